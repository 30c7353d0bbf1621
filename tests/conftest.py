import os

# Four JAX host devices for the device-mesh tests (tests/distributed/test_jax.py): XLA reads the
# flag once, when JAX starts, so it is set before any test imports JAX. One-device programs run on
# the first device as before.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import inspect
import re
from pathlib import Path

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


# -- a marker per backend -------------------------------------------------------------------------
# `pytest -m c` runs every test that runs the C backend: the tests under tests/backends/c/, the
# cases of a test parametrized over backends whose parameter is C (its name "c" or its class
# CBackend), and a test that names the backend ("c" as a word of its name; CBackend or
# make_backend("c"), backend="c", "--backend", "c" ... in its body).
# A test that reaches a backend none of these show sets `pytestmark = pytest.mark.<name>` itself.
def _backend_names():
    from mithril.backends.table import BACKENDS

    return {entry.name: entry.class_name for entry in BACKENDS.values()}


_NAME_WORDS = {"gguf": "ggml"}  # words of a test's name that mean a backend besides the names
# A backend's name in quotes where a backend is chosen (a bare "c" is as often a value's name).
_CHOOSES_A_BACKEND = r"""(?:make_backend\(|BACKENDS\[|backend(?:_name)?=|backend["']?: |"--backend", )"""


def _backends_of(item, names: dict[str, str], sources: dict) -> set[str]:
    found = set()
    parts = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent).parts
    if parts[0] == "backends" and parts[1] in names:  # tests/backends/<name>/
        found.add(parts[1])
    if parts[0] == "distributed" and parts[-1].removeprefix("test_").removesuffix(".py") in names:
        found.add(parts[-1].removeprefix("test_").removesuffix(".py"))  # tests/distributed/test_<name>.py
    by_class = {cls: name for name, cls in names.items()}
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, str) and v in names:
                found.add(v)
            cls_name = v.__name__ if isinstance(v, type) else type(v).__name__
            if cls_name in by_class:
                found.add(by_class[cls_name])
    words = getattr(item, "originalname", item.name).split("_")
    found.update(_NAME_WORDS.get(w, w) for w in words if w in ("c", "ggml", "gguf"))
    fn = getattr(item, "function", None)
    if fn is not None:
        if fn not in sources:
            try:
                sources[fn] = inspect.getsource(fn)
            except (OSError, TypeError):
                sources[fn] = ""
        found.update(name for name, cls in names.items()
                     if re.search(rf"\b{cls}\b|{_CHOOSES_A_BACKEND}['\"]{name}['\"]", sources[fn]))
    return found


# -- the long tier ---------------------------------------------------------------------------------
# `@pytest.mark.long(reason=...)` puts a test in the long tier: skipped, with its reason, unless
# MITHRIL_LONG_TESTS=1. The reason names what the fast tier still runs of that family.
LONG_TESTS = os.environ.get("MITHRIL_LONG_TESTS") == "1"


def pytest_collection_modifyitems(config, items):
    names, sources = _backend_names(), {}
    for item in items:
        for name in sorted(_backends_of(item, names, sources)):
            item.add_marker(getattr(pytest.mark, name))
        long = item.get_closest_marker("long")
        if long is not None and not LONG_TESTS:
            why = long.kwargs.get("reason") or (long.args[0] if long.args else "")
            item.add_marker(pytest.mark.skip(reason=f"long tier, MITHRIL_LONG_TESTS=1 runs it: {why}"))
