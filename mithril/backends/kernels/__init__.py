"""Shared ONNX kernels, a module per op family. Importing this package registers them all."""

from importlib import import_module

FAMILIES = (
    "elementwise",
    "reduce",
    "normalization",
    "loss",
    "shape",
    "nn",
    "image",
    "attention",
    "rnn",
    "quantize",
    "contrib_quantize",
    "contrib_text",
    "random",
    "signal",
    "strings",
    "text",
    "training",
    "control_flow",
    "sequence",
    "autodiff",
    "contrib",
    "ml",
)

for _family in FAMILIES:
    import_module(f"{__name__}.{_family}")
