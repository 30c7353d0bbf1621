#!/usr/bin/env python
"""Issue 21's four exports, made from the frameworks' own modules with seeded random weights.

    python scripts/export_models.py out_dir                      # all four .onnx files
    python scripts/export_models.py out_dir --models resnet18,gpt2_h256

- ``resnet18``, ``mobilenet_v2``: torchvision's architectures (``torchvision.models`` when it
  imports, else ``models_zoo.torch_reference``, the same modules written here because the
  torchvision wheel does not load against the pinned CPU torch), batch norms with random
  statistics, ``torch.onnx.export`` (TorchScript exporter), opset 17, input ``input`` 1x3x224x224.
- ``bert_h256``: transformers ``BertModel`` (hidden 256, 4 layers, 4 heads, intermediate 1024),
  opset 17, input ``input_ids`` 1x128; outputs ``last_hidden_state`` and ``pooler_output``.
- ``gpt2_h256``: transformers ``GPT2LMHeadModel`` (4 layers, 256 wide, 4 heads, ``use_cache=False``,
  its 50,257-word tied LM head), ``torch.onnx.export(dynamo=True)`` at opset 18 (the dynamo
  exporter's lowest; its down-conversion to 17 leaves Split's ``num_outputs``, which onnxruntime
  rejects), input ``input_ids`` 1x128; output ``logits``.

Bench code imports :func:`build` (the torch module and example inputs, no export) and
:func:`export` (both, and the file). No weights are downloaded: every model is built from its config.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("resnet18", "mobilenet_v2", "bert_h256", "gpt2_h256")
OPSET = 17
DYNAMO_OPSET = 18  # the dynamo exporter implements no lower opset
IMAGE_SIZE = 224
SEQ = 128


@dataclass
class Export:
    """A model ready to export or run: the eval-mode torch module (its forward takes the inputs in
    order and returns the tensor or tuple of tensors named ``output_names``), seeded inputs, and the
    exporter."""

    name: str
    module: object  # torch.nn.Module
    inputs: dict[str, np.ndarray]
    output_names: tuple[str, ...]
    exporter: str  # "torchscript" or "dynamo"
    source: str  # where the architecture came from, for the report

    def torch_inputs(self) -> tuple:
        import torch

        return tuple(torch.from_numpy(v) for v in self.inputs.values())

    def run_torch(self) -> dict[str, np.ndarray]:
        """The module's outputs on :attr:`inputs`, under torch.no_grad."""
        import torch

        with torch.no_grad():
            out = self.module(*self.torch_inputs())
        out = out if isinstance(out, tuple) else (out,)  # the vision modules return one tensor
        return {k: v.numpy() for k, v in zip(self.output_names, out)}


def _vision_module(name: str):
    try:
        import torchvision.models as tvm

        return getattr(tvm, name)(weights=None), "torchvision.models"
    except Exception:  # not installed, or its wheel does not load against this torch
        from models_zoo import torch_reference

        return getattr(torch_reference, name)(), "models_zoo.torch_reference (torchvision's architecture)"


def _randomize_batchnorm(module, seed: int) -> None:
    # Fresh batch norms are identities; random statistics make the ports' batch norm do real work.
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)


class _Outputs:
    """Wraps a transformers model so its forward takes ``input_ids`` and returns a tuple (exporters
    and the ports want tensors with fixed names, not a ModelOutput)."""

    @staticmethod
    def wrap(model, keys: tuple[str, ...]):
        import torch

        class TupleOutput(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids):
                out = self.model(input_ids=input_ids, return_dict=True)
                return tuple(out[k] for k in keys)

        return TupleOutput().eval()


def build(name: str, seed: int = 0, image_size: int = IMAGE_SIZE, seq: int = SEQ) -> Export:
    """The eval-mode torch module of ``name`` with seeded random weights and seeded inputs (batch 1;
    ``image_size`` and ``seq`` smaller than the defaults make fast test cases)."""
    import torch

    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if name in ("resnet18", "mobilenet_v2"):
        module, source = _vision_module(name)
        _randomize_batchnorm(module, seed)
        x = rng.standard_normal((1, 3, image_size, image_size)).astype(np.float32)
        return Export(name, module.eval(), {"input": x}, ("output",), "torchscript", source)
    if name == "bert_h256":
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
        model = BertModel(config).eval()
        keys = ("last_hidden_state", "pooler_output")
        ids = rng.integers(0, config.vocab_size, (1, seq)).astype(np.int64)
        return Export(name, _Outputs.wrap(model, keys), {"input_ids": ids}, keys, "torchscript", "transformers.BertModel")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, use_cache=False)
    model = GPT2LMHeadModel(config).eval()
    ids = rng.integers(0, config.vocab_size, (1, seq)).astype(np.int64)
    return Export(name, _Outputs.wrap(model, ("logits",)), {"input_ids": ids}, ("logits",), "dynamo",
                  "transformers.GPT2LMHeadModel")


def export(name: str, out_dir: str | os.PathLike, seed: int = 0, **sizes) -> tuple[str, Export]:
    """Build ``name`` (see :func:`build`) and write ``out_dir/name.onnx`` with its exporter (opset 17; 18 for dynamo);
    returns the path and the :class:`Export`."""
    import torch

    ex = build(name, seed, **sizes)
    path = os.path.join(out_dir, f"{name}.onnx")
    args = ex.torch_inputs()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if ex.exporter == "torchscript":
            buf = io.BytesIO()
            torch.onnx.export(ex.module, args, buf, input_names=list(ex.inputs), output_names=list(ex.output_names),
                              opset_version=OPSET, dynamo=False)
            data = buf.getvalue()
        else:
            program = torch.onnx.export(ex.module, args, input_names=list(ex.inputs),
                                        output_names=list(ex.output_names), opset_version=DYNAMO_OPSET, dynamo=True,
                                        optimize=True, verbose=False)
            data = program.model_proto.SerializeToString()
    with open(path, "wb") as f:
        f.write(data)
    return path, ex


def export_all(out_dir: str | os.PathLike, names=MODELS, seed: int = 0) -> dict[str, tuple[str, Export]]:
    """:func:`export` for each of ``names``: name -> (path, Export)."""
    os.makedirs(out_dir, exist_ok=True)
    return {n: export(n, out_dir, seed) for n in names}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list from {', '.join(MODELS)}")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}; choose from {', '.join(MODELS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    for n in names:
        t = time.perf_counter()
        path, ex = export(n, args.out_dir, args.seed)
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in ex.inputs.items())
        opset = DYNAMO_OPSET if ex.exporter == "dynamo" else OPSET
        print(f"{path}: {ex.source}, {ex.exporter} exporter, opset {opset}, {shapes}, "
              f"{os.path.getsize(path) / 2**20:.1f} MiB, {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
