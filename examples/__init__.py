"""Example models and scripts.

The scripts beside this file run as programs (``python examples/backends_timing.py``); the
packages are models built from Mithril blocks that the guides import:
``from examples.gpt.model import create_gpt`` and ``from examples.t5 import t5_encode, t5_decode``.
"""
