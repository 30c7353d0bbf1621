#!/usr/bin/env python
"""Every Mithril backend beside onnxruntime and beside the same model written directly in that
backend's framework, in one process per thread count, taking turns.

    python scripts/bench_peers.py                              # four models, 2 and 1 threads; prints
    python scripts/bench_peers.py --write                      # and replaces "## Peers" in docs/performance.md
    python scripts/bench_peers.py --models resnet18 --threads 1 --row-seconds 2
    python scripts/bench_peers.py --model my.onnx              # a user's file: onnxruntime and Mithril backends only

The models are scripts/export_models.py's exports (torchvision ResNet-18 and MobileNetV2, transformers
BertModel and GPT2LMHeadModel, seeded random weights). For each model the runtimes are timed in
groups, each group taking turns in the same process with onnxruntime on the same file
(scripts/bench.py's blocks: a lead-in of untimed calls, then about 0.2 s of timed calls):

- numpy: Mithril NumPy.
- torch: the original module in Torch eager (torch.no_grad), ``torch.compile`` of it, Mithril Torch.
- jax: the direct jax.numpy port of the module's forward under ``jax.jit`` (scripts/peers), Mithril JAX.
- mlx: the direct mlx.core port under ``mx.compile`` (scripts/peers), Mithril MLX.

``--runtimes ...,jax-port-options`` adds the JAX port compiled with the XLA options Mithril's
JaxBackend compiles that model with (XNNPACK convolutions for a CNN; XLA's YNNPACK fusions for a
transformer at 2 threads), to tell their share of a JAX row from the lowering's;
``torch-op-by-op`` adds ``TorchBackend(onednn_graph=False)``, the Torch backend without the oneDNN
graph it runs convolutional models as, to set that graph's time against its memory. The memory rows
(scripts/bench_memory.py) measure the framework-native peers too.

Each thread count runs in its own child process whose CPU affinity is that many CPUs, set before any
framework starts, so XLA and MLX (which size their pools from the CPUs they may use, once) run at the
same count as onnxruntime (``intra_op_num_threads``), torch (``torch.set_num_threads``) and BLAS
(threadpoolctl), which are also set explicitly. Every call returns NumPy arrays where Mithril's rows
do (JAX and MLX outputs are waited for and converted, as ``backend.to_numpy`` does).

With built-in models, the process of the largest thread count also loads and compiles ResNet-50
(scripts/bench.py's export) on NumPy, Torch and JAX against the compile-time bars (load+compile under
1 s on NumPy and Torch, JAX's first call under 5 s); ``--no-compile-time`` skips it.

One progress line per measurement goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path[:0] = [str(ROOT), str(SCRIPTS)]

HEADING = "## Peers"
ORT = "onnxruntime"
# group -> runtimes timed in turns with onnxruntime (and with each other)
GROUPS = {
    "numpy": ("numpy",),
    "torch": ("torch-eager", "torch-compile", "torch"),
    "jax": ("jax-port", "jax"),
    "mlx": ("mlx-port", "mlx"),
}
MITHRIL = {"numpy", "jax", "torch", "mlx", "torch-op-by-op"}  # scripts/bench.py's backend names
# runtime -> its framework-native peer in the same group
PEER_OF = {"torch": "torch-eager", "torch-compile": "torch-eager", "jax": "jax-port", "mlx": "mlx-port",
           "jax-port-options": "jax-port", "torch-op-by-op": "torch-eager"}
LABELS = {
    ORT: "onnxruntime", "numpy": "Mithril NumPy", "torch": "Mithril Torch", "jax": "Mithril JAX",
    "mlx": "Mithril MLX", "torch-eager": "Torch eager (module)", "torch-compile": "torch.compile (module)",
    "jax-port": "JAX port (jax.jit)", "mlx-port": "MLX port (mx.compile)",
    "jax-port-options": "JAX port (jax.jit, JaxBackend's XLA options)",
    "torch-op-by-op": "Mithril Torch (onednn_graph=False)",
}
# Not run unless --runtimes names them: the JAX port under the XLA options Mithril's JaxBackend
# compiles the model with (bench.jax_program_options), to tell their share of a JAX row from the lowering's;
# TorchBackend(onednn_graph=False), op by op where the default runs a convolutional model as a oneDNN
# graph, to set that graph's time against its memory.
OPTIONAL = {"jax-port-options": "jax", "torch-op-by-op": "torch"}
RUNTIMES = tuple(r for g in GROUPS.values() for r in g)


def _bench():
    import bench  # scripts/bench.py: imported after the child's affinity is set (it imports mithril)

    return bench


# -- timing --------------------------------------------------------------------------------------
def interleaved_samples(runners: dict, warmup: int, min_runs: int, max_runs: int, row_seconds: float) -> dict:
    """Seconds of every timed call per runner, the runners taking turns in blocks as
    scripts/bench.py's ``_interleaved_times`` does (whose medians alone do not give the noise)."""
    b = _bench()
    per_call = {}
    for name, fn in runners.items():
        # The faster of two calls: a runtime may still set up at its second (Mithril Torch traces
        # its oneDNN graph there), which would size every block and the row's count by that call.
        for _ in range(2):
            t = time.perf_counter()
            fn()
            per_call[name] = min(per_call.get(name, math.inf), time.perf_counter() - t)
    if sum(per_call.values()) * warmup < row_seconds / 2:
        for name, fn in runners.items():
            for _ in range(max(warmup - 1, 0)):
                t = time.perf_counter()
                fn()
                per_call[name] = min(per_call[name], time.perf_counter() - t)
    want = max(min_runs, min(max_runs, int(row_seconds / max(sum(per_call.values()), 1e-9))))
    times: dict[str, list[float]] = {k: [] for k in runners}
    while min(len(v) for v in times.values()) < want:
        for name, fn in runners.items():
            if per_call[name] < b.LONG_CALL_S:
                lead_in_end = time.perf_counter() + b.LEAD_IN_S
                fn()
                while time.perf_counter() < lead_in_end:
                    fn()
            for _ in range(max(1, min(want - len(times[name]), int(b.BLOCK_S / max(per_call[name], 1e-9))))):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return times


# -- the child: one thread count -----------------------------------------------------------------
def _set_affinity(threads: int) -> str:
    """Restrict this process to ``threads`` of its CPUs (before XLA, MLX, OpenMP or BLAS start)."""
    if not hasattr(os, "sched_setaffinity"):
        return "affinity not supported here"
    cpus = sorted(os.sched_getaffinity(0))
    if threads > len(cpus):
        return f"asked for {threads} threads, {len(cpus)} CPUs usable: all of them"
    os.sched_setaffinity(0, cpus[:threads])
    return f"CPUs {cpus[:threads]}"


def _user_inputs(path: str) -> dict[str, np.ndarray]:
    """Seeded inputs for a user's file from its declared inputs (symbolic dimensions: 1)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    dtypes = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    out = {}
    for i in ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        dtype = dtypes.get(i.type)
        if dtype is None:
            raise SystemExit(f"{path}: input {i.name!r} has type {i.type}; this bench feeds float, int and bool inputs")
        if np.issubdtype(dtype, np.floating):
            out[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            out[i.name] = np.ones(shape, np.bool_)
        else:
            out[i.name] = rng.integers(0, 100, shape).astype(dtype)
    return out


class _Compiled:
    """The module under torch.compile, shaped for scripts/bench.py's ``_eager_row``."""

    def __init__(self, ex):
        import torch

        self.module = torch.compile(ex.module)
        self.inputs, self.output_names = ex.inputs, ex.output_names


def _prepare(runtime: str, path: str, ex, inputs: dict, backends: dict, args) -> tuple:
    """(load/compile seconds or None, first-call seconds, call, outputs by name) for ``runtime``."""
    b = _bench()
    if runtime in MITHRIL:
        compile_s, first_s, call, outs, fallbacks = b._backend_row(backends[runtime], path, inputs,
                                                                   args.compile_repeats)
        # A row that fell back to op-by-op execution is still timed, and says so (as bench.py does).
        call.fallbacks = fallbacks
        return compile_s, first_s, call, outs
    if runtime == "torch-eager":
        first_s, call, outs = b._eager_row(ex, inputs)
        return None, first_s, call, outs
    if runtime == "torch-compile":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first_s, call, outs = b._eager_row(_Compiled(ex), inputs)
        return None, first_s, call, outs
    from peers import make_peer

    framework = runtime.split("-")[0]
    options = {"compiler_options": b.jax_program_options(path)} if runtime == "jax-port-options" else {}
    t = time.perf_counter()
    call = make_peer(framework, ex.name, ex.module, **options).bind(inputs)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    outs = dict(zip(ex.output_names, call()))
    return load_s, time.perf_counter() - t, call, outs


def _thread_facts(threads: int, affinity: str) -> dict:
    import torch
    from threadpoolctl import threadpool_info

    return {"threads": threads, "affinity": affinity, "torch.get_num_threads": torch.get_num_threads(),
            "blas": ", ".join(f"{p['internal_api']} {p['num_threads']}" for p in threadpool_info()) or "none"}


def run_child(args) -> dict:
    """All models at ``args.threads`` threads in this process; rows and notes as JSON-ready dicts."""
    affinity = _set_affinity(args.threads)
    b = _bench()
    import onnxruntime as ort
    import export_models as em

    notes: list[str] = []
    rows: list[dict] = []
    wanted = [r for r in (*RUNTIMES, *OPTIONAL) if r in args.runtime_list]
    backends = dict(b._make_backends([r for r in wanted if r in MITHRIL], notes))
    with b._limits(args.threads):
        facts = _thread_facts(args.threads, affinity)
        for item in args.items:
            path, name = item["path"], item["name"]
            ex = em.build(name) if item["builtin"] else None
            inputs = ex.inputs if ex is not None else _user_inputs(path)
            desc = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            t = time.perf_counter()
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            ort_load_s = time.perf_counter() - t
            out_names = [o.name for o in sess.get_outputs()]
            ref = dict(zip(out_names, sess.run(None, inputs)))
            ort_call = lambda s=sess: s.run(None, inputs)  # noqa: E731
            load = b._load_average()
            for group, members in GROUPS.items():
                members = (*members, *(r for r, g in OPTIONAL.items() if g == group))
                present = [r for r in members if r in wanted and (r in MITHRIL or ex is not None)]
                present = [r for r in present if r not in MITHRIL or r in backends]
                if not present:
                    continue
                prepared = {}
                for r in present:
                    b._progress(f"{name} ({desc}), {args.threads} threads: prepare {LABELS[r]}")
                    try:
                        prepared[r] = _prepare(r, path, ex, inputs, backends, args)
                    except Exception as exc:  # one failing runtime must not end the benchmark
                        notes.append(f"{name}, {args.threads} threads: {LABELS[r]} failed: "
                                     f"{type(exc).__name__}: {str(exc)[:300]}")
                        b._progress(notes[-1])
                        continue
                    for msg in getattr(prepared[r][2], "fallbacks", []):
                        notes.append(f"{name}, {args.threads} threads: {LABELS[r]} ran un-jitted: {msg}")
                        b._progress(notes[-1])
                if not prepared:
                    continue
                b._progress(f"{name}, {args.threads} threads: timing {' / '.join(LABELS[r] for r in [ORT, *prepared])}")
                runners = {ORT: ort_call, **{r: p[2] for r, p in prepared.items()}}
                samples = interleaved_samples(runners, args.warmup, args.min_runs, args.runs, args.row_seconds)
                ort_med = statistics.median(samples[ORT])
                meds = {r: statistics.median(v) for r, v in samples.items()}
                for r in [ORT, *prepared]:
                    s = samples[r]
                    peer = PEER_OF.get(r)
                    row = dict(model=name, input=desc, threads=args.threads, group=group, runtime=r,
                               ms=meds[r] * 1e3, min_ms=min(s) * 1e3, max_ms=max(s) * 1e3, runs=len(s),
                               vs_ort=meds[r] / ort_med, ort_ms=ort_med * 1e3,
                               vs_peer=meds[r] / meds[peer] if peer in meds else None,
                               peer=peer if peer in meds else None, load=load)
                    if r == ORT:
                        row.update(compile_s=ort_load_s, first_s=None, diff=0.0)
                    else:
                        compile_s, first_s, _, outs = prepared[r]
                        row.update(compile_s=compile_s, first_s=first_s,
                                   diff=max(float(np.max(np.abs(np.asarray(outs[k], np.float64) - ref[k])))
                                            for k in ref))
                    rows.append(row)
                    b._progress(_row_line(row))
                if args.explain:  # where each Mithril row's time goes (mithril profile)
                    for row in rows[-len(prepared) - 1:]:
                        target = getattr(prepared.get(row["runtime"], (None, None, None))[2], "profile_target", None)
                        if target is not None:
                            row["hot_ops"] = _hot_ops(b.ml, *target)
                            b._progress(f"{name} {args.threads}t {LABELS[row['runtime']]} hot ops: {row['hot_ops']}")
                del prepared, runners
            del sess, ort_call
        compile_rows = [row for item in args.compile_items for row in _compile_rows(item, backends, args, notes)]
    return {"rows": rows, "notes": notes, "facts": facts, "compile_rows": compile_rows}


# The compile-time bars: ResNet-50's load + compile on NumPy and Torch, and JAX's first call (its jit compile).
COMPILE_BARS = {"numpy": ("load+compile", 1.0), "torch": ("load+compile", 1.0), "jax": ("first call", 5.0)}


def _compile_rows(item: dict, backends: dict, args, notes: list) -> list[dict]:
    """Load+compile (median of three) and first-call seconds of each of NumPy, Torch and JAX on
    ``item``'s file, with onnxruntime's session creation beside them; no steady-state timing."""
    import onnxruntime as ort

    b = _bench()
    path, name = item["path"], item["name"]
    inputs = _user_inputs(path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    t = time.perf_counter()
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    rows = [dict(model=name, threads=args.threads, runtime=ORT, compile_s=time.perf_counter() - t, first_s=None,
                 diff=0.0)]
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    for r in COMPILE_BARS:
        if r not in backends:
            continue
        b._progress(f"{name}, {args.threads} threads: load, compile and first call on {LABELS[r]}")
        try:
            compile_s, first_s, _, outs, _ = b._backend_row(backends[r], path, inputs, 3)
        except Exception as exc:  # one failing backend must not end the benchmark
            notes.append(f"{name}: {LABELS[r]} failed to compile: {type(exc).__name__}: {str(exc)[:300]}")
            b._progress(notes[-1])
            continue
        diff = max(float(np.max(np.abs(np.asarray(outs[k], np.float64) - ref[k]))) for k in ref)
        rows.append(dict(model=name, threads=args.threads, runtime=r, compile_s=compile_s, first_s=first_s, diff=diff))
        b._progress(f"{name} {LABELS[r]}: load+compile {compile_s:.2f} s, first call {first_s:.2f} s")
    return rows


def _compile_table(rows: list[dict], export_line: str) -> list[str]:
    lines = ["", "### Load and compile time", "",
             f"{export_line}. One process at {rows[0]['threads']} thread{'s' if rows[0]['threads'] != 1 else ''} "
             "after the tables above (every framework "
             "imported and started): Mithril's `ml.compile(ml.load_onnx(path), backend)`, the median of three, "
             "and the first `evaluate` after the first compile (where jax.jit compiles); onnxruntime's session "
             "creation beside them. Bars: NumPy and Torch load+compile under 1 s, JAX's first call under 5 s.", "",
             "| Runtime | Load+compile s | First call s | Bar | Result | max \\|diff\\| |", "|---|---|---|---|---|---|"]
    for r in rows:
        bar = COMPILE_BARS.get(r["runtime"])
        if bar is None:
            verdict, bar_text = "—", "—"
        else:
            value = r["compile_s"] if bar[0] == "load+compile" else r["first_s"]
            verdict, bar_text = ("met" if value < bar[1] else "missed"), f"{bar[0]} < {bar[1]:g} s"
        lines.append(f"| {LABELS[r['runtime']]} | {r['compile_s']:.2f} | {_fmt(r['first_s'], '.2f')} | {bar_text} "
                     f"| {verdict} | {r['diff']:.1e} |")
    return lines


def _hot_ops(ml, pm, params, data, top: int = 3) -> str:
    """The op types taking the most time in one run (``ml.profile``: kernel clocks on NumPy and
    Torch, XLA's profiler on JAX, eager per-op time on MLX), as "MatMul 61%, Add 12%, ..."."""
    try:
        report = ml.profile(pm, params, data, runs=2, warmup=1)
    except Exception as exc:  # a profile that fails must not end the benchmark
        return f"profile failed: {type(exc).__name__}"
    return ", ".join(f"{r.op_type} {r.share:.0f}%" for r in report.op_types[:top])


def _row_line(r: dict) -> str:
    peer = f", {r['vs_peer']:.2f}x {LABELS[r['peer']]}" if r.get("vs_peer") is not None else ""
    return (f"{r['model']} {r['threads']}t [{r['group']}] {LABELS[r['runtime']]}: {r['ms']:.2f} ms "
            f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, {r['runs']} runs) = {r['vs_ort']:.2f}x onnxruntime{peer}")


# -- the parent: exports, one child per thread count, the table -----------------------------------
def _fmt(v, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def by_backend(rows: list[dict]) -> list[str]:
    """A table per Mithril backend: each model's median and its ratios to onnxruntime and to the
    framework-native peer, per thread count (the per-model tables below hold every runtime)."""
    lines = []
    for backend in (b for b in LABELS if b in MITHRIL and any(r["runtime"] == b for r in rows)):
        lines += ["", f"### {LABELS[backend]}", "", "| Model | Threads | Median ms | vs onnxruntime | vs its peer |",
                  "|---|---|---|---|---|"]
        for r in (r for r in rows if r["runtime"] == backend):
            peer = "—" if r["vs_peer"] is None else f"{r['vs_peer']:.2f}x {LABELS[r['peer']]}"
            lines.append(f"| {r['model']} | {r['threads']} | {r['ms']:.2f} | {r['vs_ort']:.2f}x | {peer} |")
    return lines


def render(results: list[dict], args, started: str, loads, export_lines: list[str], memory=(),
           compile_export: str = "") -> str:
    b = _bench()
    command = "python scripts/bench_peers.py" + "".join(" " + shlex.quote(a) for a in args.argv)
    facts = b._machine_facts()
    lines = [
        HEADING, "",
        f"Generated by `scripts/bench_peers.py` ({started}); regenerate with `{command}`.", "",
        "Each Mithril backend beside onnxruntime on the same file and beside the same model written directly",
        "in the backend's framework: the original torch module in Torch eager and under `torch.compile`, a",
        "port of its forward to `jax.numpy` under `jax.jit` and to `mlx.core` under `mx.compile`",
        "(scripts/peers, loaded from the module's state_dict). The runtimes of a group (NumPy; Torch; JAX; MLX)",
        "take turns with onnxruntime in the same process, so the ratios compare them under the same load;",
        "\"vs ORT\" divides by onnxruntime's median in the same group, \"vs peer\" by the framework-native",
        "peer's. Each thread count runs in its own process limited to that many CPUs (affinity, set before",
        "XLA and MLX size their pools) with onnxruntime's `intra_op_num_threads`, `torch.set_num_threads`",
        "and BLAS (threadpoolctl) set to it too. Median, min and max are over the timed calls; \"first call\"",
        "includes jit compilation (jax.jit, mx.compile, torch.compile); \"load\" is onnxruntime's session",
        "creation, Mithril's load+compile or the port's weight conversion. \"max |diff|\" is against",
        "onnxruntime's outputs. \"Hot ops\": the op types taking most of a Mithril row's time by `ml.profile`",
        "(kernel clocks on NumPy and Torch, XLA's profiler on JAX, eager per-op time on MLX; "
        "`mithril profile FILE --backend B`).",
        "Why a backend is slower than its peer, model by model: the next section.", "",
        f"Load average (1 / 5 / 15 min) at the start {b._fmt_load(loads[0])}, at the end {b._fmt_load(loads[1])}.",
        "", "Exports (scripts/export_models.py):", "",
    ]
    lines += [f"- {e}" for e in export_lines]
    lines += ["", "| Machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts]
    for res in results:
        f = res["facts"]
        lines.append(f"| {f['threads']}-thread process | {f['affinity']}; torch threads {f['torch.get_num_threads']}; "
                     f"BLAS {f['blas']} |")
    rows = [r for res in results for r in res["rows"]]
    lines += by_backend(rows)
    for model in dict.fromkeys(r["model"] for r in rows):
        mrows = [r for r in rows if r["model"] == model]
        lines += ["", f"### {model} ({mrows[0]['input']}): every runtime", "",
                  "| Threads | Runtime | Median ms | Min–max ms | Runs | vs ORT | vs peer | Load s | First call s | max \\|diff\\| | Hot ops (ml.profile) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mrows:
            peer = "—" if r["vs_peer"] is None else f"{r['vs_peer']:.2f}x {LABELS[r['peer']]}"
            name = LABELS[r["runtime"]] + (f" ({r['group']} group)" if r["runtime"] == ORT else "")
            lines.append(f"| {r['threads']} | {name} | {r['ms']:.2f} | {r['min_ms']:.2f}–{r['max_ms']:.2f} | {r['runs']} "
                         f"| {r['vs_ort']:.2f}x | {peer} | {_fmt(r['compile_s'], '.2f')} | {_fmt(r['first_s'], '.2f')} "
                         f"| {r['diff']:.1e} | {r.get('hot_ops', '')} |")
    compile_rows = [r for res in results for r in res.get("compile_rows", [])]
    if compile_rows:
        lines += _compile_table(compile_rows, compile_export)
    if memory:
        import bench_memory

        lines += ["", "### Resident memory", "",
                  f"What each model adds to a process at {max(r['threads'] for r in rows) if rows else '?'} threads "
                  "(scripts/bench_memory.py): a fresh process per model and runtime imports every framework first "
                  "and starts the runtime on a two-input Add (an onnxruntime session; the backend compiled and run, "
                  "which starts JAX's XLA client and compiler: start-up a process pays once, not per model), "
                  "then loads, compiles and runs the model five times on its own parameters "
                  "(`pm.evaluate(None, data)`) on that backend; peak is the process's peak resident memory "
                  "(VmHWM, reset before loading) minus its resident memory before loading, kept is what stays "
                  "resident after the runs. The framework-native peers are measured the same way: Torch eager "
                  "builds the torch module (its construction counts, as loading the file does for the others), a "
                  "port converts the module's weights (the module is built before the mark: a port's user would load "
                  "its weights from a file) and runs compiled; \"vs its peer\" divides a Mithril row by its "
                  "framework's. The bar: every backend within 1.3x of onnxruntime's peak.", ""]
        lines += bench_memory.table(list(memory))
    notes = [n for res in results for n in res["notes"]]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from export_models import MODELS

    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list from {', '.join(MODELS)} ('' for none)")
    ap.add_argument("--model", action="append", default=[], metavar="PATH",
                    help="a user's .onnx file (repeatable): onnxruntime and Mithril backends only, on seeded "
                         "inputs (floats standard normal, integers in [0, 100), bools true; symbolic dimensions 1)")
    ap.add_argument("--threads", default="2,1", help="comma list of thread counts, one process each")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES),
                    help=f"comma list from {', '.join((*RUNTIMES, *OPTIONAL))} (default: all but {', '.join(OPTIONAL)})")
    ap.add_argument("--row-seconds", type=float, default=6.0, help="time to spend timing one group")
    ap.add_argument("--runs", type=int, default=1000, help="most timed calls per runtime per group")
    ap.add_argument("--min-runs", type=int, default=3, help="fewest timed calls per runtime, however slow")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile-repeats", type=int, default=1, help="Mithril load+compile is the median of this many")
    ap.add_argument("--write", action="store_true", help=f"replace the {HEADING!r} section of --output")
    ap.add_argument("--output", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--no-explain", dest="explain", action="store_false",
                    help="skip the hot-ops column (ml.profile of each Mithril row after its timing)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the resident-memory rows (scripts/bench_memory.py: one fresh process per model and runtime)")
    ap.add_argument("--no-compile-time", action="store_true",
                    help="skip ResNet-50's load+compile and first-call rows (the compile-time bars; exported here, "
                         "measured in the process of the largest thread count; only with built-in --models)")
    ap.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)  # internal: one thread count
    args = ap.parse_args(argv)
    args.argv = argv
    args.runtime_list = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    for r in args.runtime_list:
        if r not in RUNTIMES and r not in OPTIONAL:
            ap.error(f"unknown runtime {r!r}; choose from {', '.join((*RUNTIMES, *OPTIONAL))}")

    if args.child:
        spec = json.loads(Path(args.child).read_text())
        args.threads, args.items, args.compile_items = spec["threads"], spec["items"], spec.get("compile_items", [])
        Path(spec["out"]).write_text(json.dumps(run_child(args)))
        return 0

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}; choose from {', '.join(MODELS)}")
    for p in args.model:
        if not os.path.isfile(p):
            ap.error(f"--model {p}: no such file")
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    if not threads or min(threads) < 1:
        ap.error("--threads needs counts of 1 or more")
    b = _bench()
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load_start = b._load_average()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        import export_models as em

        items, export_lines = [], []
        for n in names:
            b._progress(f"export {n}")
            path, ex = em.export(n, workdir)
            opset = em.DYNAMO_OPSET if ex.exporter == "dynamo" else em.OPSET
            items.append({"name": n, "path": path, "builtin": True})
            export_lines.append(f"{n}: {ex.source}, {ex.exporter} exporter, opset {opset}, "
                                f"{', '.join(f'{k} {list(v.shape)}' for k, v in ex.inputs.items())}, "
                                f"{os.path.getsize(path) / 2**20:.1f} MiB")
        for p in args.model:
            items.append({"name": os.path.basename(p), "path": os.path.abspath(p), "builtin": False})
            export_lines.append(f"{os.path.basename(p)}: the user's file")
        compile_items, compile_export = [], ""
        if names and not args.no_compile_time:
            b._progress("export resnet50 (load and compile time)")
            path50, _ = b._resnet50_onnx(workdir)
            compile_items.append({"name": "resnet50", "path": path50})
            compile_export = (f"ResNet-50 (scripts/bench.py's torchvision architecture, random weights, torchscript "
                              f"exporter, input [1, 3, 224, 224], {os.path.getsize(path50) / 2**20:.0f} MiB)")
        passthrough = [a for a in argv if not a.startswith("--write")]
        for t in threads:
            spec_path, out_path = os.path.join(workdir, f"child{t}.json"), os.path.join(workdir, f"rows{t}.json")
            Path(spec_path).write_text(json.dumps({"threads": t, "items": items, "out": out_path,
                                                    "compile_items": compile_items if t == max(threads) else []}))
            b._progress(f"{t}-thread process")
            proc = subprocess.run([sys.executable, __file__, *passthrough, "--child", spec_path])
            if proc.returncode != 0 or not os.path.exists(out_path):
                results.append({"rows": [], "notes": [f"the {t}-thread process exited with {proc.returncode}"],
                                "facts": {"threads": t, "affinity": "?", "torch.get_num_threads": "?", "blas": "?"}})
                continue
            results.append(json.loads(Path(out_path).read_text()))
        memory = []
        if not args.no_memory:
            import bench_memory

            runtimes = ["onnxruntime", *(r for r in (*bench_memory.RUNTIMES[1:], *bench_memory.PEERS)
                                         if r in args.runtime_list)]
            memory = bench_memory.rows({it["name"]: it["path"] for it in items}, runtimes, max(threads),
                                       progress=b._progress)
    section = render(results, args, started, (load_start, b._load_average()), export_lines, memory, compile_export)
    print(section)
    if args.write:
        out = Path(args.output)
        text = out.read_text() if out.exists() else "# Performance\n"
        out.write_text(b._splice_section(text, HEADING, section))
        print(f"wrote the {HEADING[3:]} section of {out}")
    return 0 if all(res["rows"] for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
