#!/usr/bin/env python
"""Run the ONNX backend test suite on a Mithril backend; writes docs/conformance.{md,json}.

    python scripts/conformance.py --backend numpy            # full run, writes the docs
    python scripts/conformance.py --backend numpy -k '^test_conv' -v
"""

import sys

from mithril.conformance import main

if __name__ == "__main__":
    sys.exit(main())
