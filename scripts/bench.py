#!/usr/bin/env python
"""Benchmark Mithril backends against onnxruntime on real models; writes docs/performance.md.

    python scripts/bench.py                       # numpy backend, writes docs/performance.md
    python scripts/bench.py --backends numpy,jax --runs 50 --no-write
    python scripts/bench.py --profile resnet18    # time per op type on the NumPy backend

Models are exported in-process with the TorchScript exporter (random weights, seeded):
ResNet-18 and MobileNetV2 at 224x224 batch 1, a small BERT (hidden 64, 2 layers) at sequence 128.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mithril as ml  # noqa: E402

# name -> attribute of `mithril` holding the backend class; a backend not yet in mithril is skipped.
BACKENDS = {
    "numpy": "NumpyBackend",
    "jax": "JaxBackend",
    "torch": "TorchBackend",
    "mlx": "MlxBackend",
    "c": "CBackend",
    "ggml": "GGMLBackend",
}

# name -> (models.build kwargs, batch)
MODELS = {
    "resnet18": ({"image_size": 224}, 1),
    "mobilenet_v2": ({"image_size": 224}, 1),
    "bert": ({"seq": 128}, 1),
}

TARGETS = "load+compile of resnet18 < 1 s; NumPy resnet18 latency <= 3x onnxruntime"


def _interleaved_times(runners: dict, warmup: int, runs: int) -> dict[str, float]:
    """Median seconds per call of each runner, calls interleaved so that every runtime sees the
    same machine load (the numbers are meant to be compared)."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for name, fn in runners.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _export(name: str, workdir: str) -> tuple[str, dict[str, np.ndarray]]:
    from models_zoo import torch_reference as models

    kwargs, batch = MODELS[name]
    spec = models.build(name, **kwargs)
    path = os.path.join(workdir, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.export_onnx(spec, "torchscript", path)
    return path, spec.numpy_inputs(batch)


def _backend_runner(backend, path: str, inputs: dict[str, np.ndarray], compile_repeats: int):
    shapes = {k: list(v.shape) for k, v in inputs.items()}

    def load_compile():
        return ml.compile(ml.load_onnx(path), backend, shapes=shapes)

    times = []
    for _ in range(compile_repeats):
        t = time.perf_counter()
        pm = load_compile()
        times.append(time.perf_counter() - t)
    params = pm.get_parameters()
    data = {k: backend.from_numpy(v) for k, v in inputs.items()}

    def call():
        # to_numpy waits for asynchronous backends (JAX, MLX) to finish.
        return {k: backend.to_numpy(v) for k, v in pm.evaluate(params, data).items()}

    return statistics.median(times), call, pm


def _machine_facts() -> list[tuple[str, str]]:
    import onnx
    import onnxruntime
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    facts = [
        ("CPU", cpu),
        ("CPU count (os.cpu_count)", str(os.cpu_count())),
        ("Usable CPUs (sched_getaffinity)", str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "?"),
        ("Python", platform.python_version()),
        ("numpy", np.__version__),
        ("onnx", onnx.__version__),
        ("onnxruntime", onnxruntime.__version__),
        ("torch (exporter)", torch.__version__),
        ("mithril", ml.__version__),
    ]
    try:
        import transformers

        facts.append(("transformers", transformers.__version__))
    except ImportError:
        pass
    return facts


def _signature(op: str, args, kwargs) -> str:
    shapes = "x".join(str(list(a.shape)) for a in args if hasattr(a, "shape") and getattr(a, "ndim", 0) > 1)
    extra = "".join(f" {k}={kwargs[k]}" for k in ("group", "strides") if kwargs.get(k) not in (None, 1, (1, 1)))
    return f"{op} {shapes}{extra}"


def profile_ops(pm, call, runs: int = 5) -> tuple[list[tuple[str, float, int]], list[tuple[str, float, int]]]:
    """Seconds per call by op type and by (op, input shapes, group/strides), timing every kernel
    call of the generated program."""
    ns = pm.program.namespace
    by_op: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_sig: dict[str, list] = defaultdict(lambda: [0.0, 0])
    op_of_kernel: dict[str, str] = {}
    for line in pm.code.splitlines():
        if "  # " in line and "=" in line:
            call_part, _, comment = line.partition("  # ")
            fn_name = call_part.split("=", 1)[1].strip().removeprefix("_first(").split("(", 1)[0]
            op_of_kernel.setdefault(fn_name, comment.split(" ", 1)[0])
    originals = {}
    for fn_name, op in op_of_kernel.items():
        fn = ns.get(fn_name)
        if not callable(fn):
            continue
        originals[fn_name] = fn

        def timed(*args, _fn=fn, _op=op, **kwargs):
            t = time.perf_counter()
            out = _fn(*args, **kwargs)
            dt = time.perf_counter() - t
            for table, key in ((by_op, _op), (by_sig, _signature(_op, args, kwargs))):
                table[key][0] += dt
                table[key][1] += 1
            return out

        ns[fn_name] = timed
    try:
        call()
        by_op.clear()
        by_sig.clear()
        for _ in range(runs):
            call()
    finally:
        ns.update(originals)

    def rows(table):
        return sorted(((k, t / runs, n // runs) for k, (t, n) in table.items()), key=lambda r: -r[1])

    return rows(by_op), rows(by_sig)


def _threads_label(threads: int) -> str:
    return "default" if threads == 0 else str(threads)


def _render(rows, facts, notes, args) -> str:
    command = "python scripts/bench.py"
    if args.backends != "numpy":
        command += f" --backends {args.backends}"
    if args.threads != "0":
        command += f" --threads {args.threads}"
    if args.runs != 20:
        command += f" --runs {args.runs}"
    lines = [
        "# Performance",
        "",
        "Generated by `scripts/bench.py`; regenerate with:",
        "",
        f"    {command}",
        "",
        "Models are exported in-process by `torch.onnx.export(..., dynamo=False)` with seeded random weights;",
        "batch 1. Load+compile is `ml.compile(ml.load_onnx(path), backend, shapes=...)`, median of 3.",
        f"Latency is the median of {args.runs} calls after {args.warmup} warmup calls, onnxruntime and backend",
        "calls interleaved so both see the same machine load; onnxruntime uses",
        "CPUExecutionProvider. Threads \"default\" leaves NumPy's BLAS and onnxruntime's intra-op pool at",
        "their defaults; a number limits both (threadpoolctl, `intra_op_num_threads`).",
        "Ratio is backend / onnxruntime (lower is better).",
        "NumPy's OpenBLAS pool degrades sharply when the CPUs are oversubscribed (load average, recorded",
        "below, above the CPU count), far more than onnxruntime's; the 1-thread rows isolate kernel",
        "efficiency from scheduling.",
        f"Targets: {TARGETS}.",
        "",
        "| Model | Input | Threads | Backend | Load+compile (s) | ORT (ms) | Backend (ms) | Ratio | Max abs diff vs ORT |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['input']} | {r['threads']} | {r['backend']} | {r['compile_s']:.3f} | "
            f"{r['ort_ms']:.2f} | {r['ms']:.2f} | {r['ratio']:.2f}x | {r['diff']:.1e} |"
        )
    lines += ["", "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _load_average() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:
        return "?"


def _limits(threads: int):
    if threads == 0:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="numpy", help=f"comma list from {', '.join(BACKENDS)}")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list from {', '.join(MODELS)}")
    ap.add_argument("--runs", type=int, default=20, help="timed calls per model and runtime")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", default="0",
                    help="comma list of thread limits for BLAS (threadpoolctl) and onnxruntime intra-op; "
                         "0 keeps the defaults (e.g. 0,1)")
    ap.add_argument("--output", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    ap.add_argument("--profile", metavar="MODEL", help="print time per op type and a cProfile of load+compile")
    args = ap.parse_args(argv)

    import onnxruntime as ort
    from rich.console import Console
    from rich.table import Table

    console = Console()
    notes: list[str] = []
    backends = []
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if name not in BACKENDS:
            ap.error(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
        cls = getattr(ml, BACKENDS[name], None)
        if cls is None:
            notes.append(f"backend {name} skipped: mithril has no {BACKENDS[name]} yet")
            continue
        try:
            backends.append((name, cls()))
        except Exception as exc:  # an unavailable device or missing optional dependency
            notes.append(f"backend {name} skipped: {type(exc).__name__}: {exc}")
    for n in notes:
        console.print(f"[yellow]{n}[/yellow]")

    thread_settings = [int(t) for t in args.threads.split(",") if t.strip()]
    model_names = [args.profile] if args.profile else [m.strip() for m in args.models.split(",") if m.strip()]
    load_before = _load_average()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in model_names:
            path, inputs = _export(model, workdir)
            input_desc = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
            for threads in thread_settings:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = threads
                with _limits(threads):
                    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
                    ref = sess.run(None, inputs)
                    runners = {"ort": lambda: sess.run(None, inputs)}
                    compiled = {}
                    for bname, backend in backends:
                        try:
                            compile_s, call, pm = _backend_runner(backend, path, inputs, compile_repeats=3)
                            outs = call()
                        except ml.MithrilError as exc:
                            notes.append(f"{model} on {bname} failed: {type(exc).__name__}: {exc}")
                            console.print(f"[red]{notes[-1]}[/red]")
                            continue
                        diff = max(float(np.max(np.abs(outs[o.name] - r))) for o, r in zip(sess.get_outputs(), ref))
                        runners[bname] = call
                        compiled[bname] = (compile_s, diff, pm)
                    times = _interleaved_times(runners, args.warmup, args.runs)
                    for bname, (compile_s, diff, pm) in compiled.items():
                        rows.append(dict(model=model, input=input_desc, threads=_threads_label(threads),
                                         backend=bname, compile_s=compile_s, ort_ms=times["ort"] * 1e3,
                                         ms=times[bname] * 1e3, ratio=times[bname] / times["ort"], diff=diff))
                        if args.profile:
                            _print_profile(console, pm, runners[bname], path, inputs, dict(backends)[bname])
                    del sess, runners

    table = Table(title="Mithril vs onnxruntime (CPU, batch 1)")
    for col in ("Model", "Threads", "Backend", "Load+compile s", "ORT ms", "Backend ms", "Ratio", "Max abs diff"):
        table.add_column(col, justify="left" if col in ("Model", "Backend") else "right")
    for r in rows:
        table.add_row(r["model"], r["threads"], r["backend"], f"{r['compile_s']:.3f}", f"{r['ort_ms']:.2f}",
                      f"{r['ms']:.2f}", f"{r['ratio']:.2f}x", f"{r['diff']:.1e}")
    console.print(table)
    if not args.no_write and not args.profile:
        facts = _machine_facts() + [("Load average before / after", f"{load_before}; {_load_average()}")]
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_render(rows, facts, notes, args))
        console.print(f"wrote {out}")
    return 0


def _print_profile(console, pm, call, path, inputs, backend) -> None:
    from rich.table import Table

    per_op, per_sig = profile_ops(pm, call)
    total = sum(t for _, t, _ in per_op)
    for title, rows in (("Time per op type per call", per_op), ("Top 20 (op, input shapes) per call", per_sig[:20])):
        table = Table(title=title)
        for col in ("Op", "Calls", "ms", "%"):
            table.add_column(col, justify="left" if col == "Op" else "right")
        for op, t, n in rows:
            table.add_row(op, str(n), f"{t * 1e3:.2f}", f"{100 * t / total:.1f}")
        console.print(table)
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    prof = cProfile.Profile()
    prof.enable()
    ml.compile(ml.load_onnx(path), backend, shapes=shapes)
    prof.disable()
    console.print("[bold]load+compile, cProfile by cumulative time[/bold]")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    sys.exit(main())
