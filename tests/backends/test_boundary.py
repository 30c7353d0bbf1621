"""Checked at the boundary (issue 17, Must 4): what users hand ``evaluate`` and the tensor API is
checked before anything runs, with the same error class and text on every backend.

- ``output_gradients``: keys, dtypes (never cast) and shapes (never broadcast) as for inputs;
- arrays of another framework (a torch.Tensor given to a JaxBackend model...) are refused naming
  what the backend takes; NumPy arrays are taken by every backend;
- a backend class or a name where a backend instance is expected;
- ``TorchBackend(compile=True)`` either compiles or falls back with one warning line naming the
  reason, on the four exported models and the zoo.
"""

from __future__ import annotations

import importlib.util
import time
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.runner import JitFallbackWarning
from mithril.backends.table import BACKENDS
from mithril.errors import DTypeError, ForeignArrayError, InputError, ShapeError

INSTALLED = [name for name, entry in BACKENDS.items() if entry.installed()]


def _backend(name: str):
    return BACKENDS[name].load()()


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    if request.param not in INSTALLED:
        pytest.skip(f"{BACKENDS[request.param].array_modules[0]} is not installed")
    if BACKENDS[request.param].load().needs_static_shapes:
        pytest.skip("these models leave the batch dim symbolic: C and GGML need fixed shapes; "
                    "tests/backends/c/test_backend.py, tests/backends/c/test_training.py and "
                    "tests/backends/ggml/test_backend.py check theirs")
    return _backend(request.param)


def _model(*, y_shape=("N", 2), extra_nodes=(), extra_inputs=(), extra_outputs=()):
    """y = x @ w ([N, 3] @ [3, 2]), s = sum(y) (a scalar), i = argmax(y) (int64, no gradient)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul"),
             helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0, name="total"),
             helper.make_node("ArgMax", ["y"], ["i"], axis=1, name="argmax"), *extra_nodes]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape)),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["N"]), *extra_outputs],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 2], np.arange(6, dtype=np.float32).tolist())])
    return ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _host(backend, value) -> np.ndarray:
    return np.asarray(backend.to_numpy(value))


# -- output_gradients: checked like inputs, the same on every backend --------------------------------
def test_correct_output_gradients_give_the_gradients(backend):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    g = np.array([[1, 2], [3, 4]], np.float32)
    out, grads = pm.evaluate(None, {"x": X}, output_gradients={"y": backend.array(g)})
    np.testing.assert_allclose(_host(backend, out["y"]), X @ np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_allclose(_host(backend, grads["w"]), X.T @ g)
    np.testing.assert_allclose(_host(backend, grads["x"]), g @ np.arange(6, dtype=np.float32).reshape(3, 2).T)
    # A Python scalar for the scalar output takes its dtype, as data does (auto_scalar_promotion).
    _, grads = pm.evaluate(None, {"x": X}, output_gradients={"s": 1.0, "y": None})
    np.testing.assert_allclose(_host(backend, grads["w"]), X.T @ np.ones((2, 2), np.float32))


@pytest.mark.parametrize("cotangent, expected", [
    (np.ones((2, 1), np.float32), "[2, 1]"),  # broadcast silently on NumPy/Torch/MLX before
    (np.ones((2,), np.float32), "[2]"),
    (np.ones((3, 2), np.float32), "[3, 2]"),  # a raw broadcast error before
    (1.0, "[]"),
])
def test_wrong_shape_names_the_output_and_both_shapes(backend, cotangent, expected):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    with pytest.raises(ShapeError) as err:
        pm.evaluate(None, {"x": X}, output_gradients={"y": cotangent})
    assert str(err.value) == (f"node 'matmul': output_gradients['y'] must have the shape of output 'y', [2, 2], "
                              f"but got {expected} (a cotangent is never broadcast)")


def test_shape_only_the_run_can_tell_is_checked_against_the_output_computed(backend):
    """y2 = Reshape(y, target) with the target given as data: its dims are known once it has run."""
    model = _model(extra_nodes=[helper.make_node("Reshape", ["y", "target"], ["y2"], name="reshape_by_data")],
                   extra_inputs=[helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
                   extra_outputs=[helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JitFallbackWarning)  # the data-dependent Reshape stays eager on JAX/MLX
        pm = ml.compile(model, backend)
        data = {"x": X, "target": np.array([1, 4], np.int64)}
        _, grads = pm.evaluate(None, data, output_gradients={"y2": np.ones((1, 4), np.float32)})
        np.testing.assert_allclose(_host(backend, grads["w"]), X.T @ np.ones((2, 2), np.float32))
        with pytest.raises(ShapeError) as err:
            pm.evaluate(None, data, output_gradients={"y2": np.ones((4, 1), np.float32)})
    assert str(err.value) == ("node 'reshape_by_data': output_gradients['y2'] must have the shape of output 'y2', "
                              "[1, 4], but got [4, 1] (a cotangent is never broadcast)")


def test_wrong_dtype_is_never_cast(backend):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    with pytest.raises(DTypeError) as err:
        pm.evaluate(None, {"x": X}, output_gradients={"y": np.ones((2, 2))})  # NumPy's default float64
    assert str(err.value) == ("node 'matmul': output_gradients['y'] must have the dtype of output 'y', float32, but "
                              "got float64; cast it explicitly (Mithril never casts silently)")


def test_integer_output_takes_no_cotangent(backend):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    with pytest.raises(DTypeError) as err:
        pm.evaluate(None, {"x": X}, output_gradients={"i": np.ones(2, np.int64)})
    assert str(err.value) == ("node 'argmax': output_gradients['i']: output 'i' is int64, which has no gradient; "
                              "leave it out of output_gradients")


@pytest.mark.parametrize("output_gradients, message", [
    ({"z": np.ones((2, 2), np.float32)},
     "output_gradients names ['z'], which are not outputs; the outputs are ['y', 's', 'i']"),
    ({}, "output_gradients names no output with a cotangent; give one for at least one of ['y', 's', 'i'] "
         "(outputs left out get zero)"),
    ({"y": None}, "output_gradients names no output with a cotangent; give one for at least one of "
                  "['y', 's', 'i'] (outputs left out get zero)"),
    (np.ones((2, 2), np.float32), "output_gradients must be a dict keyed by name ('y', 's', 'i'), not a ndarray"),
])
def test_output_gradient_keys(backend, output_gradients, message):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    with pytest.raises(InputError) as err:
        pm.evaluate(None, {"x": X}, output_gradients=output_gradients)
    assert str(err.value) == message


# -- arrays of another framework --------------------------------------------------------------------
def _foreign(name: str):
    """A [2, 3] float32 array of framework ``name``."""
    if name == "torch":
        import torch

        return torch.ones(2, 3)
    if name == "jax":
        import jax.numpy as jnp

        return jnp.ones((2, 3), jnp.float32)
    import mlx.core as mx

    return mx.ones((2, 3))


TAKES = {"numpy": "numpy.ndarray", "jax": "jax.Array or numpy.ndarray", "torch": "torch.Tensor or numpy.ndarray",
         "mlx": "mlx.core.array or numpy.ndarray"}
PAIRS = [(b, f) for b in BACKENDS for f in ("jax", "torch", "mlx") if b != f]


@pytest.mark.parametrize("backend_name, framework", PAIRS)
def test_foreign_arrays_are_refused_naming_what_the_backend_takes(backend_name, framework):
    for name in (backend_name, framework):
        if name not in INSTALLED:
            pytest.skip(f"{BACKENDS[name].array_modules[0]} is not installed")
    if BACKENDS[backend_name].load().needs_static_shapes:
        pytest.skip("the model leaves the batch dim symbolic: C and GGML need fixed shapes")
    backend = _backend(backend_name)
    cls = type(backend).__name__
    foreign = _foreign(framework)
    got = BACKENDS[framework].array_type
    convert = "x.detach().cpu().numpy()" if framework == "torch" else "np.asarray(x)"
    tail = (f": {cls} takes {TAKES[backend_name]}, got {got}; convert it first ({convert}, then backend.array(...) "
            f"to place it on the backend)")
    pm = ml.compile(_model(), backend, data_keys=["x"])
    cases = [("input 'x'", lambda: pm.evaluate(None, {"x": foreign})),
             ("parameter 'w'", lambda: pm.evaluate({"w": foreign}, {"x": X})),
             ("output_gradients['y']", lambda: pm.evaluate(None, {"x": X}, output_gradients={"y": foreign[:, :2]})),
             ("an argument of add()", lambda: backend.add(foreign, foreign)),
             ("an argument of concat()", lambda: backend.concat([backend.ones(2, 3), foreign]))]
    for what, call in cases:
        with pytest.raises(ForeignArrayError) as err:
            call()
        assert str(err.value) == what + tail
        assert isinstance(err.value, TypeError)


def test_numpy_arrays_are_taken_by_every_backend(backend):
    pm = ml.compile(_model(), backend, data_keys=["x"])
    w = np.ones((3, 2), np.float32)
    out, grads = pm.evaluate({"w": w}, {"x": X}, output_gradients={"y": np.ones((2, 2), np.float32)})
    np.testing.assert_allclose(_host(backend, out["y"]), X @ w)
    np.testing.assert_allclose(_host(backend, grads["x"]), np.full((2, 3), 2, np.float32))
    np.testing.assert_allclose(_host(backend, backend.add(X, X)), 2 * X)


def test_parameters_of_another_backends_model_are_refused():
    others = [name for name in ("torch", "jax", "mlx") if name in INSTALLED]
    if not others:
        pytest.skip("no framework besides NumPy is installed (torch, jax or mlx)")
    other = _backend(others[0])
    params = ml.compile(_model(), other).get_parameters()
    pm = ml.compile(_model(), ml.NumpyBackend())
    with pytest.raises(ForeignArrayError, match=rf"^parameter 'w': NumpyBackend takes numpy.ndarray, got "
                                                rf"{BACKENDS[others[0]].array_type};"):
        pm.evaluate(params, {"x": X})


@pytest.mark.parametrize("params, error, message", [
    ({"w": np.ones((2, 3), np.float32)}, ShapeError, "node 'matmul': parameter 'w' expects shape [3, 2] but got [2, 3]"),
    ({"w": np.ones((3, 2))}, DTypeError,
     "node 'matmul': parameter 'w' expects float32 but got float64; cast it explicitly (Mithril never casts "
     "parameters silently)"),
    ({"w": np.ones((3, 2), np.float32), "v": np.ones(2, np.float32)}, InputError,
     "unknown parameter(s) ['v']; the model's are ['w']"),
])
def test_parameters_are_checked_like_inputs(backend, params, error, message):
    pm = ml.compile(_model(), backend)
    with pytest.raises(error) as err:
        pm.evaluate(params, {"x": X})
    assert str(err.value) == message


def test_a_non_array_input_is_refused():
    pm = ml.compile(_model(), ml.NumpyBackend())
    with pytest.raises(InputError, match=r"^input 'x' is a str, not an array; NumpyBackend takes its arrays"):
        pm.evaluate(None, {"x": "x.npy"})
    with pytest.raises(InputError, match=r"^data must be a dict keyed by name \('x'\), not a ndarray$"):
        pm.evaluate(None, X)


# -- a backend class or a name where a backend instance is expected ---------------------------------
@pytest.mark.parametrize("given, said", [(ml.NumpyBackend, "a backend instance: NumpyBackend(), not the class"),
                                         ("numpy", "a backend instance such as ml.NumpyBackend(), not 'numpy'")])
def test_a_backend_class_or_name_is_refused(given, said, tmp_path):
    with pytest.raises(ml.errors.CompileError) as err:
        ml.compile(_model(), given)
    assert str(err.value) == f"compile takes {said}"
    with pytest.raises(ml.errors.CompileError) as err:  # validate compiles the model for each backend
        ml.validate(_model(), given, shapes={"x": [2, 3]})
    assert str(err.value) == f"compile takes {said}"
    ml.save_params({"w": np.ones(2, np.float32)}, tmp_path / "p.npz")
    with pytest.raises(ml.errors.ParamsFileError) as err:
        ml.load_params(tmp_path / "p.npz", given)
    assert str(err.value) == f"load_params takes {said}"


@pytest.mark.parametrize("call", ["ones(2, 3)", "add(x, x)", "to_numpy(x)", "array([1.0])", "randn(2)"])
def test_the_tensor_api_called_on_a_backend_class_says_to_make_one(call):
    """``backend = ml.NumpyBackend`` (no parentheses), then ``backend.ones(2, 3)``."""
    name = call.split("(")[0]
    for cls in [BACKENDS[b].load() for b in INSTALLED]:
        with pytest.raises(ml.errors.NotABackendError) as err:
            eval(f"cls.{call}", {"cls": cls, "x": X})
        assert str(err.value) == (f"{name}() is a method of a backend instance: {cls.__name__}().{name}(...) "
                                  f"(or the backend you made), not {cls.__name__}.{name}(...) on the class")
        assert isinstance(err.value, TypeError)
    np.testing.assert_array_equal(ml.NumpyBackend().ones(2, 3), np.ones((2, 3), np.float32))


# -- TorchBackend(compile=True): compiles, or falls back with one warning line ------------------------
needs_torch = pytest.mark.skipif("torch" not in INSTALLED, reason="torch is not installed")


def _broken_compiler(gm, example_inputs):
    raise RuntimeError("this compiler refuses every graph\nsecond line of its message")


@needs_torch
def test_failing_torch_compile_falls_back_with_one_warning_line():
    """A torch.compile backend that fails: the first evaluate runs eagerly with one
    JitFallbackWarning of one line naming the failure; later calls, gradients included, stay
    eager without another warning."""
    pm = ml.compile(_model(), ml.TorchBackend(), jit=True, jit_options={"backend": _broken_compiler},
                    data_keys=["x"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = pm.evaluate(None, {"x": X})
        _, grads = pm.evaluate(None, {"x": X}, output_gradients={"y": np.ones((2, 2), np.float32)})
        pm.evaluate(None, {"x": X})
    messages = [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)]
    assert messages == ["running un-jitted: torch.compile failed: RuntimeError: this compiler refuses every graph"]
    assert [w for w in caught if not issubclass(w.category, (JitFallbackWarning, DeprecationWarning))] == []
    np.testing.assert_allclose(out["y"].numpy(), X @ np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_allclose(grads["x"].numpy(), np.ones((2, 2)) @ np.arange(6, dtype=np.float32).reshape(3, 2).T)


@needs_torch
def test_every_model_compiled_in_a_process_is_compiled():
    """Dynamo keeps its programs and its recompile limit (8) per Python function: when every
    model's program shared one, the ninth model compiled in a process ran eagerly without a word."""
    from torch._dynamo.utils import counters

    x = np.ones((2, 3), np.float32)
    for k in range(10):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "c"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
            [helper.make_tensor("c", TensorProto.FLOAT, [1], [float(k)])])
        pm = ml.compile(ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])),
                        ml.TorchBackend(compile=True))
        graphs = counters["stats"]["unique_graphs"]
        y = pm.evaluate(None, {"x": x})["y"]
        assert counters["stats"]["unique_graphs"] == graphs + 1, f"model {k} was not compiled"
        np.testing.assert_array_equal(y.numpy(), np.full((2, 3), k, np.float32))


# The four exported models and the zoo, forward under torch.compile: each first call compiles for
# 5-45 s on a 2-core CPU. The fast tier compiles a CNN and a transformer of each kind.
_COMPILE_AGAIN = pytest.mark.long(reason="another model of a kind the fast tier compiles (exported MobileNetV2 and "
                                         "GPT-2; the zoo's MLP, LeNet and ViT), 20-45 s each")
EXPORTED = (pytest.param("resnet18", marks=_COMPILE_AGAIN), "mobilenet_v2", pytest.param("bert", marks=_COMPILE_AGAIN),
            "gpt2")
ZOO = ("mlp", "lenet", pytest.param("resnet18", marks=_COMPILE_AGAIN), pytest.param("gpt", marks=_COMPILE_AGAIN),
       pytest.param("lstm_classifier", marks=_COMPILE_AGAIN), "vit")


def _zoo_case(name: str):
    import models_zoo

    cases = {
        "mlp": (lambda: models_zoo.mlp([16, 8, 4]), (2, 12), "float"),
        "lenet": (lambda: models_zoo.lenet(num_classes=10), (2, 1, 32, 32), "float"),
        "resnet18": (lambda: models_zoo.resnet18(num_classes=10), (1, 3, 32, 32), "float"),
        "gpt": (lambda: models_zoo.create_gpt(bias=True, block_size=16, dims=16, num_heads=2, num_layers=2,
                                              vocab_size=50), (2, 7), "ids"),
        "lstm_classifier": (lambda: models_zoo.lstm_classifier(vocab_size=50, embed_dim=8, hidden_size=16,
                                                               num_classes=3), (2, 6), "ids"),
        "vit": (lambda: models_zoo.vit(image_size=16, patch_size=4, dims=16, num_heads=2, num_layers=2,
                                       num_classes=5), (2, 3, 16, 16), "float"),
    }
    build, shape, kind = cases[name]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, shape).astype(np.int64) if kind == "ids" else rng.standard_normal(shape).astype(np.float32)
    return build(), {"input": x}


_exports: dict[str, tuple] = {}


def _exported(name: str, folder):
    if name not in _exports:
        if name in ("bert", "gpt2") and importlib.util.find_spec("transformers") is None:
            pytest.skip("transformers is needed to build the BERT/GPT-2 models")
        from models_zoo import torch_reference as models

        spec = models.build(name, image_size=32, seq=16)
        path = folder / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's own tracer and deprecation warnings
            models.export_onnx(spec, "torchscript", str(path))
        _exports[name] = (ml.load_onnx(str(path)), spec.numpy_inputs(2, seed=0))
    return _exports[name]


def _compiles_or_falls_back_once(model, data, params=None):
    """Eager and compiled outputs of ``model``; at most one JitFallbackWarning, of one line, and
    no other warning but DeprecationWarnings (torch's, while dynamo imports)."""
    shapes = {k: list(v.shape) for k, v in data.items()}
    eager = ml.compile(model, ml.TorchBackend(), shapes=shapes, inference=True)
    params = eager.get_parameters() if params is None else params
    want = eager.evaluate(params, data)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = ml.compile(model, ml.TorchBackend(compile=True), shapes=shapes, inference=True)
        got = pm.evaluate(params, data)
        again = pm.evaluate(params, data)
    seconds = time.perf_counter() - start
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)]
    others = [f"{w.category.__name__}: {w.message}" for w in caught
              if not issubclass(w.category, (JitFallbackWarning, DeprecationWarning))]
    assert others == []
    assert len(fallbacks) <= 1 and all("\n" not in m and m.startswith("running un-jitted: ") for m in fallbacks)
    assert (pm._jitted is None) == bool(fallbacks)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name].numpy(), ref.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(again[name].numpy(), ref.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    return seconds, fallbacks


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("name", EXPORTED)
def test_torch_compile_on_exported_models(name, tmp_path_factory):
    model, data = _exported(name, tmp_path_factory.mktemp("export"))
    _, fallbacks = _compiles_or_falls_back_once(model, data)
    assert fallbacks == []  # each of them compiles (BERT's dynamo AssertionError is gone: see below)


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_torch_compile_on_the_zoo(name):
    model, data = _zoo_case(name)
    eager = ml.compile(model, ml.TorchBackend(), shapes={"input": list(data["input"].shape)}, inference=True)
    _, fallbacks = _compiles_or_falls_back_once(model, data, eager.randomize_params())
    assert fallbacks == []


@needs_torch
@pytest.mark.slow
def test_bert_trace_failure_falls_back_with_one_line(tmp_path_factory, monkeypatch):
    """The reported failure: with dynamo tracing NumPy calls (as before the kernels' host NumPy was
    kept out of its trace), an exported BERT raised dynamo's raw AssertionError. Now it runs
    eagerly, gradients too, with one warning line naming the node and the reason."""
    import torch

    from mithril.backends.torch import backend as torch_backend

    monkeypatch.setitem(torch_backend._DYNAMO_CONFIG, "trace_numpy", True)
    # Dynamo caches what it compiled per function, the kernels' included, across models: start
    # from nothing so the kernels are traced again under this setting, and leave nothing behind.
    torch._dynamo.reset()
    try:
        _trace_numpy_bert(tmp_path_factory)
    finally:
        torch._dynamo.reset()


def _trace_numpy_bert(tmp_path_factory):
    model, data = _exported("bert", tmp_path_factory.mktemp("export"))
    eager = ml.compile(model, ml.TorchBackend())
    want = eager.evaluate(None, data)
    cot = {k: np.ones(tuple(v.shape), np.float32) for k, v in want.items() if v.is_floating_point()}
    _, want_grads = eager.evaluate(None, data, output_gradients=cot)
    pm = ml.compile(model, ml.TorchBackend(compile=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = pm.evaluate(None, data)
        _, grads = pm.evaluate(None, data, output_gradients=cot)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)]
    assert len(fallbacks) == 1 and "\n" not in fallbacks[0], fallbacks
    assert fallbacks[0].startswith("running un-jitted: node '/model/embeddings/")
    assert "torch.compile failed: AssertionError: Expected np.nditer base" in fallbacks[0]
    for name, ref in want.items():
        np.testing.assert_allclose(got[name].numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    for name, ref in want_grads.items():
        np.testing.assert_allclose(grads[name].numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
