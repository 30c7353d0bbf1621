"""Parameters on disk, backend-neutral: safetensors (``.safetensors``) or NumPy (``.npz``).

Arrays of any backend are saved as their NumPy values, keyed by parameter name; loading gives
arrays of the backend asked for, so parameters trained on one backend run on another.
The safetensors file is written and read here (the format is a JSON header and raw bytes), so
it needs no extra package; files from the ``safetensors`` library load and vice versa.

>>> import mithril as ml, numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "params.safetensors")
>>> ml.save_params({"fc.weight": np.ones((2, 3), np.float32)}, path)
>>> {k: v.shape for k, v in ml.load_params(path, ml.NumpyBackend()).items()}
{'fc.weight': (2, 3)}
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from .backends.backend import check_backend
from .backends.table import array_backend
from .errors import ParamsFileError, public_api

_SAFETENSORS = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {v: k for k, v in _SAFETENSORS.items()}
_NPZ_DTYPES = "__mithril_dtypes__"  # npz keeps ml_dtypes (bfloat16...) as raw bits plus this note


def to_numpy(value) -> np.ndarray:
    """A NumPy copy of an array of any backend (torch and MLX bfloat16 included)."""
    return array_backend(value).to_numpy(value)


@public_api(ParamsFileError, "save_params")
def save_params(params: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``params`` (name -> array of any backend) to ``path``: ``.safetensors`` or ``.npz``."""
    arrays = {str(k): np.asarray(to_numpy(v), order="C") for k, v in params.items()}  # 0-d stays 0-d
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        _write_safetensors(arrays, path)
    elif path.endswith(".npz"):
        special = {k: a.dtype.name for k, a in arrays.items() if a.dtype not in _NATIVE}
        store = {k: (a.view(f"u{a.dtype.itemsize}") if k in special else a) for k, a in arrays.items()}
        if special:
            store[_NPZ_DTYPES] = np.array(json.dumps(special))
        np.savez(path, **store)
    else:
        raise ParamsFileError(f"save_params writes .safetensors or .npz files, not {path!r}")


@public_api(ParamsFileError, "load_params")
def load_params(path: str | os.PathLike, backend=None) -> dict[str, Any]:
    """Read parameters saved by :func:`save_params` (or any safetensors/npz file) as arrays of
    ``backend`` (NumPy arrays when None), keyed by name."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        arrays = _read_safetensors(path)
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        special = json.loads(str(arrays.pop(_NPZ_DTYPES))) if _NPZ_DTYPES in arrays else {}
        for k, name in special.items():
            arrays[k] = arrays[k].view(np.dtype(getattr(ml_dtypes, name)))
    else:
        raise ParamsFileError(f"load_params reads .safetensors or .npz files, not {path!r}")
    if backend is None:
        return arrays
    check_backend(backend, "load_params", ParamsFileError)
    return {k: backend.from_numpy(v) for k, v in arrays.items()}


_NATIVE = {np.dtype(t) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                                 np.uint64, np.uint32, np.uint16, np.uint8, np.bool_)}


def _check_host() -> None:
    if sys.byteorder != "little":
        raise ParamsFileError("safetensors files are little-endian; this big-endian host cannot write them as is")


def _write_safetensors(arrays: dict[str, np.ndarray], path: str) -> None:
    _check_host()
    header: dict[str, Any] = {"__metadata__": {"format": "np"}}
    offset = 0
    for name, arr in arrays.items():
        code = _CODES.get(arr.dtype)
        if code is None:
            raise ParamsFileError(f"safetensors has no dtype for {name!r} ({arr.dtype})")
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in arrays.values():
            f.write(arr.tobytes())  # little-endian, as safetensors wants: see _check_host


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    _check_host()
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ParamsFileError(f"{path} is not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as exc:
        raise ParamsFileError(f"{path} is not a safetensors file: {exc}") from None
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS.get(info["dtype"])
        if dtype is None:
            raise ParamsFileError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which NumPy cannot hold")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(body[begin:end], dtype=dtype).copy()
        out[name] = arr.reshape(info["shape"])
    return out


__all__ = ["ParamsFileError", "load_params", "save_params", "to_numpy"]
