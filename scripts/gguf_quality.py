"""Perplexity and KL divergence of each GGUF quantization type against float32, and generation
speed beside llama.cpp's, on a small Llama trained here: the tables of docs/gguf.md.

    python scripts/gguf_quality.py [--write] [--threads 1] [--steps 300]

What it does, all from nothing downloaded:
1. writes a text from a small seeded grammar (a training part and a held-out part), trains a
   byte-level BPE tokenizer on it (``tokenizers``);
2. builds a Llama from a config (hidden 256, so every matrix row is whole k-quant blocks), trains
   it on the text and exports it with optimum-onnx (scripts/optimum_export.py);
3. writes a GGUF file per type (``mithril export-gguf``'s code) and runs each on Mithril's GGML
   backend one token at a time over the held-out text, in chunks of ``--context`` tokens, each
   token scored given the ones before it in its chunk: perplexity, the mean KL divergence of its
   next-token distribution from float32's, and how often its most likely token is float32's
   (llama.cpp's own table reports the same three);
4. when llama-cpp-python is installed, llama.cpp computes the perplexity of the same files, and
   both generate ``--new`` tokens greedily with the same threads: tokens/s side by side.

``--write`` replaces the section "## Quantization quality and speed" of docs/gguf.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TYPES = ("f32", "f16", "q8_0", "q6_K", "q5_1", "q5_0", "q4_1", "q4_K", "q4_0")
SECTION = "## Quantization quality and speed"
PROMPT = "The small fox reads"


def make_text(seed: int, sentences: int) -> str:
    """Sentences of a small grammar: enough structure to learn, enough choice to leave entropy."""
    rng = np.random.default_rng(seed)
    adjectives = "small old quick lazy bright quiet green heavy".split()
    nouns = "fox dog model river teacher engine garden window letter city".split()
    verbs = "reads finds sees builds follows moves writes keeps".split()
    adverbs = "slowly often never quietly again today".split()
    places = "in the garden|near the river|at the window|under the bridge|inside the city".split("|")

    def np_(rng):
        words = ["the" if rng.random() < 0.6 else "a"]
        if rng.random() < 0.5:
            words.append(rng.choice(adjectives))
        words.append(rng.choice(nouns))
        return " ".join(words)

    out = []
    for _ in range(sentences):
        s = f"{np_(rng)} {rng.choice(verbs)} {np_(rng)}"
        if rng.random() < 0.4:
            s += f" {rng.choice(places)}"
        if rng.random() < 0.3:
            s += f" {rng.choice(adverbs)}"
        out.append(s[0].upper() + s[1:] + ".")
    return " ".join(out)


def train_tokenizer(text: str, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def mithril_logits(step, params, tokens, context: int) -> np.ndarray:
    """Logits [len(tokens) - chunks, vocab]: each chunk of ``context`` tokens from empty caches,
    the logits predicting its tokens 1.. from the ones before."""
    from mithril.generation import _position

    inputs = {v.name: v for v in step.ir.graph.inputs}
    backend = step.backend
    rows = []
    for start in range(0, len(tokens) - 1, context):
        chunk = tokens[start:start + context]
        state = {n: backend.from_numpy(np.zeros([int(d) for d in v.shape], np.float32))
                 for n, v in inputs.items() if "_cache_" in n}
        for p, t in enumerate(chunk[:-1]):
            position = {k: backend.from_numpy(v) for k, v in _position(p, context, inputs).items()}
            out = step.evaluate(params, {"input": backend.from_numpy(np.array([[t]], np.int64)), **state, **position})
            rows.append(backend.to_numpy(out["output"]).reshape(-1))
            state = {n: out[f"{n}_next"] for n in state}
    return np.stack(rows)


def targets(tokens, context: int) -> np.ndarray:
    return np.array([t for start in range(0, len(tokens) - 1, context) for t in tokens[start + 1:start + context]])


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def scores(logits, ref_logits, target):
    lp, ref = log_softmax(logits), log_softmax(ref_logits)
    ppl = float(np.exp(-lp[np.arange(len(target)), target].mean()))
    kld = float((np.exp(ref) * (ref - lp)).sum(-1).mean())
    same = float((logits.argmax(-1) == ref_logits.argmax(-1)).mean())
    return ppl, kld, same


def llama_cpp_logits(path, tokens, context: int, threads: int):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=context, n_threads=threads, logits_all=True,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    rows = []
    for start in range(0, len(tokens) - 1, context):
        chunk = tokens[start:start + context]
        llm.reset()
        llm.eval(chunk)
        rows.append(np.array(llm.scores[:len(chunk) - 1]))
    return np.concatenate(rows)


def llama_cpp_speed(path, prompt, new: int, threads: int, context: int) -> tuple[list[int], float]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=context, n_threads=threads,
                          n_threads_batch=threads, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                          logits_all=True, verbose=False)  # llama-cpp-python keeps scores only with logits_all
    llm.eval(list(prompt))
    out = []
    start = time.perf_counter()
    for _ in range(new):  # as ml.generate times it: each step that yields a token, logits read
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out, new / (time.perf_counter() - start)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the section in docs/gguf.md")
    ap.add_argument("--output", default=str(ROOT / "docs" / "gguf.md"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--eval-tokens", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import mithril as ml

    work = Path(tempfile.mkdtemp(prefix="gguf_quality_"))
    train_text, eval_text = make_text(args.seed, 6000), make_text(args.seed + 1, 600)
    tok = train_tokenizer(train_text, 512)
    tok.save(str(work / "tokenizer.json"))
    (work / "train.txt").write_text(train_text)
    config = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 512}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "optimum_export.py"), "--arch", "llama",
                           "--out", str(work), "--vocab-size", "512", "--config", json.dumps(config),
                           "--tokenizer", str(work / "tokenizer.json"), "--train", str(work / "train.txt"),
                           "--steps", str(args.steps), "--seq", "128", "--lr", "3e-3", "--seed", str(args.seed)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 1
    trained = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    print(f"trained and exported in {time.perf_counter() - t0:.0f} s: loss {trained['first_loss']:.2f} -> "
          f"{trained['last_loss']:.2f}", file=sys.stderr)
    onnx_path = work / "llama" / "onnx" / "model.onnx"
    tokens = tok.encode(eval_text).ids[:args.eval_tokens]
    target = targets(tokens, args.context)
    import importlib.util

    have_llama = importlib.util.find_spec("llama_cpp") is not None
    prompt = tok.encode(PROMPT).ids
    rows, ref = [], None
    for kind in TYPES:
        path = work / f"llama-{kind}.gguf"
        ml.save_gguf(str(onnx_path), path, arch="llama", quantize=None if kind == "f32" else kind)
        dec = ml.gguf_decoder(path, context=args.context)
        step = ml.compile(dec.model, dec.backend(num_threads=args.threads), shapes={"input": (1, 1)}, inference=True)
        logits = mithril_logits(step, dec.params, tokens, args.context)
        ref = logits if ref is None else ref
        ppl, kld, same = scores(logits, ref, target)
        ids, tps = ml.generate(step, dec.params, prompt, args.new, return_speed=True)
        row = {"type": kind, "bytes": os.path.getsize(path), "ppl": ppl, "kld": kld, "same": same, "tps": tps}
        if have_llama:
            row["llama_ppl"] = scores(llama_cpp_logits(path, tokens, args.context, args.threads), ref, target)[0]
            theirs, row["llama_tps"] = llama_cpp_speed(path, prompt, args.new, args.threads, args.context)
            row["same_tokens"] = [int(t) for t in ids] == theirs
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    args.load = os.getloadavg()[0]  # other work on the machine, said beside the timings
    table = render(rows, args, trained, have_llama, len(target))
    print(table)
    if args.write:
        splice(Path(args.output), table)
    return 0


def render(rows, args, trained, have_llama, n_scored) -> str:
    f32 = rows[0]
    cpu = _cpu_name()
    lines = [SECTION, "",
             f"Written by `python scripts/gguf_quality.py --write` ({time.strftime('%Y-%m-%d')}; {cpu}, "
             f"{args.threads} thread{'s' if args.threads > 1 else ''}). The model: a Llama of hidden size 256, 4 "
             f"blocks, 4 heads (2 key/value), vocabulary 512 (a BPE tokenizer trained on the text), trained for "
             f"{args.steps} steps (loss {trained['first_loss']:.2f} -> {trained['last_loss']:.2f}) on a text from a "
             f"seeded grammar and exported by optimum-onnx; scored on {n_scored} tokens of held-out text of the same "
             f"grammar, in chunks of {args.context}. KLD: the mean KL divergence of each position's next-token "
             f"distribution from float32's; same top: how often its most likely token is float32's (the grammar "
             f"picks words uniformly, so many positions are near ties that any rounding flips). The matrices are in "
             f"the type named; norms stay float32. PPL (llama.cpp): llama.cpp's perplexity of the same file on the "
             f"same chunks.", "",
             "| type | file bytes | of f32 | PPL (Mithril) | ΔPPL | KLD | same top |"
             + (" PPL (llama.cpp) |" if have_llama else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if have_llama else "")]
    for r in rows:
        lines.append(f"| {r['type']} | {r['bytes']:,} | {r['bytes'] / f32['bytes']:.1%} | {r['ppl']:.4f} | "
                     f"{r['ppl'] - f32['ppl']:+.4f} | {r['kld']:.6f} | {r['same']:.2%} |"
                     + (f" {r['llama_ppl']:.4f} |" if have_llama else ""))
    lines += ["", f"Generation, {args.new} new tokens after the prompt \"{PROMPT}\", greedy, the same file "
              f"and {args.threads} thread{'s' if args.threads > 1 else ''} (tokens/s: each step that yields a "
              "token, its logits read back; llama.cpp through llama-cpp-python with a float32 key/value cache, as "
              f"Mithril's; load average {args.load:.1f} on the machine at the end of the run). The model is small (a "
              "step reads about 10 MB of float32 weights): most of a step's time is per-step overhead, Python's "
              "`evaluate` and the arrays it passes in Mithril, where llama.cpp's loop is one C call.", ""]
    if have_llama:
        lines += ["| type | Mithril GGML tokens/s | llama.cpp tokens/s | same tokens |", "| --- | ---: | ---: | --- |"]
        for r in rows:
            lines.append(f"| {r['type']} | {r['tps']:.0f} | {r['llama_tps']:.0f} | "
                         f"{'yes' if r['same_tokens'] else 'no'} |")
    else:
        lines += ["| type | Mithril GGML tokens/s |", "| --- | ---: |"]
        for r in rows:
            lines.append(f"| {r['type']} | {r['tps']:.0f} |")
        lines += ["", "(llama-cpp-python was not installed when this was written: no llama.cpp columns.)"]
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def splice(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else "# GGUF\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        text = head + table + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + table
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
