"""Each weight is held once: loading frees the protobuf, external data is memory-mapped, and
NumPy-based backends hand out the model's own (read-only) arrays rather than copies."""

import mmap
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml


def _mlp(hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((16, hidden)).astype(np.float32)
    w2 = rng.standard_normal((hidden, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _mapped(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False


def test_loaded_tensors_no_longer_read_the_protobuf(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_mlp(), path)
    model = ml.load_onnx(path)
    for value in model.graph.initializers.values():
        assert not isinstance(value.const_value, ir.serde.TensorProtoTensor)
        assert not value.const_value.numpy().flags.writeable  # kernels never write into weights


def test_external_data_is_memory_mapped_and_exports_whole(tmp_path):
    proto = _mlp()
    onnx.save(proto, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    model = ml.load_onnx(tmp_path / "m.onnx")
    pm = ml.compile(model, ml.NumpyBackend())
    params = pm.get_parameters()
    assert all(_mapped(v) for v in params.values())
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
    inline = ml.compile(ml.load_onnx(_mlp()), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    np.testing.assert_array_equal(pm.evaluate(params, {"x": x})["y"], inline)
    # to_proto reads the mapped data in: onnxruntime runs it from bytes, with no folder to look in.
    blob = model.to_proto().SerializeToString()
    got = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, inline, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", [ml.NumpyBackend, ml.CBackend])
def test_numpy_based_backends_share_the_models_arrays(backend):
    pm = ml.compile(ml.load_onnx(_mlp()), backend(), shapes={"x": [2, 16]})
    first, second = pm.get_parameters(), pm.get_parameters()
    for k in first:
        assert np.shares_memory(first[k], second[k])
        with pytest.raises(ValueError, match="read-only"):
            first[k][...] = 0
    # A step makes new arrays; the model's own stay as they were.
    before = {k: np.array(v) for k, v in first.items()}
    stepped = {k: v - 0.1 for k, v in first.items()}
    for k in before:
        np.testing.assert_array_equal(pm.get_parameters()[k], before[k])
        assert not np.shares_memory(stepped[k], first[k])


def test_torch_parameters_are_one_copy_not_aliases():
    pm = ml.compile(ml.load_onnx(_mlp()), ml.TorchBackend(), shapes={"x": [2, 16]})
    params = pm.get_parameters()
    params["w1"].native.add_(1.0) if hasattr(params["w1"], "native") else params["w1"].add_(1.0)
    fresh = ml.TorchBackend().to_numpy(pm.get_parameters()["w1"])
    np.testing.assert_array_equal(fresh, numpy_helper.to_array(_mlp().graph.initializer[0]))


def test_torch_evaluate_with_the_models_own_parameters_shares_their_memory():
    """evaluate(None, ...) on the CPU runs on tensors over the model's arrays (torch.from_numpy),
    not a second copy; get_parameters still hands out copies, which a step may change."""
    torch = pytest.importorskip("torch")
    model = ml.load_onnx(_mlp())
    pm = ml.compile(model, ml.TorchBackend(), shapes={"x": [2, 16]})
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    want = ml.compile(model, ml.NumpyBackend(), shapes={"x": [2, 16]}).evaluate(None, {"x": x})["y"]
    got = ml.TorchBackend().to_numpy(pm.evaluate(None, {"x": x})["y"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for k, held in pm._placed.items():
        held = held.native if hasattr(held, "native") else held
        assert isinstance(held, torch.Tensor)
        assert held.data_ptr() == pm._params_numpy[k].ctypes.data  # the model's own memory
    copy = pm.get_parameters()["w1"]
    copy = copy.native if hasattr(copy, "native") else copy
    assert copy.data_ptr() != pm._params_numpy["w1"].ctypes.data


# A child process: its resident memory is not shared with the test session's.
_RESIDENT = textwrap.dedent("""
    import gc, sys
    import numpy as np
    import mithril as ml

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))

    def run(path):
        pm = ml.compile(ml.load_onnx(path), ml.NumpyBackend(), shapes={"x": [2, 16]})
        params = pm.get_parameters()
        for _ in range(5):
            pm.evaluate(params, {"x": np.ones((2, 16), np.float32)})
        return pm, params

    run(sys.argv[2])  # a small model first: what compiling imports is not the big model's memory
    gc.collect()
    before = rss()
    pm = ml.compile(ml.load_onnx(sys.argv[1]), ml.NumpyBackend(), shapes={"x": [2, 16]})
    params = pm.get_parameters()
    x = np.ones((2, 16), np.float32)
    for _ in range(5):
        pm.evaluate(params, {"x": x})
    gc.collect()
    print(rss() - before)
""")


def test_resident_memory_holds_each_weight_once(tmp_path):
    path, small = tmp_path / "big.onnx", tmp_path / "small.onnx"
    onnx.save(_mlp(), small)
    onnx.save(_mlp(hidden=1 << 19), path)  # 16 x 524288 + 524288 x 4 floats: 40 MiB of weights
    weights = (16 + 4) * (1 << 19) * 4
    out = subprocess.run([sys.executable, "-c", _RESIDENT, str(path), str(small)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    added = int(out.stdout.strip().splitlines()[-1])
    # Twice the weights would mean a second copy (the protobuf, or get_parameters' own).
    assert added < 1.4 * weights, f"{added / 2**20:.1f} MiB resident for {weights / 2**20:.1f} MiB of weights"
