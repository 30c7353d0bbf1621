"""002 multi-backend deployment, "NLP Models with Different Backends" and the "transformer" branch
of "Benchmarking Across Backends": ``examples.t5`` (encoder, decoder) and ``examples.gpt``
checked against transformers' T5Model / T5ForConditionalGeneration / GPT2LMHeadModel built from
the same config with the same weights, on every Python backend and through onnxruntime.

Tolerances: everything runs in float32 (eps 1.2e-7). T5's hidden states are RMS-normalized
(order one) and measure at most ~1.6e-6 from transformers on any backend; GPT-2's logits reach
~22 here and measure at most ~1.3e-5. Two layers of matmuls over a few dozen terms, softmax and
normalization differ between frameworks by a few ulps per op, which is all these are; the bounds
below leave a ~8x margin and stay far below any real error (a dropped bias, a wrong bucket or a
missing scale moves outputs by 1e-2 or more).
"""

from __future__ import annotations

import functools
import time
import warnings

import numpy as np
import pytest

import mithril as ml
from mithril.compile import JitFallbackWarning
from mithril.errors import DTypeError, ModelError

torch = pytest.importorskip("torch", reason="the references are transformers' torch models")
transformers = pytest.importorskip("transformers", reason="the references are transformers' T5 and GPT-2")
ort = pytest.importorskip("onnxruntime")

from examples.gpt.model import create_gpt, gpt2_params  # noqa: E402
from examples.t5 import RelativePositionBuckets, t5_decode, t5_encode, t5_params  # noqa: E402

# backend name -> (class name on ml, module it needs)
BACKENDS = {"numpy": ("NumpyBackend", "numpy"), "jax": ("JaxBackend", "jax"), "torch": ("TorchBackend", "torch"),
            "mlx": ("MlxBackend", "mlx.core")}
T5_TOL = dict(rtol=1e-5, atol=2e-5)
GPT_TOL = dict(rtol=1e-4, atol=1e-4)


def _backend(name: str):
    cls, module = BACKENDS[name]
    pytest.importorskip(module, reason=f"the {name} backend needs {module}")
    return getattr(ml, cls)()


def _to(backend, arrays: dict) -> dict:
    return {k: backend.array(v) for k, v in arrays.items()}


# -- T5 -----------------------------------------------------------------------------------------
def _t5_config(**overrides):
    """A tiny T5: 3 heads of d_kv=8 (inner dim 24 != d_model 16, as in real T5 sizes where they can
    differ), and 8 buckets up to distance 20 so 23 encoder and 17 decoder tokens reach the exact,
    logarithmic and clamped buckets on both sides."""
    fields = dict(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=3,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20,
                  bos_token_id=None, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return transformers.T5Config(**{**fields, **overrides})


@functools.lru_cache(maxsize=None)
def _t5_reference(feed_forward_proj: str = "relu"):
    """(config, encoder params, decoder params, token ids, decoder ids, HF encoder output, HF decoder
    last hidden state, HF logits) for a T5 with transformers' own random initialization."""
    config = _t5_config(feed_forward_proj=feed_forward_proj)
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(config).eval()
    rng = np.random.default_rng(0)
    ids, dec = rng.integers(0, 64, (2, 23)), rng.integers(0, 64, (2, 17))
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(dec), output_hidden_states=True)
    state = hf.state_dict()
    return (config, t5_params(state, "encoder"), t5_params(state, "decoder"), ids, dec,
            out.encoder_last_hidden_state.numpy(), out.decoder_hidden_states[-1].numpy(), out.logits.numpy())


def test_t5_model_last_hidden_state_is_the_decoder_stack_output():
    """T5Model's last_hidden_state is the decoder stack's output (what t5_decode gives); the LM
    model's decoder_hidden_states[-1] used as the reference here is the same tensor."""
    config, *_ = _t5_reference()
    torch.manual_seed(0)
    lm = transformers.T5ForConditionalGeneration(config).eval()
    base = transformers.T5Model(config).eval()
    base.load_state_dict({k: v for k, v in lm.state_dict().items() if k != "lm_head.weight"})
    _, _, _, ids, dec, enc_want, dec_want, _ = _t5_reference()
    with torch.no_grad():
        out = base(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(dec))
    np.testing.assert_array_equal(out.last_hidden_state.numpy(), dec_want)
    np.testing.assert_array_equal(out.encoder_last_hidden_state.numpy(), enc_want)


def test_relative_position_buckets_match_transformers():
    """The bucket of every relative position for query/key lengths up to 300 with T5's default
    32 buckets and distance 128: bidirectional (encoder) and unidirectional (decoder), exactly as
    transformers computes them (the float32 log is truncated at the same points)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    length = 300
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    for bidirectional in (True, False):
        want = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32,
                                                     max_distance=128).numpy()
        model = ml.models.Model()
        model |= RelativePositionBuckets(bidirectional=bidirectional, num_buckets=32, max_distance=128)(
            query="query", key="key", output="output")
        for name in BACKENDS:
            backend = _backend(name)
            pm = ml.compile(model, backend, shapes={"query": [length, 1], "key": [length, 1]}, inference=True)
            x = backend.array(np.zeros((length, 1), np.float32))
            got = backend.to_numpy(pm.evaluate({}, {"query": x, "key": x})["output"])
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, bidirectional={bidirectional}")


@pytest.mark.parametrize("name", list(BACKENDS))
def test_t5_matches_transformers_on_each_backend(name):
    """002, "NLP Models with Different Backends": ``t5_encode(config)`` and ``t5_decode(config)``
    compiled with the document's data_keys on one backend; the encoder gives T5's encoder output
    and the decoder, fed that output as ``memory``, T5Model's last hidden state."""
    config, enc_params, dec_params, ids, dec, enc_want, dec_want, _ = _t5_reference()
    backend = _backend(name)
    encoder = ml.compile(t5_encode(config), backend, data_keys={"input"})
    decoder = ml.compile(t5_decode(config), backend, data_keys={"input", "memory"})
    assert sorted(encoder.parameter_keys) == sorted(enc_params)
    assert sorted(decoder.parameter_keys) == sorted(dec_params)
    memory = encoder.evaluate(_to(backend, enc_params), {"input": backend.array(ids)})["output"]
    np.testing.assert_allclose(backend.to_numpy(memory), enc_want, **T5_TOL)
    hidden = decoder.evaluate(_to(backend, dec_params), {"input": backend.array(dec), "memory": memory})["output"]
    assert tuple(hidden.shape) == (2, 17, 16)
    np.testing.assert_allclose(backend.to_numpy(hidden), dec_want, **T5_TOL)


def test_t5_document_calls_jax_encoder_torch_decoder():
    """002, "NLP Models with Different Backends", as written: the encoder on ml.JaxBackend(), the
    decoder on ml.TorchBackend(). The JAX encoder output goes to the Torch decoder through NumPy
    (``torch_backend.array(jax_backend.to_numpy(...))``), and the pair gives T5Model's output."""
    pytest.importorskip("jax", reason="the document runs the encoder on JAX")
    config, enc_params, dec_params, ids, dec, enc_want, dec_want, _ = _t5_reference()

    encoder_lm = t5_encode(config)
    decoder_lm = t5_decode(config)
    encoder = ml.compile(encoder_lm, ml.JaxBackend(), data_keys={"input"})
    decoder = ml.compile(decoder_lm, ml.TorchBackend(), data_keys={"input", "memory"})

    jax_backend, torch_backend = encoder.backend, decoder.backend
    memory = encoder.evaluate(_to(jax_backend, enc_params), {"input": jax_backend.array(ids)})["output"]
    memory = torch_backend.array(jax_backend.to_numpy(memory))
    hidden = decoder.evaluate(_to(torch_backend, dec_params), {"input": torch_backend.array(dec), "memory": memory})
    assert isinstance(hidden["output"], torch.Tensor)
    np.testing.assert_allclose(hidden["output"].numpy(), dec_want, **T5_TOL)


def test_t5_gated_gelu_and_lm_head_match_transformers():
    """T5 v1.1's ``feed_forward_proj="gated-gelu"`` (wi_0, wi_1, tanh GELU) on NumPy, and
    ``t5_decode(config, lm_head=True)``: T5ForConditionalGeneration's logits (the hidden state
    scaled by d_model ** -0.5, times the tied shared embedding)."""
    config, enc_params, dec_params, ids, dec, enc_want, dec_want, logits_want = _t5_reference("gated-gelu")
    assert any("DenseReluDense.wi_1" in k for k in enc_params)
    backend = ml.NumpyBackend()
    encoder = ml.compile(t5_encode(config), backend, data_keys={"input"})
    memory = encoder.evaluate(enc_params, {"input": ids})["output"]
    np.testing.assert_allclose(memory, enc_want, **T5_TOL)
    decoder = ml.compile(t5_decode(config), backend, data_keys={"input", "memory"})
    np.testing.assert_allclose(decoder.evaluate(dec_params, {"input": dec, "memory": memory})["output"], dec_want,
                               **T5_TOL)
    lm = ml.compile(t5_decode(config, lm_head=True), backend, data_keys={"input", "memory"})
    assert sorted(lm.parameter_keys) == sorted(dec_params)  # the head reuses shared.weight
    logits = lm.evaluate(dec_params, {"input": dec, "memory": memory})["output"]
    assert logits.shape == (2, 17, 64)
    np.testing.assert_allclose(logits, logits_want, **T5_TOL)


def test_t5_exports_to_onnx_and_matches_onnxruntime():
    """ml.export_onnx of the encoder and the decoder with T5's weights: onnxruntime gives what
    Mithril gives (and transformers), at two batch/sequence sizes since N, S and T stay symbolic."""
    config, enc_params, dec_params, ids, dec, enc_want, dec_want, _ = _t5_reference()
    encoder_lm, decoder_lm = t5_encode(config), t5_decode(config)
    enc_proto = ml.export_onnx(encoder_lm, params=enc_params)
    dec_proto = ml.export_onnx(decoder_lm, params=dec_params)
    assert [d.dim_param for d in enc_proto.graph.input[0].type.tensor_type.shape.dim] == ["N", "S"]
    enc_ort = ort.InferenceSession(enc_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    dec_ort = ort.InferenceSession(dec_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    encoder = ml.compile(encoder_lm, ml.NumpyBackend(), data_keys={"input"})
    decoder = ml.compile(decoder_lm, ml.NumpyBackend(), data_keys={"input", "memory"})
    rng = np.random.default_rng(5)
    for src, tgt in [(ids, dec), (rng.integers(0, 64, (1, 40)), rng.integers(0, 64, (1, 3)))]:
        memory = encoder.evaluate(enc_params, {"input": src})["output"]
        (ort_memory,) = enc_ort.run(None, {"input": src})
        np.testing.assert_allclose(ort_memory, memory, **T5_TOL)
        hidden = decoder.evaluate(dec_params, {"input": tgt, "memory": memory})["output"]
        (ort_hidden,) = dec_ort.run(None, {"input": tgt, "memory": memory})
        np.testing.assert_allclose(ort_hidden, hidden, **T5_TOL)
    np.testing.assert_allclose(ort.InferenceSession(enc_proto.SerializeToString()).run(None, {"input": ids})[0],
                               enc_want, **T5_TOL)


def test_t5_takes_a_dict_config_and_refuses_unknown_keys():
    """A plain dict of T5Config's fields (``config.to_dict()`` included) builds the same model; a
    misspelt key or an unknown activation is a ModelError listing what is valid."""
    config, enc_params, _, ids, _, enc_want, _, _ = _t5_reference()
    for as_dict in (config.to_dict(), {k: getattr(config, k) for k in (
            "vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
            "relative_attention_max_distance")}):
        encoder = ml.compile(t5_encode(as_dict), ml.NumpyBackend(), data_keys={"input"})
        np.testing.assert_allclose(encoder.evaluate(enc_params, {"input": ids})["output"], enc_want, **T5_TOL)
    with pytest.raises(ModelError, match=r"unknown key\(s\) \['d_modle'\]; the keys that shape the model are .*'d_model'"):
        t5_encode({"d_modle": 16})
    with pytest.raises(ModelError, match=r"activation 'tanh' is not supported; choose one of .*'gelu_new'.*'relu'"):
        t5_decode({"feed_forward_proj": "gated-tanh"})
    with pytest.raises(ModelError, match="'ACT' or 'gated-ACT'"):
        t5_encode({"feed_forward_proj": "gelu-gated-relu"})


def test_t5_single_layer_stack():
    """With one layer, the position bias is computed and used in that layer alone; encoder and
    decoder still match transformers."""
    config = _t5_config(num_layers=1)
    torch.manual_seed(3)
    hf = transformers.T5Model(config).eval()
    ids, dec = np.arange(12).reshape(2, 6) % 64, np.arange(8).reshape(2, 4) % 64
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(dec))
    state = hf.state_dict()
    encoder = ml.compile(t5_encode(config), ml.NumpyBackend(), data_keys={"input"})
    assert encoder.output_keys == ["output"]
    memory = encoder.evaluate(t5_params(state, "encoder"), {"input": ids})["output"]
    np.testing.assert_allclose(memory, out.encoder_last_hidden_state.numpy(), **T5_TOL)
    decoder = ml.compile(t5_decode(config), ml.NumpyBackend(), data_keys={"input", "memory"})
    hidden = decoder.evaluate(t5_params(state, "decoder"), {"input": dec, "memory": memory})["output"]
    np.testing.assert_allclose(hidden, out.last_hidden_state.numpy(), **T5_TOL)


# -- GPT ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _gpt_reference():
    """create_gpt's keyword arguments (the document's, with tiny sizes), GPT-2 weights, token ids
    and the logits of transformers' GPT2LMHeadModel. The weights are drawn wider than GPT-2's
    N(0, 0.02) (embeddings N(0, 1), LayerNorm scales 1 + N(0, 0.2), the rest N(0, 0.2)) so the
    logits are of order one rather than all near zero."""
    kwargs = dict(bias=True, block_size=16, dims=32, num_heads=4, num_layers=2, vocab_size=61)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_positions=16, n_embd=32, n_head=4, n_layer=2, vocab_size=61, bos_token_id=0, eos_token_id=0)).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if key.endswith(("wte.weight", "wpe.weight")):
                p.copy_(noise)
            elif ".ln_" in key and key.endswith(".weight"):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
    ids = np.random.default_rng(0).integers(0, 61, (2, 11))
    with torch.no_grad():
        logits = hf(torch.from_numpy(ids)).logits.numpy()
    return kwargs, gpt2_params(hf.state_dict()), ids, logits


def test_gpt_matches_transformers_gpt2_on_every_backend():
    """create_gpt with the document's arguments (bias=True, block_size, dims, num_heads, num_layers,
    vocab_size; tiny sizes) compiled as the document compiles it (data_keys={"input"}, no shapes:
    N and T stay dynamic) gives GPT2LMHeadModel's logits on every backend, and equal logits
    across backends."""
    kwargs, params, ids, want = _gpt_reference()
    assert np.abs(want).max() > 1  # the comparison is not between near-zero logits
    gpt = create_gpt(**kwargs)
    results = {}
    for name in BACKENDS:
        backend = _backend(name)
        pm = ml.compile(gpt, backend, data_keys={"input"})
        assert sorted(pm.parameter_keys) == sorted(params)
        for shape in [(2, 11), (1, 16)]:
            x = ids if shape == (2, 11) else np.arange(16).reshape(1, 16)
            out = backend.to_numpy(pm.evaluate(_to(backend, params), {"input": backend.array(x)})["output"])
            assert out.shape == (*shape, 61)
            if shape == (2, 11):
                results[name] = out
    for name, out in results.items():
        np.testing.assert_allclose(out, want, err_msg=name, **GPT_TOL)
        np.testing.assert_allclose(out, results["numpy"], err_msg=name, **GPT_TOL)


def test_gpt_document_call_on_mlx_full_size():
    """002, "NLP Models with Different Backends", as written: the full GPT-2 (12 layers, 768
    dims, 50304 tokens) compiled on ml.MlxBackend() with data_keys={"input"} and no shapes. The
    program keeps N and T symbolic and runs once on 8 tokens with the model's own parameters
    (about 8 s here)."""
    pytest.importorskip("mlx.core", reason="the document runs GPT on MLX")
    gpt = create_gpt(bias=True, block_size=100, dims=768, num_heads=12,
                     num_layers=12, vocab_size=50304)
    mlx_gpt = ml.compile(gpt, ml.MlxBackend(), data_keys={"input"})
    (inp,), (out,) = mlx_gpt.ir.graph.inputs, mlx_gpt.ir.graph.outputs
    assert [str(d) for d in inp.shape] == ["N", "T"] and str(inp.dtype).endswith("INT64")
    assert [str(d) for d in out.shape] == ["N", "T", "50304"]
    assert len(mlx_gpt.parameter_keys) == 2 + 12 * 16 + 3  # wte, wpe; 16 per layer; ln_f, lm_head
    ids = mlx_gpt.backend.array(np.arange(8, dtype=np.int64)[None])
    logits = mlx_gpt.backend.to_numpy(mlx_gpt.evaluate({}, {"input": ids})["output"])
    assert logits.shape == (1, 8, 50304) and np.isfinite(logits).all()


def test_benchmark_transformer_branch_with_token_ids():
    """002, "Benchmarking Across Backends", the "transformer" branch (create_gpt compiled with
    shapes={"input": input_shape}, data_keys={"input"}, jit=True on Torch, JAX and NumPy; tiny
    sizes). The guide's ``np.random.randn(...).astype(np.float32)`` is no input for a token model:
    each backend refuses it with a DTypeError naming the int64 it expects (see also
    test_multi_backend.py). The corrected input, int64 token ids below vocab_size, runs and gives
    equal logits everywhere."""
    input_shape = [1, 16]
    model = create_gpt(bias=True, block_size=128, dims=32, num_heads=4, num_layers=2, vocab_size=101)
    numpy_input = np.random.randn(*input_shape).astype(np.float32)
    token_ids = np.random.default_rng(0).integers(0, 101, input_shape)  # int64
    backends = {"torch": ml.TorchBackend, "jax": ml.JaxBackend, "numpy": ml.NumpyBackend}
    params, results = None, {}
    for backend_name, backend_class in backends.items():
        backend = backend_class()
        compiled_model = ml.compile(model, backend=backend, shapes={"input": input_shape}, data_keys={"input"},
                                    jit=True)
        with pytest.raises(DTypeError, match=r"input 'input' expects int64 but got float32; cast it explicitly"):
            compiled_model.evaluate({}, {"input": backend.array(numpy_input)})
        if params is None:
            params = {k: backend.to_numpy(v) for k, v in compiled_model.get_parameters().items()}
        start = time.perf_counter()
        out = compiled_model.evaluate(_to(backend, params), {"input": backend.array(token_ids)})["output"]
        assert time.perf_counter() - start < 60
        results[backend_name] = backend.to_numpy(out)
        assert results[backend_name].shape == (1, 16, 101)
    for name, out in results.items():
        np.testing.assert_allclose(out, results["numpy"], err_msg=name, **GPT_TOL)


def test_benchmark_gpt_jits_on_torch():
    """002, "Benchmarking Across Backends": jit=True on ml.TorchBackend should compile the GPT's
    forward with torch.compile rather than fall back to eager."""
    model = create_gpt(bias=True, block_size=128, dims=16, num_heads=2, num_layers=1, vocab_size=11)
    backend = ml.TorchBackend()
    compiled_model = ml.compile(model, backend=backend, shapes={"input": [1, 4]}, data_keys={"input"}, jit=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled_model.evaluate({}, {"input": backend.array(np.arange(4)[None])})["output"]
    assert tuple(out.shape) == (1, 4, 11)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, JitFallbackWarning)]
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("example", ["t5", "gpt"])
def test_example_readme_snippet_runs(example, capsys):
    """examples/t5/README.md and examples/gpt/README.md show code users paste: it runs as written
    and prints what the README says (T5: the difference from T5Model, GPT: the logits' shape)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "examples" / example / "README.md").read_text()
    block = readme.split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, f"examples/{example}/README.md", "exec"), {})
    printed = capsys.readouterr().out.strip()
    if example == "t5":
        assert float(printed) < 2e-5
    else:
        assert printed == "(1, 3, 500)"
