"""Mithril's dtypes: one object per ONNX tensor element type, mapped to NumPy dtypes.

``ml.float32`` and friends are :class:`DType` instances; ``DType.numpy`` is the NumPy dtype
(``ml_dtypes`` provides bfloat16 and the narrow float/int types) and ``DType.onnx`` the
``TensorProto`` enum value.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper


@dataclass(frozen=True)
class DType:
    name: str
    onnx: int

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.onnx))

    @property
    def is_floating(self) -> bool:
        return self.onnx in FLOATING_ONNX_TYPES

    def __repr__(self) -> str:
        return f"ml.{self.name}"

    # One element type, one identity: a backend's default dtype (:class:`BackendDType`) equals
    # the module-level ``ml.float32`` it stands for.
    def __eq__(self, other) -> bool:
        if isinstance(other, DType):
            return self.onnx == other.onnx
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.onnx)


float16 = DType("float16", TensorProto.FLOAT16)
bfloat16 = DType("bfloat16", TensorProto.BFLOAT16)
float32 = DType("float32", TensorProto.FLOAT)
float64 = DType("float64", TensorProto.DOUBLE)
int8 = DType("int8", TensorProto.INT8)
int16 = DType("int16", TensorProto.INT16)
int32 = DType("int32", TensorProto.INT32)
int64 = DType("int64", TensorProto.INT64)
uint8 = DType("uint8", TensorProto.UINT8)
bool_ = DType("bool", TensorProto.BOOL)

ALL = (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, bool_)

FLOATING_ONNX_TYPES = frozenset(
    {
        TensorProto.FLOAT16,
        TensorProto.BFLOAT16,
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
        TensorProto.FLOAT4E2M1,
        TensorProto.FLOAT8E8M0,
    }
)


def np_dtype_of_onnx(onnx_type: int) -> np.dtype:
    """NumPy dtype for a ``TensorProto`` element type (strings become ``object``)."""
    if onnx_type == TensorProto.STRING:
        return np.dtype(object)
    return np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))


def onnx_type_name(onnx_type: int) -> str:
    return TensorProto.DataType.Name(onnx_type).lower()


def is_floating_np(dtype) -> bool:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return True
    try:
        return helper.np_dtype_to_tensor_dtype(dtype) in FLOATING_ONNX_TYPES
    except (KeyError, ValueError, TypeError):
        return False


_BY_NAME = {d.name: d for d in ALL}
_BY_ONNX = {d.onnx: d for d in ALL}


def _framework_dtype_name(value) -> str | None:
    """``torch.float16`` / ``mx.float16`` -> ``"float16"``; None for anything else. Looks at
    frameworks already imported only (a dtype object of one means it is imported)."""
    module = type(value).__module__.partition(".")[0]
    if module == "torch" and "torch" in sys.modules and isinstance(value, sys.modules["torch"].dtype):
        return str(value).rpartition(".")[2]
    if module == "mlx" and "mlx.core" in sys.modules and isinstance(value, sys.modules["mlx.core"].Dtype):
        return str(value).rpartition(".")[2]
    return None


def as_dtype(value) -> DType:
    """Mithril's dtype for ``value``: an ``ml`` dtype, a name (``"float16"``), a NumPy dtype or
    scalar type (``np.float16``), or a framework's dtype object (``jnp.float16``,
    ``torch.float16``, ``mx.float16``). Always one of the module-level instances.

    >>> import numpy as np
    >>> as_dtype("bfloat16"), as_dtype(np.float16), as_dtype(np.dtype("int64"))
    (ml.bfloat16, ml.float16, ml.int64)
    """
    if isinstance(value, DType):
        return _BY_ONNX[value.onnx]
    name = value if isinstance(value, str) else _framework_dtype_name(value)
    if name is not None:
        found = _BY_NAME.get(name)
        if found is not None:
            return found
    try:
        found = _BY_ONNX.get(helper.np_dtype_to_tensor_dtype(np.dtype(value)))
    except (KeyError, ValueError, TypeError):
        found = None
    if found is not None:
        return found
    from .errors import MithrilError

    raise MithrilError(f"unknown dtype {value!r}; expected one of {[d.name for d in ALL]} "
                       "(or the NumPy, JAX, PyTorch or MLX dtype of one)")


class BackendDType(DType):
    """A backend's default dtype that is also a lookup: ``backend.dtype`` is the DType new
    floating arrays take (it equals ``ml.float32``... and works wherever a DType does), and
    ``backend.dtype(x)`` is the ``ml`` DType of the array ``x``.

    >>> import mithril as ml, numpy as np
    >>> b = ml.NumpyBackend(dtype=ml.float64)
    >>> b.dtype == ml.float64, b.dtype(np.zeros(2, np.int32))
    (True, ml.int32)
    """

    def __init__(self, default: DType, dtype_of):
        object.__setattr__(self, "name", default.name)
        object.__setattr__(self, "onnx", default.onnx)
        object.__setattr__(self, "_dtype_of", dtype_of)

    def __call__(self, array) -> DType:
        found = self._dtype_of(array)
        if found is None:
            from .errors import MithrilError

            raise MithrilError(f"{type(array).__name__} has no element dtype (backend.dtype(x) takes an array)")
        return as_dtype(found)

    def __reduce__(self):  # a copy or a pickle is the plain dtype, not the backend
        return as_dtype, (self.name,)


def tensor_array(tensor) -> np.ndarray:
    """An onnx_ir tensor's values as a NumPy array. STRING tensors become object arrays of str, as
    onnxruntime and ``onnx.numpy_helper`` give them (onnx_ir gives fixed-width bytes); a string that
    is not UTF-8 stays bytes."""
    arr = tensor.numpy()
    if arr.dtype.kind != "S" and not (arr.dtype == object and arr.size and isinstance(arr.flat[0], bytes)):
        return arr

    def text(b):
        try:
            return b.decode("utf-8") if isinstance(b, bytes) else b
        except UnicodeDecodeError:
            return b

    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [text(b) for b in arr.reshape(-1).tolist()]
    return out
