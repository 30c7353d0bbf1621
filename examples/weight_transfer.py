#!/usr/bin/env python
"""Cross-backend weight transfer: parameters created on one backend move, by name, through NumPy
into every other backend, and give the same outputs there.

    python examples/weight_transfer.py --source torch
"""

from __future__ import annotations

import argparse

import numpy as np

import mithril as ml
import models_zoo
from mithril.backends.table import BACKENDS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="numpy", help="backend whose random parameters are transferred")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()

    model = models_zoo.lenet(num_classes=10)
    x = np.random.default_rng(0).standard_normal((args.batch, 1, 32, 32)).astype(np.float32)
    shapes = {"input": list(x.shape)}
    backends = {name: e.load()() for name, e in BACKENDS.items() if e.installed()}
    source = backends.get(args.source)
    if source is None:
        raise SystemExit(f"weight_transfer: backend {args.source!r} is not available here ({', '.join(backends)})")

    pm = ml.compile(model, source, shapes=shapes)
    params = pm.randomize_params()  # arrays of the source backend
    want = source.to_numpy(pm.evaluate(params, {"input": source.from_numpy(x)})["output"])
    as_numpy = {k: source.to_numpy(v) for k, v in params.items()}
    print(f"{len(as_numpy)} parameters from {source.name}: {', '.join(sorted(as_numpy)[:4])}, ...")

    worst = 0.0
    for name, backend in backends.items():
        target = ml.compile(model, backend, shapes=shapes)
        if sorted(target.parameter_keys) != sorted(as_numpy):  # the same names on every backend
            raise SystemExit(f"weight_transfer: {name} names the parameters {sorted(target.parameter_keys)}, "
                             f"{source.name} {sorted(as_numpy)}")
        moved = {k: backend.from_numpy(v) for k, v in as_numpy.items()}
        got = backend.to_numpy(target.evaluate(moved, {"input": backend.from_numpy(x)})["output"])
        diff = float(np.max(np.abs(got - want)))
        worst = max(worst, diff)
        print(f"{source.name} -> {name:6} max |diff| {diff:.2e}")
    # Exporting with the same parameters gives an ONNX file that agrees too.
    proto = ml.export_onnx(model, shapes=shapes, params=params)
    import onnxruntime as ort

    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    onnx_diff = float(np.max(np.abs(ref - want)))
    print(f"{source.name} -> onnx   max |diff| {onnx_diff:.2e}")
    if worst >= 1e-4 or not np.allclose(ref, want, rtol=1e-4, atol=1e-5):
        raise SystemExit(f"weight_transfer: outputs differ after the transfer (worst backend {worst:.2e}, "
                         f"onnxruntime {onnx_diff:.2e}; allowed 1e-4)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
