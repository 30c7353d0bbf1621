#!/usr/bin/env python
"""Run the ONNX backend test suite on Mithril backends; ``mithril conformance`` under another name.

    python scripts/conformance.py --backend numpy,jax,torch,mlx --write-docs   # refresh docs/conformance.{json,md}
    python scripts/conformance.py --real --backend numpy,jax,torch,mlx --write-docs   # the real-models table
    python scripts/conformance.py --backend numpy -k '^test_conv' -v            # a check: writes nothing

Exit status 0 when every case passes or is an expected failure (tests/expected_failures), 1 when
another fails, 2 for a usage error; nothing is written without --write-docs or --output FILE.
"""

import sys

from mithril.cli import main

if __name__ == "__main__":
    sys.exit(main(["conformance", *sys.argv[1:]]))
