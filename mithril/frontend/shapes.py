"""Symbolic shapes and types for the logical-model frontend.

A terminal's shape is a :class:`ShapeNode`: a prefix of dims, at most one variadic :class:`Var`
(any number of dims, written ``...``) and a suffix of dims. Dims, variadics, shapes and types are
union-find nodes: connecting two terminals unifies their nodes, so what one block learns (a fixed
dim, a rank) every block sharing the node sees.

Every mutation goes through :func:`tracked_setattr`, which logs it on the open :func:`transaction`'s trail:
a failed connection is undone completely, and the model stays as it was before the failing line.
"""

from __future__ import annotations

import contextlib
import itertools

from ..dtypes import DType
from ..errors import ModelError

_trail: list | None = None
_mutations = itertools.count()
mutation_count = 0  # bumped on every logged change; the constraint solver stops when it stands still


class Conflict(Exception):
    """Two shapes or types cannot agree; callers re-raise it naming the terminals involved."""


def tracked_setattr(obj, attr: str, value) -> None:
    """``setattr`` logged on the open :func:`transaction`'s trail, so a failed connection undoes it."""
    global mutation_count
    if _trail is not None:
        old = getattr(obj, attr)
        _trail.append(lambda: setattr(obj, attr, old))
    setattr(obj, attr, value)
    mutation_count = next(_mutations)


def log_undo(undo) -> None:
    """Register an undo step for a structural change (a list append, a dict entry)."""
    if _trail is not None:
        _trail.append(undo)


@contextlib.contextmanager
def transaction():
    """Everything changed inside is undone if the block raises."""
    global _trail
    outer = _trail
    trail = [] if outer is None else outer
    mark = len(trail)
    _trail = trail
    try:
        yield
    except BaseException:
        for undo in reversed(trail[mark:]):
            undo()
        del trail[mark:]
        raise
    finally:
        _trail = outer


# -- dims and variadics -------------------------------------------------------------------------
class Dim:
    """One axis length: a known int or a symbol. ``symbol`` is the name it was declared with."""

    __slots__ = ("parent", "value", "symbol", "user")

    def __init__(self, value: int | None = None, symbol: str | None = None, user: bool = False):
        self.parent: Dim | None = None
        self.value = value
        self.symbol = symbol
        self.user = user  # named by the user (IOKey shape), preferred when displaying

    def root(self) -> Dim:
        d = self
        while d.parent is not None:
            d = d.parent
        return d


def unify_dims(a: Dim, b: Dim) -> None:
    a, b = a.root(), b.root()
    if a is b:
        return
    if a.value is not None and b.value is not None:
        if a.value != b.value:
            raise Conflict(f"{a.value} != {b.value}")
        tracked_setattr(b, "parent", a)
        return
    if a.value is None and (b.value is not None or (b.user and not a.user)):
        a, b = b, a
    tracked_setattr(b, "parent", a)


def fix_dim(d: Dim, value: int) -> None:
    d = d.root()
    if d.value is None:
        tracked_setattr(d, "value", int(value))
    elif d.value != value:
        raise Conflict(f"{d.value} != {value}")


class Var:
    """A run of zero or more dims (``...``); bound to a (prefix, var, suffix) once known."""

    __slots__ = ("binding", "symbol")

    def __init__(self, symbol: str = "..."):
        self.binding: tuple | None = None
        self.symbol = symbol


# -- shapes -------------------------------------------------------------------------------------
class ShapeNode:
    """The shape of a terminal: ``(prefix dims, Var or None, suffix dims)`` behind a union-find root."""

    __slots__ = ("parent", "repr")

    def __init__(self, prefix=(), var: Var | None = None, suffix=()):
        self.parent: ShapeNode | None = None
        self.repr = (tuple(prefix), var, tuple(suffix))

    @classmethod
    def unknown(cls) -> ShapeNode:
        return cls((), Var(), ())

    @classmethod
    def of(cls, dims) -> ShapeNode:
        return cls(tuple(d if isinstance(d, Dim) else Dim(d) for d in dims))

    def root(self) -> ShapeNode:
        n = self
        while n.parent is not None:
            n = n.parent
        return n

    def normalized(self) -> tuple[tuple[Dim, ...], Var | None, tuple[Dim, ...]]:
        prefix, var, suffix = self.root().repr
        while var is not None and var.binding is not None:
            p, var, s = var.binding
            prefix, suffix = prefix + p, s + suffix
        return tuple(d.root() for d in prefix), var, tuple(d.root() for d in suffix)

    def dims(self) -> list[Dim] | None:
        """The dims when the rank is known, else None."""
        prefix, var, suffix = self.normalized()
        return None if var is not None else list(prefix + suffix)

    def values(self) -> list[int | None] | None:
        dims = self.dims()
        return None if dims is None else [d.value for d in dims]

    def static(self) -> tuple[int, ...] | None:
        vals = self.values()
        return None if vals is None or any(v is None for v in vals) else tuple(vals)


def unify_shapes(a: ShapeNode, b: ShapeNode) -> bool:
    """Make ``a`` and ``b`` one shape; False when it cannot be decided yet (two variadics whose
    rank is open on opposite sides), in which case the caller retries later."""
    ra, rb = a.root(), b.root()
    if ra is rb:
        return True
    if not _unify_repr(ra.normalized(), rb.normalized()):
        return False
    tracked_setattr(rb, "parent", ra)
    return True


def _unify_seq(xs, ys) -> None:
    for x, y in zip(xs, ys):
        unify_dims(x, y)


def _unify_repr(a, b) -> bool:
    p1, v1, s1 = a
    p2, v2, s2 = b
    if v1 is None and v2 is None:
        if len(p1) + len(s1) != len(p2) + len(s2):
            raise Conflict(f"rank {len(p1) + len(s1)} != {len(p2) + len(s2)}")
        _unify_seq(p1 + s1, p2 + s2)
        return True
    if v1 is None:
        (p1, v1, s1), (p2, v2, s2) = (p2, v2, s2), (p1, v1, s1)
    if v2 is None:
        dims = p2 + s2
        if len(dims) < len(p1) + len(s1):
            raise Conflict(f"rank {len(dims)} < {len(p1) + len(s1)}")
        _unify_seq(p1, dims[: len(p1)])
        _unify_seq(s1, dims[len(dims) - len(s1):])
        tracked_setattr(v1, "binding", (dims[len(p1): len(dims) - len(s1)], None, ()))
        return True
    if v1 is v2:
        if len(p1) != len(p2) or len(s1) != len(s2):
            raise Conflict("a shape cannot contain itself")
        _unify_seq(p1 + s1, p2 + s2)
        return True
    k, m = min(len(p1), len(p2)), min(len(s1), len(s2))
    _unify_seq(p1[:k], p2[:k])
    _unify_seq(s1[len(s1) - m:], s2[len(s2) - m:])
    p1, p2, s1, s2 = p1[k:], p2[k:], s1[: len(s1) - m], s2[: len(s2) - m]
    if not p1 and not s1:
        tracked_setattr(v1, "binding", (p2, v2, s2))
    elif not p2 and not s2:
        tracked_setattr(v2, "binding", (p1, v1, s1))
    else:
        return False
    return True


# -- types --------------------------------------------------------------------------------------
KINDS = (float, int, bool)


def kind_of(t) -> type | None:
    if t is None or t in KINDS:
        return t
    if isinstance(t, DType):
        return bool if t.name == "bool" else float if t.is_floating else int
    raise ModelError(f"not a Mithril type: {t!r}")


class TypeNode:
    """A terminal's element type: None (any), a kind (float, int, bool) or a concrete ml dtype."""

    __slots__ = ("parent", "value")

    def __init__(self, value=None):
        kind_of(value)  # validates
        self.parent: TypeNode | None = None
        self.value = value

    def root(self) -> TypeNode:
        n = self
        while n.parent is not None:
            n = n.parent
        return n


def unify_types(a: TypeNode, b: TypeNode) -> None:
    a, b = a.root(), b.root()
    if a is b:
        return
    va, vb = a.value, b.value
    if va is not None and vb is not None and va != vb:
        if kind_of(va) != kind_of(vb) or (isinstance(va, DType) and isinstance(vb, DType)):
            raise Conflict(f"{type_name(va)} != {type_name(vb)}")
    merged = va if vb is None or isinstance(va, DType) else vb
    if merged is not a.value:
        tracked_setattr(a, "value", merged)
    tracked_setattr(b, "parent", a)


def type_name(t) -> str:
    if t is None:
        return "any"
    return t.__name__ if t in KINDS else t.name


# -- display ------------------------------------------------------------------------------------
class Namer:
    """Readable, unique names for symbolic dims and variadics within one printout."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self.used: set[str] = set()

    def _name(self, obj, base: str) -> str:
        key = id(obj)
        if key not in self.names:
            name = base
            k = 1
            while name in self.used:
                name, k = f"{base}{k}", k + 1
            self.names[key] = name
            self.used.add(name)
        return self.names[key]

    def dim(self, d: Dim) -> str:
        d = d.root()
        return str(d.value) if d.value is not None else self._name(d, d.symbol or "d")

    def shape(self, node: ShapeNode) -> str:
        prefix, var, suffix = node.normalized()
        parts = [self.dim(d) for d in prefix]
        if var is not None:
            parts.append("..." + self._name(var, var.symbol.lstrip(".") or "v"))
        parts += [self.dim(d) for d in suffix]
        return "[" + ", ".join(parts) + "]"
