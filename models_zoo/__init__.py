"""Mithril's model zoo: logical models built from ``mithril.models`` blocks.

Every zoo model takes ``input`` and gives ``output``; parameter names follow the PyTorch
module they mirror (``layer1.0.conv1.weight``), so :mod:`models_zoo.weights` maps a torch
``state_dict`` onto them. :mod:`models_zoo.torch_reference` holds the torch.nn reference
architectures used by the tests, the benchmark and the main job.

>>> import models_zoo
>>> models_zoo.lenet(num_classes=10).shape_of("output")
'[N, 10]'
"""

from .classic import lenet, mlp
from .recurrent import lstm_classifier
from .resnet import resnet18, resnet34, resnet50
from .transformers import create_gpt, create_gpt_decoder, vit

ZOO = {
    "mlp": mlp,
    "lenet": lenet,
    "resnet18": resnet18,
    "resnet34": resnet34,
    "resnet50": resnet50,
    "gpt": create_gpt,
    "lstm_classifier": lstm_classifier,
    "vit": vit,
}

__all__ = ["ZOO", "create_gpt", "create_gpt_decoder", "lenet", "lstm_classifier", "mlp", "resnet18", "resnet34",
           "resnet50", "vit"]
