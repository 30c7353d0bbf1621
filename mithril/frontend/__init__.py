"""The logical-model frontend: compose blocks into Models, infer shapes, export to ONNX.

Blocks live in family modules and register themselves in :data:`BLOCKS`; ``mithril.models`` is
the public import path.
"""

from .block import BLOCKS, register  # noqa: F401
from .model import (  # noqa: F401
    Block,
    Connection,
    IOKey,
    In,
    Model,
    Out,
    Param,
    Primitive,
    ShapeView,
)
# importing the family modules registers their blocks
from . import (  # noqa: F401
    attention, creation, custom_op, elementwise, lambda_block, losses, nn, onnx_block, reduce, sequence_models,
    shape_ops,
)
