"""A NumPy-compatible facade over torch tensors, so the shared kernels run on torch unchanged.

:class:`TorchArray` wraps a ``torch.Tensor`` (``.native``) and behaves like an ndarray: NumPy
dtypes (``ml_dtypes.bfloat16`` for bf16), ``.astype``, NumPy reductions (``axis``, ``keepdims``),
NumPy promotion (NEP 50: Python scalars are weak) and NumPy indexing (negative steps too).
The module-level functions are the ``xp`` namespace the kernels call. Every op is a torch op
on the native tensors, so autograd sees the whole program.

Strings stay NumPy object arrays: a function given one runs NumPy's own function on the host
(strings are never differentiable, and torch has no string tensors).

>>> import numpy as np
>>> x = asarray(np.arange(6, dtype=np.int32)).reshape(2, 3)
>>> (x[:, ::-1] * 2.5).dtype, sum(x, axis=1).tolist()
(dtype('float64'), [3, 12])
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math
import types

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

# -- dtypes ----------------------------------------------------------------------------------
_PAIRS = [
    (np.bool_, torch.bool), (np.uint8, torch.uint8), (np.int8, torch.int8), (np.int16, torch.int16),
    (np.int32, torch.int32), (np.int64, torch.int64), (np.float16, torch.float16),
    (ml_dtypes.bfloat16, torch.bfloat16), (np.float32, torch.float32), (np.float64, torch.float64),
    (np.complex64, torch.complex64), (np.complex128, torch.complex128),
    (np.uint16, torch.uint16), (np.uint32, torch.uint32), (np.uint64, torch.uint64),
    (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn), (ml_dtypes.float8_e5m2, torch.float8_e5m2),
    (ml_dtypes.float8_e4m3fnuz, torch.float8_e4m3fnuz), (ml_dtypes.float8_e5m2fnuz, torch.float8_e5m2fnuz),
    (ml_dtypes.float8_e8m0fnu, torch.float8_e8m0fnu),
]
TO_TORCH: dict = {np.dtype(n): t for n, t in _PAIRS}
TO_NUMPY: dict = {t: np.dtype(n) for n, t in _PAIRS}
# Types torch stores but cannot compute with (no add/max/... kernels): values pass through
# them only as casts, so the backend reports them as unsupported.
STORAGE_ONLY = frozenset(np.dtype(t) for t in (np.uint16, np.uint32, np.uint64))
# dtype of NumPy's float ufuncs (exp, sqrt...) for integer inputs.
_INT_TO_FLOAT = {np.dtype(np.bool_): np.dtype(np.float16), np.dtype(np.int8): np.dtype(np.float16),
                 np.dtype(np.uint8): np.dtype(np.float16), np.dtype(np.int16): np.dtype(np.float32),
                 np.dtype(np.uint16): np.dtype(np.float32)}
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)

# NumPy's dtype names, so kernels write `x.astype(xp.float32)`.
bool_ = np.bool_
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
bfloat16 = ml_dtypes.bfloat16
nan, inf, pi, e, newaxis = np.nan, np.inf, np.pi, np.e, None
dtype, iinfo, finfo, issubdtype, result_type = np.dtype, np.iinfo, np.finfo, np.issubdtype, np.result_type
integer, floating, number, inexact, signedinteger, unsignedinteger = (
    np.integer, np.floating, np.number, np.inexact, np.signedinteger, np.unsignedinteger)

_state = types.SimpleNamespace(device=torch.device("cpu"))


@contextlib.contextmanager
def on_device(device):
    """Arrays built from host values inside this context go to ``device``."""
    old, _state.device = _state.device, torch.device(device)
    try:
        yield
    finally:
        _state.device = old


def torch_dtype(dt) -> torch.dtype:
    try:
        return TO_TORCH[dt]
    except (KeyError, TypeError):
        pass
    try:
        return TO_TORCH[np.dtype(dt)]
    except KeyError:
        raise TypeError(f"torch has no dtype {np.dtype(dt)}") from None


class _HostOnly(Exception):
    """An operand is a NumPy object (string) array: run NumPy's function on the host instead."""


# -- conversion ------------------------------------------------------------------------------
def tensor_from_numpy(arr: np.ndarray, device=None) -> torch.Tensor:
    """A torch tensor holding ``arr`` (ml_dtypes go through a same-width integer view)."""
    arr = np.asarray(arr)
    if arr.dtype == object:
        raise _HostOnly
    tt = torch_dtype(arr.dtype)
    if arr.dtype.type.__module__ == "ml_dtypes":
        view = {1: np.uint8, 2: np.int16}[arr.dtype.itemsize]
        t = torch.from_numpy(np.array(arr, order="C").view(view)).view(tt)
    elif arr.dtype in STORAGE_ONLY:
        t = torch.from_numpy(np.array(arr, order="C").view(np.dtype(f"int{arr.dtype.itemsize * 8}"))).view(tt)
    else:
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = np.array(arr, order="C")
        t = torch.from_numpy(arr)
    dev = device if device is not None else _state.device
    return t if dev.type == "cpu" else t.to(dev)


# torch.distributed.tensor.DTensor once a TorchBackend has a device mesh (mesh.py sets it; the
# import costs 0.7 s, so a plain backend never pays it): NumPy sees a DTensor's whole array.
DTENSOR = None


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    if DTENSOR is not None and isinstance(t, DTENSOR):
        t = t.full_tensor()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    np_dt = TO_NUMPY[t.dtype]
    if np_dt.type.__module__ == "ml_dtypes" or np_dt in STORAGE_ONLY:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[np_dt.itemsize]
        return t.contiguous().view(width).numpy().view(np_dt)
    if t.is_conj():
        t = t.resolve_conj()
    return t.numpy()


_WEAK = (bool, int, float, complex)


def native_tensor(x, device=None) -> torch.Tensor:
    """A torch tensor for any array-like (NumPy arrays are moved to the device)."""
    if type(x) is TorchArray:
        return x.native
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and builtins.any(isinstance(v, TorchArray) for v in x):
        return torch.stack([native_tensor(v, device) for v in x])
    return tensor_from_numpy(np.asarray(x), device)


def _np_dtype_of(x):
    if type(x) is TorchArray:
        return TO_NUMPY[x.native.dtype]
    if type(x) in _WEAK:
        return x
    return np.asarray(x).dtype if not isinstance(x, torch.Tensor) else TO_NUMPY[x.dtype]


def _device_of(args):
    for a in args:
        if type(a) is TorchArray:
            return a.native.device
    return _state.device


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _result_type(dts: list):
    """NumPy's result dtype of dtypes and Python scalars, where NumPy's rules stop at ml_dtypes'
    bfloat16 taking torch's: Python scalars are weak for bfloat16 as for NumPy's own floats
    (``np.result_type(bfloat16, 0.5)`` is float64, which turned a bfloat16 ``x * 0.5`` into
    float64), and bfloat16 meets int64 or float16 as in torch (NumPy has no common type for them)."""
    strong = [d for d in dts if type(d) not in _WEAK]
    try:
        rt = np.result_type(*dts)
    except TypeError:  # DTypePromotionError: bfloat16 with an integer type or float16
        rt = TO_NUMPY[functools.reduce(torch.promote_types, (TO_TORCH[np.dtype(d)] for d in strong))]
        if not rt.kind == "f" and rt != _BFLOAT16 and builtins.any(type(d) is float for d in dts):
            rt = np.dtype(np.float64)
        return rt
    if (rt != _BFLOAT16 and strong and len(strong) < len(dts) and np.result_type(*strong) == _BFLOAT16
            and not builtins.any(type(d) is complex for d in dts)):
        return _BFLOAT16
    return rt


def _promote(*args, tensors=False):
    """Operands as natives of NumPy's result dtype; Python scalars stay weak (left as scalars)
    unless ``tensors``. Returns (natives, numpy result dtype)."""
    # Fast path (most calls): tensors of one dtype, and Python ints with a floating one (weak: the
    # tensor's dtype wins, and no int overflows a float).
    dt, scalars = None, False
    for a in args:
        if type(a) is TorchArray:
            if dt is None:
                dt = a.native.dtype
            elif a.native.dtype is not dt:
                break
        elif type(a) is int and not tensors:
            scalars = True
        else:
            break
    else:
        if dt is not None and (not scalars or dt.is_floating_point):
            return [a.native if type(a) is TorchArray else a for a in args], TO_NUMPY[dt]
    dev = None
    items, dts = [], []
    for a in args:
        if type(a) is TorchArray:
            items.append(a.native)
            dts.append(TO_NUMPY[a.native.dtype])
        elif type(a) in _WEAK:
            items.append(a)
            dts.append(a)
        elif isinstance(a, torch.Tensor):
            items.append(a)
            dts.append(TO_NUMPY[a.dtype])
        else:
            if dev is None:
                dev = _device_of(args)
            arr = np.asarray(a)
            if arr.dtype == object:
                raise _HostOnly
            if isinstance(a, (list, tuple)) and builtins.any(isinstance(v, TorchArray) for v in a):
                t = native_tensor(a, dev)
                items.append(t)
                dts.append(TO_NUMPY[t.dtype])
                continue
            items.append(tensor_from_numpy(arr, dev))
            dts.append(arr.dtype)
    rt = _result_type(dts)
    tt = TO_TORCH[rt]
    out = []
    for it in items:
        if isinstance(it, torch.Tensor):
            out.append(it if it.dtype == tt else it.to(tt))
        elif tensors:
            if dev is None:
                dev = _device_of(args)
            out.append(torch.tensor(it, dtype=tt, device=dev))
        else:
            out.append(it)
    return out, rt


def _wrap(t):
    return TorchArray(t)


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(int(a) % ndim if ndim else int(a) for a in axis)
    return (int(axis) % ndim if ndim else int(axis),)


def _ints(shape) -> tuple:
    if type(shape) is tuple and all(type(s) is int for s in shape):  # the common case, as is
        return shape
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    if isinstance(shape, TorchArray):
        return tuple(tensor_to_numpy(shape.native).reshape(-1).tolist())
    if isinstance(shape, np.ndarray):
        return tuple(shape.reshape(-1).tolist())
    return tuple(int(s) for s in shape)


def _shape_args(shape):
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return _ints(shape[0])
    return _ints(shape)


# -- indexing --------------------------------------------------------------------------------
def _index_item(k, device):
    if k is None or k is Ellipsis or type(k) is int:
        return k
    if type(k) is slice:
        if builtins.any(v is not None and type(v) is not int for v in (k.start, k.stop, k.step)):
            return slice(*(None if v is None else int(v) for v in (k.start, k.stop, k.step)))
        return k
    if isinstance(k, (np.integer, bool, np.bool_)) and not isinstance(k, (bool, np.bool_)):
        return int(k)
    t = native_tensor(k, device) if not isinstance(k, (list, np.ndarray, np.bool_, bool)) else tensor_from_numpy(np.asarray(k), device)
    if t.dtype != torch.bool and t.dtype != torch.int64:
        t = t.long()
    return t


def _index(x: torch.Tensor, key):
    """A torch index equivalent to NumPy's ``key`` on ``x`` (negative steps become flips)."""
    if type(key) is not tuple:
        key = (key,)
    key = tuple(_index_item(k, x.device) for k in key)
    if not builtins.any(type(k) is slice and k.step is not None and k.step < 0 for k in key):
        return x, key
    consumed = builtins.sum(k.dim() if isinstance(k, torch.Tensor) and k.dtype == torch.bool else
                   0 if k is None or k is Ellipsis else 1 for k in key)
    dim, out = 0, []
    for k in key:
        if k is Ellipsis:
            dim += x.dim() - consumed
        elif k is None:
            pass
        elif type(k) is slice and k.step is not None and k.step < 0:
            n = x.shape[dim]
            r = range(*k.indices(n))
            x = x.flip(dim)
            k = slice(0, 0) if len(r) == 0 else slice(n - 1 - r[0], n - r[-1], -k.step)
            dim += 1
        elif isinstance(k, torch.Tensor) and k.dtype == torch.bool:
            dim += k.dim()
        else:
            dim += 1
        out.append(k)
    return x, tuple(out)


# -- the array -------------------------------------------------------------------------------
def _binary(fn, reflected=False):
    def op(self, other):
        if isinstance(other, np.ndarray) and other.dtype == object:
            return NotImplemented
        (a, b), _ = _promote(self, other)
        return TorchArray(fn(b, a) if reflected else fn(a, b))

    return op


def _true_divide(a, b):
    return torch.true_divide(a, b)


class TorchArray:
    """A torch tensor with NumPy's array interface (``.native`` is the tensor)."""

    __slots__ = ("native",)
    __array_ufunc__ = None  # NumPy defers `ndarray + TorchArray` to our reflected operators
    __array_priority__ = 1000

    def __init__(self, native: torch.Tensor):
        self.native = native

    # -- attributes
    @property
    def shape(self) -> tuple:
        return tuple(self.native.shape)

    @property
    def dtype(self) -> np.dtype:
        return TO_NUMPY[self.native.dtype]

    @property
    def ndim(self) -> int:
        return self.native.dim()

    @property
    def size(self) -> int:
        return self.native.numel()

    @property
    def itemsize(self) -> int:
        return self.native.element_size()

    @property
    def nbytes(self) -> int:
        return self.native.numel() * self.native.element_size()

    @property
    def T(self):
        return TorchArray(self.native.permute(*reversed(range(self.native.dim()))))

    @property
    def real(self):
        return real(self)

    @property
    def imag(self):
        return imag(self)

    @property
    def flat(self):
        return iter(self.reshape(-1))

    # -- conversion
    def __array__(self, dtype=None, copy=None):
        arr = tensor_to_numpy(self.native)
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self) -> str:
        return f"TorchArray({tensor_to_numpy(self.native)!r}, device={self.native.device})"

    def __len__(self) -> int:
        if self.native.dim() == 0:
            raise TypeError("len() of unsized object")
        return self.native.shape[0]

    def __iter__(self):
        if self.native.dim() == 0:
            raise TypeError("iteration over a 0-d array")
        return (TorchArray(t) for t in self.native.unbind(0))

    def _whole(self) -> torch.Tensor:
        """The tensor, or a DTensor's whole value (a shard or a pending sum is not the value)."""
        t = self.native
        return t.full_tensor() if DTENSOR is not None and isinstance(t, DTENSOR) else t

    def __bool__(self) -> bool:
        return bool(self._whole())

    def __int__(self) -> int:
        return int(self._whole().item())

    def __float__(self) -> float:
        return float(self._whole().item())

    def __complex__(self) -> complex:
        return complex(self._whole().item())

    def __index__(self) -> int:
        if self.native.dtype.is_floating_point:
            raise TypeError("only integer arrays can be converted to an index")
        return int(self._whole().item())

    def __round__(self, ndigits=None):
        return builtins.round(self.item(), ndigits)

    def item(self, *args):
        v = self.native.reshape(-1)[args[0]] if args else self.native
        return tensor_to_numpy(v).item()

    def tolist(self):
        return tensor_to_numpy(self.native).tolist()

    def tobytes(self) -> bytes:
        return tensor_to_numpy(self.native).tobytes()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # torch.* functions accept a TorchArray: they see the native tensor.
        return func(*_unwrap(args), **{k: _unwrap(v) for k, v in (kwargs or {}).items()})

    # -- methods
    def astype(self, dtype, copy=True):
        tt = torch_dtype(dtype)
        if tt == self.native.dtype:
            return TorchArray(self.native.clone()) if copy else self
        return TorchArray(_cast(self.native, tt))

    def copy(self):
        return TorchArray(self.native.clone())

    def reshape(self, *shape, order="C"):
        return TorchArray(self.native.reshape(_shape_args(shape)))

    def transpose(self, *axes):
        if not axes or axes == (None,):
            return self.T
        return TorchArray(self.native.permute(_shape_args(axes)))

    def swapaxes(self, a, b):
        return TorchArray(self.native.transpose(a, b))

    def flatten(self, order="C"):
        return TorchArray(self.native.reshape(-1).clone())

    def ravel(self, order="C"):
        return TorchArray(self.native.reshape(-1))

    def squeeze(self, axis=None):
        return squeeze(self, axis)

    def view(self, dtype=None):
        if dtype is None:
            return self
        return TorchArray(self.native.view(torch_dtype(dtype)))

    def conj(self):
        return TorchArray(torch.conj_physical(self.native) if self.native.is_complex() else self.native)

    conjugate = conj

    def sum(self, axis=None, dtype=None, keepdims=False, **kw):
        return sum(self, axis=axis, dtype=dtype, keepdims=keepdims, **kw)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False, initial=None):
        return max(self, axis=axis, keepdims=keepdims, initial=initial)

    def min(self, axis=None, keepdims=False, initial=None):
        return min(self, axis=axis, keepdims=keepdims, initial=initial)

    def prod(self, axis=None, dtype=None, keepdims=False):
        return prod(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return any(self, axis=axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return all(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        return argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis=None, keepdims=False):
        return argmin(self, axis=axis, keepdims=keepdims)

    def argsort(self, axis=-1, kind=None):
        return argsort(self, axis=axis, kind=kind)

    def cumsum(self, axis=None, dtype=None):
        return cumsum(self, axis=axis, dtype=dtype)

    def cumprod(self, axis=None, dtype=None):
        return cumprod(self, axis=axis, dtype=dtype)

    def clip(self, min=None, max=None):
        return clip(self, min, max)

    def round(self, decimals=0):
        return round(self, decimals)

    def take(self, indices, axis=None):
        return take(self, indices, axis=axis)

    def repeat(self, repeats, axis=None):
        return repeat(self, repeats, axis=axis)

    def nonzero(self):
        return nonzero(self)

    def std(self, axis=None, keepdims=False, ddof=0):
        return std(self, axis=axis, keepdims=keepdims, ddof=ddof)

    def var(self, axis=None, keepdims=False, ddof=0):
        return var(self, axis=axis, keepdims=keepdims, ddof=ddof)

    def dot(self, other):
        return matmul(self, other)

    def fill(self, value):
        self.native.fill_(value)

    # -- indexing
    def __getitem__(self, key):
        x, key = _index(self.native, key)
        return TorchArray(x[key])

    def __setitem__(self, key, value):
        x, k = _index(self.native, key)
        if x is not self.native:
            raise NotImplementedError("assignment through a negative-step slice")
        if type(value) in _WEAK:
            x[k] = value
        else:
            x[k] = native_tensor(value, x.device).to(x.dtype)

    # -- operators
    __add__, __radd__ = _binary(torch.add), _binary(torch.add, True)
    __sub__, __rsub__ = _binary(torch.sub), _binary(torch.sub, True)
    __mul__, __rmul__ = _binary(torch.mul), _binary(torch.mul, True)
    __floordiv__, __rfloordiv__ = _binary(torch.floor_divide), _binary(torch.floor_divide, True)
    __mod__, __rmod__ = _binary(torch.remainder), _binary(torch.remainder, True)
    __pow__, __rpow__ = _binary(torch.pow), _binary(torch.pow, True)
    __matmul__, __rmatmul__ = _binary(torch.matmul), _binary(torch.matmul, True)
    __and__, __rand__ = _binary(torch.bitwise_and), _binary(torch.bitwise_and, True)
    __or__, __ror__ = _binary(torch.bitwise_or), _binary(torch.bitwise_or, True)
    __xor__, __rxor__ = _binary(torch.bitwise_xor), _binary(torch.bitwise_xor, True)
    __lshift__, __rlshift__ = _binary(torch.bitwise_left_shift), _binary(torch.bitwise_left_shift, True)
    __rshift__, __rrshift__ = _binary(torch.bitwise_right_shift), _binary(torch.bitwise_right_shift, True)
    __eq__, __ne__ = _binary(torch.eq), _binary(torch.ne)
    __lt__, __le__ = _binary(torch.lt), _binary(torch.le)
    __gt__, __ge__ = _binary(torch.gt), _binary(torch.ge)
    __hash__ = None

    def __truediv__(self, other):
        return divide(self, other)

    def __rtruediv__(self, other):
        return divide(other, self)

    def __neg__(self):
        return TorchArray(torch.neg(self.native))

    def __pos__(self):
        return self

    def __abs__(self):
        return TorchArray(torch.abs(self.native))

    def __invert__(self):
        return TorchArray(torch.bitwise_not(self.native))


def _unwrap(v):
    if type(v) is TorchArray:
        return v.native
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(i) for i in v)
    return v


# float8 types without infinities: torch saturates out-of-range values, NumPy (ml_dtypes) and
# ONNX's non-saturating Cast give NaN. Beyond these bounds a value rounds past the largest finite.
_NAN_ABOVE = {torch.float8_e4m3fn: 464.0, torch.float8_e4m3fnuz: 248.0}


def _cast(t: torch.Tensor, tt: torch.dtype) -> torch.Tensor:
    if t.is_complex() and not tt.is_complex:
        t = t.real
    out = t.to(tt)
    bound = _NAN_ABOVE.get(tt)
    if bound is not None and t.dtype.is_floating_point:
        over = ~(t.abs() <= bound)
        if t.dtype == torch.float32 or t.dtype == torch.float64:
            over = over & ~torch.isnan(t) | torch.isnan(t)
        out = torch.where(over, torch.full((), float("nan"), dtype=torch.float32).to(tt), out)
    return out


# -- host fallback for strings ------------------------------------------------------------------
def _to_host(v):
    if type(v) is TorchArray:
        return np.asarray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_host(i) for i in v)
    return v


def _host_fallback(np_fn):
    def deco(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except _HostOnly:
                return np_fn(*_to_host(args), **{k: _to_host(v) for k, v in kwargs.items()})

        return wrapped

    return deco


def _np(name):
    return _host_fallback(getattr(np, name))


# -- creation --------------------------------------------------------------------------------
@_np("asarray")
def asarray(x, dtype=None, copy=None):
    if type(x) is TorchArray:
        return x if dtype is None else x.astype(dtype, copy=False)
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, (list, tuple)) and builtins.any(isinstance(v, TorchArray) for v in x):
        (*ts,), _ = _promote(*x, tensors=True)
        t = torch.stack(ts)
    else:
        arr = np.asarray(x, dtype=dtype)
        if arr.dtype == object:
            raise _HostOnly
        t = tensor_from_numpy(arr)
    if dtype is not None:
        tt = torch_dtype(dtype)
        if t.dtype != tt:
            t = _cast(t, tt)
    return TorchArray(t)


array = asarray


def astype(x, dtype, copy=True):
    return asarray(x).astype(dtype, copy=copy)


def _creation_dtype(dtype, default=np.float64):
    return torch_dtype(default if dtype is None else dtype)


def zeros(shape, dtype=None):
    return TorchArray(torch.zeros(_ints(shape), dtype=_creation_dtype(dtype), device=_state.device))


def ones(shape, dtype=None):
    return TorchArray(torch.ones(_ints(shape), dtype=_creation_dtype(dtype), device=_state.device))


empty = zeros


def full(shape, fill_value, dtype=None):
    shape = _ints(shape)
    if type(fill_value) is TorchArray or isinstance(fill_value, np.ndarray):
        v = asarray(fill_value, dtype=dtype).native
        return TorchArray(v.expand(shape).clone())
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    return TorchArray(torch.full(shape, fill_value, dtype=torch_dtype(dtype), device=_state.device))


def zeros_like(x, dtype=None):
    t = native_tensor(x)
    return TorchArray(torch.zeros_like(t, dtype=None if dtype is None else torch_dtype(dtype)))


def ones_like(x, dtype=None):
    t = native_tensor(x)
    return TorchArray(torch.ones_like(t, dtype=None if dtype is None else torch_dtype(dtype)))


def full_like(x, fill_value, dtype=None):
    t = native_tensor(x)
    tt = t.dtype if dtype is None else torch_dtype(dtype)
    if type(fill_value) is TorchArray:
        return TorchArray(fill_value.native.to(tt).expand(t.shape).clone())
    return TorchArray(torch.full_like(t, fill_value, dtype=tt))


def eye(N, M=None, k=0, dtype=float):
    return TorchArray(tensor_from_numpy(np.eye(int(N), None if M is None else int(M), int(k), dtype=dtype)))


def arange(start, stop=None, step=None, dtype=None):
    vals = [v.item() if hasattr(v, "item") else v for v in (start, stop, step) if v is not None]
    if dtype is None:
        dtype = np.result_type(*[np.asarray(v).dtype for v in vals])
        if dtype.kind in "iub":
            dtype = np.dtype(np.int64)
    tt = torch_dtype(dtype)
    if len(vals) == 1:
        vals = [0, vals[0]]
    # torch computes the length like NumPy, ceil((stop - start) / step), in double
    if len(vals) == 3 and vals[2] < 0 and vals[1] >= vals[0] or len(vals) >= 2 and (
            (len(vals) == 2 or vals[2] > 0) and vals[1] <= vals[0]):
        return TorchArray(torch.zeros(0, dtype=tt, device=_state.device))
    return TorchArray(torch.arange(*vals, dtype=tt, device=_state.device))


# -- elementwise -----------------------------------------------------------------------------
def _float_unary(fn, name):
    @_np(name)
    def op(x):
        t = native_tensor(x) if not isinstance(x, _WEAK) else torch.tensor(x, dtype=torch.float64)
        if not (t.dtype.is_floating_point or t.dtype.is_complex):
            t = t.to(TO_TORCH[_INT_TO_FLOAT.get(TO_NUMPY[t.dtype], _F64)])
        return TorchArray(fn(t))

    op.__name__ = name
    return op


def _any_unary(fn, name):
    @_np(name)
    def op(x):
        return TorchArray(fn(native_tensor(x)))

    op.__name__ = name
    return op


sqrt = _float_unary(torch.sqrt, "sqrt")
exp = _float_unary(torch.exp, "exp")
expm1 = _float_unary(torch.expm1, "expm1")
log = _float_unary(torch.log, "log")
log1p = _float_unary(torch.log1p, "log1p")
log2 = _float_unary(torch.log2, "log2")
log10 = _float_unary(torch.log10, "log10")
sin = _float_unary(torch.sin, "sin")
cos = _float_unary(torch.cos, "cos")
tan = _float_unary(torch.tan, "tan")
arcsin = _float_unary(torch.asin, "arcsin")
arccos = _float_unary(torch.acos, "arccos")
arctan = _float_unary(torch.atan, "arctan")
sinh = _float_unary(torch.sinh, "sinh")
cosh = _float_unary(torch.cosh, "cosh")
tanh = _float_unary(torch.tanh, "tanh")
arcsinh = _float_unary(torch.asinh, "arcsinh")
arccosh = _float_unary(torch.acosh, "arccosh")
arctanh = _float_unary(torch.atanh, "arctanh")
abs = absolute = _any_unary(torch.abs, "abs")
negative = _any_unary(torch.neg, "negative")
isnan = _any_unary(torch.isnan, "isnan")
isinf = _any_unary(torch.isinf, "isinf")
isfinite = _any_unary(torch.isfinite, "isfinite")
isneginf = _any_unary(torch.isneginf, "isneginf")
isposinf = _any_unary(torch.isposinf, "isposinf")
logical_not = _any_unary(torch.logical_not, "logical_not")
invert = bitwise_not = _any_unary(torch.bitwise_not, "invert")
signbit = _any_unary(torch.signbit, "signbit")


def _int_passthrough(fn, name):
    @_np(name)
    def op(x):
        t = native_tensor(x)
        return TorchArray(fn(t) if t.dtype.is_floating_point else t.clone())

    op.__name__ = name
    return op


floor = _int_passthrough(torch.floor, "floor")
ceil = _int_passthrough(torch.ceil, "ceil")
trunc = _int_passthrough(torch.trunc, "trunc")
rint = _int_passthrough(torch.round, "rint")


def sign(x):
    t = native_tensor(x)
    s = torch.sign(t)
    return TorchArray(torch.where(torch.isnan(t), t, s) if t.dtype.is_floating_point else s)


def round(x, decimals=0):
    t = native_tensor(x)
    if not t.dtype.is_floating_point:
        return TorchArray(t.clone())
    return TorchArray(torch.round(t, decimals=int(decimals)) if decimals else torch.round(t))


around = round


def real(x):
    t = native_tensor(x)
    return TorchArray(t.real if t.is_complex() else t)


def imag(x):
    t = native_tensor(x)
    return TorchArray(t.imag if t.is_complex() else torch.zeros_like(t))


def _binary_fn(fn, name, weak_ok=True):
    @_np(name)
    def op(a, b):
        (x, y), _ = _promote(a, b, tensors=not weak_ok or not (type(a) is TorchArray or type(b) is TorchArray))
        return TorchArray(fn(x, y))

    op.__name__ = name
    return op


add = _binary_fn(torch.add, "add")
subtract = _binary_fn(torch.sub, "subtract")
multiply = _binary_fn(torch.mul, "multiply")
power = _binary_fn(torch.pow, "power")
remainder = mod = _binary_fn(torch.remainder, "remainder")
fmod = _binary_fn(torch.fmod, "fmod")
floor_divide = _binary_fn(torch.floor_divide, "floor_divide")
equal = _binary_fn(torch.eq, "equal")
not_equal = _binary_fn(torch.ne, "not_equal")
less = _binary_fn(torch.lt, "less")
less_equal = _binary_fn(torch.le, "less_equal")
greater = _binary_fn(torch.gt, "greater")
greater_equal = _binary_fn(torch.ge, "greater_equal")
logical_and = _binary_fn(torch.logical_and, "logical_and")
logical_or = _binary_fn(torch.logical_or, "logical_or")
logical_xor = _binary_fn(torch.logical_xor, "logical_xor")
bitwise_and = _binary_fn(torch.bitwise_and, "bitwise_and")
bitwise_or = _binary_fn(torch.bitwise_or, "bitwise_or")
bitwise_xor = _binary_fn(torch.bitwise_xor, "bitwise_xor")
left_shift = _binary_fn(torch.bitwise_left_shift, "left_shift")
right_shift = _binary_fn(torch.bitwise_right_shift, "right_shift")
arctan2 = _binary_fn(torch.atan2, "arctan2", weak_ok=False)
hypot = _binary_fn(torch.hypot, "hypot", weak_ok=False)
copysign = _binary_fn(torch.copysign, "copysign", weak_ok=False)


@_np("divide")
def divide(a, b):
    (x, y), rt = _promote(a, b, tensors=not (type(a) is TorchArray or type(b) is TorchArray))
    if rt.kind in "biu":
        x = x.double() if isinstance(x, torch.Tensor) else float(x)
        y = y.double() if isinstance(y, torch.Tensor) else float(y)
    return TorchArray(torch.true_divide(x, y))


true_divide = divide


def _extremum(fn, clamp, name):
    @_np(name)
    def op(a, b):
        if type(b) in _WEAK and type(a) is TorchArray and not (type(b) is float and math.isnan(b)):
            (x, _), rt = _promote(a, b)
            if np.result_type(a.dtype, b) == a.dtype:
                return TorchArray(clamp(x, b))
        (x, y), _ = _promote(a, b, tensors=True)
        return TorchArray(fn(x, y))

    op.__name__ = name
    return op


maximum = _extremum(torch.maximum, torch.clamp_min, "maximum")
minimum = _extremum(torch.minimum, torch.clamp_max, "minimum")
fmax = _binary_fn(torch.fmax, "fmax", weak_ok=False)
fmin = _binary_fn(torch.fmin, "fmin", weak_ok=False)


@_np("logaddexp")
def logaddexp(a, b):
    (x, y), rt = _promote(a, b, tensors=True)
    if rt.kind in "biu":
        x, y = x.double(), y.double()
    return TorchArray(torch.logaddexp(x, y))


@_np("ldexp")
def ldexp(x, e):
    t = native_tensor(x)
    if not t.dtype.is_floating_point:
        t = t.double()
    return TorchArray(t * torch.pow(2.0, native_tensor(e, t.device).to(t.dtype)))


def frexp(x):
    m, e = torch.frexp(native_tensor(x))
    return TorchArray(m), TorchArray(e)


@_np("clip")
def clip(x, a_min=None, a_max=None, **kw):
    a_min = kw.get("min", a_min)
    a_max = kw.get("max", a_max)
    args = [x] + [v for v in (a_min, a_max) if v is not None]
    natives, _ = _promote(*args, tensors=True)
    t = natives[0]
    lo = natives[1] if a_min is not None else None
    hi = natives[-1] if a_max is not None else None
    if lo is not None:
        t = torch.maximum(t, lo)
    if hi is not None:
        t = torch.minimum(t, hi)
    return TorchArray(t)


@_np("where")
def where(cond, x=None, y=None):
    if x is None and y is None:
        return nonzero(cond)
    c = native_tensor(cond)
    if c.dtype != torch.bool:
        c = c != 0
    (a, b), _ = _promote(x, y, tensors=True)
    return TorchArray(torch.where(c, a, b))


# -- reductions -----------------------------------------------------------------------------
def _reduce_args(x, axis):
    t = native_tensor(x)
    return t, _axes(axis, t.dim())


def _int_sum_dtype(t):
    # NumPy sums small integers (and bools) in the platform integer.
    return torch.int64 if not (t.dtype.is_floating_point or t.dtype.is_complex) and t.dtype != torch.uint64 else None


@_np("sum")
def sum(x, axis=None, dtype=None, keepdims=False, initial=None, **_):
    t, axes = _reduce_args(x, axis)
    tt = torch_dtype(dtype) if dtype is not None else _int_sum_dtype(t)
    if not axes:
        r = t.to(tt) if tt is not None else t.clone()
    else:
        r = torch.sum(t, dim=axes, keepdim=keepdims, dtype=tt)
    if initial is not None:
        r = r + initial
    return TorchArray(r)


@_np("prod")
def prod(x, axis=None, dtype=None, keepdims=False, **_):
    t, axes = _reduce_args(x, axis)
    tt = torch_dtype(dtype) if dtype is not None else _int_sum_dtype(t)
    if tt is not None:
        t = t.to(tt)
    if not axes:
        return TorchArray(t.clone())
    if len(axes) == t.dim() and not keepdims:
        return TorchArray(torch.prod(t))
    for a in sorted(axes, reverse=True):
        t = torch.prod(t, dim=a, keepdim=keepdims) if keepdims else torch.prod(t, dim=a)
    return TorchArray(t)


@_np("mean")
def mean(x, axis=None, dtype=None, keepdims=False, **_):
    t, axes = _reduce_args(x, axis)
    if dtype is not None:
        t = t.to(torch_dtype(dtype))
    elif not (t.dtype.is_floating_point or t.dtype.is_complex):
        t = t.double()
    if not axes:
        return TorchArray(t.clone())
    return TorchArray(torch.mean(t, dim=axes, keepdim=keepdims))


def _extreme(fn, name):
    @_np(name)
    def op(x, axis=None, keepdims=False, initial=None, **_):
        t, axes = _reduce_args(x, axis)
        if not axes:
            return TorchArray(t.clone())
        if t.numel() == 0 and initial is not None:
            shape = [1 if i in axes else s for i, s in enumerate(t.shape)] if keepdims else \
                [s for i, s in enumerate(t.shape) if i not in axes]
            return TorchArray(torch.full(shape, initial, dtype=t.dtype, device=t.device))
        r = fn(t, dim=axes, keepdim=keepdims)
        if initial is not None:
            r = (torch.clamp_min if fn is torch.amax else torch.clamp_max)(r, initial)
        return TorchArray(r)

    op.__name__ = name
    return op


max = amax = _extreme(torch.amax, "max")
min = amin = _extreme(torch.amin, "min")


def _logical_reduce(fn, name):
    @_np(name)
    def op(x, axis=None, keepdims=False, **_):
        t, axes = _reduce_args(x, axis)
        if t.dtype != torch.bool:
            t = t != 0
        if not axes:
            return TorchArray(t.clone())
        return TorchArray(fn(t, dim=axes, keepdim=keepdims))

    op.__name__ = name
    return op


any = _logical_reduce(torch.any, "any")
all = _logical_reduce(torch.all, "all")


def _arg_reduce(fn):
    def op(x, axis=None, keepdims=False):
        t = native_tensor(x)
        if axis is None:
            r = fn(t.reshape(-1))
            return TorchArray(r.reshape([1] * t.dim()) if keepdims else r)
        return TorchArray(fn(t, dim=int(axis), keepdim=keepdims))

    return op


argmax = _arg_reduce(torch.argmax)
argmin = _arg_reduce(torch.argmin)


def _scan(fn):
    def op(x, axis=None, dtype=None):
        t = native_tensor(x)
        if axis is None:
            t, axis = t.reshape(-1), 0
        tt = torch_dtype(dtype) if dtype is not None else _int_sum_dtype(t)
        return TorchArray(fn(t, dim=int(axis), dtype=tt))

    return op


cumsum = _scan(torch.cumsum)
cumprod = _scan(torch.cumprod)


def var(x, axis=None, keepdims=False, ddof=0, dtype=None):
    t, axes = _reduce_args(x, axis)
    if not t.dtype.is_floating_point:
        t = t.double()
    return TorchArray(torch.var(t, dim=axes, keepdim=keepdims, correction=ddof))


def std(x, axis=None, keepdims=False, ddof=0, dtype=None):
    t, axes = _reduce_args(x, axis)
    if not t.dtype.is_floating_point:
        t = t.double()
    return TorchArray(torch.std(t, dim=axes, keepdim=keepdims, correction=ddof))


# -- shape and indexing ------------------------------------------------------------------------
@_np("reshape")
def reshape(x, shape, order="C"):
    return TorchArray(native_tensor(x).reshape(_ints(shape)))


@_np("transpose")
def transpose(x, axes=None):
    t = native_tensor(x)
    return TorchArray(t.permute(*reversed(range(t.dim())) if axes is None else _ints(axes)))


@_np("swapaxes")
def swapaxes(x, a, b):
    return TorchArray(native_tensor(x).transpose(int(a), int(b)))


@_np("moveaxis")
def moveaxis(x, source, destination):
    s = tuple(source) if isinstance(source, (tuple, list)) else int(source)
    d = tuple(destination) if isinstance(destination, (tuple, list)) else int(destination)
    return TorchArray(torch.movedim(native_tensor(x), s, d))


@_np("expand_dims")
def expand_dims(x, axis):
    t = native_tensor(x)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    n = t.dim() + len(axes)
    for a in sorted(int(a) % n for a in axes):
        t = t.unsqueeze(a)
    return TorchArray(t)


@_np("squeeze")
def squeeze(x, axis=None):
    t = native_tensor(x)
    if axis is None:
        return TorchArray(t.squeeze())
    return TorchArray(t.squeeze(_axes(axis, t.dim())))


@_np("broadcast_to")
def broadcast_to(x, shape):
    return TorchArray(native_tensor(x).expand(_ints(shape)))


def broadcast_arrays(*args):
    ts = [native_tensor(a) for a in args]
    return [TorchArray(t) for t in torch.broadcast_tensors(*ts)]


broadcast_shapes = np.broadcast_shapes


@_np("concatenate")
def concatenate(arrays, axis=0, dtype=None):
    ts, _ = _promote(*arrays, tensors=True)
    if axis is None:
        ts, axis = [t.reshape(-1) for t in ts], 0
    out = torch.cat(ts, dim=int(axis))
    return TorchArray(out if dtype is None else out.to(torch_dtype(dtype)))


@_np("stack")
def stack(arrays, axis=0):
    ts, _ = _promote(*arrays, tensors=True)
    return TorchArray(torch.stack(ts, dim=int(axis)))


@_np("split")
def split(x, indices_or_sections, axis=0):
    t = native_tensor(x)
    ios = indices_or_sections
    ios = int(ios) if isinstance(ios, (int, np.integer)) else [int(i) for i in ios]
    return [TorchArray(p) for p in torch.tensor_split(t, ios, dim=int(axis))]


array_split = split


@_np("tile")
def tile(x, reps):
    return TorchArray(torch.tile(native_tensor(x), _ints(reps)))


@_np("repeat")
def repeat(x, repeats, axis=None):
    t = native_tensor(x)
    r = int(repeats) if isinstance(repeats, (int, np.integer)) else native_tensor(repeats, t.device).long()
    return TorchArray(torch.repeat_interleave(t, r, dim=None if axis is None else int(axis)))


@_np("flip")
def flip(x, axis=None):
    t = native_tensor(x)
    return TorchArray(t.flip(_axes(axis, t.dim())))


def _pairs(pad_width, ndim):
    pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64).reshape(-1, 2) if np.ndim(pad_width) else
                         np.full((1, 2), int(pad_width)), (ndim, 2))
    return [(int(a), int(b)) for a, b in pw]


@_np("pad")
def pad(x, pad_width, mode="constant", constant_values=0, **kw):
    t = native_tensor(x)
    pairs = _pairs(pad_width, t.dim())
    if mode == "constant":
        flat = []
        for a, b in reversed(pairs):
            flat += [a, b]
        cv = constant_values.item() if hasattr(constant_values, "item") else constant_values
        if isinstance(cv, (tuple, list)):
            cv = np.asarray(cv).reshape(-1)[0].item()
        return TorchArray(F.pad(t, flat, value=cv) if builtins.any(flat) else t.clone())
    # edge/reflect/symmetric/wrap: NumPy computes the source index of every padded position.
    for axis, (a, b) in enumerate(pairs):
        if a or b:
            idx = np.pad(np.arange(t.shape[axis]), (a, b), mode=mode, **kw)
            t = t.index_select(axis, torch.from_numpy(idx).to(t.device))
    return TorchArray(t)


def _norm_index(idx: torch.Tensor, n: int) -> torch.Tensor:
    if idx.dtype != torch.int64:
        idx = idx.long()
    return torch.where(idx < 0, idx + n, idx)


@_np("take")
def take(x, indices, axis=None, mode=None):
    t = native_tensor(x)
    if axis is None:
        t, axis = t.reshape(-1), 0
    axis = int(axis) % t.dim()
    n = t.shape[axis]
    if isinstance(indices, (int, np.integer)) and mode is None:
        return TorchArray(t.select(axis, int(indices)))
    idx = native_tensor(indices, t.device)
    if mode == "clip":
        idx = idx.long().clamp(0, n - 1)
    elif mode == "wrap":
        idx = torch.remainder(idx.long(), n)
    else:
        idx = _norm_index(idx, n)
    out = t.index_select(axis, idx.reshape(-1))
    return TorchArray(out.reshape(t.shape[:axis] + idx.shape + t.shape[axis + 1:]))


@_np("take_along_axis")
def take_along_axis(x, indices, axis):
    t = native_tensor(x)
    if axis is None:
        t, axis = t.reshape(-1), 0
    axis = int(axis) % t.dim()
    idx = _norm_index(native_tensor(indices, t.device), t.shape[axis])
    return TorchArray(torch.take_along_dim(t, idx, dim=axis))


def nonzero(x):
    t = native_tensor(x)
    if t.dim() == 0:
        t = t.reshape(1)
    return tuple(TorchArray(i) for i in torch.nonzero(t, as_tuple=True))


def argwhere(x):
    return TorchArray(torch.nonzero(native_tensor(x)))


def argsort(x, axis=-1, kind=None, stable=None):
    t = native_tensor(x)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return TorchArray(torch.argsort(t, dim=int(axis), stable=True))


def sort(x, axis=-1, kind=None, stable=None):
    t = native_tensor(x)
    if axis is None:
        t, axis = t.reshape(-1), 0
    return TorchArray(torch.sort(t, dim=int(axis), stable=True).values)


def ndim(x):
    return native_tensor(x).dim() if not isinstance(x, np.ndarray) else x.ndim


def shape(x):
    return tuple(native_tensor(x).shape) if not isinstance(x, np.ndarray) else x.shape


def size(x):
    return native_tensor(x).numel() if not isinstance(x, np.ndarray) else x.size


# -- linear algebra ---------------------------------------------------------------------------
def matmul(a, b):
    (x, y), _ = _promote(a, b, tensors=True)
    return TorchArray(torch.matmul(x, y))


dot = matmul


def einsum(subscripts, *operands, optimize=None):
    ts, _ = _promote(*operands, tensors=True)
    return TorchArray(torch.einsum(subscripts, *ts))


def outer(a, b):
    (x, y), _ = _promote(a, b, tensors=True)
    return TorchArray(torch.outer(x.reshape(-1), y.reshape(-1)))


def _det(x):
    return TorchArray(torch.linalg.det(native_tensor(x)))


def _inv(x):
    return TorchArray(torch.linalg.inv(native_tensor(x)))


linalg = types.SimpleNamespace(det=_det, inv=_inv)


def _fft_fn(fn):
    def op(a, n=None, axis=-1, norm=None):
        t = native_tensor(a)
        if not (t.dtype.is_floating_point or t.is_complex()):
            t = t.double()
        return TorchArray(fn(t, n=None if n is None else int(n), dim=int(axis), norm=norm))

    return op


fft = types.SimpleNamespace(fft=_fft_fn(torch.fft.fft), ifft=_fft_fn(torch.fft.ifft),
                            rfft=_fft_fn(torch.fft.rfft), irfft=_fft_fn(torch.fft.irfft))


def __getattr__(name):
    raise AttributeError(f"the torch facade (mithril.backends.torch.xp) has no xp.{name}; "
                         f"add it there or override the kernel for torch")
