#!/usr/bin/env python
"""Train LeNet-5 on scikit-learn's digits on any backend, with a progress bar, then save the
parameters, reload them on another backend, and export the trained model to ONNX.

    python examples/train_lenet_digits.py --backend jax --epochs 15
    python examples/train_lenet_digits.py --backend torch --epochs 2 --out lenet

The 8x8 images are upsampled to LeNet's 32x32 (each pixel repeated 4x4), the first 1,500 train
and the other 297 test; training images move by up to 2 pixels (the test digits are other
writers'). Adam with a linearly decaying rate; 15 epochs reach about 96% on every backend.
``--out DIR`` keeps lenet.safetensors and lenet.onnx there (the second command writes ./lenet/);
without it they go to a temporary folder that is removed on exit.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import mithril as ml
import models_zoo
from mithril.models import CrossEntropy, Mean, TrainModel
from mithril.backends.table import BACKENDS
from mithril.optimizers import Adam, fit



def load_digits(n_train: int = 1500):
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = (d.images / 16.0).repeat(4, axis=1).repeat(4, axis=2)[:, None]
    x = ((x - x[:n_train].mean()) / x[:n_train].std()).astype(np.float32)
    y = d.target.astype(np.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def batches(backend, x, y, batch: int, shift: int = 2):
    def epoch_batches(epoch):
        rng = np.random.default_rng(epoch)
        perm = rng.permutation(len(x))
        for i in range(0, len(x) - batch + 1, batch):
            idx = perm[i:i + batch]
            pad = np.pad(x[idx], ((0, 0), (0, 0), (shift, shift), (shift, shift)))
            at = rng.integers(0, 2 * shift + 1, (batch, 2))
            xb = np.stack([pad[j, :, a:a + 32, b:b + 32] for j, (a, b) in enumerate(at)])
            yield {"input": backend.from_numpy(xb), "target": backend.from_numpy(y[idx])}

    return epoch_batches


def accuracy(backend, params, x, y) -> float:
    pm = ml.compile(models_zoo.lenet(num_classes=10), backend, shapes={"input": list(x.shape)}, inference=True)
    out = pm.evaluate({k: params[k] for k in pm.parameter_keys}, {"input": backend.from_numpy(x)})["output"]
    return float((backend.to_numpy(out).argmax(axis=1) == y).mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="jax", choices=sorted(BACKENDS))
    p.add_argument("--reload-on", default="numpy", choices=sorted(BACKENDS),
                   help="backend the saved parameters load into")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default=None, help="folder for lenet.safetensors and lenet.onnx (default: a temporary one)")
    args = p.parse_args()

    xtr, ytr, xte, yte = load_digits()
    backend = BACKENDS[args.backend].load()()
    tm = TrainModel(models_zoo.lenet(num_classes=10))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    pm = ml.compile(tm, backend, shapes={"input": [args.batch, 1, 32, 32], "target": [args.batch]},
                    data_keys={"input", "target"})
    steps = args.epochs * (len(xtr) // args.batch)
    opt = Adam(lambda step: args.lr * (1 - step / steps))
    params, _, losses = fit(pm, pm.randomize_params(), batches(backend, xtr, ytr, args.batch), opt, args.epochs)
    acc = accuracy(backend, params, xte, yte)
    print(f"{args.backend}: {steps} steps, final loss {losses[-1]:.4f}, test accuracy {acc:.1%}")

    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return save_reload_export(args, params, acc, xte, yte, Path(args.out))
    with tempfile.TemporaryDirectory(prefix="mithril-lenet-") as tmp:
        return save_reload_export(args, params, acc, xte, yte, Path(tmp))


def save_reload_export(args, params, acc: float, xte, yte, out: Path) -> int:
    """Save the parameters, reload them on another backend, export to ONNX and validate the file."""
    ml.save_params(params, out / "lenet.safetensors")
    other = BACKENDS[args.reload_on].load()()
    again = accuracy(other, ml.load_params(out / "lenet.safetensors", other), xte, yte)
    print(f"reloaded on {args.reload_on}: test accuracy {again:.1%}")
    if abs(again - acc) > 1e-9:
        raise SystemExit(f"train_lenet_digits: the parameters reloaded on {args.reload_on} give {again:.1%}, "
                         f"not the {acc:.1%} they gave on {args.backend}")
    ml.export_onnx(models_zoo.lenet(num_classes=10), out / "lenet.onnx", shapes={"input": [1, 1, 32, 32]},
                   params=params, dynamic_axes={"input": {0: "N"}})
    report = ml.validate(out / "lenet.onnx", [other], inputs={"input": xte[:8]})
    where = out / "lenet.onnx" if args.out else "lenet.onnx (in a temporary folder; --out DIR keeps it)"
    print(f"exported {where}; onnxruntime agrees: {report.passed}")
    if not report.passed:
        raise SystemExit(f"train_lenet_digits: {args.reload_on} disagrees with onnxruntime on lenet.onnx:\n{report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
