"""Greedy generation with a key/value cache (issue 19, Must 6): the zoo's decode-step GPT
(``create_gpt_decoder``) equals ``create_gpt`` step by step, and ``ml.generate`` gives the same
ids as re-running the full model on the growing sequence, on NumPy, GGML and C. The issue's bar
(q8_0 matches float32 onnxruntime's argmax on at least 30 of 32 tokens) is checked on trained
weights, as a user's model has: transformers' GPT2LMHeadModel of CFG's sizes trained for a few
seconds on a learnable synthetic corpus (``tests/models/trained_gpt.py``), for several training seeds,
through the zoo's decoder with its weights and through a GPT-2 decode step exported to ONNX by
torch and compiled from the file; both decode as ``GPT2LMHeadModel.generate`` in float32."""

import doctest
import importlib
import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.errors import MithrilError

from . import trained_gpt

CFG = dict(bias=True, block_size=64, dims=64, num_heads=4, num_layers=2, vocab_size=128)  # dims 64: whole q8_0 blocks
PROMPT = np.array([5, 17, 3, 60])
NEW = 32


def _step(backend, batch=1, **options):
    return ml.compile(models_zoo.create_gpt_decoder(**CFG), backend, shapes={"input": (batch, 1)}, inference=True,
                      **options)


def _params(seed=0):
    """GPT-2's initialisation (N(0, 0.02) weights and embeddings, LayerNorm scales near 1), so the
    attention and the context decide the next token, not the current token alone. Good for
    comparisons that must be exact (float32 backends against each other); random weights leave
    gaps of a few hundredths between the two largest logits, so quantized backends are compared
    on trained weights (``_trained``)."""
    rng = np.random.default_rng(seed)
    shapes = {k: np.shape(v) for k, v in _step(ml.NumpyBackend()).randomize_params().items()}
    return {k: ((1.0 if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0)
                + (0.1 if len(s) == 1 and k.endswith(".weight") else 0.02) * rng.standard_normal(s)).astype(np.float32)
            for k, s in shapes.items()}


def _full():
    return ml.compile(models_zoo.create_gpt(**CFG), ml.NumpyBackend(), inference=True)


def _rerun_argmax(params, prompt, count):
    """The reference: the full model (no cache) re-run on the growing sequence, argmax of the last position."""
    full, seq = _full(), [int(t) for t in prompt]
    for _ in range(count):
        seq.append(int(full.evaluate(params, {"input": np.array([seq])})["output"][0, -1].argmax()))
    return np.array(seq[len(prompt):])


def test_decoder_has_create_gpt_parameters():
    step = _step(ml.NumpyBackend())
    full = ml.compile(models_zoo.create_gpt(**CFG), ml.NumpyBackend(), shapes={"input": (1, 8)}, inference=True)
    assert {k: np.shape(v) for k, v in step.randomize_params().items()} == \
        {k: np.shape(v) for k, v in full.randomize_params().items()}
    caches = [f"{kv}_cache_{i}" for i in range(CFG["num_layers"]) for kv in "kv"]
    assert sorted(step.input_keys) == sorted(["input", "position", "mask", "write", *caches])
    assert sorted(step.output_keys) == sorted(["output", *(f"{c}_next" for c in caches)])


def test_decoder_step_logits_equal_create_gpt_at_each_position():
    params, step, size = _params(), _step(ml.NumpyBackend()), CFG["block_size"]
    tokens = np.random.default_rng(1).integers(0, CFG["vocab_size"], 12)
    want = _full().evaluate(params, {"input": tokens[None]})["output"][0]  # causal: row p sees tokens 0..p
    head = CFG["dims"] // CFG["num_heads"]
    layouts = {"k": (1, CFG["num_heads"], size, head), "v": (1, CFG["num_heads"], head, size)}  # values transposed
    caches = {f"{kv}_cache_{i}": np.zeros(layouts[kv], np.float32) for i in range(CFG["num_layers"]) for kv in "kv"}
    for p, token in enumerate(tokens):
        out = step.evaluate(params, {
            "input": np.array([[token]]), "position": np.array([p]), **caches,
            "mask": np.where(np.arange(size) <= p, 0, -1e9).astype(np.float32)[None],
            "write": np.repeat((np.arange(size) == p).astype(np.float32)[:, None], head, axis=1)})
        np.testing.assert_allclose(out["output"][0, 0], want[p], rtol=1e-4, atol=1e-5)
        caches = {k: out[f"{k}_next"] for k in caches}
        assert not caches["k_cache_0"][:, :, p + 1:].any() and not caches["v_cache_0"][..., p + 1:].any()


def test_generate_on_numpy_equals_rerunning_the_full_model():
    params = _params()
    ids = ml.generate(_step(ml.NumpyBackend()), params, PROMPT, NEW)
    assert ids.dtype == np.int64 and ids.shape == (NEW,)
    np.testing.assert_array_equal(ids, _rerun_argmax(params, PROMPT, NEW))
    assert len(set(ids.tolist())) > 3  # not one token repeated: the context matters


def test_generate_batched_rows_are_independent():
    params = _params()
    prompts = np.array([PROMPT, PROMPT[::-1]])
    ids, speed = ml.generate(_step(ml.NumpyBackend(), batch=2), params, prompts, 6, return_speed=True)
    assert ids.shape == (2, 6) and speed > 0
    single = _step(ml.NumpyBackend())
    for row, prompt in zip(ids, prompts):
        np.testing.assert_array_equal(row, ml.generate(single, params, prompt, 6))


def test_generate_refuses_what_does_not_fit_the_cache():
    step = _step(ml.NumpyBackend())
    with pytest.raises(MithrilError, match="need 66 positions; the step model's cache holds 64"):
        ml.generate(step, _params(), np.zeros(20, np.int64), 47)
    with pytest.raises(MithrilError, match="max_new_tokens must be a whole number >= 0, got -1"):
        ml.generate(step, _params(), PROMPT, -1)
    assert ml.generate(step, _params(), PROMPT, 0).shape == (0,)
    with pytest.raises(MithrilError, match=r"do not fit the step model's input \[1, 1\]"):
        ml.generate(step, _params(), np.zeros((2, 3), np.int64), 4)


def test_generate_on_ggml_float32_equals_numpy():
    """Random weights, exact equality; q8_0 and q4_0 are checked on trained weights below."""
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    params = _params()
    want = ml.generate(_step(ml.NumpyBackend()), params, PROMPT, NEW)
    # one thread: this test's machine is shared, and ggml's spinning threads crawl when cores are busy
    f32 = ml.generate(_step(ml.GGMLBackend(num_threads=1), static_shapes=True), params, PROMPT, NEW)
    np.testing.assert_array_equal(f32, want)


def test_generate_on_c_equals_numpy():
    params = _params()
    want = ml.generate(_step(ml.NumpyBackend()), params, PROMPT, 8)
    np.testing.assert_array_equal(ml.generate(_step(ml.CBackend()), params, PROMPT, 8), want)


@pytest.mark.parametrize("framework, backend", [("torch", "TorchBackend"), ("jax", "JaxBackend"),
                                                ("mlx", "MlxBackend")])
def test_generate_on_framework_backends_equals_numpy(framework, backend):
    """Caches stay the backend's own arrays between steps; inputs go in through from_numpy."""
    pytest.importorskip(framework, reason=f"{backend} needs {framework}")
    params = _params()
    want = ml.generate(_step(ml.NumpyBackend()), params, PROMPT, 8)
    np.testing.assert_array_equal(ml.generate(_step(getattr(ml, backend)()), params, PROMPT, 8), want)


def test_generate_docstring_example_runs():
    module = importlib.import_module("mithril.generation")
    tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
    assert tests
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


SEEDS = (0, 1, 2)  # training seeds: each gives its own corpus, initialisation and prompt; each must pass


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed{seed}")
def trained(request):
    """transformers' GPT2LMHeadModel of CFG's sizes trained with this seed (``trained_gpt``: a
    rule token picks one of two successor tables, 5 % noise; 100 AdamW steps of 16 sequences),
    a noise-free prompt of its corpus, and ``GPT2LMHeadModel.generate``'s greedy ids (float32
    PyTorch, its own key/value cache): the reference of the tests below."""
    torch = pytest.importorskip("torch", reason="the reference is transformers' GPT-2 in PyTorch")
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' GPT2LMHeadModel")
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    seed = request.param
    hf, table, report = trained_gpt.train_gpt2(
        torch, transformers, vocab_size=CFG["vocab_size"], block_size=CFG["block_size"], dims=CFG["dims"],
        num_heads=CFG["num_heads"], num_layers=CFG["num_layers"], seed=seed, steps=100)
    prompt = trained_gpt.prompt(table, rule=seed % trained_gpt.RULES,
                                start=int(np.random.default_rng(seed).integers(trained_gpt.RULES, CFG["vocab_size"])))
    with torch.no_grad():
        want = hf.generate(torch.from_numpy(prompt[None]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=NEW, do_sample=False, pad_token_id=0)[0, len(prompt):].numpy()
    return dict(seed=seed, torch=torch, hf=hf, table=table, report=report, prompt=prompt, want=want)


def test_training_makes_next_token_predictions_confident(trained):
    """The trained model's greedy continuation follows its corpus's rule, and the median gap
    between the two largest logits (held-out sequences) grew from a few hundredths to several
    logits. Measured (median gap before -> after; the smallest along the greedy continuation):
    seed 0 0.041 -> 3.15 (2.45), seed 1 0.042 -> 2.73 (0.60), seed 2 0.040 -> 2.94 (1.73). After
    30 steps instead of 100 (median gap about 0.5) q8_0 still matched 32 of 32 on seeds 0 to 3 but
    q4_0 only 32, 11, 4 and 24."""
    torch, report, prompt, want = trained["torch"], trained["report"], trained["prompt"], trained["want"]
    with torch.no_grad():  # the gaps along the greedy continuation itself: how close its closest call is
        logits = trained["hf"](torch.from_numpy(np.concatenate([prompt, want[:-1]])[None])).logits[0, len(prompt) - 1:]
    top = logits.topk(2, dim=-1).values
    print(f"seed {trained['seed']}: median top-1 minus top-2 logit gap {report['gap_before']:.3f} -> "
          f"{report['gap_after']:.2f} (loss {report['loss']:.3f}); along the 32 generated tokens: smallest "
          f"{float((top[:, 0] - top[:, 1]).min()):.2f}")
    assert report["gap_before"] < 0.1 and report["gap_after"] > 1.5
    np.testing.assert_array_equal(trained["want"], trained_gpt.follow(trained["table"], trained["prompt"], NEW))
    assert len(set(trained["want"].tolist())) == NEW  # the rule's tables are cycles through every token


def _count(ids, want):
    return int((np.asarray(ids) == want).sum())


def test_generate_equals_transformers_gpt2_greedy_decoding(trained):
    """The zoo's decoder with the trained GPT-2's weights (Conv1D weights transposed to Linear's
    layout) generates what ``GPT2LMHeadModel.generate`` does on GGML float32, and at q8_0 on at
    least 30 of 32 tokens (issue 19's bar; q4_0 and the argmax without compounding are in the
    tests of the exported step and of the zoo GPT trained by fit). Measured per seed 0, 1, 2:
    q8_0 32, 32, 32 of 32."""
    from models_zoo import weights

    hf, prompt, want = trained["hf"], trained["prompt"], trained["want"]
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # [in, out]; Linear's weight is [out, in]
    params = weights.gpt_params({k: v.T if k.endswith(conv1d) else v for k, v in hf.state_dict().items()})
    # one thread: this test's machine is shared, and ggml's spinning threads crawl when cores are busy
    f32 = ml.generate(_step(ml.GGMLBackend(num_threads=1), static_shapes=True), params, prompt, NEW)
    np.testing.assert_array_equal(f32, want)
    q8 = ml.generate(_step(ml.GGMLBackend(quantize="q8_0", num_threads=1), static_shapes=True), params, prompt, NEW)
    print(f"zoo decoder with GPT2LMHeadModel's weights, seed {trained['seed']}: q8_0 {_count(q8, want)}/{NEW}")
    assert _count(q8, want) >= 30


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed{seed}")
def zoo_trained(request, tmp_path_factory):
    """The zoo's ``create_gpt`` of CFG's sizes trained by Mithril's ``fit`` (TorchBackend, 100
    Adam steps of 16 sequences of ``trained_gpt``'s corpus) from ``_params(seed)``, a prompt of
    its corpus, and the reference: onnxruntime's greedy decoding (float32) of its decode step
    exported by ``ml.export_onnx``."""
    pytest.importorskip("torch", reason="the zoo GPT trains on TorchBackend")
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    seed = request.param
    params, table, report = trained_gpt.train_zoo_gpt(ml, models_zoo, CFG, _params(seed), seed=seed, steps=100)
    prompt = trained_gpt.prompt(table, rule=seed % trained_gpt.RULES,
                                start=int(np.random.default_rng(seed).integers(trained_gpt.RULES, CFG["vocab_size"])))
    path = tmp_path_factory.mktemp("zoo_gpt") / "step.onnx"
    ml.export_onnx(models_zoo.create_gpt_decoder(**CFG), path, shapes={"input": (1, 1)}, params=params)
    return dict(seed=seed, params=params, table=table, report=report, prompt=prompt,
                reference=_onnxruntime_greedy(str(path), prompt, NEW))


def test_zoo_gpt_trained_by_fit_generates_on_ggml(zoo_trained):
    """The zoo's GPT trained by Mithril: its greedy continuation follows the corpus's rule (the
    median gap between the two largest logits grew from a few hundredths to several logits),
    NumPy and GGML float32 decode as onnxruntime does, and GGML q8_0 matches onnxruntime's argmax
    on at least 30 of 32 tokens (issue 19's bar), also on float32's own sequence without the
    cache (no compounding). q4_0 is reported, not asserted. Measured per seed 0, 1, 2: median gap
    0.048 -> 3.28, 0.045 -> 2.93, 0.035 -> 3.29; q8_0 32, 32, 32 of 32 (32 each without
    compounding); q4_0 32, 32, 32."""
    params, prompt, reference, report = (zoo_trained[k] for k in ("params", "prompt", "reference", "report"))
    assert report["gap_before"] < 0.1 and report["gap_after"] > 1.5
    np.testing.assert_array_equal(reference, trained_gpt.follow(zoo_trained["table"], prompt, NEW))
    np.testing.assert_array_equal(ml.generate(_step(ml.NumpyBackend()), params, prompt, NEW), reference)
    f32 = ml.generate(_step(ml.GGMLBackend(num_threads=1), static_shapes=True), params, prompt, NEW)
    np.testing.assert_array_equal(f32, reference)
    q8 = ml.generate(_step(ml.GGMLBackend(quantize="q8_0", num_threads=1), static_shapes=True), params, prompt, NEW)
    q4 = ml.generate(_step(ml.GGMLBackend(quantize="q4_0", num_threads=1), static_shapes=True), params, prompt, NEW)
    seq = np.concatenate([prompt, reference[:-1]])[None]
    full = ml.compile(models_zoo.create_gpt(**CFG), ml.GGMLBackend(quantize="q8_0", num_threads=1),
                      shapes={"input": seq.shape}, inference=True, static_shapes=True)
    forced = full.evaluate(params, {"input": seq})["output"][0, len(prompt) - 1:].argmax(-1)
    print(f"zoo GPT trained by fit, seed {zoo_trained['seed']}: median gap {report['gap_before']:.3f} -> "
          f"{report['gap_after']:.2f} (loss {report['loss']:.3f}); q8_0 {_count(q8, reference)}/{NEW}, "
          f"q4_0 {_count(q4, reference)}/{NEW}, q8_0 on float32's sequence {_count(forced, reference)}/{NEW}")
    assert _count(q8, reference) >= 30
    assert _count(forced, reference) >= 31


def _gpt2_step_module(torch, hf):
    """GPT-2's decode step over fixed-size caches, written with GPT2LMHeadModel's own modules and
    create_gpt_decoder's inputs, outputs and cache layouts, for torch.onnx.export."""

    class GPT2Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, input, position, mask, write, *caches):
            t, c = self.hf.transformer, self.hf.config
            h, d, s = c.n_head, c.n_embd // c.n_head, c.n_positions
            x = t.wte(input) + t.wpe(position)
            keep = 1 - write
            new = []
            for i, block in enumerate(t.h):
                q, k, v = block.attn.c_attn(block.ln_1(x)).split(h * d, dim=-1)
                kc = caches[2 * i] * keep + k.reshape(1, h, 1, d) * write
                vc = caches[2 * i + 1] * keep.T + v.reshape(1, h, d, 1) * write.T
                p = torch.softmax((kc @ (q.reshape(1, h, d, 1) * d ** -0.5)).reshape(1, h, 1, s) + mask, dim=-1)
                x = x + block.attn.c_proj((vc @ p.reshape(1, h, s, 1)).reshape(1, 1, h * d))
                x = x + block.mlp(block.ln_2(x))
                new += [kc, vc]
            return (self.hf.lm_head(t.ln_f(x)), *new)

    return GPT2Step().eval()


def _onnxruntime_greedy(path, prompt, count):
    """Greedy decoding of an exported step model by onnxruntime (float32), written out by hand."""
    ort = pytest.importorskip("onnxruntime", reason="the issue's reference is onnxruntime")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    size, head = CFG["block_size"], CFG["dims"] // CFG["num_heads"]
    state = {i.name: np.zeros(i.shape, np.float32) for i in session.get_inputs() if "cache" in i.name}
    token, ids = prompt[0], []
    for p in range(len(prompt) + count - 1):
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, {
            "input": np.array([[token]]), "position": np.array([p]), **state,
            "mask": np.where(np.arange(size) <= p, 0, -1e9).astype(np.float32)[None],
            "write": np.repeat((np.arange(size) == p).astype(np.float32)[:, None], head, axis=1)})))
        state = {k: out[f"{k}_next"] for k in state}
        if p + 1 < len(prompt):
            token = prompt[p + 1]
        else:
            token = int(out["output"].argmax())
            ids.append(token)
    return np.array(ids)


def test_generate_on_an_exported_gpt2_step(trained, tmp_path):
    """The exported GPT-2: a decode step written with the trained GPT2LMHeadModel's modules,
    exported by torch.onnx.export (TorchScript), compiled from the ONNX file on GGML (one ggml
    graph, no NumPy fallback) and run by ``ml.generate`` with the file's own weights: equal to
    ``GPT2LMHeadModel.generate`` and to onnxruntime's greedy decoding of the file in float32, and
    at q8_0 equal to onnxruntime's on at least 30 of 32 tokens (issue 19's bar). q4_0 is
    reported, not asserted. Measured per seed 0, 1, 2: q8_0 32, 32, 32 of 32; q4_0 32, 32, 32."""
    torch, hf, prompt, want = trained["torch"], trained["hf"], trained["prompt"], trained["want"]
    size, head = CFG["block_size"], CFG["dims"] // CFG["num_heads"]
    caches = [f"{kv}_cache_{i}" for i in range(CFG["num_layers"]) for kv in "kv"]
    layouts = {"k": (1, CFG["num_heads"], size, head), "v": (1, CFG["num_heads"], head, size)}
    args = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(1, size),
            torch.zeros(size, head), *(torch.zeros(layouts[c[0]]) for c in caches))
    path = tmp_path / "gpt2_step.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and tracer notes
        warnings.simplefilter("ignore")
        torch.onnx.export(_gpt2_step_module(torch, hf), args, str(path), dynamo=False, opset_version=17,
                          input_names=["input", "position", "mask", "write", *caches],
                          output_names=["output", *(f"{c}_next" for c in caches)])
    reference = _onnxruntime_greedy(str(path), prompt, NEW)  # the reference
    np.testing.assert_array_equal(reference, want)
    f32 = ml.compile(str(path), ml.GGMLBackend(num_threads=1), inference=True)
    assert len(f32.program.segments) == 1 and not f32.program.fallback
    np.testing.assert_array_equal(ml.generate(f32, None, prompt, NEW), reference)
    q8 = ml.compile(str(path), ml.GGMLBackend(quantize="q8_0", num_threads=1), inference=True)
    assert "q8_0" in q8.memory_report().weights_by_dtype
    q4 = ml.compile(str(path), ml.GGMLBackend(quantize="q4_0", num_threads=1), inference=True)
    assert "q4_0" in q4.memory_report().weights_by_dtype
    q8_ids, q4_ids = ml.generate(q8, None, prompt, NEW), ml.generate(q4, None, prompt, NEW)
    print(f"exported GPT-2, seed {trained['seed']}: q8_0 {_count(q8_ids, reference)}/{NEW}, "
          f"q4_0 {_count(q4_ids, reference)}/{NEW}")
    assert _count(q8_ids, reference) >= 30


def test_generate_failures_are_mithril_errors():
    step = _step(ml.NumpyBackend())
    with pytest.raises(MithrilError, match="missing parameter"):
        ml.generate(step, {"wte.weight": np.zeros(3, np.float32)}, PROMPT, 2)
    with pytest.raises(MithrilError, match="generate failed: ValueError"):  # not a token id
        ml.generate(step, None, ["one", "two"], 2)
