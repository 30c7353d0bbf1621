#!/usr/bin/env python
"""The resident memory a model adds to a process, per runtime.

    python scripts/bench_memory.py model.onnx [more.onnx ...] [--runtimes onnxruntime,numpy,torch,jax,mlx,c]
    python scripts/bench_memory.py mobilenet_v2 --runtimes onnxruntime,torch-eager,torch,jax-port,jax

Each (model, runtime) runs in a fresh process: the frameworks are imported first (onnx, onnxruntime,
mithril, numpy, torch, jax, mlx: their memory is not the model's) and the runtime started by running
a two-input Add through it (an onnxruntime session; the Mithril backend, compiled and evaluated: the
JAX backend's XLA client and compiler start here, about 45 MiB, as a process pays once, not per
model; the same backend object then runs the model), the kernel's peak-RSS mark is
reset (``/proc/self/clear_refs``), then the model is loaded, compiled and run five times on seeded
inputs with its own parameters (``pm.evaluate(None, data)``, as an onnxruntime session runs its own
weights; ``get_parameters()`` would hand out a copy on the backends that keep their own memory). "Peak" is VmHWM minus the RSS before loading (what the model needed at its height, loading
and compiling included); "after" is the RSS after the runs minus the same (what it keeps). Linux
only. scripts/bench_peers.py writes these rows into its section of docs/performance.md.

The framework-native peers of scripts/bench_peers.py are measured the same way on its built-in
models (scripts/export_models.py's names, not a file): ``torch-eager`` builds the torch module
(seeded random weights) and runs it under ``torch.no_grad``; ``jax-port``, ``jax-port-options`` (the
XLA options JaxBackend compiles that model with) and ``mlx-port`` port the module's weights
(scripts/peers) and run the compiled port. Their start-up is a two-input add in their framework
(jitted, compiled). Torch eager's peak includes building the module, as the others' includes loading
the file; a port's user would load its weights from a file, not from a torch module, so the module
is built before the mark and the port's conversion of the weights and its own copy of them count.
``torch-op-by-op`` is ``TorchBackend(onednn_graph=False)``: the Torch backend without the oneDNN
graph it runs convolutional models as by default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
RUNTIMES = ("onnxruntime", "numpy", "torch", "jax", "mlx", "c", "torch-op-by-op")
# scripts/bench_peers.py's framework-native peers: built-in models only (they are built from the torch module)
PEERS = ("torch-eager", "jax-port", "jax-port-options", "mlx-port")

_CHILD = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    import onnx, onnxruntime as ort
    import mithril as ml
    import torch, jax
    try:
        import mlx.core
    except ImportError:
        pass

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

    path, runtime, threads, name, scripts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    xla_options = json.loads(sys.argv[6])  # jax-port-options: what JaxBackend compiles this model with
    peer = runtime in sys.argv[7].split(",")  # PEERS
    if peer:
        sys.path.insert(0, scripts)
        import importlib.util
        import export_models, peers
        for lib in ("torchvision", "transformers", "models_zoo.torch_reference"):  # what build() imports
            if importlib.util.find_spec(lib.split(".")[0]) is not None:
                importlib.import_module(lib)
    model = onnx.load(path, load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = {}
    inits = {t.name for t in model.graph.initializer}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[i.name] = rng.integers(0, 100, shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[i.name] = np.ones(shape, bool)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
    del model, inits
    torch.set_num_threads(threads)
    # The runtime started on a two-input Add: its start-up is not the model's memory.
    f32 = onnx.TensorProto.FLOAT
    tiny = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Add", ["a", "b"], ["c"])], "tiny",
                               [onnx.helper.make_tensor_value_info(n, f32, [4]) for n in "ab"],
                               [onnx.helper.make_tensor_value_info("c", f32, [4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    pair = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    if runtime == "onnxruntime":
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        ort.InferenceSession(tiny.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, pair)
    elif peer:
        options = {"compiler_options": xla_options} if runtime == "jax-port-options" else {}
        if runtime == "torch-eager":
            with torch.no_grad():
                torch.add(torch.from_numpy(pair["a"]), torch.from_numpy(pair["b"]))
        else:
            ops = peers.make_ops(runtime.split("-")[0], **options)
            ops.to_numpy([ops.compile(lambda a, b: a + b)(ops.asarray(pair["a"]), ops.asarray(pair["b"]))])
    else:
        make = {"numpy": ml.NumpyBackend, "torch": ml.TorchBackend, "jax": ml.JaxBackend, "mlx": ml.MlxBackend,
                "c": ml.CBackend, "torch-op-by-op": ml.TorchBackend}[runtime]
        backend = make(num_threads=threads) if runtime in ("numpy", "c") else (
            make(onednn_graph=False) if runtime == "torch-op-by-op" else make())
        extra = {"inference": True} if runtime == "c" else {}
        warm = ml.compile(ml.load_onnx(tiny), backend, **extra)
        backend.to_numpy(warm.evaluate(None, {k: backend.from_numpy(v) for k, v in pair.items()})["c"])
        del warm
    if peer and runtime != "torch-eager":
        # A port's user loads its weights from a file, not from a torch module: the module is built
        # before the mark, and the port's conversion and its own weights count.
        ex = export_models.build(name)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    if runtime == "onnxruntime":
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        for _ in range(5):
            sess.run(None, feeds)
    elif runtime == "torch-eager":
        ex = export_models.build(name)
        tensors = [torch.from_numpy(ex.inputs[k]) for k in ex.inputs]
        with torch.no_grad():
            for _ in range(5):
                out = ex.module(*tensors)
    elif peer:
        call = peers.make_peer(runtime.split("-")[0], name, ex.module, **options).bind(ex.inputs)
        for _ in range(5):
            out = call()
    else:
        pm = ml.compile(ml.load_onnx(path), backend, shapes={k: list(v.shape) for k, v in feeds.items()}, **extra)
        data = {k: backend.from_numpy(v) for k, v in feeds.items()}
        for _ in range(5):
            out = {k: backend.to_numpy(v) for k, v in pm.evaluate(None, data).items()}
    gc.collect()
    print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before}))
""")


def measure(path: str, runtime: str, threads: int = 2, timeout: float = 900, name: str = "") -> dict:
    """{"peak": bytes, "after": bytes} for one model on one runtime, or {"error": why}. A peer in
    :data:`PEERS` builds the built-in model ``name`` (scripts/export_models.py) instead of reading ``path``."""
    if runtime in PEERS and name not in _builtin_models():
        return {"error": f"{runtime} needs a built-in model ({', '.join(_builtin_models())}), not {name!r}"}
    xla_options = {}
    if runtime == "jax-port-options":  # made here, not in the child, whose heap it would change
        if str(SCRIPTS) not in sys.path:
            sys.path.insert(0, str(SCRIPTS))
        import bench

        xla_options = bench.jax_program_options(path)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, path, runtime, str(threads), name, str(SCRIPTS),
                               json.dumps(xla_options), ",".join(PEERS)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _builtin_models() -> tuple[str, ...]:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    from export_models import MODELS

    return MODELS


# Mithril backend -> its framework-native peers, the first one measured counting (the JAX port under
# JaxBackend's XLA options before the one under XLA's defaults)
PEER_OF = {"torch": ("torch-eager",), "torch-op-by-op": ("torch-eager",), "jax": ("jax-port-options", "jax-port"),
           "mlx": ("mlx-port",)}


def rows(paths: dict[str, str], runtimes=RUNTIMES, threads: int = 2, progress=print) -> list[dict]:
    """One row per (model, runtime); peers run only for built-in model names and are measured
    first, so that each Mithril row can be set against its framework's own."""
    out = []
    builtin = _builtin_models()
    for name, path in paths.items():
        order = [r for r in runtimes if r == "onnxruntime"] + [r for r in runtimes if r in PEERS] + [
            r for r in runtimes if r != "onnxruntime" and r not in PEERS]
        found = {}
        for runtime in order:
            if runtime in PEERS and name not in builtin:
                continue
            m = found[runtime] = measure(path, runtime, threads, name=name)
            row = {"model": name, "runtime": runtime, **m}
            ort = found.get("onnxruntime", {})
            peer = next((p for p in PEER_OF.get(runtime, ()) if "peak" in found.get(p, {})), None)
            if "peak" in ort and "peak" in m:
                row["vs_ort"] = m["peak"] / ort["peak"]
            if peer is not None and "peak" in m:
                row["vs_peer"], row["peer"] = m["peak"] / found[peer]["peak"], peer
            out.append(row)
            progress(f"memory {name} {runtime}: " + (f"peak {m['peak'] / 2**20:.0f} MiB, after {m['after'] / 2**20:.0f} MiB"
                                                      if "peak" in m else m["error"]))
    return out


def table(memory_rows: list[dict]) -> list[str]:
    lines = ["| Model | Runtime | Peak added (MiB) | Kept after the runs (MiB) | Peak vs onnxruntime "
             "| Peak vs its peer |", "|---|---|---|---|---|---|"]
    for r in memory_rows:
        if "peak" not in r:
            lines.append(f"| {r['model']} | {r['runtime']} | failed: {r['error']} | | | |")
            continue
        ratio = f"{r['vs_ort']:.2f}x" if "vs_ort" in r else "—"
        peer = f"{r['vs_peer']:.2f}x {r['peer']}" if "vs_peer" in r else "—"
        lines.append(f"| {r['model']} | {r['runtime']} | {r['peak'] / 2**20:.0f} | {r['after'] / 2**20:.0f} | {ratio} "
                     f"| {peer} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+",
                    help=f".onnx files, or built-in names ({', '.join(_builtin_models())}: exported first, and the "
                         "only models the peers run)")
    choices = (*RUNTIMES, *PEERS)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"comma list from {', '.join(choices)}")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    for r in runtimes:
        if r not in choices:
            ap.error(f"unknown runtime {r!r}; choose from {', '.join(choices)}")
    for m in args.models:
        if m not in _builtin_models() and not os.path.isfile(m):
            ap.error(f"{m}: no such file, and not a built-in model ({', '.join(_builtin_models())})")
    progress = lambda s: print(s, file=sys.stderr)  # noqa: E731
    with tempfile.TemporaryDirectory() as workdir:
        paths = {}
        for m in args.models:
            if os.path.isfile(m):
                paths[m] = m
            else:
                import export_models

                progress(f"export {m}")
                paths[m] = export_models.export(m, workdir)[0]
        found = rows(paths, runtimes, args.threads, progress=progress)
    print("\n".join(table(found)))
    return 0 if all("peak" in r for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
