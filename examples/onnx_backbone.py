#!/usr/bin/env python
"""Compose an imported ONNX backbone with a new head and a loss: a PyTorch ResNet-18 exported to
ONNX becomes a block of a Mithril model, gets a fresh 10-class head and a cross-entropy loss,
trains the head with Adam for a few steps (on JAX or PyTorch when among --backends, else the first one),
and exports the whole thing.

    python examples/onnx_backbone.py --image-size 64 --steps 20

The backbone's output, the head's input, is ResNet's 1,000 class scores (a row norm near 37 here),
so the head's loss is steep: plain SGD at lr 0.05 diverges (2.69 -> 25.6 in 20 steps, in PyTorch as
in Mithril), while Adam's per-parameter steps do not depend on that scale. Larger images or batches
(``--image-size 224 --batch 32``) work the same, only slower. The ONNX files go to a temporary
folder that is removed on exit; ``--out DIR`` keeps them.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np

import mithril as ml
from mithril import cli
from mithril.frontend.onnx_block import OnnxBlock
from mithril.models import CrossEntropy, IOKey, Linear, Mean, Model
from mithril.optimizers import Adam


def make_backends(spec: str) -> list:
    """``all`` (every backend that can start here) or comma-separated names: the command line's own
    ``--backend`` parsing (``mithril.cli.make_backends``), its errors as one line."""
    try:
        backends, skipped = cli.make_backends(spec)
    except ml.errors.MithrilError as exc:
        raise SystemExit(f"onnx_backbone: {exc}") from None
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    return backends


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
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate for the head")
    p.add_argument("--backends", default="all", help="comma-separated names, or all")
    p.add_argument("--out", help="folder for resnet18.onnx and resnet18_with_head.onnx (default: a temporary one)")
    args = p.parse_args()

    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return run(args, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="mithril-onnx-backbone-") as tmp:
        return run(args, Path(tmp))


def run(args, folder: Path) -> int:
    path = folder / "resnet18.onnx"
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
    trainers = [b for b in backends if b.supports_gradients]  # GGML runs inference only
    trainer = next((b for b in trainers if b.name in ("torch", "jax")), trainers[0] if trainers else None)
    if trainer is None and args.steps > 0:
        raise SystemExit("onnx_backbone: none of --backends trains; add numpy, jax, torch, mlx or c")
    losses = {}
    params = None
    for backend in backends:
        # GGML runs inference only: there the loss is evaluated, not differentiated.
        pm = (ml.compile(model, backend, shapes=shapes, trainable_keys=head) if backend.supports_gradients
              else ml.compile(model, backend, shapes=shapes, inference=True))
        if params is None:
            params = {k: np.asarray(backend.to_numpy(v)) for k, v in pm.randomize_params().items()}
            params.update(pretrained)
        out = pm.evaluate({k: backend.from_numpy(v) for k, v in params.items()},
                          {"input": backend.from_numpy(x), "label": backend.from_numpy(label)})
        losses[backend.name] = float(backend.to_numpy(out["loss"]))
        print(f"{backend.name:6} loss {losses[backend.name]:.6f}")
    spread = max(losses.values()) - min(losses.values())
    if spread > 1e-4 * max(1.0, abs(min(losses.values()))):
        raise SystemExit(f"onnx_backbone: the backends disagree on the loss by {spread:.2e}: {losses}")

    if args.steps > 0:
        pm = ml.compile(model, trainer, shapes=shapes, trainable_keys=head)
        p_b = {k: trainer.from_numpy(v) for k, v in params.items()}
        data = {"input": trainer.from_numpy(x), "label": trainer.from_numpy(label)}
        opt = Adam(args.lr)
        state = opt.init({k: p_b[k] for k in head})  # only the new head trains; the backbone stays frozen
        first = None
        for _ in range(args.steps):
            out, grads = pm.evaluate(p_b, data, output_gradients={"loss": trainer.from_numpy(np.float32(1.0))})
            first = float(trainer.to_numpy(out["loss"])) if first is None else first
            new_head, state = opt.update({k: p_b[k] for k in head}, {k: grads[k] for k in head}, state)
            p_b.update(new_head)
        last = float(trainer.to_numpy(pm.evaluate(p_b, data)["loss"]))  # after the last step
        print(f"trained the head on {trainer.name} for {args.steps} steps (Adam, lr {args.lr:g}): "
              f"loss {first:.4f} -> {last:.4f}")
        if not last < first:
            raise SystemExit(f"onnx_backbone: the head's loss did not go down in {args.steps} steps "
                             f"({first:.4f} -> {last:.4f}, Adam lr {args.lr:g}); try a smaller --lr")
        params.update({k: trainer.to_numpy(p_b[k]) for k in head})

    out_path = folder / "resnet18_with_head.onnx"
    ml.export_onnx(model, out_path, shapes=shapes, params=params)
    report = ml.validate(out_path, backends[:1], inputs={"input": x, "label": label})
    where = out_path if args.out else f"{out_path.name} (in a temporary folder; --out DIR keeps it)"
    print(f"exported {where}; onnxruntime agrees: {report.passed}")
    if not report.passed:
        raise SystemExit(f"onnx_backbone: {backends[0].name} disagrees with onnxruntime on the exported model:\n"
                         f"{report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
