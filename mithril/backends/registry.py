"""The kernel registry: each ONNX op written once, against an array namespace.

A kernel is a plain function. Its positional parameters are the node's inputs (``None`` for a
missing optional input; variadic inputs arrive as further positional arguments); its
keyword-only parameters are the node's attributes, named as in ONNX, with defaults filled
from the ``onnx.defs`` schema. A kernel may also declare any of these keyword-only
parameters, which the lowering supplies:

``xp``           the backend's array namespace (``numpy`` for NumpyBackend)
``num_outputs``  how many outputs the node asks for (for ops with optional outputs)
``rng``          a ``numpy.random.Generator`` seeded from the backend (random ops)
``ctx``          the backend's options for its kernels (``Backend.kernel_context``: JaxBackend's
                 ``KernelOptions`` say which convolutions go to XNNPACK), None where it has none
``opset``        the opset version in force for the node's domain
``node``         a :class:`NodeInfo` (name, op type, output dtypes known from the graph)
``standard``     for a kernel that declares ``standard_ops`` (a fused op), the
                 :class:`StandardKernels` it calls them through

A kernel returns one array, or a tuple of arrays for a node with several outputs.
Sequences are Python lists; an empty Optional is ``None``.

    @kernel("Softmax", since=13)
    def softmax(x, *, axis, xp):
        e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
        return e / xp.sum(e, axis=axis, keepdims=True)

Resolution picks, for ``(domain, op_type)``, the entry with the newest ``since`` that is
<= the model's opset for that domain. ``@override("jax", "Conv", since=11)`` registers a
backend-specific kernel that wins over the shared one on that backend; its ``reason`` says
which gap or speed-up it is for (``mithril ops Erf`` prints it).

Metadata a kernel declares at registration, read by the code named here, never recovered from
``if op_type == ...`` branches or comments:

``static_inputs``         positions read as concrete host values (Reshape's shape): the plan
                          (plan.py) passes them unconverted; compile keeps their initializers
                          out of params.
``graph_attributes``      attributes holding subgraphs (If, Loop, Scan), for readers and
                          ``mithril ops``: the plan binds subgraphs by attribute type.
``nondeterministic``      random ops: never constant-folded (interpret.py), never traced once
                          (compile's jit blockers, the MLX backend).
``data_dependent_shape``  output shapes depend on input values: blocks whole-graph jit (compile).
``output_shapes``         a shape rule for ops ONNX inference does not know (specialize.py).
``standard_ops``          the standard ONNX ops a fused op runs (FusedConv: Conv and its
                          activations), each with the oldest version its calls are written for:
                          the plan resolves them on its backend at the model's ai.onnx opset
                          (:class:`StandardKernels`).
``host_only``             the kernel computes on the host with NumPy whatever the backend: string
                          and map ops, ops that mutate a NumPy canvas in place or loop over values
                          (ConvTranspose's overlap-add, Scatter*, NonMaxSuppression). The
                          registry wraps it (``KernelSpec.fn``) so that it receives NumPy arrays
                          (and ``xp=numpy``) on every backend (under a jit, a traced input fails
                          the trace and JAX runs eagerly, warned); a backend that wants it on its
                          device overrides it.
``emit_required``         an emit-based backend (C, GGML: kernels render code instead of running
                          over ``xp``) must provide this op itself: the shared kernel cannot be
                          rendered and is a tensor op, not one to leave to the explicit NumPy
                          fallback. A ``host_only`` kernel without it (strings, tokenizers,
                          ai.onnx.ml maps) may take that fallback; a kernel over ``xp`` is
                          rendered from the shared definition.

``KernelSpec.location`` is where the function is defined (``mithril/backends/kernels/nn.py:142``),
for generated code and for ``mithril ops``.

Custom ops (docs/custom_ops.md; :mod:`mithril.backends.custom_ops`). Any domain with a kernel is
accepted at compile, at the version the model imports it with. A user's op goes in a domain of its
own (:data:`CUSTOM_DOMAIN`, ``mithril.custom``, unless ``domain=`` says otherwise), registered

- for one backend, in its framework (``jnp``, ``torch``, ``mx``): ``ml.JaxBackend.register_op("gelu",
  fn)``, also on an instance and as a decorator (``@backend.register_op("gelu")``), or
  ``ml.register_op("gelu", fn, backend="jax")``: an override under that backend's name; or
  ``@override("jax", "gelu", domain="mithril.custom")`` as the built-in overrides are;
- for every backend, over ``xp``: ``ml.register_op("gelu", fn)``, or
  ``@kernel("gelu", domain="mithril.custom")`` as the built-in kernels are.

A second registration of the same op, domain, ``since`` and backend is a
:class:`~mithril.errors.KernelRegistrationError` naming both definitions, unless it says
``replace=True``; ``register_op`` replaces its own earlier registration (a re-run notebook cell).
``ml.scoped_ops()`` undoes what is registered inside it (tests), ``ml.unregister_op`` one op.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import KernelRegistrationError, MithrilError, UnsupportedAttributeError

# The domain ``register_op`` and ``ml.CustomOp`` use unless given another: user ops, apart from
# ONNX's domains and from ``ai.mithril`` (the ops Mithril's own passes make).
CUSTOM_DOMAIN = "mithril.custom"
# Domains whose ops Mithril implements itself; a missing op of another domain is a custom op
# nobody registered, and the error says how to register one.
STANDARD_DOMAINS = frozenset({"", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft", "ai.mithril"})


@dataclass(frozen=True)
class KernelSpec:
    fn: Callable
    op_type: str
    domain: str
    since: int
    # Input positions that must be concrete (host) values for shape-static backends:
    # Reshape's shape, Slice's starts/ends/axes/steps, TopK's k, ...
    static_inputs: tuple[int, ...] = ()
    # Attributes holding subgraphs (If's then_branch, Loop's body, ...).
    graph_attributes: tuple[str, ...] = ()
    # Random ops are never constant-folded.
    nondeterministic: bool = False
    # Output shapes depend on input values (NonZero, Unique): blocks whole-graph jit.
    data_dependent_shape: bool = False
    # For ops ONNX shape inference does not know (com.microsoft): (inputs, attributes) -> one
    # (shape, dtype) per output, or None; inputs are (static shape or None, dtype or None) pairs,
    # None for a missing input. Lets Shape sub-graphs after such ops fold at compile.
    output_shapes: Callable | None = None
    # Computes with NumPy on the host whatever the backend (see the module docstring); ``fn`` is
    # then the wrapper that hands it NumPy arrays.
    host_only: bool = False
    # An emit-based backend (C, GGML) must implement this op itself (see the module docstring).
    emit_required: bool = False
    # Why a backend override exists: the semantic gap it fills or the speed-up it buys.
    reason: str = ""
    # Registered through register_op: a later register_op of the same op replaces it.
    custom: bool = False
    # The standard ONNX ops a fused op calls, as (op_type, oldest version its calls are written for).
    standard_ops: tuple[tuple[str, int], ...] = ()
    accepts: frozenset[str] = field(default_factory=frozenset)
    accepts_var_keyword: bool = False

    @property
    def name(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op_type}-{self.since}"

    @property
    def location(self) -> str:
        """``path:line`` of the kernel's definition, the path relative to the directory holding
        the ``mithril`` package (the repository root in a checkout).

        >>> import mithril.backends.kernels
        >>> REGISTRY.resolve("Relu", 14).location.startswith("mithril/backends/kernels/elementwise.py:")
        True
        """
        return source_location(self.fn)

    @property
    def builtin(self) -> bool:
        """Whether the function is defined in the mithril package (one of Mithril's own kernels)."""
        if self.custom:
            return False
        code = getattr(inspect.unwrap(self.fn), "__code__", None)
        return code is not None and os.path.abspath(code.co_filename).startswith(_PACKAGE + os.sep)

    @property
    def function(self) -> str:
        """``module.function`` of the kernel's definition."""
        fn = inspect.unwrap(self.fn)
        return f"{fn.__module__}.{fn.__qualname__}"


# The directory holding the mithril package: KernelSpec.location is relative to it.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGE = os.path.join(_ROOT, "mithril")


def source_location(fn) -> str:
    """``path:line`` of ``fn``'s definition, the path relative to the directory holding the
    ``mithril`` package (``KernelSpec.location``, a native rule's in ``mithril ops``)."""
    try:
        return _cached_location(fn)
    except TypeError:  # an unhashable callable: not cached
        return _cached_location.__wrapped__(fn)


@functools.lru_cache(maxsize=None)
def _cached_location(fn) -> str:
    # Once per function: emitting a program names the kernel of every node, and
    # inspect.getsourcefile plus relpath cost 40 us a call.
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    path = inspect.getsourcefile(fn) or (code.co_filename if code else "?")
    try:
        path = os.path.relpath(path, _ROOT)
    except ValueError:  # another drive (Windows)
        pass
    if path.startswith(".."):
        path = os.path.abspath(os.path.join(_ROOT, path))
    return f"{path.replace(os.sep, '/')}:{code.co_firstlineno if code else 0}"


def _to_host(value):
    """A kernel argument as NumPy: arrays of any backend (through ``__array__``), sequences
    (lists) element by element; anything else (None, NumPy arrays, maps) as it is."""
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)) or not hasattr(type(value), "__array__"):
        return value
    return np.asarray(value)


def _on_host(fn, takes_xp: bool):
    """``fn`` called with its inputs as NumPy arrays, and ``xp=numpy`` where it takes ``xp``."""

    @functools.wraps(fn)
    def host_kernel(*inputs, **attributes):
        if takes_xp:
            attributes["xp"] = np
        return fn(*(_to_host(v) for v in inputs), **attributes)

    return host_kernel


def make_spec(fn, op_type, domain, since, **meta) -> KernelSpec:
    """The registry entry for kernel ``fn``: its keyword-only attributes, its metadata ``meta``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or ufunc (np.tanh): inputs only, no attributes
        params = ()
    accepts = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if meta.get("host_only"):
        fn = _on_host(fn, "xp" in accepts)
    if "standard_ops" in meta:
        ops = meta["standard_ops"]
        meta["standard_ops"] = tuple(sorted(ops.items() if isinstance(ops, dict) else ((op, 1) for op in ops)))
    return KernelSpec(
        fn=fn,
        op_type=op_type,
        domain=domain,
        since=since,
        accepts=accepts,
        accepts_var_keyword=var_kw,
        **meta,
    )


class KernelRegistry:
    """(domain, op_type) -> sorted list of (since, KernelSpec), per backend."""

    def __init__(self) -> None:
        # backend name ("*" for shared kernels) -> (domain, op) -> sorted [(since, spec)]
        self._tables: dict[str, dict[tuple[str, str], list[tuple[int, KernelSpec]]]] = {}
        # Open scoped() blocks: each records (backend, spec, the spec it replaced or None).
        self._journals: list[list[tuple[str, KernelSpec, KernelSpec | None]]] = []

    def register(self, backend: str, spec: KernelSpec, *, replace: bool = False) -> None:
        """Add ``spec`` to ``backend``'s table ("*": shared). The same op, domain and ``since``
        twice is an error naming both definitions, unless ``replace`` (or both came from
        ``register_op``, ``spec.custom``)."""
        table = self._tables.setdefault(backend, {})
        entries = table.setdefault((spec.domain, spec.op_type), [])
        old = next((e for s, e in entries if s == spec.since), None)
        if old is not None and not replace and not (old.custom and spec.custom):
            where = "every backend" if backend == "*" else f"backend {backend!r}"
            raise KernelRegistrationError(
                f"kernel {spec.name} registered twice for {where}: first {old.function} at {old.location}, "
                f"again {spec.function} at {spec.location}; pass replace=True to replace it on purpose, "
                "or register the new op under another name or domain")
        if old is not None:
            entries[:] = [(s, e) for s, e in entries if e is not old]
        bisect.insort(entries, (spec.since, spec), key=lambda e: e[0])
        for journal in self._journals:
            journal.append((backend, spec, old))

    def unregister(self, backend: str, op_type: str, since: int, domain: str = "") -> None:
        entries = self._tables.get(backend, {}).get((domain, op_type), [])
        entries[:] = [(s, spec) for s, spec in entries if s != since]

    def where(self, op_type: str, domain: str = "") -> list[str]:
        """The tables holding ``op_type`` at any version: "*" (every backend) and backend names."""
        return sorted(b for b, table in self._tables.items() if table.get((domain, op_type)))

    def shape_rule(self, op_type: str, opset: int, domain: str = "") -> Callable | None:
        """The ``output_shapes`` rule for an op at ``opset``: the shared kernel's, else the first
        backend override's that has one (shapes do not depend on the backend)."""
        for backend in ("*", *self.backends()):
            spec = self.resolve(op_type, opset, domain, backend)
            if spec is not None and spec.output_shapes is not None:
                return spec.output_shapes
        return None

    @contextlib.contextmanager
    def scoped(self):
        """Undo, on exit, the registrations made inside except Mithril's own (``KernelSpec.builtin``:
        a backend's overrides imported meanwhile stay): the replaced kernels come back."""
        journal: list[tuple[str, KernelSpec, KernelSpec | None]] = []
        self._journals.append(journal)
        try:
            yield self
        finally:
            self._journals[:] = [j for j in self._journals if j is not journal]
            for backend, spec, old in reversed(journal):
                if spec.builtin:
                    continue
                entries = self._tables.get(backend, {}).get((spec.domain, spec.op_type), [])
                entries[:] = [(s, e) for s, e in entries if e is not spec]
                if old is not None and all(s != old.since for s, _ in entries):
                    bisect.insort(entries, (old.since, old), key=lambda e: e[0])

    def resolve(self, op_type: str, opset: int, domain: str = "", backend: str = "*") -> KernelSpec | None:
        """Newest kernel with since <= opset; a backend override beats the shared kernel
        only when its ``since`` is at least as new."""
        best = None
        for table_name in ("*", backend) if backend != "*" else ("*",):
            entries = self._tables.get(table_name, {}).get((domain, op_type), [])
            idx = bisect.bisect_right(entries, opset, key=_since)
            if idx:
                candidate = entries[idx - 1][1]
                if best is None or candidate.since >= best.since:
                    best = candidate
        return best

    def ops(self, backend: str = "*") -> set[tuple[str, str]]:
        ops = {key for key, entries in self._tables.get("*", {}).items() if entries}
        if backend != "*":
            ops |= {key for key, entries in self._tables.get(backend, {}).items() if entries}
        return ops

    def domains(self, backend: str = "*") -> set[str]:
        """Every operator domain with at least one kernel (shared, or this backend's)."""
        return {domain for domain, _ in self.ops(backend)}

    def versions(self, op_type: str, domain: str = "", backend: str = "*") -> list[int]:
        return [s for s, _ in self._tables.get(backend, {}).get((domain, op_type), [])]

    def entries(self, op_type: str, domain: str = "", backend: str = "*") -> list[KernelSpec]:
        """The kernels registered for one op in one table ("*": the shared one), oldest first."""
        return [spec for _, spec in self._tables.get(backend, {}).get((domain, op_type), [])]

    def backends(self) -> list[str]:
        """Backends with overrides registered so far ("*", the shared table, not among them)."""
        return sorted(b for b in self._tables if b != "*")

    def ranges(self, op_type: str, domain: str = "", backend: str = "*") -> list[tuple[int, int | None, KernelSpec]]:
        """What ``resolve`` picks on ``backend`` for each opset: (first, last or None, spec) runs
        of consecutive opsets resolved to the same kernel, oldest first.

        >>> import mithril.backends.kernels
        >>> [(a, b, s.name) for a, b, s in REGISTRY.ranges("Softmax")]
        [(1, 12, 'Softmax-1'), (13, None, 'Softmax-13')]
        """
        starts = sorted({*self.versions(op_type, domain), *self.versions(op_type, domain, backend)})
        out: list[list] = []
        for since in starts:
            spec = self.resolve(op_type, since, domain, backend)
            if out and out[-1][2] is spec:
                continue
            if out:
                out[-1][1] = since - 1
            out.append([since, None, spec])
        return [tuple(r) for r in out]


def _since(entry: tuple[int, KernelSpec]) -> int:
    return entry[0]


REGISTRY = KernelRegistry()


def kernel(op_type: str, *, since: int = 1, domain: str = "", replace: bool = False, **meta):
    """Register a shared kernel (used by every backend unless overridden). The function is
    returned undecorated: other kernels call it directly, over their own ``xp``. ``replace=True``
    replaces a kernel registered for the same op, domain and ``since`` (otherwise an error)."""

    def wrap(fn):
        REGISTRY.register("*", make_spec(fn, op_type, domain, since, **meta), replace=replace)
        return fn

    return wrap


def override(backend: str, op_type: str, *, since: int = 1, domain: str = "", reason: str = "",
             replace: bool = False, **meta):
    """Register a backend-specific kernel for a real semantic gap or for speed, which ``reason``
    names (``reason="speed: lax.erf is one XLA op"``)."""

    def wrap(fn):
        REGISTRY.register(backend, make_spec(fn, op_type, domain, since, reason=reason, **meta), replace=replace)
        return fn

    return wrap


def missing_kernel_help(backend: str, nodes) -> tuple[dict[str, str], str]:
    """For nodes ``(label, domain, op_type)`` without a kernel on ``backend``: a note per node
    registered only for other backends, and a line saying how to register a kernel (empty when
    all are ops of Mithril's own domains that no backend has)."""
    notes: dict[str, str] = {}
    custom: list[tuple[str, str]] = []
    for label, domain, op_type in nodes:
        tables = [t for t in REGISTRY.where(op_type, domain) if t != "*"]
        if tables:
            notes[label] = f"registered for {', '.join(tables)} only"
        if tables or domain not in STANDARD_DOMAINS:
            custom.append((domain, op_type))
    if not custom:
        return notes, ""
    from .table import BACKENDS

    domain, op_type = custom[0]
    owner = f"ml.{BACKENDS[backend].class_name}" if backend in BACKENDS else "backend"
    args = f"{op_type!r}, fn" + ("" if domain == CUSTOM_DOMAIN else f", domain={domain!r}")
    return notes, (f"register a kernel (docs/custom_ops.md): {owner}.register_op({args}) for this backend, "
                   f"in its framework, or ml.register_op({args}) for every backend, over xp")


# Runtime arguments a standard kernel takes where it declares them (plan.RUNTIME_ARGUMENTS).
_RUNTIME = ("xp", "rng", "ctx")


class StandardKernels:
    """The standard ONNX kernels a fused op runs (its ``standard_ops``), resolved when the plan is
    built: on the plan's backend (XLA's Conv on JAX, torch's on Torch), at the model's ai.onnx
    opset, or at the oldest version the fused op's call is written for where that is newer (an op
    the model's opset predates, such as Gelu-20 under com.microsoft's Gelu, is its first version).
    A fused kernel receives it as ``standard`` and calls ``standard("Conv", x, w, b, pads=...,
    xp=xp, ctx=ctx)``; each kernel gets the runtime arguments it declares. An attribute the
    standard kernel does not implement is an error naming the node (unless it is unset or that
    op's schema default), never dropped.

    >>> import mithril.backends.kernels
    >>> standard = StandardKernels(REGISTRY.resolve("FusedConv", 1, "com.microsoft"), {"": 13}, "*",
    ...                            NodeInfo("conv1", "FusedConv", "com.microsoft", 1))
    >>> standard.kernels["Conv"].name, standard.kernels["Relu"].name
    ('Conv-1', 'Relu-6')
    """

    def __init__(self, spec: KernelSpec, opsets: dict[str, int], backend: str, node: NodeInfo):
        from ..onnx_bridge.schema import attribute_defaults

        self.node = node
        # A model that imports no ai.onnx opset: the newest kernels.
        self.opset = opsets.get("", opsets.get("ai.onnx"))
        self.kernels: dict[str, KernelSpec] = {}
        self.defaults: dict[str, dict] = {}
        for op_type, oldest in spec.standard_ops:
            first = min(REGISTRY.versions(op_type) + REGISTRY.versions(op_type, backend=backend), default=oldest)
            version = max(self.opset or 10**6, oldest, first)
            found = REGISTRY.resolve(op_type, version, "", backend)
            if found is None:
                raise MithrilError(f"{node.op_type} runs {op_type}, which has no kernel on backend {backend!r} "
                                   f"at ai.onnx opset {version} (node {node.name!r})")
            self.kernels[op_type] = found
            self.defaults[op_type] = attribute_defaults(op_type, version)

    def __call__(self, op_type: str, *inputs, **kwargs):
        spec = self.kernels.get(op_type)
        if spec is None:
            raise MithrilError(f"{self.node.op_type} calls {op_type}, which its kernel does not declare among "
                               f"its standard_ops {sorted(self.kernels)} (node {self.node.name!r})")
        call = {}
        for name, value in kwargs.items():
            if name in spec.accepts or spec.accepts_var_keyword:
                call[name] = value
            elif name in _RUNTIME or value is None or _same(self.defaults[op_type].get(name, _UNSET), value):
                continue
            else:
                raise UnsupportedAttributeError(
                    f"{self.node.op_type} runs {spec.name} (ai.onnx opset {self.opset}), which does not implement "
                    f"attribute {name}={value!r}",
                    node=self.node.name, op_type=self.node.op_type, opset=self.node.opset)
        return spec.fn(*inputs, **call)

    def __repr__(self) -> str:
        return f"<standard kernels of {self.node.op_type}: {', '.join(s.name for s in self.kernels.values())}>"


_UNSET = object()


def _same(default, value) -> bool:
    """An attribute value equal to the schema's default (floats within rounding)."""
    if isinstance(default, float) and isinstance(value, float):
        return default == value or abs(default - value) <= 1e-7 * max(1.0, abs(default))
    if isinstance(default, (tuple, list)) and isinstance(value, (tuple, list)):
        return tuple(default) == tuple(value)
    return default is not _UNSET and type(default) is type(value) and default == value


@dataclass(frozen=True)
class NodeInfo:
    """What a kernel may know about its node beyond inputs and attributes."""

    name: str
    op_type: str
    domain: str
    opset: int
    # numpy dtypes of outputs where the graph declares them (Cast-like ops, random ops).
    output_dtypes: tuple = ()
