"""The PyTorch backend: tensor API, the NumPy facade, parity with NumPy, gradients, devices, dtypes."""

import sys

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.errors import BackendUnavailableError, DTypeError, UnsupportedDTypeError

from tests.conftest import make_model

torch = pytest.importorskip("torch", reason="the Torch backend needs torch (pip install mithril[torch])")
from mithril.backends.torch import xp as txp  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    return ml.TorchBackend()


# -- tensor API and facade ------------------------------------------------------------------
def test_tensor_api_takes_and_returns_tensors(backend):
    a = backend.array([[1.0, 2.0], [3.0, 4.0]])
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float32 and backend.dtype_of(a) == np.float32
    assert backend.dtype_of(a.to(torch.bfloat16)) == ml_dtypes.bfloat16
    s = backend.add(a, backend.ones(2, 2))
    assert isinstance(s, torch.Tensor) and s.tolist() == [[2, 3], [4, 5]]
    assert backend.matmul(a, a).tolist() == [[7, 10], [15, 22]]
    assert backend.sum(a, axis=0).tolist() == [4, 6]
    assert backend.relu(backend.array([-1.0, 2.0])).tolist() == [0, 2]
    assert backend.reshape(backend.arange(6), (2, 3)).shape == (2, 3)
    assert backend.concat([a, a], axis=1).shape == (2, 4)
    assert backend.zeros_like(a).dtype == torch.float32 and backend.ones_like(a, dtype=ml.int32).dtype == torch.int32
    assert backend.arange(3).dtype == torch.int64
    assert ml.TorchBackend(dtype=ml.float64).randn(2, 2).dtype == torch.float64
    # NumPy semantics, tensors out: int64 / int64 is float64 (torch alone would give float32)
    assert backend.divide(backend.arange(3), backend.arange(1, 4)).dtype == torch.float64
    # to_numpy takes tensors and facade arrays alike
    assert backend.to_numpy(a).dtype == np.float32 and backend.to_numpy(txp.TorchArray(a)).tolist() == a.tolist()
    assert backend.from_numpy(np.arange(3, dtype=np.int16)).dtype == torch.int16  # the exact dtype


def test_evaluate_takes_and_returns_tensors(conv_model, backend):
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    pm = ml.compile(ml.load_onnx(conv_model), backend, shapes={"x": x.shape}, data_keys=["x"])
    params = pm.get_parameters()
    assert all(isinstance(v, torch.Tensor) for v in params.values())
    from_tensor = pm.evaluate(params, {"x": torch.from_numpy(x)})["y"]
    from_numpy = pm.evaluate({k: v.numpy() for k, v in params.items()}, {"x": x})["y"]
    assert type(from_tensor) is torch.Tensor and type(from_numpy) is torch.Tensor
    torch.testing.assert_close(from_tensor, from_numpy, rtol=0, atol=0)
    out, grads = pm.evaluate(params, {"x": torch.from_numpy(x)}, output_gradients={"y": torch.ones(2, 8)})
    assert type(out["y"]) is torch.Tensor and not out["y"].requires_grad
    assert set(grads) == {"W", "x"} and all(type(g) is torch.Tensor for g in grads.values())
    assert grads["x"].shape == (2, 4, 8, 8)
    # a float64 tensor for a float32 input is refused, not cast
    with pytest.raises(DTypeError, match="expects float32"):
        pm.evaluate(params, {"x": torch.from_numpy(x.astype(np.float64))})


def test_constants_become_tensors_once_at_compile_static_inputs_stay_on_the_host(backend):
    nodes = [helper.make_node("Add", ["x", "bias"], ["h"], name="add"),
             helper.make_node("Reshape", ["h", "shape"], ["y"], name="reshape")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT, [3, 2])],
                       {"bias": np.arange(3, dtype=np.float32), "shape": np.array([3, 2], np.int64)})
    pm = ml.compile(ml.load_onnx(model), backend, constant_keys={"bias"})
    ns = pm.program.namespace
    add_line = next(line for line in pm.code.splitlines() if "'add'" in line)
    reshape_line = next(line for line in pm.code.splitlines() if "'reshape'" in line)
    bias_name = add_line.split("(")[1].split(",")[1].strip()
    shape_name = reshape_line.split("(")[1].split(",")[1].strip()
    assert isinstance(ns[bias_name], txp.TorchArray) and ns[bias_name].native.dtype == torch.float32
    assert isinstance(ns[shape_name], np.ndarray)  # Reshape reads its shape on the host
    y = pm.evaluate({}, {"x": torch.ones(2, 3)})["y"]
    assert y.tolist() == [[1, 2], [3, 1], [2, 3]]


@pytest.mark.parametrize("size, pads, strides", [
    (8, (1, 1, 1, 1), (2, 2)),  # the end pixel no window reads: symmetric torch padding still fits
    (9, (1, 1, 1, 1), (2, 2)),
    (8, (0, 1, 1, 0), (1, 2)),  # truly asymmetric: padded explicitly
    (7, (2, 0, 0, 2), (3, 1)),
])
def test_conv_and_pool_padding_geometries_match_the_shared_kernels(size, pads, strides):
    from mithril.backends.kernels import nn
    from mithril.backends.torch import overrides as torch_kernels

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    attrs = dict(auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=pads, strides=strides)
    want = nn.conv(x, w, None, xp=np, **attrs)
    got = torch_kernels.conv(txp.asarray(x), txp.asarray(w), None, xp=txp, **attrs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    for ceil_mode in (0, 1):
        pool = dict(auto_pad="NOTSET", kernel_shape=(3, 3), pads=pads, strides=strides, ceil_mode=ceil_mode)
        want = nn.max_pool(x, xp=np, **pool)
        got = torch_kernels.max_pool(txp.asarray(x), xp=txp, **pool)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_clip_with_scalar_bounds_is_one_clamp(backend):
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="relu6")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [5])], [("y", TensorProto.FLOAT, [5])],
                       {"lo": np.float32(0.0), "hi": np.float32(6.0)})
    pm = ml.compile(ml.load_onnx(model), backend, constant_keys={"lo", "hi"})
    x = torch.tensor([-1.0, 0.5, 6.5, float("nan"), 3.0])
    y = pm.evaluate({}, {"x": x})["y"]
    assert y[[0, 1, 2, 4]].tolist() == [0.0, 0.5, 6.0, 3.0] and torch.isnan(y[3])


def test_large_float32_products_run_in_onednn_where_torch_s_blas_is_mkl_off_intel(monkeypatch):
    # MKL leaves AVX-512 unused on CPUs not Intel's: there, MatMul, Gemm and MatMulAdd run large
    # forward-only float32 products with oneDNN's matmul (GPT-2's LM head 65 -> 36 ms on an AMD
    # EPYC); small ones, and anything autograd records, keep torch's own.
    from mithril.backends.torch import overrides as ov

    if not hasattr(torch.ops.mkldnn, "_linear_pointwise") or not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN matmul")
    monkeypatch.setattr(ov, "_ONEDNN_LINEAR", True)
    seen = []
    real = ov.onednn_linear
    monkeypatch.setattr(ov, "onednn_linear", lambda *a: seen.append(real(*a) is not None) or real(*a))
    rng = np.random.default_rng(0)
    init = {"W1": rng.standard_normal((256, 1024)), "b1": rng.standard_normal(1024),
            "W2": rng.standard_normal((256, 1024)), "b2": rng.standard_normal(256),
            "W3": rng.standard_normal((256, 128)), "Ws": rng.standard_normal((8, 8))}
    init = {k: (v / 16).astype(np.float32) for k, v in init.items()}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("Gemm", ["r", "W2", "b2"], ["g"], transB=1),
             helper.make_node("MatMul", ["g", "W3"], ["y"]), helper.make_node("MatMul", ["s", "Ws"], ["z"])]
    F32 = TensorProto.FLOAT
    model = make_model(nodes, [("x", F32, [128, 256]), ("s", F32, [4, 8])],
                       [("y", F32, [128, 128]), ("z", F32, [4, 8])], init)
    data = {"x": rng.standard_normal((128, 256)).astype(np.float32),
            "s": rng.standard_normal((4, 8)).astype(np.float32)}
    h = np.maximum(data["x"] @ init["W1"] + init["b1"], 0) @ init["W2"].T + init["b2"]
    want = {"y": h @ init["W3"], "z": data["s"] @ init["Ws"]}
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), inference=True)
    out = pm.evaluate(None, data)
    for k in want:
        np.testing.assert_allclose(out[k].numpy(), want[k], rtol=1e-4, atol=1e-4)
    assert sorted(seen) == [False, True, True, True]  # 128x256 by 256x128 at the floor (2^22); 4x8 by 8x8 below
    # Gradients: autograd records the forward, which keeps torch's kernels.
    seen.clear()
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), data_keys=["x", "s"])
    out, grads = pm.evaluate(pm.get_parameters(), data, output_gradients={"y": torch.ones(128, 128),
                                                                            "z": torch.ones(4, 8)})
    np.testing.assert_allclose(out["y"].numpy(), want["y"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grads["s"].numpy(), np.ones((4, 8)) @ init["Ws"].T, rtol=1e-5)
    assert seen and not any(seen)


def test_a_large_matmul_weight_is_packed_for_onednn_once_it_comes_back_unchanged(monkeypatch):
    # oneDNN packs a plain weight again at every call; a large one (from 2^20 elements, GPT-2's
    # LM head) is packed once and kept, keyed on the tensor the MatMul's transposed view reads,
    # made at the second call that brings it unchanged: an operand made afresh at every call (an
    # activation) is never packed, and a weight changed in place is read again.
    from mithril.backends.torch import overrides as ov

    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight") or not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN matmul")
    monkeypatch.setattr(ov, "_ONEDNN_LINEAR", True)
    made = []  # (call, the packed tensor's base) for each packing
    real_kept = ov._kept

    def spy(w, what, key, make, **kw):
        return real_kept(w, what, key, lambda: made.append((call, w)) or make(), **kw)

    monkeypatch.setattr(ov, "_kept", spy)
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((256, 4096)) / 16).astype(np.float32)
    F32 = TensorProto.FLOAT
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("MatMul", ["x", "v"], ["z"])],
                       [("x", F32, [32, 256]), ("v", F32, [256, 4096])],
                       [("y", F32, [32, 4096]), ("z", F32, [32, 4096])], {"W": W})
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), data_keys=["x", "v"])
    params = pm.get_parameters()
    w = params["W"]
    for call in range(5):
        if call == 3:
            w.add_(1.0)  # in place: the packed copy no longer holds
        data = {"x": rng.standard_normal((32, 256)).astype(np.float32),
                "v": rng.standard_normal((256, 4096)).astype(np.float32)}
        out = pm.evaluate(params, data)
        np.testing.assert_allclose(out["y"].numpy(), data["x"] @ (W + 1.0 if call >= 3 else W), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["z"].numpy(), data["x"] @ data["v"], rtol=1e-4, atol=1e-4)
    # Packed at the second call, and again at the second call after the change; never v.
    assert [(c, b is w) for c, b in made] == [(1, True), (4, True)]
    kept = [held[3] for (ident, what), held in ov.kept_copies.items() if ident == id(w) and what[0] == "linear"]
    assert len(kept) == 1 and kept[0].is_mkldnn
    ident = id(w)
    del params, w, kept, made[:]
    pm = None
    assert not any(i == ident for i, _ in ov.kept_copies)  # gone with W


def test_sequence_and_string_outputs(backend):
    seq = make_model([helper.make_node("SequenceConstruct", ["a", "b"], ["s"])],
                     [("a", TensorProto.FLOAT, [2]), ("b", TensorProto.FLOAT, [2])], [])
    seq.graph.output.append(helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None))
    out = ml.compile(ml.load_onnx(seq), backend).evaluate(None, {"a": torch.ones(2), "b": np.zeros(2, np.float32)})
    assert isinstance(out["s"], list) and [type(t) for t in out["s"]] == [torch.Tensor, torch.Tensor]
    assert [t.tolist() for t in out["s"]] == [[1, 1], [0, 0]]


def test_facade_follows_numpy_semantics():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = txp.asarray(x)
    cases = [
        (t * 2.5, x * 2.5),  # weak float scalar: int32 -> float64
        (t + np.int64(1), x + np.int64(1)),
        (t / 2, x / 2),
        (t // -3, x // -3),
        (t % 5, x % 5),
        (t[::-1, ::-2], x[::-1, ::-2]),
        (t[:, [0, -1]], x[:, [0, -1]]),
        (t[x > 4], x[x > 4]),
        (t[None, ..., 1], x[None, ..., 1]),
        (np.float32(2) * t.astype(np.float16), np.float32(2) * x.astype(np.float16)),
        (txp.sum(t, axis=1, keepdims=True), np.sum(x, axis=1, keepdims=True)),
        (txp.mean(t), np.mean(x)),
        (txp.take(t, np.array([[0, -1]]), axis=1), np.take(x, np.array([[0, -1]]), axis=1)),
        (txp.pad(t, ((1, 0), (2, 1)), mode="reflect"), np.pad(x, ((1, 0), (2, 1)), mode="reflect")),
        (txp.where(t > 3, t, 0.5), np.where(x > 3, x, 0.5)),
        (txp.clip(t, 2, 7), np.clip(x, 2, 7)),
        (txp.split(t, [1, 3], axis=1)[1], np.split(x, [1, 3], axis=1)[1]),
    ]
    for got, want in cases:
        got = np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert txp.sign(txp.asarray(np.array([np.nan, -2.0]))).tolist()[1] == -1.0
    assert np.isnan(txp.sign(txp.asarray(np.array([np.nan]))).tolist()[0])


# -- parity with NumPy ------------------------------------------------------------------------
def _run(model, backend, data, **kw):
    pm = ml.compile(ml.load_onnx(model), backend, **kw)
    out = pm.evaluate(None, {k: backend.array(v) for k, v in data.items()})
    return {k: backend.to_numpy(v) for k, v in out.items()}


def test_parity_with_numpy_on_conv_model(conv_model, backend):
    x = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
    want = _run(conv_model, ml.NumpyBackend(), {"x": x}, shapes={"x": x.shape}, inference=True)
    got = _run(conv_model, backend, {"x": x}, shapes={"x": x.shape})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)


def test_parity_with_numpy_on_resnet(backend):
    from models_zoo import torch_reference as models

    spec = models.build("resnet18", image_size=32)
    onnx_bytes = models.export_onnx(spec, "torchscript")
    x = spec.numpy_inputs(2)
    want = _run(onnx_bytes, ml.NumpyBackend(), x, shapes={"input": x["input"].shape}, inference=True)
    got = _run(onnx_bytes, backend, x, shapes={"input": x["input"].shape})
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-4, atol=1e-4)
    # params moved through NumPy give the same outputs
    pm = ml.compile(ml.load_onnx(onnx_bytes), backend, shapes={"input": x["input"].shape})
    params = {k: backend.from_numpy(ml.NumpyBackend().to_numpy(v)) for k, v in pm.get_parameters().items()}
    out = backend.to_numpy(pm.evaluate(params, {"input": backend.array(x["input"])})["output"])
    np.testing.assert_allclose(out, got["output"], rtol=1e-6, atol=1e-6)


# -- gradients ---------------------------------------------------------------------------------
# Conv -> Gemm -> Softmax gradients against finite differences on every backend: tests/kernels/test_nn.py.


class _BrokenBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("this op's backward is broken")


def test_a_failing_backward_names_its_node():
    """Torch's backward pass runs in autograd's engine, no line of the program: the node whose
    gradient failed is found by running the pass again under anomaly mode (its forward stack)."""
    def broken(x):
        return _BrokenBackward.apply(x.native if hasattr(x, "native") else x)

    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="dense"),
             helper.make_node("Doubled", ["m"], ["d"], domain="com.example", name="the_broken_one"),
             helper.make_node("Tanh", ["d"], ["y"], name="act")]
    model = make_model(nodes, [("x", f, [2, 3])], [("y", f, [2, 4])],
                       {"W": np.ones((3, 4), np.float32)}, domains=["com.example"])
    with ml.scoped_ops():
        ml.TorchBackend.register_op("Doubled", broken, domain="com.example")
        pm = ml.compile(ml.load_onnx(model), ml.TorchBackend())
        data = {"x": np.ones((2, 3), np.float32)}
        out = pm.evaluate(pm.get_parameters(), data)  # the forward alone runs
        np.testing.assert_allclose(out["y"].numpy(), np.tanh(6.0), rtol=1e-6)
        with pytest.raises(ml.errors.KernelError, match=r"node .the_broken_one'.*Doubled.*the gradient of kernel "
                                                         r".*RuntimeError: this op's backward is broken"):
            pm.evaluate(pm.get_parameters(), data, output_gradients={"y": np.ones((2, 4), np.float32)})
    assert not torch.is_anomaly_enabled()


# If and Loop gradients on every autodiff backend: tests/kernels/test_control_flow.py.


# -- jit, devices, dtypes, availability ----------------------------------------------------------
def test_eager_unless_compile_asked(backend):
    # compile(jit=None) reads jit_by_default: eager unless compile=True or jit=True; backend.jit,
    # called when the user's jit is True, is torch.compile.
    def forward(params, data):
        return {}

    assert not backend.jit_by_default
    assert ml.TorchBackend(compile=True).jit_by_default and ml.TorchBackend(jit=True).jit_by_default
    assert backend.jit(forward) is not forward


def test_absent_device_warns_and_runs_on_cpu():
    with pytest.warns(ml.errors.DeviceFallbackWarning, match=r"'cuda:7' is not present \(present devices: cpu"):
        b = ml.TorchBackend(device="cuda:7")
    assert b.device == "cpu" and b.ones(2).device.type == "cpu"
    with pytest.raises(ml.errors.BackendOptionError, match="'tpu' is not a device.*cpu, cuda"):
        ml.TorchBackend(device="tpu")
    assert ml.TorchBackend(device="cpu").device == "cpu"


def test_cotangents_move_to_the_device_as_data_inputs_do():
    # A CPU tensor or a NumPy cotangent on a GPU backend reached torch.autograd.grad on the CPU
    # ("invalid gradient at index 0 - expected device cuda:0 but got cpu"). torch's meta device
    # (shapes only, present in every torch) stands in for the GPU here.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    model = ml.load_onnx(make_model(nodes, [("x", TensorProto.FLOAT, ["N", 4])], [("y", TensorProto.FLOAT, ["N", 3])],
                                    {"w": np.ones((4, 3), np.float32)}))
    b = ml.TorchBackend()
    b._device = torch.device("meta")
    pm = ml.compile(model, b, data_keys=["x"])
    x = np.ones((2, 4), np.float32)
    for cot in (torch.ones(2, 3), np.ones((2, 3), np.float32)):
        out, grads = pm.evaluate(None, {"x": x}, output_gradients={"y": cot})
        assert out["y"].device.type == "meta" and grads["w"].device.type == "meta" and grads["w"].shape == (4, 3)
        assert grads["x"].device.type == "meta" and grads["x"].shape == (2, 4)


def test_unsupported_dtype_is_reported_with_reason():
    model = make_model([helper.make_node("Add", ["a", "b"], ["c"])],
                       [("a", TensorProto.UINT32, [2]), ("b", TensorProto.UINT32, [2])],
                       [("c", TensorProto.UINT32, [2])])
    with pytest.raises(UnsupportedDTypeError, match="uint32.*no arithmetic kernels"):
        ml.compile(ml.load_onnx(model), ml.TorchBackend())


def test_strings_run_on_the_host(backend):
    model = make_model([helper.make_node("StringConcat", ["a", "b"], ["c"])],
                       [("a", TensorProto.STRING, [2]), ("b", TensorProto.STRING, [2])],
                       [("c", TensorProto.STRING, [2])], opset=20)
    pm = ml.compile(ml.load_onnx(model), backend)
    out = pm.evaluate(None, {"a": np.array(["x", "y"], dtype=object), "b": np.array(["1", "2"], dtype=object)})
    assert backend.to_numpy(out["c"]).tolist() == ["x1", "y2"]


def test_missing_torch_names_the_extra(monkeypatch):
    from mithril.backends.torch import backend as torch_backend

    monkeypatch.setattr(torch_backend, "torch", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailableError, match=r"pip install mithril\[torch\]"):
        ml.TorchBackend()


# -- the recorded conformance run -------------------------------------------------------------------
def test_recorded_conformance_meets_target_and_every_failure_is_documented():
    from mithril import conformance

    record = conformance.load_record()["backends"].get("torch")
    if record is None:
        pytest.fail("reports/conformance.json has no torch column: run `python scripts/conformance.py --backend torch --write-docs`")
    cases = record["cases"]
    node_pass = sum(c["status"] == "pass" for c in cases.values() if c["kind"] == "node")
    assert node_pass >= 1650, f"Torch passes {node_pass} of the node cases; the target is 1,650"
    documented = conformance.expected_failures("torch")
    undocumented = sorted(n for n, c in cases.items() if c["status"] != "pass" and n not in documented)
    assert not undocumented, f"failures without an entry in mithril/expected_failures/torch.py: {undocumented}"
    stale = sorted(n for n in documented if cases.get(n, {}).get("status") == "pass")
    assert not stale, f"expected-failure entries that now pass (remove them): {stale}"
