"""The JAX backend: the generated program over ``jax.numpy``, jitted as one XLA program."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import functools
import inspect
import os
import sys
import types
import weakref

import numpy as np

from ... import dtypes
from ...errors import BackendOptionError, BackendUnavailableError, DeviceFallbackWarning
from ..backend import Backend
from ..host_memory import ALIGNMENT, aligned_copy, process_memory_info
from ..options import device_kind, warn_user
from ..cpu import cpu_flags, usable_cpus
from ..mesh import check_batch, parse_mesh
from . import mesh as _mesh

# Imported by the first JaxBackend(), so `import mithril` never imports jax.
jax = jnp = Hoisted = None
_overrides = None  # .overrides.jax, imported with jax


def _import_jax() -> None:
    global jax, jnp, Hoisted
    if jax is None:
        try:
            import jax as _jax
            import jax.numpy as _jnp
        except ImportError as exc:
            raise BackendUnavailableError("JaxBackend needs jax: pip install mithril[jax]") from exc
        jax, jnp = _jax, _jnp
        from .hoist import Hoisted

        monitoring = getattr(jax, "monitoring", None)
        if _MALLOC_TRIM is not None and hasattr(monitoring, "register_event_duration_secs_listener"):
            monitoring.register_event_duration_secs_listener(_release_compile_heap)


def _present_devices() -> list[str]:
    """``"<platform>:<index>"`` for every device of every platform jax has (cpu, gpu, tpu)."""
    present = []
    for platform in ("cpu", "gpu", "tpu"):
        try:
            present += [f"{platform}:{i}" for i in range(len(jax.devices(platform)))]
        except RuntimeError:  # no backend for this platform
            pass
    return present


# Platforms jax names (cuda and rocm are its names for NVIDIA's and AMD's GPUs).
_JAX_DEVICE_KINDS = ("cpu", "gpu", "tpu", "cuda", "rocm")


def _find_device(backend, device: str):
    """``"cpu"``, ``"gpu"``, ``"tpu"``, ``"gpu:1"`` -> the jax Device, or None when that device is
    not present; a name that is no jax platform is an error."""
    platform, index = device_kind(backend, device, _JAX_DEVICE_KINDS)
    try:
        return jax.devices(platform)[index or 0]
    except (RuntimeError, IndexError):  # no such platform here, or fewer devices
        return None


def _parse_device(backend, device: str):
    """The jax Device for ``device``; an absent one warns once and gives the CPU."""
    found = _find_device(backend, device)
    if found is None:
        warn_user(f"JaxBackend: device {device!r} is not present (present devices: "
                  f"{', '.join(_present_devices())}); running on cpu", DeviceFallbackWarning)
        found = jax.devices("cpu")[0]
    return found


# precision= values: jax.default_matmul_precision's names. "bfloat16" is one bf16 pass (fastest),
# "tensorfloat32" three, "float32"/"highest" full float32; "default"/"high" are aliases of the first two.
_PRECISIONS = ("bfloat16", "tensorfloat32", "float32", "default", "high", "highest")


def _precision_name(precision) -> str | None:
    """``precision=``: None, one of :data:`_PRECISIONS`, or a ``jax.lax.Precision``."""
    if precision is None:
        return None
    if isinstance(precision, jax.lax.Precision):
        return precision.name.lower()
    if isinstance(precision, str) and precision.lower() in _PRECISIONS:
        return precision.lower()
    raise BackendOptionError(f"JaxBackend: precision must be one of {', '.join(_PRECISIONS)} or a "
                             f"jax.lax.Precision, got {precision!r}")


_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def _set_pre_allocate(pre_allocate: bool) -> None:
    """XLA's GPU allocator grabs most of the GPU's memory at start unless XLA_PYTHON_CLIENT_PREALLOCATE
    is false. It is read once, when jax first starts its backends: set here before that, warned
    about after it (and where there is no GPU for it to apply to)."""
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", lambda: True)()
    wanted = "true" if pre_allocate else "false"
    if not started:
        os.environ[_PREALLOCATE] = wanted  # process-wide: read by the GPU client jax starts next
    in_force = os.environ.get(_PREALLOCATE, "true").lower() not in ("false", "0")
    has_gpu = any(d.platform == "gpu" for d in jax.devices()) if _has_platform("gpu") else False
    if not has_gpu:
        warn_user(f"JaxBackend: pre_allocate={pre_allocate} sets XLA's GPU allocator, and there is no GPU here; "
                  "ignored")
    elif in_force != bool(pre_allocate):
        warn_user(f"JaxBackend: jax has already started its GPU client (preallocation "
                  f"{'on' if in_force else 'off'}); pre_allocate={pre_allocate} cannot change it in this "
                  f"process (set {_PREALLOCATE} before jax starts)")


def _has_platform(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


# XLA:CPU's YNNPACK fusions beat its Eigen kernels on Intel CPUs with AVX-512 where XLA has several
# threads, and lose elsewhere (docs/performance.md, "JAX backend: XLA options"). They take the dots
# only, one each: XLA's default list also gives them the convolutions (XNNPACK's, below, are faster)
# and fuses a CNN's last stage into one slow graph. An empty list turns them off.
_NO_YNN_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
_YNN_DOT_FUSIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


# Module names, so that tests can stand in for the CPU.
_cpu_flags = cpu_flags
_usable_cpus = usable_cpus


def _ynn_fusions_win() -> bool:
    """Whether XLA's YNNPACK dots beat its Eigen kernels on this CPU and thread count (see above)."""
    vendor, flags = _cpu_flags()
    return vendor == "GenuineIntel" and "avx512f" in flags and _usable_cpus() > 1


# XNNPACK's convolution for the `convolution` HLOs the Conv kernel emits where it beats im2col and
# Eigen's matmul, on large feature maps (jax/overrides.py chooses per layer).
_XNN_CONVOLUTIONS = {"xla_cpu_use_xnnpack": True,
                     "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"}
# float16/bfloat16 rounded where the graph rounds them: XLA may keep a fused half-precision chain in
# float32 and round once, and jitted results then differ from eager ones and from ONNX's.
_EXACT_HALVES = {"xla_allow_excess_precision": False}
# XLA:CPU's older loop emitters for the fusions around the library calls: the MLIR ones take about
# twice the memory to compile a large program, for the same run time (docs/performance.md).
# Forward programs only, and not those with 8- or 4-bit floats, whose NaN the older ones convert
# wrongly; gradient programs keep the MLIR ones, with which a sharded run matches its one-device run.
# jaxlib 0.11.2 rejects the option: there the default set goes without it (_with_old_emitters).
_OLD_EMITTERS = {"xla_cpu_use_fusion_emitters": False}


def _narrow_float(dtype) -> bool:
    """Float8 and float4 dtypes (ml_dtypes' one-byte floats)."""
    return dtype is not None and dtype.itemsize == 1 and dtypes.is_floating_np(dtype)


@dataclasses.dataclass(frozen=True)
class _ProgramNotes:
    """What :meth:`JaxBackend.lower` notes of a program for the XLA options it gets by default
    (a program it did not lower is taken to have both)."""

    window_ops: bool = True  # it convolves or pools
    narrow_floats: bool = True  # it holds float8/float4 values


def _default_options_for(notes: _ProgramNotes | None, options: dict, *, gradient: bool = False) -> dict:
    """The backend's default ``options`` fitted to one program (its ``notes``): a forward program
    without convolutions or pools gets XLA's own YNNPACK fusions (``_window_free_options``);
    gradient programs, and forward ones with narrow floats, the MLIR emitters."""
    notes = notes or _ProgramNotes()
    if not gradient and not notes.window_ops:
        options = _window_free_options(options) or options
    if (gradient or notes.narrow_floats) and _OLD_EMITTERS.items() <= options.items():
        options = {k: v for k, v in options.items() if k not in _OLD_EMITTERS}
    return options


def _with_old_emitters(chain: tuple) -> tuple:
    """Each set of options first with the older emitters, then (a jaxlib without them) without."""
    return tuple(o for options in chain for o in ({**options, **_OLD_EMITTERS}, options))


# The CPU default, best first: a jaxlib that rejects an option (YNNPACK came with 2025's XLA;
# pyproject admits jax>=0.4.30) gets the next one.
_CPU_COMPILER_OPTIONS = _with_old_emitters(({**_EXACT_HALVES, **_NO_YNN_FUSIONS, **_XNN_CONVOLUTIONS},
                                            {**_EXACT_HALVES, **_NO_YNN_FUSIONS}, _EXACT_HALVES)) + ({},)
# Where YNNPACK's dots win.
_CPU_COMPILER_OPTIONS_YNN = _with_old_emitters(({**_EXACT_HALVES, **_YNN_DOT_FUSIONS, **_XNN_CONVOLUTIONS},
                                                {**_EXACT_HALVES, **_YNN_DOT_FUSIONS}, _EXACT_HALVES)) + ({},)
_OTHER_COMPILER_OPTIONS = (_EXACT_HALVES, {})
# A forward program with no convolution or pooling (transformers, MLPs) takes XLA's own list of
# YNNPACK fusions wherever XLA has more than one thread: its dot, elementwise and reduce fusions
# run matmuls with their bias, GELU and LayerNorm faster than the dots alone or Eigen. Gradient
# programs keep the dot-only list, which is faster for them (docs/performance.md).
_WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv", "FusedConv",
                         "NhwcConv", "MaxPool", "AveragePool", "LpPool", "MaxUnpool", "Col2Im"})


def _window_free_options(options: dict) -> dict | None:
    """The options for a program without convolutions or pools, where they differ from
    ``options``: XLA's own YNNPACK fusions instead of the dot-only list, or instead of none where
    XLA has more than one thread; None elsewhere."""
    ynn = options.get("xla_cpu_experimental_ynn_fusion_type")
    if ynn != _YNN_DOT_FUSIONS["xla_cpu_experimental_ynn_fusion_type"] and not (ynn == "" and _usable_cpus() > 1):
        return None
    return {k: v for k, v in options.items() if k != "xla_cpu_experimental_ynn_fusion_type"}


def _library_convolutions(options: dict) -> bool:
    """Whether these compiler options send `convolution` HLOs to XNNPACK."""
    return bool(options.get("xla_cpu_use_xnnpack")) and "INDIVIDUAL_CONVOLUTION" in str(
        options.get("xla_cpu_experimental_xnn_fusion_type", ""))


def _on_cpu_ynn_dots(backend, options: dict) -> bool:
    """Whether ``backend``'s programs compiled with ``options`` run their dots with YNNPACK."""
    return backend._device.platform == "cpu" and _ynn_dots(options)


def _ynn_dots(options: dict) -> bool:
    """Whether these compiler options leave XLA:CPU's dots to YNNPACK (its default, where this
    jaxlib has YNNPACK: an older one ignores the question)."""
    return "DOT" in str(options.get("xla_cpu_experimental_ynn_fusion_type", "DOT"))


@functools.lru_cache(maxsize=None)
def _rejected_options(device, options: tuple) -> str | None:
    """Why XLA on ``device`` rejects these compiler options (a trivial program compiled with
    them), or None when it takes them; once per device and set of options."""
    probe = jax.device_put(np.float32(0), device)
    try:
        jax.jit(lambda v: v + 1, compiler_options=dict(options)).lower(probe).compile()
    except (TypeError, RuntimeError) as exc:  # no compiler_options argument; XLA's INVALID_ARGUMENT
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def _takes_context(forward) -> bool:
    """Whether ``forward`` takes the kernels' ``ctx`` (a generated program does: emit_python)."""
    try:
        return "ctx" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _jit(fn, compiler_options: dict):
    # jax.jit only takes compiler_options since 0.4.3x; without options, its plain form.
    return jax.jit(fn, compiler_options=compiler_options) if compiler_options else jax.jit(fn)


def _is_host_only(value) -> bool:
    # Strings (object arrays) live on the host: JAX has no string dtype.
    return isinstance(value, np.ndarray) and value.dtype == object


def _has_host_only(tree) -> bool:
    # Once per call over every parameter (hundreds in a CNN): checks against concrete classes
    # only (isinstance against the jax.Array ABC costs ten times more).
    if isinstance(tree, dict):
        tree = tree.values()
    elif not isinstance(tree, (list, tuple)):
        return _is_host_only(tree)
    for v in tree:
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                return True
        elif isinstance(v, (dict, list, tuple)) and _has_host_only(v):
            return True
    return False


# The backend whose scope() this thread is in: evaluate() enters it, and the jitted program it
# calls need not enter it again. A dynamic extent, not an option: JAX's compile listener
# (_release_compile_heap) gets no argument that could say whose call compiled.
_ACTIVE_SCOPE = contextvars.ContextVar("mithril_jax_active_scope", default=None)


def _libc_malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _libc_malloc_trim()
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _release_compile_heap(event: str, duration: float, **_kwargs) -> None:
    """After XLA compiled a program inside one of these backends' calls: the compiler's freed heap
    handed back to the system (``malloc_trim(0)``). XLA compiles in the calling thread's malloc
    arena and runs programs on its own threads, whose arenas do not reuse that free memory, so a
    first call held both: ResNet-18's peak over the process's start was 252 MiB without the trim
    (onnxruntime's 151), mobilenet_v2's 137 (50). A few ms beside a compile of 0.1-2 s. Programs
    a user compiles with jax outside Mithril's calls are left alone."""
    if event == _BACKEND_COMPILE and _ACTIVE_SCOPE.get() is not None:
        _MALLOC_TRIM(0)



def _on_host(value) -> bool:
    if isinstance(value, jax.Array):  # tracers included
        return False
    if isinstance(value, (list, tuple)):
        return all(_on_host(v) for v in value)
    return True


class _HostAwareJnp:
    """``jax.numpy``, except that a call whose arguments are all host values (NumPy arrays,
    Python scalars) runs in NumPy: shape arithmetic (Shape -> Gather -> Concat -> Reshape) then
    stays concrete under ``jax.jit`` instead of becoming traced values a static input cannot read."""

    def __init__(self):
        self._cache: dict = {}

    def __getattr__(self, name):
        fn = self._cache.get(name)
        if fn is None:
            jfn, nfn = getattr(jnp, name), getattr(np, name, None)
            if nfn is None or not callable(jfn) or isinstance(jfn, type) or not callable(nfn):
                fn = jfn
            else:
                def fn(*args, **kwargs):
                    if _on_host(args) and _on_host(tuple(kwargs.values())):
                        return nfn(*args, **kwargs)
                    return jfn(*args, **kwargs)

                fn.__name__ = name
            self._cache[name] = fn
        return fn

    def __repr__(self) -> str:
        return "<jax.numpy, host-aware>"


class _Jitted:
    """The whole generated forward as jitted XLA programs: its parameter-only work in one, run
    once per set of parameters, and the rest in another (hoist.py). Host-only inputs
    (strings) run it eagerly. ``compiler_options`` are the XLA options both compile with: the
    backend's, or its defaults fitted to this program (``_default_options_for``)."""

    def __init__(self, backend: "JaxBackend", forward, compiler_options: dict | None = None):
        self.backend = backend
        self.forward = forward
        options = backend.compiler_options if compiler_options is None else compiler_options
        if compiler_options is None and backend._default_options:
            options = _default_options_for(backend._program_notes.get(forward), options)
        self.compiler_options = dict(options)
        # YNNPACK's dots read a transposed weight in place as fast as a copy: no transposed copy kept.
        # On one CPU device, prepare's rearrangements run in NumPy (hoist.py).
        host = backend._device if backend._device.platform == "cpu" and backend._jmesh is None else None
        # Forward programs on a CPU with AVX-512 send small images' convolutions to XNNPACK too
        # (jax/overrides.py), where the options send any there: the program's ctx says so.
        self._small_images = (backend._device.platform == "cpu" and _library_convolutions(options)
                              and "avx512f" in _cpu_flags()[1] and _takes_context(forward))
        self._compiled = Hoisted(self._traced_as_forward(forward), functools.partial(_jit, compiler_options=options),
                                 transposed_dot_operands=_on_cpu_ynn_dots(backend, options), host_device=host)

    def __call__(self, params, data):
        with self.backend.scope():
            if _has_host_only(params) or _has_host_only(data):
                return self.forward(params, data)
            return self._compiled(params, data)

    def _traced_as_forward(self, forward):
        if not self._small_images:
            return forward
        return functools.partial(forward, ctx=dataclasses.replace(self.backend.kernel_context,
                                                                  small_images_to_library=True))

    def profile(self, forward, params, data, *, runs: int, warmup: int):
        """``forward`` (this program's forward, its ops named per node) split and compiled as this
        one is, its per-call program run under XLA's profiler (xla_profile.py)."""
        with self.backend.scope():
            if _has_host_only(params) or _has_host_only(data):
                return None
            from . import xla_profile

            own = self._compiled
            hoisted = Hoisted(self._traced_as_forward(forward), own._jit, own.transposed_dot_operands, own.host_device)
            return xla_profile.trace(hoisted, params, data, runs=runs, warmup=warmup)


class JaxBackend(Backend):
    """Runs lowered ONNX graphs with ``jax.numpy``; ``compile(..., jit=True)`` jits the whole graph.

    ONNX uses int64 (shapes, indices) and float64 throughout, which JAX holds only with x64
    enabled. The backend does not flip the global ``jax_enable_x64`` flag: every call into it
    (conversion, evaluation, gradients) runs inside ``jax.enable_x64(True)``, a thread-local
    scope, and outside it the user's configuration is untouched. Arrays it returns keep their
    64-bit dtypes; arithmetic on them outside the scope follows the user's configuration.

    Jitted evaluation runs as two programs (hoist.py): the work that reads parameters only
    (weights transposed or sliced into the layout a kernel reads) once per set of parameter
    arrays, and the rest on every call. The prepared values are kept, with the parameter arrays
    they came from, until a call passes other arrays (memory: at most about the weights again).

    ``compiler_options`` are XLA options for the programs this backend compiles (``jax.jit``'s
    argument of that name, per program: the process-wide ``XLA_FLAGS`` are left alone). The default
    on the CPU sends dots to YNNPACK on Intel CPUs with AVX-512, where its kernels are faster than
    XLA's own (only the dots in a program with convolutions or pools; XLA's own fusion list, with
    elementwise and reduce fusions, in a forward program without: a transformer's), and turns
    XLA:CPU's YNNPACK fusions off elsewhere (slower on an AMD EPYC), except in such a transformer's
    forward program where XLA has more than one thread (GPT-2's LM head: 28 against 50 ms on an AMD
    EPYC at 2 threads), and sends the convolutions that XNNPACK runs faster than im2col + matmul to
    XNNPACK (docs/performance.md), and compiles forward programs with XLA's older loop emitters
    (``xla_cpu_use_fusion_emitters`` off: half the memory to compile, as fast; gradient programs and
    those holding float8/float4 values keep the MLIR emitters); on every device it has XLA round
    each float16/bfloat16 op's result as the graph does (``xla_allow_excess_precision`` off, no
    effect on float32). ``compiler_options={}`` restores XLA's defaults, and the Conv kernel then
    uses im2col throughout.

    Options: ``precision`` ("bfloat16", "tensorfloat32", "float32", "default", "high",
    "highest" or a ``jax.lax.Precision``) is the matmul/conv precision of this backend's
    programs, in effect in :meth:`scope` and so when they are traced; ``debug=True`` makes a NaN
    or inf produced raise (``jax.debug_nans``/``debug_infs``, and NumPy's errstate for host
    work); ``pre_allocate`` sets XLA's GPU allocator flag (process-wide, read when jax starts its
    GPU client: a warning where there is no GPU, or when it has started); ``platform`` is
    ``device``'s alias; ``jit`` is what ``compile(jit=None)`` does. An absent ``device`` warns
    once and runs on the CPU.

    ``device_mesh=(2, 2)`` (with ``axis_names``, default ``("data", "model")``) runs over a
    ``jax.sharding.Mesh`` of that many devices: arrays the backend makes are whole on each of
    them unless ``tensor_split`` splits them, and ``ml.compile(..., parallel=...)`` places
    parameters and inputs by a strategy (docs/distributed.md). On the CPU, a backend made before
    any other JAX work has JAX create the host devices the mesh needs, at least 8 (JAX makes
    them only when it starts, so later, larger meshes find theirs); a count set in ``XLA_FLAGS``
    (``--xla_force_host_platform_device_count``) is kept.

    >>> import mithril as ml
    >>> b = ml.JaxBackend(dtype=ml.float32, device="cpu")
    >>> b.to_numpy(b.add(b.ones(2), b.ones(2))).tolist()
    [2.0, 2.0]
    """

    name = "jax"
    supports_gradients = True
    jit_option_names = {"compiler_options": "XLA options for this program, over the backend's compiler_options"}

    def __init__(self, dtype=None, device: str | None = None, compiler_options: dict | None = None, *,
                 precision=None, pre_allocate: bool | None = None, jit: bool = True, debug: bool = False,
                 platform: str | None = None, device_mesh=None, axis_names=None, **unknown):
        _import_jax()
        self._refuse_unknown_options(unknown)
        global _overrides
        from . import overrides as _overrides  # registers the JAX kernels
        if platform is not None:
            if device is not None and device != platform:
                raise BackendOptionError(f"JaxBackend: platform={platform!r} is an alias of device, which is "
                                         f"{device!r}; give one of them")
            device = platform
        self.mesh = parse_mesh("JaxBackend", device_mesh, axis_names)
        host_devices_why: list[str] = []
        if self.mesh is not None and self.mesh.size > 1:
            # Before the device lookup starts jax's backends, whatever the device: one that is not
            # present falls back to the CPU, and host devices are free where a GPU is.
            host_devices_why = _mesh.ask_host_devices(jax, self.mesh)
        if pre_allocate is not None:
            _set_pre_allocate(pre_allocate)  # before the device lookup starts jax's backends
        self._device = _parse_device(self, "cpu" if device is None else device)
        self.precision = _precision_name(precision)
        self.debug = bool(debug)
        self.pre_allocate = pre_allocate
        self.jit_by_default = bool(jit)
        self.device_mesh = None if self.mesh is None else self.mesh.shape
        # The jax.sharding.Mesh; None on one device (a one-device mesh is the plain path).
        self._jmesh = _mesh.build_mesh(jax, self._device.platform, self.mesh, host_devices_why) \
            if self.mesh and self.mesh.size > 1 else None
        if compiler_options is None:
            # The CPU default, or as much of it as this jaxlib knows.
            if self._device.platform != "cpu":
                defaults = _OTHER_COMPILER_OPTIONS
            else:
                defaults = _CPU_COMPILER_OPTIONS_YNN if _ynn_fusions_win() else _CPU_COMPILER_OPTIONS
            compiler_options = next(o for o in defaults if not o or self._rejected(o) is None)
            self._default_options = True
        else:
            self._check_compiler_options(compiler_options)
            self._default_options = False
        self.compiler_options = dict(compiler_options)
        self._library_convolutions = _library_convolutions(self.compiler_options)
        self._ynn_dots = _ynn_dots(self.compiler_options)
        # The generated programs' ctx: what these options decide for the Conv kernel.
        self.kernel_context = _overrides.KernelOptions(library_convolutions=self._library_convolutions,
                                                       ynn_dots=self._ynn_dots)
        self.xp = _HostAwareJnp()
        self._vjp_cache: dict = {}
        name = f"{self._device.platform}:{self._device.id}" if device is not None and ":" in device else self._device.platform
        super().__init__(dtype if dtype is not None else dtypes.float32, name)

    def _check_compiler_options(self, compiler_options) -> None:
        if compiler_options:
            reason = self._rejected(compiler_options)
            if reason is not None:
                raise BackendUnavailableError(
                    f"JaxBackend: XLA on {self._device} rejects compiler_options {dict(compiler_options)}: {reason}"
                )

    def _rejected(self, options) -> str | None:
        try:
            key = tuple(sorted(options.items()))
            hash(key)
        except TypeError:  # an unhashable value: XLA options are strings, numbers and booleans
            return f"option values must be strings, numbers or booleans, got {dict(options)}"
        return _rejected_options(self._device, key)

    @classmethod
    def devices(cls) -> list[str]:
        """``"cpu:0"``, ``"gpu:0"``... for every device jax sees, per platform."""
        _import_jax()
        return _present_devices()

    def scope(self):
        """x64 and this backend's device, for the duration of one call; and its matmul/conv
        ``precision`` and ``debug`` checks (NaN and inf raise), which a jitted program takes at
        trace time: it is traced inside this scope."""
        if _ACTIVE_SCOPE.get() is self:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(jax.enable_x64(True))
        stack.enter_context(jax.default_device(self._device))
        if self.precision is not None:
            stack.enter_context(jax.default_matmul_precision(self.precision))
        if self.debug:
            stack.enter_context(jax.debug_nans(True))
            stack.enter_context(jax.debug_infs(True))
            # What runs on the host (NumPy, for host-only values) raises alike.
            stack.enter_context(np.errstate(invalid="raise", divide="raise", over="raise"))
        stack.callback(_ACTIVE_SCOPE.reset, _ACTIVE_SCOPE.set(self))
        return stack

    # -- dtypes and conversion -------------------------------------------------------
    def unsupported_dtype_reason(self, dtype) -> str | None:
        dtype = np.dtype(dtype)
        if dtype == object:
            return None  # strings: the string kernels run on the host with NumPy
        try:
            with self.scope():
                held = jnp.zeros((), dtype=dtype).dtype
        except (TypeError, ValueError) as exc:
            return f"jax.numpy has no {dtype} ({exc})"
        return None if held == dtype else f"jax.numpy holds {dtype} as {held}"

    def from_numpy(self, arr):
        arr = np.asarray(arr)
        if arr.dtype == object:
            return arr
        with self.scope():
            # On a mesh every array the backend makes is on the mesh (whole on each device), so it
            # meets sharded ones in one program.
            return jax.device_put(arr, self._device if self._jmesh is None else self._replicated)

    def share(self, arr):
        """``arr``'s values held once: on one CPU device, a read-only copy aligned as XLA:CPU aligns
        its buffers (64 bytes), which :meth:`hold` then puts on the device without a copy (XLA adopts
        such a buffer); the model drops ``arr``. A read-only ``arr`` aligned so already comes back
        as it is, as does any array on a GPU, a mesh, or of a dtype JAX does not hold.

        >>> import numpy as np, mithril as ml
        >>> b = ml.JaxBackend(device="cpu")
        >>> w = b.share(np.ones(3, np.float32))
        >>> w.flags.writeable, w.ctypes.data % 64, b.hold(w).unsafe_buffer_pointer() == w.ctypes.data
        (False, 0, True)
        """
        arr = np.asarray(arr)
        if (self._device.platform != "cpu" or self._jmesh is not None or arr.dtype == object
                or self.unsupported_dtype_reason(arr.dtype)
                or (not arr.flags.writeable and arr.ctypes.data % ALIGNMENT == 0)):
            return arr
        out = aligned_copy(arr)
        out.flags.writeable = False  # XLA reads the buffer as immutable; nor may anyone write it here
        return out

    # -- device meshes -----------------------------------------------------------------
    @functools.cached_property
    def _replicated(self):
        return _mesh.sharding(jax, self._jmesh, ())

    def shard(self, value, spec):
        """``value`` (NumPy or JAX) split over the backend's mesh by ``spec`` (the mesh axis of
        each dim, None for whole): ``jax.device_put`` with a ``NamedSharding``."""
        with self.scope():
            return jax.device_put(value, _mesh.sharding(jax, self._jmesh, tuple(spec)))

    def place(self, values: dict, plan) -> dict:
        """Parameters or data placed by a :class:`~mithril.distributed.ShardingPlan`: NumPy arrays
        and arrays off the mesh by the plan's spec; arrays already on the mesh keep the user's
        placement."""
        out = {}
        for name, v in values.items():
            if _is_host_only(v) or _mesh.on_mesh(jax, self._jmesh, v):
                out[name] = v
                continue
            if name in plan.stages:  # a pipeline's parameter: on its stage's devices
                with self.scope():
                    axes = (plan.strategies["pipeline"], plan.strategies.get("data"))
                    out[name] = jax.device_put(v, self.stage_sharding(plan.stages[name], axes))
                continue
            spec = plan.specs.get(name, ())
            if name in plan.input_shapes:
                check_batch("evaluate", self.mesh, name, np.shape(v), spec)
            out[name] = self.shard(v, spec)
        return out

    @functools.cached_property
    def _stage_cache(self) -> dict:
        return {}

    def synchronize(self, value) -> None:
        jax.block_until_ready(value)  # leaves without block_until_ready (NumPy, host values) pass

    def is_traced(self, args) -> bool:
        return any(isinstance(a, jax.core.Tracer) for a in args)

    def check_sharding(self, plan) -> None:
        """A pipeline's stages run on the devices at each index of its axis; with data parallel on
        a second axis, each stage's batch rows are split over that axis's devices."""
        if plan.pipeline is not None:
            self._pipeline_axes = (plan.strategies["pipeline"], plan.strategies.get("data"))

    def lower(self, plan, **kwargs):
        """The generated program, noted (whether the graph convolves or pools, and whether it holds
        narrow floats) for the XLA options :meth:`jit` and :meth:`vjp` give it by default: see
        ``_default_options_for``."""
        program = super().lower(plan, **kwargs)
        nodes = list(plan.all_nodes())
        self._program_notes[program.forward] = _ProgramNotes(
            window_ops=any(pn.op_type in _WINDOW_OPS for pn in nodes),
            narrow_floats=any(_narrow_float(v.dtype) for v in plan.inputs) or any(
                v is not None and _narrow_float(v.dtype) for pn in nodes for v in (*pn.inputs, *pn.outputs)))
        return program

    @functools.cached_property
    def _program_notes(self) -> weakref.WeakKeyDictionary:
        """Each forward :meth:`lower` made -> its :class:`_ProgramNotes`, while the forward lives."""
        return weakref.WeakKeyDictionary()

    def lower_stages(self, plan, stages, *, file_path: str | None = None):
        """The program with its pipeline stages; each stage's arguments are marked batched (a
        micro-batch's rows: split over the data axis when there is one) or not (parameters and
        what is computed from them alone: whole on each device of the stage)."""
        program = super().lower_stages(plan, stages, file_path=file_path)
        rows = {v.static_shape[0] for v in plan.inputs if v.kind == "input" and v.static_shape}
        codes = {c.co_name: c for c in program.forward.__code__.co_consts if isinstance(c, types.CodeType)}
        for segment in stages.segments:
            batched = tuple(v.kind != "param" and bool(v.static_shape) and v.static_shape[0] in rows
                            for v in segment.inputs)
            if f"s{segment.index}" in codes:
                self._stage_args[codes[f"s{segment.index}"]] = (self._pipeline_axes, batched)
        return program

    @functools.cached_property
    def _stage_args(self) -> dict:
        return {}

    _pipeline_axes: tuple = (None, None)  # (pipeline axis, data axis) of the last pipeline compiled

    def stage_sharding(self, index: int, axes: tuple | None = None, batched: bool = False):
        """Where pipeline stage ``index`` runs: the mesh's devices at that index of its pipeline
        axis (``axes``: (pipeline axis, data axis); default the compiled pipeline's, else the
        axis named ``"pipe"``, else the first), whole on each, or ``batched``: split by rows over
        the data axis."""
        names = self.mesh.axis_names
        pipe, data = axes if axes is not None else self._pipeline_axes
        axis = names.index(pipe) if pipe in names else names.index("pipe") if "pipe" in names else 0
        devices = np.take(self._jmesh.devices, index, axis=axis)
        rest = tuple(n for i, n in enumerate(names) if i != axis)
        sub = jax.sharding.Mesh(np.asarray(devices).reshape([d for i, d in enumerate(self.mesh.shape) if i != axis]),
                                rest) if rest else jax.sharding.Mesh(np.asarray([devices]), ("stage",))
        return _mesh.sharding(jax, sub, (data,) if batched and data in rest else ())

    def pipeline_stage(self, index: int, fn, *args):
        """Pipeline stage ``index`` (a segment of the printed program, :mod:`mithril.distributed.
        pipeline`) as one jitted program on its devices; the arrays it reads are moved there
        first (``jax.device_put``, differentiable). Host values (shape arithmetic) stay concrete:
        the compiled stage is keyed by them, as :func:`_checkpointed` keeps them."""
        leaves, tree = jax.tree_util.tree_flatten(args)
        traced = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
        host_key = tuple((i, _static_key(x)) for i, x in enumerate(leaves) if i not in set(traced))
        key = (index, fn.__code__, tree, host_key)
        entry = self._stage_cache.get(key)
        if entry is None:
            box: dict = {}
            host_leaves = list(leaves)

            def on_arrays(*arrays):
                full = list(host_leaves)
                for i, x in zip(traced, arrays):
                    full[i] = x
                out_leaves, box["tree"] = jax.tree_util.tree_flatten(fn(*jax.tree_util.tree_unflatten(tree, full)))
                box["host"] = [_ON_DEVICE if isinstance(x, jax.Array) else x for x in out_leaves]
                return [x for x in out_leaves if isinstance(x, jax.Array)]

            # Where each array goes: by the argument it belongs to (lower_stages marked the batched
            # ones), a micro-batch's rows over the data axis; everything else whole on each device.
            axes, batched = self._stage_args.get(fn.__code__, (None, ()))
            owner = [i for i, a in enumerate(args) for _ in jax.tree_util.tree_leaves(a)]
            shardings = {b: self.stage_sharding(index, axes, b) for b in (False, True)}
            placed = [shardings[owner[i] < len(batched) and batched[owner[i]]] for i in traced]
            # Plain jax.jit: jax.vjp traces a stage as a nested jit, which takes no compiler_options.
            entry = self._stage_cache[key] = (jax.jit(on_arrays), box, placed)
        jitted, box, placed = entry
        # Under jax.vjp the arrays are tracers (no .sharding to compare): device_put is a no-op for
        # an array already there, and its transpose brings the cotangent back.
        arrays = [jax.device_put(leaves[i], s) for i, s in zip(traced, placed)]
        out = iter(jitted(*arrays))
        return jax.tree_util.tree_unflatten(box["tree"], [next(out) if x is _ON_DEVICE else x for x in box["host"]])

    def per_device_bytes(self, arrays) -> dict:
        """``{device id: bytes}`` that ``arrays`` (a dict or a list) hold on each device."""
        return _mesh.per_device_bytes(arrays.values() if isinstance(arrays, dict) else arrays)

    def to_numpy(self, arr) -> np.ndarray:
        if isinstance(arr, jax.Array) and not arr.is_fully_addressable and not arr.is_fully_replicated:
            # A mesh spanning several processes (hosts): every process gets the whole array.
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(arr, tiled=True))
        return np.asarray(arr)

    def finalize_outputs(self, outputs: dict) -> dict:
        # Kernels that run on the host return NumPy arrays: callers always get backend arrays.
        return {k: self._to_backend(v) for k, v in outputs.items()}

    def _to_backend(self, v):
        if isinstance(v, list):
            return [self._to_backend(x) for x in v]
        if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype != object:
            return self.from_numpy(v)
        return v

    # -- compilation hooks -----------------------------------------------------------
    def jit(self, forward, options: dict | None = None):
        """``jax.jit`` of the whole forward (two programs, hoist.py). ``options``:
        ``compiler_options``, XLA options merged over the backend's for this program."""
        options = self.check_jit_options(options)
        compiler_options = None
        if "compiler_options" in options:
            compiler_options = {**self.compiler_options, **dict(options["compiler_options"] or {})}
            self._check_compiler_options(compiler_options)
        return _Jitted(self, forward, compiler_options)

    def profile_jitted(self, jitted, print_program, params, data, *, runs: int, warmup: int):
        """XLA's profiler on the compiled per-call program, each instruction's time given to the
        node it came from (xla_profile.py)."""
        if not isinstance(jitted, _Jitted):
            return None
        from .xla_profile import scoped_call

        return jitted.profile(print_program(scoped_call), params, data, runs=runs, warmup=warmup)

    # -- devices, random keys, memory ------------------------------------------------------
    def to_device(self, x, device):
        """``x`` on ``device`` (``jax.device_put``); an absent device warns and ``x`` stays."""
        found = _find_device(self, device)
        if found is None:
            warn_user(f"JaxBackend: device {device!r} is not present (present devices: "
                      f"{', '.join(_present_devices())}); the array stays on {self.device}", DeviceFallbackWarning)
            return x
        with self.scope():
            return jax.device_put(x, found)

    def set_seed(self, seed: int) -> None:
        super().set_seed(seed)
        with jax.enable_x64(True):
            self._key = jax.random.key(seed)

    def get_random_key(self):
        """A fresh JAX PRNG key split off the backend's key (:meth:`set_seed` restarts it)."""
        with self.scope():
            self._key, key = jax.random.split(self._key)
        return key

    def split_key(self, key):
        """``jax.random.split``: ``(new_key, subkey)``."""
        with self.scope():
            new_key, subkey = jax.random.split(key)
        return new_key, subkey

    def random_normal(self, key, shape=(), dtype=None):
        """``jax.random.normal(key, shape)`` in ``dtype`` (default: the backend's)."""
        with self.scope():
            return jax.random.normal(key, (shape,) if isinstance(shape, int) else tuple(shape),
                                     dtype=self.backend_dtype(dtype))

    def get_memory_info(self) -> dict:
        """XLA's allocator statistics of this device where it keeps them (GPU, TPU), in MB;
        the process's resident memory on the CPU, where it does not."""
        stats = self._device.memory_stats()
        if not stats:
            return process_memory_info()
        info = {"used": stats.get("bytes_in_use", 0) / 2**20,
                "peak": stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0)) / 2**20,
                "source": f"XLA allocator of {self._device}"}
        if "bytes_limit" in stats:
            info["limit"] = stats["bytes_limit"] / 2**20
        return info

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        # The jitted vector-Jacobian product only where compile jitted the forward (jit=True, no
        # random draws, no value-dependent shapes); a failed trace raises, and the caller asks
        # again with jitted=None (eager).
        forward = program.forward
        key = (id(forward), tuple(diff_params), tuple(diff_data), tuple(sorted(output_gradients)))
        with self.scope():
            run = self._vjp_cache.get(key)
            if run is None:
                notes = self._program_notes.get(forward)
                options = _default_options_for(notes, self.compiler_options, gradient=True) \
                    if self._default_options else self.compiler_options
                run = self._vjp_cache[key] = _make_vjp(forward, tuple(diff_params), tuple(diff_data), options)
            cot = {k: jnp.asarray(v) for k, v in output_gradients.items()}
            if program.jitted is not None and not (_has_host_only(params) or _has_host_only(data)):
                return run.jitted(dict(params), dict(data), cot)
            return run(dict(params), dict(data), cot)

    def vjp_parts(self, program, parts, diff_params, diff_data) -> list:
        """GPipe: the forward pass of every micro-batch is issued (``jax.vjp``; each stage runs
        asynchronously on its devices, so stage 0 starts part 2 while stage 1 runs part 1), then
        the backward passes, last part first."""
        with self.scope():
            pending = []
            for params, data, cotangents in parts:
                f, primal_p, primal_d = _split_for_vjp(program.forward, params, data, diff_params, diff_data)
                outputs, pullback = jax.vjp(f, primal_p, primal_d)
                pending.append((outputs, pullback, cotangents))
            results = [None] * len(pending)
            for i in reversed(range(len(pending))):
                outputs, pullback, cotangents = pending[i]
                gp, gd = pullback({k: _cotangent(v, cotangents.get(k)) for k, v in outputs.items()})
                results[i] = (outputs, {**gp, **gd})
            return results

    def checkpoint(self, fn, *args):
        """A segment of the generated forward whose backward pass computes it again (see
        :func:`_checkpointed`) while the backend differentiates (vjp); a plain call otherwise,
        so forward-only programs stay as they were (hoist.py still finds their weight-only work)."""
        return _checkpointed(fn, args) if _DIFFERENTIATING.get() else fn(*args)


# True while _make_vjp's function runs (or is traced): the forward's checkpointed segments recompute.
# A dynamic extent read by the checkpoint hook (the same forward runs with and without a gradient
# trace around it), not an option a kernel reads: kernel options travel as ctx.
_DIFFERENTIATING = contextvars.ContextVar("mithril_jax_differentiating", default=False)


def _checkpointed(fn, args):
    """``fn(*args)`` whose backward pass keeps only the arguments and differentiates ``fn`` again.

    ``jax.checkpoint`` means the same, but XLA:CPU erases its optimization barriers before its
    last common-subexpression pass, which merges the recomputation back into the forward pass
    (ResNet-18 training kept as much memory with it as without). Here a ``custom_vjp`` saves the
    arguments, and its backward rule ties the recomputation's inputs to the cotangent by an exact
    identity XLA does not fold (:func:`_tie`), so the recomputation happens after the cotangent
    exists, on every platform. Only JAX arrays are traced; other leaves (NumPy values computed on
    the host: shapes) stay concrete, in and out."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    traced = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
    host = {}  # fn's output structure and host leaves

    def on_arrays(*arrays):
        full = list(leaves)
        for i, x in zip(traced, arrays):
            full[i] = x
        out_leaves, host["tree"] = jax.tree_util.tree_flatten(fn(*jax.tree_util.tree_unflatten(tree, full)))
        host["leaves"] = [None if isinstance(x, jax.Array) else x for x in out_leaves]
        return [x for x in out_leaves if isinstance(x, jax.Array)]

    @jax.custom_vjp
    def segment(*arrays):
        return on_arrays(*arrays)

    def forward(*arrays):
        return on_arrays(*arrays), arrays

    def backward(arrays, cotangents):
        anchor = next((jnp.ravel(c)[0] for c in cotangents
                       if jnp.issubdtype(c.dtype, jnp.floating) and c.size), None)
        _, pullback = jax.vjp(on_arrays, *(_tie(a, anchor) for a in arrays))
        return tuple(pullback(list(cotangents)))

    segment.defvjp(forward, backward)
    arrays = iter(segment(*(leaves[i] for i in traced)))
    return jax.tree_util.tree_unflatten(host["tree"], [next(arrays) if x is None else x for x in host["leaves"]])


def _tie(value, anchor):
    """``value``, made to depend on ``anchor``: ``where(anchor == anchor, value, value rounded to
    its own precision)`` is ``value`` whatever ``anchor`` is, and XLA folds neither side."""
    if anchor is None or not jnp.issubdtype(value.dtype, jnp.floating):
        return value
    info = jnp.finfo(value.dtype)
    return jnp.where(anchor == anchor, value, jax.lax.reduce_precision(value, info.nexp, info.nmant))


class _Vjp:
    """A vector-Jacobian product program, called eagerly or as ``jitted``."""

    def __init__(self, run, compiler_options: dict):
        self.run = run
        self.jitted = _jit(run, compiler_options)

    def __call__(self, params, data, cotangents):
        return self.run(params, data, cotangents)


def _make_vjp(forward, diff_params, diff_data, compiler_options) -> _Vjp:
    def run(params, data, cotangents):
        token = _DIFFERENTIATING.set(True)
        try:
            return _vjp(params, data, cotangents)
        finally:
            _DIFFERENTIATING.reset(token)

    def _vjp(params, data, cotangents):
        f, primal_p, primal_d = _split_for_vjp(forward, params, data, diff_params, diff_data)
        outputs, pullback = jax.vjp(f, primal_p, primal_d)
        cots = {k: _cotangent(v, cotangents.get(k)) for k, v in outputs.items()}
        gp, gd = pullback(cots)
        return outputs, {**gp, **gd}

    return _Vjp(run, compiler_options)


def _split_for_vjp(forward, params, data, diff_params, diff_data):
    """``f(differentiated params, differentiated data)`` over ``forward`` with the rest fixed, and
    the primal values of its two arguments."""
    fixed_p = {k: v for k, v in params.items() if k not in diff_params}
    fixed_d = {k: v for k, v in data.items() if k not in diff_data}

    def f(dp, dd):
        return forward({**fixed_p, **dp}, {**fixed_d, **dd})

    return f, {k: params[k] for k in diff_params}, {k: data[k] for k in diff_data}


_ON_DEVICE = object()  # a pipeline stage's output computed on its devices (not a host value)


def _static_key(value):
    """A host value as a cache key: its type, dtype, shape and bytes."""
    if isinstance(value, (list, tuple)):
        return tuple(_static_key(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    arr = np.asarray(value)
    return (arr.dtype.str, arr.shape, arr.tobytes() if arr.dtype != object else repr(arr.tolist()))


def _cotangent(out, given):
    """The cotangent for one output: the given one, zeros, or float0 for non-floating outputs."""
    if isinstance(out, (list, tuple)):
        return type(out)(_cotangent(o, None) for o in out)
    if out is None:
        return None
    dtype = jnp.result_type(out)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(np.shape(out), dtype=jax.dtypes.float0)
    if given is None:
        given = jnp.zeros(np.shape(out), dtype=dtype)
    given = jnp.asarray(given, dtype=dtype)
    if (isinstance(out, jax.Array) and not isinstance(out, jax.core.Tracer) and not isinstance(given, jax.core.Tracer)
            and given.sharding != out.sharding):  # a pipeline's output lives on its last stage's devices
        given = jax.device_put(given, out.sharding)
    return given


def _scoped(fn):
    @functools.wraps(fn)
    def run(self, *args, **kwargs):
        with self.scope():
            return fn(self, *args, **kwargs)

    return run


# The tensor API computes inside the scope too: int64 stays int64 (outside x64, jax.numpy truncates).
for _name in ("array", "zeros", "ones", "randn", "rand", "arange", "zeros_like", "ones_like", "add", "subtract",
              "multiply", "divide", "matmul", "maximum", "minimum", "relu", "sigmoid", "tanh", "isnan", "sum",
              "mean", "max", "reshape", "transpose", "concat",
              "power", "negative", "abs", "exp", "log", "sqrt", "sin", "cos", "where", "min"):
    setattr(JaxBackend, _name, _scoped(getattr(Backend, _name)))
