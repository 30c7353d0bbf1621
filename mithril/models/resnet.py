"""ResNet-18/34/50 with torchvision's architecture (He et al., 2015; BasicBlock and Bottleneck,
stride on the 3x3 convolution as in torchvision's "ResNet v1.5").

Blocks are named as torchvision's modules (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0``, ``fc``), so a Mithril parameter key equals the torch ``state_dict`` key.
Part of the library (``from mithril.models import resnet18``); :mod:`models_zoo` re-exports them.
"""

from __future__ import annotations

from ..frontend import BLOCKS, IOKey, Model
from ..frontend.nn import BatchNorm2D, Convolution2D, Linear, MaxPool2D

Add, Mean, Relu = BLOCKS["Add"], BLOCKS["Mean"], BLOCKS["Relu"]


class BasicBlock(Model):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, name: str | None = None):
        super().__init__(name)
        self |= Convolution2D(3, planes, stride=stride, padding=1, use_bias=False, name="conv1")(
            input=IOKey("input", shape=["N", inplanes, None, None]))
        self += BatchNorm2D(name="bn1")
        self += Relu()
        self += Convolution2D(3, planes, padding=1, use_bias=False, name="conv2")
        self += BatchNorm2D(name="bn2")
        _residual(self, self.bn2.output, inplanes, planes * self.expansion, stride)


class Bottleneck(Model):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a residual connection (ResNet-50)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, name: str | None = None):
        super().__init__(name)
        self |= Convolution2D(1, planes, use_bias=False, name="conv1")(
            input=IOKey("input", shape=["N", inplanes, None, None]))
        self += BatchNorm2D(name="bn1")
        self += Relu()
        self += Convolution2D(3, planes, stride=stride, padding=1, use_bias=False, name="conv2")
        self += BatchNorm2D(name="bn2")
        self += Relu()
        self += Convolution2D(1, planes * self.expansion, use_bias=False, name="conv3")
        self += BatchNorm2D(name="bn3")
        _residual(self, self.bn3.output, inplanes, planes * self.expansion, stride)


def _residual(block: Model, out, inplanes: int, outplanes: int, stride: int) -> None:
    identity = block.input
    if stride != 1 or inplanes != outplanes:
        down = Model(name="downsample")
        down |= Convolution2D(1, outplanes, stride=stride, use_bias=False, name="0")(input="input")
        down += BatchNorm2D(name="1")(output="output")
        block |= down(input="input")
        identity = block.downsample.output
    block |= Add()(left=out, right=identity)
    block += Relu()(output="output")


class ResNet(Model):
    """A stem (7x7/2 convolution, 3x3/2 max pool), four stages of ``block`` repeated ``layers``
    times (64, 128, 256, 512 planes), global average pooling and a ``fc`` classifier.
    Input [N, 3, H, W]; output [N, num_classes]."""

    def __init__(self, block: type[Model], layers, num_classes: int = 1000, name: str | None = None):
        super().__init__(name)
        self |= Convolution2D(7, 64, stride=2, padding=3, use_bias=False, name="conv1")(
            input=IOKey("input", shape=["N", 3, None, None]))
        self += BatchNorm2D(name="bn1")
        self += Relu()
        self += MaxPool2D(3, stride=2, padding=1, name="maxpool")
        inplanes = 64
        for i, (planes, count) in enumerate(zip((64, 128, 256, 512), layers)):
            stage = Model(name=f"layer{i + 1}")
            for j in range(count):
                unit = block(inplanes, planes, stride=2 if i > 0 and j == 0 else 1, name=str(j))
                stage.extend(unit, chain=j > 0, **_ends(j, count))
                inplanes = planes * block.expansion
            self += stage
        self += Mean(axis=(2, 3), name="avgpool")
        self += Linear(num_classes, name="fc")(output="output")


def _ends(i: int, count: int) -> dict:
    """Bindings of the i-th of ``count`` chained blocks: the first reads ``input``, the last writes ``output``."""
    return {**({"input": "input"} if i == 0 else {}), **({"output": "output"} if i == count - 1 else {})}


def resnet18(num_classes: int = 1000, name: str | None = None) -> ResNet:
    """ResNet-18: BasicBlock x (2, 2, 2, 2).

    >>> resnet18(num_classes=10).shape_of("output")
    '[N, 10]'
    """
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, name)


def resnet34(num_classes: int = 1000, name: str | None = None) -> ResNet:
    """ResNet-34: BasicBlock x (3, 4, 6, 3)."""
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes, name)


def resnet50(num_classes: int = 1000, name: str | None = None) -> ResNet:
    """ResNet-50: Bottleneck x (3, 4, 6, 3)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, name)
