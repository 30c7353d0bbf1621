#!/usr/bin/env python
"""Run the ONNX backend test suite on Mithril backends; ``mithril conformance`` under another name.

    python scripts/conformance.py --backend numpy,jax,torch,mlx --write-docs   # refresh docs/conformance.md and reports/conformance.json
    python scripts/conformance.py --real --backend numpy,jax,torch,mlx --write-docs   # the real-models table
    python scripts/conformance.py --backend numpy -k '^test_conv' -v            # a check: writes nothing
    python scripts/conformance.py --scoreboard --backend numpy --write-docs     # onnx's BackendTest, the scoreboard's way

Exit status 0 when every case passes or is an expected failure (mithril/expected_failures), 1 when
another fails, 2 for a usage error; nothing is written without --write-docs or --output FILE.
"""

import sys
from pathlib import Path

from mithril.cli import main

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "real"

if __name__ == "__main__":
    # The checkout's real-model corpus; the installed command has none of its own.
    given = any(a == "--corpus" or a.startswith("--corpus=") for a in sys.argv[1:])
    corpus = [] if given else ["--corpus", str(CORPUS)]
    sys.exit(main(["conformance", *corpus, *sys.argv[1:]]))
