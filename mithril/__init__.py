"""Mithril: compose, import and export models through ONNX, and run them on any backend.

>>> import mithril as ml
>>> ml.NumpyBackend().name
'numpy'
"""

from .dtypes import (  # noqa: F401
    DType,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from .errors import MithrilError  # noqa: F401
from . import errors  # noqa: F401
from .onnx_bridge.load import OnnxModel, load_onnx  # noqa: F401
from .backends.numpy.backend import NumpyBackend  # noqa: F401
from .backends.c.backend import CBackend  # noqa: F401  (builds with the system C compiler when compiling)
from .backends.ggml.backend import GGMLBackend  # noqa: F401  (imports ggml-python only when compiling)
from .backends.mlx.backend import MLXBackend, MlxBackend  # noqa: F401  (imports mlx only when created)
from .backends.jax.backend import JaxBackend  # noqa: F401  (imports jax only when created)
from .backends.torch.backend import TorchBackend  # noqa: F401  (imports torch only when created)
from .compile import compile  # noqa: F401
from .physical_model import PhysicalModel  # noqa: F401
from .export import export_onnx, save_gguf  # noqa: F401
from .params_io import load_params, save_params  # noqa: F401
from .backends.ggml.gguf_io import load_gguf  # noqa: F401  (imports gguf only when called)
from .backends.ggml.llama_gguf import gguf_decoder  # noqa: F401  (a llama.cpp GGUF file as a decode step)
from .backends.custom_ops import register_op, scoped_ops, unregister_op  # noqa: F401  (custom ops)
from . import optimizers  # noqa: F401,E402
from . import models  # noqa: F401,E402  (ml.models.MLP, ml.models.resnet18...)
# The blocks a model is usually built from, at the top level (ml.Linear); all of them are in ml.models.
from .models import (  # noqa: F401,E402
    MLP,
    LSTM,
    AvgPool2D,
    BatchNorm2D,
    Conv2d,
    Convolution1D,
    CustomOp,
    Convolution2D,
    Dropout,
    Embedding,
    Flatten,
    Gelu,
    GroupNorm,
    IOKey,
    Lambda,
    LayerNorm,
    LeakyRelu,
    Linear,
    MaxPool1D,
    MaxPool2d,
    MaxPool2D,
    Model,
    MultiHeadAttention,
    Relu,
    Reshape,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
    TransformerBlock,
)

bool = bool_  # noqa: A001  (ml.bool, as the issue's API names it)

__version__ = "0.1.0"
from .validate import ValidationReport, validate  # noqa: F401,E402
from .reduce import ReduceResult, reduce  # noqa: F401,E402  (a failing model shrunk to a few nodes)
from .profile import ProfileReport, profile  # noqa: F401,E402
from .c_export import export_c  # noqa: F401,E402  (a model as a standalone C source tree)
from .generation import generate  # noqa: F401,E402  (greedy decoding with a key/value cache, any backend)
