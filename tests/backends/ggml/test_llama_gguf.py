"""GGUF files llama.cpp runs (issue 57, Must 5): decoders exported by optimum-onnx with their
key/value cache (GPT-2, Llama, Qwen2, Phi-3, built here from small configs) written by
``ml.save_gguf(..., arch=...)`` / ``mithril export-gguf`` with a BPE tokenizer trained here.

Fast tier: the metadata, tensor names, shapes and types llama.cpp reads (gguf's own reader and
tables), the values against the export's, and the file run by Mithril's ``ml.generate`` on GGML
against onnxruntime's greedy decoding of the ONNX file, token for token. Long tier: llama.cpp
itself (llama-cpp-python, built from source by scripts/dev.sh) loads each file, float32 and
q8_0, and generates the same tokens.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mithril as ml
from mithril.backends.ggml.llama_gguf import _unpermute_rope, hf_state

pytest.importorskip("gguf")
pytest.importorskip("ggml")
tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import optimum_export  # noqa: E402

ARCHS = ("gpt2", "llama", "qwen2", "phi3")
TYPES = ("f32", "q8_0")
NEW = 16
CONTEXT = 32
TEXT = ("the quick brown fox jumps over the lazy dog. a small model reads a small text, "
        "and the tokenizer learns its words: fox, dog, model, text, words.")


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 20, trainer)
    return tok


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode("a small model reads").ids


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tokenizer):
    """arch -> the folder optimum-onnx exported it to (model.onnx, config.json, tokenizer.json)."""
    if not optimum_export.available():
        pytest.skip("optimum-onnx is not installed (scripts/dev.sh installs it in .venv/optimum-onnx)")
    out = tmp_path_factory.mktemp("optimum")
    tok_file, text_file = out / "tokenizer.json", out / "text.txt"
    tokenizer.save(str(tok_file))
    text_file.write_text((TEXT + " ") * 20)
    # trained a little on the text (200 steps): the prompt, from the text, is continued with clear
    # margins between the two best logits, as a real model's greedy decoding is, so q8_0's rounding
    # does not decide a near tie. At a rate of 0.01 GPT-2's training diverges on some CPUs (torch's
    # kernels differ by CPU) and its continuation is one token repeated.
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "optimum_export.py"), "--arch", ",".join(ARCHS),
                           "--out", str(out), "--tokenizer", str(tok_file), "--train", str(text_file),
                           "--steps", "200", "--lr", "0.005"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {arch: out / arch / "onnx" for arch in ARCHS}


@pytest.fixture(scope="module")
def files(exports, tmp_path_factory):
    """(arch, type) -> the GGUF file written from the export (tokenizer and config beside it)."""
    out = tmp_path_factory.mktemp("gguf")
    written = {}
    for arch in ARCHS:
        for kind in TYPES:
            path = out / f"{arch}-{kind}.gguf"
            ml.save_gguf(str(exports[arch] / "model.onnx"), path, arch="auto", quantize=None if kind == "f32" else kind)
            written[arch, kind] = path
    return written


def onnxruntime_greedy(model_path, prompt, new) -> tuple[list[int], np.ndarray]:
    """Greedy decoding of an optimum export (the prompt at once, then a token per call with the
    cache fed back), and the logits of the prompt's last position."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    past = {n: np.zeros((1, v.shape[1], 0, v.shape[3]), np.float32) for n, v in inputs.items() if n.startswith("past")}
    ids, pos, tokens, first = np.array([prompt], np.int64), 0, [], None
    for _ in range(new):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, pos + ids.shape[1]), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(pos, pos + ids.shape[1], dtype=np.int64)[None]
        res = dict(zip(outputs, sess.run(None, feeds)))
        logits = res["logits"][0, -1]
        first = logits if first is None else first
        tokens.append(int(logits.argmax()))
        past = {n.replace("present", "past_key_values"): v for n, v in res.items() if n.startswith("present")}
        pos += ids.shape[1]
        ids = np.array([[tokens[-1]]], np.int64)
    return tokens, first


def compiled(dec):
    # one thread: a 64-wide model gains nothing from more, and ggml's spinning thread barriers
    # cost milliseconds per op on a busy machine (two pytest workers on two cores)
    return ml.compile(dec.model, dec.backend(num_threads=1), shapes={"input": (1, 1)}, inference=True)


def mithril_greedy(path, prompt, new) -> list[int]:
    dec = ml.gguf_decoder(path, context=CONTEXT)
    return [int(t) for t in ml.generate(compiled(dec), dec.params, prompt, new)]


def _reader(path):
    import gguf

    return gguf.GGUFReader(str(path), "r")


def _field(reader, key):
    from mithril.backends.ggml.gguf_metadata import field_value as _field_value

    return _field_value(reader.fields[key])


# -- the file llama.cpp reads ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_metadata_and_tensors_are_llama_cpps(arch, files, exports, tokenizer):
    import gguf

    config = json.loads((exports[arch] / "config.json").read_text())
    for kind in TYPES:
        r = _reader(files[arch, kind])
        assert _field(r, "general.architecture") == arch
        assert _field(r, "general.file_type") == {"f32": 0, "q8_0": 7}[kind]
        n_embd = config.get("hidden_size", config.get("n_embd"))
        n_layer = config.get("num_hidden_layers", config.get("n_layer"))
        n_head = config.get("num_attention_heads", config.get("n_head"))
        assert _field(r, f"{arch}.embedding_length") == n_embd
        assert _field(r, f"{arch}.block_count") == n_layer
        assert _field(r, f"{arch}.attention.head_count") == n_head
        assert _field(r, f"{arch}.attention.head_count_kv") == config.get("num_key_value_heads", n_head)
        assert _field(r, f"{arch}.context_length") == config.get("max_position_embeddings", config.get("n_positions"))
        if arch == "gpt2":
            assert _field(r, "gpt2.attention.layer_norm_epsilon") == pytest.approx(config["layer_norm_epsilon"])
            assert _field(r, "gpt2.feed_forward_length") == 4 * n_embd
        else:
            assert _field(r, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(config["rms_norm_eps"])
            assert _field(r, f"{arch}.rope.freq_base") == pytest.approx(config.get("rope_theta", 10000.0))
            assert _field(r, f"{arch}.rope.dimension_count") == n_embd // n_head
            assert _field(r, f"{arch}.feed_forward_length") == config["intermediate_size"]
        # the tokenizer: every id of the embedding named, the trained merges, GPT-2's pre-tokenizer
        tokens = _field(r, "tokenizer.ggml.tokens")
        assert len(tokens) == config["vocab_size"] and _field(r, "tokenizer.ggml.model") == "gpt2"
        assert _field(r, "tokenizer.ggml.pre") == "gpt-2"
        vocab = tokenizer.get_vocab()
        assert all(tokens[i] == t for t, i in vocab.items())
        assert tokens[-1] == f"[PAD{config['vocab_size'] - 1}]"
        assert len(_field(r, "tokenizer.ggml.merges")) == len(json.loads(tokenizer.to_str())["model"]["merges"])
        types = _field(r, "tokenizer.ggml.token_type")
        assert types[vocab["<|endoftext|>"]] == gguf.TokenType.CONTROL and types[-1] == gguf.TokenType.UNUSED
        # names: llama.cpp's for this architecture; matrices in the file's type, the rest float32
        allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]}
        names = {t.name for t in r.tensors}
        for name in names:
            base = name.rsplit(".", 1)[0]
            assert re.sub(r"^blk\.\d+\.", "blk.{bid}.", base) in allowed, name
        for t in r.tensors:
            want = kind if len(t.shape) == 2 and not t.name.startswith("position_embd") else "f32"
            assert t.tensor_type.name.lower() == want, (t.name, t.tensor_type)
        ne = {t.name: [int(d) for d in t.shape] for t in r.tensors}
        assert ne["token_embd.weight"] == [n_embd, config["vocab_size"]]
        assert ne["output.weight"] == [n_embd, config["vocab_size"]]
        if arch in ("gpt2", "phi3"):
            q_rows = n_embd + 2 * (n_embd // n_head) * config.get("num_key_value_heads", n_head)
            assert ne["blk.0.attn_qkv.weight"] == [n_embd, q_rows]
        else:
            assert ne["blk.1.attn_k.weight"] == [n_embd, config["num_key_value_heads"] * (n_embd // n_head)]
        if arch == "phi3":
            assert ne["blk.0.ffn_up.weight"] == [n_embd, 2 * config["intermediate_size"]]
        if arch == "qwen2":
            assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= names



@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_values_are_the_exports(arch, files, exports):
    # Every weight of the ONNX file, found by the node that reads it (renamed and deduplicated
    # initializers included), lands in the file with llama.cpp's layout.
    import onnx

    state = hf_state(onnx.load(exports[arch] / "model.onnx"))
    f32 = {t.name: np.array(t.data).reshape([int(d) for d in t.shape[::-1]])
           for t in _reader(files[arch, "f32"]).tensors}
    if arch == "gpt2":
        assert np.array_equal(f32["blk.1.attn_qkv.weight"], state["transformer.h.1.attn.c_attn.weight"])
        assert np.array_equal(f32["position_embd.weight"], state["transformer.wpe.weight"])
        assert np.array_equal(f32["blk.1.ffn_norm.bias"], state["transformer.h.1.ln_2.bias"])
    else:
        heads, kv = (4, 2) if arch != "phi3" else (4, 4)
        q = f32["blk.1.attn_q.weight"] if arch != "phi3" else f32["blk.1.attn_qkv.weight"][:64]
        if arch == "llama":  # rows permuted for rope on adjacent pairs
            q = _unpermute_rope(q, heads)
            assert np.array_equal(_unpermute_rope(f32["blk.1.attn_k.weight"], kv),
                                  state["model.layers.1.self_attn.k_proj.weight"])
        want = state["model.layers.1.self_attn.q_proj.weight"] if arch != "phi3" else \
            state["model.layers.1.self_attn.qkv_proj.weight"][:64]
        assert np.array_equal(q, want)
        # layer 1's norm reads layer 0's initializer through an Identity (the exporter's dedup)
        assert np.array_equal(f32["blk.1.attn_norm.weight"], state["model.layers.1.input_layernorm.weight"])
    embedding = next(v for k, v in state.items() if k.endswith(("wte.weight", "embed_tokens.weight")))
    assert np.array_equal(f32["token_embd.weight"], embedding)
    q8 = {t.name: t for t in _reader(files[arch, "q8_0"]).tensors}
    from mithril.backends.ggml.quantize import dequantize_rows

    t = q8["output.weight"]
    dense = dequantize_rows(np.array(t.data), "q8_0", int(t.shape[1]), int(t.shape[0]))
    assert np.abs(dense - f32["output.weight"]).max() <= np.abs(f32["output.weight"]).max() / 127 + 1e-6


# -- the file run by Mithril --------------------------------------------------------------------


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_mithril_generates_onnxruntimes_tokens_from_the_file(arch, kind, files, exports, prompt):
    expected, logits = onnxruntime_greedy(exports[arch] / "model.onnx", prompt, NEW)
    assert len(set(expected)) > 2, expected  # a sequence, not one token repeated
    dec = ml.gguf_decoder(files[arch, kind], context=CONTEXT)
    assert dec.arch == arch and dec.quantize == (None if kind == "f32" else kind)
    step = compiled(dec)
    assert [int(t) for t in ml.generate(step, dec.params, prompt, NEW)] == expected
    if kind == "f32":  # the prompt's last logits, against onnxruntime's
        from mithril.generation import _position

        inputs = {v.name: v for v in step.ir.graph.inputs}
        state = {n: np.zeros([int(d) for d in v.shape], np.float32) for n, v in inputs.items() if "_cache_" in n}
        for p, token in enumerate(prompt):
            out = step.evaluate(dec.params, {"input": np.array([[token]], np.int64), **state,
                                             **_position(p, CONTEXT, inputs)})
            state = {n: out[f"{n}_next"] for n in state}
        got = np.asarray(out["output"]).reshape(-1)
        assert np.abs(got - logits).max() < 1e-4 * max(1.0, np.abs(logits).max())


def test_half_and_4_bit_files_run_in_their_own_type(exports, prompt, tmp_path):
    # f16: GGMLBackend(dtype=float16) reads the file's halves; q4_0: GGMLBackend(quantize="q4_0")
    # its blocks, as llama.cpp does. A k-quant whose rows (64) are not whole 256-blocks stays f32.
    expected, _ = onnxruntime_greedy(exports["qwen2"] / "model.onnx", prompt, NEW)
    for kind in ("f16", "q4_0", "q4_K"):
        path = tmp_path / f"{kind}.gguf"
        ml.save_gguf(str(exports["qwen2"] / "model.onnx"), path, arch="qwen2", quantize=kind)
        types = {t.name: t.tensor_type.name.lower() for t in _reader(path).tensors}
        assert types["blk.0.attn_q.weight"] == ("f32" if kind == "q4_K" else kind)
        dec = ml.gguf_decoder(path, context=CONTEXT)
        assert (dec.quantize, dec.weight_type) == {"f16": (None, "f16"), "q4_0": ("q4_0", "f32"),
                                                   "q4_K": (None, "f32")}[kind]
        tokens = [int(t) for t in ml.generate(compiled(dec), dec.params, prompt, NEW)]
        if kind != "q4_0":
            assert tokens == expected, kind
        else:
            assert len(tokens) == NEW


def test_save_gguf_takes_a_loaded_or_compiled_model_and_the_cli_writes_the_same(exports, files, tmp_path):
    from mithril import cli

    src = exports["llama"] / "model.onnx"
    loaded = ml.load_onnx(str(src))
    ml.save_gguf(loaded, tmp_path / "loaded.gguf", arch="llama", quantize="q8_0")
    compiled = ml.compile(loaded, ml.NumpyBackend(), inference=True)
    ml.save_gguf(compiled, tmp_path / "compiled.gguf", arch="auto", quantize="q8_0")
    assert cli.main(["export-gguf", str(src), str(tmp_path / "cli.gguf"), "--quantize", "q8_0"]) == 0
    ref = (files["llama", "q8_0"]).read_bytes()
    for name in ("loaded", "compiled", "cli"):
        assert (tmp_path / f"{name}.gguf").read_bytes() == ref, name


def test_tokenizer_and_config_can_be_given(exports, tokenizer, tmp_path):
    # A bare ONNX file (no config.json, no tokenizer.json beside it): the hyperparameters from the
    # graph, the tokenizer and context length given.
    import onnx

    model = onnx.load(exports["qwen2"] / "model.onnx")
    ml.save_gguf(model, tmp_path / "bare.gguf", arch="qwen2", tokenizer=tokenizer,
                 config={"max_position_embeddings": 128})
    r = _reader(tmp_path / "bare.gguf")
    assert _field(r, "qwen2.attention.head_count_kv") == 2 and _field(r, "qwen2.context_length") == 128
    assert _field(r, "qwen2.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    from mithril.backends.ggml.llama_gguf import save_llama_gguf

    hp = save_llama_gguf(model, tmp_path / "inferred.gguf", arch="qwen2", tokenizer=tokenizer, context_length=64)
    assert hp["rope_theta"] == pytest.approx(10000.0) and hp["n_head"] == 4 and hp["eps"] == pytest.approx(1e-6)


def test_errors_name_what_is_missing(exports, tmp_path):
    import onnx

    model = onnx.load(exports["gpt2"] / "model.onnx")
    with pytest.raises(ml.MithrilError, match="tokenizer"):
        ml.save_gguf(model, tmp_path / "x.gguf", arch="gpt2")
    with pytest.raises(ml.MithrilError, match="arch must be one of"):
        ml.save_gguf(str(exports["gpt2"] / "model.onnx"), tmp_path / "x.gguf", arch="falcon")
    from mithril import cli

    assert cli.main(["export-gguf", str(tmp_path / "none.onnx"), str(tmp_path / "x.gguf")]) == 2


# -- llama.cpp --------------------------------------------------------------------------------


def llama_cpp_greedy(path, prompt, new, threads=1) -> list[int]:
    """Greedy decoding by llama.cpp (float32 key/value cache, as Mithril's)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=CONTEXT, n_batch=CONTEXT, n_threads=threads, seed=0,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
                          logits_all=True, verbose=False)  # scores are kept only with logits_all
    tokens = []
    llm.eval(list(prompt))
    for _ in range(new):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([tokens[-1]])
    return tokens


@pytest.mark.long(reason="llama.cpp (llama-cpp-python, a source build) loads the 8 files (~20 s); the fast tier "
                         "checks the metadata and tensors llama.cpp reads and runs the files on Mithril")
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_runs_the_file_and_generates_the_same_tokens(arch, kind, files, exports, prompt):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (MITHRIL_LONG_TESTS=1 bash "
                                            "scripts/dev.sh test builds it)")
    expected, _ = onnxruntime_greedy(exports[arch] / "model.onnx", prompt, NEW)
    ours = mithril_greedy(files[arch, kind], prompt, NEW)
    theirs = llama_cpp_greedy(files[arch, kind], prompt, NEW)
    assert theirs == ours == expected


@pytest.mark.long(reason="llama.cpp's tokenizer on the file (llama-cpp-python, a source build)")
def test_llama_cpp_tokenizes_as_the_trained_tokenizer(files, tokenizer):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(files["gpt2", "f32"]), n_ctx=CONTEXT, verbose=False, vocab_only=True)
    for text in (TEXT, "the lazy fox's words, 42 of them!", "  model\ttext\n"):
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode(text).ids
        assert llm.detokenize(tokenizer.encode(text).ids).decode() == text
