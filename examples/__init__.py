"""Example models and scripts.

The scripts beside this file run as programs, each with the command its docstring shows; the
packages are models built from Mithril blocks that the guides import:
``from examples.gpt.model import create_gpt`` and ``from examples.t5 import t5_encode, t5_decode``.
"""
