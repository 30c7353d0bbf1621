#!/usr/bin/env python
"""The main job: export a PyTorch ResNet-18 to ONNX, load it with Mithril, run it on every
installed backend, validate each against onnxruntime, and print the table.

    python scripts/main_job.py [--image-size 224] [--batch 2] [--out out/]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import mithril as ml
from mithril.cli import available_backends
from models_zoo.torch_reference import build, export_onnx


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--out", default="out", help="folder for the exported .onnx and generated code")
    args = p.parse_args()
    console = Console()
    out = Path(args.out)
    out.mkdir(exist_ok=True)

    spec = build("resnet18", image_size=args.image_size)
    path = out / "resnet18.onnx"
    t0 = time.perf_counter()
    export_onnx(spec, "torchscript", str(path))
    console.print(f"exported torchvision-architecture ResNet-18 to {path} in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    model = ml.load_onnx(path)
    console.print(f"loaded {model} in {time.perf_counter() - t0:.2f} s")

    x = np.random.default_rng(0).standard_normal((args.batch, 3, args.image_size, args.image_size)).astype(np.float32)
    with torch.no_grad():
        torch_out = spec.module(torch.from_numpy(x)).numpy()

    backends = []
    for name, cls in available_backends().items():
        try:
            backends.append(cls())
        except ml.MithrilError as exc:
            console.print(f"[yellow]skipping {name}: {exc}[/yellow]")
    timing = Table(title="ResNet-18 on every installed backend")
    for col in ("backend", "compile s", "run ms", "max abs err vs PyTorch"):
        timing.add_column(col, justify="right" if col != "backend" else "left")
    for b in backends:
        t0 = time.perf_counter()
        pm = ml.compile(model, b, shapes={"input": list(x.shape)}, file_path=str(out / f"resnet18_{b.name}.py"))
        compile_s = time.perf_counter() - t0
        params = pm.get_parameters()
        pm.evaluate(params, {"input": b.from_numpy(x)})  # warm-up
        t0 = time.perf_counter()
        y = b.to_numpy(pm.evaluate(params, {"input": b.from_numpy(x)})["output"])
        run_ms = 1e3 * (time.perf_counter() - t0)
        timing.add_row(b.name, f"{compile_s:.2f}", f"{run_ms:.1f}", f"{np.max(np.abs(y - torch_out)):.2e}")
    console.print(timing)

    report = ml.validate(model, backends, inputs={"input": x}, per_node=False)
    console.print(report.table())
    console.print("[green]every backend matches onnxruntime[/green]" if report.passed
                  else "[red]validation failed[/red]")
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
