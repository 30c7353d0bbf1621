"""GGML quantization on real trained weights (issue 19, Must 3): the per-weight error report,
and accuracy bars, not random weights:

- Magika's file-type model (``magika`` 0.5.1 ships it in its wheel: tests/data/real/
  wheel_magika_standard_v1.onnx, provenance in the MANIFEST), four trained dense layers that
  GGML quantizes: its logits' cosine similarity to onnxruntime float32 >= 0.999 at q8_0 and
  >= 0.99 at q4_0, on real files' bytes.
- LeNet trained here on scikit-learn's digits (NumpyBackend, as tests/frontend/test_training.py), then
  compiled on GGMLBackend: test accuracy drops <= 0.5 points at q8_0 and <= 2 at q4_0 against
  float32 NumPy, its fully connected layers quantized (rows zero-padded to whole blocks).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.backends.ggml.quantize import QuantizationReport, QuantizedTensor
from mithril.models import CrossEntropy, Mean, TrainModel

from tests.conftest import digits_32x32

pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")

ROOT = Path(__file__).resolve().parents[3]
MAGIKA = ROOT / "tests" / "data" / "real" / "wheel_magika_standard_v1.onnx"
LOGITS = "model/target_label/BiasAdd:0"  # the Softmax's input: logits compare more sharply than probabilities


_MAGIKA_SAMPLES = tuple(text.encode() for text in (
    "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    \"\"\"The softmax of x along axis.\"\"\"\n"
    "    e = np.exp(x - x.max(axis=axis, keepdims=True))\n    return e / e.sum(axis=axis, keepdims=True)\n\n\n"
    "class Counter:\n    def __init__(self):\n        self.counts = {}\n\n    def add(self, key):\n"
    "        self.counts[key] = self.counts.get(key, 0) + 1\n        return self.counts[key]\n\n\n"
    "if __name__ == \"__main__\":\n    print(softmax(np.arange(4.0)))\n",
    '{\n  "name": "example",\n  "version": "1.2.3",\n  "files": [\n    {"path": "a.onnx", "sha256": '
    '"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "bytes": 1024},\n'
    '    {"path": "b.onnx", "sha256": "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752", '
    '"bytes": 2048}\n  ],\n  "license": "Apache-2.0"\n}\n',
    "# Example\n\nA short project that **converts** models between frameworks.\n\n## Install\n\n"
    "```bash\npip install example\n```\n\n## Use\n\n- load a file\n- run it\n- compare the outputs\n\n"
    "See [the docs](docs/index.md) for more.\n",
    "#!/usr/bin/env bash\nset -euo pipefail\ncd \"$(dirname \"$0\")/..\"\nVENV=${VENV:-.venv}\n"
    "if [ ! -x \"$VENV/bin/python\" ]; then\n  python3 -m venv \"$VENV\"\nfi\n"
    "\"$VENV/bin/python\" -m pip install --quiet -e .\nexec \"$VENV/bin/python\" -m pytest -q \"$@\"\n",
    "[build-system]\nrequires = [\"setuptools>=77\"]\nbuild-backend = \"setuptools.build_meta\"\n\n"
    "[project]\nname = \"example\"\nversion = \"0.1.0\"\nrequires-python = \">=3.10\"\n"
    "dependencies = [\"numpy>=1.26\", \"onnx>=1.16\"]\n\n[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n",
))


def _compile(model, backend, shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # magika's shape arithmetic runs on NumPy (fallback warning)
        return ml.compile(model, backend, shapes=shapes, static_shapes=True, inference=True)


def _magika_features(data: bytes, size: int = 512, pad: int = 256) -> np.ndarray:
    """Magika v1's input: the first, middle and last 512 bytes of the (stripped) file, padded with 256."""
    data = data.strip()
    beg, end = list(data[:size]), list(data[-size:])
    start = max(0, (len(data) - size) // 2)
    mid = list(data[start:start + size])
    return np.array(beg + [pad] * (size - len(beg)) + mid + [pad] * (size - len(mid))
                    + [pad] * (size - len(end)) + end, np.float32)


@pytest.fixture(scope="module")
def magika():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(MAGIKA)
    model.graph.output.append(onnx.helper.make_tensor_value_info(LOGITS, onnx.TensorProto.FLOAT, None))
    # Files of six types, fixed here (the repository's own files change with it, and so would
    # magika's answers on them); one committed ONNX file.
    onnx_file = (ROOT / "tests" / "data" / "real" / "skl_mlp.onnx").read_bytes()
    x = np.stack([_magika_features(data) for data in (*_MAGIKA_SAMPLES, onnx_file)])
    want = ort.InferenceSession(model.SerializeToString()).run([LOGITS], {"bytes": x})[0]
    return ml.load_onnx(model), x, want


@pytest.mark.parametrize("quantize, bar", [("q8_0", 0.999), ("q4_0", 0.99)])
def test_magika_logits_stay_close_to_onnxruntime(magika, quantize, bar):
    model, x, want = magika
    pm = _compile(model, ml.GGMLBackend(quantize=quantize), {"bytes": list(x.shape)})
    got = np.asarray(pm.evaluate(pm.get_parameters(), {"bytes": x})[LOGITS])
    cosines = [float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(got, want)]
    assert min(cosines) >= bar, f"magika at {quantize}: cosine similarities {np.round(cosines, 5)}"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all(), (got.argmax(axis=1), want.argmax(axis=1))
    report = pm.program.quantization_report()
    # its four dense layers (257x128, 512x256, 256x256, 256x113) are quantized and reported
    assert sorted(r.shape for r in report) == [(256, 113), (256, 256), (257, 128), (512, 256)]
    assert all(r.type_name == quantize and r.nbytes < 0.3 * r.float_bytes for r in report)
    assert all(0 < r.rel_rms < (0.01 if quantize == "q8_0" else 0.15) for r in report)


# -- LeNet on the digits -------------------------------------------------------------------------
BATCH, N_TRAIN, EPOCHS, LR = 64, 1500, 6, 3e-3


def _digits():
    """LeNet's digits (conftest.digits_32x32) in float32."""
    x, y, xt, yt = digits_32x32(N_TRAIN)
    return x.astype(np.float32), y, xt.astype(np.float32), yt


@pytest.fixture(scope="module")
def lenet():
    """LeNet trained on NumPy (Adam, linear decay, shifted images): (params, test x, test y)."""
    from mithril.optimizers import Adam, fit

    xtr, ytr, xte, yte = _digits()
    tm = TrainModel(models_zoo.lenet(num_classes=10))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    pm = ml.compile(tm, ml.NumpyBackend(), shapes={"input": [BATCH, 1, 32, 32], "target": [BATCH]},
                    data_keys={"input", "target"})

    def batches(epoch, shift=2):
        rng = np.random.default_rng(epoch)
        perm = rng.permutation(N_TRAIN)
        for i in range(0, N_TRAIN - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            pad = np.pad(xtr[idx], ((0, 0), (0, 0), (shift, shift), (shift, shift)))
            at = rng.integers(0, 2 * shift + 1, (BATCH, 2))
            yield {"input": np.stack([pad[j, :, a:a + 32, b:b + 32] for j, (a, b) in enumerate(at)]),
                   "target": ytr[idx]}

    steps = EPOCHS * (N_TRAIN // BATCH)
    params, _, _ = fit(pm, pm.randomize_params(), batches, Adam(lambda step: LR * (1 - step / steps)), EPOCHS,
                       progress=False)
    return {k: np.asarray(v) for k, v in params.items()}, xte, yte


def _accuracy(backend, params, x, y) -> tuple[float, object]:
    pm = _compile(models_zoo.lenet(num_classes=10), backend, {"input": list(x.shape)})
    out = np.asarray(pm.evaluate({k: params[k] for k in pm.parameter_keys}, {"input": x})["output"])
    return 100 * float((out.argmax(axis=1) == y).mean()), pm


@pytest.mark.parametrize("quantize, max_drop", [("q8_0", 0.5), ("q4_0", 2.0)])
def test_lenet_trained_on_digits_keeps_its_accuracy(lenet, quantize, max_drop):
    params, x, y = lenet
    base, _ = _accuracy(ml.NumpyBackend(), params, x, y)
    assert base >= 90, f"LeNet trained to only {base:.1f} % on NumPy"
    acc, pm = _accuracy(ml.GGMLBackend(quantize=quantize), params, x, y)
    print(f"LeNet on digits: float32 NumPy {base:.2f} %, GGML {quantize} {acc:.2f} %")
    assert base - acc <= max_drop, f"{quantize}: {acc:.2f} % against {base:.2f} % in float32"
    report = pm.program.quantization_report()
    quantized = {r.name.split(".")[0]: r for r in report}
    # the fully connected layers are quantized (400 and 84 wide rows zero-padded to whole blocks);
    # the convolution kernels stay float32 (ggml's im2col reads float kernels only)
    assert set(quantized) == {"fc1", "fc2", "fc3"} and all(r.type_name == quantize for r in report)
    assert not any(r.name.startswith("conv") for r in report)
    assert quantized["fc1"].shape == (120, 400)  # Gemm with transB: [out, in]


def test_report_lists_weights_and_kept_float_matrices():
    """A 48-wide embedding table cannot be read by rows of 32-value blocks unpadded: kept float, named."""
    model = models_zoo.create_gpt(bias=True, block_size=16, dims=48, num_heads=4, num_layers=1, vocab_size=40)
    pm = _compile(model, ml.GGMLBackend(quantize="q8_0"), {"input": [1, 16]})
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    pm.evaluate(params, {"input": np.zeros((1, 16), np.int64)})
    report = pm.program.quantization_report()
    assert isinstance(report, QuantizationReport)
    rows = {r.name: r for r in report}
    w = rows["h.0.mlp.linear_0.weight"]
    assert w.type_name == "q8_0" and w.shape == tuple(params["h.0.mlp.linear_0.weight"].shape)
    assert w.nbytes < 0.4 * w.float_bytes  # rows of 48 padded to 64 and 0 < w.rel_rms < 0.01 and w.max_abs > 0
    kept = dict(report.kept_float)
    assert "wte.weight" in kept and "48 values" in kept["wte.weight"] and "wte.weight" not in rows
    text = str(report)
    assert "h.0.mlp.linear_0.weight" in text and "kept float: wte.weight" in text and "of float32" in text
    # new arrays: the report follows the reload
    pm.evaluate({k: v * 2 for k, v in params.items()}, {"input": np.zeros((1, 16), np.int64)})
    again = {r.name: r for r in pm.program.quantization_report()}
    assert again["h.0.mlp.linear_0.weight"].max_abs == pytest.approx(2 * w.max_abs, rel=1e-5)


def _two_matmuls(rng):
    """x [1, tokens, 64] @ W1 [64, 40] @ W2 [40, 36]: W1's 40 rows (stored transposed) are whole 8-row
    groups; W2's 36 are stored as 40 (quantize.ROW_MULTIPLE: zero rows whose results are dropped),
    not whole 32-row tiles."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w1 = rng.standard_normal((64, 40)).astype(np.float32)
    w2 = rng.standard_normal((40, 36)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "tokens", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "tokens", 36])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])), w1, w2


@pytest.mark.parametrize("quantize", ["q4_0", "q4_K", "q8_0"])
def test_repacked_matmul_weights_compute_what_llamafiles_kernel_does(quantize, monkeypatch):
    """q4_0, q4_K and (without AMX) q8_0 matmul weights go to ggml's CPU_REPACK buffer (interleaved
    for its gemm; q8_0's x86 kernel is scripts/patches/ggml-q8_0-x86-repack.patch) where the CPU
    has that kernel: same results as the plain layout, reloaded arrays re-repacked, bytes reported;
    a weight whose rows are not whole 8-row groups is stored with zero rows up to them (their
    results dropped) and repacked too. Eight activation rows run the gemm twice; one, the gemv."""
    import ggml

    from mithril.backends.ggml import program as ggml_program

    monkeypatch.setenv("MITHRIL_GGML_AMX", "0")
    rng = np.random.default_rng(0)
    model, w1, w2 = _two_matmuls(rng)
    x = {"x": rng.standard_normal((1, 8, 64)).astype(np.float32)}
    params = {"w1": w1, "w2": w2}
    pm = _compile(model, ml.GGMLBackend(quantize=quantize, num_threads=1), {"x": [1, 8, 64]})
    got = pm.evaluate(params, x)["y"]
    weights = {w.value.name: w for w in pm.program._weights.values()}
    if ggml_program._repack_buffer_type(quantize) is None or not ggml.ggml_cpu_has_avx2():
        assert not any(w.repacked for w in weights.values())  # no kernel: everything stays plain
        return
    assert len(weights["w1"].repacked) == 1 and weights["w1"].buffer is None  # the repacked copy only
    assert len(weights["w2"].repacked) == 1 and weights["w2"].buffer is None  # 36 rows stored as 40
    assert got.shape == (1, 8, 36)
    assert pm.memory_report().weights_by_dtype[quantize] == \
        weights["w1"].repacked[0][2] + weights["w2"].repacked[0][2]
    monkeypatch.setattr(ggml_program, "REPACKED", {})
    plain = _compile(model, ml.GGMLBackend(quantize=quantize, num_threads=1), {"x": [1, 8, 64]})
    want = plain.evaluate(params, x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(want, x["x"] @ w1 @ w2, rtol=0.2, atol=0.2 * np.abs(want).max())
    # A new array for w1 is quantized and repacked again.
    new = {"w1": w1[:, ::-1].copy(), "w2": w2}
    again, want = pm.evaluate(new, x)["y"], plain.evaluate(new, x)["y"]
    assert np.abs(again - got).max() > 0.1 * np.abs(got).max()
    np.testing.assert_allclose(again, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # One activation row (a decode step): the repacked gemv.
    monkeypatch.undo()
    monkeypatch.setenv("MITHRIL_GGML_AMX", "0")
    one = {"x": x["x"][:, :1]}
    step = _compile(model, ml.GGMLBackend(quantize=quantize, num_threads=1), {"x": [1, 1, 64]})
    assert all(len(w.repacked) == 1 for w in step.program._weights.values())
    got = step.evaluate(params, one)["y"]
    monkeypatch.setattr(ggml_program, "REPACKED", {})
    plain = _compile(model, ml.GGMLBackend(quantize=quantize, num_threads=1), {"x": [1, 1, 64]})
    want = plain.evaluate(params, one)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_q8_0_matmul_weights_run_on_amx_where_it_works(monkeypatch):
    """q8_0 matmul weights go to ggml's AMX buffer (laid out as int8 tiles) where the CPU has
    AMX-INT8 and this ggml build's AMX matmul runs (ggml-python as published dies with SIGILL;
    scripts/dev.sh builds it patched, and amx_works asks a child process first): same results as
    llamafile's q8_0 kernel; a weight whose rows are not whole 32-row tiles stays plain."""
    from mithril.backends.ggml import program as ggml_program

    if (ggml_program._repack_buffer_type("q8_0") or (None,))[0] != b"AMX":
        pytest.skip("no working AMX here: this CPU has no AMX-INT8, or this ggml-python build's AMX "
                    "matmul faults (not built by scripts/dev.sh), or MITHRIL_GGML_AMX=0")
    rng = np.random.default_rng(3)
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w1 = rng.standard_normal((64, 96)).astype(np.float32)  # 96 rows stored transposed: three tiles
    w2 = rng.standard_normal((96, 40)).astype(np.float32)  # 40 rows: not whole tiles
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 40])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = {"x": rng.standard_normal((1, 24, 64)).astype(np.float32)}
    params = {"w1": w1, "w2": w2}
    for threads in (1, 2):
        pm = _compile(model, ml.GGMLBackend(quantize="q8_0", num_threads=threads), {"x": [1, 24, 64]})
        got = pm.evaluate(params, x)["y"]
        weights = {w.value.name: w for w in pm.program._weights.values()}
        assert len(weights["w1"].repacked) == 1 and not weights["w2"].repacked
        with monkeypatch.context() as m:
            m.setattr(ggml_program, "REPACKED", {})
            plain = _compile(model, ml.GGMLBackend(quantize="q8_0", num_threads=threads), {"x": [1, 24, 64]})
            want = plain.evaluate(params, x)["y"]
        assert not any(w.repacked for w in plain.program._weights.values())
        # the same int8 products, summed in another order (AMX accumulates in int32, per tile)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        np.testing.assert_allclose(want, x["x"] @ w1 @ w2, rtol=0.05, atol=0.05 * np.abs(want).max())


def test_amx_can_be_turned_off(monkeypatch):
    from mithril.backends.ggml import program as ggml_program

    monkeypatch.setenv("MITHRIL_GGML_AMX", "0")
    assert ggml_program.amx_works() is False
    assert (ggml_program._repack_buffer_type("q8_0") or (None,))[0] in (None, b"CPU_REPACK")


def test_repack_refuses_what_ggmls_repacked_matmul_would_assert_on():
    """The refusal that keeps a weight out of the CPU_REPACK buffer (ggml would read its interleaved
    bytes as plain ones in any other op, and asserts on a 4-D activation or a part row group)."""
    import ctypes

    import ggml

    from mithril.backends.ggml.program import _repack_refusal

    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    try:
        w = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 64, 16)
        x3 = ggml.ggml_new_tensor_3d(ctx, ggml.GGML_TYPE_F32, 64, 8, 2)
        x4 = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, 64, 8, 1, 2)
        good = ggml.ggml_mul_mat(ctx, w, x3).contents
        assert _repack_refusal(ggml, w.contents, [(good, 0)]) is None
        assert "dims" in _repack_refusal(ggml, w.contents, [(good, 0), (ggml.ggml_mul_mat(ctx, w, x4).contents, 0)])
        other = ggml.ggml_get_rows(ctx, w, ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I32, 2)).contents
        assert "other than" in _repack_refusal(ggml, w.contents, [(good, 0), (other, 0)])
        odd = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, 64, 12)
        assert "8-row" in _repack_refusal(ggml, odd.contents, [(ggml.ggml_mul_mat(ctx, odd, x3).contents, 0)])
        assert _repack_refusal(ggml, w.contents, []) == "read by no node"
        # AMX: whole 32-row tiles, and a contiguous activation
        assert "32-row" in _repack_refusal(ggml, w.contents, [(good, 0)], amx=True)
        w32 = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_Q8_0, 64, 32)
        assert _repack_refusal(ggml, w32.contents, [(ggml.ggml_mul_mat(ctx, w32, x3).contents, 0)], amx=True) is None
        strided = ggml.ggml_view_2d(ctx, x3, 64, 4, x3.contents.nb[1] * 2, 0)
        assert "contiguous" in _repack_refusal(ggml, w32.contents, [(ggml.ggml_mul_mat(ctx, w32, strided).contents, 0)],
                                               amx=True)
        assert ctypes.addressof(w.contents)  # the tensors are still ggml's (nothing was computed)
    finally:
        ggml.ggml_free(ctx)


def test_gguf_of_a_model_with_repacked_weights_holds_the_plain_bytes(tmp_path):
    """save_gguf writes a repacked weight's plain q4_0 bytes (made again from its array: ggml keeps
    only the interleaved copy); the file loads back and runs to the same outputs."""
    rng = np.random.default_rng(1)
    model, w1, w2 = _two_matmuls(rng)
    x = {"x": rng.standard_normal((1, 8, 64)).astype(np.float32)}
    pm = _compile(model, ml.GGMLBackend(quantize="q4_0", num_threads=1), {"x": [1, 8, 64]})
    params = {"w1": w1, "w2": w2}
    want = pm.evaluate(params, x)["y"]
    path = str(tmp_path / "mm.gguf")
    ml.save_gguf(pm, path)
    loaded = ml.load_gguf(path)
    assert loaded["w1"].type_name == "q4_0"
    np.testing.assert_array_equal(loaded["w1"].data, QuantizedTensor.from_array(w1, "q4_0", "t").data)
    again = _compile(model, ml.GGMLBackend(quantize="q4_0", num_threads=1), {"x": [1, 8, 64]})
    np.testing.assert_array_equal(again.evaluate(dict(loaded), x)["y"], want)
