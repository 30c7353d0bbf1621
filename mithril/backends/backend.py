"""The backend contract: :class:`Backend`, what ``compile``, ``evaluate`` and the tools ask of
every backend over its array namespace ``xp``. The tensor API users call on a backend is
:mod:`mithril.backends.tensor_api`."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import numpy as np

from ..dtypes import BackendDType, DType, as_dtype, float32
from ..errors import BackendOptionError, ForeignArrayError, MeshError, MithrilError
from .table import BACKENDS, backend_of_array
from .tensor_api import TensorMethods


class Backend(TensorMethods):
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
    - Arrays in and out: :meth:`from_numpy`, :meth:`to_numpy`, :meth:`dtype_of`, :meth:`check_array`
      (another framework's arrays are refused; NumPy's are taken everywhere);
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
    - Shapes: ``needs_static_shapes`` backends (C, GGML) compile every shape fixed; the others
      keep symbolic dims open until the first call.
    - Gradients: ``supports_gradients``; :meth:`lower_backward` builds a gradient program at
      compile (a backend without autodiff), :meth:`vjp` computes outputs and gradients from a
      :class:`~mithril.backends.runner.Program` (forward, jitted, backward).
    - Devices: :meth:`devices` lists the devices present, in the spelling ``device=`` takes; a
      device that is not present warns once (:func:`warn_user`, ``DeviceFallbackWarning``) and
      the backend runs on the CPU; :meth:`to_device` moves an array.
    - Custom ops: :meth:`register_op` registers a kernel in the framework's own arrays under this
      backend's ``name`` (an override, :mod:`mithril.backends.registry`).
    - Options: keyword arguments of ``__init__``; an unknown one is refused by
      :meth:`_refuse_unknown_options` listing :meth:`options`; one the machine cannot honour
      warns once (``BackendOptionWarning``). ``jit_by_default`` is what ``compile(jit=None)``
      does, and :attr:`jit_option_names` the ``jit_options`` :meth:`jit` takes.
    - The tensor API (``zeros``, ``add``, ``random_normal``, ``get_memory_info``...) in the
      framework's own arrays; :attr:`dtype` is the default dtype and, called, an array's dtype.

    >>> from mithril.backends.table import BACKENDS
    >>> all(issubclass(entry.load(), Backend) for entry in BACKENDS.values())
    True
    """

    name = "base"
    xp: Any = np
    supports_gradients = False
    needs_static_shapes = False  # C and GGML: every input shape fixed at compile
    # What ml.compile(jit=None) does on this backend: True where jitting the whole program pays.
    jit_by_default = True
    # What ml.compile(parallel=None) splits by on this backend's device mesh (None: data parallel).
    default_parallel: str | None = None

    # The jit_options this backend's jit() takes (name -> what it does); compile passes the user's.
    jit_option_names: dict[str, str] = {}

    def __init__(self, dtype: DType = float32, device: str = "cpu"):
        self.dtype = dtype
        self.device = device
        self.set_seed(0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype!r}, device={self.device!r})"

    @property
    def dtype(self) -> BackendDType:
        """The default dtype (``backend.dtype == ml.float32``), and, called with an array, that
        array's ``ml`` dtype (``backend.dtype(x)``): a :class:`~mithril.dtypes.BackendDType`.
        Assigning takes anything :func:`~mithril.dtypes.as_dtype` does."""
        return self._dtype

    @dtype.setter
    def dtype(self, value) -> None:
        self._dtype = BackendDType(as_dtype(value), self.dtype_of)

    # -- options -------------------------------------------------------------------------
    @classmethod
    def options(cls) -> list[str]:
        """The keyword options the constructor takes."""
        params = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]

    def _refuse_unknown_options(self, unknown: dict) -> None:
        """An option the constructor does not have is an error listing those it has."""
        if unknown:
            raise BackendOptionError(
                f"{type(self).__name__} has no option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, sorted(unknown)))}; valid options: {', '.join(self.options())}")

    def check_jit_options(self, options) -> dict:
        """The user's ``jit_options`` as a dict, each name one this backend's jit takes."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.jit_option_names))
        if unknown:
            valid = ", ".join(f"{k} ({v})" for k, v in self.jit_option_names.items()) or "none"
            raise BackendOptionError(
                f"{type(self).__name__}'s jit has no option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; valid jit_options: {valid}")
        return options

    # -- dtypes and conversion -------------------------------------------------------
    def backend_dtype(self, dtype: DType | None):
        return (as_dtype(dtype) if dtype is not None else self.dtype).numpy

    def from_numpy(self, arr: np.ndarray):
        return self.xp.asarray(arr)

    def hold(self, arr: np.ndarray):
        """A compiled model's own parameter (read-only ``arr``, which the model keeps) as this
        backend runs it for ``evaluate(None, ...)``. Backends that can compute on ``arr``'s memory
        share it rather than keep a second copy; by default :meth:`from_numpy`."""
        return self.from_numpy(arr)

    def share(self, arr: np.ndarray) -> np.ndarray:
        """A compiled model's own parameter ``arr`` as a NumPy array over this backend's memory, for
        the model to keep instead of ``arr`` (which it then drops), so that :meth:`hold` shares it
        and the weights are held once where the backend cannot compute on NumPy's memory (MLX).
        By default ``arr`` itself."""
        return arr

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

    def check_array(self, value, what: str) -> None:
        """Refuse an array of another framework (:class:`~mithril.errors.ForeignArrayError`
        naming what this backend takes and how to convert); NumPy arrays, Python values and this
        backend's own arrays pass. ``what`` names the value (``"input 'x'"``)."""
        got = backend_of_array(value)
        if got.name in ("numpy", self.name):
            return
        own = BACKENDS[self.name].array_type if self.name in BACKENDS else "its own arrays"
        takes = "numpy.ndarray" if own == "numpy.ndarray" else f"{own} or numpy.ndarray"
        convert = "x.detach().cpu().numpy()" if got.name == "torch" else "np.asarray(x)"
        raise ForeignArrayError(f"{what}: {type(self).__name__} takes {takes}, got {got.array_type}; convert it "
                                f"first ({convert}, then backend.array(...) to place it on the backend)")

    # The mithril.distributed.DeviceMesh this backend runs on, where it runs on several devices.
    mesh = None

    def check_sharding(self, plan) -> None:
        """Called by compile with the :class:`~mithril.distributed.ShardingPlan`: a backend that
        runs only some strategies refuses the others here (a MeshError), not at the first
        evaluate."""

    def local_shape(self, name: str, shape: tuple, plan) -> tuple:
        """The shape parameter ``name`` (of whole shape ``shape``) has as this process holds it under
        ``plan`` (a :class:`~mithril.distributed.ShardingPlan`): evaluate takes that shape too. The
        whole one here; a backend whose processes hold only their part of a split parameter (MLX
        arrays are local) says the part's."""
        return shape

    def synchronize(self, value) -> None:
        """Wait until the arrays in ``value`` (any nesting of dicts, lists, tuples) are computed:
        frameworks that dispatch asynchronously (JAX), lazily (MLX) or to a GPU (Torch on CUDA)
        return before the work is done. Nothing to wait for here."""

    def is_traced(self, args) -> bool:
        """Whether any of ``args`` is a value being traced into a program (a JAX tracer inside
        ``lax.while_loop``), not a computed array."""
        return False

    def set_num_threads(self, n: int) -> bool:
        """Limit the framework's intra-op threads to ``n`` where it can change them after start
        (True); False where the count is fixed (a constructor's ``num_threads``, or a pool sized
        once when the framework starts)."""
        return False

    @classmethod
    def op_ranges(cls, op_type: str, domain: str = "") -> list:
        """What runs ``op_type`` here, per opset range (:class:`~mithril.backends.op_support.OpSupport`,
        read by ``mithril ops`` and ``mithril inspect``): the kernel registry's choice by default."""
        from .op_support import registry_ranges

        return registry_ranges(cls.name, op_type, domain)

    @classmethod
    def op_support(cls, op_type: str, domain: str = "", opset: int = 1):
        """What runs ``op_type`` at ``opset`` here (an OpSupport), or None when nothing does."""
        return next((r for r in cls.op_ranges(op_type, domain) if r.covers(opset)), None)

    @classmethod
    def op_keys(cls) -> set[tuple[str, str]]:
        """Every ``(domain, op_type)`` something runs here at some opset."""
        from .registry import REGISTRY

        return REGISTRY.ops(cls.name)

    def place(self, values: dict, plan) -> dict:
        """Parameters or data placed on the mesh by a :class:`~mithril.distributed.ShardingPlan`
        (a backend with device meshes overrides it)."""
        raise MeshError(f"{type(self).__name__} runs on one device: it places nothing on a mesh")

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

        plan = self.forward_plan(plan)
        segments = checkpoint_segments(plan) if gradient_checkpointing and self.checkpoint is not None else None
        return emit_python(plan, namespace=self.program_namespace(), file_path=file_path, constant=self.constant,
                           checkpointing=segments)

    def plan_passes(self) -> list:
        """The plan passes (:mod:`mithril.backends.passes`) the forward program runs through: none
        here; NumPy and Torch write activations into their input, Torch fuses Gelu chains and
        convolutions."""
        return []

    def forward_plan(self, plan):
        """The plan :meth:`lower` prints for the forward program: ``plan`` after
        :meth:`plan_passes` (``plan`` itself when they change nothing; they rewrite a copy).
        :mod:`mithril.profile` times the same program."""
        from .passes import run_passes

        return run_passes(plan, self.plan_passes())

    def wait_for_build(self, program) -> None:
        """Returns once ``program`` (from :meth:`lower`) is ready to run: ``ml.compile`` calls it
        last, so that its time includes what lower left running in the background (C: the C
        compiler, beside the gradient program's build). Here nothing is left."""

    def vjp_parts(self, program, parts, diff_params, diff_data) -> list:
        """:meth:`vjp` of each ``(params, data, cotangents)`` of ``parts`` (a pipeline's
        micro-batches) -> ``[(outputs, gradients)...]``. Here one after the other; a backend that
        dispatches asynchronously issues every forward pass first (GPipe)."""
        return [self.vjp(program, p, d, diff_params, diff_data, c) for p, d, c in parts]

    def lower_stages(self, plan, stages, *, file_path: str | None = None):
        """The plan as :meth:`lower` prints it, with ``stages`` (a pipeline's
        :class:`~mithril.backends.checkpoint.Checkpointing`) each called through
        ``pipeline_stage(index, fn, *live_in)``: a backend with device meshes defines it."""
        from .emit_python import emit_python

        if not hasattr(self, "pipeline_stage"):
            raise MeshError(f"{type(self).__name__} has no pipeline stages")
        return emit_python(plan, namespace=self.program_namespace(), file_path=file_path, constant=self.constant,
                           checkpointing=stages)

    # The ``ctx`` of the kernels that declare one: what this backend's options decide for them
    # (JaxBackend: which convolutions go to XNNPACK); None where the options decide nothing.
    kernel_context = None

    def program_namespace(self) -> dict:
        """What generated Python code reads besides its kernels: the array namespace, the backend,
        and the kernels' ``ctx``."""
        return {"xp": self.xp, "_backend": self, "ctx": self.kernel_context}

    def jit(self, forward, options: dict | None = None):
        """Compile the whole generated ``forward(params, data)`` as one program (identity here).
        ``options`` are the user's ``jit_options`` (``compile(..., jit_options=...)``), checked
        against :attr:`jit_option_names`."""
        self.check_jit_options(options)
        return forward

    def profile_jitted(self, jitted, print_program, params, data, *, runs: int, warmup: int):
        """Per-node time of ``jitted`` (what :meth:`jit` returned) as the framework's own profiler
        sees the compiled program, for :mod:`mithril.profile`: ``print_program(call)`` prints the
        same forward with each kernel call made as ``call(i, kernel, *args)``. None where the
        backend has no such profiler (the nodes are then timed run one by one)."""
        return None

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

    # -- custom ops ------------------------------------------------------------------
    @classmethod
    def register_op(cls, name: str, fn=None, *, domain: str | None = None, since: int = 1, output_shapes=None,
                    vjp=None, replace: bool = False, **meta):
        """Register ``fn``, written in this backend's framework (``jnp`` on JAX, ``torch`` on
        Torch, ``mx`` on MLX, NumPy here), as the kernel of op ``name`` in ``domain``
        (``mithril.custom`` unless given) for every backend of this kind; a decorator when ``fn``
        is left out. ``fn`` takes the node's inputs positionally and its attributes as keyword
        arguments; the other options are :func:`~mithril.backends.custom_ops.register_op`'s. A
        model uses the op through ``ml.CustomOp(name)``; a loaded file through nodes of that domain.

        >>> import numpy as np, mithril as ml
        >>> with ml.scoped_ops():
        ...     @ml.NumpyBackend.register_op("cube")
        ...     def cube(x):
        ...         return x ** 3
        ...     model = ml.Model()
        ...     model |= ml.CustomOp("cube")(input="input", output="output")
        ...     pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2]})
        ...     pm.evaluate({}, {"input": np.array([2.0, 3.0], np.float32)})["output"]
        array([ 8., 27.], dtype=float32)
        """
        from .custom_ops import register_op
        from .registry import CUSTOM_DOMAIN

        return register_op(name, fn, backend=cls.name, domain=CUSTOM_DOMAIN if domain is None else domain,
                           since=since, output_shapes=output_shapes, vjp=vjp, replace=replace, **meta)

    @classmethod
    def framework_kernel(cls, fn):
        """``fn``, written over this framework's arrays, as a kernel of this backend's programs: ``fn``
        itself where the programs compute on the framework's own arrays; a backend computing on a
        facade (MLX's ``xp``) hands ``fn`` native arrays and wraps what it returns."""
        return fn

    @classmethod
    def unregister_op(cls, name: str, *, domain: str | None = None, since: int | None = None) -> None:
        """Remove what :meth:`register_op` registered for op ``name`` on this kind of backend."""
        from .custom_ops import unregister_op
        from .registry import CUSTOM_DOMAIN

        unregister_op(name, backend=cls.name, domain=CUSTOM_DOMAIN if domain is None else domain, since=since)


def check_backend(value, what: str, error: type[MithrilError] = MithrilError) -> None:
    """Refuse what is not a backend instance (a backend class, a name such as ``"torch"``) with
    ``error`` saying what ``what`` (a function's name) takes."""
    if isinstance(value, Backend):
        return
    if isinstance(value, type) and issubclass(value, Backend):
        raise error(f"{what} takes a backend instance: {value.__name__}(), not the class")
    raise error(f"{what} takes a backend instance such as ml.NumpyBackend(), not {value!r}")
