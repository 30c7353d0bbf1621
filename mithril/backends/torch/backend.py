"""The PyTorch backend: the generated program over a NumPy-compatible facade of torch tensors."""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from ...errors import BackendUnavailableError
from ..backend import Backend

# Imported by the first TorchBackend(), so `import mithril` never imports torch.
torch = txp = None


def _import_torch() -> None:
    global torch, txp
    if torch is None:
        try:
            import torch as _torch
        except ImportError as exc:
            raise BackendUnavailableError("TorchBackend needs torch: pip install mithril[torch]") from exc
        from . import xp as _txp

        torch, txp = _torch, _txp


def _present_devices() -> list[str]:
    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def _parse_device(device: str):
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` -> torch.device, or BackendUnavailableError."""
    present = _present_devices()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise BackendUnavailableError(
            f"TorchBackend: unknown device {device!r}; present devices: {', '.join(present)}") from exc
    if dev.type == "cuda" and dev.index is None and len(present) > 1 and present[1].startswith("cuda"):
        dev = torch.device("cuda:0")
    name = dev.type if dev.index is None else f"{dev.type}:{dev.index}"
    if name not in present:
        raise BackendUnavailableError(
            f"TorchBackend: device {device!r} is not present; present devices: {', '.join(present)}")
    return dev


class TorchBackend(Backend):
    """Runs lowered ONNX graphs with PyTorch, eagerly by default.

    Users see ``torch.Tensor`` everywhere: ``evaluate`` takes tensors (or NumPy arrays, kept at
    their dtype) and returns tensors, gradients are tensors, and the tensor API (``array``,
    ``zeros``, ``add``...) takes and returns tensors. Inside, the shared kernels run through
    :mod:`mithril.backends.torch.xp`, a NumPy-compatible facade (``TorchArray``, whose
    ``.native`` is the tensor): ``prepare_inputs`` wraps, ``finalize_outputs`` unwraps. Hot ops
    (Conv, Gemm, MatMul, pools, normalizations, Softmax...) call ``torch.nn.functional``
    directly (``mithril/backends/torch/overrides.py``). Every evaluation runs under ``torch.no_grad()``;
    gradients (``evaluate(..., output_gradients=...)``) use ``torch.autograd.grad``.

    ``compile=True`` wraps the generated forward in ``torch.compile`` (inductor). Measured on
    this 2-core CPU, interleaved with PyTorch eager, it is not faster: ResNet-18 (batch 1,
    224x224) 0.93x of eager's time both with and without it, the small BERT (sequence 128)
    1.57x with it and 0.99x without; and its first call takes 9-70 s. So eager is the default.

    uint16/uint32/uint64 are reported unsupported (torch has no arithmetic kernels for them);
    strings stay NumPy object arrays and the string kernels run on the host.

    >>> import mithril as ml
    >>> b = ml.TorchBackend(dtype=ml.float32, device="cpu")
    >>> b.add(b.ones(2), b.ones(2))
    tensor([2., 2.])
    """

    name = "torch"
    supports_gradients = True

    def __init__(self, dtype=None, device: str = "cpu", compile: bool = False):
        from ... import dtypes

        _import_torch()
        from . import overrides as _registers_overrides  # noqa: F401

        self._device = _parse_device(device)
        self.xp = txp
        self.compile = compile
        super().__init__(dtype if dtype is not None else dtypes.float32, str(self._device))

    @classmethod
    def devices(cls) -> list[str]:
        """``"cpu"``, then ``"cuda:<i>"`` per CUDA device and ``"mps"`` where present."""
        _import_torch()
        return _present_devices()

    def scope(self):
        """No autograd recording (vjp turns it back on) and this backend's device."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        stack.enter_context(txp.on_device(self._device))
        return stack

    # -- dtypes and conversion -------------------------------------------------------
    def unsupported_dtype_reason(self, dtype) -> str | None:
        dtype = np.dtype(dtype)
        if dtype == object:
            return None  # strings: the string kernels run on the host with NumPy
        if dtype in txp.STORAGE_ONLY:
            return f"torch stores {dtype} but has no arithmetic kernels for it (add, max, ... are not implemented)"
        if dtype not in txp.TO_TORCH:
            return f"torch has no {dtype} dtype"
        return None

    def from_numpy(self, arr):
        """A ``torch.Tensor`` on this backend's device holding a copy of ``arr`` (its exact dtype);
        NumPy string arrays stay NumPy (the string kernels run on the host)."""
        if isinstance(arr, txp.TorchArray):
            arr = arr.native
        if isinstance(arr, torch.Tensor):
            return arr.to(self._device)
        arr = np.asarray(arr)
        if arr.dtype == object:
            return arr
        return txp.tensor_from_numpy(np.array(arr), self._device)

    def to_numpy(self, arr) -> np.ndarray:
        if isinstance(arr, txp.TorchArray):
            return txp.tensor_to_numpy(arr.native)
        if isinstance(arr, torch.Tensor):
            return txp.tensor_to_numpy(arr)
        return np.asarray(arr)

    def to_torch(self, arr):
        """The ``torch.Tensor`` behind a backend array."""
        return arr.native if isinstance(arr, txp.TorchArray) else torch.as_tensor(arr)

    def dtype_of(self, value) -> np.dtype | None:
        if isinstance(value, torch.Tensor):
            return txp.TO_NUMPY.get(value.dtype)
        return super().dtype_of(value)

    def prepare_inputs(self, values: dict) -> dict:
        # The program computes on the facade; NumPy arrays keep their dtype (no casting) and are
        # copied, so an output that aliases an input (Identity, Reshape) never aliases the caller's array.
        return {k: self._to_facade(v) for k, v in values.items()}

    def constant(self, value: np.ndarray):
        # Converted (and moved to the device) once at compile instead of by every op that reads it.
        return value if value.dtype == object else txp.TorchArray(self.from_numpy(value))

    def _to_facade(self, v):
        if isinstance(v, txp.TorchArray):
            return v
        if isinstance(v, torch.Tensor):
            return txp.TorchArray(v.to(self._device))
        if isinstance(v, (list, tuple)):  # a sequence input
            return [self._to_facade(x) for x in v]
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype != object:
            return txp.TorchArray(self.from_numpy(v))
        return v

    def finalize_outputs(self, outputs: dict) -> dict:
        # Users get torch.Tensors: facades are unwrapped, values kernels computed on the host
        # (NumPy) become tensors; strings stay NumPy object arrays.
        return {k: self._to_native(v) for k, v in outputs.items()}

    def _to_native(self, v):
        if isinstance(v, (list, tuple)):
            return [self._to_native(x) for x in v]
        if isinstance(v, txp.TorchArray):
            return v.native
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype != object:
            return self.from_numpy(v)
        return v

    # -- compilation hooks -----------------------------------------------------------
    def jit(self, forward):
        """``forward`` itself (eager) unless ``compile=True``: then ``torch.compile`` of it."""
        if not self.compile:
            return forward
        return _Compiled(forward)

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        forward = program.jitted or program.forward  # torch.compile's program differentiates too
        params, data = dict(params), dict(data)
        leaves = {}
        with torch.enable_grad():
            for src, names in ((params, diff_params), (data, diff_data)):
                for k in names:
                    leaf = _native(src[k], self._device).detach().requires_grad_(True)
                    leaves[k] = leaf
                    src[k] = txp.TorchArray(leaf)
            outputs = forward(params, data)
            roots, cots = [], []
            for name, g in output_gradients.items():
                out = outputs.get(name)
                t = out.native if isinstance(out, txp.TorchArray) else None
                if t is None or not t.requires_grad or g is None:
                    continue
                roots.append(t)
                cots.append(_native(g, self._device).to(t.dtype).expand(t.shape))
            if roots:
                grads = torch.autograd.grad(roots, list(leaves.values()), cots, allow_unused=True)
            else:
                grads = [None] * len(leaves)
        out = {k: v.native.detach() if isinstance(v, txp.TorchArray) else v for k, v in outputs.items()}
        return out, {k: g if g is not None else torch.zeros_like(leaf).detach()
                     for (k, leaf), g in zip(leaves.items(), grads)}

    def checkpoint(self, fn, *args):
        """``torch.utils.checkpoint`` (non-reentrant) of a segment of the generated forward
        while autograd records (vjp): its saved tensors are dropped and recomputed in the backward
        pass. Under ``no_grad`` (forward-only calls) a plain call."""
        if not torch.is_grad_enabled():
            return fn(*args)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, *args, use_reentrant=False)

    # -- tensor API: natives in and out; NumPy semantics through the facade -------------
    def relu(self, x):
        return torch.relu(_native(x, self._device))

    def sigmoid(self, x):
        return torch.sigmoid(_native(x, self._device))


def _native_api(name):
    """The base tensor API method ``name`` over torch.Tensors (NumPy semantics, through the facade)."""
    base = getattr(Backend, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        return _unwrap(base(self, *_wrap(args), **kwargs))

    return method


def _wrap(v):
    if isinstance(v, torch.Tensor):
        return txp.TorchArray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x) for x in v)
    return v


def _unwrap(v):
    return v.native if isinstance(v, txp.TorchArray) else v


for _name in ("add", "subtract", "multiply", "divide", "matmul", "tanh", "sum", "mean", "max", "reshape",
              "transpose", "concat"):
    setattr(TorchBackend, _name, _native_api(_name))


def _native(v, device):
    if isinstance(v, txp.TorchArray):
        return v.native
    if isinstance(v, torch.Tensor):
        return v
    return txp.tensor_from_numpy(np.asarray(v), device)


class _Compiled:
    """``torch.compile`` over a native-tensor version of the generated forward."""

    def __init__(self, forward):
        self.forward = forward

        def native_forward(params, data):
            wrap = {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
            wrap_d = {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in data.items()}
            out = forward(wrap, wrap_d)
            return {k: v.native if isinstance(v, txp.TorchArray) else v for k, v in out.items()}

        self._compiled = torch.compile(native_forward, dynamic=False)

    def __call__(self, params, data):
        unwrap = lambda d: {k: v.native if isinstance(v, txp.TorchArray) else v for k, v in d.items()}  # noqa: E731
        out = self._compiled(unwrap(params), unwrap(data))
        return {k: txp.TorchArray(v) if isinstance(v, torch.Tensor) else v for k, v in out.items()}


__all__ = ["TorchBackend"]
