"""C rules for data movement: views, Transpose, Concat (kernels: ``lib/mt_movement*.h``)."""

from __future__ import annotations

from math import prod

from . import FLOATS, c_kernel, ints, strides


@c_kernel("Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze", alias=True, folded=(1,))
def view(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if c.buf(x) != c.buf(y):
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")


@c_kernel("Transpose", dtypes=FLOATS)
def transpose(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    perm = ints(pn.kwargs.get("perm")) or list(range(len(shape)))[::-1]
    sx = strides(shape)
    c.line(f"mt_transpose_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {len(shape)}, {c.arr(c.shape(y))}, "
           f"{c.arr([sx[p] for p in perm])});")


def _check_concat(pn):
    if any(v.dtype != pn.outputs[0].dtype for v in pn.inputs if v is not None):
        return "inputs of different element types"
    return None


@c_kernel("Concat", dtypes=FLOATS, check=_check_concat)
def concat(pn, c):
    y = pn.outputs[0]
    out_shape = c.shape(y)
    axis = pn.kwargs["axis"] % len(out_shape)
    outer, total, offset = prod(out_shape[:axis]), prod(out_shape[axis:]), 0
    for v in pn.inputs:
        chunk = prod(c.shape(v)[axis:])
        c.line(f"mt_concat_part_{c.sfx(y)}({c.buf(v)}, {c.buf(y)}, {outer}, {chunk}, {total}, {offset});")
        offset += chunk
