"""The C renderer: a lowering plan as one C translation unit, partitioned into C segments.

:func:`render` walks the plan once. Each node that has a C kernel (``mithril/backends/c/lib``)
for the program's element type, with every float value's shape known, joins the current C
segment; any other node ends it and runs on NumPy (the shared kernels). A segment becomes one
function ``void seg<k>(void *const *io, char *arena)``: ``io`` holds the segment's inputs and
outputs (NumPy buffers, passed without copying), ``arena`` the intermediates, at offsets
planned from the values' lifetimes (a buffer is reused once its last reader has run).

The source holds only the calls, the shapes as constants and the arena layout; the kernels are
``static inline`` functions of ``lib/mithril_kernels.h``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from ..plan import Plan, PlanNode, PlanValue

CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
ALIGN = 64  # bytes: arena offsets start on a cache line

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Neg": "neg", "Abs": "abs", "Erf": "erf"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
VIEWS = {"Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"}
OTHER = {"MatMul", "Gemm", "MatMulAdd", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
         "BatchNormalization", "Softmax", "LogSoftmax", "Transpose", "Concat", "ReduceMean", "ReduceSum"}
C_OPS = set(UNARY) | set(BINARY) | VIEWS | OTHER


@dataclass
class Segment:
    """A run of nodes rendered as the C function ``seg<index>``: ``io`` lists the values passed
    from Python (inputs first, then ``outputs``, which Python allocates)."""

    index: int
    nodes: list[PlanNode]
    inputs: list[PlanValue] = field(default_factory=list)
    outputs: list[PlanValue] = field(default_factory=list)


@dataclass
class CSource:
    """What :func:`render` returns: the C source, the steps (a Segment, or a PlanNode NumPy runs),
    the arena size in bytes and the nodes left to NumPy."""

    source: str
    steps: list
    arena_bytes: int
    fallback: list[PlanNode]
    naive_bytes: int = 0


def _tensor_inputs(pn: PlanNode) -> list[PlanValue]:
    """The inputs a C kernel reads as buffers (static ones, like Reshape's shape, are folded
    into the generated constants)."""
    skip = set(pn.static_inputs)
    if pn.op_type in ("ReduceMean", "ReduceSum", "Squeeze", "Unsqueeze"):
        skip.add(1)
    return [v for i, v in enumerate(pn.inputs) if v is not None and i not in skip]


def _ints(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _no_auto_pad(pn: PlanNode) -> bool:
    pad = pn.kwargs.get("auto_pad", "NOTSET")
    return (pad.decode() if isinstance(pad, bytes) else pad) in ("NOTSET", None, "")


def why_not_c(pn: PlanNode, dtype: np.dtype) -> str | None:
    """Why ``pn`` cannot run in C with element type ``dtype``; None when it can."""
    if pn.domain not in ("", "ai.mithril") or pn.op_type not in C_OPS or pn.subgraphs:
        return "no C kernel"
    if pn.domain == "ai.mithril" and pn.op_type != "MatMulAdd":
        return "no C kernel"
    for v in _tensor_inputs(pn) + list(pn.outputs):
        if v.dtype != dtype:
            return f"dtype {v.dtype} (C runs {dtype})"
        if v.static_shape is None:
            return f"shape of {v.name!r} not fixed"
        if v.kind == "constant" and tuple(np.shape(v.value)) != v.static_shape:
            return f"constant {v.name!r} holds shape {np.shape(v.value)}, typed {v.static_shape}"
    op, k = pn.op_type, pn.kwargs
    x = pn.inputs[0].static_shape if pn.inputs and pn.inputs[0] is not None else None
    if op in BINARY and len(pn.outputs[0].static_shape) == 0:
        return None
    if op in ("MatMul", "MatMulAdd"):
        a, b = pn.inputs[0].static_shape, pn.inputs[1].static_shape
        if len(a) < 2 or len(b) < 2:
            return "1-D MatMul operand"
        if len(b) > 2 and a[:-2] != b[:-2]:
            return "broadcast batch dims"
        if op == "MatMulAdd" and prod(pn.inputs[2].static_shape) != b[-1]:
            return "bias is not one row"
    if op in ("Conv", "MaxPool", "AveragePool"):
        if len(x) != 4:
            return f"{len(x) - 2}-D window (C has 2-D)"
        if not _no_auto_pad(pn):
            return "auto_pad"
    if op == "Conv" and pn.inputs[1].static_shape[1] * k.get("group", 1) != x[1]:
        return "group does not divide channels"
    if op == "MaxPool" and (len(pn.outputs) > 1 or k.get("num_outputs", 1) > 1):
        return "Indices output"
    if op == "AveragePool" and any(d != 1 for d in (k.get("dilations") or [])):
        return "dilated AveragePool"
    if op == "BatchNormalization" and (len(pn.outputs) > 1 or k.get("training_mode") or
                                       (k.get("is_test") == 0 and "is_test" in pn.attributes)):
        return "training mode"
    if op in ("ReduceMean", "ReduceSum") and _reduce_axes(pn) is None:
        return "axes given at run time"
    if op == "Gemm" and len(pn.inputs) > 2 and pn.inputs[2] is not None and len(pn.inputs[2].static_shape) > 2:
        return "bias of rank > 2"
    return None


def _reduce_axes(pn: PlanNode) -> list[int] | None:
    """The reduced axes (normalized, sorted); None when they come at run time."""
    rank = len(pn.inputs[0].static_shape)
    axes = pn.kwargs.get("axes")
    if axes is None and len(pn.inputs) > 1 and pn.inputs[1] is not None:
        if pn.inputs[1].kind != "constant":
            return None
        axes = _ints(pn.inputs[1].value)
    if not axes:
        if pn.kwargs.get("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)


def _strides(shape) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def _broadcast_strides(shape, out_shape) -> list[int]:
    """Element strides of a C-contiguous ``shape`` walked along ``out_shape`` (0 where broadcast)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [0 if d == 1 and o != 1 else s for d, o, s in zip(shape, out_shape, _strides(shape))]


class _Renderer:
    def __init__(self, plan: Plan, dtype: np.dtype):
        self.plan, self.dtype = plan, np.dtype(dtype)
        self.ctype = CTYPES[self.dtype]
        self.lines: list[str] = []
        self.consts = 0

    def arr(self, values, ctype="mt_i") -> str:
        """A static const array of ``values`` in the generated file; its name."""
        self.consts += 1
        name = f"k{self.consts}"
        self.lines.append(f"    static const {ctype} {name}[] = {{{', '.join(str(int(v)) for v in values)}}};")
        return name

    def literal(self, x: float) -> str:
        return f"({self.ctype}){float(x)!r}"

    # -- one node --------------------------------------------------------------------------
    def node(self, pn: PlanNode, buf, scratch: str | None) -> None:
        op, k = pn.op_type, pn.kwargs
        tensors = set(map(id, _tensor_inputs(pn)))
        ins = [buf(v) if v is not None and id(v) in tensors else "0" for v in pn.inputs]
        y = buf(pn.outputs[0])
        out_shape = pn.outputs[0].static_shape
        shapes = [v.static_shape if v is not None else None for v in pn.inputs]
        emit = self.lines.append
        emit(f"    /* {pn.label} ({op}) */")
        n = prod(out_shape)
        if op in UNARY:
            emit(f"    mt_{UNARY[op]}({ins[0]}, {y}, {n});")
        elif op in BINARY:
            shape = out_shape if out_shape else (1,)
            sa = self.arr(_broadcast_strides(shapes[0], shape))
            sb = self.arr(_broadcast_strides(shapes[1], shape))
            emit(f"    mt_{BINARY[op]}({ins[0]}, {ins[1]}, {y}, {len(shape)}, {self.arr(shape)}, {sa}, {sb});")
        elif op in VIEWS:
            if ins[0] != y:
                emit(f"    mt_copy({ins[0]}, {y}, {n});")
        elif op in ("MatMul", "MatMulAdd"):
            a, b = shapes[0], shapes[1]
            M, K, N = a[-2], a[-1], b[-1]
            bias = ins[2] if op == "MatMulAdd" else "0"
            if len(b) == 2:
                emit(f"    mt_gemm({ins[0]}, {ins[1]}, {bias}, {y}, {prod(a[:-1])}, {N}, {K}, {K}, 1, {N}, 1, "
                     f"0, 1, 1, 1);")
            else:
                batch = prod(a[:-2])
                emit(f"    for (mt_i q = 0; q < {batch}; q++) mt_gemm({ins[0]} + q * {M * K}, {ins[1]} + q * {K * N}, "
                     f"{bias}, {y} + q * {M * N}, {M}, {N}, {K}, {K}, 1, {N}, 1, 0, 1, 1, 1);")
        elif op == "Gemm":
            a, b = shapes[0], shapes[1]
            ta, tb = k.get("transA", 0), k.get("transB", 0)
            M, K = (a[1], a[0]) if ta else (a[0], a[1])
            N = b[0] if tb else b[1]
            ar, ac = (1, M) if ta else (K, 1)
            br, bc = (1, K) if tb else (N, 1)
            c, cr, cc = "0", 0, 0
            if len(pn.inputs) > 2 and pn.inputs[2] is not None:
                c = ins[2]
                cr, cc = _broadcast_strides(shapes[2], (M, N))
            emit(f"    mt_gemm({ins[0]}, {ins[1]}, {c}, {y}, {M}, {N}, {K}, {ar}, {ac}, {br}, {bc}, {cr}, {cc}, "
                 f"{self.literal(k.get('alpha', 1.0))}, {self.literal(k.get('beta', 1.0))});")
        elif op == "Conv":
            N, C, H, W = shapes[0]
            M, _, KH, KW = shapes[1]
            pads = _ints(k.get("pads")) or [0, 0, 0, 0]
            st = _ints(k.get("strides")) or [1, 1]
            dl = _ints(k.get("dilations")) or [1, 1]
            bias = ins[2] if len(pn.inputs) > 2 and pn.inputs[2] is not None else "0"
            emit(f"    mt_conv2d({ins[0]}, {ins[1]}, {bias}, {y}, {scratch}, {N}, {C}, {H}, {W}, {M}, {KH}, {KW}, "
                 f"{out_shape[2]}, {out_shape[3]}, {k.get('group', 1)}, {st[0]}, {st[1]}, {pads[0]}, {pads[1]}, "
                 f"{dl[0]}, {dl[1]});")
        elif op in ("MaxPool", "AveragePool"):
            N, C, H, W = shapes[0]
            KH, KW = _ints(k["kernel_shape"])
            pads = _ints(k.get("pads")) or [0, 0, 0, 0]
            st = _ints(k.get("strides")) or [1, 1]
            if op == "MaxPool":
                dl = _ints(k.get("dilations")) or [1, 1]
                emit(f"    mt_maxpool2d({ins[0]}, {y}, {N * C}, {H}, {W}, {out_shape[2]}, {out_shape[3]}, {KH}, {KW}, "
                     f"{st[0]}, {st[1]}, {pads[0]}, {pads[1]}, {dl[0]}, {dl[1]});")
            else:
                emit(f"    mt_avgpool2d({ins[0]}, {y}, {N * C}, {H}, {W}, {out_shape[2]}, {out_shape[3]}, {KH}, {KW}, "
                     f"{st[0]}, {st[1]}, {pads[0]}, {pads[1]}, {pads[2]}, {pads[3]}, "
                     f"{int(bool(k.get('count_include_pad', 0)))});")
        elif op == "GlobalAveragePool":
            x = shapes[0]
            emit(f"    mt_global_avgpool({ins[0]}, {y}, {x[0] * x[1]}, {prod(x[2:])});")
        elif op == "BatchNormalization":
            x = shapes[0]
            emit(f"    mt_batchnorm({ins[0]}, {ins[1]}, {ins[2]}, {ins[3]}, {ins[4]}, {y}, {x[0]}, "
                 f"{x[1] if len(x) > 1 else 1}, {prod(x[2:])}, {self.literal(k.get('epsilon', 1e-5))});")
        elif op in ("Softmax", "LogSoftmax"):
            x = shapes[0]
            axis = k.get("axis", -1 if pn.opset >= 13 else 1) % max(len(x), 1)
            if pn.opset >= 13:
                outer, mid, inner = prod(x[:axis]), x[axis], prod(x[axis + 1:])
            else:
                outer, mid, inner = prod(x[:axis]), prod(x[axis:]), 1
            emit(f"    mt_softmax({ins[0]}, {y}, {outer}, {mid}, {inner}, {int(op == 'LogSoftmax')});")
        elif op == "Transpose":
            x = shapes[0]
            perm = _ints(k.get("perm")) or list(range(len(x)))[::-1]
            sx = _strides(x)
            emit(f"    mt_transpose({ins[0]}, {y}, {len(x)}, {self.arr(out_shape)}, {self.arr([sx[p] for p in perm])});")
        elif op == "Concat":
            axis = k["axis"] % len(out_shape)
            outer, total, offset = prod(out_shape[:axis]), prod(out_shape[axis:]), 0
            for v, name in zip(pn.inputs, ins):
                chunk = prod(v.static_shape[axis:])
                emit(f"    mt_concat_part({name}, {y}, {outer}, {chunk}, {total}, {offset});")
                offset += chunk
        elif op in ("ReduceMean", "ReduceSum"):
            x = shapes[0]
            axes = _reduce_axes(pn)
            kept = [d for i, d in enumerate(x) if i not in axes]
            ks = _strides(kept)
            sy, j = [], 0
            for i in range(len(x)):
                if i in axes:
                    sy.append(0)
                else:
                    sy.append(ks[j])
                    j += 1
            count = prod(x[i] for i in axes)
            scale = 1.0 / count if op == "ReduceMean" and count else 1.0
            if not x:
                emit(f"    mt_copy({ins[0]}, {y}, 1);")
            else:
                emit(f"    mt_reduce_sum({ins[0]}, {y}, {len(x)}, {self.arr(x)}, {self.arr(sy)}, {n}, "
                     f"{self.literal(scale)});")
        else:  # pragma: no cover - why_not_c admits only the ops above
            raise AssertionError(op)


def _scratch_elements(pn: PlanNode) -> int:
    if pn.op_type != "Conv":
        return 0
    w, y = pn.inputs[1].static_shape, pn.outputs[0].static_shape
    return w[1] * w[2] * w[3] * y[2] * y[3]


def _plan_arena(items: list[tuple[object, int, int, int]]) -> tuple[dict, int]:
    """First-fit offsets for (key, bytes, first step, last step): two items share bytes only
    when their step ranges do not overlap. Returns key -> offset and the arena size."""
    placed: list[tuple[int, int, int, int]] = []  # offset, size, first, last
    offsets, top = {}, 0
    for key, size, first, last in sorted(items, key=lambda t: -t[1]):
        size = -(-size // ALIGN) * ALIGN
        busy = sorted((o, o + s) for o, s, f, l in placed if not (l < first or f > last))
        at = 0
        for lo, hi in busy:
            if at + size <= lo:
                break
            at = max(at, hi)
        placed.append((at, size, first, last))
        offsets[key] = at
        top = max(top, at + size)
    return offsets, top


def render(plan: Plan, dtype) -> CSource:
    """The plan as C source and the steps that run it (see the module docstring)."""
    dtype = np.dtype(dtype)
    r = _Renderer(plan, dtype)
    steps: list = []
    fallback: list[PlanNode] = []
    for pn in plan.nodes:
        if why_not_c(pn, dtype) is None:
            if not steps or not isinstance(steps[-1], Segment):
                steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), []))
            steps[-1].nodes.append(pn)
        else:
            steps.append(pn)
            fallback.append(pn)

    # Who reads each value, by step.
    readers: dict[PlanValue, list[int]] = {}
    for i, step in enumerate(steps):
        for pn in step.nodes if isinstance(step, Segment) else [step]:
            for v in pn.inputs:
                if v is not None:
                    readers.setdefault(v, []).append(i)
            for sub in pn.subgraphs.values():
                for p in sub if isinstance(sub, tuple) else (sub,):
                    for v in p.outer:
                        readers.setdefault(v, []).append(i)
    plan_outputs = set(plan.outputs)

    r.lines += ["/* Generated by Mithril's C backend: one function per C segment of the model. */",
                f"#define T {r.ctype}", '#include "mithril_kernels.h"', "",
                "#ifdef _OPENMP", "#include <omp.h>",
                "void mt_set_threads(int n) { omp_set_num_threads(n); }",
                "#else", "void mt_set_threads(int n) { (void)n; }", "#endif", ""]
    arena_bytes, naive = 0, 0
    itemsize = dtype.itemsize
    for si, step in enumerate(steps):
        if not isinstance(step, Segment):
            continue
        produced = {o for pn in step.nodes for o in pn.outputs}
        seen: set[PlanValue] = set()
        for pn in step.nodes:
            for v in _tensor_inputs(pn):
                if v not in produced and v not in seen:
                    seen.add(v)
                    step.inputs.append(v)
        for pn in step.nodes:
            for o in pn.outputs:
                if o in plan_outputs or any(i > si for i in readers.get(o, [])):
                    step.outputs.append(o)
        io = {v: f"(({r.ctype} *)io[{i}])" for i, v in enumerate(step.inputs + step.outputs)}
        # Views of intermediates share their input's buffer; each storage's life spans its aliases'.
        root: dict[PlanValue, PlanValue] = {}
        for pn in step.nodes:
            o = pn.outputs[0]
            if pn.op_type in VIEWS and o not in io and pn.inputs[0] not in step.outputs:
                src = pn.inputs[0]
                root[o] = root.get(src, src)
        life: dict[object, list[int]] = {}
        sizes: dict[object, int] = {}
        for j, pn in enumerate(step.nodes):
            for v in _tensor_inputs(pn):
                key = root.get(v, v)
                if key in life:
                    life[key][1] = j
            for o in pn.outputs:
                key = root.get(o, o)
                if key in io:
                    continue
                if key not in life:
                    life[key] = [j, j]
                    sizes[key] = prod(o.static_shape) * itemsize
            if _scratch_elements(pn):
                life[("scratch", j)] = [j, j]
                sizes[("scratch", j)] = _scratch_elements(pn) * itemsize
        offsets, size = _plan_arena([(key, sizes[key], f, l) for key, (f, l) in life.items()])
        arena_bytes = max(arena_bytes, size)
        naive += sum(sizes.values())

        def buf(v, io=io, offsets=offsets, root=root):
            if v in io:
                return io[v]
            key = root.get(v, v)
            if key in io:
                return io[key]
            return f"(({r.ctype} *)(arena + {offsets[key]}))"

        r.lines.append(f"void seg{step.index}(void *const *io, char *arena) {{")
        r.lines.append("    (void)io; (void)arena;")
        for j, pn in enumerate(step.nodes):
            scratch = f"(({r.ctype} *)(arena + {offsets[('scratch', j)]}))" if _scratch_elements(pn) else None
            r.node(pn, buf, scratch)
        r.lines += ["}", ""]
    return CSource("\n".join(r.lines) + "\n", steps, arena_bytes, fallback, naive)


__all__ = ["C_OPS", "CSource", "Segment", "render", "why_not_c"]
