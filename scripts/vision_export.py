"""Build a vision model from its config, with random weights, and export it to ONNX: a timm model
(``--timm NAME``) or an Ultralytics YOLO (``--ultralytics CONFIG.yaml``), through torch.onnx's
TorchScript exporter (``--exporter torchscript``, opset 17) or its dynamo exporter
(``--exporter dynamo``). The files the GGML robustness tests run, as users make them.

timm and Ultralytics need torchvision, and the only torchvision wheel for torch 2.13 that
scripts/dev.sh can install is a CUDA build whose compiled ops do not load with the CPU build of
torch. So scripts/dev.sh installs timm, torchvision, ultralytics (and the few packages of theirs
the environment lacks) without dependencies into a folder of their own (``.venv/vision``) that
this script puts first on ``sys.path``, where nothing else imports them; torchvision's two
operators its Python code registers fake kernels for at import are declared first when its
compiled library is missing (the models never call them). Run it with the environment's Python:

    python scripts/vision_export.py --timm regnetx_002 --exporter torchscript --size 224 --out regnetx.onnx
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OVERLAY = Path(sys.prefix) / "vision"


def available() -> bool:
    """Whether timm, torchvision and ultralytics are in the overlay (or the environment)."""
    import importlib.util

    if all((OVERLAY / name).is_dir() for name in ("timm", "torchvision", "ultralytics")):
        return True
    return all(importlib.util.find_spec(name) is not None for name in ("timm", "torchvision", "ultralytics"))


def _import_torchvision() -> None:
    import torch

    if OVERLAY.is_dir():
        sys.path.insert(0, str(OVERLAY))
    try:
        import torchvision  # noqa: F401, F811
        return
    except RuntimeError as exc:  # its compiled ops did not load: "operator torchvision::nms does not exist"
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _import_torchvision.keep = lib  # the definitions live as long as the library object
    import torchvision  # noqa: F401, F811


def build(args):
    import torch

    torch.manual_seed(args.seed)
    _import_torchvision()
    if args.timm:
        import timm

        return timm.create_model(args.timm, pretrained=False).eval()
    os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(args.out).parent))  # its settings file, not ~/.config
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(args.ultralytics, verbose=False).eval()
    for m in model.modules():  # inference outputs only (the decoded boxes), as its own ONNX export
        if hasattr(m, "export"):
            m.export = True
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--timm", help="a timm model name (timm.create_model)")
    group.add_argument("--ultralytics", help="an Ultralytics model config (yolov8n.yaml, yolo11n.yaml, ...)")
    ap.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript")
    ap.add_argument("--opset", type=int, default=17, help="the TorchScript exporter's opset (dynamo: its default)")
    ap.add_argument("--size", type=int, default=224, help="image height and width")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import warnings

    import torch

    torch.set_num_threads(1)
    model = build(args)
    x = torch.randn(args.batch, 3, args.size, args.size)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if args.exporter == "torchscript":
            torch.onnx.export(model, (x,), args.out, input_names=["x"], output_names=["y"], opset_version=args.opset,
                              dynamo=False)
        else:
            torch.onnx.export(model, (x,), args.out, input_names=["x"], output_names=["y"], dynamo=True,
                              external_data=False)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
