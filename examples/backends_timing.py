#!/usr/bin/env python
"""The same zoo model on every installed backend: compile time, run time, and agreement with NumPy.

    python examples/backends_timing.py --model resnet18 --batch 4 --image-size 64 --repeats 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import mithril as ml
import models_zoo
from mithril import cli


def make_backends(spec: str) -> list:
    """``all`` (every backend that can start here) or comma-separated names: the command line's own
    ``--backend`` parsing (``mithril.cli.make_backends``), its errors as one line."""
    try:
        backends, skipped = cli.make_backends(spec)
    except ml.errors.MithrilError as exc:
        raise SystemExit(f"backends_timing: {exc}") from None
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    return backends


def build(name: str, batch: int, image_size: int):
    """A zoo model, its input shape and an input batch."""
    rng = np.random.default_rng(0)
    if name == "gpt":
        model = models_zoo.create_gpt(bias=True, block_size=64, dims=64, num_heads=4, num_layers=2, vocab_size=256)
        return model, rng.integers(0, 256, (batch, 32)).astype(np.int64)
    if name == "lenet":
        return models_zoo.lenet(num_classes=10), rng.standard_normal((batch, 1, 32, 32)).astype(np.float32)
    builder = {"resnet18": models_zoo.resnet18, "resnet34": models_zoo.resnet34, "resnet50": models_zoo.resnet50}
    if name in builder:
        model = builder[name](num_classes=10)
    elif name == "vit":
        model = models_zoo.vit(image_size=image_size, patch_size=image_size // 4)
    else:
        raise SystemExit(f"backends_timing: unknown model {name!r}")
    return model, rng.standard_normal((batch, 3, image_size, image_size)).astype(np.float32)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", choices=["lenet", "resnet18", "resnet34", "resnet50", "vit", "gpt"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backends", default="all", help="comma-separated names, or all")
    args = p.parse_args()
    backends = make_backends(args.backends)

    model, x = build(args.model, args.batch, args.image_size)
    shapes = {"input": list(x.shape)}
    # One set of parameters (NumPy arrays) shared by every backend: they move by name.
    params = {k: np.asarray(v) for k, v in ml.compile(model, ml.NumpyBackend(), shapes=shapes).get_parameters().items()}

    print(f"{args.model}: input {list(x.shape)}, {sum(v.size for v in params.values()):,} parameters")
    print(f"{'backend':8} {'compile s':>10} {'first run ms':>13} {'median run ms':>14} {'max |diff| vs numpy':>20}")
    reference = None
    for backend in backends:
        t0 = time.perf_counter()
        pm = ml.compile(model, backend, shapes=shapes)
        compile_s = time.perf_counter() - t0
        p_b = {k: backend.from_numpy(v) for k, v in params.items()}
        data = {"input": backend.from_numpy(x)}
        t0 = time.perf_counter()
        y = backend.to_numpy(pm.evaluate(p_b, data)["output"])  # includes jit tracing where there is one
        first_ms = 1e3 * (time.perf_counter() - t0)
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            backend.to_numpy(pm.evaluate(p_b, data)["output"])  # to_numpy waits for async backends
            runs.append(1e3 * (time.perf_counter() - t0))
        if reference is None:
            reference = y
        diff = float(np.max(np.abs(y - reference)))
        print(f"{backend.name:8} {compile_s:10.2f} {first_ms:13.1f} {np.median(runs):14.1f} {diff:20.2e}")
        if diff > 1e-3 * max(1.0, float(np.abs(reference).max())):
            raise SystemExit(f"backends_timing: {backend.name} differs from the first backend by {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
