"""The nn family (mithril/backends/kernels/nn.py) on every installed backend: each case is a
one-node model compiled on the backend and compared with the shared NumPy kernel itself."""

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.kernels import nn
from mithril.backends.table import BACKENDS

from tests.conftest import make_model

AVAILABLE = [name for name, entry in BACKENDS.items() if entry.installed()]
F = TensorProto.FLOAT


def _run(model, backend_name, x):
    backend = BACKENDS[backend_name].load()()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a node C or GGML leaves to NumPy warns once; values are the test
        pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": x.shape}, inference=True)
        return backend.to_numpy(pm.evaluate(None, {"x": backend.from_numpy(x)})["y"])


@pytest.mark.parametrize("size, pads, strides", [
    (8, (1, 1, 1, 1), (2, 2)),  # the end pixel no window reads: symmetric padding still fits
    (9, (1, 1, 1, 1), (2, 2)),
    (8, (0, 1, 1, 0), (1, 2)),  # truly asymmetric
    (7, (2, 0, 0, 2), (3, 1)),
])
@pytest.mark.parametrize("backend_name", AVAILABLE)
def test_conv_and_pool_padding_geometries_match_the_shared_kernels(backend_name, size, pads, strides):
    # tests/backends/torch/test_backend.py calls Torch's own Conv and MaxPool kernels on these
    # geometries; here every backend runs them as compiled models.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=pads, strides=strides)
    conv = helper.make_node("Conv", ["x", "W"], ["y"], pads=list(pads), strides=list(strides), name="conv")
    got = _run(make_model([conv], [("x", F, list(x.shape))], [("y", F, None)], {"W": w}), backend_name, x)
    np.testing.assert_allclose(got, nn.conv(x, w, None, xp=np, **attrs), rtol=1e-5, atol=1e-5)
    for ceil_mode in (0, 1):
        pool = dict(auto_pad="NOTSET", kernel_shape=(3, 3), pads=pads, strides=strides, ceil_mode=ceil_mode)
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=list(pads),
                                strides=list(strides), ceil_mode=ceil_mode, name="pool")
        got = _run(make_model([node], [("x", F, list(x.shape))], [("y", F, None)]), backend_name, x)
        np.testing.assert_array_equal(got, nn.max_pool(x, xp=np, **pool))
