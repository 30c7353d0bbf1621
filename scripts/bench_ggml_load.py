#!/usr/bin/env python
"""GGML or C, and onnxruntime, on a quiet machine and beside one CPU-bound process, in one run.

    python scripts/bench.py --ggml-load                     # writes its section of docs/performance.md
    python scripts/bench.py --c-load                        # the same for C (--backend c): its own section
    python scripts/bench.py --ggml-load --no-write --seconds 2
    python scripts/bench_ggml_load.py --models bert_mini,gpt2_mini --exporters torchscript,dynamo

BERT-Mini (BertModel: hidden 256, 4 layers, 4 heads) and a GPT-2 of the same shape (GPT2LMHeadModel,
its 50,257-token embedding tied to the LM head), built from transformers configurations with seeded
random weights (models_zoo.torch_reference) and exported by torch.onnx as a user would
(``--exporters``: TorchScript, dynamo), run at 128 tokens, batch 1 (``bert_small`` and
``gpt2_124m``, the published sizes, can be named too).
Each model is timed in phases: quiet, loaded (one ``while True: pass`` Python process this script
starts and stops), ``--cycles`` times, then quiet again; in each phase the runtimes take turns in
blocks of about ``--block`` seconds for ``--seconds`` seconds, so every runtime sees the same load,
and the cycles spread the quiet and the loaded phases over the same stretch of time. The runtimes:
onnxruntime (its default threads), ``ggml`` (``GGMLBackend()``: every usable CPU) and, when asked,
``ggml-1-thread`` (``num_threads=1``); with ``--backend c``, ``c`` (``CBackend()``, the weights
parameters) and ``c-1-thread``. Each libgomp policy (``--libgomp``: how the OpenMP threads of ggml
or of the C library wait, passive or spinning, see POLICIES) runs in a process of its own, with its
own onnxruntime rows. Quiet and loaded are the medians of all the calls in those phases; "loaded /
quiet" their ratio. Whatever else runs on the machine runs in all phases: the 1-minute load
averages are reported beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADING = "## GGML under load"
C_HEADING = "## C under load"  # --backend c
MODELS = ("bert_mini", "gpt2_mini", "bert_small", "gpt2_124m")  # models_zoo.torch_reference.build names
DEFAULT_MODELS = ("bert_mini", "gpt2_mini")
RUNTIMES = ("onnxruntime", "ggml", "ggml-1-thread", "c", "c-1-thread")
DEFAULT_RUNTIMES = {"ggml": ("onnxruntime", "ggml"), "c": ("onnxruntime", "c", "c-1-thread")}
# How libgomp's threads wait, one process each (libgomp reads it once): "spinning" is libgomp's
# default (300,000 rounds before a thread sleeps), what GGMLBackend runs with unless told: calls
# then watched by the thread governor; "passive" (OMP_WAIT_POLICY=PASSIVE) sleeps at once, every
# call on every thread; "spin-N" spins N rounds.
POLICIES = {"spinning": {"GOMP_SPINCOUNT": "300000"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
            "spin-3000": {"GOMP_SPINCOUNT": "3000"}, "spin-30000": {"GOMP_SPINCOUNT": "30000"}}
DEFAULT_POLICIES = ("spinning", "passive")
LOADED_TARGET = 2.0  # GGML's loaded median / its quiet median, issue 57 (Must 3)
SEQ = 128


def cpu_features() -> str:
    """The vector extensions ggml's kernels choose by, as /proc/cpuinfo and ggml report them."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        pass
    named = [("AVX2", "avx2"), ("FMA", "fma"), ("F16C", "f16c"), ("AVX-512", "avx512f"), ("AVX512_VNNI", "avx512_vnni"),
             ("AVX_VNNI", "avx_vnni"), ("AVX512_BF16", "avx512_bf16"), ("AMX", "amx_int8")]
    have = [n for n, flag in named if flag in flags]
    lacks = [n for n, flag in named if flag not in flags]
    return f"{', '.join(have) or 'none of the x86 vector extensions'} (no {', '.join(lacks)})" if lacks else \
        ", ".join(have)


def _runner(name: str, path: str, inputs: dict):
    if name == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        return lambda: session.run(None, inputs)
    import mithril as ml

    threads = 1 if name.endswith("-1-thread") else None
    backend = ml.CBackend(num_threads=threads) if name.startswith("c") else ml.GGMLBackend(num_threads=threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the NumPy fallback's warning
        pm = ml.compile(ml.load_onnx(path), backend, shapes={k: list(v.shape) for k, v in inputs.items()},
                        static_shapes=True, inference=True)
    params = pm.get_parameters()
    call = lambda: pm.evaluate(params, inputs)  # noqa: E731
    call.program = pm.program
    return call


def _phase(runners: dict, seconds: float, block: float) -> dict[str, list[float]]:
    """Every timed call's seconds per runner, the runners taking turns in blocks of ``block``
    seconds (one untimed call first) for about ``seconds`` in all."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or min(len(v) for v in times.values()) < 3:
        for name, fn in runners.items():
            fn()
            stop = time.perf_counter() + block
            while True:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
                if t >= stop:
                    break
    return times


def measure(model: str, exporter: str, runtimes: list[str], seconds: float, block: float, cycles: int,
            workdir: str) -> list[dict]:
    """The rows of ``model`` exported by ``exporter``: each runtime's quiet and loaded medians over
    ``cycles`` quiet and loaded phases of ``seconds`` each (and a last quiet one)."""
    from models_zoo import torch_reference as tr

    spec = tr.build(model, seq=SEQ)
    path = os.path.join(workdir, f"{model}_{exporter}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.export_onnx(spec, exporter, path)
    inputs = spec.numpy_inputs(1)
    runners = {name: _runner(name, path, inputs) for name in runtimes}
    for fn in runners.values():
        fn()
    phases = []
    for phase in ["quiet", "loaded"] * cycles + ["quiet"]:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if phase == "loaded" else None
        try:
            time.sleep(0.2 if busy else 0.0)
            load = os.getloadavg()[0]
            phases.append((phase, load, _phase(runners, seconds, block)))
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        print(f"{model} ({exporter}, {_policy()}) {phase}: " + ", ".join(
            f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in phases[-1][2].items()), file=sys.stderr, flush=True)
    rows = []
    for name in runtimes:
        quiet = [t for p, _, times in phases if p == "quiet" for t in times[name]]
        loaded = [t for p, _, times in phases if p == "loaded" for t in times[name]]
        rows.append({"model": model, "exporter": exporter, "runtime": name, "libgomp": _policy(),
                     "quiet_ms": statistics.median(quiet) * 1e3, "loaded_ms": statistics.median(loaded) * 1e3,
                     "calls": (len(quiet), len(loaded)),
                     "loads": tuple(load for _, load, _ in phases)})
        rows[-1]["ratio"] = rows[-1]["loaded_ms"] / rows[-1]["quiet_ms"]
    return rows


def _policy() -> str:
    """How libgomp waits in this process (the environment it was started with)."""
    return next((name for name, env in POLICIES.items() if env and all(os.environ.get(k) == v for k, v in env.items())),
                "default")


def bars(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    out = []
    for key in dict.fromkeys((r["model"], r["exporter"], r["libgomp"]) for r in rows):
        by = {r["runtime"]: r for r in rows if (r["model"], r["exporter"], r["libgomp"]) == key}
        g, o = by.get("ggml"), by.get("onnxruntime")
        where = f"{key[0]} ({key[1]}; libgomp {key[2]})"
        c, c1 = by.get("c"), by.get("c-1-thread")
        if c is not None and c1 is not None:  # issue 58 (Must 2)
            out.append(("C on every CPU no slower than C on one thread, loaded", where,
                        f"{c['loaded_ms']:.1f} ms vs {c1['loaded_ms']:.1f} ms",
                        "met" if c["loaded_ms"] <= c1["loaded_ms"] else "NOT met"))
        if g is None:
            continue
        out.append((f"GGML loaded median at most {LOADED_TARGET:g}x its quiet median", where,
                    f"{g['ratio']:.2f}x", "met" if g["ratio"] <= LOADED_TARGET else "NOT met"))
        if o is not None:
            out.append(("GGML slowed by the load no more than onnxruntime", where,
                        f"{g['ratio']:.2f}x vs {o['ratio']:.2f}x", "met" if g["ratio"] <= o["ratio"] else "NOT met"))
    return out


def render(rows: list[dict], started: str, args) -> str:
    loads = [x for r in rows for x in r["loads"]]
    c = args.backend == "c"
    lines = [C_HEADING if c else HEADING, "",
             f"Generated by `scripts/bench.py --{'c' if c else 'ggml'}-load` ({started}; CPU {cpu_features()}; "
             f"{len(os.sched_getaffinity(0))} usable CPUs; 1-minute load average {min(loads):.2f}-{max(loads):.2f} "
             "over the phases, the busy process included).",
             "Each model runs quiet, then beside one CPU-bound process this script starts (`while True: pass`),",
             f"{args.cycles} times, then quiet again ({args.seconds:g} s a phase), the runtimes taking turns in each phase;"]
    if c:
        lines += ["quiet and loaded are the medians of all the calls in those phases. c: `CBackend()` in float32 on every",
                  "usable CPU, the weights parameters (calls move to one thread while other processes hold the CPUs:",
                  "docs/backends.md, threads on a busy machine); c-1-thread: `num_threads=1`; onnxruntime at its default",
                  "threads. libgomp: how the C library's OpenMP threads wait, one process each: spinning (libgomp's default)",
                  "or passive (`OMP_WAIT_POLICY=PASSIVE`)."]
    else:
        lines += ["quiet and loaded are the medians of all the calls in those phases. ggml:",
                  "`GGMLBackend()` in float32 on every usable CPU; onnxruntime at its default threads. libgomp: how",
                  "ggml's OpenMP threads wait, one process each: spinning (libgomp's default and GGMLBackend's: a call's",
                  "graphs move to one thread while other processes hold the CPUs), passive (`OMP_WAIT_POLICY=PASSIVE`:",
                  "asleep at once at each barrier, every call on every thread) or spin-N (`GOMP_SPINCOUNT=N`); docs/backends.md."]
    lines += ["bert_mini / gpt2_mini: hidden 256, 4 layers, 4 heads (GPT-2's 50,257-token embedding",
              f"tied to its LM head), random weights, exported by torch.onnx; sequence {SEQ}, batch 1.", "",
              "| Model | Exporter | libgomp | Runtime | Quiet (ms) | Loaded (ms) | Loaded / quiet | Calls (quiet, loaded) |",
              "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['exporter']} | {r['libgomp']} | {r['runtime']} | {r['quiet_ms']:.1f} | "
                     f"{r['loaded_ms']:.1f} | {r['ratio']:.2f}x | {r['calls'][0]}, {r['calls'][1]} |")
    lines += ["", "| Bar | Model | Measured | Met |", "|---|---|---|---|"]
    lines += [f"| {t} | {m} | {v} | {verdict} |" for t, m, v, verdict in bars(rows)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma list from {', '.join(MODELS)}")
    ap.add_argument("--exporters", default="torchscript", help="comma list from torchscript, dynamo")
    ap.add_argument("--backend", choices=("ggml", "c"), default="ggml",
                    help="whose section: GGML's (default runtimes onnxruntime, ggml) or C's (onnxruntime, c, c-1-thread)")
    ap.add_argument("--runtimes", help=f"comma list from {', '.join(RUNTIMES)} (default: the backend's)")
    ap.add_argument("--libgomp", default=",".join(DEFAULT_POLICIES),
                    help=f"comma list from {', '.join(POLICIES)}: a process each")
    ap.add_argument("--json", help=argparse.SUPPRESS)  # a child's rows (one libgomp policy), for the parent
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per phase (all runtimes)")
    ap.add_argument("--cycles", type=int, default=3, help="quiet-then-loaded cycles (then a last quiet phase)")
    ap.add_argument("--block", type=float, default=0.5, help="seconds of one runtime's turn")
    ap.add_argument("--output", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave --output alone")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    exporters = [e.strip() for e in args.exporters.split(",") if e.strip()]
    runtimes = [r.strip() for r in (args.runtimes or ",".join(DEFAULT_RUNTIMES[args.backend])).split(",") if r.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    for r in runtimes:
        if r not in RUNTIMES:
            ap.error(f"unknown runtime {r!r}; choose from {', '.join(RUNTIMES)}")
    policies = [p.strip() for p in args.libgomp.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            ap.error(f"unknown libgomp policy {p!r}; choose from {', '.join(POLICIES)}")
    if args.json:  # a child, under one policy
        rows = []
        with tempfile.TemporaryDirectory(prefix="mithril-ggml-load-") as workdir:
            for model in models:
                for exporter in exporters:
                    rows += measure(model, exporter, runtimes, args.seconds, args.block, args.cycles, workdir)
        Path(args.json).write_text(json.dumps(rows))
        return 0
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    rows = []
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    with tempfile.TemporaryDirectory(prefix="mithril-native-load-") as out:
        for policy in policies:
            path = os.path.join(out, f"{policy}.json")
            child = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--ggml-load", "--c-load")]
            done = subprocess.run([sys.executable, __file__, *child, "--json", path], env={**base, **POLICIES[policy]})
            if done.returncode != 0:
                print(f"the {policy} libgomp process failed (status {done.returncode})", file=sys.stderr)
                return 1
            rows += json.loads(Path(path).read_text())
    section = render(rows, started, args)
    print(section)
    if not args.no_write:
        import bench

        out = Path(args.output)
        text = out.read_text() if out.exists() else "# Performance\n"
        heading = C_HEADING if args.backend == "c" else HEADING
        out.write_text(bench._splice_section(text, heading, section))
        print(f"wrote the {heading[3:]} section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
