"""C kernels, Python side: for each ONNX op, when it can run in C and the call that runs it.

A family module (:mod:`.elementwise`, :mod:`.movement`, :mod:`.nn`, :mod:`.autodiff`) registers its
ops with :func:`c_kernel` when it is imported (:mod:`mithril.backends.c.render` imports them all;
this package holds only the registry, so the families import it without a cycle). A rule has two parts: ``check(pn)`` says why a node cannot run in C (None
when it can) beyond what :func:`mithril.backends.c.render.why_not_c` checks for every node
(static shapes, element types the C library has, folded inputs given as constants), and
``emit(pn, c)`` prints the node's call through the :class:`Emitter` ``c`` (a kernel that can
fail on the data, like Gather on an out-of-range index, returns nonzero and is printed with
``c.checked(call, problem)``: the segment stops and Python raises an error naming the node)::

    @c_kernel("Relu", dtypes=FLOATS)
    def relu(pn, c):
        x, y = pn.inputs[0], pn.outputs[0]
        c.line(f"mt_relu_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)});")

``folded`` lists input positions read at render time (Reshape's shape, Slice's starts): they
must be constants, are never passed as buffers, and their values are ``c.const(v)``.
``alias`` marks ops whose output is their first input's bytes (Reshape, Squeeze, ...): no copy
is emitted when the renderer can share the buffer. ``scratch(pn)`` gives the bytes of arena
scratch a node needs (im2col); the node reads it as ``c.scratch`` (a ``char *``).

The kernels themselves are C in ``mithril/backends/c/lib``: one function per op and element
type, named ``mt_<op>_<sfx>`` (``sfx`` from :data:`SUFFIX`), ``static inline``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np

from ...plan import PlanNode, PlanValue
from ...segmented.rules import NativeRule, RuleTable

# Element types the C kernels compute in: NumPy dtype -> (C type, kernel-name suffix).
COMPUTE_TYPES: dict[np.dtype, tuple[str, str]] = {
    np.dtype(np.float32): ("float", "f32"),
    np.dtype(np.float64): ("double", "f64"),
    np.dtype(np.int8): ("int8_t", "i8"),
    np.dtype(np.int16): ("int16_t", "i16"),
    np.dtype(np.int32): ("int32_t", "i32"),
    np.dtype(np.int64): ("int64_t", "i64"),
    np.dtype(np.uint8): ("uint8_t", "u8"),
    np.dtype(np.uint16): ("uint16_t", "u16"),
    np.dtype(np.uint32): ("uint32_t", "u32"),
    np.dtype(np.uint64): ("uint64_t", "u64"),
    np.dtype(np.bool_): ("mt_bool", "b8"),
}
# Storage-only element types (lib/mt_convert.h): held as their bits, converted by Cast and CastLike,
# moved by the ops that only move bytes (``storage=True``); no kernel computes in them.
STORAGE: dict[np.dtype, tuple[str, str]] = {
    np.dtype(np.float16): ("uint16_t", "f16"),
    np.dtype(ml_dtypes.bfloat16): ("uint16_t", "bf16"),
    np.dtype(ml_dtypes.float8_e4m3fn): ("uint8_t", "f8e4m3fn"),
    np.dtype(ml_dtypes.float8_e4m3fnuz): ("uint8_t", "f8e4m3fnuz"),
    np.dtype(ml_dtypes.float8_e5m2): ("uint8_t", "f8e5m2"),
    np.dtype(ml_dtypes.float8_e5m2fnuz): ("uint8_t", "f8e5m2fnuz"),
    np.dtype(ml_dtypes.float8_e8m0fnu): ("uint8_t", "f8e8m0"),
    np.dtype(ml_dtypes.float4_e2m1fn): ("uint8_t", "f4e2m1"),
    np.dtype(ml_dtypes.int4): ("uint8_t", "i4"),
    np.dtype(ml_dtypes.uint4): ("uint8_t", "u4"),
    np.dtype(ml_dtypes.int2): ("uint8_t", "i2"),
    np.dtype(ml_dtypes.uint2): ("uint8_t", "u2"),
}
ALL = frozenset(COMPUTE_TYPES)
# Every element type a C buffer can hold.
C_TYPES: dict[np.dtype, tuple[str, str]] = {**COMPUTE_TYPES, **STORAGE}
# Each C type's code in lib/mt_convert.h (MT_T_*): the numeric types, then the storage-only ones.
TYPE_CODE = {dt: i for i, dt in enumerate(C_TYPES)}
SUFFIX = {dt: s for dt, (_, s) in C_TYPES.items()}
FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
SIGNED = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
UNSIGNED = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
INTS = SIGNED | UNSIGNED
NUMBERS = FLOATS | INTS


@dataclass(frozen=True, kw_only=True)
class CKernel(NativeRule):
    """One op's rule (see the module docstring)."""

    emit: Callable[[PlanNode, Emitter], None]
    dtypes: frozenset | None = None  # element types of the node's first input (None: any C type)
    alias: bool = False
    scratch: Callable[[PlanNode], int] | None = None
    storage: bool = False  # takes the storage-only types (STORAGE): Cast, and ops that only move bytes

    @property
    def function(self):
        return self.emit

    def buffers(self, pn: PlanNode):
        """The node's buffers, less the optional outputs it omits (an empty name: RNN's Y when
        only Y_h is asked for, Attention's present keys beside its scores): the renderer gives
        those no buffer, and the kernel a null pointer."""
        for position, v in super().buffers(pn):
            if position is not None or v.name:
                yield position, v

    def value_problem(self, pn: PlanNode, position: int | None, v: PlanValue) -> str | None:
        if v.dtype not in C_TYPES:
            return f"dtype {v.dtype} of {v.name!r} (C has {', '.join(str(d) for d in C_TYPES)})"
        if v.dtype in STORAGE and not self.storage:
            return (f"dtype {v.dtype} of {v.name!r}: C stores it but computes in "
                    f"{', '.join(sorted(map(str, ALL)))}; only Cast, CastLike and ops that move bytes take it")
        return None

    def node_problem(self, pn: PlanNode) -> str | None:
        first = pn.inputs[0] if pn.inputs else None
        if self.dtypes is not None and first is not None and first.dtype not in self.dtypes:
            return f"dtype {first.dtype} (the C kernel has {', '.join(sorted(map(str, self.dtypes)))})"
        return super().node_problem(pn)


# The C rules, by (domain, op type) and opset (the segmented layer's rule table).
KERNELS = RuleTable("C kernel")

# The kwarg under which the renderer hands a node the bounds (lo, hi) of a Relu or Clip fused
# into it (render.fuse): the node's kernel clamps its results before storing them.
CLAMP = "_c_clamp"
FUSES_ACTIVATION = {("", "Conv")}
# The kwarg set (True) on a Conv into which the renderer fused the Add that was its only reader
# (render.fuse): the Add's other operand is the Conv's fourth input, added before the
# clamp, as onnxruntime's Conv+Add(+Relu) fusion does.
RESIDUAL = "_c_residual"
# The kwarg set (True) on a MatMul or MatMulAdd whose second input the renderer took from before a
# weight-only Transpose (render.FoldWeightTranspose): that input is the [N, K] matrix whose
# transpose the MatMul multiplies by, read with its strides, never copied.
B_TRANSPOSED = "_c_b_transposed"


def c_kernel(*op_types: str, domain: str = "", since: int = 1, dtypes: Iterable[np.dtype] | None = None,
             check: Callable[[PlanNode], str | None] | None = None, folded: Iterable[int] = (),
             alias: bool = False, scratch: Callable[[PlanNode], int] | None = None, storage: bool = False):
    """Register ``emit`` as the C rule of each of ``op_types`` from opset ``since`` on (see the
    module docstring)."""

    def register(emit):
        for op in op_types:
            KERNELS.add(CKernel(op_type=op, domain=domain, since=since, emit=emit, check=check,
                                dtypes=None if dtypes is None else frozenset(np.dtype(d) for d in dtypes),
                                folded=tuple(folded), alias=alias, scratch=scratch, storage=storage))
        return emit

    return register


class Emitter:
    """What a rule's ``emit`` prints with: buffers, constant arrays, literals, types."""

    def __init__(self, renderer, buf: Callable[[PlanValue], str], scratch: str | None, position: int = 0):
        self._r = renderer
        self._buf = buf
        self.scratch = scratch
        self._position = position

    def line(self, text: str) -> None:
        self._r.lines.append("    " + text)

    def checked(self, call: str, problem: str) -> None:
        """A kernel call returning an ``int``: nonzero stops the segment, and Python raises a
        NodeError naming this node and ``problem`` (e.g. "an index is out of range")."""
        self._r.problems.append(problem)
        self.line(f"if ({call}) return {len(self._r.problems)};")

    def buf(self, v: PlanValue) -> str:
        """A typed pointer expression to ``v``'s first element."""
        return self._buf(v)

    def arr(self, values, ctype: str = "mt_i") -> str:
        """A ``static const`` array of ``values`` in the generated file; its name."""
        return self._r.arr(values, ctype)

    @staticmethod
    def ctype(v_or_dtype) -> str:
        dt = v_or_dtype.dtype if isinstance(v_or_dtype, PlanValue) else np.dtype(v_or_dtype)
        return C_TYPES[dt][0]

    @staticmethod
    def sfx(v_or_dtype) -> str:
        dt = v_or_dtype.dtype if isinstance(v_or_dtype, PlanValue) else np.dtype(v_or_dtype)
        return C_TYPES[dt][1]

    @staticmethod
    def literal(x, dtype) -> str:
        """``x`` as a C constant of ``dtype`` (infinities and NaN included)."""
        dt = np.dtype(dtype)
        ctype = C_TYPES[dt][0]
        if dt.kind == "f":
            x = float(x)
            if x != x:
                return f"({ctype})NAN"
            if x in (float("inf"), float("-inf")):
                return f"({ctype})({'-' if x < 0 else ''}INFINITY)"
            return f"({ctype}){x!r}"
        if dt.kind == "b":
            return "1" if x else "0"
        return f"({ctype}){int(x)}{'ULL' if dt.kind == 'u' else 'LL'}"

    @staticmethod
    def const(v: PlanValue) -> np.ndarray:
        """A folded input's value (a constant)."""
        return np.asarray(v.value)

    @staticmethod
    def shape(v: PlanValue) -> tuple[int, ...]:
        return v.static_shape

    @staticmethod
    def numel(v: PlanValue) -> int:
        return prod(v.static_shape)


def strides(shape) -> list[int]:
    """Element strides of a C-contiguous array of ``shape``."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def broadcast_strides(shape, out_shape) -> list[int]:
    """Element strides of a C-contiguous ``shape`` walked along ``out_shape`` (0 where broadcast)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out_shape, strides(shape))]


def ints(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def same_types(pn: PlanNode) -> str | None:
    """A ``check`` for ops whose buffers (folded inputs aside) share one element type."""
    rule = KERNELS.rule_for(pn)
    folded = set(rule.folded) if rule is not None else set()
    dt = pn.outputs[0].dtype
    for i, v in enumerate(pn.inputs):
        if v is not None and i not in folded and v.dtype != dt:
            return f"input {v.name!r} is {v.dtype}, the output {dt}"
    return None


def text(value) -> str | None:
    """A string attribute (ONNX gives bytes) as str."""
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["ALL", "C_TYPES", "CKernel", "Emitter", "FLOATS", "INTS", "KERNELS", "NUMBERS", "SIGNED", "SUFFIX",
           "UNSIGNED", "broadcast_strides", "c_kernel", "ints", "same_types", "strides", "text"]
