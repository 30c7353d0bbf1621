"""Each weight held once (issue 57, Must 2): a model whose weights are ONNX external data loads
into GGML with its peak resident memory at most 1.15x its weights (ggml reads the memory-mapped
file where the layout allows; a transposed or quantized copy replaces the original, whose pages
are handed back), and save_gguf writes the model's own weights straight after compile, the same
file as after an evaluate, which then converts nothing again."""

import json
import mmap
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import mithril as ml
from mithril.backends.ggml.quantize import WeightFormat
from mithril.backends.host_memory import mapped_file, release_mapped_pages

pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _external_mlp(folder, dim: int, layers: int, batch: int = 2, seed: int = 0):
    """An MLP of ``layers`` [dim, dim] weights kept in ``folder``/weights.bin: MatMuls (stored
    transposed by ggml) and Gemms with transB (read as they are) in turn, a Relu between them,
    a bias on the last. Returns (model path, weights by name, the bias)."""
    rng = np.random.default_rng(seed)
    weights, nodes, inits, offset = {}, [], [], 0
    with open(os.path.join(folder, "weights.bin"), "wb") as f:
        for i in range(layers):
            w = rng.random((dim, dim), dtype=np.float32)
            w -= 0.5
            w *= 3.5 / np.sqrt(dim)
            f.write(w.tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[dim, dim],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(w.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            offset += w.nbytes
            inits.append(t)
            weights[f"w{i}"] = w
            x, y = ("x" if i == 0 else f"h{i - 1}"), f"m{i}"
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [y]) if i % 2 == 0 else
                         helper.make_node("Gemm", [x, f"w{i}"], [y], transB=1))
            nodes.append(helper.make_node("Relu", [y], [f"h{i}"]) if i < layers - 1 else
                         helper.make_node("Add", [y, "bias"], ["y"]))
    bias = np.linspace(-1, 1, dim, dtype=np.float32)
    inits.append(onnx.numpy_helper.from_array(bias, "bias"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])], inits)
    path = os.path.join(folder, "mlp.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, weights, bias


def _reference(weights, bias, x):
    h = x
    for i, (name, w) in enumerate(weights.items()):
        h = h @ (w if i % 2 == 0 else w.T)
        h = np.maximum(h, 0) if i < len(weights) - 1 else h + bias
    return h


# The child: ggml started on a tiny model first (its library, its threads: not the model's
# memory), the peak mark reset, then the model loaded, compiled and run once with its own weights.
_CHILD = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    import onnx
    import mithril as ml

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    path, quantize, dim = sys.argv[1], (sys.argv[2] or None), int(sys.argv[3])
    f32 = onnx.TensorProto.FLOAT
    tiny = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["a", "b"], ["c"])], "tiny",
                               [onnx.helper.make_tensor_value_info("a", f32, [2, 32])],
                               [onnx.helper.make_tensor_value_info("c", f32, [2, 32])],
                               [onnx.numpy_helper.from_array(np.ones((32, 32), np.float32), "b")]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    backend = ml.GGMLBackend(quantize=quantize)
    ml.compile(ml.load_onnx(tiny), backend, inference=True).evaluate(None, {"a": np.ones((2, 32), np.float32)})
    x = np.random.default_rng(1).standard_normal((2, dim)).astype(np.float32)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    pm = ml.compile(ml.load_onnx(path), backend, inference=True)
    y = pm.evaluate(None, {"x": x})["y"]
    np.save(sys.argv[4], y)
    print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before}))
""")


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """256 MiB of weights (four 4096 x 4096 matrices) as external data: (path, weight bytes,
    input, NumPy's output)."""
    dim, folder = 4096, tmp_path_factory.mktemp("external")
    path, weights, bias = _external_mlp(str(folder), dim, 4)
    x = np.random.default_rng(1).standard_normal((2, dim)).astype(np.float32)
    return path, sum(w.nbytes for w in weights.values()), x, _reference(weights, bias, x)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="peak RSS is read from Linux's /proc")
@pytest.mark.parametrize("quantize", [None, "q8_0"])
def test_an_external_data_model_loads_with_each_weight_resident_once(big_model, tmp_path, quantize):
    """Loading, compiling and one evaluate add at most 1.15x the weights to the process at its
    peak. Before, the memory-mapped original stayed resident beside each transposed or quantized
    copy: 2x for float32 (5.1 GB for a 2.5 GB MLP)."""
    path, weight_bytes, x, want = big_model
    out = str(tmp_path / "y.npy")
    done = subprocess.run([sys.executable, "-c", _CHILD, path, quantize or "", str(x.shape[1]), out],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rss = json.loads(done.stdout.strip().splitlines()[-1])
    assert rss["peak"] <= 1.15 * weight_bytes, (
        f"peak {rss['peak'] / 2**20:.0f} MiB for {weight_bytes / 2**20:.0f} MiB of weights ({quantize})")
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(np.load(out), want, atol=(1e-4 if quantize is None else 5e-2) * scale)


def _compiled(path, quantize):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ml.compile(ml.load_onnx(path), ml.GGMLBackend(quantize=quantize, num_threads=1), inference=True)


@pytest.mark.parametrize("quantize", [None, "q8_0", "q4_K"])
def test_save_gguf_straight_after_compile_writes_the_models_own_weights(tmp_path, monkeypatch, quantize):
    """No evaluate needed: the file is the one written after an evaluate, and the evaluates that
    follow the save run on the weights the save converted (nothing converted again, nor for
    get_parameters()' new views of the same weights). q4_K's matmul weights are repacked where
    ggml has its AVX2 kernel: the file holds their plain bytes all the same."""
    path, weights, bias = _external_mlp(str(tmp_path), 256, 3)
    x = {"x": np.random.default_rng(2).standard_normal((2, 256)).astype(np.float32)}

    run_first = _compiled(path, quantize)
    y = run_first.evaluate(None, x)["y"]
    ml.save_gguf(run_first, tmp_path / "after_evaluate.gguf")

    pm = _compiled(path, quantize)
    ml.save_gguf(pm, tmp_path / "after_compile.gguf")
    assert (tmp_path / "after_compile.gguf").read_bytes() == (tmp_path / "after_evaluate.gguf").read_bytes()
    converted = []
    convert = WeightFormat._convert
    monkeypatch.setattr(WeightFormat, "_convert", lambda self, array, *rest: (
        converted.append(array is not None), convert(self, array, *rest))[1])
    np.testing.assert_array_equal(pm.evaluate(None, x)["y"], y)
    np.testing.assert_array_equal(pm.evaluate(pm.get_parameters(), x)["y"], y)
    assert not any(converted)
    # a repacked weight's plain bytes are made again from its array for the file: the same bytes
    ml.save_gguf(pm, tmp_path / "again.gguf")
    assert (tmp_path / "again.gguf").read_bytes() == (tmp_path / "after_evaluate.gguf").read_bytes()
    converted.clear()
    if quantize is None:
        np.testing.assert_allclose(y, _reference(weights, bias, x["x"]), rtol=1e-4, atol=1e-4)
    # new memory (even with the same values) is read again
    pm.evaluate({k: np.array(v) for k, v in pm.get_parameters().items()}, x)
    assert any(converted)


@pytest.mark.parametrize("in_place", [True, False], ids=["patched-ggml", "published-ggml"])
def test_float32_weights_read_as_they_are_stay_in_the_file_pages(tmp_path, monkeypatch, in_place):
    """A Gemm's transB weight is the memory-mapped array itself, and so is a MatMul's [K, N] where
    ggml reads it in place (scripts/dev.sh's build); published ggml gets its transpose."""
    from mithril.backends.ggml import threads

    if in_place and not threads.reads_f32_in_place():
        pytest.skip("this ggml-python build has no in-place float32 matmul (scripts/dev.sh builds it patched)")
    monkeypatch.setitem(threads._STATE, "in_place", in_place)
    path, weights, bias = _external_mlp(str(tmp_path), 64, 4, batch=20)
    pm = _compiled(path, None)
    x = np.random.default_rng(1).standard_normal((20, 64)).astype(np.float32)
    y = pm.evaluate(None, {"x": x})["y"]
    np.testing.assert_allclose(y, _reference(weights, bias, x), rtol=1e-4, atol=1e-4)
    by_name = {w.value.name: w for w in pm.program._weights.values()}
    assert mapped_file(by_name["w1"].buffer) is not None  # the Gemm's, rows as stored
    if in_place:  # the MatMul's, read by ggml where the file's pages are
        assert {w.layout for w in by_name.values()} >= {"plain"}
        assert mapped_file(by_name["w0"].buffer) is not None and mapped_file(by_name["w2"].buffer) is not None
    else:  # the MatMul's, transposed
        assert mapped_file(by_name["w0"].buffer) is None
        np.testing.assert_array_equal(by_name["w0"].buffer, weights["w0"].T)


def test_mapped_pages_are_found_through_views_and_handed_back(tmp_path):
    data = np.arange(4 * mmap.PAGESIZE, dtype=np.float32)
    (tmp_path / "a.bin").write_bytes(data.tobytes())
    with open(tmp_path / "a.bin", "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    a = np.frombuffer(mm, np.float32).reshape(4, -1)[1:3, ::2].T
    assert mapped_file(a) is mm
    assert float(a.sum()) == float(data.reshape(4, -1)[1:3, ::2].sum())
    assert release_mapped_pages(a)
    np.testing.assert_array_equal(a, data.reshape(4, -1)[1:3, ::2].T)  # read again from the file
    assert mapped_file(np.array(a)) is None and not release_mapped_pages(np.array(a))
    writable = np.frombuffer(mmap.mmap(-1, mmap.PAGESIZE), np.uint8)  # anonymous: its own memory
    assert mapped_file(writable) is None
