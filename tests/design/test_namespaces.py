"""The design documents' namespaces: blocks at the top level (``ml.Linear``), ``mithril.models``
with the zoo's ResNets, and ``mithril.backends`` with ``Backend`` and every backend class."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mithril as ml
import mithril.models
from mithril.backends.tensor_api import TRACEABLE_API
from mithril.backends.table import BACKENDS

DOCUMENTED_TOP_LEVEL = ("Model", "Linear", "Relu", "Softmax", "Conv2d", "MaxPool2d", "Flatten", "Lambda")


@pytest.mark.parametrize("name", DOCUMENTED_TOP_LEVEL)
def test_top_level_blocks_are_the_models_blocks(name):
    """004 MLX backend, "Basic Usage" and "Examples": ``ml.Model()``, ``ml.Linear``, ``ml.Relu``,
    ``ml.Softmax``, ``ml.Conv2d``, ``ml.MaxPool2d``, ``ml.Flatten``, ``ml.Lambda`` are the blocks
    of ``mithril.models``, not copies."""
    assert getattr(ml, name) is getattr(mithril.models, name)
    assert name in mithril.models.__all__


def test_other_layers_at_the_top_level():
    """004 MLX backend, "Examples": a reader who found ``ml.Linear`` and ``ml.Conv2d`` at the
    top level finds the other layers there too, each the block of ``mithril.models``."""
    for name in ("IOKey", "MLP", "Convolution2D", "MaxPool2D", "AvgPool2D", "BatchNorm2D", "LayerNorm", "Dropout",
                 "Embedding", "Gelu", "LeakyRelu", "Sigmoid", "Tanh", "MultiHeadAttention"):
        assert getattr(ml, name) is getattr(mithril.models, name), name
    assert ml.models is mithril.models


def test_import_mithril_loads_no_framework_and_no_zoo():
    """``import mithril`` stays light: the top-level blocks and ``mithril.backends`` import no
    framework, and the library never imports the zoo built on it (not even for a ResNet)."""
    code = ("import sys, mithril, mithril.backends; mithril.Linear, mithril.models.MLP; "
            "before = [m for m in ('jax', 'torch', 'mlx', 'models_zoo') if m in sys.modules]; "
            "from mithril.models import resnet18; "
            "print(before, 'models_zoo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] False"


def test_models_resnets_are_the_zoos():
    """002 multi-backend deployment, "Same Model, Multiple Backends": ``from mithril.models import
    resnet18`` gives the zoo's constructor (the library's, which models_zoo re-exports: not a second copy)."""
    from mithril.models import resnet18, resnet34, resnet50
    from models_zoo import resnet

    assert (resnet18, resnet34, resnet50) == (resnet.resnet18, resnet.resnet34, resnet.resnet50)
    with pytest.raises(AttributeError, match="has no attribute 'resnet101'"):
        mithril.models.resnet101  # noqa: B018


def test_backends_package_exports():
    """001 backends, "Custom Backends" (``from mithril.backends import Backend``) and 004 MLX
    backend, "Creating the Backend" (``from mithril.backends import MLXBackend``): the package
    holds the contract and every backend class of the table, the same classes as ``ml.*``."""
    from mithril.backends import Backend, JaxBackend, MLXBackend, MlxBackend, NumpyBackend, TorchBackend

    assert MLXBackend is MlxBackend is ml.MLXBackend
    assert (NumpyBackend, JaxBackend, TorchBackend) == (ml.NumpyBackend, ml.JaxBackend, ml.TorchBackend)
    import mithril.backends as backends

    for entry in BACKENDS.values():
        cls = getattr(backends, entry.class_name)
        assert cls is entry.load() and issubclass(cls, Backend) and entry.class_name in backends.__all__
    assert {"Backend", "MLXBackend"} <= set(backends.__all__)


def test_custom_backend_subclass():
    """001 backends, "Custom Backends": a subclass of ``Backend`` calling
    ``super().__init__(dtype=dtype)`` and defining ``zeros``/``ones`` is a working backend."""
    from mithril.backends import Backend

    class MyCustomBackend(Backend):
        def __init__(self, dtype=ml.float32):
            super().__init__(dtype=dtype)

        def zeros(self, *shape, dtype=None):
            return np.zeros(shape, dtype=self.backend_dtype(dtype))

        def ones(self, *shape, dtype=None):
            return np.ones(shape, dtype=self.backend_dtype(dtype))

    b = MyCustomBackend()
    assert b.dtype == ml.float32
    assert b.zeros(2, 3).shape == (2, 3) and b.ones(2).dtype == np.float32
    np.testing.assert_array_equal(b.add(b.ones(2), b.ones(2)), [2.0, 2.0])


class _Probe:
    """Stands for a traced value: records the tensor-API calls forwarded to it."""

    calls: list = []

    def __mithril_function__(self, backend, name, args, kwargs):
        self.calls.append((type(backend).__name__, name))
        return "forwarded"


@pytest.mark.parametrize("backend_name", list(BACKENDS))
def test_every_backends_tensor_api_forwards_traced_values(backend_name):
    """004 MLX backend, "Custom MLX Operations": ``backend.maximum(0.01 * x, x)`` inside an
    ``ml.Lambda`` works whatever backend ``backend`` is, because every backend's tensor API
    (in its class body or set after it) hands a traced argument to the tracer without computing."""
    cls = BACKENDS[backend_name].load()
    backend = object.__new__(cls)  # no framework needed: a forwarded call never reaches it
    names = sorted(n for n in TRACEABLE_API if hasattr(cls, n))
    assert {"add", "multiply", "maximum", "sum", "reshape", "concat"} <= set(names)
    _Probe.calls = []
    for name in names:
        args = ([_Probe(), _Probe()],) if name == "concat" else (_Probe(), 1.0)
        assert getattr(backend, name)(*args) == "forwarded", name
    assert _Probe.calls == [(cls.__name__, n) for n in names]


def test_traceable_api_names_each_have_a_tracing_rule():
    """Every name the backends forward has a rule emitting ONNX nodes in the Lambda tracer."""
    from mithril.frontend.lambda_block import API

    assert set(API) == set(TRACEABLE_API)
