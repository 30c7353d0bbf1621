#!/usr/bin/env python
"""Compose an imported ONNX backbone with a new head and a loss: a PyTorch ResNet-18 exported to
ONNX becomes a block of a Mithril model, gets a fresh 10-class head and a cross-entropy loss,
trains the head for a few steps on a backend with gradients, and exports the whole thing.

    python examples/onnx_backbone.py --image-size 64 --steps 20
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

import mithril as ml
from mithril.cli import make_backends
from mithril.frontend.onnx_block import OnnxBlock
from mithril.models import CrossEntropy, IOKey, Linear, Mean, Model


def export_backbone(path: Path, image_size: int) -> None:
    from models_zoo import torch_reference

    spec = torch_reference.build("resnet18", image_size=image_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notes
        torch_reference.export_onnx(spec, "torchscript", str(path))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--backends", default="all", help="comma-separated names, or all")
    args = p.parse_args()

    path = Path(tempfile.mkdtemp()) / "resnet18.onnx"
    export_backbone(path, args.image_size)
    backbone = ml.load_onnx(path)
    print(f"loaded {backbone}")

    model = Model()
    model |= OnnxBlock(backbone, name="backbone")(input="input", output="features")
    model += Linear(dimension=10, name="head")(output=IOKey("logits", expose=True))
    model |= CrossEntropy()(input=model.head.output, target="label")
    model += Mean()(output="loss")
    print(f"features {model.shape_of('features')} -> logits {model.shape_of('logits')}")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, args.image_size, args.image_size)).astype(np.float32)
    label = rng.integers(0, 10, args.batch).astype(np.int64)
    shapes = {"input": list(x.shape), "label": [args.batch]}
    head = {"head.weight", "head.bias"}

    pretrained = model.backbone.pretrained_params()  # the ONNX file's weights, by parameter name
    backends = make_backends(args.backends)
    trainer = next((b for b in backends if b.name in ("torch", "jax")), None)
    losses = {}
    params = None
    for backend in backends:
        pm = ml.compile(model, backend, shapes=shapes, trainable_keys=head)
        if params is None:
            params = {k: np.asarray(backend.to_numpy(v)) for k, v in pm.randomize_params().items()}
            params.update(pretrained)
        out = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                          {"input": backend.from_numpy(x), "label": backend.from_numpy(label)})
        losses[backend.name] = float(backend.to_numpy(out["loss"]))
        print(f"{backend.name:6} loss {losses[backend.name]:.6f}")
    spread = max(losses.values()) - min(losses.values())
    if spread > 1e-4 * max(1.0, abs(min(losses.values()))):
        print(f"backends disagree on the loss (spread {spread:.2e})")
        return 1

    if trainer is not None and args.steps > 0:
        pm = ml.compile(model, trainer, shapes=shapes, trainable_keys=head)
        p_b = {k: trainer.from_numpy(v) for k, v in params.items()}
        data = {"input": trainer.from_numpy(x), "label": trainer.from_numpy(label)}
        first = last = None
        for step in range(args.steps):
            out, grads = pm.evaluate(p_b, data, output_gradients={"loss": trainer.from_numpy(np.float32(1.0))})
            last = float(trainer.to_numpy(out["loss"]))
            first = last if first is None else first
            for k in head:  # plain SGD on the new head; the imported backbone stays frozen
                p_b[k] = trainer.from_numpy(trainer.to_numpy(p_b[k]) - args.lr * trainer.to_numpy(grads[k]))
        print(f"trained the head on {trainer.name} for {args.steps} steps: loss {first:.4f} -> {last:.4f}")
        if not last < first:
            return 1
        params.update({k: trainer.to_numpy(p_b[k]) for k in head})

    out_path = path.with_name("resnet18_with_head.onnx")
    ml.export_onnx(model, out_path, shapes=shapes, params=params)
    report = ml.validate(out_path, backends[:1], inputs={"input": x, "label": label})
    print(f"exported {out_path}; onnxruntime agrees: {report.passed}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
