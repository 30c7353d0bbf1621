"""Mithril's dtypes: one object per ONNX tensor element type, mapped to NumPy dtypes.

``ml.float32`` and friends are :class:`DType` instances; ``DType.numpy`` is the NumPy dtype
(``ml_dtypes`` provides bfloat16 and the narrow float/int types) and ``DType.onnx`` the
``TensorProto`` enum value.
"""

from __future__ import annotations

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


def as_dtype(value) -> DType:
    """Accept an ``ml`` dtype, a NumPy dtype or a dtype name."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        for d in ALL:
            if d.name == value:
                return d
    try:
        onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(value))
    except (KeyError, ValueError, TypeError):
        onnx_type = None
    for d in ALL:
        if d.onnx == onnx_type:
            return d
    from .errors import MithrilError

    raise MithrilError(f"unknown dtype {value!r}; expected one of {[d.name for d in ALL]}")


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
