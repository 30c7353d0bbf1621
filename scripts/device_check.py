#!/usr/bin/env python
"""Run the zoo's models on a GPU through JaxBackend and TorchBackend and compare with NumPy on the
CPU: outputs, one gradient, and the median time per call. For a machine with an accelerator (the
device tool's), where the test suite (CPU-only) does not go.

    python scripts/device_check.py               # prints a Markdown table
    python scripts/device_check.py --out FILE    # also writes it to FILE
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mithril as ml  # noqa: E402
import models_zoo  # noqa: E402

MODELS = {
    "mlp": (lambda: models_zoo.mlp([256, 256, 10]), {"input": (64, 128)}, "float"),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), {"input": (8, 3, 64, 64)}, "float"),
    "gpt": (lambda: models_zoo.create_gpt(bias=True, block_size=128, dims=256, num_heads=4, num_layers=4,
                                          vocab_size=1024), {"input": (4, 128)}, "tokens"),
}


def _data(kind, shapes):
    rng = np.random.default_rng(0)
    if kind == "tokens":
        return {k: rng.integers(0, 1024, s) for k, s in shapes.items()}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _median_ms(fn, repeat=20):
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def check(name, backend):
    build, shapes, kind = MODELS[name]
    model = build()
    ref = ml.compile(model, ml.NumpyBackend(), shapes=shapes, inference=True)
    params = {k: np.asarray(v) for k, v in ref.randomize_params().items()}
    for k in params:
        if k.endswith("running_var"):
            params[k] = np.abs(params[k]) + 0.5
    data = _data(kind, shapes)
    want = np.asarray(ref.evaluate(params, data)["output"])
    pm = ml.compile(model, backend, shapes=shapes, inference=True)
    p = {k: backend.array(v) for k, v in params.items()}
    d = {k: backend.array(v) for k, v in data.items()}
    got = backend.to_numpy(pm.evaluate(p, d)["output"])
    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-12))
    ms = _median_ms(lambda: backend.to_numpy(pm.evaluate(p, d)["output"]))
    cpu_ms = _median_ms(lambda: ref.evaluate(params, data), repeat=5)
    return err, ms, cpu_ms


def gradient_check(backend):
    """One gradient of the MLP's mean output on the device equals NumPy's on the CPU."""
    model = models_zoo.mlp([32, 10])
    shapes = {"input": (16, 24)}
    ref = ml.compile(model, ml.NumpyBackend(), shapes=shapes)
    params = {k: np.asarray(v) for k, v in ref.randomize_params().items()}
    data = _data("float", shapes)
    seed = {"output": np.full((16, 10), 1 / 160, np.float32)}
    _, want = ref.evaluate(params, data, output_gradients=seed)
    pm = ml.compile(model, backend, shapes=shapes)
    _, got = pm.evaluate({k: backend.array(v) for k, v in params.items()},
                         {k: backend.array(v) for k, v in data.items()},
                         output_gradients={k: backend.array(v) for k, v in seed.items()})
    return max(float(np.abs(backend.to_numpy(got[k]) - want[k]).max() / (np.abs(want[k]).max() + 1e-12)) for k in want)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    backends = []
    try:
        import torch

        if torch.cuda.is_available():
            backends.append(("torch", lambda: ml.TorchBackend(device="cuda"), torch.cuda.get_device_name(0)))
    except ImportError:
        pass
    try:
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            backends.append(("jax", lambda: ml.JaxBackend(device="gpu"), str(jax.devices("gpu")[0].device_kind)))
    except (ImportError, RuntimeError):
        pass
    if not backends:
        print("no GPU found for torch or jax")
        return 1
    lines = [f"Device check: {', '.join(f'{n} on {d}' for n, _, d in backends)}; Python {platform.python_version()}",
             "", "| backend | model | max rel. error vs NumPy (CPU) | ms per call (GPU) | ms per call (NumPy, CPU) |",
             "|---|---|---|---|---|"]
    failures = 0
    for bname, make, _ in backends:
        for name in MODELS:
            try:
                err, ms, cpu_ms = check(name, make())
                lines.append(f"| {bname} | {name} | {err:.1e} | {ms:.2f} | {cpu_ms:.1f} |")
                failures += err > 1e-2
            except Exception as exc:  # report every row, then fail
                lines.append(f"| {bname} | {name} | {type(exc).__name__}: {str(exc)[:200]} | | |")
                failures += 1
        try:
            lines.append(f"| {bname} | mlp gradient | {gradient_check(make()):.1e} | | |")
        except Exception as exc:
            lines.append(f"| {bname} | mlp gradient | {type(exc).__name__}: {str(exc)[:200]} | | |")
            failures += 1
        print("\n".join(lines[-len(MODELS) - 1:]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
