"""The MLX backend: the generated program over a NumPy-compatible facade of ``mlx.core``,
compiled whole with ``mx.compile``; gradients by ``mx.value_and_grad``."""

from __future__ import annotations

import functools

import numpy as np

from ...errors import BackendUnavailableError
from ..backend import Backend

# Imported by the first MlxBackend(), so `import mithril` never imports mlx.
mx = xp = None


def _import_mlx() -> None:
    global mx, xp
    if mx is None:
        try:
            import mlx.core as _mx

            from . import xp as _xp
        except ImportError as exc:
            raise BackendUnavailableError(f"MlxBackend needs mlx ({exc}): pip install mithril[mlx]") from exc
        mx, xp = _mx, _xp


def _present_devices() -> list[str]:
    kinds = {"cpu": mx.cpu, "gpu": mx.gpu}
    return [name for name, kind in kinds.items() if mx.is_available(mx.Device(kind))]


def _parse_device(device: str):
    """``"cpu"`` or ``"gpu"`` -> the mx.Device, or BackendUnavailableError naming what is present."""
    kinds = {"cpu": mx.cpu, "gpu": mx.gpu}
    present = _present_devices()
    kind = kinds.get(device.lower())
    if kind is None or device.lower() not in present:
        raise BackendUnavailableError(
            f"MlxBackend: device {device!r} is not present; present devices: {', '.join(present)}")
    return mx.Device(kind)


def _unwrap(tree):
    """Facade arrays -> mx.arrays through dicts, lists and tuples."""
    if isinstance(tree, dict):
        return {k: _unwrap(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_unwrap(v) for v in tree)
    return tree.native if isinstance(tree, xp.MlxArray) else tree


def _wrap(tree):
    if isinstance(tree, dict):
        return {k: _wrap(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_wrap(v) for v in tree)
    return xp.MlxArray(tree) if isinstance(tree, mx.array) else tree


def _only_arrays(tree) -> bool:
    if isinstance(tree, dict):
        return all(_only_arrays(v) for v in tree.values())
    return isinstance(tree, mx.array)


class _Compiled:
    """``mx.compile`` of the whole generated forward. A trace failure raises: ``evaluate`` then
    runs the forward op by op and stays so (with a JitFallbackWarning). Calls with host-only
    inputs (strings) run op by op here, silently. Graphs with random draws never get here:
    compile reads the kernels' ``nondeterministic`` metadata and keeps them eager on every backend."""

    def __init__(self, backend: "MlxBackend", forward):
        self.backend = backend
        self.forward = forward
        self._compiled = mx.compile(self._native_forward)

    def _native_forward(self, params, data):
        return _unwrap(self.forward(_wrap(params), _wrap(data)))

    def __call__(self, params, data):
        params, data = _unwrap(dict(params)), _unwrap(dict(data))
        with mx.stream(self.backend._device):
            if self._compiled is not None and _only_arrays(params) and _only_arrays(data):
                return _wrap(self._compiled(params, data))
            return self.forward(_wrap(params), _wrap(data))

    @property
    def compiled(self) -> bool:
        return self._compiled is not None


class MlxBackend(Backend):
    """Runs lowered ONNX graphs on Apple's MLX (CPU, or the GPU where present).

    Users see ``mx.array`` everywhere: ``evaluate`` takes mx.arrays (or NumPy arrays, kept at
    their dtype) and returns mx.arrays, gradients are mx.arrays, and the tensor API (``array``,
    ``zeros``, ``add``...) takes and returns mx.arrays. Inside, the shared kernels run on
    :class:`~mithril.backends.mlx.xp.MlxArray`, a NumPy-compatible facade whose ``.native``
    is the ``mx.array`` (``prepare_inputs`` wraps, ``finalize_outputs`` unwraps). ``compile(..., jit=True)`` compiles the whole graph with
    ``mx.compile``. MLX has no float64 on its default CPU path and none on the GPU: graphs
    holding it are reported unsupported at compile time. MLX has no strings either; like JAX and
    Torch, strings stay NumPy object arrays on the host, where the string kernels run, and a
    graph fed them runs op by op (mx.compile traces arrays only).

    >>> import mithril as ml
    >>> b = ml.MlxBackend(dtype=ml.float32, device="cpu")
    >>> b.add(b.ones(2), b.ones(2)).tolist()
    [2.0, 2.0]
    """

    name = "mlx"
    supports_gradients = True

    def __init__(self, dtype=None, device: str = "cpu"):
        from ... import dtypes

        _import_mlx()
        from . import overrides as _registers_overrides  # noqa: F401

        self._device = _parse_device(device)
        self.xp = xp
        super().__init__(dtype if dtype is not None else dtypes.float32, device)
        reason = self.unsupported_dtype_reason(self.dtype.numpy)
        if reason:
            raise BackendUnavailableError(f"MlxBackend cannot use dtype {self.dtype!r}: {reason}")

    @classmethod
    def devices(cls) -> list[str]:
        """``"cpu"``, and ``"gpu"`` where MLX has one."""
        _import_mlx()
        return _present_devices()

    def scope(self):
        """This backend's device as MLX's default stream, for the duration of one call."""
        return mx.stream(self._device)

    # -- dtypes and conversion -------------------------------------------------------
    def unsupported_dtype_reason(self, dtype) -> str | None:
        dtype = np.dtype(dtype)
        if dtype == np.float64:
            return "MLX has no float64 on its default CPU path (arrays convert to float32) and none on the GPU"
        if dtype == object:
            return None  # strings: the string kernels run on the host with NumPy
        if not xp.is_supported(dtype):
            return f"MLX has no {dtype} arrays"
        return None

    def from_numpy(self, arr):
        """An ``mx.array`` holding ``arr`` at its exact dtype (float64 is refused); NumPy string
        arrays stay NumPy (the string kernels run on the host)."""
        if isinstance(arr, xp.MlxArray):
            return arr.native
        if isinstance(arr, mx.array):
            return arr
        arr = np.asarray(arr)
        if arr.dtype == object:
            return arr
        reason = self.unsupported_dtype_reason(arr.dtype)
        if reason:
            from ...errors import UnsupportedDTypeError

            raise UnsupportedDTypeError(f"MlxBackend cannot hold {arr.dtype}: {reason}")
        with mx.stream(self._device):
            return mx.array(arr)

    def to_numpy(self, arr) -> np.ndarray:
        if isinstance(arr, list):
            return np.asarray([self.to_numpy(a) for a in arr])
        return xp.to_host(arr)

    def dtype_of(self, value) -> np.dtype | None:
        if isinstance(value, mx.array):
            # float64 (CPU-only in MLX) is not a facade dtype, but a check must still see it.
            return np.dtype(np.float64) if value.dtype == mx.float64 else xp.np_dtype(value.dtype)
        return super().dtype_of(value)

    def prepare_inputs(self, values: dict) -> dict:
        # The program computes on the facade; NumPy arrays keep their dtype (no casting).
        return {k: self._to_facade(v) for k, v in values.items()}

    def constant(self, value: np.ndarray):
        # Converted once at compile instead of by every op that reads it; float64 and strings stay
        # on the host, where the kernels that accept them compute.
        if value.dtype == object or self.unsupported_dtype_reason(value.dtype):
            return value
        return xp.MlxArray(self.from_numpy(value))

    def _to_facade(self, v):
        if isinstance(v, xp.MlxArray):
            return v
        if isinstance(v, (list, tuple)):  # a sequence input
            return [self._to_facade(x) for x in v]
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype == object:
            return np.asarray(v)  # strings stay on the host
        if isinstance(v, (mx.array, np.ndarray, np.generic)):
            return xp.MlxArray(self.from_numpy(v))
        return v

    def finalize_outputs(self, outputs: dict) -> dict:
        # Users get mx.arrays: facades are unwrapped, values kernels computed on the host (NumPy)
        # become mx.arrays; strings stay NumPy object arrays.
        return {k: self._to_native(v) for k, v in outputs.items()}

    def _to_native(self, v):
        if isinstance(v, (list, tuple)):
            return [self._to_native(x) for x in v]
        if isinstance(v, xp.MlxArray):
            return v.native
        if isinstance(v, (np.ndarray, np.generic)) and xp.is_supported(np.asarray(v).dtype):
            return xp.native(np.asarray(v))
        return v

    # -- compilation hooks -----------------------------------------------------------
    def jit(self, forward):
        return _Compiled(self, forward)

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        forward = program.forward  # mx.value_and_grad traces the eager forward
        params, data = _unwrap(dict(params)), _unwrap(dict(data))
        # Cotangents meet the outputs in float32 (the loss below): a NumPy float64 one is welcome.
        cot = {k: _unwrap(self.from_numpy(v if isinstance(v, (mx.array, xp.MlxArray)) or np.asarray(v).dtype != np.float64
                                          else np.asarray(v, np.float32)))
               for k, v in output_gradients.items()}
        names = list(diff_params) + list(diff_data)

        def loss_and_outputs(primals):
            p, d = dict(params), dict(data)
            for name, value in zip(names, primals):
                (p if name in diff_params else d)[name] = value
            out = _unwrap(forward(_wrap(p), _wrap(d)))
            # The vjp with cotangents g is the gradient of sum(out * g).
            loss = mx.array(0.0)
            for k, g in cot.items():
                loss = loss + mx.sum(out[k].astype(mx.float32) * g.astype(mx.float32))
            return loss, out

        primals = [params[k] for k in diff_params] + [data[k] for k in diff_data]
        with mx.stream(self._device):
            (_, outputs), grads = mx.value_and_grad(loss_and_outputs)(primals)
        return outputs, dict(zip(names, grads))

    def checkpoint(self, fn, *args):
        """``mx.checkpoint`` of a segment of the generated forward: ``mx.value_and_grad`` keeps
        its arguments and calls it again in the backward pass instead of keeping what it computed."""
        return _checkpointed(fn, args)


_SLOT = object()  # where an array sat in a structure handed to mx.checkpoint


def _checkpointed(fn, args):
    """``mx.checkpoint(fn)(*args)`` over the arrays among ``args`` (in sequences too): it
    differentiates its arguments only, so each array goes in as one. Host values (NumPy arrays
    of shapes, strings) pass as they are, in and out."""
    arrays: list = []
    hollow = _hollow(args, arrays)
    out = {}

    def on_arrays(*natives):
        result = fn(*_fill(hollow, iter(natives)))
        out_arrays: list = []
        out["hollow"] = _hollow(result, out_arrays)
        return out_arrays

    natives = mx.checkpoint(on_arrays)(*arrays)
    return _fill(out["hollow"], iter(natives))


def _hollow(tree, arrays: list):
    """``tree`` with each array replaced by _SLOT, its native appended to ``arrays``."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_hollow(v, arrays) for v in tree)
    if isinstance(tree, (xp.MlxArray, mx.array)):
        arrays.append(_unwrap(tree))
        return _SLOT
    return tree


def _fill(tree, natives):
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, natives) for v in tree)
    return xp.MlxArray(next(natives)) if tree is _SLOT else tree


def _native_api(name):
    """The base tensor API method ``name`` over mx.arrays (NumPy semantics, through the facade)."""
    base = getattr(Backend, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        with mx.stream(self._device):
            return _unwrap(base(self, *_wrap(args), **kwargs))

    return method


for _name in ("add", "subtract", "multiply", "divide", "matmul", "relu", "sigmoid", "tanh", "sum", "mean", "max",
              "reshape", "transpose", "concat"):
    setattr(MlxBackend, _name, _native_api(_name))


MLXBackend = MlxBackend
