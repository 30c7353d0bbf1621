"""A NumPy-compatible facade over ``mlx.core``: the shared kernels run on MLX unchanged.

:class:`MlxArray` wraps an ``mx.array`` (``.native``) and speaks NumPy: ``.dtype`` is a NumPy
dtype, ``.astype(np.float32)``, ``.sum(axis=..., keepdims=...)``, operators with NEP 50
promotion (Python scalars are weak), NumPy indexing. The module itself is the ``xp`` namespace:
the functions the kernels call, with NumPy signatures, returning facade arrays.

float64 requests compute in float32: MLX has no float64 on the GPU, and its CPU path converts
float64 input to float32 (the backend reports float64 graphs unsupported; only kernels' internal
widening lands here). Functions MLX lacks run on host copies through NumPy, for integer and
boolean data only: a float path leaving MLX would silently lose gradients and compilation.

Strings stay NumPy object arrays: a function given one runs NumPy's own function on the host
(strings are never differentiable, and MLX has no string arrays).

>>> import numpy as np
>>> from mithril.backends.mlx import xp
>>> a = xp.asarray(np.arange(6, dtype=np.int32)).reshape(2, 3)
>>> (a.sum(axis=1).dtype, (a * 1.5).dtype, a[:, ::-1].tolist())
(dtype('int32'), dtype('float32'), [[2, 1, 0], [5, 4, 3]])
"""

from __future__ import annotations

import builtins
import functools

import ml_dtypes
import mlx.core as mx
import numpy as np

# -- dtypes ---------------------------------------------------------------------------------
_PAIRS = [
    (np.bool_, mx.bool_), (np.int8, mx.int8), (np.int16, mx.int16), (np.int32, mx.int32), (np.int64, mx.int64),
    (np.uint8, mx.uint8), (np.uint16, mx.uint16), (np.uint32, mx.uint32), (np.uint64, mx.uint64),
    (np.float16, mx.float16), (ml_dtypes.bfloat16, mx.bfloat16), (np.float32, mx.float32),
    (np.complex64, mx.complex64),
]
_TO_MX = {np.dtype(n): m for n, m in _PAIRS}
_TO_MX[np.dtype(np.float64)] = mx.float32  # computed in float32, see the module docstring
_TO_NP = {m: np.dtype(n) for n, m in _PAIRS}
_BF16 = np.dtype(ml_dtypes.bfloat16)

# NumPy's names for dtypes and constants, so kernels compare `x.dtype == xp.float32`.
from numpy import (  # noqa: E402,F401
    bool_, complex64, dtype, e, finfo, float16, float32, float64, iinfo, inf, int8, int16, int32, int64,
    integer, issubdtype, nan, newaxis, pi, uint8, uint16, uint32, uint64, floating,
)

bfloat16 = ml_dtypes.bfloat16


def mx_dtype(dt):
    """The MLX dtype for a NumPy dtype (or anything ``np.dtype`` accepts)."""
    if isinstance(dt, mx.Dtype):
        return dt
    nd = np.dtype(dt)
    try:
        return _TO_MX[nd]
    except KeyError:
        raise TypeError(f"MLX has no {nd} arrays") from None


def np_dtype(dt) -> np.dtype:
    return _TO_NP[dt]


def is_supported(dt) -> bool:
    return np.dtype(dt) in _TO_MX


# -- conversion -----------------------------------------------------------------------------
def native(x):
    """An ``mx.array`` (or a Python scalar, which stays weakly typed) for any array-like."""
    if isinstance(x, MlxArray):
        return x.native
    if isinstance(x, mx.array) or x is None or isinstance(x, (bool, int, float, complex)):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        return _from_host(np.asarray(x))
    if isinstance(x, (list, tuple)):
        return _from_host(np.asarray([np.asarray(v) if isinstance(v, MlxArray) else v for v in x]))
    raise TypeError(f"cannot make an MLX array from {type(x).__name__}")


def _from_host(a: np.ndarray):
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    elif a.dtype not in _TO_MX:
        raise TypeError(f"MLX has no {a.dtype} arrays")
    return mx.array(a)


def to_host(x) -> np.ndarray:
    """A NumPy copy of a facade or MLX array (bfloat16 through float32, which holds it exactly)."""
    if isinstance(x, MlxArray):
        x = x.native
    if isinstance(x, mx.array):
        if x.dtype == mx.bfloat16:
            return np.array(x.astype(mx.float32)).astype(_BF16)
        return np.array(x)
    return np.asarray(x)


def wrap(x):
    if isinstance(x, mx.array):
        return MlxArray(x)
    if isinstance(x, tuple):
        return tuple(wrap(v) for v in x)
    if isinstance(x, list):
        return [wrap(v) for v in x]
    return x


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer, MlxArray)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def _axes(axis):
    if axis is None:
        return None
    if isinstance(axis, (tuple, list)):
        return [int(a) for a in axis]
    return int(axis)


# -- the array ------------------------------------------------------------------------------
def _binary(fn, reflected=False):
    def op(self, other):
        if other is None:
            return NotImplemented
        try:
            o = native(other)
        except TypeError:
            return NotImplemented
        return MlxArray(fn(o, self.native) if reflected else fn(self.native, o))

    return op


def _logical_or_bitwise(logical, bitwise):
    def fn(a, b):
        is_bool = (not isinstance(a, mx.array) or a.dtype == mx.bool_) and (
            not isinstance(b, mx.array) or b.dtype == mx.bool_)
        return (logical if is_bool else bitwise)(a, b)

    return fn


class MlxArray:
    """An ``mx.array`` seen through NumPy's array API."""

    __slots__ = ("native",)
    __array_ufunc__ = None  # numpy defers to our reflected operators instead of converting us
    __hash__ = None

    def __init__(self, value):
        self.native = value

    # metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.native.shape)

    @property
    def ndim(self) -> int:
        return self.native.ndim

    @property
    def size(self) -> int:
        return self.native.size

    @property
    def dtype(self) -> np.dtype:
        return _TO_NP[self.native.dtype]

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.native.nbytes

    @property
    def T(self):
        return MlxArray(mx.transpose(self.native))

    @property
    def real(self):
        return MlxArray(mx.real(self.native)) if self.native.dtype == mx.complex64 else self

    @property
    def imag(self):
        return MlxArray(mx.imag(self.native)) if self.native.dtype == mx.complex64 else zeros_like(self)

    def __repr__(self) -> str:
        return f"MlxArray({to_host(self)!r})"

    # conversion
    def __array__(self, dtype=None, copy=None):
        a = to_host(self)
        return a.astype(dtype) if dtype is not None else a

    def item(self):
        return to_host(self).item()

    def tolist(self):
        return to_host(self).tolist()

    def __len__(self) -> int:
        if not self.native.ndim:
            raise TypeError("len() of unsized object")
        return self.native.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __index__(self) -> int:
        if self.native.dtype not in _INTS:
            raise TypeError("only integer arrays can be indices")
        return int(self.item())

    def astype(self, dtype, copy=True):
        return MlxArray(self.native.astype(mx_dtype(dtype)))

    def copy(self):
        return MlxArray(mx.array(self.native))

    # shape
    def reshape(self, *shape, order="C"):
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
        return MlxArray(mx.reshape(self.native, _shape(shape)))

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)) else axes
        return MlxArray(mx.transpose(self.native, _axes(axes) if axes else None))

    def flatten(self):
        return MlxArray(mx.reshape(self.native, (-1,)))

    ravel = flatten

    def squeeze(self, axis=None):
        return squeeze(self, axis)

    def swapaxes(self, a, b):
        return MlxArray(mx.swapaxes(self.native, a, b))

    def repeat(self, repeats, axis=None):
        return repeat(self, repeats, axis)

    def nonzero(self):
        return nonzero(self)

    def conj(self):
        return MlxArray(mx.conjugate(self.native))

    def dot(self, other):
        return matmul(self, other)

    def clip(self, a_min=None, a_max=None):
        return clip(self, a_min, a_max)

    def round(self, decimals=0):
        return round(self, decimals)

    # reductions
    def sum(self, axis=None, dtype=None, keepdims=False):
        return sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def prod(self, axis=None, dtype=None, keepdims=False):
        return prod(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return max(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return min(self, axis=axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return any(self, axis=axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return all(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        return argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis=None, keepdims=False):
        return argmin(self, axis=axis, keepdims=keepdims)

    def cumsum(self, axis=None, dtype=None):
        return cumsum(self, axis=axis, dtype=dtype)

    def var(self, axis=None, keepdims=False, ddof=0):
        return MlxArray(mx.var(self.native, axis=_axes(axis), keepdims=keepdims, ddof=ddof))

    def std(self, axis=None, keepdims=False, ddof=0):
        return MlxArray(mx.std(self.native, axis=_axes(axis), keepdims=keepdims, ddof=ddof))

    # indexing
    def __getitem__(self, key):
        return MlxArray(self.native[_index(key)])

    def __setitem__(self, key, value):
        # Functional underneath: a fresh array, so no other holder of the old one sees the write.
        updated = mx.array(self.native)
        v = native(value)
        if isinstance(v, mx.array) and v.dtype != updated.dtype:
            v = v.astype(updated.dtype)
        updated[_index(key)] = v
        self.native = updated

    # operators
    __add__ = _binary(mx.add)
    __radd__ = _binary(mx.add, True)
    __sub__ = _binary(mx.subtract)
    __rsub__ = _binary(mx.subtract, True)
    __mul__ = _binary(mx.multiply)
    __rmul__ = _binary(mx.multiply, True)
    __truediv__ = _binary(mx.divide)
    __rtruediv__ = _binary(mx.divide, True)
    __floordiv__ = _binary(mx.floor_divide)
    __rfloordiv__ = _binary(mx.floor_divide, True)
    __mod__ = _binary(mx.remainder)
    __rmod__ = _binary(mx.remainder, True)
    __pow__ = _binary(mx.power)
    __rpow__ = _binary(mx.power, True)
    __matmul__ = _binary(lambda a, b: native_matmul(a, b))
    __rmatmul__ = _binary(lambda a, b: native_matmul(a, b), True)
    __and__ = _binary(_logical_or_bitwise(mx.logical_and, mx.bitwise_and))
    __rand__ = _binary(_logical_or_bitwise(mx.logical_and, mx.bitwise_and), True)
    __or__ = _binary(_logical_or_bitwise(mx.logical_or, mx.bitwise_or))
    __ror__ = _binary(_logical_or_bitwise(mx.logical_or, mx.bitwise_or), True)
    __xor__ = _binary(_logical_or_bitwise(mx.not_equal, mx.bitwise_xor))
    __rxor__ = _binary(_logical_or_bitwise(mx.not_equal, mx.bitwise_xor), True)
    __lshift__ = _binary(mx.left_shift)
    __rshift__ = _binary(mx.right_shift)
    __eq__ = _binary(mx.equal)
    __ne__ = _binary(mx.not_equal)
    __lt__ = _binary(mx.less)
    __le__ = _binary(mx.less_equal)
    __gt__ = _binary(mx.greater)
    __ge__ = _binary(mx.greater_equal)

    def __neg__(self):
        return MlxArray(mx.negative(self.native))

    def __pos__(self):
        return self

    def __abs__(self):
        return MlxArray(mx.abs(self.native))

    def __invert__(self):
        x = self.native
        return MlxArray(mx.logical_not(x) if x.dtype == mx.bool_ else mx.bitwise_invert(x))


_INTS = {mx.int8, mx.int16, mx.int32, mx.int64, mx.uint8, mx.uint16, mx.uint32, mx.uint64}
_FLOATS = {mx.float16, mx.bfloat16, mx.float32, mx.complex64}


def _index(key):
    if isinstance(key, tuple):
        if builtins.any(_is_bool_index(k) for k in key):
            key = _expand_bool(key)
        return tuple(_index_part(k) for k in key)
    if _is_bool_index(key):
        return tuple(_index_part(k) for k in _expand_bool((key,)))
    return _index_part(key)


def _is_bool_index(k) -> bool:
    return (isinstance(k, (MlxArray, np.ndarray)) and k.dtype == np.bool_ and k.ndim > 0) or (
        isinstance(k, list) and len(k) > 0 and builtins.all(isinstance(v, (bool, np.bool_)) for v in k))


def _expand_bool(key):
    # A boolean mask selects data-dependent positions: NumPy semantics via its nonzero (host).
    out = []
    for k in key:
        if _is_bool_index(k):
            out.extend(np.nonzero(to_host(k) if isinstance(k, MlxArray) else np.asarray(k)))
        else:
            out.append(k)
    return tuple(out)


def _index_part(k):
    if isinstance(k, MlxArray):
        return k.native
    if isinstance(k, (np.ndarray, list)):
        a = np.asarray(k)
        return mx.array(a.astype(np.int64) if a.dtype.kind in "iu" else a)
    if isinstance(k, np.integer):
        return int(k)
    if isinstance(k, slice):
        return slice(*(int(v) if isinstance(v, (np.integer, MlxArray)) else v for v in (k.start, k.stop, k.step)))
    return k


# -- namespace: creation --------------------------------------------------------------------
def _default_dtype(value):
    if isinstance(value, (bool, np.bool_)):
        return mx.bool_
    if isinstance(value, (int, np.integer)):
        return mx.int64
    if isinstance(value, complex):
        return mx.complex64
    return mx.float32


def asarray(x, dtype=None, copy=None):
    if isinstance(x, MlxArray):
        return x.astype(dtype) if dtype is not None and np.dtype(dtype) != x.dtype else x
    if isinstance(x, mx.array):
        x = MlxArray(x)
        return x.astype(dtype) if dtype is not None else x
    if isinstance(x, (bool, int, float, complex)) and dtype is None:
        return MlxArray(mx.array(x, dtype=_default_dtype(x)))
    if isinstance(x, (list, tuple)) and builtins.any(isinstance(v, MlxArray) for v in x):
        out = stack([asarray(v) for v in x]) if x else MlxArray(mx.array([]))
        return out.astype(dtype) if dtype is not None else out
    a = np.asarray(x, dtype=dtype)
    return MlxArray(_from_host(a))


array = asarray


def zeros(shape, dtype=float):
    return MlxArray(mx.zeros(_shape(shape), mx_dtype(dtype)))


def ones(shape, dtype=float):
    return MlxArray(mx.ones(_shape(shape), mx_dtype(dtype)))


def empty(shape, dtype=float):
    return zeros(shape, dtype)


def full(shape, fill_value, dtype=None):
    fill = native(fill_value)
    dt = mx_dtype(dtype) if dtype is not None else (
        fill.dtype if isinstance(fill, mx.array) else _default_dtype(fill_value))
    return MlxArray(mx.full(_shape(shape), fill, dt))


def zeros_like(x, dtype=None):
    return zeros(np.shape(x) if not isinstance(x, MlxArray) else x.shape, dtype or _dtype_of(x))


def ones_like(x, dtype=None):
    return ones(np.shape(x) if not isinstance(x, MlxArray) else x.shape, dtype or _dtype_of(x))


def full_like(x, fill_value, dtype=None):
    return full(np.shape(x) if not isinstance(x, MlxArray) else x.shape, fill_value, dtype or _dtype_of(x))


def _dtype_of(x):
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def arange(start, stop=None, step=None, dtype=None):
    values = [v for v in (start, stop, step) if v is not None]
    if dtype is None:
        dtype = np.int64 if builtins.all(isinstance(v, (int, np.integer)) for v in values) else np.float32
    host = np.arange(*[v.item() if isinstance(v, MlxArray) else v for v in values])
    return MlxArray(_from_host(host.astype(dtype)))


def eye(n, m=None, k=0, dtype=float):
    return MlxArray(mx.eye(int(n), None if m is None else int(m), int(k), mx_dtype(dtype)))


def astype(x, dtype, copy=True):
    return asarray(x).astype(dtype)


# -- namespace: shape -----------------------------------------------------------------------
def reshape(x, shape, order="C"):
    return MlxArray(mx.reshape(native(x), _shape(shape)))


def transpose(x, axes=None):
    return MlxArray(mx.transpose(native(x), _axes(axes)))


def swapaxes(x, a, b):
    return MlxArray(mx.swapaxes(native(x), int(a), int(b)))


def moveaxis(x, source, destination):
    x = asarray(x)
    if isinstance(source, (int, np.integer)):
        return MlxArray(mx.moveaxis(x.native, int(source), int(destination)))
    src = [int(s) % x.ndim for s in source]
    dst = [int(d) % x.ndim for d in destination]
    order = [i for i in range(x.ndim) if i not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def expand_dims(x, axis):
    return MlxArray(mx.expand_dims(native(x), _axes(axis)))


def squeeze(x, axis=None):
    return MlxArray(mx.squeeze(native(x), _axes(axis)))


def broadcast_to(x, shape):
    return MlxArray(mx.broadcast_to(native(x), _shape(shape)))


def broadcast_arrays(*xs):
    shape = np.broadcast_shapes(*(np.shape(x) if not isinstance(x, MlxArray) else x.shape for x in xs))
    return [broadcast_to(x, shape) for x in xs]


def stack(arrays, axis=0):
    return MlxArray(mx.stack([native(a) for a in arrays], axis=int(axis)))


def concatenate(arrays, axis=0):
    arrays = [native(a) for a in arrays]
    if axis is None:
        arrays, axis = [mx.reshape(a, (-1,)) for a in arrays], 0
    return MlxArray(mx.concatenate(arrays, axis=int(axis)))


def split(x, indices_or_sections, axis=0):
    ios = indices_or_sections
    ios = int(ios) if isinstance(ios, (int, np.integer)) else [int(i) for i in ios]
    return [MlxArray(a) for a in mx.split(native(x), ios, axis=int(axis))]


def flip(x, axis=None):
    x = asarray(x)
    axes = range(x.ndim) if axis is None else ([axis] if isinstance(axis, (int, np.integer)) else axis)
    index = [slice(None)] * x.ndim
    for a in axes:
        index[int(a)] = slice(None, None, -1)
    return x[tuple(index)]


def tile(x, reps):
    return MlxArray(mx.tile(native(x), _shape(reps)))


def repeat(x, repeats, axis=None):
    x = asarray(x)
    if axis is None:
        x, axis = x.reshape(-1), 0
    if isinstance(repeats, (int, np.integer)) or np.ndim(repeats) == 0:
        return MlxArray(mx.repeat(x.native, int(repeats), axis=int(axis)))
    # Per-element counts: gather with host-built indices (the counts fix the output shape).
    index = np.repeat(np.arange(x.shape[axis]), to_host(repeats) if isinstance(repeats, MlxArray) else repeats)
    return take(x, index, axis=axis)


def pad(x, pad_width, mode="constant", constant_values=0, **_):
    x = asarray(x)
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64).reshape(-1, 2) if np.ndim(pad_width) else
                             np.asarray([[pad_width, pad_width]]), (x.ndim, 2))
    widths = [(int(b), int(e)) for b, e in widths]
    if mode == "constant":
        value = native(constant_values)
        if isinstance(value, mx.array):
            value = value.astype(x.native.dtype)
        return MlxArray(mx.pad(x.native, widths, mode="constant", constant_values=value))
    if mode == "edge":
        return MlxArray(mx.pad(x.native, widths, mode="edge"))
    out = x
    for axis, (b, e) in enumerate(widths):
        if not b and not e:
            continue
        n = out.shape[axis]
        if mode == "reflect":
            idx = np.abs(np.arange(-b, n + e))
            period = 2 * (n - 1) if n > 1 else 1
            idx = idx % period
            idx = np.where(idx >= n, period - idx, idx)
        elif mode == "wrap":
            idx = np.arange(-b, n + e) % n
        elif mode == "symmetric":
            idx = np.arange(-b, n + e) % (2 * n)
            idx = np.where(idx >= n, 2 * n - 1 - idx, idx)
        else:
            raise ValueError(f"pad mode {mode!r} is not supported on MLX")
        out = take(out, idx, axis=axis)
    return out


# -- namespace: indexing and sorting --------------------------------------------------------
def take(x, indices, axis=None, **_):
    x = asarray(x)
    if axis is None:
        return MlxArray(mx.take(mx.reshape(x.native, (-1,)), _int_index(indices)))
    return MlxArray(mx.take(x.native, _int_index(indices), axis=int(axis)))


def _int_index(indices):
    if isinstance(indices, (int, np.integer)):
        return int(indices)
    idx = native(indices)
    return idx if isinstance(idx, mx.array) else mx.array(idx)


def take_along_axis(x, indices, axis):
    return MlxArray(mx.take_along_axis(native(x), _int_index(indices), axis=None if axis is None else int(axis)))


def put_along_axis(x, indices, values, axis):
    return MlxArray(mx.put_along_axis(native(x), _int_index(indices), native(values), axis=int(axis)))


def where(condition, x=None, y=None):
    if x is None and y is None:
        return nonzero(condition)
    cond = native(condition)
    a, b = native(x), native(y)
    if not isinstance(cond, mx.array):
        cond = mx.array(cond)
    if not isinstance(a, mx.array) and not isinstance(b, mx.array):
        a = mx.array(a, dtype=_default_dtype(a))
    return MlxArray(mx.where(cond, a, b))


def nonzero(x):
    # numpy-only: the number of nonzeros fixes the output shape.
    return tuple(MlxArray(mx.array(i.astype(np.int64))) for i in np.nonzero(to_host(x)))


def argwhere(x):
    return MlxArray(mx.array(np.argwhere(to_host(x)).astype(np.int64)))


def _int64(x):
    return MlxArray(x.astype(mx.int64))


def argmax(x, axis=None, keepdims=False):
    return _int64(mx.argmax(native(x), axis=_axes(axis), keepdims=keepdims))


def argmin(x, axis=None, keepdims=False):
    return _int64(mx.argmin(native(x), axis=_axes(axis), keepdims=keepdims))


def argsort(x, axis=-1, kind=None, stable=None):
    x = native(x)
    if axis is None:
        x, axis = mx.reshape(x, (-1,)), 0
    return _int64(mx.argsort(x, axis=int(axis)))


def sort(x, axis=-1, kind=None):
    return MlxArray(mx.sort(native(x), axis=axis))


# -- namespace: reductions ------------------------------------------------------------------
def _reduce(fn, bool_as=None):
    def reduce(x, axis=None, dtype=None, keepdims=False, out=None, **_):
        a = native(x)
        if not isinstance(a, mx.array):
            a = native(asarray(a))
        if bool_as is not None and a.dtype == mx.bool_:
            a = a.astype(bool_as)
        if dtype is not None:
            a = a.astype(mx_dtype(dtype))
        return MlxArray(fn(a, axis=_axes(axis), keepdims=keepdims))

    return reduce


sum = _reduce(mx.sum, mx.int64)  # noqa: A001
prod = _reduce(mx.prod, mx.int64)
mean = _reduce(mx.mean)
max = _reduce(mx.max)  # noqa: A001
min = _reduce(mx.min)  # noqa: A001
amax, amin = max, min
any = _reduce(mx.any)  # noqa: A001
all = _reduce(mx.all)  # noqa: A001
logsumexp = _reduce(mx.logsumexp)


def _scan(fn):
    def scan(x, axis=None, dtype=None, **_):
        a = native(asarray(x))
        if a.dtype == mx.bool_:
            a = a.astype(mx.int64)
        if dtype is not None:
            a = a.astype(mx_dtype(dtype))
        if axis is None:
            a, axis = mx.reshape(a, (-1,)), 0
        return MlxArray(fn(a, axis=int(axis)))

    return scan


cumsum = _scan(mx.cumsum)
cumprod = _scan(mx.cumprod)


def var(x, axis=None, keepdims=False, ddof=0):
    return MlxArray(mx.var(native(x), axis=_axes(axis), keepdims=keepdims, ddof=ddof))


def std(x, axis=None, keepdims=False, ddof=0):
    return MlxArray(mx.std(native(x), axis=_axes(axis), keepdims=keepdims, ddof=ddof))


def count_nonzero(x, axis=None, keepdims=False):
    return sum(asarray(x) != 0, axis=axis, keepdims=keepdims)


# -- namespace: elementwise -----------------------------------------------------------------
def _lift(fn):
    def lifted(*args, **kwargs):
        kwargs.pop("out", None)
        return wrap(fn(*(native(a) for a in args), **kwargs))

    lifted.__name__ = getattr(fn, "__name__", "lifted")
    return lifted


def _unary(fn):
    def unary(x, **_):
        a = native(x)
        if not isinstance(a, mx.array):
            a = native(asarray(a))
        return MlxArray(fn(a))

    return unary


for _name in ("abs", "negative", "sqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan",
              "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "ceil",
              "floor", "sign", "isnan", "isinf", "isfinite", "logical_not", "square", "reciprocal", "rsqrt",
              "erf", "erfinv", "sigmoid", "conjugate", "real", "imag"):
    globals()[_name] = _unary(getattr(mx, _name))
absolute = abs  # noqa: F821  (defined by the loop above)
conj = conjugate  # noqa: F821

for _name in ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "equal", "not_equal",
              "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "floor_divide",
              "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "logaddexp",
              "arctan2", "outer", "inner"):
    globals()[_name] = _lift(getattr(mx, _name))
true_divide = divide  # noqa: F821
mod = remainder  # noqa: F821


def native_matmul(a, b):
    """matmul of two mlx arrays; integer ones by an exact broadcast multiply-sum."""
    if a.dtype in _FLOATS or b.dtype in _FLOATS:
        return mx.matmul(a, b)
    # MLX's matmul is floating-point only: exact integer products by a broadcast multiply-sum.
    a2 = a[None, :, None] if a.ndim == 1 else a[..., None]
    b2 = b[:, None][None] if b.ndim == 1 else mx.expand_dims(b, -3)
    y = mx.sum(a2 * b2, axis=-2)
    if b.ndim == 1:
        y = mx.squeeze(y, -1)
    if a.ndim == 1:
        y = mx.squeeze(y, -2 if b.ndim > 1 else -1)
    return y


def matmul(a, b):
    a, b = native(asarray(a)), native(asarray(b))
    return MlxArray(native_matmul(a, b))


dot = matmul


def logical_xor(a, b):
    return MlxArray(mx.not_equal(mx.array(native(a)).astype(mx.bool_), mx.array(native(b)).astype(mx.bool_)))


def invert(x):
    return ~asarray(x)


bitwise_not = invert


def trunc(x):
    x = asarray(x)
    if x.native.dtype not in _FLOATS:
        return x
    return MlxArray(mx.where(x.native < 0, mx.ceil(x.native), mx.floor(x.native)))


fix = trunc


def fmod(a, b):
    # C fmod keeps the dividend's sign; remainder (Python %) the divisor's.
    a, b = native(a), native(b)
    r = mx.remainder(a, b)
    wrong_sign = (r != 0) & ((r < 0) != (a < 0))
    return MlxArray(mx.where(wrong_sign, r - b, r))


def round(x, decimals=0):  # noqa: A001
    x = asarray(x)
    if x.native.dtype not in _FLOATS:
        return x
    return MlxArray(mx.round(x.native, int(decimals)))


around = round


def clip(x, a_min=None, a_max=None, **_):
    x = asarray(x)
    lo, hi = native(a_min), native(a_max)
    out = x.native
    # maximum then minimum, as numpy: min > max gives max everywhere.
    if lo is not None:
        out = mx.maximum(out, lo.astype(out.dtype) if isinstance(lo, mx.array) else lo)
    if hi is not None:
        out = mx.minimum(out, hi.astype(out.dtype) if isinstance(hi, mx.array) else hi)
    return MlxArray(out)


def isneginf(x):
    x = native(x)
    return MlxArray(mx.isinf(x) & (x < 0))


def isposinf(x):
    x = native(x)
    return MlxArray(mx.isinf(x) & (x > 0))


def nan_to_num(x, nan=0.0, posinf=None, neginf=None, **_):
    return MlxArray(mx.nan_to_num(native(x), nan=nan, posinf=posinf, neginf=neginf))


def einsum(subscripts, *operands, optimize=None, **_):
    return MlxArray(mx.einsum(subscripts, *(native(o) for o in operands)))


def tensordot(a, b, axes=2):
    return MlxArray(mx.tensordot(native(a), native(b), axes=axes))


def shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def ndim(x):
    return x.ndim if hasattr(x, "ndim") else np.ndim(x)


def size(x):
    return x.size if hasattr(x, "size") else np.size(x)


def result_type(*xs):
    return np.result_type(*(x.dtype if isinstance(x, MlxArray) else x for x in xs))


def can_cast(from_, to, casting="safe"):
    return np.can_cast(from_.dtype if isinstance(from_, MlxArray) else from_, to, casting)


class _Linalg:
    def det(self, x):
        # MLX's factorizations run on its CPU stream only.
        return MlxArray(_det(native(x)))

    def inv(self, x):
        return MlxArray(mx.linalg.inv(native(x), stream=mx.cpu))

    def norm(self, x, ord=None, axis=None, keepdims=False):
        return MlxArray(mx.linalg.norm(native(x), ord=ord, axis=axis, keepdims=keepdims))


def _det(a):
    return mx.linalg.det(a, stream=mx.cpu)


linalg = _Linalg()


class _FFT:
    def __getattr__(self, name):
        fn = getattr(mx.fft, name)

        def call(a, n=None, axis=-1, norm=None):
            if norm not in (None, "backward"):
                raise NotImplementedError(f"fft norm {norm!r} on MLX")
            return MlxArray(fn(native(a), n=n, axis=axis, stream=mx.cpu))

        return call


fft = _FFT()


# -- everything else: NumPy on host copies, for integer and boolean data only ----------------
def _host_fallback(name, fn):
    def on_host(*args, **kwargs):
        floats = [a for a in (*args, *kwargs.values()) if isinstance(a, MlxArray) and a.native.dtype in _FLOATS]
        if floats:
            raise NotImplementedError(f"xp.{name} on {floats[0].dtype} data has no MLX equivalent "
                                      f"(a host copy would lose gradients)")
        host = [to_host(a) if isinstance(a, MlxArray) else a for a in args]
        host_kw = {k: to_host(v) if isinstance(v, MlxArray) else v for k, v in kwargs.items()}
        return _to_facade(fn(*host, **host_kw))

    on_host.__name__ = name
    return on_host


def _to_facade(x):
    if isinstance(x, np.ndarray) and x.dtype in _TO_MX:
        return MlxArray(_from_host(x))
    if isinstance(x, tuple):
        return tuple(_to_facade(v) for v in x)
    if isinstance(x, list):
        return [_to_facade(v) for v in x]
    return x


def __getattr__(name):
    value = getattr(np, name, None)
    if value is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if callable(value) and not isinstance(value, type):
        fn = _host_fallback(name, value)
        globals()[name] = fn
        return fn
    return value


# -- strings: NumPy's own function on the host -----------------------------------------------
def _host_values(v):
    if isinstance(v, MlxArray):
        return to_host(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_host_values(i) for i in v)
    return v


def _holds_strings(values) -> bool:
    for v in values:
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                return True
        elif isinstance(v, (list, tuple)) and _holds_strings(v):
            return True
    return False


def _strings_on_host(np_fn, fn):
    # Checked before the call, so a function calling another (take -> asarray) never sees a
    # NumPy result where it expects a facade.
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if _holds_strings(args) or (kwargs and _holds_strings(kwargs.values())):
            return np_fn(*_host_values(args), **{k: _host_values(v) for k, v in kwargs.items()})
        return fn(*args, **kwargs)

    return wrapped


for _name, _fn in list(globals().items()):
    _np_fn = getattr(np, _name, None)
    if (not _name.startswith("_") and callable(_fn) and callable(_np_fn) and not isinstance(_fn, type)
            and getattr(_fn, "__module__", None) == __name__):
        globals()[_name] = _strings_on_host(_np_fn, _fn)
