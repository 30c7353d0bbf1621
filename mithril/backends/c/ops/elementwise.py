"""C rules for elementwise ops and reductions (kernels: ``lib/mt_elementwise*.h``)."""

from __future__ import annotations

from math import prod

from . import FLOATS, same_types, broadcast_strides, c_kernel, ints

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Neg": "neg", "Abs": "abs", "Erf": "erf"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@c_kernel(*UNARY, dtypes=FLOATS, check=same_types)
def unary(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    c.line(f"mt_{UNARY[pn.op_type]}_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)});")


@c_kernel(*BINARY, dtypes=FLOATS, check=same_types)
def binary(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    shape = c.shape(y) or (1,)
    sa = c.arr(broadcast_strides(c.shape(a), shape))
    sb = c.arr(broadcast_strides(c.shape(b), shape))
    c.line(f"mt_{BINARY[pn.op_type]}_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {c.buf(y)}, {len(shape)}, "
           f"{c.arr(shape)}, {sa}, {sb});")


def reduce_axes(pn) -> list[int] | None:
    """The reduced axes (normalized, sorted); None when they come at run time."""
    rank = len(pn.inputs[0].static_shape)
    axes = pn.kwargs.get("axes")
    if axes is None and len(pn.inputs) > 1 and pn.inputs[1] is not None:
        if pn.inputs[1].kind != "constant":
            return None
        axes = ints(pn.inputs[1].value)
    if not axes:
        if pn.kwargs.get("noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(a % rank for a in axes)


def _check_reduce(pn):
    if reduce_axes(pn) is None:
        return "axes given at run time"
    return same_types(pn)


@c_kernel("ReduceMean", "ReduceSum", dtypes=FLOATS, check=_check_reduce, folded=(1,))
def reduce(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    axes = reduce_axes(pn)
    kept = [d for i, d in enumerate(shape) if i not in axes]
    ks, sy, j = [prod(kept[i + 1:]) for i in range(len(kept))], [], 0
    for i in range(len(shape)):
        if i in axes:
            sy.append(0)
        else:
            sy.append(ks[j])
            j += 1
    count = prod(shape[i] for i in axes)
    scale = 1.0 / count if pn.op_type == "ReduceMean" and count else 1.0
    if not shape:
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, sizeof(*{c.buf(y)}));")
    else:
        c.line(f"mt_reduce_sum_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {len(shape)}, {c.arr(shape)}, {c.arr(sy)}, "
               f"{c.numel(y)}, {c.literal(scale, x.dtype)});")
