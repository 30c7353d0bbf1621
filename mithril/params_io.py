"""Parameters on disk, backend-neutral: safetensors (``.safetensors``) or NumPy (``.npz``).

Arrays of any backend are saved as their NumPy values, keyed by parameter name; loading gives
arrays of the backend asked for, so parameters trained on one backend run on another.
safetensors files go through the ``safetensors`` library: ``safetensors.numpy.save_file`` writes
them (bfloat16 and float8 included: it names an ml_dtypes array's dtype in the header), and
``safe_open(path, framework="numpy")`` reads them from a memory map, copying out only the tensors
asked for (``keys=``). Files of ``safetensors.torch``, ``safetensors.flax`` and the others load,
and Mithril's load in them.

>>> import mithril as ml, numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "params.safetensors")
>>> ml.save_params({"fc.weight": np.ones((2, 3), np.float32), "fc.bias": np.zeros(2, np.float32)}, path)
>>> {k: v.shape for k, v in ml.load_params(path, ml.NumpyBackend()).items()}
{'fc.bias': (2,), 'fc.weight': (2, 3)}
>>> list(ml.load_params(path, keys=["fc.bias"]))  # only this tensor is read
['fc.bias']
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import ml_dtypes  # registers bfloat16 with NumPy, which safetensors' NumPy reader asks for by name
import numpy as np
import safetensors
import safetensors.numpy

from .backends.backend import check_backend
from .backends.table import array_backend
from .errors import ParamsFileError, public_api

_METADATA = {"format": "np"}  # the header's __metadata__, as safetensors.numpy's own files carry none
_NPZ_DTYPES = "__mithril_dtypes__"  # npz keeps ml_dtypes (bfloat16...) as raw bits plus this note
# safetensors' NumPy reader looks float8 up as numpy.float8_*, which NumPy lacks
# (safetensors/safetensors#682): these come through safetensors.deserialize as bytes instead.
_FLOAT8 = {
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
}


def to_numpy(value) -> np.ndarray:
    """A NumPy copy of an array of any backend (torch and MLX bfloat16 included)."""
    return array_backend(value).to_numpy(value)


@public_api(ParamsFileError, "save_params")
def save_params(params: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``params`` (name -> array of any backend) to ``path``: ``.safetensors`` or ``.npz``.

    >>> import mithril as ml, numpy as np, ml_dtypes, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
    >>> ml.save_params({"w": np.ones(3, ml_dtypes.bfloat16)}, path)
    >>> ml.load_params(path)["w"].dtype
    dtype(bfloat16)
    """
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
def load_params(path: str | os.PathLike, backend=None, *, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Read parameters saved by :func:`save_params` (or any safetensors/npz file) as arrays of
    ``backend`` (NumPy arrays when None), keyed by name.

    ``keys`` reads only those tensors, in that order; the others are never copied out of the file.
    Without it a safetensors file gives every tensor sorted by name (the file keeps no order of
    its own), an npz file in the order saved.

    >>> import mithril as ml, numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "p.npz")
    >>> ml.save_params({"a": np.ones(2), "b": np.zeros(3)}, path)
    >>> ml.load_params(path, keys=["b"])["b"].shape
    (3,)
    """
    path = os.fspath(path)
    wanted = None if keys is None else [keys] if isinstance(keys, str) else list(keys)
    if path.endswith(".safetensors"):
        arrays = _read_safetensors(path, wanted)
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as f:  # an NpzFile reads a member when asked for it
            names = [k for k in f.files if k != _NPZ_DTYPES]
            special = json.loads(str(f[_NPZ_DTYPES])) if _NPZ_DTYPES in f.files else {}
            arrays = {k: f[k] for k in _chosen(path, names, wanted)}
        for k in arrays.keys() & special.keys():
            arrays[k] = arrays[k].view(np.dtype(getattr(ml_dtypes, special[k])))
    else:
        raise ParamsFileError(f"load_params reads .safetensors or .npz files, not {path!r}")
    if backend is None:
        return arrays
    check_backend(backend, "load_params", ParamsFileError)
    return {k: backend.from_numpy(v) for k, v in arrays.items()}


_NATIVE = {np.dtype(t) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                                 np.uint64, np.uint32, np.uint16, np.uint8, np.bool_)}


def _chosen(path: str, names: list[str], wanted: list[str] | None) -> list[str]:
    if wanted is None:
        return names
    held = set(names)
    missing = [k for k in wanted if k not in held]
    if missing:
        raise ParamsFileError(f"{path} has no tensor {missing[0]!r} (it holds {len(names)}: {', '.join(names[:8])}"
                              f"{', ...' if len(names) > 8 else ''})")
    return wanted


def _write_safetensors(arrays: dict[str, np.ndarray], path: str) -> None:
    try:
        safetensors.numpy.save_file(arrays, path, metadata=_METADATA)
    except Exception as exc:  # name the tensor: try each alone, empty, so nothing is copied
        for name, arr in arrays.items():
            try:
                safetensors.numpy.save({name: np.empty((0,), arr.dtype)})
            except Exception:
                raise ParamsFileError(f"safetensors has no dtype for {name!r} ({arr.dtype}): {exc}") from exc
        raise ParamsFileError(f"cannot write {path}: {exc}") from exc


def _read_safetensors(path: str, wanted: list[str] | None) -> dict[str, np.ndarray]:
    try:
        handle = safetensors.safe_open(path, framework="numpy")
    except safetensors.SafetensorError as exc:
        raise ParamsFileError(f"{path} is not a safetensors file: {exc}") from None
    out: dict[str, np.ndarray | None] = {}
    float8 = []
    with handle as f:
        for name in _chosen(path, f.keys(), wanted):
            code = f.get_slice(name).get_dtype()  # from the header: nothing read yet
            if code in _FLOAT8:
                out[name] = None  # read below; the entry keeps the order
                float8.append(name)
                continue
            try:
                out[name] = f.get_tensor(name)
            except (safetensors.SafetensorError, AttributeError, TypeError) as exc:
                raise ParamsFileError(f"{path}: tensor {name!r} has dtype {code}, which NumPy cannot hold "
                                      f"({exc})") from None
    if float8:  # deserialize reads the whole file: only files with float8 tensors come this way
        with open(path, "rb") as fh:
            raw = dict(safetensors.deserialize(fh.read()))
        for name in float8:
            info = raw[name]
            out[name] = np.frombuffer(info["data"], dtype=_FLOAT8[info["dtype"]]).reshape(info["shape"])
    return out


__all__ = ["ParamsFileError", "load_params", "save_params", "to_numpy"]
