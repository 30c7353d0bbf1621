"""ggml rules, Python side: for each ONNX op, when a node can run in ggml and the ggml calls
that build it.

A family module (:mod:`.elementwise`, :mod:`.movement`, :mod:`.nn`, :mod:`.attention`,
:mod:`.recurrent`, :mod:`.image`) registers its ops with :func:`ggml_op` when it is imported
(:mod:`mithril.backends.ggml.program` imports them all; this package holds only the registry
and the :class:`Builder`). A rule has two parts: ``check(pn)`` says why a node cannot run in
ggml (None when it can) beyond what :func:`mithril.backends.ggml.program.why_not_ggml` checks
for every node (static shapes, at most four dims, the dtypes the rule takes: float32 by
default; bools as float32 0/1 and int8/int16/uint8/uint16 as exact float32 where a rule says
so), and ``build(pn, g)`` returns the node's output tensors, made
with ggml calls through the :class:`Builder` ``g``::

    @ggml_op("Relu")
    def relu(pn, g):
        return g.ggml.ggml_relu(g.ctx, g.t(pn.inputs[0]))

ggml aborts the process when one of its assertions fails (a broadcast it cannot do, a
non-contiguous operand, more than four dims), so ``check`` refuses every such case first: a
rule's ``build`` only ever sees nodes its ``check`` accepted. Shapes cross into ggml in one
place, :func:`ne`: ggml's ``ne[0]`` is the innermost (last NumPy) dimension.

``folded`` lists input positions read at build time (Reshape's shape, Slice's starts): constants,
or graph inputs, when the program is built at the first evaluate for their values
(:class:`mithril.backends.ggml.program.DeferredGGMLProgram`). ``indices`` lists inputs read as
int32 row indices (Gather's): int64 ones are narrowed at the segment boundary, with a range
check. ``dtype_only`` lists inputs of which only the dtype is read (CastLike's target).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import numpy as np

from ...plan import PlanNode, PlanValue
from ...segmented.rules import NativeRule, RuleTable

MAX_DIMS = 4  # GGML_MAX_DIMS
F32 = np.dtype(np.float32)
BOOL = np.dtype(np.bool_)  # held as float32 0.0 / 1.0 inside ggml, converted at a segment's edges
# Integers float32 holds exactly: ops that only compare, pick or move them (not arithmetic,
# which would not wrap as the integer type does) take them as float32.
SMALL_INTS = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.uint8), np.dtype(np.uint16))
EXACT = (F32, BOOL, *SMALL_INTS)  # what data movement and comparisons take


def _bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# Half types ggml stores as they are (a Cast's input or output): name -> NumPy dtype.
HALF = {"GGML_TYPE_F16": np.dtype(np.float16), "GGML_TYPE_BF16": _bfloat16()}
INDEX_DTYPES = frozenset({np.dtype(np.int64), np.dtype(np.int32)})


def ne(shape) -> list[int]:
    """ggml's extents of a NumPy shape: reversed (``ne[0]`` is the last axis), padded with 1s to
    four. The one place where the dimension order turns around."""
    dims = [int(d) for d in reversed(tuple(shape))]
    if len(dims) > MAX_DIMS:
        raise ValueError(f"ggml tensors have at most {MAX_DIMS} dims, not {len(shape)}")
    return dims + [1] * (MAX_DIMS - len(dims))


def ggml_axis(axis: int, rank: int) -> int:
    """ggml's dimension index of NumPy axis ``axis`` (negative allowed) of a rank-``rank`` value."""
    return rank - 1 - (axis % max(rank, 1))


@dataclass(frozen=True, kw_only=True)
class GGMLOp(NativeRule):
    """One op's rule (see the module docstring)."""

    build: Callable[[PlanNode, Builder], object]
    indices: tuple[int, ...] = ()
    dtypes: frozenset = frozenset({np.dtype(np.float32)})  # of the other inputs and the outputs
    dtype_only: tuple[int, ...] = ()  # inputs read for their dtype alone (CastLike's target)

    @property
    def function(self):
        return self.build

    def buffers(self, pn: PlanNode):
        # Inputs read for their dtype alone are no buffers; nor are omitted optional outputs.
        for i, v in super().buffers(pn):
            if (i is None and v.name) or (i is not None and i not in self.dtype_only):
                yield i, v

    def value_problem(self, pn: PlanNode, position: int | None, v: PlanValue) -> str | None:
        dtypes = INDEX_DTYPES if position is not None and position in self.indices else self.dtypes
        if v.dtype not in dtypes:
            return f"dtype {v.dtype} of {v.name!r} (ggml here computes {', '.join(sorted(map(str, dtypes)))})"
        if v.shape is not None and len(v.shape) > MAX_DIMS:
            return f"{v.name!r} has {len(v.shape)} dims (ggml has at most {MAX_DIMS})"
        if v.static_shape is not None and prod(v.static_shape) == 0:
            return f"{v.name!r} is empty"
        return None

    def node_problem(self, pn: PlanNode) -> str | None:
        try:
            return super().node_problem(pn)
        except Exception as exc:  # a rule that cannot read this node's attributes: NumPy runs it
            return f"its ggml rule failed on it ({type(exc).__name__}: {exc})"


# The ggml rules, by (domain, op type) and opset (the segmented layer's rule table).
OPS = RuleTable("ggml rule")


def ggml_op(*op_types: str, domain: str = "", since: int = 1, check=None, folded: tuple[int, ...] = (),
            indices: tuple[int, ...] = (), dtypes=(F32,), dtype_only: tuple[int, ...] = ()):
    """Registers ``build`` (and ``check``) for each of ``op_types`` from opset ``since`` on.
    ``dtypes``: the types its inputs (but ``folded`` and ``indices``) and outputs may have; a
    bool is held as float32 0/1 inside a ggml graph (:data:`BOOL`)."""

    def register(build):
        for op_type in op_types:
            OPS.add(GGMLOp(op_type=op_type, domain=domain, since=since, build=build, check=check,
                           folded=tuple(folded), indices=tuple(indices),
                           dtypes=frozenset(np.dtype(d) for d in dtypes), dtype_only=tuple(dtype_only)))
        return build

    return register


def const_value(pn: PlanNode, i: int, default=None):
    """The value of input ``i`` when it is a constant (None when absent), as a NumPy array."""
    v = pn.inputs[i] if i < len(pn.inputs) else None
    if v is None:
        return default
    return np.asarray(v.value)


def fill_value(pn: PlanNode) -> np.ndarray:
    """The values a ConstantOfShape or EyeLike node ``pn`` fills its output with, in its shape."""
    if pn.op_type == "EyeLike":
        k = int(pn.kwargs.get("k", 0))
        return np.eye(*pn.outputs[0].static_shape, k=k)
    value = pn.kwargs.get("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.broadcast_to(value.reshape(()) if value.size == 1 else value, pn.outputs[0].static_shape)


class Builder:
    """What a rule builds with: ``ggml`` (the bindings), ``ctx`` (the segment's ggml context),
    ``t(v)`` (the tensor of a plan value), ``weight(v, layout)`` (a parameter or constant held
    by the program, in ggml's layout for its use), and shape helpers in NumPy order."""

    def __init__(self, ggml, ctx, tensors: dict, weight: Callable, constant: Callable, bounds: dict):
        self.ggml = ggml
        self.ctx = ctx
        self._tensors = tensors
        self._weight = weight
        self._constant = constant
        self._bounds = bounds
        self.producers: dict[PlanValue, PlanNode] = {}  # set by the program: who made each value
        # Set by the program: float32 matrix weights are read in place by matmuls (``linear``).
        self.f32_in_place = False

    def transposed_weight(self, v: PlanValue | None) -> PlanValue | None:
        """The weight ``W`` when ``v`` is ``Transpose(W)`` of a matrix weight (a Linear layer's
        ``[out, in]`` weight): a matmul reads ``W`` itself by rows, quantizable, and the
        Transpose, read by nothing else, drops out of the ggml graph."""
        pn = self.producers.get(v)
        if pn is None or pn.op_type != "Transpose" or pn.domain != "":
            return None
        w = pn.inputs[0]
        perm = pn.kwargs.get("perm")
        if not self.is_weight(w) or len(w.static_shape) != 2 or (perm is not None and list(perm) != [1, 0]):
            return None
        return w

    def t(self, v: PlanValue):
        """The tensor holding ``v`` (a segment input, a weight, or an earlier node's output)."""
        return self._tensors[v]

    def weight(self, v: PlanValue, layout: str = "plain"):
        """``v`` (a parameter or constant) as a weight tensor: ``"plain"`` keeps its shape,
        ``"t"`` transposes a matrix (``[K, N]`` stored as ``[N, K]``, ggml's ``mul_mat`` operand),
        ``"rows"`` keeps a matrix read by rows; those two may be in the program's weight type
        (float16, bfloat16) or quantized."""
        return self._weight(v, layout)

    def linear(self, v: PlanValue, layout: str, x):
        """``x @ W`` for the matrix weight ``v`` read in ``layout`` (``"t"``: ``v`` is ``[K, N]``;
        ``"rows"``: ``v`` is ``[N, K]``), through ``ggml_mul_mat``: ``x`` is zero-padded to the
        stored rows' length (quantized rows are whole blocks), and the results of the zero rows
        the stored matrix may have (quantize.ROW_MULTIPLE) are dropped: ``[.., M, N]``. A float32
        ``[K, N]`` weight is read in place where ggml can (``f32_in_place``): ``mul_mat`` of its
        transposed view, no transposed copy made when it loads."""
        if layout == "t" and self.f32_in_place:
            w = self._weight(v, "plain")
            return self.ggml.ggml_mul_mat(self.ctx, self.ggml.ggml_transpose(self.ctx, w), self.contiguous(x))
        w = self._weight(v, layout, True)
        extra = int(w.contents.ne[0]) - int(x.contents.ne[0])
        if extra:
            x = self.ggml.ggml_pad(self.ctx, self.contiguous(x), extra, 0, 0, 0)
        y = self.ggml.ggml_mul_mat(self.ctx, w, x)
        n = v.static_shape[1] if layout == "t" else v.static_shape[0]
        if int(y.contents.ne[0]) != n:
            c = y.contents
            y = self.ggml.ggml_view_4d(self.ctx, y, n, c.ne[1], c.ne[2], c.ne[3], c.nb[1], c.nb[2], c.nb[3], 0)
        return y

    def constant(self, array: np.ndarray):
        """A float32 tensor holding ``array`` (made at build time, kept by the program)."""
        return self._constant(np.ascontiguousarray(array, dtype=np.float32))

    def constant_i32(self, array: np.ndarray):
        """An int32 tensor holding ``array`` (row indices known at build time)."""
        return self._constant(np.ascontiguousarray(array, dtype=np.int32))

    def index(self, v: PlanValue, rows: int, pn: PlanNode):
        """The int32 tensor of the row indices ``v``, which ``pn`` reads from a ``rows``-row table:
        each call wraps negative indices and refuses out-of-range ones before ggml reads them.
        Indices computed in this graph (ArgMax, TopK, a constant fill) must be in range by
        construction: ggml asserts on a row outside the table while it computes, which no
        check can catch then."""
        t = self._tensors[v]
        if t.contents.type != self.ggml.GGML_TYPE_I32:
            bound = self.computed_bound(v)
            if bound is None or not 0 <= bound[0] <= bound[1] < rows:
                from ..guard import GGMLPreconditionError

                found = "not known when the graph is built" if bound is None else f"in [{bound[0]}, {bound[1]}]"
                raise GGMLPreconditionError(
                    f"ggml would abort on ggml_get_rows: indices {v.name!r} computed in the graph, {found}, for a "
                    f"table of {rows} rows", node=pn.label, op_type=pn.op_type, opset=pn.opset)
            return self.ggml.ggml_cast(self.ctx, self.contiguous(t), self.ggml.GGML_TYPE_I32)
        bound = self._bounds.get(v)
        if bound is None or bound[0] > rows:
            self._bounds[v] = (rows, pn)
        return t

    def computed_bound(self, v: PlanValue) -> tuple[int, int] | None:
        """(least, greatest) of the integer values ``v`` computed in this graph takes, where its
        producer fixes them: ArgMax/ArgMin and TopK's indices (positions along their axis), a
        ConstantOfShape or EyeLike fill (its values); None otherwise."""
        pn = self.producers.get(v)
        if pn is None or pn.domain != "":
            return None
        if pn.op_type in ("ArgMax", "ArgMin") or (pn.op_type == "TopK" and v is pn.outputs[1]):
            shape = pn.inputs[0].static_shape
            axis = int(pn.kwargs.get("axis", -1 if pn.op_type == "TopK" else 0)) % len(shape)
            return 0, int(shape[axis]) - 1
        if pn.op_type in ("ConstantOfShape", "EyeLike"):
            values = np.asarray(fill_value(pn))
            return (int(values.min()), int(values.max())) if values.size else None
        return None

    def is_weight(self, v: PlanValue | None) -> bool:
        return v is not None and v.kind in ("param", "constant")

    def contiguous(self, x):
        """``x``, copied into a contiguous tensor when it is a strided view."""
        return x if self.ggml.ggml_is_contiguous(x) else self.ggml.ggml_cont(self.ctx, x)

    def clamp(self, x, lo: float, hi: float):
        """``x`` clamped to ``[lo, hi]`` in a new tensor: ``ggml_clamp`` writes into its operand
        (it returns a view of it), which may be a caller's array or a value read again later."""
        return self.ggml.ggml_clamp(self.ctx, self.ggml.ggml_cont(self.ctx, x), float(lo), float(hi))

    def reshape(self, x, shape):
        """``x`` (made contiguous if it is not) with the NumPy shape ``shape``."""
        g = self.ggml
        if not g.ggml_is_contiguous(x):
            x = g.ggml_cont(self.ctx, x)
        n = ne(shape)
        return g.ggml_reshape_4d(self.ctx, x, *n)

    def broadcast(self, x, shape):
        """``x`` repeated to the NumPy shape ``shape`` (its dims are 1 or equal to ``shape``'s)."""
        n = ne(shape)
        if list(x.contents.ne[:MAX_DIMS]) == n:
            return x
        return self.ggml.ggml_repeat_4d(self.ctx, x, *n)


class Stack:
    """Tensors concatenated along ggml dim ``dim`` as they are made, merged pairwise like a binary
    counter (two blocks of the same count become one): at most log2(n) + 1 blocks are alive at
    once, not n (ggml-alloc runs out of free blocks past about 256 tensors alive; see
    :func:`mithril.backends.ggml.guard.peak_allocations`), and each element is copied log2(n)
    times. ``reverse``: the tensors come last to first (a reverse recurrence)."""

    def __init__(self, g: Builder, dim: int, reverse: bool = False):
        self.g, self.dim, self.reverse = g, dim, reverse
        self.blocks: list[tuple[int, object]] = []

    def _cat(self, earlier, later):
        return self.g.ggml.ggml_concat(self.g.ctx, earlier, later, self.dim)

    def _merge(self, first, second):  # ``first`` made before ``second``
        return self._cat(second, first) if self.reverse else self._cat(first, second)

    def add(self, t) -> None:
        self.blocks.append((1, t))
        while len(self.blocks) > 1 and self.blocks[-1][0] == self.blocks[-2][0]:
            (n, a), (_, b) = self.blocks[-2], self.blocks[-1]
            self.blocks[-2:] = [(2 * n, self._merge(a, b))]

    def result(self):
        """Every tensor added, in order along ``dim``."""
        _, out = self.blocks[-1]
        for _, t in reversed(self.blocks[:-1]):
            out = self._merge(t, out)
        return out


__all__ = ["BOOL", "Builder", "EXACT", "GGMLOp", "HALF", "INDEX_DTYPES", "MAX_DIMS", "OPS", "SMALL_INTS", "Stack",
           "const_value", "ggml_axis", "ggml_op", "ne"]
