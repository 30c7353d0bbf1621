"""GGUF files in and out (llama.cpp's weight format, through the ``gguf`` package).

``save_gguf(pm, path)`` writes a compiled GGML model's weights as GGMLBackend stores them (type,
layout, rows padded to whole blocks), so ``load_gguf`` gives back tensors GGMLBackend reads
without re-quantizing; ``save_gguf(params, path, quantize="q8_0")`` quantizes a parameter dict
by rows (matrices only; 1-D tensors stay float32). Metadata: ``general.name``, and under
``mithril.`` the model's inputs (names, shapes, dtypes), outputs, and per tensor its parameter
name, ggml type, layout and shape.

>>> import mithril as ml, numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "w.gguf")
>>> ml.save_gguf({"fc.weight": np.ones((4, 64), np.float32), "fc.bias": np.zeros(4, np.float32)}, path,
...              quantize="q8_0")
>>> params = ml.load_gguf(path)
>>> params["fc.weight"].type_name, params["fc.weight"].dequantize().shape, params["fc.bias"].dtype
('q8_0', (4, 64), dtype('float32'))
>>> round(float(ml.load_gguf(path, dequantize=True)["fc.weight"].sum()), 1)
256.0
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import BackendOptionError, MithrilError, ParamsFileError, public_api
from .gguf_metadata import read_metadata
from .quantize import QUANT_TYPES, QuantizedTensor, quant_name, restore

ARCH = "mithril"  # general.architecture: these files hold a Mithril model's parameters, not a llama.cpp one
MAX_NAME = 63  # ggml's GGML_MAX_NAME (64) less the terminating zero


class GGUFFileError(ParamsFileError):
    """A GGUF file that cannot be written or read (truncated, corrupt, not GGUF); names the file."""


class GGUFParams(dict):
    """The parameters of a GGUF file (name -> NumPy array or :class:`QuantizedTensor`), with the
    file's ``name`` (``general.name``), ``inputs`` ({name: {"shape", "dtype"}}), ``outputs`` and
    ``metadata`` (every key-value field, as Python values)."""

    name: str | None = None
    inputs: dict = {}
    outputs: list = []
    metadata: dict = {}


def _type_name(qtype) -> str:
    """gguf's GGMLQuantizationType as this backend names it (Q8_0 -> q8_0, Q4_K -> q4_K, F16 -> f16)."""
    name = qtype.name
    return name[:-2].lower() + "_K" if name.endswith("_K") else name.lower()


def _numpy_gguf_type(dtype: np.dtype):
    import gguf

    return {"float16": gguf.GGMLQuantizationType.F16, "float32": gguf.GGMLQuantizationType.F32,
            "float64": gguf.GGMLQuantizationType.F64, "int8": gguf.GGMLQuantizationType.I8,
            "int16": gguf.GGMLQuantizationType.I16, "int32": gguf.GGMLQuantizationType.I32,
            "int64": gguf.GGMLQuantizationType.I64}[np.dtype(dtype).name]


def _gguf_type(type_name: str):
    import gguf

    return gguf.GGMLQuantizationType[type_name.upper()]


def _stored_tensors(pm, params: Mapping | None) -> dict:
    """name -> QuantizedTensor (as the program stores it) or float32 array (in its own shape) of
    a GGML-compiled model; parameters no ggml graph reads come from ``params`` or the model."""
    program = pm.program
    own = None
    if params is not None:
        pm.check_params(params)
        program._refresh_weights(dict(params))
    elif any(w.value.kind == "param" and (w.source is None or w.source() is None) for w in program._weights.values()):
        # Not run yet: the model's own weights, converted now (an evaluate(None) then finds them
        # converted); ``own`` keeps their arrays alive while the bytes are written.
        own = pm.get_parameters()
        program._refresh_weights(own, keep_loaded=True)
    stored: dict[str, Any] = {}
    for w in program._weights.values():
        v = w.value
        if v.kind != "param" or (v.name in stored and w.type_name == "f32"):
            continue
        if w.type_name == "f32":
            stored[v.name] = restore(program.weight_buffer(w), w.layout, "f32", v.static_shape)
        else:
            stored[v.name] = QuantizedTensor(w.type_name, w.layout, v.static_shape, program.weight_buffer(w))
    rest = [k for k in pm.parameter_keys if k not in stored]
    if rest:
        source = dict(params) if params is not None else own if own is not None else pm.get_parameters()
        missing = [k for k in rest if k not in source]
        if missing:
            raise MithrilError(f"save_gguf: parameter(s) {missing[:8]} are read on NumPy, not by a ggml graph, and "
                               "have no value; pass params=")
        stored.update({k: np.asarray(source[k]) for k in rest})
    return stored


def _quantized_params(params: Mapping, quantize: str | None) -> dict:
    """``params`` with each float matrix stored as ``quantize`` by rows (the rest as NumPy arrays)."""
    from ..table import array_backend

    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, QuantizedTensor):
            out[k] = v
            continue
        a = np.asarray(array_backend(v).to_numpy(v))  # any backend's array, as NumPy
        if quantize is not None and a.ndim == 2 and a.dtype.kind == "f":
            out[k] = QuantizedTensor.from_array(a, quantize, "rows")
        else:
            out[k] = a
    return out


def _io_metadata(pm) -> tuple[list, list]:
    from ...dtypes import np_dtype_of_onnx

    inputs = []
    for name, v in pm.declared_inputs.items():
        shape = None if v.shape is None else [d if isinstance(d, int) else str(d) for d in v.shape]
        dtype = None if v.dtype is None else np.dtype(np_dtype_of_onnx(int(v.dtype))).name
        inputs.append({"name": name, "shape": shape, "dtype": dtype})
    return inputs, list(pm.output_keys)


@public_api(GGUFFileError, "save_gguf")  # any other failure (a value gguf cannot store...) is a GGUFFileError
def save_gguf(source, path: str | os.PathLike, quantize: str | None = None, *, name: str | None = None,
              params: Mapping | None = None) -> None:
    """Write a model's parameters to the GGUF file ``path``.

    ``source`` is a compiled model or a parameter dict (name -> array of any backend, or
    :class:`QuantizedTensor`). A model compiled on ``GGMLBackend`` writes its weights exactly as
    the backend stores them (its ``quantize``/``dtype``, transposed matmul operands, rows padded
    to whole blocks): :func:`load_gguf` then gives tensors GGMLBackend uses without converting
    them again. ``params`` gives the values to write (default: those of its last ``evaluate``,
    or the model's own when it has not run yet).
    A parameter dict (or a model on another backend) is written with every float matrix stored
    as ``quantize`` by rows (None: float32 as given); other tensors keep their dtype.
    ``name`` sets ``general.name`` (default: the model's graph name).

    ``ml.save_gguf`` (:func:`mithril.export.save_gguf`) calls this without ``arch``.

    >>> import mithril as ml, models_zoo, numpy as np, tempfile, os
    >>> pm = ml.compile(models_zoo.mlp(), ml.GGMLBackend(quantize="q8_0"), shapes={"input": [1, 16]},
    ...                 static_shapes=True, inference=True)
    >>> params = pm.randomize_params()
    >>> out = pm.evaluate(params, {"input": np.ones((1, 16), np.float32)})["output"]
    >>> path = os.path.join(tempfile.mkdtemp(), "mlp.gguf")
    >>> ml.save_gguf(pm, path)
    >>> again = pm.evaluate(ml.load_gguf(path), {"input": np.ones((1, 16), np.float32)})["output"]
    >>> bool((again == out).all())
    True
    """
    path = os.fspath(path)
    quantize = quant_name(quantize)
    inputs: list = []
    outputs: list = []
    graph_name = None
    program = getattr(source, "program", None)
    if hasattr(source, "parameter_keys"):  # a compiled model
        inputs, outputs = _io_metadata(source)
        graph_name = source.ir.graph.name or None
        from .program import GGMLProgram

        if isinstance(program, GGMLProgram):
            own = program.format.quantize
            if quantize is not None and quantize != own:
                raise BackendOptionError(f"save_gguf: this model was compiled with GGMLBackend(quantize={own!r}); "
                                         f"its weights are written as stored, so quantize={quantize!r} cannot apply "
                                         "(compile with that quantize, or pass its parameters as a dict)")
            tensors = _stored_tensors(source, params)
        else:
            tensors = _quantized_params(source.get_parameters() if params is None else params, quantize)
    elif isinstance(source, Mapping):
        tensors = _quantized_params(source, quantize)
    else:
        raise MithrilError(f"save_gguf takes a compiled model or a dict of parameters, not a {type(source).__name__}")
    try:
        _write(path, tensors, name or graph_name or "mithril model", inputs, outputs, quantize)
    except MithrilError:
        raise
    except Exception as exc:
        raise GGUFFileError(f"save_gguf could not write {path!r}: {type(exc).__name__}: {exc}") from exc


def _write(path: str, tensors: dict, name: str, inputs: list, outputs: list, quantize: str | None) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name(name)
    described: dict[str, dict] = {}
    used: set[str] = set()
    for i, (param, value) in enumerate(tensors.items()):
        key = param if len(param.encode()) <= MAX_NAME and param not in used else f"mithril.tensor.{i}"
        used.add(key)
        if isinstance(value, QuantizedTensor):
            stored = value.stored_shape
            raw = value.data.reshape(stored[:-1] + (-1,))
            writer.add_tensor(key, raw, raw_shape=raw.shape, raw_dtype=_gguf_type(value.type_name))
            described[key] = {"param": param, "type": value.type_name, "layout": value.layout,
                              "shape": list(value.shape), "dtype": "float32"}
        else:
            a = np.ascontiguousarray(value)
            dtype = a.dtype.name
            if a.dtype.kind == "f" and a.dtype not in (np.float16, np.float32, np.float64):
                a = a.astype(np.float32)  # bfloat16, float8: float32 in the file, cast back at load
            elif a.dtype.kind not in "fi":
                a = a.astype(np.int64)  # bool and unsigned: gguf has no such arrays
            writer.add_tensor(key, a.reshape(a.shape or (1,)))
            described[key] = {"param": param, "type": _type_name(_numpy_gguf_type(a.dtype)), "layout": "plain",
                              "shape": list(value.shape), "dtype": dtype}
    if quantize is not None or any(isinstance(v, QuantizedTensor) and v.type_name in QUANT_TYPES
                                   for v in tensors.values()):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_string("mithril.inputs", json.dumps(inputs))
    writer.add_string("mithril.outputs", json.dumps(outputs))
    writer.add_string("mithril.tensors", json.dumps(described))
    if quantize is not None:
        writer.add_string("mithril.quantize", quantize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load_gguf(path: str | os.PathLike, *, dequantize: bool = False) -> GGUFParams:
    """The parameters in the GGUF file ``path``: name -> NumPy array (float32 tensors, integers)
    or :class:`QuantizedTensor` (tensors in a quantized or half-precision ggml type).

    ``GGMLBackend`` reads a QuantizedTensor's bytes as they are when the model stores that
    weight in the same type and layout (a file :func:`save_gguf` wrote from a model compiled the
    same way); otherwise it dequantizes and converts. For any other backend, dequantize first:
    ``load_gguf(path, dequantize=True)`` or ``{k: np.asarray(v) for k, v in params.items()}``.
    The result also carries the file's ``name``, ``inputs``, ``outputs`` and ``metadata``.
    A file that is not readable GGUF raises :class:`GGUFFileError` naming it.

    >>> import mithril as ml, numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.gguf")
    >>> ml.save_gguf({"table": np.arange(64 * 3, dtype=np.float32).reshape(3, 64)}, path, quantize="q4_0")
    >>> p = ml.load_gguf(path)
    >>> p.name, p["table"].type_name, ml.load_gguf(path, dequantize=True)["table"].shape
    ('mithril model', 'q4_0', (3, 64))
    """
    path = os.fspath(path)
    try:
        return _read(path, dequantize)
    except MithrilError:
        raise
    except Exception as exc:
        raise GGUFFileError(f"load_gguf: {path!r} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def _read(path: str, dequantize: bool) -> GGUFParams:
    import gguf
    import ml_dtypes  # noqa: F401 - registers bfloat16 and the float8 dtypes a tensor may be cast back to

    if not os.path.isfile(path):
        raise GGUFFileError(f"load_gguf: no file {path!r}")
    reader = gguf.GGUFReader(path, "r")
    metadata = read_metadata(reader)
    described = json.loads(metadata.get("mithril.tensors") or "{}")
    out = GGUFParams()
    for t in reader.tensors:
        info = described.get(t.name, {})
        param = info.get("param", t.name)
        ne = [int(d) for d in t.shape]
        type_name = _type_name(t.tensor_type)
        data = np.array(t.data)  # a copy: the reader's memory map closes with it
        expect = int(t.n_bytes)
        if data.nbytes != expect:
            raise GGUFFileError(f"load_gguf: {path!r} is truncated: tensor {t.name!r} holds {data.nbytes} of its "
                                f"{expect} bytes")
        if info.get("layout", "plain") == "plain" and type_name in ("f32", "f16", "f64", "i8", "i16", "i32", "i64"):
            want = info.get("dtype")  # numpy arrays come back as their own dtype and shape
            a = data.reshape(-1).view(np.dtype({"f32": "float32", "f16": "float16", "f64": "float64"}.get(
                type_name, "int" + type_name[1:])))
            out[param] = (a.astype(want) if want and want != a.dtype.name else a).reshape(
                info["shape"] if "shape" in info else ne[::-1])
            continue
        shape = tuple(info["shape"]) if "shape" in info else tuple(ne[::-1])
        q = QuantizedTensor(type_name, info.get("layout", "rows"), shape, data)
        out[param] = q.dequantize() if dequantize else q
    out.name = metadata.get("general.name")
    out.inputs = {d["name"]: {"shape": d["shape"], "dtype": d["dtype"]}
                  for d in json.loads(metadata.get("mithril.inputs") or "[]")}
    out.outputs = json.loads(metadata.get("mithril.outputs") or "[]")
    out.metadata = metadata
    return out


__all__ = ["GGUFFileError", "GGUFParams", "load_gguf", "save_gguf"]
