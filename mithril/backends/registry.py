"""The kernel registry: each ONNX op written once, against an array namespace.

A kernel is a plain function. Its positional parameters are the node's inputs (``None`` for a
missing optional input; variadic inputs arrive as further positional arguments); its
keyword-only parameters are the node's attributes, named as in ONNX, with defaults filled
from the ``onnx.defs`` schema. A kernel may also declare any of these keyword-only
parameters, which the lowering supplies:

``xp``           the backend's array namespace (``numpy`` for NumpyBackend)
``num_outputs``  how many outputs the node asks for (for ops with optional outputs)
``rng``          a ``numpy.random.Generator`` seeded from the backend (random ops)
``opset``        the opset version in force for the node's domain
``node``         a :class:`NodeInfo` (name, op type, output dtypes known from the graph)

A kernel returns one array, or a tuple of arrays for a node with several outputs.
Sequences are Python lists; an empty Optional is ``None``.

    @kernel("Softmax", since=13)
    def softmax(x, *, axis, xp):
        e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
        return e / xp.sum(e, axis=axis, keepdims=True)

Resolution picks, for ``(domain, op_type)``, the entry with the newest ``since`` that is
<= the model's opset for that domain. ``@override("jax", "Conv", since=11)`` registers a
backend-specific kernel that wins over the shared one on that backend.
"""

from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field


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
    accepts: frozenset[str] = field(default_factory=frozenset)
    accepts_var_keyword: bool = False

    @property
    def name(self) -> str:
        return f"{self.domain + '::' if self.domain else ''}{self.op_type}-{self.since}"


def _make_spec(fn, op_type, domain, since, **meta) -> KernelSpec:
    params = inspect.signature(fn).parameters.values()
    accepts = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
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

    def register(self, backend: str, spec: KernelSpec) -> None:
        table = self._tables.setdefault(backend, {})
        entries = table.setdefault((spec.domain, spec.op_type), [])
        for since, _ in entries:
            if since == spec.since:
                raise ValueError(f"kernel {spec.name} registered twice for backend {backend!r}")
        bisect.insort(entries, (spec.since, spec), key=lambda e: e[0])

    def unregister(self, backend: str, op_type: str, since: int, domain: str = "") -> None:
        entries = self._tables.get(backend, {}).get((domain, op_type), [])
        entries[:] = [(s, spec) for s, spec in entries if s != since]

    def resolve(self, op_type: str, opset: int, domain: str = "", backend: str = "*") -> KernelSpec | None:
        """Newest kernel with since <= opset; a backend override beats the shared kernel
        only when its ``since`` is at least as new."""
        best = None
        for table_name in ("*", backend) if backend != "*" else ("*",):
            entries = self._tables.get(table_name, {}).get((domain, op_type), [])
            idx = bisect.bisect_right([s for s, _ in entries], opset)
            if idx:
                candidate = entries[idx - 1][1]
                if best is None or candidate.since >= best.since:
                    best = candidate
        return best

    def ops(self, backend: str = "*") -> set[tuple[str, str]]:
        ops = set(self._tables.get("*", {}))
        if backend != "*":
            ops |= set(self._tables.get(backend, {}))
        return ops

    def domains(self, backend: str = "*") -> set[str]:
        """Every operator domain with at least one kernel (shared, or this backend's)."""
        return {domain for domain, _ in self.ops(backend)}

    def versions(self, op_type: str, domain: str = "", backend: str = "*") -> list[int]:
        return [s for s, _ in self._tables.get(backend, {}).get((domain, op_type), [])]


REGISTRY = KernelRegistry()


def kernel(op_type: str, *, since: int = 1, domain: str = "", **meta):
    """Register a shared kernel (used by every backend unless overridden)."""

    def wrap(fn):
        REGISTRY.register("*", _make_spec(fn, op_type, domain, since, **meta))
        return fn

    return wrap


def override(backend: str, op_type: str, *, since: int = 1, domain: str = "", **meta):
    """Register a backend-specific kernel for a real semantic gap or for speed."""

    def wrap(fn):
        REGISTRY.register(backend, _make_spec(fn, op_type, domain, since, **meta))
        return fn

    return wrap


@dataclass(frozen=True)
class NodeInfo:
    """What a kernel may know about its node beyond inputs and attributes."""

    name: str
    op_type: str
    domain: str
    opset: int
    # numpy dtypes of outputs where the graph declares them (Cast-like ops, random ops).
    output_dtypes: tuple = ()
