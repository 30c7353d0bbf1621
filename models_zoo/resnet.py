"""ResNet-18/34/50: the library's own (:mod:`mithril.models.resnet`), listed in the zoo beside the
models built on it."""

from mithril.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50"]
