import os

# Four JAX host devices for the device-mesh tests (tests/distributed/test_jax.py): XLA reads the
# flag once, when JAX starts, so it is set before any test imports JAX. One-device programs run on
# the first device as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def digits_32x32(n_train: int = 1500):
    """sklearn's load_digits as [N, 1, 32, 32] float64 (each pixel repeated 4x4), standardized with
    the training set's mean and deviation: (x_train, y_train, x_test, y_test), the first ``n_train``
    images training, the rest (297 of 1,797 at the default) test. LeNet's real training data."""
    sklearn = pytest.importorskip("sklearn.datasets", reason="scikit-learn is in the test extra")
    d = sklearn.load_digits()
    x = (d.images / 16.0).repeat(4, axis=1).repeat(4, axis=2)[:, None]
    x = (x - x[:n_train].mean()) / x[:n_train].std()
    y = d.target.astype(np.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def make_model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=10, domains=()):
    """A small hand-made model: inputs/outputs are (name, elem_type, shape) triples."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


@pytest.fixture
def conv_model():
    """Conv -> Sigmoid -> Mul -> ReduceMean with a dynamic batch."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
        helper.make_node("Mul", ["s", "c"], ["m"], name="mul"),
        helper.make_node("ReduceMean", ["m"], ["y"], axes=[2, 3], keepdims=0, name="gap"),
    ]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 4, 8, 8])], [("y", TensorProto.FLOAT, ["N", 8])],
                      {"W": w})


@pytest.fixture(scope="session", autouse=True)
def _c_build_cache(tmp_path_factory):
    """Libraries the C backend builds during the tests go to a temporary cache, not the user's
    (``~/.cache/mithril/c``); a test or module that wants its own sets MITHRIL_CACHE_DIR itself."""
    import os

    if os.environ.get("MITHRIL_CACHE_DIR"):
        yield
        return
    os.environ["MITHRIL_CACHE_DIR"] = str(tmp_path_factory.mktemp("mithril-c-cache"))
    try:
        yield
    finally:
        os.environ.pop("MITHRIL_CACHE_DIR", None)
