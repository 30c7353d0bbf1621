#!/usr/bin/env python
"""Benchmark Mithril backends against onnxruntime and PyTorch eager on real models; writes docs/performance.md.

    python scripts/bench.py                        # numpy,jax,torch,mlx on every model, writes docs/performance.md
    python scripts/bench.py --quick --no-write     # a few runs per row, to check that everything runs
    python scripts/bench.py --backends torch --models bert,gpt2 --no-write
    python scripts/bench.py --profile resnet18     # time per op type on the NumPy backend (--backends c: in C)
    python scripts/bench.py --training-memory      # only the training-memory section (gradient checkpointing)
    python scripts/bench.py --precision            # only the precision section (float16, bfloat16, float64)
    python scripts/bench.py --c-backend            # only the C section (latency, ResNet-50 build time, arena)
    python scripts/bench.py --mesh                 # only the device-mesh section (JAX strategies on host devices)
    python scripts/bench.py --peers [--write ...]  # every backend beside onnxruntime and its framework's peer, with
                                                   # resident memory (scripts/bench_peers.py; arguments pass through)
    python scripts/bench.py --load-memory [...]    # peak RSS and load time of a 2.5 GB MLP with external data on
                                                   # GGML, NumPy and onnxruntime (scripts/bench_load.py)
    python scripts/bench.py --ggml-load [...]      # GGML and onnxruntime quiet and beside one busy process;
                                                   # writes its section (scripts/bench_ggml_load.py)
    python scripts/bench.py --c-load [...]         # the same for C, 1 and every thread: its own section

Models are exported in-process with the TorchScript exporter (random weights, seeded): ResNet-18 at
224x224 batch 1 and 8, MobileNetV2 at 224x224 batch 1, a small BERT (hidden 64, 2 layers) and a small
GPT-2 (hidden 64, 2 layers) at sequence 128. Every row is timed taking turns with onnxruntime and
PyTorch eager (the torch.nn module the ONNX file came from) in the same process, so ratios compare
runtimes under the same machine load. ``jax-xla-defaults`` is the JAX backend compiled with XLA's
default options (``compiler_options={}``), beside the backend's own CPU defaults. ``--jax-xla-flags``
also runs the JAX rows in two subprocesses, without and with those ``XLA_FLAGS``, since XLA reads
its flags once per process.

The training-memory section measures one ResNet-18 training step (forward and gradients of a
cross-entropy loss) with and without ``gradient_checkpointing=True``, each configuration in a
fresh subprocess; ``--training-memory`` runs only that section and replaces it in
docs/performance.md, leaving the rest of the file as it is (a full run keeps the section it finds).

The precision section runs ResNet-18, BERT and GPT-2 exports on each backend in each dtype it holds
(``Backend(dtype=...)``: the precision pass converts the float32 file, docs/precision.md), timing
the dtypes of one backend in turns and comparing every output with onnxruntime's float32;
``--precision`` runs only that section and replaces it the same way.

The C backend section times ``c`` (``CBackend()``: linked with OpenBLAS when
scipy-openblas32 is installed) and ``c-noblas`` (``MITHRIL_C_BLAS=0``: the kernel library's own
GEMM only) beside NumPy on ResNet-18, MobileNetV2, BERT-Small (4 layers, hidden 512) and GPT-2
(124M, with its LM head) at sequence 128, the models the C bars name, and on the small BERT
and GPT-2 above, where per-call overhead shows (each taking turns with onnxruntime, default and 1
thread; 3 s of timing per row unless --row-seconds; C compiled with inference=True and the file's
initializers as constant_keys: weights fixed at compile, as in onnxruntime's session), builds ResNet-50
with an empty ``MITHRIL_CACHE_DIR`` (the C compiler runs) and again from that cache, and reports
ResNet-18's arena bytes against the naive sum of its intermediates; ``--c-backend`` runs only that
section and replaces it the same way. A full run has the C rows in its tables too.

Long sections print one progress line per measurement on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import os
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mithril as ml  # noqa: E402
from mithril.compile import JitFallbackWarning  # noqa: E402
from mithril.dtypes import is_floating_np  # noqa: E402

# name -> (attribute of `mithril` holding the backend class, constructor kwargs); a backend that
# mithril lacks or whose framework is not installed is skipped with a note.
BACKENDS = {
    "numpy": ("NumpyBackend", {}),
    "jax": ("JaxBackend", {}),
    # XLA's own defaults (YNNPACK fusions on, no XNNPACK convolutions; the Conv kernel then uses
    # im2col throughout): what the JAX backend's CPU compiler_options change.
    "jax-xla-defaults": ("JaxBackend", {"compiler_options": {}}),
    "torch": ("TorchBackend", {}),
    "torch-compile": ("TorchBackend", {"compile": True}),
    # Op by op where the default runs a convolutional model as a oneDNN graph (its time against memory).
    "torch-op-by-op": ("TorchBackend", {"onednn_graph": False}),
    "mlx": ("MlxBackend", {}),
    "c": ("CBackend", {}),
    "c-noblas": ("CBackend", {}),  # built with MITHRIL_C_BLAS=0 (BUILD_ENV)
    "ggml": ("GGMLBackend", {}),
    "ggml-q8_0": ("GGMLBackend", {"quantize": "q8_0"}),
    "ggml-q4_0": ("GGMLBackend", {"quantize": "q4_0"}),
    "ggml-q4_K": ("GGMLBackend", {"quantize": "q4_K"}),
    # ggml-python's own ONNX runtime (ggml.contrib.onnx), the GGML backend's peer: not a Mithril backend.
    "ggml-contrib": ("", {}),
}
DEFAULT_BACKENDS = "numpy,jax,jax-xla-defaults,torch,mlx,c"
# Backends whose thread pools --threads limits (BLAS through threadpoolctl, torch.set_num_threads,
# the C backend's num_threads); JAX (XLA) and MLX fix theirs at start-up, so they run at their defaults only.
THREAD_LIMITED = {"numpy", "torch", "torch-compile", "c", "c-noblas", "ggml", "ggml-q8_0", "ggml-q4_0", "ggml-q4_K"}
# Backends given the row's thread count as ``num_threads=`` (0, "default": every usable CPU, which is
# OpenMP's default, said explicitly because omp_set_num_threads from an earlier row would stay set).
NUM_THREADS_OPTION = {"c", "c-noblas", "ggml", "ggml-q8_0", "ggml-q4_0", "ggml-q4_K"}
# Environment variables set while a backend's row is built (the C backend reads MITHRIL_C_BLAS then).
BUILD_ENV = {"c-noblas": {"MITHRIL_C_BLAS": "0"}}
C_TARGET = 1.5  # C backend latency / onnxruntime, issue 18
C_COLD_TARGET_S = 10.0  # ResNet-50 cold compile on C (C compiler included), issue 18
C_CACHED_TARGET_S = 0.5  # ResNet-50 compile from the cache, issue 18
EAGER = "pytorch-eager"
EAGER_PEERS = {"torch", "torch-compile"}  # rows timed interleaved with PyTorch eager as well


@dataclass(frozen=True)
class Case:
    arch: str  # models_zoo.torch_reference.build name; the batch axis of the export is dynamic
    build: dict
    batch: int
    exporter: str = "torchscript"  # torch.onnx's exporter: "torchscript" or "dynamo"


MODELS = {
    "resnet18": Case("resnet18", {"image_size": 224}, 1),
    "resnet18_b8": Case("resnet18", {"image_size": 224}, 8),
    "mobilenet_v2": Case("mobilenet_v2", {"image_size": 224}, 1),
    "bert": Case("bert", {"seq": 128}, 1),
    "gpt2": Case("gpt2", {"seq": 128}, 1),
    # The published sizes, the C section's (issue 18 names BERT-small and GPT-2).
    "bert_small": Case("bert_small", {"seq": 128}, 1),
    "gpt2_124m": Case("gpt2_124m", {"seq": 128}, 1),
    # The same files from torch.onnx's dynamo exporter (the GGML section: any exporter's file).
    "bert_small_dynamo": Case("bert_small", {"seq": 128}, 1, "dynamo"),
    "gpt2_124m_dynamo": Case("gpt2_124m", {"seq": 128}, 1, "dynamo"),
}

JAX_TARGET = 1.5  # JAX (jit) latency / onnxruntime, issue 3
TORCH_TARGET = 1.0  # Torch backend latency / PyTorch eager, issue 3
NUMPY_TARGET = 3.0  # NumPy resnet18 latency / onnxruntime, issue 2
COMPILE_TARGET_S = 1.0  # NumPy resnet18 load+compile, issue 2


def _export(case: Case, workdir: str, cache: dict) -> tuple[str, object, dict[str, np.ndarray]]:
    """The ONNX file, the torch.nn module it came from, and seeded inputs at the case's batch."""
    from models_zoo import torch_reference as models

    key = (case.arch, tuple(sorted(case.build.items())), case.exporter)
    if key not in cache:
        spec = models.build(case.arch, **case.build)
        path = os.path.join(workdir, f"{case.arch}_{len(cache)}.onnx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            models.export_onnx(spec, case.exporter, path)
        cache[key] = (path, spec)
    path, spec = cache[key]
    return path, spec, spec.numpy_inputs(case.batch)


def _to_numpy_outputs(backend, outputs) -> dict[str, np.ndarray]:
    # to_numpy waits for asynchronous backends (JAX, MLX) to finish.
    return {k: backend.to_numpy(v) for k, v in outputs.items()}


def _c_constants(backend, model) -> dict:
    """``constant_keys``: every initializer of ``model`` on C (see _backend_row), none elsewhere."""
    return {"constant_keys": list(model.initializer_names)} if backend.name == "c" else {}


def jax_program_options(path: str) -> dict:
    """The XLA options JaxBackend compiles ``path``'s forward program with: its defaults fitted to
    the program (a transformer's differ from a CNN's), which a port run "under JaxBackend's
    options" must take too."""
    backend = ml.JaxBackend()
    pm = ml.compile(ml.load_onnx(path), backend)
    jitted = pm._jitted  # None where the model runs eagerly: then the backend's own options
    return dict(jitted.compiler_options if jitted is not None else backend.compiler_options)


def _backend_row(backend, path: str, inputs: dict[str, np.ndarray], compile_repeats: int):
    """Load+compile seconds (the first compile, median with further ones when repeated), first-call
    seconds (the first evaluate of the first compiled model: where jax.jit and mx.compile compile),
    the steady call, and the first call's outputs."""
    shapes = {k: list(v.shape) for k, v in inputs.items()}

    def load_compile():
        # C renders and builds the gradient program at compile unless told it is inference only;
        # GGML is inference only. C takes the file's weights as constants, fixed at compile as in
        # onnxruntime's session, so that it packs them once (NCHWc convolutions).
        static = backend.needs_static_shapes
        model = ml.load_onnx(path)
        return ml.compile(model, backend, shapes=shapes, static_shapes=static, inference=True if static else None,
                          **_c_constants(backend, model))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", JitFallbackWarning)
        t = time.perf_counter()
        pm = load_compile()
        compile_times = [time.perf_counter() - t]
        params = pm.get_parameters()
        data = {k: backend.from_numpy(v) for k, v in inputs.items()}
        t = time.perf_counter()
        outs = _to_numpy_outputs(backend, pm.evaluate(params, data))
        first_s = time.perf_counter() - t
    # A row that fell back to op-by-op execution is not a jit measurement: say so.
    fallbacks = [str(w.message)[:200] for w in caught if issubclass(w.category, JitFallbackWarning)]
    for _ in range(compile_repeats - 1):  # compile only: a jit compiles on its first call
        t = time.perf_counter()
        load_compile()
        compile_times.append(time.perf_counter() - t)

    def call():
        return _to_numpy_outputs(backend, pm.evaluate(params, data))

    call.weight_bytes = pm.memory_report().weight_bytes  # the GGML section compares stored weight types
    call.profile_target = (pm, params, data)  # what ml.profile times (bench_peers' hot ops)
    return statistics.median(compile_times), first_s, call, outs, fallbacks


def _eager_row(spec, inputs: dict[str, np.ndarray]):
    """The torch.nn module itself under torch.no_grad, on the same inputs: first-call seconds, the
    call, and its outputs in the ONNX output order."""
    import torch

    tensors = [torch.from_numpy(inputs[k]) for k in spec.inputs]

    def call():
        with torch.no_grad():
            out = spec.module(*tensors)
        return out if isinstance(out, tuple) else (out,)

    t = time.perf_counter()
    out = call()
    first_s = time.perf_counter() - t
    return first_s, call, {k: v.numpy() for k, v in zip(spec.output_names, out)}


# Each runtime's turn starts with untimed calls for LEAD_IN_S, then times calls for about BLOCK_S.
# The lead-in absorbs what the previous turn leaves behind: onnxruntime's and torch's idle workers
# keep spinning for tens of milliseconds after a call and take a core from whoever runs next, and
# XLA's pool needs a few calls to get back to speed after a pause. Measured on this 2-CPU VM,
# MobileNetV2 on JAX: the calls after a 0.2 s turn of onnxruntime (or a 0.2 s sleep) take 8-17 ms
# for the first 30-60 ms, then 6.8 ms; onnxruntime's own first call after a pause is 6 ms, then 4.7.
LEAD_IN_S = 0.1
BLOCK_S = 0.2
# Calls this slow are all timed: a neighbour's leftovers are a small part of them.
LONG_CALL_S = 0.5


def _progress(message: str) -> None:
    """One line on stderr per measurement of a long section, so a run shows where it is."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _interleaved_times(runners: dict, warmup: int, min_runs: int, max_runs: int, row_seconds: float):
    """Median seconds per call of each runner and the number of timed calls per runner.

    The runners take turns in blocks, so every runtime sees the same machine load. Each block
    begins with untimed calls for LEAD_IN_S (at least one; none for calls of LONG_CALL_S or more)
    and then times calls for about BLOCK_S. Blocks are sized by each runner's fastest warmup call,
    made back to back. The row takes about ``row_seconds`` of timed calls (``min_runs`` to
    ``max_runs`` per runner)."""
    per_call = {}
    round_s = 0.0
    for name, fn in runners.items():  # two calls each, to choose the warmup: the faster counts
        for _ in range(2):  # (a runtime may still set up at its second: Mithril Torch's oneDNN graph)
            t = time.perf_counter()
            fn()
            per_call[name] = min(per_call.get(name, math.inf), time.perf_counter() - t)
        round_s += per_call[name]
    extra = max(warmup - 1, 0) if round_s * warmup < row_seconds / 2 else 0
    for name, fn in runners.items():
        for _ in range(extra):
            t = time.perf_counter()
            fn()
            per_call[name] = min(per_call[name], time.perf_counter() - t)
    round_s = sum(per_call.values())
    want = max(min_runs, min(max_runs, int(row_seconds / max(round_s, 1e-9))))
    times: dict[str, list[float]] = {k: [] for k in runners}
    while min(len(v) for v in times.values()) < want:
        for name, fn in runners.items():
            if per_call[name] < LONG_CALL_S:
                lead_in_end = time.perf_counter() + LEAD_IN_S
                fn()
                while time.perf_counter() < lead_in_end:
                    fn()
            for _ in range(max(1, min(want - len(times[name]), int(BLOCK_S / max(per_call[name], 1e-9))))):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}, want


def _max_diff(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(outs[k], np.float64) - r))) for k, r in ref.items())


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



def _machine_facts() -> list[tuple[str, str]]:
    import importlib.metadata as metadata

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        cpu = info.get("model name", cpu)
        # A bare "AMD EPYC" under a hypervisor: the family tells Zen 4 (25) from Zen 5 (26).
        if "cpu family" in info:
            cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    except OSError:
        pass
    facts = [
        ("CPU", cpu),
        ("CPU count (os.cpu_count)", str(os.cpu_count())),
        ("Usable CPUs (sched_getaffinity)", str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "?"),
        ("Python", platform.python_version()),
        ("mithril", ml.__version__),
    ]
    for dist in ("numpy", "onnx", "onnxruntime", "torch", "jax", "jaxlib", "mlx", "transformers", "scipy-openblas32"):
        try:
            facts.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            facts.append((dist, "not installed"))
    facts.append(("XLA_FLAGS of the main process", os.environ.get("XLA_FLAGS") or "(unset)"))
    # The kernels OpenBLAS runs: its own pick for the CPU unless OPENBLAS_CORETYPE forces one (a
    # machine that sets it to Haswell on an AVX-512 CPU halves the single-thread sgemm rate).
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        facts.append((var, os.environ.get(var) or "(unset)"))
    from threadpoolctl import threadpool_info
    blas = [f"{p['prefix']} {p['version']} ({p.get('architecture') or '?'} kernels)"
            for p in threadpool_info() if p["user_api"] == "blas"]
    facts.append(("BLAS libraries loaded (threadpoolctl)", ", ".join(blas) or "none found"))
    return facts


def _load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def _fmt_load(load) -> str:
    return "?" if load is None else " / ".join(f"{v:.2f}" for v in load)


@contextlib.contextmanager
def _limits(threads: int):
    """Limit BLAS pools (threadpoolctl) and torch's intra-op pool to ``threads``; 0 changes nothing."""
    if threads == 0:
        yield
        return
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)


def _threads_label(threads: int) -> str:
    return "default" if threads == 0 else str(threads)


def _make_backends(names: list[str], notes: list[str]) -> list[tuple[str, object]]:
    backends = []
    for name in names:
        attr, kwargs = BACKENDS[name]
        if name == "ggml-contrib":
            try:
                import ggml.contrib.onnx  # noqa: F401
                backends.append((name, None))
            except Exception as exc:
                notes.append(f"ggml-contrib skipped: {type(exc).__name__}: {exc}")
            continue
        cls = getattr(ml, attr, None)
        if cls is None:
            notes.append(f"backend {name} skipped: mithril has no {attr} yet")
            continue
        try:
            backends.append((name, cls(**kwargs)))
        except Exception as exc:  # framework not installed, device not present
            notes.append(f"backend {name} skipped: {type(exc).__name__}: {exc}")
    return backends


def run_benchmark(args, backends, model_names, notes) -> list[dict]:
    """One row per (model, threads, backend), plus a PyTorch eager row per (model, threads)."""
    import onnxruntime as ort

    rows = []
    cache: dict = {}
    with tempfile.TemporaryDirectory() as workdir:
        for model in model_names:
            path, spec, inputs = _export(MODELS[model], workdir, cache)
            input_desc = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
            load = _load_average()
            for threads in args.thread_settings:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = threads
                with _limits(threads):
                    t = time.perf_counter()
                    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
                    ort_load_s = time.perf_counter() - t
                    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
                    ort_call = lambda: sess.run(None, inputs)  # noqa: E731
                    eager = None
                    if not args.no_eager:
                        eager_first_s, eager, eager_outs = _eager_row(spec, inputs)
                        candidates = [(EAGER, lambda r=(None, eager_first_s, eager, eager_outs, []): r)]
                    else:
                        candidates = []
                    for bname, backend in backends:
                        if threads != 0 and bname not in THREAD_LIMITED:
                            continue
                        if bname == "ggml-contrib":
                            _progress(f"{model} ({input_desc}), {_threads_label(threads)} threads: {bname}")
                            peer = _ggml_contrib_row(path, inputs, threads, args)
                            if "error" in peer:
                                notes.append(f"{model} on ggml-contrib failed: {peer['error']}")
                                print(notes[-1], flush=True)
                                continue
                            rows.append(dict(model=model, input=input_desc, threads=_threads_label(threads),
                                             backend=bname, ratio=peer["ms"] / peer["ort_ms"], eager_ms=None,
                                             vs_eager=None, ort_load_s=ort_load_s, load=load, weight_bytes=None,
                                             xla_flags=os.environ.get("XLA_FLAGS", ""), **peer))
                            print(_row_line(rows[-1]), flush=True)
                            continue
                        if bname in NUM_THREADS_OPTION:
                            backend = _backend_with_threads(bname, threads)
                        candidates.append((bname, lambda b=backend, n=bname: _with_env(
                            BUILD_ENV.get(n, {}), _backend_row, b, path, inputs, args.compile_repeats)))
                    for bname, prepare in candidates:
                        _progress(f"{model} ({input_desc}), {_threads_label(threads)} threads: {bname}")
                        try:
                            compile_s, first_s, call, outs, fallbacks = prepare()
                        except Exception as exc:  # one failing backend must not end the benchmark
                            notes.append(f"{model} on {bname} failed: {type(exc).__name__}: {str(exc)[:300]}")
                            print(notes[-1], flush=True)
                            continue
                        for msg in fallbacks:
                            notes.append(f"{model} on {bname} ({_threads_label(threads)} threads) ran un-jitted: {msg}")
                            print(notes[-1], flush=True)
                        runners = {"ort": ort_call}
                        # Only Torch rows run next to eager: torch's spinning OpenMP pool would slow its neighbours.
                        if eager is not None and bname in EAGER_PEERS:
                            runners[EAGER] = eager
                        runners[bname] = call
                        times, runs = _interleaved_times(runners, args.warmup, args.min_runs, args.runs,
                                                         args.row_seconds)
                        row = dict(model=model, input=input_desc, threads=_threads_label(threads), backend=bname,
                                   compile_s=compile_s, first_s=first_s, ms=times[bname] * 1e3, runs=runs,
                                   ort_ms=times["ort"] * 1e3, ratio=times[bname] / times["ort"],
                                   eager_ms=times[EAGER] * 1e3 if EAGER in times else None,
                                   vs_eager=times[bname] / times[EAGER] if EAGER in times else None,
                                   diff=_max_diff(outs, ref), ort_load_s=ort_load_s, load=load,
                                   weight_bytes=getattr(call, "weight_bytes", None),
                                   xla_flags=os.environ.get("XLA_FLAGS", ""))
                        rows.append(row)
                        print(_row_line(row), flush=True)
                        del call, runners
                    del sess, ort_call, eager
    return rows


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _backend_with_threads(name: str, threads: int):
    """A fresh ``name`` backend with ``num_threads=threads`` (0: every usable CPU)."""
    attr, kwargs = BACKENDS[name]
    return getattr(ml, attr)(**kwargs, num_threads=threads or _usable_cpus())


def _ggml_contrib_child(path: str, inputs: dict[str, np.ndarray], threads: int, timing: tuple, conn) -> None:
    """In a child process: ggml.contrib.onnx (ggml-python's ONNX runtime, with its NumPy fallback,
    at its own thread count) on ``path``, timed in turns with onnxruntime; sends the row's numbers.
    A child, because a failed GGML_ASSERT in the peer aborts its process."""
    import onnx
    import onnxruntime as ort
    from ggml.contrib.onnx import GgmlRuntimeBackend

    try:
        t = time.perf_counter()
        rep = GgmlRuntimeBackend.prepare(onnx.load(path))
        compile_s = time.perf_counter() - t
        names = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
        t = time.perf_counter()
        outs = dict(zip(names, rep.run(inputs)))
        first_s = time.perf_counter() - t
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        times, runs = _interleaved_times({"ort": lambda: sess.run(None, inputs), "peer": lambda: rep.run(inputs)},
                                         *timing)
        conn.send(dict(compile_s=compile_s, first_s=first_s, ms=times["peer"] * 1e3, ort_ms=times["ort"] * 1e3,
                       runs=runs, diff=_max_diff(outs, ref)))
    except Exception as exc:  # reported as the row's failure
        conn.send(dict(error=f"{type(exc).__name__}: {str(exc)[:300]}"))


def _ggml_contrib_row(path: str, inputs: dict[str, np.ndarray], threads: int, args) -> dict:
    """The ggml.contrib.onnx row's numbers from :func:`_ggml_contrib_child`, or ``error``: why not."""
    import multiprocessing as mp

    # spawn, not fork: a child forked from this process (ggml, onnxruntime and OpenMP threads
    # running) deadlocked before its first call.
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # an abort is reported, not debugged with gdb
    proc = ctx.Process(target=_ggml_contrib_child, args=(path, inputs, threads, (
        args.warmup, args.min_runs, args.runs, args.row_seconds), child))
    proc.start()
    child.close()
    try:
        result = parent.recv() if parent.poll(900) else None
    except EOFError:  # the child died before sending
        result = None
    if result is None and proc.is_alive():
        proc.kill()
    proc.join(60)
    if result is None:
        return dict(error=f"its process ended with status {proc.exitcode} (a GGML_ASSERT aborts the process; "
                          "-9: stopped after 15 minutes)")
    return result


@contextlib.contextmanager
def _with_env_ctx(env: dict):
    """The variables of ``env`` set inside the block, restored after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _with_env(env: dict, fn, *args):
    """``fn(*args)`` with the variables of ``env`` set, restored after."""
    with _with_env_ctx(env):
        return fn(*args)


def _row_line(r: dict) -> str:
    eager = f", {r['vs_eager']:.2f}x eager" if r["vs_eager"] is not None else ""
    first = f"first call {r['first_s']:.2f} s, " if r["first_s"] is not None else ""
    return (f"{r['model']:<13} {r['threads']:<7} {r['backend']:<14} {first}{r['ms']:.2f} ms "
            f"(ort {r['ort_ms']:.2f} ms) = {r['ratio']:.2f}x ort{eager}, {r['runs']} runs")


def run_jax_subprocesses(args, model_names, notes) -> dict[str, list[dict]]:
    """The JAX rows in fresh processes without and with ``args.jax_xla_flags`` (XLA reads
    XLA_FLAGS once per process); label -> rows."""
    results = {}
    for label, flags in (("default", None), (args.jax_xla_flags, args.jax_xla_flags)):
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        if flags:
            env["XLA_FLAGS"] = flags
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [sys.executable, str(Path(__file__).resolve()), "--backends", "jax", "--models", ",".join(model_names),
               "--threads", "0", "--no-eager", "--json", out, "--runs", str(args.runs), "--min-runs",
               str(args.min_runs), "--warmup", str(args.warmup), "--row-seconds", str(args.row_seconds),
               "--compile-repeats", str(args.compile_repeats)]
        print(f"JAX subprocess, XLA_FLAGS={flags or '(unset)'}", flush=True)
        _progress(f"JAX subprocess, XLA_FLAGS={flags or '(unset)'}")
        proc = subprocess.run(cmd, env=env)
        try:
            child = json.loads(Path(out).read_text()) if proc.returncode == 0 else {"rows": [], "notes": []}
            results[label] = child["rows"]
            notes.extend(f"JAX subprocess with XLA_FLAGS={flags or '(unset)'}: {n}" for n in child["notes"])
            if proc.returncode != 0:
                notes.append(f"JAX subprocess with XLA_FLAGS={flags or '(unset)'} exited with {proc.returncode}")
        finally:
            os.unlink(out)
    return results


def _find(rows, model, backend, threads="default"):
    return next((r for r in rows if r["model"] == model and r["backend"] == backend and r["threads"] == threads), None)


def _targets(rows, model_names, backend_names, jax_sub) -> list[tuple[str, str, str, str, str]]:
    """(issue, target, model, measured, verdict) computed from the rows."""
    out = []
    if "numpy" in backend_names and "resnet18" in model_names:
        r = _find(rows, "resnet18", "numpy")
        if r is not None:
            ok = r["compile_s"] < COMPILE_TARGET_S
            out.append(("2", f"NumPy load+compile < {COMPILE_TARGET_S:g} s", "resnet18", f"{r['compile_s']:.3f} s",
                        "met" if ok else "NOT met"))
        by_threads = [x for x in rows if x["model"] == "resnet18" and x["backend"] == "numpy"]
        if by_threads:
            measured = ", ".join(f"{x['ratio']:.2f}x at {x['threads']} thread{'s' if x['threads'] != '1' else ''}"
                                 for x in by_threads)
            met = [x["threads"] for x in by_threads if x["ratio"] <= NUMPY_TARGET]
            if len(met) == len(by_threads):
                verdict = "met"
            elif met:
                verdict = f"NOT met at default threads (met at {', '.join(met)} thread{'s' if met != ['1'] else ''})"
            else:
                verdict = "NOT met"
            out.append(("2", f"NumPy latency <= {NUMPY_TARGET:g}x onnxruntime", "resnet18", measured, verdict))
    for model in model_names:
        if "torch" in backend_names:
            r = _find(rows, model, "torch")
            if r is None or r["vs_eager"] is None:
                out.append(("3", "Torch backend <= PyTorch eager", model, "not measured", "not measured"))
                continue
            others = [x for x in rows if x["model"] == model and x["backend"] == "torch" and x["threads"] != "default"
                      and x["vs_eager"] is not None]
            measured = f"{r['vs_eager']:.2f}x eager ({r['ms']:.2f} vs {r['eager_ms']:.2f} ms)"
            measured += "".join(f"; {x['vs_eager']:.2f}x at {x['threads']} thread" for x in others)
            verdict = "met" if r["vs_eager"] <= TORCH_TARGET else "NOT met"
            if others:
                verdict = f"{verdict} at default threads; " + "; ".join(
                    f"{'met' if x['vs_eager'] <= TORCH_TARGET else 'NOT met'} at {x['threads']} thread" for x in others)
            out.append(("3", "Torch backend <= PyTorch eager", model, measured, verdict))
    for model in model_names:
        if "jax" in backend_names:
            r = _find(rows, model, "jax")
            extra = []
            xla_defaults = _find(rows, model, "jax-xla-defaults")
            if xla_defaults is not None:
                extra.append(f"{xla_defaults['ratio']:.2f}x with XLA's default options")
            for label, sub in jax_sub.items():
                s = _find(sub, model, "jax")
                if s is not None:
                    extra.append(f"{s['ratio']:.2f}x subprocess {'XLA_FLAGS=' + label if label != 'default' else 'default'}")
            measured = "not measured" if r is None else f"{r['ratio']:.2f}x"
            if extra:
                measured += " (" + "; ".join(extra) + ")"
            verdict = "not measured" if r is None else ("met" if r["ratio"] <= JAX_TARGET else "NOT met")
            out.append(("3", f"JAX (jit) <= {JAX_TARGET:g}x onnxruntime", model, measured, verdict))
    for cname in ("c", "c-noblas"):
        if cname not in backend_names:
            continue
        for model in [m for m in model_names if m in C_TARGET_MODELS]:
            by_threads = [x for x in rows if x["model"] == model and x["backend"] == cname]
            if not by_threads:
                out.append(("18", f"C ({cname}) <= {C_TARGET:g}x onnxruntime", model, "not measured", "not measured"))
                continue
            measured = ", ".join(f"{x['ratio']:.2f}x at {x['threads']} thread{'s' if x['threads'] != '1' else ''}"
                                 for x in by_threads)
            met = [x["threads"] for x in by_threads if x["ratio"] <= C_TARGET]
            verdict = ("met" if len(met) == len(by_threads) else f"met at {', '.join(met)} only" if met
                       else "NOT met")
            out.append(("18", f"C ({cname}) <= {C_TARGET:g}x onnxruntime", model, measured, verdict))
            if "numpy" in backend_names:
                pairs = [(x, _find(rows, model, "numpy", x["threads"])) for x in by_threads]
                pairs = [(x, n) for x, n in pairs if n is not None]
                # By the two medians, not by their ratios to onnxruntime: in NumPy's rounds onnxruntime
                # shares the cores with OpenBLAS's threads, which spin on after each of NumPy's matmuls
                # (the likely cause), and at 2 threads ran as if on one (bert_small 19.17 ms there, 10.99-11.69 in C's
                # rounds, 02:19 UTC on 2026-12-03), which flattered NumPy's ratio (1.64x; 31.35 ms
                # against C's 19.26).
                if pairs:
                    measured = ", ".join(f"{x['ms']:.2f} ms vs NumPy {n['ms']:.2f} ms at {x['threads']} "
                                         f"thread{'s' if x['threads'] != '1' else ''}" for x, n in pairs)
                    faster = all(x["ms"] < n["ms"] for x, n in pairs)
                    out.append(("18", f"C ({cname}) faster than NumPy", model, measured, "met" if faster else "NOT met"))
    for model in model_names:
        if "mlx" in backend_names:
            r = _find(rows, model, "mlx")
            out.append(("3", "MLX reported", model, "not measured" if r is None else
                        f"{r['ratio']:.2f}x onnxruntime, first call {r['first_s']:.2f} s",
                        "reported" if r is not None else "NOT reported"))
    return out


def _f(v, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _render(rows, targets, jax_sub, facts, notes, args, loads, started: str) -> str:
    command = "python scripts/bench.py" + "".join(" " + shlex.quote(a) for a in args.argv)
    load_start, load_end = loads
    lines = [
        "# Performance",
        "",
        f"Generated by `scripts/bench.py` ({started}); regenerate with:",
        "",
        f"    {command}",
        "",
        f"**Read the ratios, not the absolute times.** This is a shared {os.cpu_count()}-CPU machine on which other",
        "sessions run their own jobs; absolute times drift with their load (load average, 1 / 5 / 15 min:",
        f"{_fmt_load(load_start)} at the start, {_fmt_load(load_end)} at the end), while each ratio compares",
        "runtimes timed in the same process, taking turns, under the same load. The load average",
        "counts this benchmark's own threads too (about 2 while it runs).",
    ]
    peak = max([x[0] for x in [load_start, load_end] + [r["load"] for r in rows] if x] or [0.0])
    if peak >= (os.cpu_count() or 1):
        lines += ["", f"The 1-minute load average reached {peak:.2f} on {os.cpu_count()} CPUs during this run: the machine "
                  "was oversubscribed, so even ratios are noisier than usual. Spinning thread pools (OpenBLAS, "
                  "torch's OpenMP pool, so NumPy, Torch and PyTorch eager) suffer most at default threads; the "
                  "1-thread rows are the steadier comparison."]
    if args.quick:
        lines += ["", "This is a `--quick` run (few calls per row): a smoke test, not a measurement."]
    lines += ["", "One report: this command rewrites the Machine, Bars, Results and Threads sections; every other",
              "section names the command that regenerates it (`--peers --write`, `--c-backend`, `--ggml-backend`,",
              "`--training-memory`, `--precision`, `--mesh`) and is kept as found. \"Why a backend is slower than",
              "its peer\" is written by hand from the Peers section's profiles."]
    lines += ["", "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts]
    lines += ["", "## Bars", "",
              "Computed from the Results below (the C, GGML and memory bars are in their own sections).", "",
              "| Bar | Model | Measured | Met |", "|---|---|---|---|"]
    lines += [f"| {t} | {m} | {v} | {verdict} |" for _, t, m, v, verdict in targets]
    lines += ["", "## Results", "",
              "Load+compile: `ml.compile(ml.load_onnx(path), backend, shapes=...)` with its defaults (jit=True; NumPy",
              f"also builds its gradient program), median of {args.compile_repeats}. First call: the first `evaluate`",
              "of the first compiled model, outputs converted to NumPy; jax.jit and mx.compile compile here.",
              "Latency: median of Runs timed calls per runtime. onnxruntime and the backend (and PyTorch eager, in",
              f"the Torch rows) take turns in blocks of about {BLOCK_S:g} s of timed calls. Below {LONG_CALL_S:g} s",
              f"a call, each block starts with {LEAD_IN_S:g} s of untimed calls (at least one): they absorb what the",
              "previous turn leaves behind. onnxruntime's and torch's idle workers keep spinning for tens of",
              "milliseconds after a call and take a core from the next runtime, and XLA's pool needs a few calls",
              "to get back to speed after a pause (MobileNetV2 on JAX: 8-17 ms calls for the first 30-60 ms, then",
              f"6.8 ms). Each row times about {args.row_seconds:g} s of calls: at least {args.min_runs} and at most",
              f"{args.runs} timed calls, after up to {args.warmup} warmup calls, so slow rows get fewer.",
              "vs ORT and vs eager: backend time / onnxruntime's or PyTorch eager's in the same rounds (lower is",
              "better). Max abs diff: largest difference from onnxruntime's outputs. jax-xla-defaults: the JAX",
              "backend with `compiler_options={}`, XLA's defaults (YNNPACK fusions on, no XNNPACK convolutions),",
              "beside its own CPU default. c: `CBackend(num_threads=...)` compiled with `static_shapes=True`,",
              "`inference=True` and `constant_keys=` every initializer of the file (weights fixed at compile, as",
              "in onnxruntime's session: the C program packs them once for its NCHWc convolutions),",
              "linked with OpenBLAS when scipy-openblas32 is installed (Machine lists it); c-noblas: the same",
              "built with `MITHRIL_C_BLAS=0` (the kernel library's own blocked GEMM). Load+compile of the C rows",
              "is from the C cache after the first build (the first includes the C compiler).",
              ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        mrows = [r for r in rows if r["model"] == model]
        first = mrows[0]
        lines += [f"### {model}", "",
                  f"Input {first['input']}; onnxruntime session creation {first['ort_load_s']:.3f} s; load average "
                  f"at the start of this model {_fmt_load(first['load'])}.", "",
                  "| Backend | Threads | Load+compile (s) | First call (s) | Latency (ms) | Runs | ORT (ms) | vs ORT "
                  "| Eager (ms) | vs eager | Max abs diff |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in mrows:
            name = "PyTorch eager (baseline)" if r["backend"] == EAGER else r["backend"]
            lines.append(f"| {name} | {r['threads']} | {_f(r['compile_s'], '.3f')} | {_f(r['first_s'], '.3f')} | "
                         f"{r['ms']:.2f} | {r['runs']} | {r['ort_ms']:.2f} | {r['ratio']:.2f}x | "
                         f"{_f(r['eager_ms'], '.2f')} | {_f(r['vs_eager'], '.2f')}{'x' if r['vs_eager'] else ''} | "
                         f"{r['diff']:.1e} |")
        lines.append("")
    if jax_sub:
        labels = list(jax_sub)
        lines += ["## JAX on CPU with and without XLA flags", "",
                  "The JAX rows again, each setting in a fresh subprocess (XLA reads `XLA_FLAGS` once per process),",
                  "JAX taking turns with onnxruntime only. \"default\" leaves `XLA_FLAGS` unset, which is what",
                  f"`ml.JaxBackend()` runs with; the other rows set `XLA_FLAGS={labels[-1]}` for the whole process.",
                  "The backend's defaults are not changed by this benchmark; the Bars table judges the default.", "",
                  "| Model | XLA_FLAGS | JAX (ms) | ORT (ms) | vs ORT | First call (s) | Runs |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for model in dict.fromkeys(r["model"] for r in rows):
            for lab in labels:
                s = _find(jax_sub[lab], model, "jax")
                flags = "(unset)" if lab == "default" else f"`{lab}`"
                lines.append(f"| {model} | {flags} | — | — | — | — | — |" if s is None else
                             f"| {model} | {flags} | {s['ms']:.2f} | {s['ort_ms']:.2f} | {s['ratio']:.2f}x | "
                             f"{s['first_s']:.2f} | {s['runs']} |")
        lines += ["", *_xla_summary(rows, jax_sub, labels)]
        lines.append("")
    lines += ["## Threads", "",
              "\"default\" leaves every pool at its default (onnxruntime's intra-op pool, OpenBLAS, torch, XLA, MLX).",
              "A number limits onnxruntime's `intra_op_num_threads`, BLAS pools (threadpoolctl) and torch's",
              "intra-op pool (`torch.set_num_threads`, PyTorch eager included) and the C backend's OpenMP threads",
              f"(`CBackend(num_threads=...)`; at \"default\" every usable CPU); only {', '.join(sorted(THREAD_LIMITED))}",
              "get such rows (XLA and MLX fix their pools at start-up). Spinning thread pools (OpenBLAS, torch's",
              "OpenMP) degrade sharply when the CPUs are oversubscribed, far more than onnxruntime's; the 1-thread",
              "rows isolate kernel efficiency from scheduling."]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _xla_summary(rows, jax_sub, labels) -> list[str]:
    """Computed reading of the XLA flags table, with how far two runs of the same setting disagree."""
    if len(labels) < 2:
        return []
    default, flagged = labels[0], labels[-1]
    pairs = [(_find(jax_sub[default], m, "jax"), _find(jax_sub[flagged], m, "jax"), _find(rows, m, "jax"))
             for m in dict.fromkeys(r["model"] for r in rows)]
    pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
    if not pairs:
        return []
    faster = sum(f["ratio"] < d["ratio"] for d, f, _ in pairs)
    gmean = float(np.exp(np.mean([np.log(f["ratio"] / d["ratio"]) for d, f, _ in pairs])))
    out = [f"With `{flagged}` the JAX/onnxruntime ratio was lower on {faster} of {len(pairs)} models; geometric "
           f"mean of (with flag / without) {gmean:.2f}x."]
    same = [max(d["ratio"], m["ratio"]) / min(d["ratio"], m["ratio"]) for d, _, m in pairs if m is not None]
    if same:
        out.append(f"For scale, the same default setting measured twice (the main process's JAX row and this "
                   f"subprocess's) disagrees by up to {max(same):.2f}x on one model; differences smaller than that "
                   "are noise on this machine.")
    return out


# -- C backend: build time and arena (issue 18) ----------------------------------------------------

C_HEADING = "## C backend"
C_MODELS = ("resnet18", "mobilenet_v2", "bert_small", "gpt2_124m", "bert", "gpt2")
C_TARGET_MODELS = ("resnet18", "mobilenet_v2", "bert_small", "gpt2_124m")  # the models issue 18's bar names
C_BACKENDS = ("numpy", "c", "c-noblas")


def _resnet50_onnx(workdir: str) -> tuple[str, dict[str, np.ndarray]]:
    """torchvision's ResNet-50 (bottleneck blocks; written here, torchvision is not a dependency),
    seeded random weights, exported at 224x224 batch 1."""
    import torch
    from torch import nn

    from models_zoo import torch_reference as models

    class Bottleneck(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
                nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(planes),
                nn.ReLU(inplace=True), nn.Conv2d(planes, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4))
            self.down = (nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
                         if stride != 1 or inplanes != planes * 4 else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.down(x))

    layers, inplanes = [], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * 4
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                           nn.MaxPool2d(3, stride=2, padding=1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(2048, 1000)).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    spec = models.ModelSpec("resnet50", module, {"input": torch.from_numpy(x)}, ("output",),
                            {"input": {0: "batch"}, "output": {0: "batch"}})
    path = os.path.join(workdir, "resnet50.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.export_onnx(spec, "torchscript", path)
    return path, {"input": x}


def run_c_build(args) -> dict:
    """ResNet-50 on CBackend: load, compile with an empty MITHRIL_CACHE_DIR (the C compiler runs) and
    compile again from that cache (median of --compile-repeats); ResNet-18's memory report."""
    from mithril.backends.c import build

    out: dict = {}
    with tempfile.TemporaryDirectory() as workdir, tempfile.TemporaryDirectory() as cache:
        _progress("C build: exporting ResNet-50")
        path, inputs = _resnet50_onnx(workdir)
        shapes = {k: list(v.shape) for k, v in inputs.items()}
        _, _, blas = build.blas_flags()
        out["blas"] = blas or "none"
        out["cc"] = build.compiler_version(tuple(build.compiler()))
        with _with_env_ctx({"MITHRIL_CACHE_DIR": cache}):
            t = time.perf_counter()
            model = ml.load_onnx(path)
            out["load_s"] = time.perf_counter() - t
            before = build.BUILDS["count"]
            _progress("C build: ResNet-50 cold compile")
            t = time.perf_counter()
            pm = ml.compile(model, ml.CBackend(), shapes=shapes, static_shapes=True)
            out["cold_s"] = time.perf_counter() - t
            out["cold_builds"] = build.BUILDS["count"] - before
            out["source_kb"] = len(pm.program.source) / 1024 if hasattr(pm.program, "source") else None
            warm = []
            for _ in range(max(args.compile_repeats, 1)):
                t = time.perf_counter()
                ml.compile(ml.load_onnx(path), ml.CBackend(), shapes=shapes, static_shapes=True)
                warm.append(time.perf_counter() - t)
                model2 = ml.load_onnx(path)
                t = time.perf_counter()
                ml.compile(model2, ml.CBackend(), shapes=shapes, static_shapes=True)
                out.setdefault("cached", []).append(time.perf_counter() - t)
            out["cached_load_s"] = statistics.median(warm)
            out["cached_s"] = statistics.median(out.pop("cached"))
            out["cached_builds"] = build.BUILDS["count"] - before - out["cold_builds"]
            ref = pm.evaluate(pm.get_parameters(), inputs)
            del pm, model, model2
            _progress("C build: ResNet-18 memory report")
            r18, _, r18_inputs = _export(MODELS["resnet18"], workdir, {})
            pm18 = ml.compile(ml.load_onnx(r18), ml.CBackend(), shapes={k: list(v.shape) for k, v in r18_inputs.items()},
                              static_shapes=True)
            out["resnet18"] = pm18.program.memory_report()
    out["resnet50_outputs_finite"] = bool(all(np.isfinite(np.asarray(v)).all() for v in ref.values()))
    return out


def _render_c_build(res: dict, rows: list[dict], targets, notes: list[str], started: str, load) -> str:
    cold_ok = res["cold_s"] < C_COLD_TARGET_S
    cached_ok = res["cached_s"] < C_CACHED_TARGET_S
    r18 = res["resnet18"]
    arena, naive = r18.get("arena_bytes", 0), r18.get("naive_bytes", 0)
    half_ok = naive > 0 and arena <= naive / 2
    facts = dict(_machine_facts())
    mib = 1024 * 1024
    lines = [C_HEADING, "",
             f"Generated by `scripts/bench.py --c-backend` ({started}; load average {_fmt_load(load)} at the start).",
             "c: `CBackend(num_threads=...)` compiled with `static_shapes=True`, `inference=True` and",
             "`constant_keys=` every initializer of the file (weights fixed at compile, as in onnxruntime's",
             "session: the C program packs them once for its NCHWc convolutions), linked with OpenBLAS (its GEMM",
             "run single-threaded inside the backend's OpenMP threads) when scipy-openblas32 is installed;",
             "c-noblas: the same built with `MITHRIL_C_BLAS=0`, the kernel library's own blocked GEMM. Each row",
             "takes turns with onnxruntime at the same thread count (\"default\": every usable CPU for C and",
             "onnxruntime's default pool); vs ORT is the backend's time over onnxruntime's in the same rounds.",
             "bert_small is BERT-Small's shape (4 layers, hidden 512, 8 heads), gpt2_124m GPT-2's released smallest",
             "size with its LM head (both random weights, sequence 128, batch 1): the models the C bar names.",
             "bert and gpt2 are the small configurations of the tables above (hidden 64, 2 layers), where",
             "per-call overhead shows; they are listed, not held to the bar.", "",
             "| Model | Backend | Threads | Load+compile (s) | Latency (ms) | ORT (ms) | vs ORT | Runs | Max abs diff |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['backend']} | {r['threads']} | {r['compile_s']:.3f} | {r['ms']:.2f} | "
              f"{r['ort_ms']:.2f} | {r['ratio']:.2f}x | {r['runs']} | {r['diff']:.1e} |" for r in rows]
    lines += ["", "| Bar | Model | Measured | Met |", "|---|---|---|---|"]
    lines += [f"| {t} | {m} | {v} | {verdict} |" for _, t, m, v, verdict in targets]
    lines += ["", "ResNet-50 (torchvision's architecture, random weights, 224x224 batch 1, exported with the",
             "TorchScript exporter) compiled with `ml.compile(model, ml.CBackend(), shapes=..., static_shapes=True)`. Cold: an empty",
             f"`MITHRIL_CACHE_DIR`, so the C compiler runs ({res['cold_builds']} build{'s' * (res['cold_builds'] != 1)}). Cached: the same file loaded",
             f"again and compiled from that cache, median of {res['repeats']} ({res['cached_builds']} builds). Arena:",
             "ResNet-18's intermediates in one arena planned from lifetimes (`pm.program.memory_report()`), against",
             "the naive sum of every intermediate's bytes.", "",
             f"C compiler: {res['cc']}. BLAS: {res['blas']}, OPENBLAS_CORETYPE {facts['OPENBLAS_CORETYPE']}. "
             f"CPU: {facts['CPU']}, "
             f"{_usable_cpus()} usable.", "",
             "| Bar | Measured | Met |", "|---|---|---|",
             f"| ResNet-50 compiles cold (C compiler included) in < {C_COLD_TARGET_S:g} s | {res['cold_s']:.2f} s "
             f"(load_onnx before it {res['load_s']:.2f} s) | {'met' if cold_ok else 'NOT met'} |",
             f"| ResNet-50 compiles from the cache in < {C_CACHED_TARGET_S:g} s | {res['cached_s']:.3f} s "
             f"(with load_onnx {res['cached_load_s']:.3f} s) | {'met' if cached_ok else 'NOT met'} |",
             f"| ResNet-18 arena <= half the naive sum | {arena / mib:.1f} MiB arena, {naive / mib:.1f} MiB naive "
             f"({arena / naive:.2f}x) | {'met' if half_ok else 'NOT met'} |" if naive else
             "| ResNet-18 arena <= half the naive sum | no memory report | NOT met |", ""]
    if not res.get("resnet50_outputs_finite", True):
        lines += ["ResNet-50's outputs on C were not all finite: the timing above is of a wrong program.", ""]
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _c_backend_main(args, model_names: list[str]) -> int:
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load = _load_average()
    notes: list[str] = []
    args.no_eager = True
    if "--threads" not in args.argv:
        # One thread first: measured after the 2-thread rows, ResNet-18's 1-thread C row came out up to
        # 1.8x slower than alone (the other program's OpenMP threads still held the second core).
        args.thread_settings = [1, 0]
    from mithril.backends.c import build

    names = list(C_BACKENDS)
    if not build.blas_flags()[2]:  # without a BLAS, c and c-noblas are one build: timing it twice adds only noise
        names.remove("c-noblas")
        notes.append("scipy-openblas32 is not installed: c is built with the kernel library's own GEMM "
                     "(c-noblas, the same build, is not run)")
    backends = _make_backends(names, notes)
    rows = run_benchmark(args, backends, model_names, notes) if model_names else []
    targets = [t for t in _targets(rows, model_names, [b for b, _ in backends], {}) if t[0] == "18"]
    res = run_c_build(args)
    res["repeats"] = max(args.compile_repeats, 1)
    section = _render_c_build(res, rows, targets, notes, started, load)
    return _print_and_write_section(args, C_HEADING, section, "C backend")


# -- the GGML backend ---------------------------------------------------------------------------

GGML_HEADING = "## GGML backend"
GGML_MODELS = ("bert_small", "bert_small_dynamo", "gpt2_124m", "gpt2_124m_dynamo", "resnet18")
GGML_BAR_MODELS = ("bert_small", "bert_small_dynamo", "gpt2_124m", "gpt2_124m_dynamo")  # issue 57's
GGML_BACKENDS = ("ggml", "ggml-q8_0", "ggml-q4_0", "ggml-q4_K", "ggml-contrib")
GGML_F32_TARGET = 1.3  # GGML float32 latency / onnxruntime, issue 57
GGML_Q8_TARGET = 1.2  # GGML q8_0 latency / onnxruntime float32, issue 19
GGML_Q4_BYTES_TARGET = 0.30  # q4_0 weight bytes / float32 weight bytes, issue 19


def _ggml_targets(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    out = []
    for model in GGML_BAR_MODELS:
        for threads in sorted({r["threads"] for r in rows if r["model"] == model}):
            f32, q8 = _find(rows, model, "ggml", threads), _find(rows, model, "ggml-q8_0", threads)
            if f32:
                out.append((f"GGML float32 within {GGML_F32_TARGET:g}x of onnxruntime ({threads} threads)", model,
                            f"{f32['ratio']:.2f}x", "met" if f32["ratio"] <= GGML_F32_TARGET else "NOT met"))
            if q8 and f32:
                ok = q8["ms"] < f32["ms"] and q8["ratio"] <= GGML_Q8_TARGET
                out.append((f"q8_0 faster than GGML float32 and within {GGML_Q8_TARGET:g}x of onnxruntime "
                            f"({threads} threads)", model, f"{q8['ms']:.1f} ms vs {f32['ms']:.1f} ms; {q8['ratio']:.2f}x",
                            "met" if ok else "NOT met"))
            for name in ("ggml-q4_0", "ggml-q4_K"):
                q = _find(rows, model, name, threads)
                if q and f32:
                    out.append((f"{name[5:]} faster than GGML float32 ({threads} threads; {_ggml_cpu()})", model,
                                f"{q['ms']:.1f} ms vs {f32['ms']:.1f} ms", "met" if q["ms"] < f32["ms"] else "NOT met"))
        f32, q4 = _find(rows, model, "ggml"), _find(rows, model, "ggml-q4_0")
        if f32 and q4 and f32.get("weight_bytes") and q4.get("weight_bytes"):
            share = q4["weight_bytes"] / f32["weight_bytes"]
            out.append((f"q4_0 weights at most {GGML_Q4_BYTES_TARGET:.0%} of float32's", model,
                        f"{q4['weight_bytes'] / 2**20:.1f} MiB of {f32['weight_bytes'] / 2**20:.1f} MiB ({share:.0%})",
                        "met" if share <= GGML_Q4_BYTES_TARGET else "NOT met"))
    return out


def _ggml_cpu() -> str:
    """The CPU's vector extensions that choose ggml's kernels (scripts/bench_ggml_load.py), and
    whether q8_0 ran on AMX where the CPU has it (``MITHRIL_GGML_AMX=0`` measures the kernel of
    CPUs without it)."""
    import bench_ggml_load

    from mithril.backends.ggml.program import amx_works

    features = bench_ggml_load.cpu_features()
    if "AMX" in features.split(" (no")[0] and not amx_works():
        features += "; ggml's AMX matmul off (MITHRIL_GGML_AMX=0)"
    return features


def _render_ggml(rows: list[dict], targets, notes: list[str], started: str, load,
                 generation: list[dict]) -> str:
    lines = [GGML_HEADING, "",
             f"Generated by `scripts/bench.py --ggml-backend` ({started}; load average {_fmt_load(load)} at the start;",
             f"CPU {_ggml_cpu()}).",
             "ggml: `GGMLBackend(num_threads=...)` in float32; ggml-q8_0 / ggml-q4_0 / ggml-q4_K: the same with `quantize=`",
             "(matmul weights and embedding tables quantized, activations float32); ggml-contrib: ggml-python's own",
             "ONNX runtime (`ggml.contrib.onnx`, with its NumPy fallback, at its own thread count) on the same file.",
             "Each row takes turns with onnxruntime (float32) at the same thread count (\"default\": every usable",
             "CPU); vs ORT is the row's time over onnxruntime's in the same rounds. Nodes without a ggml rule run on",
             "NumPy between ggml graphs (BERT's and GPT-2's mask arithmetic, Erf, Split): part of the time here.",
             "bert_small: BERT-Small's shape (4 layers, hidden 512, 8 heads); gpt2_124m: GPT-2's released smallest",
             "size with its LM head; both random weights, sequence 128, batch 1, TorchScript exports (_dynamo: the",
             "same modules from torch.onnx's dynamo exporter).", "",
             "| Model | Backend | Threads | Load+compile (s) | Latency (ms) | ORT (ms) | vs ORT | Weights (MiB) | Max abs diff |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        weights = f"{r['weight_bytes'] / 2**20:.1f}" if r.get("weight_bytes") else ""
        lines.append(f"| {r['model']} | {r['backend']} | {r['threads']} | {r['compile_s']:.3f} | {r['ms']:.2f} | "
                     f"{r['ort_ms']:.2f} | {r['ratio']:.2f}x | {weights} | {r['diff']:.1e} |")
    lines += ["", "| Bar | Model | Measured | Met |", "|---|---|---|---|"]
    lines += [f"| {t} | {m} | {v} | {verdict} |" for t, m, v, verdict in targets]
    lines += ["", *_render_generation(generation), ""]
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _ggml_backend_main(args, model_names: list[str]) -> int:
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load = _load_average()
    notes: list[str] = []
    args.no_eager = True
    backends = _make_backends(list(GGML_BACKENDS), notes)
    rows = run_benchmark(args, backends, model_names, notes)
    targets = _ggml_targets(rows)
    for t, m, v, verdict in targets:
        print(f"GGML bar: {t} [{m}]: {v} -> {verdict}")
    generation = _ggml_generation(args, notes)
    section = _render_ggml(rows, targets, notes, started, load, generation)
    return _print_and_write_section(args, GGML_HEADING, section, "GGML backend")


GEN_MODELS = {  # create_gpt_decoder's arguments
    "gpt_small": dict(bias=True, block_size=128, dims=256, num_heads=4, num_layers=4, vocab_size=1024),
    "gpt2_124m": dict(bias=True, block_size=256, dims=768, num_heads=12, num_layers=12, vocab_size=50257),
}
GEN_PROMPT, GEN_NEW = 16, 64
GEN_BACKENDS = (("numpy", "NumpyBackend", {}), ("ggml", "GGMLBackend", {}),
                ("ggml-q8_0", "GGMLBackend", {"quantize": "q8_0"}), ("ggml-q4_0", "GGMLBackend", {"quantize": "q4_0"}))


def _ggml_generation(args, notes: list[str]) -> list[dict]:
    """Greedy generation with the key/value cache (``ml.generate`` over the zoo's
    ``create_gpt_decoder``): tokens/s of the steps that produce new tokens, the median of runs
    taking turns with the other backends for about ``--row-seconds`` each, per thread setting."""
    import models_zoo

    rows = []
    for model_name, cfg in GEN_MODELS.items():
        model = models_zoo.create_gpt_decoder(**cfg)
        rng = np.random.default_rng(0)
        step = ml.compile(model, ml.NumpyBackend(), shapes={"input": (1, 1)}, inference=True)
        params = {k: (0.02 * rng.standard_normal(np.shape(v), dtype=np.float32))  # GPT-2's initialisation
                  for k, v in step.randomize_params().items()}
        for k in params:
            if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                params[k] += 1
        prompt = rng.integers(0, cfg["vocab_size"], GEN_PROMPT)
        for threads in args.thread_settings:
            steps = {}
            with _limits(threads):
                for name, attr, kwargs in GEN_BACKENDS:
                    options = {} if name == "numpy" else {"num_threads": threads or _usable_cpus()}
                    try:
                        t = time.perf_counter()
                        pm = ml.compile(model, getattr(ml, attr)(**kwargs, **options), shapes={"input": (1, 1)},
                                        inference=True, static_shapes=name != "numpy")
                        compile_s = time.perf_counter() - t
                        ids = ml.generate(pm, params, prompt, GEN_NEW)  # also the warm-up
                    except Exception as exc:
                        notes.append(f"generation of {model_name} on {name} skipped: {type(exc).__name__}: {exc}")
                        continue
                    steps[name] = {"pm": pm, "ids": ids, "compile_s": compile_s, "speeds": []}
                deadline = time.perf_counter() + args.row_seconds * len(steps)
                while steps and (time.perf_counter() < deadline or min(len(r["speeds"]) for r in steps.values()) < 2):
                    for r in steps.values():
                        r["speeds"].append(ml.generate(r["pm"], params, prompt, GEN_NEW, return_speed=True)[1])
            f32 = steps.get("ggml", {}).get("ids")
            for name, r in steps.items():
                rows.append({"model": model_name, "backend": name, "threads": _threads_label(threads),
                             "compile_s": r["compile_s"], "tokens_s": statistics.median(r["speeds"]),
                             "runs": len(r["speeds"]), "match": None if f32 is None else int((r["ids"] == f32).sum())})
                print(f"generation {model_name} {name} threads={_threads_label(threads)}: "
                      f"{rows[-1]['tokens_s']:.1f} tokens/s, {rows[-1]['match']} of {GEN_NEW} tokens equal GGML "
                      "float32's")
            steps.clear()
    return rows


def _render_generation(rows: list[dict]) -> list[str]:
    import textwrap

    sizes = "; ".join(f"{name}: dims {c['dims']}, {c['num_layers']} layers, {c['num_heads']} heads, block "
                      f"{c['block_size']}, vocabulary {c['vocab_size']}" for name, c in GEN_MODELS.items())
    prose = ["Greedy generation with the key/value cache: `ml.generate` over the zoo's `create_gpt_decoder` "
             f"({sizes}; random weights with GPT-2's N(0, 0.02) initialisation), batch 1, a "
             f"{GEN_PROMPT}-token prompt and {GEN_NEW} new tokens. Tokens/s counts the steps that produce new "
             "tokens (one `evaluate` each, logits back to NumPy, argmax in Python); the median of the runs. "
             "Same as float32 counts the new tokens equal to GGML float32's (the caches make every step depend on "
             "the earlier tokens, so one different argmax changes the rest; random weights leave small gaps between "
             "the largest logits)."]
    lines = [*textwrap.wrap(" ".join(prose), 105), "",
             "| Model | Backend | Threads | Compile (s) | Tokens/s | Runs | Same as float32 |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        same = "" if r["match"] is None else f"{r['match']} / {GEN_NEW}"
        lines.append(f"| {r['model']} | {r['backend']} | {r['threads']} | {r['compile_s']:.2f} | {r['tokens_s']:.1f} | "
                     f"{r['runs']} | {same} |")
    if not rows:
        lines.append("| (not run) | | | | | | |")
    return lines


# -- training memory: gradient checkpointing -----------------------------------------------------

TRAIN_MEMORY_BACKENDS = ("numpy", "jax", "torch", "mlx")
TRAIN_MEMORY_HEADING = "## Training memory: gradient checkpointing"
# How each backend's peak is measured (the section's text says why).
TRAIN_MEMORY_METHODS = {"numpy": "resident memory", "torch": "resident memory",
                        "jax": "XLA buffer assignment", "mlx": "MLX allocator"}
# Fixed, so glibc hands every freed array of 128 KiB or more back to the OS at once (by default
# the threshold rises with the sizes freed, and freed activations would stay resident).
TRAIN_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _train_step_memory(backend_name: str, checkpointing: bool, batch: int, image: int) -> dict:
    """In this (fresh) process: ResNet-18 (models_zoo, BatchNorm in training mode) with a
    cross-entropy loss compiled on ``backend_name``; one untimed step (jit compiles there), then
    steps measured: the peak memory of one (:data:`TRAIN_MEMORY_METHODS` says how, per backend)
    and the fastest of two."""
    from mithril.models import CrossEntropy, Mean, TrainModel
    from models_zoo import resnet18

    attr, kwargs = BACKENDS[backend_name]
    backend = getattr(ml, attr)(**kwargs)
    tm = TrainModel(resnet18(num_classes=1000))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    # The backend's default jit, except JAX: jit=False, and the step below is jax.jit of the whole
    # evaluate (the vector-Jacobian product the backend jits, with its compiler options), whose
    # buffer assignment XLA reports.
    pm = ml.compile(tm, backend, shapes={"input": [batch, 3, image, image], "target": [batch]},
                    data_keys={"target"}, gradient_checkpointing=checkpointing,
                    jit=False if backend_name == "jax" else None)
    params = pm.randomize_params()
    rng = np.random.default_rng(0)
    data = {"input": backend.from_numpy(rng.standard_normal((batch, 3, image, image)).astype(np.float32)),
            "target": backend.from_numpy(rng.integers(0, 1000, batch))}
    peak = None
    if backend_name == "jax":
        import jax

        with backend.scope():
            compiled = jax.jit(lambda p, d: pm.evaluate(p, d),
                               compiler_options=backend.compiler_options or None).lower(params, data).compile()
        memory = compiled.memory_analysis()
        peak = memory.temp_size_in_bytes + memory.output_size_in_bytes

        def step():
            with backend.scope():
                return jax.block_until_ready(compiled(params, data))
    elif backend_name == "mlx":
        import mlx.core as mx

        mx.set_cache_limit(0)  # freed buffers go back to the system, not to MLX's cache

        def step():
            out, grads = pm.evaluate(params, data)
            mx.eval(list(grads.values()))  # every gradient at once, as an optimizer step does
            return out, grads
    else:
        def step():  # NumPy and Torch compute eagerly
            return pm.evaluate(params, data)
    step()
    if backend_name == "mlx":
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        step()
        peak = mx.get_peak_memory() - before
    elif peak is None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        before = _proc_status_kb("VmRSS")
        step()
        peak = (_proc_status_kb("VmHWM") - before) * 1024
    seconds = []
    for _ in range(2):
        t = time.perf_counter()
        out, grads = step()
        seconds.append(time.perf_counter() - t)
    norms = {k: float(np.linalg.norm(backend.to_numpy(v).astype(np.float64))) for k, v in grads.items()}
    return dict(backend=backend_name, checkpointing=checkpointing, batch=batch, image=image, peak_mb=peak / 2**20,
                step_s=min(seconds), loss=float(backend.to_numpy(out["loss"])), grad_norms=norms, params=len(params))


def run_training_memory(backend_names, batch: int, image: int, notes: list[str]) -> list[dict]:
    """One subprocess per (backend, checkpointing); the rows they report."""
    rows = []
    for name in backend_names:
        for checkpointing in (False, True):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                out = f.name
            cmd = [sys.executable, str(Path(__file__).resolve()), "--train-memory-case",
                   f"{name}:{int(checkpointing)}:{batch}:{image}", "--json", out]
            print(f"training memory: {name}, gradient_checkpointing={checkpointing}", flush=True)
            _progress(f"training memory: {name}, gradient_checkpointing={checkpointing}")
            proc = subprocess.run(cmd, env={**os.environ, **TRAIN_MEMORY_ENV})
            try:
                if proc.returncode != 0:
                    notes.append(f"training memory on {name} (gradient_checkpointing={checkpointing}) exited with "
                                 f"{proc.returncode}")
                    continue
                row = json.loads(Path(out).read_text())
                rows.append(row)
                print(f"  peak {row['peak_mb']:.0f} MB, step {row['step_s']:.2f} s, loss {row['loss']:.4f}", flush=True)
            finally:
                os.unlink(out)
    return rows


def _render_training_memory(rows: list[dict], notes: list[str], started: str, load) -> str:
    first = rows[0] if rows else {"batch": "?", "image": "?"}
    lines = [TRAIN_MEMORY_HEADING, "",
             f"Generated by `python scripts/bench.py --training-memory` ({started}; load average {_fmt_load(load)}), "
             "which rewrites this section only.", "",
             "One training step of ResNet-18 (`models_zoo.resnet18`, BatchNorm in training mode, 1000 classes) "
             f"with a mean cross-entropy loss, batch {first['batch']} at {first['image']}x{first['image']}: "
             "`pm.evaluate(params, data)` of the compiled `TrainModel`, which returns the loss and the gradient of "
             "every parameter, compiled with and without `gradient_checkpointing=True`. Each configuration runs "
             "in a fresh subprocess: one step first (where jit compiles), then one step whose peak memory is "
             "measured, then two timed (the faster is shown). Peak: the memory the step adds at its height "
             "(activations kept for the backward pass, recomputed ones, gradients, temporaries), measured as "
             "each framework allows it honestly on this CPU:", "",
             "- NumPy and Torch allocate through malloc: the process's peak resident memory during the step "
             "(Linux VmHWM, reset through `/proc/self/clear_refs` just before it) minus its resident memory "
             "before it, with glibc's mmap threshold fixed at 128 KiB (`MALLOC_MMAP_THRESHOLD_`) so that freed "
             "arrays leave the process at once. (On NumPy this agrees with tracemalloc's peak within 1%.)",
             "- JAX: XLA's buffer assignment for the compiled gradient program (`jax.jit` of the same evaluate, "
             "with the backend's compiler options): temporaries plus outputs, from `memory_analysis()`. The "
             "process's resident memory is no measure here: what XLA's compiler freed stays in the heap and "
             "serves the step.",
             "- MLX: its allocator's peak during the step (`mx.get_peak_memory()` after `mx.reset_peak_memory()`) "
             "minus its active memory before it, the buffer cache off (`mx.set_cache_limit(0)`); every gradient "
             "evaluated at once with `mx.eval`, as an optimizer step does.", "",
             "Gradients: the largest relative difference of the per-parameter gradient norms between the two runs "
             "(the same seeded parameters and batch). Step times are as noisy as the machine's load.", "",
             "| Backend | Measured as | Peak without (MB) | Peak with (MB) | Drop | Step without (s) | Step with (s) "
             "| Gradients |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r["backend"] for r in rows):
        off = next((r for r in rows if r["backend"] == name and not r["checkpointing"]), None)
        on = next((r for r in rows if r["backend"] == name and r["checkpointing"]), None)
        method = TRAIN_MEMORY_METHODS[name]
        if off is None or on is None:
            lines.append(f"| {name} | {method} | {_f(off and off['peak_mb'], '.0f')} | "
                         f"{_f(on and on['peak_mb'], '.0f')} | — | — | — | — |")
            continue
        diff = max(abs(on["grad_norms"][k] - v) / max(abs(v), 1e-30) for k, v in off["grad_norms"].items())
        lines.append(f"| {name} | {method} | {off['peak_mb']:.0f} | {on['peak_mb']:.0f} | "
                     f"{100 * (1 - on['peak_mb'] / off['peak_mb']):.0f}% | {off['step_s']:.2f} | {on['step_s']:.2f} | "
                     f"{diff:.1e} |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# -- precision: the backend's dtype on exported models ----------------------------------------------

PRECISION_HEADING = "## Precision: float16, bfloat16 and float64"
# The dtypes each backend is measured in: the design's promise (mixed precision on JAX, Torch and
# MLX; float64 on NumPy, JAX and Torch) beside float32. NumPy also runs float16 and bfloat16, with
# no BLAS for them (bfloat16 is emulated by ml_dtypes): correct and far slower, so not timed here.
PRECISION_DTYPES = {"numpy": ("float32", "float64"), "jax": ("float32", "float16", "bfloat16", "float64"),
                    "torch": ("float32", "float16", "bfloat16", "float64"), "mlx": ("float32", "float16", "bfloat16")}
PRECISION_MODELS = {
    "resnet18": Case("resnet18", {"image_size": 112}, 1),
    "bert": Case("bert", {"seq": 128}, 1),
    "gpt2": Case("gpt2", {"seq": 128}, 1),
}
# tests/backends/test_precision.py's tolerances, on the same measure: 4 eps for the half types, 32 float32
# eps for float64 (compared with onnxruntime's float32, whose own rounding dominates).
PRECISION_TOLERANCES = {"float32": 32 * 2.0**-23, "float16": 4 * 2.0**-10, "bfloat16": 4 * 2.0**-7,
                        "float64": 32 * 2.0**-23}


def _scaled_error(outs: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """The largest over outputs of max |out - ref| / max |ref|: the error relative to each
    output's scale (tests/backends/test_precision.py's measure)."""
    worst = 0.0
    for k, r in ref.items():
        got, want = np.asarray(outs[k], np.float64), np.asarray(r, np.float64)
        worst = max(worst, float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30)))
    return worst


def run_precision(backend_names: list[str], model_names: list[str], args, notes: list[str]) -> list[dict]:
    """Per (model, backend): the model compiled in each of the backend's dtypes, checked against
    onnxruntime's float32 on the first call, then the dtypes timed taking turns."""
    import onnxruntime as ort

    rows = []
    cache: dict = {}
    total = sum(len(PRECISION_DTYPES[b]) for b in backend_names) * len(model_names)
    done = 0
    with tempfile.TemporaryDirectory() as workdir:
        for model in model_names:
            case = PRECISION_MODELS[model]
            path, _, inputs = _export(case, workdir, cache)
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            ref = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
            input_desc = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
            for bname in backend_names:
                attr, kwargs = BACKENDS[bname]
                runners, found = {}, {}
                for dtype in PRECISION_DTYPES[bname]:
                    done += 1
                    _progress(f"precision [{done}/{total}] {model} ({input_desc}) on {bname} in {dtype}: "
                              "compile and first call")
                    try:
                        backend = getattr(ml, attr)(dtype=getattr(ml, dtype), **kwargs)
                        t = time.perf_counter()
                        pm = ml.compile(path, backend, shapes={k: list(v.shape) for k, v in inputs.items()})
                        compile_s = time.perf_counter() - t
                        want = backend.dtype.numpy
                        params = pm.get_parameters()
                        data = {k: backend.from_numpy(v.astype(want) if v.dtype == np.float32 else v)
                                for k, v in inputs.items()}

                        def call(backend=backend, pm=pm, params=params, data=data):
                            return _to_numpy_outputs(backend, pm.evaluate(params, data))

                        t = time.perf_counter()
                        outs = call()
                        first_s = time.perf_counter() - t
                    except Exception as exc:  # one failing dtype must not end the section
                        notes.append(f"{model} on {bname} in {dtype} failed: {type(exc).__name__}: {str(exc)[:300]}")
                        print(notes[-1], flush=True)
                        continue
                    dtypes = sorted({str(v.dtype) for v in outs.values() if is_floating_np(v.dtype)})
                    runners[dtype] = call
                    found[dtype] = dict(model=model, input=input_desc, backend=bname, dtype=dtype,
                                        compile_s=compile_s, first_s=first_s, error=_scaled_error(outs, ref),
                                        output_dtypes=dtypes)
                if not runners:
                    continue
                _progress(f"precision: timing {model} on {bname} in {', '.join(runners)} (taking turns)")
                times, runs = _interleaved_times(runners, args.warmup, args.min_runs, args.runs, args.row_seconds)
                base = times.get("float32")
                for dtype, row in found.items():
                    row.update(ms=times[dtype] * 1e3, runs=runs, vs_float32=times[dtype] / base if base else None)
                    rows.append(row)
                    print(f"{model:<9} {bname:<6} {dtype:<9} {row['ms']:8.2f} ms  "
                          f"{_f(row['vs_float32'], '.2f')}x float32  error {row['error']:.2e}  "
                          f"(outputs {', '.join(row['output_dtypes'])})", flush=True)
    return rows


def _render_precision(rows: list[dict], notes: list[str], started: str, load, args) -> str:
    sizes = "; ".join(f"{m} {next(r['input'] for r in rows if r['model'] == m)}"
                      for m in dict.fromkeys(r["model"] for r in rows))
    lines = [PRECISION_HEADING, "",
             f"Generated by `python scripts/bench.py --precision` ({started}; load average {_fmt_load(load)}), "
             "which rewrites this section only.", "",
             "The TorchScript exports of ResNet-18, the small BERT and the small GPT-2 (float32 files, random "
             f"weights, seeded), batch 1: {sizes}. Each backend compiles the file once per dtype with "
             "`Backend(dtype=...)`: the precision pass (docs/precision.md) converts the float32 graph to that "
             "dtype (Softmax, LayerNormalization and whole-axis reductions stay float32 in float16 and "
             "bfloat16), and inputs and outputs take the dtype. A backend's dtypes are timed taking turns in "
             f"one process (about {args.row_seconds:g} s of calls per model and backend); ms is the median "
             "steady call, and *vs float32* its ratio to the same backend's float32 row.", "",
             "*Error* is max |output - onnxruntime| / max |onnxruntime| over the model's outputs, against "
             "onnxruntime's float32 on the same inputs (the float32 rows show the backend's own float32 "
             "difference). tests/backends/test_precision.py holds the same measure to 4 eps for the half types "
             "(float16 3.9e-3, bfloat16 3.1e-2) and to 32 float32 eps (3.8e-6) for float64.", "",
             "Times follow the CPU's half-precision instructions, not the bytes saved: this one has "
             f"{_half_precision_isa()}. Where a framework has no fast kernel for a dtype it converts around "
             "each op or falls back to a generic loop, and that dtype's rows are slower than float32.", "",
             "| Model | Backend | dtype | ms | vs float32 | Error vs onnxruntime float32 | Within tolerance |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        ok = "yes" if r["error"] <= PRECISION_TOLERANCES[r["dtype"]] else "no"
        lines.append(f"| {r['model']} | {r['backend']} | {r['dtype']} | {r['ms']:.2f} | {_f(r['vs_float32'], '.2f')} | "
                     f"{r['error']:.1e} | {ok} |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _half_precision_isa() -> str:
    """Which of the x86 half-precision extensions the CPU reports (from /proc/cpuinfo)."""
    wanted = {"f16c": "F16C (float16 conversions only)", "avx512_bf16": "AVX512-BF16 (bfloat16 dot products)",
              "amx_bf16": "AMX-BF16", "avx512_fp16": "AVX512-FP16 (float16 arithmetic)", "amx_fp16": "AMX-FP16"}
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "an instruction set this script cannot read (no /proc/cpuinfo)"
    have = [v for k, v in wanted.items() if k in flags]
    lacks = [v.split(" (")[0] for k, v in wanted.items() if k not in flags]
    return (", ".join(have) or "no half-precision extension") + (f"; no {', '.join(lacks)}" if lacks else "")


def _precision_main(args, backend_names: list[str], model_names: list[str]) -> int:
    notes: list[str] = []
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load = _load_average()
    rows = run_precision(backend_names, model_names, args, notes)
    section = _render_precision(rows, notes, started, load, args)
    return _print_and_write_section(args, PRECISION_HEADING, section, "precision")


MESH_HEADING = "## Device meshes"


def _mesh_main(args) -> int:
    """The device-mesh section (scripts/bench_mesh.py measures in a child with 4 host devices)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_mesh

    started, load = time.strftime("%Y-%m-%d %H:%M %Z"), _fmt_load(_load_average())
    steps = 3 if args.quick else 10
    rows = bench_mesh.measure(steps=steps, warmup=1 if args.quick else 3)
    section = bench_mesh.render(rows, started, load, os.cpu_count() or 0)
    return _print_and_write_section(args, MESH_HEADING, section, "device-mesh")


def _print_and_write_section(args, heading: str, section: str, label: str) -> int:
    """Print a section run on its own (--precision, --training-memory) and, unless --no-write,
    replace only that section of the performance document."""
    print(section)
    if not args.no_write:
        out = Path(args.output)
        text = out.read_text() if out.exists() else "# Performance\n"
        out.write_text(_splice_section(text, heading, section))
        print(f"wrote the {label} section of {out}")
    return 0


def _splice_section(text: str, heading: str, section: str | None) -> str:
    """``text`` with the section starting at ``heading`` (up to the next ``## ``) replaced by
    ``section``; a missing one goes before the first section that follows it in SECTION_ORDER
    (or at the end). None keeps ``text``."""
    if section is None:
        return text
    start = text.find(heading + "\n")
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        end = len(text) if end < 0 else end + 1
        return text[:start] + section + ("\n" if end < len(text) else "") + text[end:]
    later = SECTION_ORDER[SECTION_ORDER.index(heading) + 1:] if heading in SECTION_ORDER else ("## Threads",)
    anchors = [i for i in (text.find(f"\n{h}\n") for h in later) if i >= 0]
    if not anchors:
        return text.rstrip("\n") + "\n\n" + section
    anchor = min(anchors)
    return text[:anchor + 1] + section + "\n" + text[anchor + 1:]


def _existing_section(path: Path, heading: str) -> str | None:
    """The section at ``heading`` of the file at ``path`` (its text up to the next ``## ``), if any."""
    if not path.exists():
        return None
    text = path.read_text()
    start = text.find(heading + "\n")
    if start < 0:
        return None
    end = text.find("\n## ", start + len(heading))
    return (text[start:] if end < 0 else text[start:end]).rstrip("\n") + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--peers"]:  # its own options: scripts/bench_peers.py --help
        import bench_peers

        return bench_peers.main(argv[1:])
    if argv[:1] == ["--load-memory"]:  # its own options: scripts/bench_load.py --help
        import bench_load

        return bench_load.main(argv[1:])
    if argv[:1] == ["--ggml-load"]:  # its own options: scripts/bench_ggml_load.py --help
        import bench_ggml_load

        return bench_ggml_load.main(argv[1:])
    if argv[:1] == ["--c-load"]:  # the same script's C section
        import bench_ggml_load

        return bench_ggml_load.main(["--backend", "c", *argv[1:]])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=DEFAULT_BACKENDS, help=f"comma list from {', '.join(BACKENDS)}")
    ap.add_argument("--models", default=",".join(m for m, c in MODELS.items() if c.exporter == "torchscript"),
                    help=f"comma list from {', '.join(MODELS)}")
    ap.add_argument("--runs", type=int, default=1000,
                    help="most timed calls per runtime per row; --row-seconds usually binds first")
    ap.add_argument("--min-runs", type=int, default=3, help="fewest rounds per row, however slow")
    ap.add_argument("--row-seconds", type=float, default=12.0, help="time to spend timing one row")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile-repeats", type=int, default=3, help="load+compile is the median of this many")
    ap.add_argument("--threads", default="0,1",
                    help="comma list of thread limits for BLAS (threadpoolctl) and onnxruntime intra-op; 0 keeps "
                         f"the defaults; limits other than 0 apply to {', '.join(sorted(THREAD_LIMITED))} only")
    ap.add_argument("--jax-xla-flags", default="",
                    help="also run the JAX rows in subprocesses without and with these XLA_FLAGS ('' skips)")
    ap.add_argument("--no-eager", action="store_true", help="no PyTorch eager baseline")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 warmup, 2-5 rounds of about 3 s per row, load+compile once, 1 thread setting")
    ap.add_argument("--output", default=str(ROOT / "docs" / "performance.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    ap.add_argument("--json", metavar="PATH", help=argparse.SUPPRESS)  # rows for the parent (JAX subprocesses)
    ap.add_argument("--profile", metavar="MODEL", help="print time per op type and a cProfile of load+compile")
    ap.add_argument("--training-memory", action="store_true",
                    help="only the training-memory section (ResNet-18 with and without gradient_checkpointing, "
                         f"on those of --backends among {', '.join(TRAIN_MEMORY_BACKENDS)}); replaces that section "
                         "of --output and leaves the rest")
    ap.add_argument("--train-batch", type=int, default=8, help="training-memory batch size")
    ap.add_argument("--train-image", type=int, default=224, help="training-memory image size")
    ap.add_argument("--train-memory-case", help=argparse.SUPPRESS)  # backend:checkpointing:batch:image, a child
    ap.add_argument("--precision", action="store_true",
                    help="only the precision section (ResNet-18, BERT and GPT-2 in float16, bfloat16 and float64 "
                         f"on those of --backends among {', '.join(PRECISION_DTYPES)}; --models among "
                         f"{', '.join(PRECISION_MODELS)}; 3 s of timing per model and backend unless "
                         "--row-seconds); replaces that section of --output and leaves the rest")
    ap.add_argument("--c-backend", action="store_true",
                    help=f"only the C backend section ({', '.join(C_BACKENDS)} on --models among {', '.join(C_MODELS)}, "
                         "3 s of timing per row unless --row-seconds; ResNet-50 compile cold and from the cache; "
                         "ResNet-18 arena bytes vs the naive sum); replaces that section of --output and leaves the rest")
    ap.add_argument("--mesh", action="store_true",
                    help="only the device-mesh section (a GPT training step per strategy on 1, 2 and 4 JAX host "
                         "devices, scripts/bench_mesh.py); replaces that section of --output and leaves the rest")
    ap.add_argument("--ggml-backend", action="store_true",
                    help=f"only the GGML backend section ({', '.join(GGML_BACKENDS)} on --models among "
                         f"{', '.join(GGML_MODELS)}, 3 s of timing per row unless --row-seconds); replaces that "
                         "section of --output and leaves the rest")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.quick:
        args.runs, args.min_runs, args.row_seconds, args.warmup, args.compile_repeats = 5, 2, 3.0, 1, 1
        if "--threads" not in argv:
            args.threads = "0"
    args.thread_settings = [int(t) for t in args.threads.split(",") if t.strip()]

    if args.train_memory_case:
        name, checkpointing, batch, image = args.train_memory_case.split(":")
        row = _train_step_memory(name, checkpointing == "1", int(batch), int(image))
        Path(args.json).write_text(json.dumps(row))
        return 0
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in names:
        if name not in BACKENDS:
            ap.error(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if args.c_backend:
        if "--row-seconds" not in argv:
            args.row_seconds = 3.0
        models = ([m.strip() for m in args.models.split(",") if m.strip()] if "--models" in argv else list(C_MODELS))
        for m in models:
            if m not in C_MODELS:
                ap.error(f"unknown C model {m!r}; choose from {', '.join(C_MODELS)}")
        return _c_backend_main(args, models)
    if args.ggml_backend:
        if "--row-seconds" not in argv:
            args.row_seconds = 3.0
        models = ([m.strip() for m in args.models.split(",") if m.strip()] if "--models" in argv else list(GGML_MODELS))
        for m in models:
            if m not in MODELS:
                ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
        return _ggml_backend_main(args, models)
    if args.mesh:
        return _mesh_main(args)
    if args.training_memory:
        return _training_memory_main(args, [n for n in names if n in TRAIN_MEMORY_BACKENDS])
    if args.precision:
        if "--row-seconds" not in argv:
            args.row_seconds = 3.0
        models = ([m.strip() for m in args.models.split(",") if m.strip()] if "--models" in argv
                  else list(PRECISION_MODELS))
        for m in models:
            if m not in PRECISION_MODELS:
                ap.error(f"unknown precision model {m!r}; choose from {', '.join(PRECISION_MODELS)}")
        return _precision_main(args, [n for n in names if n in PRECISION_DTYPES], models)
    model_names = [args.profile] if args.profile else [m.strip() for m in args.models.split(",") if m.strip()]
    for m in model_names:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    notes: list[str] = []
    backends = _make_backends(names, notes)
    for n in notes:
        print(n, flush=True)
    if args.profile:
        args.no_eager = True
        backends = backends[:1]

    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load_start = _load_average()
    rows = run_benchmark(args, backends, model_names, notes)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "notes": notes}))
        return 0
    if args.profile:
        for _, backend in backends:
            _print_profile(backend, *_profile_inputs(args.profile))
        return 0
    jax_sub = {}
    if args.jax_xla_flags and any(b == "jax" for b, _ in backends):
        jax_sub = run_jax_subprocesses(args, model_names, notes)
    load_end = _load_average()
    backend_names = [b for b, _ in backends]
    targets = _targets(rows, model_names, backend_names, jax_sub)
    for i, t, m, v, verdict in targets:
        print(f"bar: {t} [{m}]: {v} -> {verdict}")
    if not args.no_write:
        facts = _machine_facts() + [("Load average at start / end (1 / 5 / 15 min)",
                                     f"{_fmt_load(load_start)}; {_fmt_load(load_end)}")]
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = _render(rows, targets, jax_sub, facts, notes, args, (load_start, load_end), started)
        # The other sections are regenerated on their own (--peers, --c-backend...) or by hand: kept as found.
        for heading in KEPT_SECTIONS:
            text = _splice_section(text, heading, _existing_section(out, heading))
        out.write_text(text)
        print(f"wrote {out}")
    return 0


PEERS_HEADING = "## Peers"  # scripts/bench_peers.py's section
WHY_HEADING = "## Why a backend is slower than its peer"  # written by hand from the Peers profiles
GGML_LOAD_HEADING = "## GGML under load"  # scripts/bench_ggml_load.py's section
C_LOAD_HEADING = "## C under load"  # scripts/bench_ggml_load.py --backend c
# The report's sections in order: a section written on its own goes to its place among these.
SECTION_ORDER = ("## Machine", PEERS_HEADING, WHY_HEADING, "## Bars", "## Results",
                 "## JAX on CPU with and without XLA flags", C_HEADING, C_LOAD_HEADING, GGML_HEADING,
                 GGML_LOAD_HEADING, TRAIN_MEMORY_HEADING, PRECISION_HEADING, MESH_HEADING, "## Threads", "## Notes")
KEPT_SECTIONS = (PEERS_HEADING, WHY_HEADING, C_HEADING, C_LOAD_HEADING, GGML_HEADING, GGML_LOAD_HEADING,
                 TRAIN_MEMORY_HEADING, PRECISION_HEADING, MESH_HEADING)


def _training_memory_main(args, backend_names: list[str]) -> int:
    notes: list[str] = []
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load = _load_average()
    rows = run_training_memory(backend_names, args.train_batch, args.train_image, notes)
    section = _render_training_memory(rows, notes, started, load)
    return _print_and_write_section(args, TRAIN_MEMORY_HEADING, section, "training-memory")


def _profile_inputs(model: str):
    workdir = tempfile.mkdtemp()
    path, _, inputs = _export(MODELS[model], workdir, {})
    return path, inputs


def profile_c_nodes(pm, call, runs: int = 5) -> tuple[list[tuple[str, float, int]], list[tuple[str, float, int]]]:
    """profile_ops for the C backend: the per-node clocks of a library built with
    MITHRIL_C_PROFILE=1 (CProgram.profile), by op type and by (op, input shapes)."""
    call()
    before = {id(pn): s for pn, s in pm.program.profile()}
    for _ in range(runs):
        call()
    by_op: dict[str, list] = defaultdict(lambda: [0.0, 0])
    by_sig: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for pn, seconds in pm.program.profile():
        dt = seconds - before[id(pn)]
        sig = f"{pn.op_type} {[list(v.static_shape) for v in pn.inputs if v is not None and v.static_shape is not None]}"
        for table, key in ((by_op, pn.op_type), (by_sig, sig)):
            table[key][0] += dt
            table[key][1] += runs

    def rows(table):
        return sorted(((k, t / runs, n // runs) for k, (t, n) in table.items() if t > 0), key=lambda r: -r[1])

    return rows(by_op), rows(by_sig)


def _print_profile(backend, path, inputs) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    shapes = {k: list(v.shape) for k, v in inputs.items()}
    if backend.name == "c":  # timed inside C: a library with a clock around each node
        os.environ["MITHRIL_C_PROFILE"] = "1"
    model = ml.load_onnx(path)
    pm = ml.compile(model, backend, shapes=shapes, inference=True if backend.name == "c" else None,
                    **_c_constants(backend, model))
    params = pm.get_parameters()
    data = {k: backend.from_numpy(v) for k, v in inputs.items()}

    def call():
        return _to_numpy_outputs(backend, pm.evaluate(params, data))

    per_op, per_sig = profile_c_nodes(pm, call) if backend.name == "c" else profile_ops(pm, call)
    total = sum(t for _, t, _ in per_op)
    for title, rows in (("Time per op type per call", per_op), ("Top 20 (op, input shapes) per call", per_sig[:20])):
        table = Table(title=title)
        for col in ("Op", "Calls", "ms", "%"):
            table.add_column(col, justify="left" if col == "Op" else "right")
        for op, t, n in rows:
            table.add_row(op, str(n), f"{t * 1e3:.2f}", f"{100 * t / total:.1f}")
        console.print(table)
    prof = cProfile.Profile()
    prof.enable()
    ml.compile(ml.load_onnx(path), backend, shapes=shapes)
    prof.disable()
    console.print("[bold]load+compile, cProfile by cumulative time[/bold]")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)



if __name__ == "__main__":
    sys.exit(main())
