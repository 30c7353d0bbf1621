"""The block registry: every block class by name, so expressions (``a + b``) and the public
``mithril.models`` package find them.

A new block is one small class in a family module (``elementwise``, ``reduce``, ``shape_ops``,
``nn``, ``losses``), decorated with :func:`register`: ports with shape templates, an optional
``infer`` shape rule, and ``lower`` emitting standard ai.onnx nodes. See docs/frontend.md.
"""

from __future__ import annotations

from ..errors import ModelError

BLOCKS: dict[str, type] = {}


def register(cls):
    if cls.__name__ in BLOCKS:
        raise ModelError(f"block {cls.__name__} is registered twice")
    BLOCKS[cls.__name__] = cls
    return cls
