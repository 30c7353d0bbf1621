"""``ml.export_onnx``: a logical Model (or a loaded ONNX model) to an ONNX file or proto."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import onnx

from .errors import BackendOptionError, ExportError, MithrilError, public_api


@public_api(ExportError, "export_onnx")
def export_onnx(
    model,
    path: str | os.PathLike | None = None,
    shapes: Mapping[str, Iterable[int]] | None = None,
    params: Mapping[str, Any] | None = None,
    opset: int | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    dtype=None,
) -> onnx.ModelProto:
    """Export ``model`` (a logical Model, a TrainModel's training graph, or a loaded ONNX model) to
    ONNX, write it to ``path`` when given, and return the ModelProto.

    ``shapes`` fixes input dims (dims not given stay symbolic ``dim_param``s); ``dynamic_axes``
    (``{"input": {0: "batch"}}`` or ``{"input": [0]}``) keeps given dims symbolic in the graph.
    ``params`` (arrays of any backend, keyed by the names ``ml.compile`` reports) become
    initializers; missing ones are randomized and a :class:`RandomParamsWarning` says so.
    ``opset`` defaults to the newest the installed onnxruntime loads. ``dtype`` is the type of every
    float the model leaves open: by default that of the floating ``params`` when they share one
    (parameters trained on ``NumpyBackend(dtype=ml.float64)`` export as float64), else float32.

    >>> import mithril as ml
    >>> from mithril.models import Model, Relu
    >>> m = Model()
    >>> m |= Relu()(input="input", output="output")
    >>> proto = ml.export_onnx(m, shapes={"input": [2, 3]})
    >>> [n.op_type for n in proto.graph.node]
    ['Relu']
    """
    from .frontend.model import Model
    from .frontend.onnx_export import build_onnx
    from .frontend.train import TrainModel
    from .onnx_bridge.load import OnnxModel, load_onnx

    if dtype is None and params:
        dtype = _params_float_dtype(params)
    if isinstance(model, Model):
        proto, _ = build_onnx(model, shapes=shapes, params=params, opset=opset, dynamic_axes=dynamic_axes,
                              warn_random=True, dtype=dtype)
        onnx.checker.check_model(proto, full_check=True)
    elif isinstance(model, TrainModel):
        # The training graph: the model's outputs, the buffer updates and "loss".
        proto = model.build_onnx(shapes=shapes, params=params, opset=opset, dynamic_axes=dynamic_axes, dtype=dtype)
        onnx.checker.check_model(proto, full_check=True)
    else:
        proto = (model if isinstance(model, OnnxModel) else load_onnx(model)).to_proto()
    if path is not None:
        onnx.save(proto, os.fspath(path))
    return proto


def _params_float_dtype(params: Mapping[str, Any]):
    """The one floating dtype of ``params``, or None when they have none or several."""
    import numpy as np

    from .frontend.onnx_export import to_numpy

    kinds = {a.dtype for a in (np.asarray(to_numpy(v)) for v in params.values())
             if a.dtype.kind == "f" or a.dtype.name == "bfloat16"}
    return kinds.pop() if len(kinds) == 1 else None


@public_api(MithrilError, "save_gguf")  # each writer raises its own GGUFFileError
def save_gguf(source, path: str | os.PathLike, quantize: str | None = None, *, name: str | None = None,
              params: Mapping | None = None, arch: str | None = None, tokenizer=None, config=None) -> None:
    """Write a GGUF file: a model's parameters, or with ``arch`` a decoder LLM llama.cpp runs.

    Without ``arch``: the parameters of a compiled model or a parameter dict, as GGMLBackend
    stores them (:func:`mithril.backends.ggml.gguf_io.save_gguf`: ``params``, ``quantize``,
    ``name``). ``arch`` (``"auto"``, ``"gpt2"``, ``"llama"``, ``"qwen2"``, ``"phi3"``): the ONNX
    decoder ``source`` (exported with its key/value cache: a path, a loaded or compiled model),
    its ``tokenizer`` and ``config``, as a llama.cpp model file
    (:func:`mithril.backends.ggml.llama_gguf.save_llama_gguf`; docs/gguf.md).
    """
    from .backends.ggml.gguf_io import save_gguf as save_params_gguf
    from .backends.ggml.llama_gguf import save_llama_gguf

    if arch is None:
        if tokenizer is not None or config is not None:
            raise BackendOptionError("save_gguf: tokenizer= and config= describe a llama.cpp model file: give arch= "
                                     "(\"auto\", \"gpt2\", \"llama\", \"qwen2\" or \"phi3\") too")
        save_params_gguf(source, path, quantize, name=name, params=params)
        return
    if params is not None:
        raise BackendOptionError("save_gguf(arch=...): the decoder's weights come from its ONNX file; params= is "
                                 "for a compiled model's parameters (without arch)")
    save_llama_gguf(source, path, arch, quantize, tokenizer=tokenizer, config=config, name=name)


__all__ = ["export_onnx", "save_gguf"]
