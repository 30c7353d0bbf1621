"""The JAX backend: tensor API, whole-graph jit and its fallback, gradients, x64 scoping, devices, parity."""

import re
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.compile import JitFallbackWarning
from mithril.errors import BackendUnavailableError

from tests.conftest import make_model

jax = pytest.importorskip("jax", reason="the JAX backend needs jax (pip install mithril[jax])")
D, F, I64 = TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.INT64


@pytest.fixture(scope="module")
def backend():
    return ml.JaxBackend()


def _compile(model, backend, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)  # a test of jit must not pass eagerly
        return _Strict(ml.compile(ml.load_onnx(model), backend, **kw))


class _Strict:
    """A compiled model whose every evaluation must run jitted (a fallback warning fails the test)."""

    def __init__(self, pm):
        self.pm = pm

    def __getattr__(self, name):
        return getattr(self.pm, name)

    def evaluate(self, *args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("error", JitFallbackWarning)
            result = self.pm.evaluate(*args, **kwargs)
        assert self.pm._jitted is not None
        return result


# -- tensor API, devices, x64 -----------------------------------------------------------------
def test_tensor_api(backend):
    a = backend.array([[1.0, 2.0], [3.0, 4.0]])
    assert isinstance(a, jax.Array) and a.dtype == np.float32
    assert backend.to_numpy(backend.add(a, backend.ones(2, 2))).tolist() == [[2, 3], [4, 5]]
    assert backend.to_numpy(backend.matmul(a, a)).tolist() == [[7, 10], [15, 22]]
    assert backend.to_numpy(backend.sum(a, axis=0)).tolist() == [4, 6]
    assert backend.to_numpy(backend.relu(backend.array([-1.0, 2.0]))).tolist() == [0, 2]
    assert backend.reshape(backend.arange(6), (2, 3)).shape == (2, 3)
    # int64 and float64 survive although the global x64 flag is off
    assert backend.add(backend.arange(3), backend.arange(3)).dtype == np.int64
    assert ml.JaxBackend(dtype=ml.float64).randn(2, 2).dtype == np.float64


def test_x64_is_scoped_not_global(backend, conv_model):
    before = jax.config.jax_enable_x64
    pm = _compile(conv_model, backend, shapes={"x": [1, 4, 8, 8]})
    pm.evaluate(None, {"x": backend.randn(1, 4, 8, 8)})
    assert jax.config.jax_enable_x64 == before


def test_missing_device_warns_and_runs_on_cpu():
    # Issue 22: an absent device says so in one warning line (naming what is present) and runs.
    with pytest.warns(ml.errors.DeviceFallbackWarning, match=r"'tpu:3' is not present \(present devices: cpu:0(, \w+:\d+)*\); running on cpu"):
        b = ml.JaxBackend(device="tpu:3")
    assert b.device == "cpu:0" and b.to_numpy(b.ones(2)).tolist() == [1.0, 1.0]
    assert ml.JaxBackend(device="cpu:0").device == "cpu:0"
    with pytest.raises(ml.errors.BackendOptionError, match="'banana' is not a device.*cpu, gpu, tpu"):
        ml.JaxBackend(device="banana")


# -- whole-graph jit --------------------------------------------------------------------------
def test_jit_matches_numpy_on_conv_model(backend, conv_model):
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    want = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(), inference=True).evaluate(None, {"x": x})["y"]
    pm = _compile(conv_model, backend)
    got = pm.evaluate(None, {"x": backend.from_numpy(x)})["y"]
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-5, atol=1e-5)


def test_shape_arithmetic_stays_static_under_jit(backend):
    # Shape -> Gather -> Concat -> Reshape with no shapes given at compile: the traced array's
    # shape is static, so the new shape must be concrete inside jax.jit.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="flatten"),
    ]
    model = make_model(nodes, [("x", F, ["N", 3, 4])], [("y", F, ["N", 12])],
                       {"zero": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    pm = _compile(model, backend)
    for n in (2, 5):
        x = np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)
        y = pm.evaluate(None, {"x": backend.from_numpy(x)})["y"]
        assert y.shape == (n, 12)
        np.testing.assert_array_equal(backend.to_numpy(y), x.reshape(n, 12))


def test_value_dependent_shape_runs_eagerly_naming_the_node(backend):
    nodes = [helper.make_node("NonZero", ["x"], ["i"], name="where_nonzero"),
             helper.make_node("Transpose", ["i"], ["y"], perm=[1, 0])]
    model = make_model(nodes, [("x", F, [5])], [("y", I64, ["K", 1])])
    with pytest.warns(JitFallbackWarning, match="where_nonzero"):
        pm = ml.compile(ml.load_onnx(model), backend)
    y = pm.evaluate(None, {"x": backend.array([0.0, 2.0, 0.0, 3.0, 1.0])})["y"]
    assert backend.to_numpy(y).tolist() == [[1], [3], [4]]


def test_shape_from_data_falls_back_at_first_call_naming_the_node(backend):
    # Reshape's shape arrives as data: the trace cannot read it, the program runs eagerly.
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_by_data")]
    model = make_model(nodes, [("x", F, [6]), ("shape", I64, [2])], [("y", F, None)])
    pm = ml.compile(ml.load_onnx(model), backend)
    with pytest.warns(JitFallbackWarning, match="reshape_by_data"):
        y = pm.evaluate(None, {"x": backend.arange(6.0), "shape": backend.array(np.array([2, 3]))})["y"]
    assert y.shape == (2, 3)


def test_a_failed_trace_falls_back_once_for_forward_and_gradients_apart(backend):
    # The forward falls back at its first call (one warning); the gradients' own jitted program
    # fails its trace too, and falls back once more; later calls run eagerly without a warning.
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_by_data")]
    model = make_model(nodes, [("x", F, [6]), ("shape", I64, [2])], [("y", F, None)])
    pm = ml.compile(ml.load_onnx(model), backend, data_keys=["x"])
    data = {"x": backend.arange(6.0), "shape": backend.array(np.array([2, 3]))}
    cot = {"y": backend.ones(2, 3)}
    with pytest.warns(JitFallbackWarning, match="reshape_by_data"):
        pm.evaluate(None, data, output_gradients=cot)
    assert pm._jitted is not None  # the forward's jit is not given up for the gradients' failure
    with pytest.warns(JitFallbackWarning, match="reshape_by_data"):
        pm.evaluate(None, data)
    assert pm._jitted is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        y = pm.evaluate(None, data)["y"]
        _, grads = pm.evaluate(None, data, output_gradients=cot)
    assert y.shape == (2, 3)
    np.testing.assert_array_equal(backend.to_numpy(grads["x"]), np.ones(6))


def test_after_a_jitted_run_worked_a_failure_is_an_error_not_a_fallback(backend, conv_model):
    pm = _compile(conv_model, backend, shapes={"x": [1, 4, 8, 8]})
    data = {"x": backend.randn(1, 4, 8, 8)}
    pm.evaluate(None, data)
    jitted = pm._jitted

    def broken(params, data):
        raise RuntimeError("device lost")

    pm.pm._jitted = broken
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        with pytest.raises(ml.errors.EvaluationError, match="device lost"):
            pm.pm.evaluate(None, data)
    assert pm.pm._jitted is broken  # not dropped for eager: the error is the caller's to see
    pm.pm._jitted = jitted


# -- gradients ----------------------------------------------------------------------------------
# Conv -> Gemm -> Softmax gradients on every backend: tests/kernels/test_nn.py.


# If and Loop gradients on every autodiff backend: tests/kernels/test_control_flow.py.


def test_non_floating_outputs_get_zero_cotangents():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("ArgMax", ["y"], ["k"], axis=0)]
    model = make_model(nodes, [("x", D, [4])], [("y", D, [4]), ("k", I64, [1])], {"w": np.arange(4.0)})
    backend = ml.JaxBackend(dtype=ml.float64)
    pm = _compile(model, backend)
    out, grads = pm.evaluate(None, {"x": backend.from_numpy(np.ones(4))}, output_gradients={"y": np.ones(4)})
    assert backend.to_numpy(out["k"]).tolist() == [3]
    assert backend.to_numpy(grads["w"]).tolist() == [1, 1, 1, 1]


# -- parity with NumPy on an exported network -----------------------------------------------------
def test_resnet_export_matches_numpy(backend):
    pytest.importorskip("torch", reason="the ResNet export needs torch")
    from models_zoo import torch_reference as models

    spec = models.build("resnet18", image_size=32)
    onnx_bytes = models.export_onnx(spec, "torchscript")
    data = spec.numpy_inputs(2)
    want = ml.compile(ml.load_onnx(onnx_bytes), ml.NumpyBackend(), inference=True).evaluate(None, data)
    pm = _compile(onnx_bytes, backend)
    got = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in data.items()})
    for name, value in want.items():
        np.testing.assert_allclose(backend.to_numpy(got[name]), value, rtol=1e-4, atol=1e-4)


def test_accelerator_conv_path_matches_im2col(monkeypatch):
    # On GPU/TPU Conv is lax.conv_general_dilated; check that path here against the shared kernel.
    from mithril.backends.kernels import nn
    from mithril.backends.jax import overrides as jax_kernels

    monkeypatch.setattr(jax_kernels, "_on_cpu", lambda: False)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = dict(auto_pad="NOTSET", dilations=(2, 1), group=2, kernel_shape=None, pads=(1, 0, 2, 1), strides=(2, 3))
    want = nn.conv(x, w, b, xp=np, **attrs)
    got = jax_kernels.conv(jax.numpy.asarray(x), jax.numpy.asarray(w), jax.numpy.asarray(b), xp=jax.numpy, **attrs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.fixture
def on_the_cpu():
    """The CPU as jax's default device: the Conv kernel picks its CPU paths by the device it
    traces for (JaxBackend.scope sets it; these tests call the kernel under a bare jax.jit), and
    on a GPU machine jax's default is the GPU, which takes lax.conv."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        # depthwise (multiply-add of shifted slices), with a channel multiplier, strided
        ((2, 4, 9, 8), (4, 1, 3, 3), dict(group=4, pads=(1, 1, 1, 1), strides=(2, 1))),
        ((1, 3, 7, 7), (6, 1, 3, 2), dict(group=3, pads=(0, 1, 2, 0), dilations=(2, 1))),
        # dense and grouped im2col with the batch moved into the matmul, 1x1, 1-D and 3-D
        ((3, 4, 9, 7), (6, 4, 3, 2), dict(group=1, pads=(1, 0, 2, 1), strides=(2, 3))),
        ((2, 4, 6, 6), (8, 2, 3, 3), dict(group=2, pads=(1, 1, 1, 1))),
        ((2, 8, 5, 5), (3, 8, 1, 1), dict(group=1)),
        ((2, 4, 11), (6, 2, 3), dict(group=2, auto_pad="SAME_UPPER")),
        ((2, 2, 4, 5, 3), (4, 2, 3, 3, 3), dict(group=1, auto_pad="SAME_LOWER")),
    ],
)
def test_cpu_conv_paths_match_the_shared_kernel(on_the_cpu, x_shape, w_shape, attrs):
    from mithril.backends.kernels import nn
    from mithril.backends.jax import overrides as jax_kernels

    rng = np.random.default_rng(3)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    attrs = dict(dict(auto_pad="NOTSET", dilations=None, kernel_shape=None, pads=None, strides=None), **attrs)
    want = nn.conv(x, w, b, xp=np, **attrs)
    jnp = jax.numpy
    got = jax.jit(lambda x, w, b: jax_kernels.conv(x, w, b, xp=jnp, **attrs))(x, w, b)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # float16 accumulates in float32: within float16 rounding of the float32 result.
    got16 = jax.jit(lambda x, w: jax_kernels.conv(x, w, None, xp=jnp, **attrs))(x.astype(np.float16),
                                                                                 w.astype(np.float16))
    want16 = nn.conv(x.astype(np.float16).astype(np.float32), w.astype(np.float16).astype(np.float32), None,
                     xp=np, **attrs)
    np.testing.assert_allclose(np.asarray(got16, np.float32), want16, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("limit", ["between", "below"])
def test_large_patch_convs_go_per_sample_or_to_xla(monkeypatch, on_the_cpu, limit):
    # Batched convs whose patch matrix passes the limit run one sample at a time (lax.map), or as
    # lax.conv when one sample's patches pass it too; values and gradients match either way.
    from mithril.backends.kernels import nn
    from mithril.backends.jax import overrides as jax_kernels

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 9, 7)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 2)).astype(np.float32)
    attrs = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=(1, 0, 2, 1), strides=(2, 1))
    want = nn.conv(x, w, None, xp=np, **attrs)
    sample = 4 * 6 * want.shape[2] * want.shape[3] * 4  # c * taps * pixels * itemsize
    monkeypatch.setattr(jax_kernels, "_PATCHES_MAX_BYTES", sample + 1 if limit == "between" else sample - 1)
    jnp = jax.numpy
    f = jax.jit(lambda x, w: jax_kernels.conv(x, w, None, xp=jnp, **attrs))
    lowered = f.lower(x, w).as_text()
    assert ("while" in lowered) == (limit == "between")
    np.testing.assert_allclose(np.asarray(f(x, w)), want, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda w: jnp.sum(jnp.tanh(f(x, w))))(w)
    monkeypatch.setattr(jax_kernels, "_PATCHES_MAX_BYTES", 1 << 40)
    ref = jax.grad(lambda w: jnp.sum(jnp.tanh(jax_kernels.conv(x, w, None, xp=jnp, **attrs))))(w)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref), rtol=1e-4, atol=1e-4)


def test_max_pool_gradient_under_jit():
    # lax.reduce_window with a traced init has no gradient; the override passes a concrete one.
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              name="pool")]
    model = make_model(nodes, [("x", F, [1, 1, 4, 4])], [("y", F, [1, 1, 2, 2])])
    backend = ml.JaxBackend()
    pm = _compile(model, backend, data_keys=["x"])
    x = np.random.default_rng(0).permutation(16).astype(np.float32).reshape(1, 1, 4, 4)
    _, grads = pm.evaluate(None, {"x": backend.from_numpy(x)}, output_gradients={"y": np.ones((1, 1, 2, 2), np.float32)})
    want = np.zeros(16, np.float32)
    for window in (x[0, 0, :2, :2], x[0, 0, :2, 1:], x[0, 0, 1:, :2], x[0, 0, 1:, 1:]):
        want[int(window.max())] += 1  # values are 0..15, so a value is its flat index's key
    np.testing.assert_array_equal(backend.to_numpy(grads["x"]).reshape(-1)[np.argsort(x.reshape(-1))], want)
    # Ties (a window of zeros after a ReLU) send the cotangent to one maximum, as PyTorch and
    # onnxruntime do, not a share to each.
    _, grads = pm.evaluate(None, {"x": backend.from_numpy(np.zeros((1, 1, 4, 4), np.float32))},
                           output_gradients={"y": np.ones((1, 1, 2, 2), np.float32)})
    g = backend.to_numpy(grads["x"])
    assert set(np.unique(g)) <= {0.0, 1.0, 2.0, 3.0, 4.0} and g.sum() == 4.0


# -- XLA options and the CPU kernels chosen for speed --------------------------------------------


def _optimized_hlo(pm, backend, params, data):
    with backend.scope():
        return pm._jitted._compiled.lower(params, data).compile().as_text()


def test_compiler_options_reach_every_program():
    # Options reach the forward and gradient programs alike: an empty YNNPACK fusion list turns
    # those fusions off, {} gives XLA's defaults (on) back, and the CPU default keeps them where
    # they win (Intel CPUs with AVX-512), and in this window-free forward program wherever XLA
    # has several threads, and turns them off elsewhere.
    from mithril.backends.jax import backend as jax_backend

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = make_model(nodes, [("x", F, [128, 64]), ("w", F, [64, 64])], [("y", F, [128, 64])])
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((128, 64), np.float32), rng.standard_normal((64, 64), np.float32)
    wins = jax_backend._ynn_fusions_win()
    for options, forward_fused, fused in ((None, wins or jax_backend._usable_cpus() > 1, wins), ({}, True, True),
                                          ({"xla_cpu_experimental_ynn_fusion_type": ""}, False, False)):
        backend = ml.JaxBackend(compiler_options=options)
        pm = _compile(model, backend, data_keys=["x", "w"])
        data = {"x": backend.from_numpy(x), "w": backend.from_numpy(w)}
        assert ("__ynn_fusion" in _optimized_hlo(pm, backend, {}, data)) is forward_fused
        out, grads = pm.evaluate({}, data, output_gradients={"y": np.ones((128, 64), np.float32)})
        np.testing.assert_allclose(backend.to_numpy(out["y"]), x @ w, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(backend.to_numpy(grads["x"]), np.ones((128, 64)) @ w.T, rtol=1e-4, atol=1e-4)
        (run,) = backend._vjp_cache.values()
        with backend.scope():
            cot = {"y": np.ones((128, 64), np.float32)}
            hlo = run.jitted.lower({}, data, cot).compile().as_text()
        assert ("__ynn_fusion" in hlo) is fused


def test_cpu_default_options_are_dropped_where_xla_does_not_know_them(monkeypatch):
    # An older jaxlib rejects an option of the default (YNNPACK came with 2025's XLA): the backend
    # takes the next default it accepts, down to XLA's own.
    from mithril.backends.jax import backend as jax_backend

    no_ynn = {"xla_cpu_experimental_ynn_fusion_type": ""}
    unknown = {"xla_cpu_no_such_option": True}
    monkeypatch.setattr(jax_backend, "_ynn_fusions_win", lambda: False)
    monkeypatch.setattr(jax_backend, "_CPU_COMPILER_OPTIONS", ({**no_ynn, **unknown}, no_ynn, {}))
    backend = ml.JaxBackend()
    assert backend.compiler_options == no_ynn and not backend._library_convolutions
    monkeypatch.setattr(jax_backend, "_CPU_COMPILER_OPTIONS", (unknown, {}))
    assert ml.JaxBackend().compiler_options == {}
    monkeypatch.undo()
    xnn = {"xla_cpu_use_xnnpack": True,
           "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"}
    # YNNPACK takes the dots (and nothing else) where they win; its fusions are off elsewhere.
    ynn_dots = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
    # XLA dropped its older loop emitters (jaxlib 0.11 rejects the option): where this jaxlib has
    # them, the default asks for them.
    old_emitters = {"xla_cpu_use_fusion_emitters": False}
    if jax_backend._rejected_options(jax_backend.jax.devices("cpu")[0], tuple(old_emitters.items())) is not None:
        old_emitters = {}
    for wins, ynn in ((True, ynn_dots), (False, no_ynn)):
        monkeypatch.setattr(jax_backend, "_ynn_fusions_win", lambda wins=wins: wins)
        backend = ml.JaxBackend()
        assert backend.compiler_options == {"xla_allow_excess_precision": False, **ynn, **xnn, **old_emitters}
        assert backend._library_convolutions
        # A jaxlib without the older emitters keeps the rest of the set.
        real = jax_backend._rejected_options
        monkeypatch.setattr(jax_backend, "_rejected_options",
                            lambda device, options: "unknown" if dict(options).keys() & old_emitters.keys()
                            else real(device, options))
        assert ml.JaxBackend().compiler_options == {"xla_allow_excess_precision": False, **ynn, **xnn}
        monkeypatch.setattr(jax_backend, "_rejected_options", real)


def _forward_options(model, backend):
    """The forward program compiled for inference, and the XLA options it was jitted with."""
    pm = _compile(model, backend, inference=True)
    options = pm._jitted.compiler_options  # what scripts/bench.py's jax_program_options reads
    assert options == pm._jitted._compiled._jit.keywords["compiler_options"]  # what both programs compile with
    return pm, options


def _mlp_and_cnn():
    """A program without windows (MatMul, Relu) and one with a Conv."""
    rng = np.random.default_rng(0)
    mlp = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                     [("x", F, [128, 64])], [("y", F, [128, 64])],
                     {"w": rng.standard_normal((64, 64)).astype(np.float32)})
    cnn = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                     [("x", F, [1, 4, 8, 8])], [("y", F, [1, 4, 8, 8])],
                     {"w": rng.standard_normal((4, 4, 3, 3)).astype(np.float32)})
    return mlp, cnn


def test_programs_with_narrow_floats_keep_the_mlir_emitters(monkeypatch):
    # The CPU default compiles forward programs with XLA's older loop emitters (half the compile
    # memory), except one holding float8/float4 values: those emitters turn NaN into a wrong FNUZ
    # float8. Gradient programs keep the MLIR ones; options the user chose are never changed.
    from mithril.backends.jax import backend as jax_backend

    default = ml.JaxBackend()
    if default.compiler_options.get("xla_cpu_use_fusion_emitters") is not False:
        pytest.skip("this jaxlib has no xla_cpu_use_fusion_emitters: nothing to choose")
    f8 = TensorProto.FLOAT8E4M3FNUZ
    nodes = [helper.make_node("Cast", ["x"], ["q"], to=f8), helper.make_node("Cast", ["q"], ["y"], to=F)]
    fnuz = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                          [helper.make_tensor_value_info("q", f8, [4]), helper.make_tensor_value_info("y", F, [4])]),
        opset_imports=[helper.make_opsetid("", 21)])
    relu = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [4])], [("y", F, [4])])

    options = _forward_options
    pm, chosen = options(fnuz, default)
    assert "xla_cpu_use_fusion_emitters" not in chosen
    x = np.array([np.nan, 1.0, -2.0, 0.5], np.float32)
    got = np.asarray(default.to_numpy(pm.evaluate(None, {"x": x})["q"]))
    np.testing.assert_array_equal(got.view(np.uint8), x.astype(got.dtype).view(np.uint8))  # NaN is 0x80
    assert options(relu, default)[1]["xla_cpu_use_fusion_emitters"] is False
    user = ml.JaxBackend(compiler_options=dict(default.compiler_options))
    assert options(fnuz, user)[1] == default.compiler_options
    # Gradient programs: the MLIR emitters, the rest of the default kept.
    seen = []
    make_vjp = jax_backend._make_vjp
    monkeypatch.setattr(jax_backend, "_make_vjp", lambda f, p, d, o: seen.append(o) or make_vjp(f, p, d, o))
    pm = _compile(relu, default, data_keys=["x"])
    pm.evaluate({}, {"x": x[1:].repeat(2)[:4]}, output_gradients={"y": np.ones(4, np.float32)})
    assert seen == [{k: v for k, v in default.compiler_options.items() if k != "xla_cpu_use_fusion_emitters"}]


def test_programs_without_convolutions_keep_xla_s_own_ynn_fusions(monkeypatch):
    # Where the default sends dots alone to YNNPACK (Intel, AVX-512, several threads), a forward
    # program with no convolution or pool gets XLA's own fusion list back (a transformer's matmuls
    # with their elementwise and reduce work ran faster); a CNN's keeps the dot-only list, and
    # options the user chose are never changed.
    from mithril.backends.jax import backend as jax_backend

    monkeypatch.setattr(jax_backend, "_ynn_fusions_win", lambda: True)
    mlp, cnn = _mlp_and_cnn()

    def options(model, backend):
        return _forward_options(model, backend)[1]

    default = ml.JaxBackend()
    assert default.compiler_options["xla_cpu_experimental_ynn_fusion_type"] == "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
    assert options(mlp, default) == {k: v for k, v in default.compiler_options.items()
                                     if k != "xla_cpu_experimental_ynn_fusion_type"}
    assert options(cnn, default) == default.compiler_options
    chosen = dict(default.compiler_options)
    assert options(mlp, ml.JaxBackend(compiler_options=chosen)) == chosen
    # And the program runs its dots in YNNPACK fusions, with the values of the dot-only one.
    pm = _compile(mlp, ml.JaxBackend(), inference=True)
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    assert "__ynn_fusion" in _optimized_hlo(pm, pm.backend, pm.get_parameters(), {"x": x})
    want = _compile(mlp, ml.JaxBackend(compiler_options=chosen), inference=True).evaluate(None, {"x": x})["y"]
    np.testing.assert_allclose(np.asarray(pm.evaluate(None, {"x": x})["y"]), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_window_free_programs_get_xla_s_ynn_fusions_where_xla_has_several_threads(monkeypatch):
    # Where the default runs no YNNPACK fusions (an AMD CPU, or no AVX-512), a forward program
    # with no convolution or pool still gets XLA's own list when XLA has more than one thread
    # (GPT-2's LM head ran 28 against 50 ms so on an AMD EPYC); on one thread, and in a CNN's
    # program, Eigen keeps the dots.
    from mithril.backends.jax import backend as jax_backend

    monkeypatch.setattr(jax_backend, "_ynn_fusions_win", lambda: False)
    mlp, cnn = _mlp_and_cnn()
    options = _forward_options

    default = ml.JaxBackend()
    if default.compiler_options.get("xla_cpu_experimental_ynn_fusion_type") != "":
        pytest.skip("this jaxlib has no YNNPACK fusions to turn on")
    xla_list = {k: v for k, v in default.compiler_options.items() if k != "xla_cpu_experimental_ynn_fusion_type"}
    for cpus, mlp_options in ((2, xla_list), (1, default.compiler_options)):
        monkeypatch.setattr(jax_backend, "_usable_cpus", lambda n=cpus: n)
        assert options(mlp, default)[1] == mlp_options
        assert options(cnn, default)[1] == default.compiler_options
    assert options(mlp, ml.JaxBackend(compiler_options=dict(default.compiler_options)))[1] == default.compiler_options
    # The MLP's dots then run in YNNPACK fusions (XLA has several threads), with the same values.
    monkeypatch.setattr(jax_backend, "_usable_cpus", lambda: 2)
    pm, _ = options(mlp, default)
    x = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
    assert "__ynn_fusion" in _optimized_hlo(pm, pm.backend, pm.get_parameters(), {"x": x})
    np.testing.assert_allclose(np.asarray(pm.evaluate(None, {"x": x})["y"]),
                               np.maximum(x @ pm.get_parameters()["w"], 0), rtol=1e-5, atol=1e-5)


def test_ynn_dots_on_intel_cpus_with_avx512_and_several_threads(monkeypatch):
    from mithril.backends.jax import backend as jax_backend

    for vendor, flags, cpus, wins in (("GenuineIntel", {"avx2", "avx512f"}, 2, True),
                                      ("GenuineIntel", {"avx2", "avx512f"}, 1, False),
                                      ("GenuineIntel", {"avx2"}, 2, False),
                                      ("AuthenticAMD", {"avx2", "avx512f"}, 2, False), ("", set(), 2, False)):
        monkeypatch.setattr(jax_backend, "_cpu_flags", lambda v=vendor, f=flags: (v, f))
        monkeypatch.setattr(jax_backend, "_usable_cpus", lambda n=cpus: n)
        assert jax_backend._ynn_fusions_win() is wins


def test_conv_kernel_reads_the_backend_options_from_its_ctx_argument():
    # The Conv kernel declares ctx; the generated program passes the backend's KernelOptions
    # (forward takes it as a parameter, so a caller may pass other options explicitly).
    from mithril.backends.jax import overrides

    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], name="conv")]
    model = make_model(nodes, [("x", F, [1, 16, 7, 7]), ("W", F, [24, 16, 1, 1])], [("y", F, [1, 24, 7, 7])])
    for options, ynn in (({"xla_cpu_experimental_ynn_fusion_type": ""}, False), ({}, True)):
        backend = ml.JaxBackend(compiler_options=options)
        assert backend.kernel_context == overrides.KernelOptions(library_convolutions=False, ynn_dots=ynn)
        pm = _compile(model, backend, data_keys=["x", "W"])
        lines = pm.code.splitlines()
        assert lines[0] == "def forward(params, data, ctx=ctx):"
        assert any("# Conv 'conv'" in line and line.split("  #")[0].endswith(", xp=xp, ctx=ctx)") for line in lines)
        assert pm.program.namespace["ctx"] is backend.kernel_context


@pytest.mark.parametrize("ynn, out_shape", [
    (True, "f32[49,24]"),    # YNNPACK's dots: rows @ W.T, whatever the rows
    (False, "f32[24,49]"),   # Eigen's, below 64 rows: W @ rows.T
])
def test_pointwise_conv_orientation_follows_the_dot_library(ynn, out_shape):
    # Which way round a pointwise Conv's matmul runs depends on the library XLA sends dots to
    # (overrides.py, _POINTWISE_MIN_ROWS); values match NumPy's either way.
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv")]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 7, 7)).astype(np.float32)
    params = {"W": rng.standard_normal((24, 16, 1, 1)).astype(np.float32) / 4,
              "B": rng.standard_normal(24).astype(np.float32)}
    model = make_model(nodes, [("x", F, [1, 16, 7, 7])], [("y", F, [1, 24, 7, 7])], params)
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), data_keys=["x"]).evaluate(params, {"x": x})
    options = {"xla_allow_excess_precision": False} if ynn else {"xla_cpu_experimental_ynn_fusion_type": ""}
    backend = ml.JaxBackend(compiler_options=options)
    assert backend._ynn_dots is ynn
    pm = _compile(model, backend, data_keys=["x"])
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    data = {"x": backend.from_numpy(x)}
    hlo = _optimized_hlo(pm, backend, jparams, data)
    assert re.search(re.escape(out_shape) + r"\{[0-9,]*\} dot\(", hlo), hlo
    out = pm.evaluate(jparams, data)
    np.testing.assert_allclose(backend.to_numpy(out["y"]), want["y"], rtol=1e-5, atol=1e-5)


_XNN = {"xla_allow_excess_precision": False, "xla_cpu_use_xnnpack": True,
        "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"}


@pytest.mark.parametrize("options, size, avx512, convolution, in_gradients", [
    (None, 14, False, True, True),    # 196 output pixels, 16 channels: XNNPACK's convolution
    # 49 pixels, Eigen's dots: im2col, but in forward programs on a CPU with AVX-512.
    ({**_XNN, "xla_cpu_experimental_ynn_fusion_type": ""}, 7, False, False, False),
    ({**_XNN, "xla_cpu_experimental_ynn_fusion_type": ""}, 7, True, True, False),
    # YNNPACK's dots: XNNPACK at every size (its convolution beats im2col + YNNPACK's matmul).
    ({**_XNN, "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}, 7, False, True, True),
    ({}, 14, True, False, False),     # XLA's defaults send no convolution to XNNPACK: im2col throughout
])
def test_conv_layers_go_to_xnnpack_where_it_is_faster(options, size, avx512, convolution, in_gradients,
                                                      monkeypatch):
    # Which layers: overrides/jax.py, from per-layer timings. Values and gradients match NumPy's
    # either way.
    from mithril.backends.jax import backend as jax_backend

    monkeypatch.setattr(jax_backend, "_cpu_flags", lambda: ("", frozenset({"avx512f"} if avx512 else ())))
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, size, size)).astype(np.float32)
    params = {"W": rng.standard_normal((8, 16, 3, 3)).astype(np.float32) / 12,
              "B": rng.standard_normal(8).astype(np.float32)}
    model = make_model(nodes, [("x", F, [1, 16, size, size])], [("y", F, [1, 8, size, size])], params)
    g = rng.standard_normal((1, 8, size, size)).astype(np.float32)
    reference = ml.NumpyBackend()
    ref = ml.compile(ml.load_onnx(model), reference, data_keys=["x"])
    want, want_grads = ref.evaluate(params, {"x": x}, output_gradients={"y": g})
    backend = ml.JaxBackend(compiler_options=options)
    pm = _compile(model, backend, data_keys=["x"])
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    data = {"x": backend.from_numpy(x)}
    hlo = _optimized_hlo(pm, backend, jparams, data)
    assert (" convolution(" in hlo) is convolution
    # The filter reaches the per-call program in the (kh, kw, C, M) layout XLA's convolution reads:
    # no instruction there rearranges it (the transposition is parameter-only work, done once).
    entry = hlo[hlo.index("ENTRY"):]
    assert not re.search(r"= f32\[3,3,16,8\]\{[0-9,]*\} (?!parameter|bitcast)", entry)
    out, grads = pm.evaluate(jparams, data, output_gradients={"y": g})
    np.testing.assert_allclose(backend.to_numpy(out["y"]), want["y"], rtol=1e-4, atol=1e-4)
    for name, value in want_grads.items():
        np.testing.assert_allclose(backend.to_numpy(grads[name]), value, rtol=1e-4, atol=1e-3)
    (run,) = backend._vjp_cache.values()
    with backend.scope():
        gradient_hlo = run.jitted.lower(jparams, data, {"y": g}).compile().as_text()
    assert (" convolution(" in gradient_hlo) is in_gradients


def test_conv_transpose_reads_its_filter_without_rearranging_it_per_call():
    # ConvTranspose flips and transposes its filter into a convolution's: parameter-only work,
    # done once, including the (kh, kw, C, M) order XLA:CPU's convolution reads. Values match
    # NumPy's (which has no ConvTranspose gradient to compare with).
    nodes = [helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                              name="up")]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    params = {"W": rng.standard_normal((16, 8, 3, 3)).astype(np.float32) / 12,
              "B": rng.standard_normal(8).astype(np.float32)}
    model = make_model(nodes, [("x", F, [1, 16, 9, 9])], [("y", F, [1, 8, 17, 17])], params)
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True).evaluate(params, {"x": x})
    backend = ml.JaxBackend()
    pm = _compile(model, backend, inference=True)
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    data = {"x": backend.from_numpy(x)}
    hlo = _optimized_hlo(pm, backend, jparams, data)
    entry = hlo[hlo.index("ENTRY"):]
    assert " convolution(" in entry
    assert not re.search(r"= f32\[3,3,16,8\]\{[0-9,]*\} (?!parameter|bitcast)", entry)
    np.testing.assert_allclose(backend.to_numpy(pm.evaluate(jparams, data)["y"]), want["y"], rtol=1e-4, atol=1e-4)


def test_rejected_compiler_options_fail_at_construction_naming_them():
    with pytest.raises(BackendUnavailableError, match="rejects compiler_options.*xla_cpu_no_such_option"):
        ml.JaxBackend(compiler_options={"xla_cpu_no_such_option": True})
    with pytest.raises(BackendUnavailableError, match="strings, numbers or booleans"):
        ml.JaxBackend(compiler_options={"xla_cpu_enable_fast_math": [True]})


def test_gemm_contracts_transposed_weights_without_copying_them():
    # `x @ W.T` before a matrix-vector product made XLA:CPU copy W transposed on every call.
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc")]
    model = make_model(nodes, [("x", F, [1, 256]), ("w", F, [100, 256]), ("b", F, [100])], [("y", F, [1, 100])])
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s, np.float32) for s in ((1, 256), (100, 256), (100,)))
    backend = ml.JaxBackend()
    pm = _compile(model, backend)
    data = {k: backend.from_numpy(v) for k, v in (("x", x), ("w", w), ("b", b))}
    np.testing.assert_allclose(backend.to_numpy(pm.evaluate({}, data)["y"]), x @ w.T + b, rtol=1e-4, atol=1e-4)
    assert " transpose(" not in _optimized_hlo(pm, backend, {}, data)


def test_erf_and_gelu_are_xla_primitives_in_float32():
    # The shared erf is a float64 polynomial written for NumPy; under XLA it cost a third of BERT.
    nodes = [helper.make_node("Erf", ["x"], ["e"], name="erf"), helper.make_node("Gelu", ["x"], ["g"], name="gelu")]
    model = make_model(nodes, [("x", F, [64])], [("e", F, [64]), ("g", F, [64])], opset=20)
    x = np.linspace(-6, 6, 64, dtype=np.float32)
    backend = ml.JaxBackend()
    pm = _compile(model, backend)
    data = {"x": backend.from_numpy(x)}
    out = pm.evaluate({}, data)
    from scipy import special

    np.testing.assert_allclose(backend.to_numpy(out["e"]), special.erf(x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(backend.to_numpy(out["g"]), 0.5 * x * special.erfc(-x / np.sqrt(2)), rtol=1e-6,
                               atol=1e-7)
    assert "f64" not in _optimized_hlo(pm, backend, {}, data)


def _mobile_block(batch, size, multiplier=1):
    """Pointwise Conv -> Relu -> depthwise 3x3 Conv (channel multiplier) -> Relu -> pointwise
    stride-2 Conv: a MobileNet block, whose convolutions the JAX CPU path runs channels last."""
    c, m = 8, 16
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["a"], name="expand"),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "W2", "B2"], ["d"], group=m, pads=[1, 1, 1, 1], name="depthwise"),
             helper.make_node("Relu", ["d"], ["s"]),
             helper.make_node("Conv", ["s", "W3"], ["y"], strides=[2, 2], name="project")]
    rng = np.random.default_rng(7)
    params = {"W1": rng.standard_normal((m, c, 1, 1)).astype(np.float32) / 3,
              "B1": rng.standard_normal(m).astype(np.float32),
              "W2": rng.standard_normal((m * multiplier, 1, 3, 3)).astype(np.float32) / 3,
              "B2": rng.standard_normal(m * multiplier).astype(np.float32),
              "W3": rng.standard_normal((4, m * multiplier, 1, 1)).astype(np.float32) / 4}
    out = (size + 1) // 2
    model = make_model(nodes, [("x", F, [batch, c, size, size])], [("y", F, [batch, 4, out, out])], params)
    x = rng.standard_normal((batch, c, size, size)).astype(np.float32)
    g = rng.standard_normal((batch, 4, out, out)).astype(np.float32)
    return model, params, x, g


@pytest.mark.parametrize("batch, size, multiplier", [
    (2, 10, 1),  # 200 and 50 rows: the expand as rows @ W.T, the projection as W @ rows.T
    (1, 16, 2),  # a depthwise channel multiplier of 2
    (1, 5, 1),   # odd sizes: the stride-2 projection keeps the last row and column
])
def test_mobilenet_blocks_match_numpy_values_and_gradients(batch, size, multiplier):
    model, params, x, g = _mobile_block(batch, size, multiplier)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), data_keys=["x"])
    want, want_grads = ref.evaluate(params, {"x": x}, output_gradients={"y": g})
    backend = ml.JaxBackend()
    pm = _compile(model, backend, data_keys=["x"])
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    out, grads = pm.evaluate(jparams, {"x": backend.from_numpy(x)}, output_gradients={"y": g})
    np.testing.assert_allclose(backend.to_numpy(out["y"]), want["y"], rtol=1e-4, atol=1e-4)
    assert set(grads) == set(want_grads)
    for name, value in want_grads.items():
        np.testing.assert_allclose(backend.to_numpy(grads[name]), value, rtol=1e-4, atol=1e-3, err_msg=name)


def test_depthwise_reads_every_tap_from_its_padded_input():
    # A stem (im2col: its matmul writes channels first) feeding a depthwise Conv. Left alone, XLA
    # reads the centre tap from the pad's operand and fuses the stem's matmul output, transposed,
    # into the depthwise loop. The loop must read only the padded activation and the per-tap
    # weight vectors; values and gradients match NumPy's.
    m = 8
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem"),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "W2"], ["y"], group=m, pads=[1, 1, 1, 1], name="depthwise")]
    rng = np.random.default_rng(8)
    params = {"W1": rng.standard_normal((m, 3, 3, 3)).astype(np.float32) / 5,
              "B1": rng.standard_normal(m).astype(np.float32),
              "W2": rng.standard_normal((m, 1, 3, 3)).astype(np.float32) / 3}
    model = make_model(nodes, [("x", F, [1, 3, 32, 32])], [("y", F, [1, m, 16, 16])], params)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    g = rng.standard_normal((1, m, 16, 16)).astype(np.float32)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), data_keys=["x"])
    want, want_grads = ref.evaluate(params, {"x": x}, output_gradients={"y": g})
    backend = ml.JaxBackend()
    pm = _compile(model, backend, data_keys=["x"])
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    data = {"x": backend.from_numpy(x)}
    hlo = _optimized_hlo(pm, backend, jparams, data)
    # The depthwise loop: the fusion reading the padded activation, (1, 18, 18, m) channels last.
    loops = [line for line in hlo.splitlines()
             if line.startswith("%fused") and f"f32[1,18,18,{m}]" in line.split("->")[0]]
    assert len(loops) == 1
    operands = re.findall(r"param_[0-9.]+: (\w+\[[0-9,]*\])", loops[0])
    assert set(operands) <= {f"f32[1,18,18,{m}]", f"f32[{m},1,1,1]"}, operands
    out, grads = pm.evaluate(jparams, data, output_gradients={"y": g})
    np.testing.assert_allclose(backend.to_numpy(out["y"]), want["y"], rtol=1e-4, atol=1e-4)
    for name, value in want_grads.items():
        np.testing.assert_allclose(backend.to_numpy(grads[name]), value, rtol=1e-4, atol=1e-3, err_msg=name)


def test_weights_are_held_once_on_the_cpu():
    # The model keeps each weight in a buffer aligned as XLA:CPU aligns its own (JaxBackend.share),
    # and evaluate(None, ...) runs that buffer in place: no second copy of the weights on the
    # device. Read-only (XLA treats its buffers as immutable); the values are the file's.
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    rng = np.random.default_rng(3)
    params = {"W": rng.standard_normal((64, 48)).astype(np.float32),
              "b": rng.standard_normal(48).astype(np.float32)}
    x = rng.standard_normal((5, 64)).astype(np.float32)
    model = ml.load_onnx(make_model(nodes, [("x", F, [5, 64])], [("y", F, [5, 48])], params))
    backend = ml.JaxBackend()
    pm = ml.compile(model, backend)
    got = backend.to_numpy(pm.evaluate(None, {"x": backend.from_numpy(x)})["y"])
    np.testing.assert_allclose(got, x @ params["W"] + params["b"], rtol=1e-5, atol=1e-5)
    for name, value in params.items():
        kept = model.ir.graph.initializers[name].const_value.numpy()
        assert not kept.flags.writeable and kept.ctypes.data % 64 == 0
        np.testing.assert_array_equal(kept, value)
        assert pm._own_parameters()[name].unsafe_buffer_pointer() == kept.ctypes.data, name


@pytest.mark.parametrize("ynn", [True, False])
def test_large_weight_transposed_for_a_dot_is_read_in_place_by_ynnpack(ynn):
    # A tied LM head (logits = h @ embedding.T): with YNNPACK's dots the per-call program reads the
    # weight in place (no transposed copy kept beside it); with Eigen's, the transpose is
    # parameter-only work kept as a residual. Values match NumPy's either way.
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["y"])]
    rng = np.random.default_rng(9)
    params = {"W": rng.standard_normal((2048, 512)).astype(np.float32) / 20}
    x = rng.standard_normal((8, 512)).astype(np.float32)
    model = make_model(nodes, [("x", F, [8, 512])], [("y", F, [8, 2048])], params)
    options = {"xla_allow_excess_precision": False} if ynn else {"xla_cpu_experimental_ynn_fusion_type": ""}
    backend = ml.JaxBackend(compiler_options=options)
    pm = _compile(model, backend, data_keys=["x"])
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    got = backend.to_numpy(pm.evaluate(jparams, {"x": backend.from_numpy(x)})["y"])
    np.testing.assert_allclose(got, x @ params["W"].T, rtol=1e-4, atol=1e-4)
    split, _, _ = next(iter(pm._jitted._compiled._programs.values()))
    assert split.residual_bytes == (0 if ynn else params["W"].nbytes)
    hlo = _optimized_hlo(pm, backend, jparams, {"x": backend.from_numpy(x)})
    entry = hlo[hlo.index("ENTRY"):]
    assert ("f32[512,2048]" in entry) is not ynn  # the transposed copy, a parameter of main


def test_parameter_only_work_runs_once_per_set_of_parameters():
    # The pointwise weight's transpose and the depthwise per-tap vectors depend on parameters
    # alone: a prepare program computes them, and the per-call program reads them while the
    # caller passes the same arrays. New arrays, or NumPy arrays (mutable), are prepared afresh.
    model, params, x, _ = _mobile_block(2, 10)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    backend = ml.JaxBackend()
    pm = _compile(model, backend)
    data = {"x": backend.from_numpy(x)}
    first = {k: backend.from_numpy(v) for k, v in params.items()}
    changed = {**params, "W1": params["W1"] * -2, "W2": params["W2"] + 1}
    second = {k: backend.from_numpy(v) for k, v in changed.items()}

    def check(jparams, host):
        got = backend.to_numpy(pm.evaluate(jparams, data)["y"])
        np.testing.assert_allclose(got, ref.evaluate(host, {"x": x})["y"], rtol=1e-4, atol=1e-4)

    check(first, params)
    hoisted = pm._jitted._compiled
    split, _, _ = next(iter(hoisted._programs.values()))
    prepared = {e.primitive.name for e in split._prepare.jaxpr.eqns}
    assert "transpose" in prepared and "slice" in prepared, prepared
    # The biases' broadcasts stay in the per-call program (XLA fuses them): the residuals are
    # no larger than the weights they come from.
    assert 0 < split.residual_bytes <= sum(v.nbytes for k, v in params.items() if k.startswith("W"))
    state = hoisted._kept[3]  # the parameters the per-call program reads, and the residuals
    check(first, params)
    assert hoisted._kept[3] is state  # not prepared again
    check(second, changed)
    assert hoisted._kept[3] is not state
    check(first, params)
    mutable = {k: v.copy() for k, v in params.items()}
    check(mutable, params)
    mutable["W1"] *= -2
    mutable["W2"] += 1
    check(mutable, changed)  # the same NumPy arrays, changed in place


def test_rearranging_prepare_runs_in_numpy_on_the_cpu():
    # MobileNetV2-like: prepare is transposes, slices and reshapes only. On the CPU NumPy runs it
    # (XLA would compile a kernel per weight for work done once): the jitted prepare is never
    # compiled, and the residuals NumPy made are bit for bit what that program gives.
    model, params, x, _ = _mobile_block(2, 10)
    backend = ml.JaxBackend()
    pm = _compile(model, backend)
    jparams = {k: backend.from_numpy(v) for k, v in params.items()}
    pm.evaluate(jparams, {"x": backend.from_numpy(x)})
    hoisted = pm._jitted._compiled
    split, prepare, _ = next(iter(hoisted._programs.values()))
    assert split.host_prepare and hoisted.host_device == backend._device
    assert prepare._cache_size() == 0
    residuals = hoisted._kept[3][len(split.main_params):]
    assert residuals and all(r.devices() == {backend._device} for r in residuals)
    for got, want in zip(residuals, prepare(jparams), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Work NumPy has no rule for (a gather of an embedding table) keeps the jitted prepare.
    from mithril.backends.jax import hoist
    gather = jax.make_jaxpr(lambda w: w[np.array([1, 0])])(np.ones((2, 3), np.float32))
    assert not hoist._runs_on_host(gather.eqns)


def test_the_compilers_freed_heap_goes_back_after_each_compile_of_ours(monkeypatch):
    """XLA compiles in the calling thread's malloc arena; its freed heap is handed back to the
    system (glibc's malloc_trim) after each program JaxBackend compiles, and only then: a program
    the user jits outside Mithril's calls is left alone."""
    from mithril.backends.jax import backend as jb

    if jb._MALLOC_TRIM is None:
        pytest.skip("no glibc malloc_trim on this system: nothing to hand back")
    trims = []
    monkeypatch.setattr(jb, "_MALLOC_TRIM", lambda pad: trims.append(pad))
    rng = np.random.default_rng(3)
    f = TensorProto.FLOAT
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                       [("x", f, [5, 7])], [("y", f, [5, 3])], {"W": rng.standard_normal((7, 3)).astype(np.float32)})
    backend = ml.JaxBackend()
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    want = np.tanh(x @ np.asarray(pm.get_parameters()["W"]))
    np.testing.assert_allclose(backend.to_numpy(pm.evaluate(None, {"x": x})["y"]), want, rtol=1e-5, atol=1e-6)
    assert trims and set(trims) == {0}  # at least the forward program's compile
    seen = len(trims)
    pm.evaluate(None, {"x": x})  # compiled already: no compile, no trim
    assert len(trims) == seen
    jax.jit(lambda v: jax.numpy.sin(v) * 3)(np.ones(11, np.float32)).block_until_ready()  # the user's own
    assert len(trims) == seen
