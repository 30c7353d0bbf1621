"""The design documents' backend constructors, typed in as a user would (issue 22, Must 2).

Each test names the document and section whose call it makes, with the same arguments. This
machine has no GPU, TPU or Apple silicon: where a snippet asks for one, the backend says so in
one warning line (``DeviceFallbackWarning`` or ``BackendOptionWarning``) and runs on the CPU,
and the test checks the warning's text and that it ran. Options that can take effect here are
checked by what they change (numerics, dtypes, program text, allocator state).
"""

from __future__ import annotations

import gc
import re
import sys
import warnings

import jax
import jax.numpy as jnp
import mlx.core as mx
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.mlx.backend import MLXBackend
from mithril.errors import BackendOptionError, BackendOptionWarning, DeviceFallbackWarning

NO_CUDA = not torch.cuda.is_available()


def jax_gpu_count() -> int:
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:  # no GPU backend for jax here
        return 0
NO_JAX_GPU = not any(d.platform == "gpu" for d in jax.devices())
NO_MLX_GPU = not mx.is_available(mx.gpu)


def onnx_model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(initializers))
    return ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def weight(name, shape, dtype=np.float32, seed=0):
    values = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(values.dtype), shape, values.tobytes(), raw=True)


def matmul_relu(elem=TensorProto.FLOAT, dtype=np.float32, k=64, n=32):
    """y = relu(x @ w), x: [N, k], w: [k, n] (a parameter)."""
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                      [("x", elem, ["N", k])], [("y", elem, ["N", n])], [weight("w", [k, n], dtype)])


def w_of(model) -> np.ndarray:
    from mithril.dtypes import tensor_array

    return tensor_array(model.ir.graph.initializers["w"].const_value)


def data(shape, dtype=np.float32, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def one_warning(record, category, pattern):
    """Exactly one warning of ``category`` whose one-line text matches ``pattern``."""
    found = [w for w in record if issubclass(w.category, category) and re.search(pattern, str(w.message))]
    assert len(found) == 1, [str(w.message) for w in record]
    assert "\n" not in str(found[0].message)


# -- unknown options, device meshes, framework dtypes (every backend) --------------------------

@pytest.mark.parametrize("cls, valid", [
    (ml.NumpyBackend, "dtype, device, num_threads, device_mesh"),
    (ml.JaxBackend, "dtype, device, compiler_options, precision, pre_allocate, jit, debug, platform, device_mesh, "
                    "axis_names"),
    (ml.TorchBackend, "dtype, device, compile, jit, enable_amp, cudnn_benchmark, parallel_strategy, devices, device_mesh, "
                      "axis_names, onednn_graph"),
    (ml.MLXBackend, "dtype, device, random_seed, compute_precision, use_graph, jit, memory_limit, auto_free_tensors, "
                    "enable_mps_optimization, use_ane, device_mesh, axis_names"),
], ids=["numpy", "jax", "torch", "mlx"])
def test_unknown_option_lists_the_valid_ones(cls, valid):
    """Issue 22, Must 2: an option a backend does not have stays an error, listing the valid
    ones (a TypeError too, as Python's own for an unknown keyword)."""
    with pytest.raises(BackendOptionError, match=f"{cls.__name__} has no option 'enable_ampp'; valid options: {valid}$"):
        cls(enable_ampp=True)
    with pytest.raises(TypeError):
        cls(enable_ampp=True)


@pytest.mark.parametrize("cls", [ml.NumpyBackend, ml.JaxBackend, ml.TorchBackend, ml.MLXBackend],
                         ids=["numpy", "jax", "torch", "mlx"])
def test_device_mesh_of_one_device_and_larger(cls):
    """001 backends, "Device Mesh for Parallelism" (``device_mesh=(2, 2)``, ``(4,)``) and 000
    "Backend Initialization Reference": a mesh of one device is accepted everywhere. JAX builds
    larger ones over its devices (tests/conftest.py gives it four host devices); Torch needs a
    process per device (torchrun), so outside one it says so; NumPy and MLX run on one device and
    refuse, never a silent single device."""
    for mesh in (None, (1,), (1, 1)):
        backend = cls(device_mesh=mesh)
        assert backend.device_mesh == mesh
        assert backend.to_numpy(backend.ones(2)).tolist() == [1.0, 1.0]
    for mesh, count in (((2, 2), 4), ((4,), 4), ((2,), 2)):
        if cls is ml.JaxBackend:
            backend = cls(device_mesh=mesh)
            assert backend.device_mesh == mesh and backend.mesh.size == count
            assert len(backend.ones(2).sharding.device_set) == count  # whole on each device of the mesh
            continue
        with pytest.raises(ml.errors.MeshError, match=rf"device_mesh={re.escape(repr(mesh))}"):
            cls(device_mesh=mesh)
    with pytest.raises(BackendOptionError, match="device_mesh must be a tuple of positive ints"):
        cls(device_mesh=(0, "x"))


def test_initialization_reference_meshes():
    """000 backend comparison, "Backend Initialization Reference": the JAX 2x2 mesh as written
    (no GPU: the CPU's host devices, with a warning; fewer than 4 GPUs: a MeshError naming the
    count and device='cpu', which then runs it); PyTorch's (4,) mesh needs four processes
    (torchrun), and outside them says so; the MLX and NumPy constructors run."""
    gpus = jax_gpu_count()
    device = "gpu"
    if 0 < gpus < 4:
        with pytest.raises(ml.errors.MeshError, match=rf"device_mesh=\(2, 2\) needs 4 devices, but jax sees {gpus} "
                                                      rf"gpu device\(s\)\. Give a device_mesh of at most {gpus} "
                                                      r"device\(s\), or device='cpu'"):
            ml.JaxBackend(dtype=ml.float32, device="gpu", device_mesh=(2, 2))
        device = "cpu"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.JaxBackend(dtype=ml.float32, device=device, device_mesh=(2, 2), pre_allocate=True,
                                precision="bfloat16")
    if gpus == 0:
        one_warning(record, DeviceFallbackWarning, r"^JaxBackend: device 'gpu' is not present .*; running on cpu$")
    assert backend.mesh.axis_names == ("data", "model") and backend.mesh.size == 4
    assert len(backend.ones(2).sharding.device_set) == 4
    with pytest.raises(ml.errors.MeshError, match=r"device_mesh=\(4,\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendOptionWarning)
            ml.TorchBackend(dtype=ml.float32, device="cuda:0", device_mesh=(4,), enable_amp=True, cudnn_benchmark=True)
    backend = ml.MLXBackend(dtype=ml.float16, device_mesh=(1,))
    assert backend.dtype == ml.float16 and backend.ones(2).dtype == mx.float16
    backend = ml.NumpyBackend(dtype=ml.float64)
    assert backend.ones(2).dtype == np.float64


@pytest.mark.parametrize("make, native", [
    (lambda: ml.JaxBackend(dtype=jnp.float16), jnp.float16),
    (lambda: ml.JaxBackend(dtype=np.float64), jnp.float64),
    (lambda: ml.TorchBackend(dtype=torch.bfloat16), torch.bfloat16),
    (lambda: ml.TorchBackend(dtype="float16"), torch.float16),
    (lambda: ml.NumpyBackend(dtype=np.dtype("float64")), np.float64),
    (lambda: MLXBackend(dtype=mx.float16), mx.float16),
    (lambda: MLXBackend(dtype=mx.bfloat16), mx.bfloat16),
    (lambda: MLXBackend(dtype=mx.float32), mx.float32),
], ids=["jnp.float16", "np.float64", "torch.bfloat16", "str", "np.dtype", "mx.float16", "mx.bfloat16", "mx.float32"])
def test_framework_dtype_objects(make, native):
    """004 MLX backend, "Data Types" (``MLXBackend(dtype=mx.float16)``...), and issue 22, Must 5:
    a framework's dtype object is taken wherever a Mithril dtype is."""
    backend = make()
    assert backend.dtype == ml.dtypes.as_dtype(native)
    assert backend.randn(2, 3).dtype == native


def test_framework_dtype_objects_in_the_tensor_api():
    """Issue 22, Must 5: ``dtype=`` of the tensor API takes framework dtypes too; a dtype
    Mithril has not is an error naming the valid ones."""
    assert ml.TorchBackend().ones(2, dtype=torch.float16).dtype == torch.float16
    assert ml.JaxBackend().zeros(2, dtype=jnp.int32).dtype == jnp.int32
    assert ml.NumpyBackend().ones(2, dtype=mx.bfloat16).dtype == ml.bfloat16.numpy
    with pytest.raises(ml.MithrilError, match=r"unknown dtype torch.complex64; expected one of \['float16'"):
        ml.TorchBackend(dtype=torch.complex64)


# -- JAX -----------------------------------------------------------------------------------------

def test_jax_optimization_techniques_backend():
    """000 backend comparison, "JAX Backend / Optimization Techniques":
    ``JaxBackend(device="gpu", precision="bfloat16", pre_allocate=True)``. Without a GPU: one
    warning for the device (runs on cpu) and one for pre_allocate (XLA's GPU allocator flag,
    nothing to apply to); the backend keeps the precision and runs."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.JaxBackend(device="gpu", precision="bfloat16", pre_allocate=True)
    if NO_JAX_GPU:
        one_warning(record, DeviceFallbackWarning, r"^JaxBackend: device 'gpu' is not present \(present devices: cpu:0(, cpu:\d)*\); "
                    r"running on cpu$")
        one_warning(record, BackendOptionWarning, r"^JaxBackend: pre_allocate=True sets XLA's GPU allocator, and there is no GPU here; ignored$")
        assert backend.device == "cpu"
    assert backend.precision == "bfloat16" and backend.pre_allocate is True
    model = matmul_relu()
    pm = ml.compile(model, backend=backend, jit=True)
    x = data((4, 64))
    np.testing.assert_allclose(np.asarray(pm.evaluate(None, {"x": x})["y"]), np.maximum(x @ w_of(model), 0),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("precision, hlo", [("bfloat16", "DEFAULT"), ("tensorfloat32", "HIGH"), ("float32", "HIGHEST"),
                                            ("highest", "HIGHEST"), (jax.lax.Precision.HIGHEST, "HIGHEST")])
def test_jax_precision_is_in_the_jitted_program(precision, hlo):
    """003 JAX backend, "JAX Specific Options" (``precision=jax.lax.Precision.HIGHEST``) and 000
    (``precision="bfloat16"``): the matmul precision is in effect while the program is traced,
    so the jitted program carries it (the dot's precision in the lowered StableHLO)."""
    backend = ml.JaxBackend(precision=precision)
    model = matmul_relu()
    pm = ml.compile(model, backend, jit=True)
    params = pm.get_parameters()
    x = backend.array(data((4, 64)))
    pm.evaluate(params, {"x": x})
    with backend.scope():
        text = pm._jitted._compiled.lower(backend.prepare_inputs(params), {"x": x}).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert dots and all(f"precision = [{hlo}, {hlo}]" in line for line in dots), dots

    seen = []

    def forward(params, data):
        seen.append(jax.config.jax_default_matmul_precision)
        return {"y": jnp.matmul(data["a"], data["b"])}

    backend.jit(forward)({}, {"a": jnp.ones((2, 2)), "b": jnp.ones((2, 2))})
    assert seen and set(seen) == {backend.precision}  # traced under the backend's precision


def test_jax_precision_numerics_on_this_cpu():
    """000 backend comparison, "JAX Backend / Optimization Techniques" (``precision="bfloat16"``):
    what precision changes in the numbers. XLA:CPU computes float32 dots in float32 whatever the
    requested precision (the precision is a lower bound XLA may exceed), so on the CPU
    "bfloat16" and "highest" give the same float32-accurate result; on a GPU or TPU the
    bfloat16 pass would show an error of about 1e-2 relative. The program does carry it (see
    test_jax_precision_is_in_the_jitted_program). The CPU is named: it is JaxBackend's default
    device on every machine, and this test is about it."""
    a, b = data((64, 64), seed=2), data((64, 64), seed=3)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    results = {}
    for precision in ("bfloat16", "highest"):
        backend = ml.JaxBackend(device="cpu", precision=precision)
        results[precision] = np.asarray(backend.matmul(backend.array(a), backend.array(b)), np.float64)
    error = {p: np.abs(r - exact).max() / np.abs(exact).max() for p, r in results.items()}
    assert error["bfloat16"] < 1e-5 and error["highest"] < 1e-5


def test_jax_specific_options_debug_raises_on_nan():
    """003 JAX backend, "JAX Specific Options": ``JaxBackend(precision=jax.lax.Precision.HIGHEST,
    debug=True, platform="gpu", jit=True)``. ``platform`` is ``device``'s alias (no GPU here: one
    warning, cpu); ``debug=True`` turns on jax's NaN and inf checks, so a NaN produced raises
    (an EvaluationError from evaluate, jax's FloatingPointError from the tensor API) where the
    same program without debug returns NaN."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.JaxBackend(precision=jax.lax.Precision.HIGHEST, debug=True, platform="gpu", jit=True)
    if NO_JAX_GPU:
        one_warning(record, DeviceFallbackWarning, r"device 'gpu' is not present.*running on cpu")
    assert backend.debug and backend.precision == "highest" and backend.jit_by_default
    model = onnx_model([helper.make_node("Log", ["x"], ["y"])], [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])])
    x = np.array([1.0, -1.0, 2.0], np.float32)
    quiet = ml.compile(model, ml.JaxBackend()).evaluate({}, {"x": x})["y"]
    assert np.isnan(np.asarray(quiet)[1])
    with pytest.raises(ml.MithrilError, match=r"invalid value.* encountered in log"):
        ml.compile(model, backend).evaluate({}, {"x": x})
    with pytest.raises(FloatingPointError, match="nan"):
        backend.divide(backend.zeros(2), backend.zeros(2))
    assert np.isnan(np.asarray(ml.JaxBackend().divide(backend.zeros(2), backend.zeros(2)))).all()
    with pytest.raises(BackendOptionError, match="platform='gpu' is an alias of device, which is 'cpu'"):
        ml.JaxBackend(platform="gpu", device="cpu")


def test_jax_creating_a_backend():
    """003 JAX backend, "Creating a JAX Backend" (and 001 "Data Types", 003 "Memory Issues"):
    dtype float32/float64/float16, ``jit=True``, ``device="gpu"`` (no GPU here: one warning, cpu)."""
    assert ml.JaxBackend(dtype=ml.float32).randn(2).dtype == jnp.float32
    assert ml.JaxBackend(dtype=ml.float64).randn(2).dtype == jnp.float64
    assert ml.JaxBackend(dtype=ml.float16).randn(2).dtype == jnp.float16
    assert ml.JaxBackend(jit=True).jit_by_default and not ml.JaxBackend(jit=False).jit_by_default
    model = matmul_relu()
    assert ml.compile(model, ml.JaxBackend(jit=False))._jitted is None
    assert ml.compile(model, ml.JaxBackend(jit=True))._jitted is not None
    for device in ("gpu", "gpu:0", "tpu"):
        if NO_JAX_GPU:
            with pytest.warns(DeviceFallbackWarning, match=rf"JaxBackend: device '{device}' is not present.*running on cpu"):
                backend = ml.JaxBackend(device=device)
            assert backend.device.startswith("cpu") and backend.ones(2).devices() == {jax.devices("cpu")[0]}
    with pytest.raises(BackendOptionError, match="'banana' is not a device; devices are named cpu, gpu, tpu"):
        ml.JaxBackend(device="banana")
    with pytest.raises(BackendOptionError, match="precision must be one of bfloat16, tensorfloat32, float32, default, "
                                                 "high, highest or a jax.lax.Precision, got 'fast'"):
        ml.JaxBackend(precision="fast")


def test_jax_jit_options():
    """000 backend comparison, "Compile with JAX-specific options" and issue 22: ``jit_options``
    reach jax.jit (``compiler_options``, merged over the backend's and checked by XLA); others
    are refused listing the valid ones."""
    backend = ml.JaxBackend()
    model = matmul_relu()
    x = data((2, 64))
    pm = ml.compile(model, backend, jit=True, jit_options={"compiler_options": {"xla_cpu_enable_fast_math": False}})
    np.testing.assert_allclose(np.asarray(pm.evaluate(None, {"x": x})["y"]), np.maximum(x @ w_of(model), 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(BackendOptionError, match=r"JaxBackend's jit has no option 'donate'; valid jit_options: compiler_options"):
        ml.compile(model, backend, jit=True, jit_options={"donate": True})
    with pytest.raises(ml.errors.BackendUnavailableError, match="rejects compiler_options.*xla_no_such_flag"):
        ml.compile(model, backend, jit=True, jit_options={"compiler_options": {"xla_no_such_flag": 1}})


# -- PyTorch -------------------------------------------------------------------------------------

def test_torch_optimization_techniques_backend():
    """000 backend comparison, "PyTorch Backend / Optimization Techniques":
    ``TorchBackend(device="cuda", enable_amp=True, cudnn_benchmark=True)``. Without CUDA: one
    warning for the device (cpu) and one for cudnn_benchmark; with CUDA, torch's cuDNN
    autotuner is on."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.TorchBackend(device="cuda", enable_amp=True, cudnn_benchmark=True)
    if NO_CUDA:
        one_warning(record, DeviceFallbackWarning, r"^TorchBackend: device 'cuda' is not present \(present devices: cpu\); running on cpu$")
        one_warning(record, BackendOptionWarning, r"^TorchBackend: cudnn_benchmark=True tunes cuDNN's convolutions, and CUDA is not available here; ignored$")
        assert backend.device == "cpu" and backend.amp_dtype == torch.bfloat16
    else:
        assert torch.backends.cudnn.benchmark and backend.amp_dtype == torch.float16
    assert backend.enable_amp


def test_torch_enable_amp_runs_matmuls_in_bfloat16_and_returns_float32():
    """000 backend comparison, "PyTorch Backend" (``enable_amp=True``): the forward runs under
    torch.autocast (bfloat16 on the CPU), so the matmul's error is bfloat16-sized (about 1e-2
    relative, against 1e-6 without), and outputs come back in the float32 the graph declares;
    gradients are float32 too."""
    model = matmul_relu(k=256, n=64)
    x = data((8, 256))
    exact = np.maximum(x.astype(np.float64) @ w_of(model).astype(np.float64), 0)
    plain = ml.compile(model, ml.TorchBackend()).evaluate(None, {"x": x})["y"]
    amp_backend = ml.TorchBackend(enable_amp=True)
    amp = ml.compile(model, amp_backend)
    out = amp.evaluate(None, {"x": x})["y"]
    assert out.dtype == torch.float32 and plain.dtype == torch.float32
    scale = np.abs(exact).max()
    plain_error = np.abs(plain.numpy() - exact).max() / scale
    amp_error = np.abs(out.numpy() - exact).max() / scale
    assert plain_error < 1e-5
    assert 1e-4 < amp_error < 3e-2  # bfloat16 keeps 8 bits of mantissa: 2**-8 = 0.0039 per rounding
    outputs, grads = amp.evaluate(None, {"x": x}, output_gradients={"y": torch.ones(8, 64)})
    assert outputs["y"].dtype == torch.float32 and grads["w"].dtype == torch.float32
    # float64 graphs are left alone by autocast: exact to float64.
    model64 = matmul_relu(TensorProto.DOUBLE, np.float64)
    x64 = data((8, 64), np.float64)
    out64 = ml.compile(model64, ml.TorchBackend(dtype=ml.float64, enable_amp=True)).evaluate(None, {"x": x64})["y"]
    assert out64.dtype == torch.float64
    np.testing.assert_allclose(out64.numpy(), np.maximum(x64 @ w_of(model64), 0), rtol=1e-12)


def test_torch_device_placement():
    """001 backends, "Device Placement": ``device="cuda"``, ``"cuda:0"``, ``"cpu"``. Without
    CUDA the first two warn once each and run on cpu; a name torch has no device for is an
    error listing the names."""
    for device in ("cuda", "cuda:0"):
        if NO_CUDA:
            with pytest.warns(DeviceFallbackWarning, match=rf"TorchBackend: device '{device}' is not present.*running on cpu"):
                backend = ml.TorchBackend(device=device)
            assert backend.device == "cpu" and backend.ones(2).device.type == "cpu"
        else:
            assert ml.TorchBackend(device=device).ones(2).device.type == "cuda"
    assert ml.TorchBackend(device="cpu").device == "cpu"
    with pytest.raises(BackendOptionError, match="'banana' is not a device; devices are named cpu, cuda, cuda:<index>, mps"):
        ml.TorchBackend(device="banana")


def centered():
    """y = x - mean(x over the batch): its output depends on which rows run together."""
    return onnx_model([helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
                       helper.make_node("Sub", ["x", "m"], ["y"])],
                      [("x", TensorProto.FLOAT, ["N", 3])], [("y", TensorProto.FLOAT, ["N", 3])])


def test_torch_data_parallel_splits_the_batch():
    """002 multi-backend deployment, "Multi-Device Deployment":
    ``TorchBackend(parallel_strategy="data_parallel", devices=["cuda:0", "cuda:1"])``. Absent
    devices warn once and become cpu; the batch (dim 0 of every data input) is split over the
    devices, each part runs on its device and the outputs are concatenated. A model whose rows
    interact (a batch mean) shows the split: each part is centred on its own mean."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.TorchBackend(parallel_strategy="data_parallel", devices=["cuda:0", "cuda:1"])
    if NO_CUDA:
        one_warning(record, DeviceFallbackWarning, r"^TorchBackend: devices 'cuda:0', 'cuda:1' not present \(present devices: cpu\); they run on cpu$")
    two = ml.TorchBackend(parallel_strategy="data_parallel", devices=["cpu", "cpu"])
    x = data((5, 3))
    out = ml.compile(centered(), two).evaluate({}, {"x": x})["y"].numpy()
    parts = [x[:3] - x[:3].mean(0), x[3:] - x[3:].mean(0)]  # 5 rows over 2 devices: 3 and 2
    np.testing.assert_allclose(out, np.concatenate(parts), rtol=1e-6, atol=1e-6)
    whole = ml.compile(centered(), ml.TorchBackend()).evaluate({}, {"x": x})["y"].numpy()
    assert not np.allclose(out, whole, atol=1e-3)
    # A per-row model gives the same outputs and gradients as on one device.
    model = matmul_relu()
    x = data((7, 64))
    ref_out, ref_grads = ml.compile(model, ml.TorchBackend()).evaluate(None, {"x": x}, output_gradients={"y": torch.ones(7, 32)})
    for b in (backend, two):
        # The seed is a CPU tensor: it moves to the main device as data inputs do (on a GPU
        # machine the outputs and gradients live on cuda:0).
        got_out, got_grads = ml.compile(model, b).evaluate(None, {"x": x}, output_gradients={"y": torch.ones(7, 32)})
        assert str(got_out["y"].device) == b.device and str(got_grads["w"].device) == b.device
        torch.testing.assert_close(got_out["y"].cpu(), ref_out["y"])
        torch.testing.assert_close(got_grads["w"].cpu(), ref_grads["w"])



def test_torch_data_parallel_averages_outputs_that_are_not_per_row():
    """002 multi-backend deployment, "Multi-Device Deployment" (data-parallel training): an
    output that is not per-row (a loss reduced over the batch) is averaged over the parts,
    weighted by their rows, as DDP averages gradients: a batch mean comes out exact, and so do
    its gradients. Compile's shapes fixing the batch dim draw one warning (the program may hold
    that size as a constant)."""
    loss_model = onnx_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                             helper.make_node("ReduceMean", ["r"], ["loss"], keepdims=0)],
                            [("x", TensorProto.FLOAT, ["N", 64])], [("loss", TensorProto.FLOAT, [])],
                            [weight("w", [64, 32])])
    x = data((5, 64))
    one = ml.compile(loss_model, ml.TorchBackend())
    two = ml.compile(loss_model, ml.TorchBackend(parallel_strategy="data_parallel", devices=["cpu", "cpu"]))
    cot = {"loss": torch.tensor(1.0)}
    (ref, ref_grads), (got, got_grads) = one.evaluate(None, {"x": x}, cot), two.evaluate(None, {"x": x}, cot)
    torch.testing.assert_close(got["loss"], ref["loss"])
    torch.testing.assert_close(got_grads["w"], ref_grads["w"])
    pooled = onnx_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=0)],
                        [("x", TensorProto.FLOAT, ["N", 3])], [("y", TensorProto.FLOAT, [3])])
    x = data((4, 3))
    out = ml.compile(pooled, ml.TorchBackend(parallel_strategy="data_parallel", devices=["cpu", "cpu"])).evaluate({}, {"x": x})
    np.testing.assert_allclose(out["y"].numpy(), x.mean(0), rtol=1e-6)
    with pytest.warns(BackendOptionWarning, match=r"data_parallel runs parts of the batch, and compile's shapes fix the batch "
                                                  r"dim \(x: 4\).*leave dim 0 symbolic"):
        ml.compile(pooled, ml.TorchBackend(parallel_strategy="data_parallel", devices=["cpu", "cpu"]), shapes={"x": [4, 3]})


def test_torch_model_parallel_and_strategy_errors():
    """002 multi-backend deployment, "Multi-Device Deployment":
    ``TorchBackend(parallel_strategy="model_parallel", devices=["cuda:0", "cuda:1"])`` places the
    program on the first device outside a process group and says in one line how to split it (one
    process per device: mithril launch, torchrun); unknown strategies and devices without a strategy are errors listing the
    valid strategies."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = ml.TorchBackend(parallel_strategy="model_parallel", devices=["cuda:0", "cuda:1"])
    one_warning(record, BackendOptionWarning, r"model_parallel runs the whole program on (cpu|cuda:0) outside a process "
                                              r"group: it splits a model over one process per device \(mithril launch "
                                              r"--nproc 2 script.py, torchrun\)")
    model = matmul_relu()
    x = data((2, 64))
    y = ml.compile(model, backend).evaluate(None, {"x": x})["y"]
    assert str(y.device) == backend.device  # outputs stay on the device, as torch's do
    np.testing.assert_allclose(backend.to_numpy(y),
                               np.maximum(x @ w_of(model), 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(BackendOptionError, match=r"unknown parallel_strategy 'pipeline'; valid strategies: data_parallel \(.*\); "
                                                 r"model_parallel \("):
        ml.TorchBackend(parallel_strategy="pipeline", devices=["cpu"])
    with pytest.raises(BackendOptionError, match="devices=\\['cpu'\\] needs a parallel_strategy, one of data_parallel, model_parallel"):
        ml.TorchBackend(devices=["cpu"])
    for devices in ([], "cuda:0"):
        with pytest.raises(BackendOptionError, match=r"devices must be a non-empty list such as \['cuda:0', 'cuda:1'\], got"):
            ml.TorchBackend(parallel_strategy="data_parallel", devices=devices)


def test_torch_jit_options_reach_torch_compile():
    """000 backend comparison, "Compile with PyTorch-specific options": ``jit=True`` with
    ``jit_options`` runs the forward through torch.compile with those options (here
    ``backend="eager"``, which skips inductor's code generation to stay fast); an option
    torch.compile has not is refused listing the valid ones. The document's
    ``{"backend": "inductor", "mode": "max-autotune"}`` is accepted as is (compiling it takes
    minutes on this CPU, so the test only builds it)."""
    model = matmul_relu()
    x = data((2, 64))
    pm = ml.compile(model, ml.TorchBackend(), jit=True, jit_options={"backend": "eager", "fullgraph": False})
    assert pm._jitted is not None and pm._jitted.options == {"backend": "eager", "fullgraph": False}
    np.testing.assert_allclose(pm.evaluate(None, {"x": x})["y"].numpy(), np.maximum(x @ w_of(model), 0), rtol=1e-5, atol=1e-5)
    doc = ml.compile(model, ml.TorchBackend(device="cpu"), jit=True, jit_options={"backend": "inductor", "mode": "max-autotune"})
    assert doc._jitted.options == {"backend": "inductor", "mode": "max-autotune"}
    with pytest.raises(BackendOptionError, match="TorchBackend's jit has no option 'modee'; valid jit_options: backend .*mode .*"
                                                 "fullgraph .*dynamic .*options .*disable"):
        ml.compile(model, ml.TorchBackend(), jit=True, jit_options={"modee": "max-autotune"})
    assert not ml.TorchBackend().jit_by_default and ml.TorchBackend(compile=True).jit_by_default
    assert ml.compile(model, ml.TorchBackend())._jitted is None  # eager unless asked
    with pytest.raises(BackendOptionError, match="compile=True asks for torch.compile and jit=False refuses it"):
        ml.TorchBackend(compile=True, jit=False)


# -- MLX -----------------------------------------------------------------------------------------

def test_mlx_configuration_options():
    """004 MLX backend, "Configuration Options": ``MLXBackend(dtype=mx.float16,
    device=mx.devices.gpu, random_seed=42, compute_precision="float32", use_graph=True)``.
    ``mx.devices`` does not exist in MLX: the snippet fails in MLX itself with an AttributeError
    naming it, before Mithril is called. MLX spells the GPU ``mx.gpu`` (a DeviceType); with it
    (or "gpu", or ``mx.Device(mx.gpu)``) and no GPU here, one warning and the CPU."""
    with pytest.raises(AttributeError, match="module 'mlx.core' has no attribute 'devices'"):
        MLXBackend(dtype=mx.float16, device=mx.devices.gpu, random_seed=42, compute_precision="float32", use_graph=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        backend = MLXBackend(dtype=mx.float16, device=mx.gpu, random_seed=42, compute_precision="float32", use_graph=True)
    if NO_MLX_GPU:
        one_warning(record, DeviceFallbackWarning, r"^MlxBackend: device 'gpu' is not present \(present devices: cpu\); running on cpu$")
        assert backend.device == "cpu"
    assert backend.dtype == ml.float16 and backend.compute_precision == ml.float32 and backend.jit_by_default
    assert backend.seed == 42
    again = MLXBackend(random_seed=42)
    np.testing.assert_array_equal(np.asarray(backend.randn(3, dtype=ml.float32)), np.asarray(again.randn(3)))
    for device in (mx.cpu, mx.Device(mx.cpu), "cpu"):
        assert MLXBackend(device=device).device == "cpu"


def test_mlx_selecting_compute_devices():
    """004 MLX backend, "Selecting Compute Devices": ``MLXBackend(device=mx.devices.gpu)`` and
    ``(device=mx.devices.cpu)``. Both attributes are missing from MLX (AttributeError in MLX);
    what the user means, ``mx.gpu`` / ``mx.cpu``, works (the GPU with a fallback warning here)."""
    for name in ("gpu", "cpu"):
        with pytest.raises(AttributeError, match="has no attribute 'devices'"):
            MLXBackend(device=getattr(mx.devices, name))
    assert MLXBackend(device=mx.cpu).device == "cpu"
    if NO_MLX_GPU:
        with pytest.warns(DeviceFallbackWarning, match="device 'gpu' is not present"):
            assert MLXBackend(device=mx.gpu).device == "cpu"
    with pytest.raises(BackendOptionError, match="'tpu' is not a device; devices are named cpu, gpu"):
        MLXBackend(device="tpu")


def test_mlx_memory_limit_sets_mlx_limit():
    """004 MLX backend, "Memory Management": ``memory_limit="4GB"`` calls MLX's
    ``mx.set_memory_limit`` (process-wide in MLX; KB/MB/GB count in 1024s, as in the
    documents' ``4 * 1024**3``). Bytes and other spellings work; nonsense is an error."""
    before = mx.get_memory_limit()
    try:
        backend = MLXBackend(memory_limit="4GB", auto_free_tensors=True)
        assert backend.memory_limit == 4 * 1024**3 and mx.get_memory_limit() == 4 * 1024**3
        MLXBackend(memory_limit="512MB")
        assert mx.get_memory_limit() == 512 * 2**20
        MLXBackend(memory_limit=3 * 2**30)
        assert mx.get_memory_limit() == 3 * 2**30
        MLXBackend(memory_limit="1.5GiB")
        assert mx.get_memory_limit() == int(1.5 * 2**30)
        with pytest.raises(BackendOptionError, match="memory_limit takes a positive number of bytes or a size such as '4GB'"):
            MLXBackend(memory_limit="lots")
    finally:
        mx.set_memory_limit(before)


def test_mlx_auto_free_tensors_releases_the_cache():
    """004 MLX backend, "Memory Management": ``auto_free_tensors=True`` releases MLX's buffer
    cache after each evaluation (``mx.clear_cache``): the intermediates' buffers, which MLX
    otherwise keeps cached, are gone when evaluate returns."""
    model = matmul_relu(k=256, n=256)
    x = data((64, 256))
    cached = {}
    for free in (False, True):
        pm = ml.compile(model, MLXBackend(auto_free_tensors=free), jit=False)
        gc.collect()
        mx.clear_cache()
        out = pm.evaluate(None, {"x": x})["y"]
        mx.eval(out)
        cached[free] = mx.get_cache_memory()
        del out
    assert cached[False] >= 64 * 256 * 4  # at least the freed hidden activation
    assert cached[True] == 0


def test_mlx_use_graph_is_mx_compile_by_default():
    """004 MLX backend, "Computational Graphs" / "Disable optimizations for debugging":
    ``use_graph=True`` (the default) makes compile jit with mx.compile; ``use_graph=False`` runs
    the program op by op; both give the same values. ``jit=`` is the same switch."""
    model = matmul_relu()
    x = data((2, 64))
    results = []
    for backend, jitted in ((MLXBackend(use_graph=True), True), (MLXBackend(use_graph=False), False),
                            (MLXBackend(jit=False), False)):
        assert backend.jit_by_default is jitted
        pm = ml.compile(model, backend)
        assert (pm._jitted is not None) is jitted
        results.append(np.asarray(pm.evaluate(None, {"x": x})["y"]))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)
    pm = ml.compile(model, MLXBackend(), jit=True, jit_options={"shapeless": True})
    np.testing.assert_allclose(np.asarray(pm.evaluate(None, {"x": x})["y"]), results[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(BackendOptionError, match="MlxBackend's jit has no option 'inline'; valid jit_options: shapeless"):
        ml.compile(model, MLXBackend(), jit=True, jit_options={"inline": True})
    with pytest.raises(BackendOptionError, match="jit=True and use_graph=False disagree"):
        MLXBackend(jit=True, use_graph=False)


def overflowing_square(elem, dtype):
    """y = (x * x) / 1000: x = 300 overflows float16 in x * x (90000 > 65504) but not in y."""
    return onnx_model([helper.make_node("Mul", ["x", "x"], ["s"]), helper.make_node("Div", ["s", "k"], ["y"])],
                      [("x", elem, [3])], [("y", elem, [3])],
                      [helper.make_tensor("k", elem, [], np.array(1000, dtype).tobytes(), raw=True)])


def test_mlx_compute_precision_float32_over_float16_arrays():
    """004 MLX backend, "Numerical Instability" (``compute_precision="float32"``) with the
    float16 arrays of "Configuration Options": params, inputs and outputs stay float16 while
    the computation runs in float32, so an intermediate beyond float16's range (300 * 300)
    no longer overflows; without it the same program gives inf."""
    model = overflowing_square(TensorProto.FLOAT16, np.float16)
    x = np.array([300.0, 2.0, -250.0], np.float16)
    plain = ml.compile(model, MLXBackend(dtype=mx.float16)).evaluate({}, {"x": x})["y"]
    assert np.isinf(np.asarray(plain)[0])
    backend = MLXBackend(dtype=mx.float16, compute_precision="float32")
    out = ml.compile(model, backend).evaluate({}, {"x": x})["y"]
    assert out.dtype == mx.float16
    np.testing.assert_allclose(np.asarray(out, np.float64), [90.0, 0.004, 62.5], rtol=1e-3)
    assert MLXBackend(dtype=mx.float32, compute_precision="float32").compute_precision == ml.float32
    with pytest.raises(BackendOptionError, match="compute_precision must be one of float32, float16, bfloat16"):
        MLXBackend(compute_precision="int8")


def test_mlx_compute_precision_float16_over_float32_arrays():
    """004 MLX backend, "Use compute_precision appropriately" (``compute_precision="float16"``
    for speed): float32 arrays in and out, the matmul in float16 (an error of float16's size,
    about 1e-3 relative, against 1e-6 in float32); gradients keep the parameters' float32."""
    model = matmul_relu(k=128, n=32)
    x = data((8, 128))
    exact = np.maximum(x.astype(np.float64) @ w_of(model).astype(np.float64), 0)
    scale = np.abs(exact).max()
    errors = {}
    for precision in (None, "float16"):
        backend = MLXBackend(compute_precision=precision)
        pm = ml.compile(model, backend)
        out = pm.evaluate(None, {"x": x})["y"]
        assert out.dtype == mx.float32
        errors[precision] = np.abs(np.asarray(out, np.float64) - exact).max() / scale
        _, grads = pm.evaluate(None, {"x": x}, output_gradients={"y": mx.ones((8, 32))})
        assert grads["w"].dtype == mx.float32
    assert errors[None] < 1e-5 and 1e-4 < errors["float16"] < 1e-2


def test_mlx_apple_only_options_warn_and_run():
    """004 MLX backend, "Metal Performance Shaders" (``enable_mps_optimization=True``) and
    "Apple Neural Engine" (``use_ane=True``): off Apple silicon each says so in one warning
    line and the backend runs on the CPU; MLX has no Neural Engine path at all, so use_ane
    warns on Apple too."""
    if sys.platform == "darwin":
        pytest.skip("the warnings' text is for a machine without Apple silicon")
    with pytest.warns(BackendOptionWarning) as record:
        backend = MLXBackend(enable_mps_optimization=True)
    one_warning(record, BackendOptionWarning, r"^MlxBackend: enable_mps_optimization=True needs Metal \(Apple silicon\), "
                                              r"which is not here; running on cpu$")
    assert backend.device == "cpu" and backend.to_numpy(backend.ones(2)).tolist() == [1.0, 1.0]
    with pytest.warns(BackendOptionWarning) as record:
        backend = MLXBackend(use_ane=True)
    one_warning(record, BackendOptionWarning, r"^MlxBackend: use_ane=True asks for the Apple Neural Engine, which MLX does "
                                              r"not run on \(and this is not Apple silicon\); ignored$")
    assert backend.to_numpy(backend.add(backend.ones(2), backend.ones(2))).tolist() == [2.0, 2.0]


# -- NumPy ---------------------------------------------------------------------------------------

def test_numpy_device_and_threads():
    """000 backend comparison, "NumPy Backend" (CPU only): ``device="cpu"`` is accepted, an
    accelerator name warns once and runs on the CPU; ``num_threads`` caps BLAS threads and is
    checked."""
    backend = ml.NumpyBackend(dtype=ml.float32, device="cpu", num_threads=1)
    assert backend.device == "cpu" and not backend.jit_by_default
    with pytest.warns(DeviceFallbackWarning, match="NumpyBackend runs on the CPU only; device 'cuda' is not used, running on cpu"):
        assert ml.NumpyBackend(device="cuda").device == "cpu"
    with pytest.raises(BackendOptionError, match="num_threads must be a positive int or None"):
        ml.NumpyBackend(num_threads=0)
