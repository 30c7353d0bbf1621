"""The backend contract (:class:`Backend`) and its tensor API, shared by every backend over its
array namespace ``xp``."""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

import numpy as np

from ..dtypes import DType, as_dtype, float32


# The tensor API a Lambda block traces (mithril/frontend/lambda_block.py). Called with a traced
# value among its arguments (a type with __mithril_function__, as torch's __torch_function__),
# a method of these names forwards the call to that value, which emits ONNX nodes, instead of
# computing; TensorAPI wraps them in every backend class, defined in its body or set later.
TRACEABLE_API = frozenset({
    "add", "subtract", "multiply", "divide", "power", "matmul", "maximum", "minimum", "negative", "abs",
    "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "sin", "cos", "isnan",
    "sum", "mean", "max", "min", "reshape", "transpose", "concat", "where",
})


def _traceable(name: str, method):
    @functools.wraps(method)
    def traceable(self, *args, **kwargs):
        for arg in (*args, *kwargs.values()):
            for v in arg if isinstance(arg, (list, tuple)) else (arg,):
                if hasattr(type(v), "__mithril_function__"):
                    return v.__mithril_function__(self, name, args, kwargs)
        return method(self, *args, **kwargs)

    return traceable


class TensorAPI(type):
    """The metaclass of backends: wraps their :data:`TRACEABLE_API` methods for tracing."""

    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace, **kwargs)
        for key in TRACEABLE_API & namespace.keys():
            if inspect.isfunction(namespace[key]):
                type.__setattr__(cls, key, _traceable(key, namespace[key]))

    def __setattr__(cls, key, value):
        if key in TRACEABLE_API and inspect.isfunction(value):
            value = _traceable(key, value)
        super().__setattr__(key, value)


class Backend(metaclass=TensorAPI):
    """Base of every backend, and the contract ``compile``, ``evaluate`` and the tools rely on.

    A backend is one folder, ``mithril/backends/<name>/``, holding ``backend.py`` (the subclass),
    ``overrides.py`` (its ``@override("<name>", ...)`` kernels, imported when the class is
    created), ``arrays.py`` (``sqrt``, ``zeros_like``, ``to_numpy``, ``update_scope``, ``jit`` over
    its framework's arrays, for the optimizers and params I/O) and whatever else it needs (an
    ``xp.py`` facade, jit helpers); plus one row in :data:`mithril.backends.table.BACKENDS`. Its
    framework is imported only inside the folder, and not by the folder's ``__init__.py``.

    What a subclass provides (the defaults here fit NumPy-like frameworks):

    - ``name`` (its table row and override key) and ``xp``, the array namespace the shared
      kernels compute with (the framework's NumPy-compatible module, or a facade over it).
    - Arrays in and out: :meth:`from_numpy`, :meth:`to_numpy`, :meth:`dtype_of`;
      :meth:`prepare_inputs` turns the user's params and data into what the generated program
      takes, :meth:`finalize_outputs` its outputs into what users get; :meth:`constant` gives an
      initializer in the array type the program computes on.
    - :meth:`scope`: the context every call into the backend runs in (precision flags, device,
      thread caps, no autograd recording).
    - :meth:`unsupported_dtype_reason`: why a dtype cannot be held (compile refuses the graph).
    - Lowering: :meth:`lower` turns the backend-neutral plan (:mod:`mithril.backends.plan`) into
      a program. The default prints it as Python over ``xp``; an emit-based backend (C, GGML)
      renders it in its own language.
    - Jit: :meth:`jit` makes one program of the whole generated forward. A jitted program
      raises when it cannot be traced; ``evaluate`` then runs the eager forward once, and if that
      works stays eager with one ``JitFallbackWarning`` (:mod:`mithril.backends.runner`).
    - Gradients: ``supports_gradients``; :meth:`lower_backward` builds a gradient program at
      compile (a backend without autodiff), :meth:`vjp` computes outputs and gradients from a
      :class:`~mithril.backends.runner.Program` (forward, jitted, backward).
    - Devices: :meth:`devices` lists the devices present, in the spelling ``device=`` takes.

    >>> from mithril.backends.table import BACKENDS
    >>> all(issubclass(entry.load(), Backend) for entry in BACKENDS.values())
    True
    """

    name = "base"
    xp: Any = np
    supports_gradients = False

    def __init__(self, dtype: DType = float32, device: str = "cpu"):
        self.dtype = as_dtype(dtype)
        self.device = device
        self.set_seed(0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype!r}, device={self.device!r})"

    # -- dtypes and conversion -------------------------------------------------------
    def backend_dtype(self, dtype: DType | None):
        return (as_dtype(dtype) if dtype is not None else self.dtype).numpy

    def array(self, data, dtype: DType | None = None):
        if dtype is None and isinstance(data, np.ndarray):
            return self.from_numpy(data)
        if dtype is None:
            arr = np.asarray(data)
            dtype = self.dtype if np.issubdtype(arr.dtype, np.floating) else as_dtype(arr.dtype)
        return self.from_numpy(np.asarray(data, dtype=self.backend_dtype(dtype)))

    def from_numpy(self, arr: np.ndarray):
        return self.xp.asarray(arr)

    def to_numpy(self, arr) -> np.ndarray:
        return np.asarray(arr)

    def dtype_of(self, value) -> np.dtype | None:
        """The NumPy dtype of a backend (or NumPy) array, None when it has none (sequences)."""
        dt = getattr(value, "dtype", None)
        if dt is None:
            return None
        try:
            return np.dtype(dt)
        except TypeError:
            return None

    def prepare_inputs(self, values: dict) -> dict:
        """Params or data as the generated program takes them (a facade backend wraps natives here)."""
        return values

    def finalize_outputs(self, outputs: dict) -> dict:
        """Program outputs as users get them (native arrays of the framework)."""
        return outputs

    def constant(self, value: np.ndarray):
        """An initializer constant that kernels read as a tensor (not as a static input), in the
        array type the program computes on; called once per constant at compile. The default keeps
        the NumPy array (NumPy itself; JAX, whose jit embeds constants in the program)."""
        return value

    @classmethod
    def devices(cls) -> list[str]:
        """The devices present, as ``device=`` names them (``"cpu"``, ``"cuda:0"``...); imports
        the framework, and raises BackendUnavailableError when it is not installed."""
        return ["cpu"]

    # -- compilation hooks: a backend overrides what its framework offers -------------
    def scope(self):
        """The context each evaluation runs in (JAX: x64 and the device; NumPy: a BLAS thread cap)."""
        return contextlib.nullcontext()

    def unsupported_dtype_reason(self, dtype) -> str | None:
        """Why this backend cannot hold ``dtype`` (a NumPy dtype), or None when it can."""
        return None

    def lower(self, plan, *, file_path: str | None = None, gradient_checkpointing: bool = False):
        """The plan (:class:`~mithril.backends.plan.Plan`) as a program: the generated Python
        ``forward(params, data)`` over :attr:`xp` here (:mod:`mithril.backends.emit_python`). An
        emit-based backend (C, GGML) renders the plan in its own language instead and returns a
        :class:`~mithril.backends.emit_python.LoweredProgram`-like object with ``forward``,
        ``source`` and ``filename``. With ``gradient_checkpointing`` and a :attr:`checkpoint`
        hook, the plan's segments (:mod:`mithril.backends.checkpoint`) run through it."""
        from .checkpoint import checkpoint_segments
        from .emit_python import emit_python

        segments = checkpoint_segments(plan) if gradient_checkpointing and self.checkpoint is not None else None
        return emit_python(plan, namespace=self.program_namespace(), file_path=file_path, constant=self.constant,
                           checkpointing=segments)

    def program_namespace(self) -> dict:
        """What generated Python code reads besides its kernels: the array namespace and the backend."""
        return {"xp": self.xp, "_backend": self}

    def jit(self, forward):
        """Compile the whole generated ``forward(params, data)`` as one program (identity here)."""
        return forward

    def lower_backward(self, plan, *, diff_names: list[str], file_path: str | None = None,
                       gradient_checkpointing: bool = False):
        """Called by ``compile`` (unless ``inference=True``) with the lowering plan
        (:class:`~mithril.backends.plan.Plan`), the names to differentiate and where to write the
        source (or None): a backend without autodiff builds its gradient program here, so a
        missing rule fails at compile time; with ``gradient_checkpointing``, one that re-runs
        forward segments in the backward pass. What it returns reaches :meth:`vjp` as
        ``program.backward``; None (the default) leaves autodiff to differentiate
        ``program.forward``. A backend without ``supports_gradients`` refuses here, so compile
        reports it."""
        if not self.supports_gradients:
            from ..errors import MithrilError

            raise MithrilError(f"{type(self).__name__} does not compute gradients")
        return None

    # Gradient checkpointing for a backend whose autodiff differentiates the generated forward:
    # ``checkpoint(fn, *args)`` returns ``fn(*args)`` (a tuple) and has the backward pass recompute
    # what ``fn`` computed from the arguments instead of keeping it (jax.checkpoint,
    # torch.utils.checkpoint, mx.checkpoint). None: no such hook (the forward is printed without
    # segments; a backend with its own gradient program recomputes in lower_backward).
    checkpoint = None

    def vjp(self, program, params: dict, data: dict, diff_params: list[str], diff_data: list[str],
            output_gradients: dict) -> tuple[dict, dict]:
        """Outputs of ``program`` (a :class:`~mithril.backends.runner.Program`) and the gradients
        of ``diff_params`` and ``diff_data`` given the cotangents ``output_gradients`` (outputs not
        named get zero cotangents). A backend differentiates ``program.forward`` (or its
        ``jitted`` form, when not None: a trace failure may raise, and the caller then asks again
        with ``jitted=None``), or runs ``program.backward``, its own gradient program."""
        from ..errors import MithrilError

        raise MithrilError(f"{type(self).__name__} does not compute gradients")

    # -- creation --------------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def zeros(self, *shape, dtype: DType | None = None):
        return self.from_numpy(np.zeros(_shape(shape), dtype=self.backend_dtype(dtype)))

    def ones(self, *shape, dtype: DType | None = None):
        return self.from_numpy(np.ones(_shape(shape), dtype=self.backend_dtype(dtype)))

    def randn(self, *shape, dtype: DType | None = None):
        return self.from_numpy(self.rng.standard_normal(_shape(shape)).astype(self.backend_dtype(dtype)))

    def rand(self, *shape, dtype: DType | None = None):
        return self.from_numpy(self.rng.random(_shape(shape)).astype(self.backend_dtype(dtype)))

    def arange(self, *args, dtype: DType | None = None):
        if dtype is None:
            dtype = self.dtype if any(isinstance(a, float) for a in args) else as_dtype(np.int64)
        return self.from_numpy(np.arange(*args).astype(self.backend_dtype(dtype)))

    def zeros_like(self, x, dtype: DType | None = None):
        n = self.to_numpy(x)
        return self.from_numpy(np.zeros(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype)))

    def ones_like(self, x, dtype: DType | None = None):
        n = self.to_numpy(x)
        return self.from_numpy(np.ones(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype)))

    # -- arithmetic ------------------------------------------------------------------
    def add(self, a, b):
        return a + b

    def subtract(self, a, b):
        return a - b

    def multiply(self, a, b):
        return a * b

    def divide(self, a, b):
        return a / b

    def matmul(self, a, b):
        return self.xp.matmul(a, b)

    def relu(self, x):
        return self.xp.maximum(x, 0)

    def sigmoid(self, x):
        return 1 / (1 + self.xp.exp(-x))

    def tanh(self, x):
        return self.xp.tanh(x)

    def sum(self, x, axis=None, keepdim: bool = False):
        return self.xp.sum(x, axis=axis, keepdims=keepdim)

    def mean(self, x, axis=None, keepdim: bool = False):
        return self.xp.mean(x, axis=axis, keepdims=keepdim)

    def max(self, x, axis=None, keepdim: bool = False):
        return self.xp.max(x, axis=axis, keepdims=keepdim)

    def reshape(self, x, shape):
        return self.xp.reshape(x, tuple(shape))

    def transpose(self, x, axes=None):
        return self.xp.transpose(x, axes)

    def concat(self, arrays, axis: int = 0):
        return self.xp.concatenate(list(arrays), axis=axis)


def _shape(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)
