#!/usr/bin/env python
"""Issue 21, Must 5: the resident memory a model adds to a process, per runtime.

    python scripts/bench_memory.py model.onnx [more.onnx ...] [--runtimes onnxruntime,numpy,torch,jax,mlx,c]

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
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

RUNTIMES = ("onnxruntime", "numpy", "torch", "jax", "mlx", "c")

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

    path, runtime, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
    else:
        make = {"numpy": ml.NumpyBackend, "torch": ml.TorchBackend, "jax": ml.JaxBackend, "mlx": ml.MlxBackend,
                "c": ml.CBackend}[runtime]
        backend = make(num_threads=threads) if runtime in ("numpy", "c") else make()
        extra = {"inference": True} if runtime == "c" else {}
        warm = ml.compile(ml.load_onnx(tiny), backend, **extra)
        backend.to_numpy(warm.evaluate(None, {k: backend.from_numpy(v) for k, v in pair.items()})["c"])
        del warm
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
    else:
        pm = ml.compile(ml.load_onnx(path), backend, shapes={k: list(v.shape) for k, v in feeds.items()}, **extra)
        data = {k: backend.from_numpy(v) for k, v in feeds.items()}
        for _ in range(5):
            out = {k: backend.to_numpy(v) for k, v in pm.evaluate(None, data).items()}
    gc.collect()
    print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before}))
""")


def measure(path: str, runtime: str, threads: int = 2, timeout: float = 900) -> dict:
    """{"peak": bytes, "after": bytes} for one model on one runtime, or {"error": why}."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, path, runtime, str(threads)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(paths: dict[str, str], runtimes=RUNTIMES, threads: int = 2, progress=print) -> list[dict]:
    out = []
    for name, path in paths.items():
        ort = None
        for runtime in runtimes:
            m = measure(path, runtime, threads)
            if runtime == "onnxruntime" and "peak" in m:
                ort = m
            row = {"model": name, "runtime": runtime, **m}
            if ort is not None and "peak" in m:
                row["vs_ort"] = m["peak"] / ort["peak"]
            out.append(row)
            progress(f"memory {name} {runtime}: " + (f"peak {m['peak'] / 2**20:.0f} MiB, after {m['after'] / 2**20:.0f} MiB"
                                                      if "peak" in m else m["error"]))
    return out


def table(memory_rows: list[dict]) -> list[str]:
    lines = ["| Model | Runtime | Peak added (MiB) | Kept after the runs (MiB) | Peak vs onnxruntime |",
             "|---|---|---|---|---|"]
    for r in memory_rows:
        if "peak" not in r:
            lines.append(f"| {r['model']} | {r['runtime']} | failed: {r['error']} | | |")
            continue
        ratio = f"{r['vs_ort']:.2f}x" if "vs_ort" in r else "—"
        lines.append(f"| {r['model']} | {r['runtime']} | {r['peak'] / 2**20:.0f} | {r['after'] / 2**20:.0f} | {ratio} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help=".onnx files")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"comma list from {', '.join(RUNTIMES)}")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    for r in runtimes:
        if r not in RUNTIMES:
            ap.error(f"unknown runtime {r!r}; choose from {', '.join(RUNTIMES)}")
    found = rows({p: p for p in args.models}, runtimes, args.threads, progress=lambda s: print(s, file=sys.stderr))
    print("\n".join(table(found)))
    return 0 if all("peak" in r for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
