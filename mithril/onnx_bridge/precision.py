"""The float-precision pass: a loaded model computes in the backend's dtype.

Filled in by the precision work of issue 17; until then it leaves the model as it is.
"""

from __future__ import annotations

import onnx_ir as ir


def convert_precision(model: ir.Model, backend, *, keep_io_types: bool = False) -> None:
    """Convert ``model``'s float computation to ``backend.dtype`` in place."""
    return None
