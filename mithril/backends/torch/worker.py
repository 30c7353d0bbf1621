"""The process torchrun starts for ``mithril launch`` (:mod:`mithril.distributed.launch`):
``python -m mithril.backends.torch.worker script.py [args...]`` runs the script as ``__main__``
inside torch's ``record``, so a failure's traceback reaches torchrun's summary of the first
failing rank, and leaves the process group the script built.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m mithril.backends.torch.worker script.py [args...]")
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        record(lambda: runpy.run_path(argv[0], run_name="__main__"))()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # a process that exits with one open warns


if __name__ == "__main__":
    main(sys.argv[1:])
