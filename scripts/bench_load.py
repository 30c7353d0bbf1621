#!/usr/bin/env python
"""Peak resident memory and time of loading a model whose weights are ONNX external data.

    python scripts/bench_load.py                            # ten 8192 x 8192 MatMuls (2.5 GiB of float32)
    python scripts/bench_load.py --layers 4 --dim 4096 --runtimes ggml,ggml-q8_0,numpy
    python scripts/bench.py --load-memory [...]             # the same

The model is an MLP of ``--layers`` [dim, dim] MatMuls with a Relu between them, its weights in
one external data file, written to a temporary folder (``--dir``, default the system's temporary
folder; removed afterwards unless ``--keep``). Each runtime runs in a fresh process: its
framework imported and started on a tiny model first, the kernel's peak-RSS mark reset
(``/proc/self/clear_refs``), then the model loaded, compiled (an onnxruntime session) and run
once on a [--batch, dim] input with its own weights. "Peak" is VmHWM minus the RSS before
loading; "load" the seconds (and CPU seconds, every thread's) from the file to the first output;
"run" one more evaluate. Runtimes: ``ggml`` (GGMLBackend, float32 weights), ``ggml-<type>``
(``quantize=<type>``: ``ggml-q8_0``, ``ggml-q4_0``...), ``numpy``, ``onnxruntime``. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

RUNTIMES = ("ggml", "numpy", "onnxruntime")

_CHILD = textwrap.dedent("""
    import gc, json, resource, sys, time
    import numpy as np
    import onnx, onnxruntime as ort
    import mithril as ml

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    path, runtime, batch, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    f32 = onnx.TensorProto.FLOAT
    tiny = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Add", ["a", "b"], ["c"])], "tiny",
                               [onnx.helper.make_tensor_value_info(n, f32, [4]) for n in "ab"],
                               [onnx.helper.make_tensor_value_info("c", f32, [4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    pair = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    if runtime == "onnxruntime":
        ort.InferenceSession(tiny.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, pair)
    else:
        name, _, quantize = runtime.partition("-")
        backend = ml.NumpyBackend() if name == "numpy" else ml.GGMLBackend(quantize=quantize or None)
        ml.compile(ml.load_onnx(tiny), backend, inference=True).evaluate(None, pair)
    x = {"x": np.random.default_rng(1).standard_normal((batch, dim)).astype(np.float32)}
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before, start, start_cpu = status("VmRSS"), time.perf_counter(), cpu()
    if runtime == "onnxruntime":
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        run = lambda: sess.run(None, x)[0]
    else:
        pm = ml.compile(ml.load_onnx(path), backend, inference=True)
        run = lambda: pm.evaluate(None, x)["y"]
    y = run()
    load, load_cpu = time.perf_counter() - start, cpu() - start_cpu
    start = time.perf_counter()
    run()
    print(json.dumps({"peak": status("VmHWM") - before, "after": status("VmRSS") - before, "load": load,
                      "load_cpu": load_cpu, "run": time.perf_counter() - start, "sum": float(np.abs(y).sum())}))
""")


def write_mlp(folder: str, layers: int, dim: int, batch: int) -> tuple[str, int]:
    """The MLP's .onnx file and its weights.bin in ``folder``: (model path, weight bytes)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    nodes, inits, offset = [], [], 0
    with open(os.path.join(folder, "weights.bin"), "wb") as f:
        for i in range(layers):
            w = rng.standard_normal((dim, dim), dtype=np.float32)
            w *= 1 / np.sqrt(dim)
            f.write(w.tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[dim, dim],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(w.nbytes))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            offset += w.nbytes
            inits.append(t)
            out = "y" if i == layers - 1 else f"m{i}"
            nodes.append(helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [out]))
            if i < layers - 1:
                nodes.append(helper.make_node("Relu", [out], [f"h{i}"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])], inits)
    path = os.path.join(folder, "mlp.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, offset


def measure(path: str, runtime: str, batch: int, dim: int, timeout: float = 1800) -> dict:
    """One runtime's row in a fresh process: {"peak", "after", "load", "load_cpu", "run", "sum"} or {"error"}."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, path, runtime, str(batch), str(dim)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict], weight_bytes: int) -> list[str]:
    lines = ["| Runtime | Peak added (MiB) | Peak / weights | Kept (MiB) | Load to first output (s) | CPU (s) "
             "| Next run (s) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['runtime']} | failed: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['runtime']} | {r['peak'] / 2**20:.0f} | {r['peak'] / weight_bytes:.2f}x | "
                     f"{r['after'] / 2**20:.0f} | {r['load']:.1f} | {r['load_cpu']:.1f} | {r['run']:.2f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help="comma list: ggml, ggml-<quantize>, numpy, "
                                                                   "onnxruntime")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the runtimes (each row printed)")
    ap.add_argument("--dir", default=None, help="where the model is written (default: the temporary folder)")
    ap.add_argument("--keep", action="store_true", help="leave the model's folder in place")
    args = ap.parse_args(argv)
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    for r in runtimes:
        if r not in RUNTIMES and not r.startswith("ggml-"):
            ap.error(f"unknown runtime {r!r}")
    if not os.path.exists("/proc/self/clear_refs"):
        ap.error("peak RSS is read from Linux's /proc")
    folder = tempfile.mkdtemp(prefix="mithril-load-", dir=args.dir)
    try:
        print(f"writing {args.layers} x [{args.dim}, {args.dim}] float32 weights to {folder}", file=sys.stderr)
        path, weight_bytes = write_mlp(folder, args.layers, args.dim, args.batch)
        rows = []
        for _ in range(args.repeats):
            for runtime in runtimes:
                row = {"runtime": runtime, **measure(path, runtime, args.batch, args.dim)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.layers} MatMuls of [{args.dim}, {args.dim}], {weight_bytes / 2**20:.0f} MiB of float32 weights "
          f"as external data, batch {args.batch}:")
    print("\n".join(table(rows, weight_bytes)))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
