"""C rules for ops that work along one axis of their input (kernels: ``lib/mt_rowwise.h``):
RMSNormalization, LpNormalization and TopK (CumProd shares CumSum's rule in :mod:`.elementwise`).

TopK's K may be a constant or come at run time: it is read in C, and a K other than the one the
output shapes were compiled for stops the segment with a NodeError.
"""

from __future__ import annotations

from math import prod

import numpy as np

from . import FLOATS, NUMBERS, broadcast_strides, c_kernel, same_types
from .elementwise import collapse

INT64 = np.dtype(np.int64)
# stash_type values that name a float type (FLOAT, FLOAT16, DOUBLE, BFLOAT16): C keeps the
# statistics in double, at least as precise as any of them.
FLOAT_STASH = (1, 10, 11, 16)


def _axis(pn, default: int) -> int | None:
    """The node's ``axis`` attribute as a dim of its first input; None when out of range."""
    rank = len(pn.inputs[0].static_shape)
    axis = int(pn.kwargs.get("axis", default))
    return axis % rank if -rank <= axis < rank else None


def _split(shape, axis: int) -> tuple[int, int, int]:
    """``shape`` as (outer, n, inner) around ``axis``."""
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def _like_x(pn) -> str | None:
    """Why the output is not shaped and typed like the first input; None when it is."""
    x, y = pn.inputs[0], pn.outputs[0]
    if tuple(y.static_shape) != tuple(x.static_shape):
        return f"output is typed {y.static_shape}, the kernel writes {x.static_shape}"
    if y.dtype != x.dtype:
        return f"output is {y.dtype}, the input {x.dtype}"
    return None


# ---------------------------------------------------------------------------------------------
# RMSNormalization / LpNormalization


def _scale_walk(scale_shape, inner_shape) -> tuple[list[int], list[int]] | None:
    """The normalized dims collapsed and scale's strides along them (0 where it broadcasts); None
    when scale does not broadcast to ``inner_shape`` without widening it."""
    shape = list(scale_shape)
    while len(shape) > len(inner_shape) and shape[0] == 1:
        shape.pop(0)
    if len(shape) > len(inner_shape):
        return None
    if any(d not in (1, i) for d, i in zip(shape[::-1], inner_shape[::-1])):
        return None
    dims, (st,) = collapse(inner_shape, broadcast_strides(shape, inner_shape))
    return dims, st


def _check_rmsnorm(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    axis = _axis(pn, -1)
    if axis is None:
        return f"axis {pn.kwargs.get('axis')} is out of range for rank {len(x)}"
    if int(pn.kwargs.get("stash_type", 1)) not in FLOAT_STASH:
        return f"stash_type {pn.kwargs.get('stash_type')} is not a float type"
    scale = pn.inputs[1].static_shape
    if _scale_walk(scale, x[axis:]) is None:
        return f"scale {scale} does not broadcast to the normalized dims {tuple(x[axis:])}"
    return _like_x(pn) or same_types(pn)


@c_kernel("RMSNormalization", dtypes=FLOATS, check=_check_rmsnorm)
def rmsnorm(pn, c):
    x, scale, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if c.numel(y) == 0:
        return
    s = c.shape(x)
    axis = _axis(pn, -1)
    dims, st = _scale_walk(c.shape(scale), s[axis:])
    c.line(f"mt_rmsnorm_{c.sfx(y)}({c.buf(x)}, {c.buf(scale)}, {c.buf(y)}, {prod(s[:axis])}, {prod(s[axis:])}, "
           f"{len(dims)}, {c.arr(dims)}, {c.arr(st)}, {float(pn.kwargs.get('epsilon', 1e-5))!r});")


def _check_lpnorm(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    if _axis(pn, -1) is None:
        return f"axis {pn.kwargs.get('axis')} is out of range for rank {len(x)}"
    if int(pn.kwargs.get("p", 2)) not in (1, 2):
        return f"p={pn.kwargs.get('p')} (ONNX allows 1 and 2)"
    return _like_x(pn)


@c_kernel("LpNormalization", dtypes=FLOATS, check=_check_lpnorm)
def lpnorm(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if c.numel(y) == 0:
        return
    outer, n, inner = _split(c.shape(x), _axis(pn, -1))
    c.line(f"mt_lpnorm_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {outer}, {n}, {inner}, {int(pn.kwargs.get('p', 2))});")


# ---------------------------------------------------------------------------------------------
# TopK


def _compiled_k(pn) -> int:
    """K as the output shapes were compiled for."""
    return pn.outputs[0].static_shape[_axis(pn, -1)]


def _check_top_k(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    axis = _axis(pn, -1)
    if axis is None:
        return f"axis {pn.kwargs.get('axis')} is out of range for rank {len(x)}"
    if len(pn.outputs) != 2 or not all(o.name for o in pn.outputs):
        return "an output is omitted"
    values, indices = pn.outputs
    k = values.static_shape[axis] if len(values.static_shape) == len(x) else -1
    want = tuple(x[:axis]) + (k,) + tuple(x[axis + 1:])
    if k < 0 or k > x[axis] or any(tuple(o.static_shape) != want for o in pn.outputs):
        return f"outputs typed {values.static_shape} and {indices.static_shape} for X {x} along axis {axis}"
    if values.dtype != pn.inputs[0].dtype or indices.dtype != INT64:
        return f"outputs are {values.dtype} and {indices.dtype}, expected {pn.inputs[0].dtype} and int64"
    if pn.opset < 10:
        given = int(pn.kwargs.get("k", -1))
    else:
        kv = pn.inputs[1]
        if kv.dtype != INT64 or prod(kv.static_shape) != 1:
            return f"K is {kv.dtype} {list(kv.static_shape)}"
        if kv.kind != "constant":
            return None  # read in C and checked against k
        given = int(np.asarray(kv.value).reshape(-1)[0])
    return None if given == k else f"K={given} for outputs of {k} along axis {axis}"


@c_kernel("TopK", dtypes=NUMBERS, check=_check_top_k)
def top_k(pn, c):
    x, (values, indices) = pn.inputs[0], pn.outputs
    k = _compiled_k(pn)
    if pn.opset >= 10 and pn.inputs[1].kind != "constant":
        c.checked(f"{c.buf(pn.inputs[1])}[0] != {k}", f"K is not {k}, the size the model was compiled for")
    if c.numel(values) == 0:
        return
    outer, n, inner = _split(c.shape(x), _axis(pn, -1))
    largest = int(int(pn.kwargs.get("largest", 1)) == 1)  # as onnxruntime: only 1 means largest
    c.line(f"mt_topk_{c.sfx(x)}({c.buf(x)}, {c.buf(values)}, {c.buf(indices)}, {outer}, {n}, {inner}, {k}, "
           f"{largest});")
