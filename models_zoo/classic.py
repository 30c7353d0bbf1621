"""Small classics: a multilayer perceptron and LeNet-5."""

from __future__ import annotations

from mithril.models import MLP, AvgPool2D, Convolution2D, Flatten, Linear, Model, Relu, Tanh


def mlp(dimensions=(64, 32, 10), activation=Relu, name: str | None = None) -> Model:
    """Linear layers of ``dimensions`` with ``activation`` between them (none after the last).

    >>> mlp([16, 4]).shape_of("output")
    '[..., 4]'
    """
    dimensions = list(dimensions)
    return MLP([activation] * (len(dimensions) - 1) + [None], dimensions, name=name)


def lenet(num_classes: int = 10, name: str | None = None) -> Model:
    """LeNet-5 (LeCun et al., 1998) on [N, 1, 32, 32] images: two 5x5 convolutions with tanh and
    2x2 average-pool subsampling, then 120-84-``num_classes`` fully connected layers.

    >>> lenet(num_classes=3).shape_of("output")
    '[N, 3]'
    """
    model = Model(name)
    model |= Convolution2D(5, 6, name="conv1")(input=_image("input", 1, 32, 32))
    model += Tanh()
    model += AvgPool2D(2, name="pool1")
    model += Convolution2D(5, 16, name="conv2")
    model += Tanh()
    model += AvgPool2D(2, name="pool2")
    model += Flatten(start_dim=1)
    model += Linear(120, name="fc1")
    model += Tanh()
    model += Linear(84, name="fc2")
    model += Tanh()
    model += Linear(num_classes, name="fc3")(output="output")
    return model


def _image(name: str, channels: int, height: int | None = None, width: int | None = None):
    from mithril.models import IOKey

    return IOKey(name, shape=["N", channels, height, width])
