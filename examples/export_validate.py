#!/usr/bin/env python
"""Export a zoo model to ONNX, then validate every installed backend against onnxruntime.

    python examples/export_validate.py --model gpt --out gpt.onnx

``--out`` names the file to write (here ./gpt.onnx); without it the file goes to a temporary
folder that is removed on exit.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx

import mithril as ml
import models_zoo
from mithril.backends.table import BACKENDS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt", choices=["gpt", "vit", "lstm_classifier", "lenet"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16, help="sequence length (gpt, lstm_classifier)")
    p.add_argument("--out", help="where to write the .onnx (default: a temporary folder)")
    args = p.parse_args()

    rng = np.random.default_rng(0)
    if args.model == "gpt":
        model = models_zoo.create_gpt(bias=True, block_size=64, dims=32, num_heads=4, num_layers=2, vocab_size=128)
        x = rng.integers(0, 128, (args.batch, args.seq)).astype(np.int64)
    elif args.model == "lstm_classifier":
        model = models_zoo.lstm_classifier(vocab_size=128, num_classes=4)
        x = rng.integers(0, 128, (args.batch, args.seq)).astype(np.int64)
    elif args.model == "vit":
        model = models_zoo.vit(image_size=32, patch_size=8)
        x = rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
    else:
        model = models_zoo.lenet()
        x = rng.standard_normal((args.batch, 1, 32, 32)).astype(np.float32)

    if args.out:
        return export_and_validate(model, x, Path(args.out), kept=True)
    with tempfile.TemporaryDirectory(prefix="mithril-export-") as tmp:
        return export_and_validate(model, x, Path(tmp) / f"{args.model}.onnx", kept=False)


def export_and_validate(model, x: np.ndarray, path: Path, kept: bool) -> int:
    # Parameters from a compiled model; the batch axis stays dynamic in the file.
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": list(x.shape)})
    proto = ml.export_onnx(model, path, params=pm.get_parameters(), dynamic_axes={"input": [0]})
    onnx.checker.check_model(onnx.load(path), full_check=True)
    where = path if kept else f"{path.name} (in a temporary folder; --out keeps it)"
    print(f"wrote {where} ({path.stat().st_size / 1e6:.2f} MB, opset {proto.opset_import[0].version}, "
          f"{len(proto.graph.node)} nodes); onnx.checker full check passed")

    loaded = ml.load_onnx(path)
    backends = [e.load()() for e in BACKENDS.values() if e.installed()]
    report = ml.validate(loaded, backends, inputs={"input": x})
    print(report)  # plain text: every figure survives a log's 80 columns
    if not report.passed:
        raise SystemExit(f"export_validate: some backend disagrees with onnxruntime on {path.name}:\n{report}")
    print("every backend matches onnxruntime")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
