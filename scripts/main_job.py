#!/usr/bin/env python
"""The main job: build the zoo's ResNet-18 with the weights of a PyTorch ResNet-18, export it to
ONNX and load it back; export the PyTorch model itself to ONNX (an external file); run both on
every installed backend, compare with PyTorch, validate each against onnxruntime, print the tables.

    python scripts/main_job.py [--image-size 224] [--batch 2] [--out out/]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

import mithril as ml
import models_zoo
from mithril.cli import available_backends, console as make_console
from models_zoo.torch_reference import build, export_onnx
from models_zoo.weights import resnet18_params


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--out", default="out", help="folder for the exported .onnx files and generated code")
    args = p.parse_args()
    console = make_console()  # a log or a pipe keeps every figure: lines as long as their content
    out = Path(args.out)
    out.mkdir(exist_ok=True)

    # The external file: torch.onnx's export of a torchvision-architecture ResNet-18.
    spec = build("resnet18", image_size=args.image_size)
    torch_path = out / "resnet18_torch.onnx"
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notes
        export_onnx(spec, "torchscript", str(torch_path))
    console.print(f"exported PyTorch ResNet-18 to {torch_path} in {time.perf_counter() - t0:.1f} s")

    # The zoo model: Mithril blocks, the same weights mapped from the torch state_dict.
    t0 = time.perf_counter()
    zoo = models_zoo.resnet18(num_classes=1000)
    zoo_path = out / "resnet18_zoo.onnx"
    ml.export_onnx(zoo, zoo_path, params=resnet18_params(spec.module.state_dict()), dynamic_axes={"input": [0]})
    console.print(f"built models_zoo.resnet18 and exported it to {zoo_path} in {time.perf_counter() - t0:.1f} s")

    models = {"zoo (Mithril export)": ml.load_onnx(zoo_path), "PyTorch export": ml.load_onnx(torch_path)}
    for label, model in models.items():
        console.print(f"loaded {label}: {model}")

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
    for col in ("model", "backend", "compile s", "run ms", "max abs err vs PyTorch"):
        timing.add_column(col, justify="left" if col in ("model", "backend") else "right")
    for label, model in models.items():
        tag = "zoo" if label.startswith("zoo") else "torch"
        for b in backends:
            t0 = time.perf_counter()
            pm = ml.compile(model, b, shapes={"input": list(x.shape)},
                            file_path=str(out / f"resnet18_{tag}_{b.name}.py"))
            compile_s = time.perf_counter() - t0
            params = pm.get_parameters()
            pm.evaluate(params, {"input": b.from_numpy(x)})  # warm-up (jit tracing)
            t0 = time.perf_counter()
            y = b.to_numpy(pm.evaluate(params, {"input": b.from_numpy(x)})["output"])
            run_ms = 1e3 * (time.perf_counter() - t0)
            timing.add_row(label, b.name, f"{compile_s:.2f}", f"{run_ms:.1f}",
                           f"{np.max(np.abs(y - torch_out)):.2e}")
    console.print(timing)

    passed = True
    for label, model in models.items():
        report = ml.validate(model, backends, inputs={"input": x}, per_node=False)
        table = report.table()
        table.title = f"{label}: every backend vs onnxruntime"
        console.print(table)
        passed &= report.passed
    console.print("[green]both models match onnxruntime on every backend[/green]" if passed
                  else "[red]validation failed[/red]")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
