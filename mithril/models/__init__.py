"""Mithril's logical models: ``from mithril.models import Model, Linear, Relu, IOKey``.

>>> from mithril.models import Model, Linear, Relu
>>> model = Model()
>>> model |= Linear(dimension=32)(input="input", output="hidden")
>>> model += Relu()
>>> model += Linear(dimension=16).connect(output="output")
>>> model.shape_of("output")
'[...v, 16]'
"""

from ..frontend import BLOCKS, Block, Connection, IOKey, Model, Primitive  # noqa: F401
from ..frontend.nn import buffer_updates  # noqa: F401
from ..frontend.onnx_block import OnnxBlock  # noqa: F401
from ..frontend.train import TrainModel  # noqa: F401  (registers L1, L2)

globals().update(BLOCKS)

__all__ = ["Block", "Connection", "IOKey", "Model", "OnnxBlock", "Primitive", "TrainModel", "buffer_updates", *sorted(BLOCKS)]
