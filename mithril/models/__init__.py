"""Mithril's logical models: ``from mithril.models import Model, Linear, Relu, IOKey``.

Every block (``Linear``, ``Conv2d``, ``MaxPool2d``, ``Flatten``, ``Lambda``...) and the ResNets
built from them (``resnet18``, ``resnet34``, ``resnet50``, :mod:`.resnet`; :mod:`models_zoo`, which
builds on this package, lists them among its models).

>>> from mithril.models import Model, Linear, Relu
>>> model = Model()
>>> model |= Linear(dimension=32)(input="input", output="hidden")
>>> model += Relu()
>>> model += Linear(dimension=16).connect(output="output")
>>> model.shape_of("output")
'[...v, 16]'
>>> from mithril.models import resnet18
>>> resnet18(num_classes=10).shape_of("output")
'[N, 10]'
"""

from ..frontend import BLOCKS, Block, Connection, IOKey, Model, Primitive  # noqa: F401
from ..frontend.nn import buffer_updates  # noqa: F401
from ..frontend.onnx_block import OnnxBlock  # noqa: F401
from ..frontend.train import TrainModel  # noqa: F401  (registers L1, L2)

from .resnet import resnet18, resnet34, resnet50  # noqa: F401

globals().update(BLOCKS)

__all__ = ["Block", "Connection", "IOKey", "Model", "OnnxBlock", "Primitive", "TrainModel", "buffer_updates",
           *sorted(BLOCKS), "resnet18", "resnet34", "resnet50"]
