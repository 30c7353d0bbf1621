"""GGUF in and out (issue 19, Must 4): ml.save_gguf writes a GGML model's weights as the backend
stores them, ml.load_gguf gives them back and GGMLBackend runs them without re-quantizing (bit
for bit the same outputs); dequantized, any backend runs them; the file reads back with gguf's
own GGUFReader; a damaged file is a MithrilError naming it."""

import json
import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.backends.ggml import quantize as quantize_module
from mithril.backends.ggml.gguf_io import GGUFFileError
from mithril.backends.ggml.quantize import QuantizedTensor
from mithril.errors import MithrilError

pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
gguf = pytest.importorskip("gguf", reason="GGUF files need the gguf package")

SHAPE = (1, 16)


def _gpt():
    return models_zoo.create_gpt(bias=True, block_size=16, dims=64, num_heads=4, num_layers=2, vocab_size=96)


def _compile(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ml.compile(_gpt(), backend, shapes={"input": SHAPE}, inference=True, static_shapes=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A q8_0 GPT evaluated once and saved: (pm, params, tokens, its output, the file)."""
    pm = _compile(ml.GGMLBackend(quantize="q8_0"))
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    x = np.random.default_rng(0).integers(0, 96, SHAPE)
    out = pm.evaluate(params, {"input": x})["output"]
    path = tmp_path_factory.mktemp("gguf") / "gpt_q8_0.gguf"
    ml.save_gguf(pm, path, name="zoo gpt")
    return pm, params, x, out, path


def test_round_trip_runs_the_stored_bytes_bit_for_bit(saved, monkeypatch):
    pm, params, x, out, path = saved
    loaded = ml.load_gguf(path)
    assert set(loaded) == set(pm.parameter_keys)
    quantized = {k for k, v in loaded.items() if isinstance(v, QuantizedTensor)}
    assert {"wte.weight", "lm_head.weight", "h.0.attn.q_proj.weight", "h.1.mlp.linear_1.weight"} <= quantized
    assert all(loaded[k].type_name == "q8_0" for k in quantized)
    assert loaded["h.0.ln_1.bias"].dtype == np.float32 and loaded["h.0.ln_1.bias"].shape == (64,)

    def refuse(*args, **kwargs):
        raise AssertionError("a GGUF weight was quantized again")

    monkeypatch.setattr(quantize_module, "quantize_rows", refuse)
    fresh = _compile(ml.GGMLBackend(quantize="q8_0"))  # a new program: nothing cached from `pm`
    got = fresh.evaluate(loaded, {"input": x})["output"]
    np.testing.assert_array_equal(got, out)
    # the buffers ggml reads are the file's bytes, not copies made from them; a weight ggml holds as
    # AMX tiles (where AMX works) keeps only the tiles, laid out from those bytes (nothing quantized)
    weights = {w.value.name: w for w in fresh.program._weights.values() if w.type_name == "q8_0"}
    lent = {k: w.buffer for k, w in weights.items() if not w.repacked}
    assert weights and all(lent[k] is loaded[k].data for k in lent)
    assert all(w.buffer is None for w in weights.values() if w.repacked)
    report = fresh.program.quantization_report()
    assert {r.name for r in report} == set(weights) and all(r.rel_rms is None for r in report)
    assert "stored" in str(report)


def test_dequantized_parameters_run_on_numpy(saved):
    pm, params, x, out, path = saved
    dense = ml.load_gguf(path, dequantize=True)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in dense.values())
    assert all(dense[k].shape == params[k].shape for k in params)
    ref = _compile(ml.NumpyBackend())
    got = ref.evaluate(dense, {"input": x})["output"]
    # The same weights in NumPy's float32 arithmetic; ggml's q8_0 matmuls also round the
    # activations to 8 bits (llama.cpp's vec_dot), hence the 2 % of the largest logit.
    np.testing.assert_allclose(got, out, rtol=0, atol=0.02 * np.abs(out).max())
    cosine = float(got.ravel() @ out.ravel() / np.linalg.norm(got) / np.linalg.norm(out))
    assert cosine > 0.9999, cosine
    # and dequantizing by hand gives the same arrays
    by_hand = {k: np.asarray(v) for k, v in ml.load_gguf(path).items()}
    assert all(np.array_equal(by_hand[k], dense[k]) for k in dense)
    # q8_0 weights are close to the float32 ones they were made from
    w = params["h.0.mlp.linear_0.weight"]
    assert np.abs(dense["h.0.mlp.linear_0.weight"] - w).max() < 0.01 * np.abs(w).max()


def test_file_reads_back_with_gguf_reader(saved):
    pm, params, x, out, path = saved
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(pm.parameter_keys)
    q8 = gguf.GGMLQuantizationType.Q8_0
    assert tensors["h.0.attn.q_proj.weight"].tensor_type == q8
    assert tensors["wte.weight"].tensor_type == q8
    assert tensors["h.0.ln_1.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert list(tensors["wte.weight"].shape) == [64, 96]  # ggml's order: ne[0] is the row
    assert tensors["wte.weight"].n_bytes == 96 * 2 * 34  # two 34-byte q8_0 blocks per row

    def text(key):
        field = reader.fields[key]
        return bytes(field.parts[field.data[0]]).decode()

    assert text("general.name") == "zoo gpt"
    assert text("general.architecture") == "mithril"
    assert json.loads(text("mithril.inputs")) == [{"name": "input", "shape": [1, 16], "dtype": "int64"}]
    assert json.loads(text("mithril.outputs")) == ["output"]
    layout = json.loads(text("mithril.tensors"))
    assert layout["h.0.attn.q_proj.weight"] == {"param": "h.0.attn.q_proj.weight", "type": "q8_0",
                                                 "layout": "rows", "shape": [64, 64], "dtype": "float32"}
    loaded = ml.load_gguf(path)
    assert loaded.name == "zoo gpt" and loaded.inputs == {"input": {"shape": [1, 16], "dtype": "int64"}}


def test_params_dict_is_quantized_by_rows(tmp_path):
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((8, 40)).astype(np.float32),  # rows of 40: padded to 64
              "b": rng.standard_normal(8).astype(np.float32), "steps": np.array([3, 4], np.int64)}
    path = tmp_path / "p.gguf"
    ml.save_gguf(params, path, quantize="q4_0")
    loaded = ml.load_gguf(path)
    assert loaded["w"].type_name == "q4_0" and loaded["w"].stored_shape == (8, 64)
    assert np.abs(loaded["w"].dequantize() - params["w"]).max() < 0.25 * np.abs(params["w"]).max()
    np.testing.assert_array_equal(loaded["b"], params["b"])
    np.testing.assert_array_equal(loaded["steps"], params["steps"])
    assert loaded["steps"].dtype == np.int64
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert tensors["w"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert tensors["b"].tensor_type == gguf.GGMLQuantizationType.F32


def test_a_different_quantization_is_converted_not_misread(saved):
    """A q8_0 file given to a q4_0 model: dequantized and quantized again as q4_0."""
    pm, params, x, out, path = saved
    q4 = _compile(ml.GGMLBackend(quantize="q4_0"))
    got = q4.evaluate(ml.load_gguf(path), {"input": x})["output"]
    want = q4.evaluate(ml.load_gguf(path, dequantize=True), {"input": x})["output"]
    np.testing.assert_array_equal(got, want)
    assert {r.type_name for r in q4.program.quantization_report()} == {"q4_0"}


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_file_is_a_mithril_error_naming_it(saved, tmp_path, damage):
    data = saved[-1].read_bytes()
    bad = tmp_path / f"{damage}.gguf"
    bad.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"GGUF" + bytes(range(256)) * 4,
                     "empty": b""}[damage])
    with pytest.raises(GGUFFileError, match=str(bad).replace(".", r"\.")) as info:
        ml.load_gguf(bad)
    assert isinstance(info.value, MithrilError)
    with pytest.raises(GGUFFileError, match="no file"):
        ml.load_gguf(tmp_path / "missing.gguf")


def test_half_precision_weights_round_trip_and_long_names(tmp_path):
    """f16 weights travel as stored too; a name longer than ggml's 63 bytes is kept in the metadata."""
    model = models_zoo.mlp([16, 8, 4])
    pm = ml.compile(model, ml.GGMLBackend(dtype=ml.float16), shapes={"input": [2, 12]}, static_shapes=True,
                    inference=True)
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    x = np.random.default_rng(2).standard_normal((2, 12)).astype(np.float32)
    out = pm.evaluate(params, {"input": x})["output"]
    ml.save_gguf(pm, tmp_path / "mlp.gguf")
    loaded = ml.load_gguf(tmp_path / "mlp.gguf")
    assert {v.type_name for v in loaded.values() if isinstance(v, QuantizedTensor)} == {"f16"}
    np.testing.assert_array_equal(pm.evaluate(loaded, {"input": x})["output"], out)

    long = "encoder." * 10 + "weight"
    ml.save_gguf({long: np.ones((2, 32), np.float32)}, tmp_path / "long.gguf", quantize="q8_0")
    names = [t.name for t in gguf.GGUFReader(tmp_path / "long.gguf").tensors]
    assert all(len(n) <= 63 for n in names)
    assert list(ml.load_gguf(tmp_path / "long.gguf")) == [long]


def test_save_refusals_are_mithril_errors(tmp_path):
    pm = _compile(ml.GGMLBackend(quantize="q8_0"))
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    with pytest.raises(MithrilError, match="compiled with GGMLBackend\\(quantize='q8_0'\\)"):
        ml.save_gguf(pm, tmp_path / "x.gguf", quantize="q4_0", params=params)
    ml.save_gguf(pm, tmp_path / "x.gguf", params=params)  # params= loads them first
    assert ml.load_gguf(tmp_path / "x.gguf")["lm_head.weight"].type_name == "q8_0"
    with pytest.raises(GGUFFileError, match="could not write"):
        ml.save_gguf(params, tmp_path / "no" / "such" / "dir.gguf")
