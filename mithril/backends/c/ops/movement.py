"""C rules for data movement: views, Transpose, Concat, Split, Slice, Gather/Scatter, Pad,
Expand, Tile, DepthToSpace, Resize, Trilu and the fills (kernels: ``lib/mt_movement*.h``).

Data movement never looks at values, so every rule runs for every C element type. Most ops are
one strided copy (``mt_strided``): y walks x with per-dim strides, 0 where broadcast, negative
for a reversed Slice. Inputs that only restate the output's shape (Reshape's shape, Expand's
shape, Split's sizes, OneHot's depth, ConstantOfShape's shape) are not needed to move data: the
output's shape is static and says it; they are checked against it (at compile when constant,
in the generated code otherwise). Inputs whose values matter (Slice's starts, Pad's pads,
Resize's scales, Trilu's k, Range's start) are read at render time when constant and at run
time otherwise, where the kernel checks them against the static output shape. A check that
fails stops the node with a NodeError naming it (Emitter.checked), never a wrong result.
"""

from __future__ import annotations

from math import prod

import numpy as np

from ...plan import squeeze_output_problem
from . import c_kernel, ints, same_types, strides, text

# Index tensors' element types and the code mt_index_at reads them with (lib/mt_movement.h).
INDEX_CODE = {np.dtype(t): i for i, t in enumerate(
    (np.int32, np.int64, np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.uint64))}
GATHER_INDEX = frozenset({np.dtype(np.int32), np.dtype(np.int64)})
VALUE_CODE = {**INDEX_CODE, np.dtype(np.float32): 8, np.dtype(np.float64): 9}
OUT_OF_RANGE = "an index is out of range (valid: -dim <= index < dim)"


def _given(pn, i):
    """Input ``i`` when the node has it (optional inputs may be absent or empty)."""
    return pn.inputs[i] if i < len(pn.inputs) and pn.inputs[i] is not None else None


def _const_ints(pn, i):
    """Input ``i``'s values when it is a constant (None when absent, False when given at run time)."""
    v = _given(pn, i)
    if v is None:
        return None
    return ints(v.value) if v.kind == "constant" else False


def _strided(c, x, y, shape, sx, off=0):
    """y (``shape``, C-contiguous) = x read at ``off + sum(i_d * sx[d])``, with adjacent dims
    that are contiguous in x merged so rows are as long as possible (memcpy when stride 1)."""
    if prod(shape) == 0:
        return
    dims: list[tuple[int, int]] = []
    for n, s in zip(shape, sx):
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:
            dims[-1] = (dims[-1][0] * n, s)
        else:
            dims.append((n, s))
    args = f"{c.buf(x)}, {c.buf(y)}, {len(dims)}, {c.arr([n for n, _ in dims])}, {c.arr([s for _, s in dims])}, {off}"
    unit = [d for d, (n, s) in enumerate(dims[:-1]) if s == 1 and n >= 8]
    if dims and dims[-1][1] != 1 and dims[-1][0] >= 8 and unit:
        # x's contiguous axis is not y's last: tiles of that plane (NCHW <-> NHWC, 2-D transposes).
        c.line(f"mt_strided_tiled_{c.sfx(y)}({args}, {unit[0]});")
    else:
        c.line(f"mt_strided_{c.sfx(y)}({args});")


# -- shape arguments ---------------------------------------------------------------------------
# Inputs that restate the output's shape are not needed to move the data: a constant one is
# checked here against the static output shape, a run-time one by the generated code, where a
# value asking for another shape stops the node (the C kernels only know the compiled shape).
SHAPE_MISMATCH = "its shape argument asks for another shape than the compiled {shape}"


def _reshape_target(vals, xs, ys, allowzero):
    if len(vals) != len(ys):
        return False
    return all(v == -1 or (xs[i] if v == 0 and not allowzero and i < len(xs) else v) == ys[i]
               for i, v in enumerate(vals))


def _expand_target(vals, xs, ys):
    if len(vals) > len(ys):
        return False
    xs = (1,) * (len(ys) - len(xs)) + tuple(xs)
    off = len(ys) - len(vals)
    return all((xs[off + i] if v == 1 else (v if xs[off + i] in (1, v) else -1)) == ys[off + i]
               for i, v in enumerate(vals))


def _shape_arg(pn):
    """(position, expected values or None, kind) of the node's shape argument; None when it has none."""
    x, y = pn.inputs[0], pn.outputs[0]
    ys = y.static_shape
    if pn.op_type == "Reshape" and _given(pn, 1) is not None:
        return 1, None, "reshape"
    if pn.op_type == "Expand":
        return 1, None, "expand"
    if pn.op_type == "Tile" and all(x.static_shape):
        return 1, [b // a for a, b in zip(x.static_shape, ys)], "dims"
    if pn.op_type == "ConstantOfShape":
        return 0, list(ys), "dims"
    if pn.op_type == "OneHot":
        return 1, [ys[_onehot_axis(pn)]], "dims"
    if pn.op_type == "CenterCropPad":
        return 1, [ys[a] for a in _crop_axes(pn)], "dims"
    return None


def _check_shape_arg(pn):
    got = _shape_arg(pn)
    if got is None:
        return None
    i, want, kind = got
    v = pn.inputs[i]
    if v.dtype not in VALUE_CODE or (kind != "dims" and v.dtype not in INDEX_CODE):
        return f"input {v.name!r} is {v.dtype}"
    n, ys, xs = prod(v.static_shape), pn.outputs[0].static_shape, pn.inputs[0].static_shape
    if n > len(ys) if kind == "expand" else n != (len(ys) if kind == "reshape" else len(want)):
        return f"input {v.name!r} holds {n} values for an output of rank {len(ys)}"
    if v.kind == "constant":
        vals = ints(v.value) if kind != "dims" else [float(a) for a in np.asarray(v.value).reshape(-1)]
        ok = (_reshape_target(vals, xs, ys, pn.kwargs.get("allowzero", 0)) if kind == "reshape" else
              _expand_target(vals, xs, ys) if kind == "expand" else vals == [float(a) for a in want])
        if not ok:
            return f"input {v.name!r} = {vals} does not give the output shape {ys}"
    return None


def _emit_shape_check(pn, c):
    got = _shape_arg(pn)
    if got is None or pn.inputs[got[0]].kind == "constant":
        return
    i, want, kind = got
    v, ys, xs = pn.inputs[i], c.shape(pn.outputs[0]), c.shape(pn.inputs[0])
    n, code = c.numel(v), VALUE_CODE[v.dtype]
    if kind == "reshape":
        call = (f"mt_check_reshape({c.buf(v)}, {code}, {n}, {len(xs)}, {c.arr(xs)}, {c.arr(ys)}, "
                f"{int(pn.kwargs.get('allowzero', 0) or 0)})")
    elif kind == "expand":
        padded = (1,) * (len(ys) - len(xs)) + tuple(xs)
        call = f"mt_check_expand({c.buf(v)}, {code}, {n}, {len(ys)}, {c.arr(padded)}, {c.arr(ys)})"
    else:
        call = f"mt_check_dims({c.buf(v)}, {code}, {n}, {c.arr(want)})"
    c.checked(call, f"input {v.name!r}: " + SHAPE_MISMATCH.format(shape=ys))


# -- views ------------------------------------------------------------------------------------
def _check_view(pn):
    v = _given(pn, 1)
    if v is not None and v.dtype not in INDEX_CODE:
        return f"input {v.name!r} is {v.dtype}"
    if prod(pn.inputs[0].static_shape) != prod(pn.outputs[0].static_shape):
        return "input and output sizes differ"
    return squeeze_output_problem(pn) or _check_shape_arg(pn) or _check_same_data(pn)


# Squeeze/Unsqueeze's axes are not read: the output's static shape says them.
@c_kernel("Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze", alias=True, check=_check_view, storage=True)
def view(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    _emit_shape_check(pn, c)
    if c.buf(x) != c.buf(y):
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")


def _check_same_data(pn):
    """Data input and output share the element type."""
    x, y = pn.inputs[0], pn.outputs[0]
    return None if x.dtype == y.dtype else f"input {x.name!r} is {x.dtype}, the output {y.dtype}"


def _output_is(pn, want):
    """The kernels write what the op gives: the plan's output shape must be it."""
    y = pn.outputs[0].static_shape
    return None if tuple(y) == tuple(want) else f"output shape {tuple(y)}, but the op gives {tuple(want)}"


def _check_transpose(pn):
    xs = pn.inputs[0].static_shape
    perm = ints(pn.kwargs.get("perm")) or list(range(len(xs)))[::-1]
    if sorted(p % max(len(xs), 1) for p in perm) != list(range(len(xs))):
        return f"perm {perm} is not a permutation of {len(xs)} axes"
    return _output_is(pn, [xs[p % len(xs)] for p in perm]) or _check_same_data(pn)


@c_kernel("Transpose", check=_check_transpose)
def transpose(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    perm = ints(pn.kwargs.get("perm")) or list(range(len(shape)))[::-1]
    sx = strides(shape)
    _strided(c, x, y, c.shape(y), [sx[p % len(shape)] for p in perm])


def _check_concat(pn):
    if any(v.dtype != pn.outputs[0].dtype for v in pn.inputs if v is not None):
        return "inputs of different element types"
    ins = [v.static_shape for v in pn.inputs if v is not None]
    y = pn.outputs[0].static_shape
    if not y:
        return "a scalar output"
    axis = pn.kwargs["axis"] % len(y)
    if any(len(s) != len(y) or any(a != b for d, (a, b) in enumerate(zip(s, y)) if d != axis) for s in ins):
        return "inputs differ from the output off the axis"
    return _output_is(pn, y[:axis] + (sum(s[axis] for s in ins),) + y[axis + 1:])


@c_kernel("Concat", check=_check_concat)
def concat(pn, c):
    y = pn.outputs[0]
    out_shape = c.shape(y)
    axis = pn.kwargs["axis"] % len(out_shape)
    outer, total, offset = prod(out_shape[:axis]), prod(out_shape[axis:]), 0
    for v in pn.inputs:
        if v is None:
            continue
        chunk = prod(c.shape(v)[axis:])
        if chunk and outer:
            c.line(f"mt_concat_part_{c.sfx(y)}({c.buf(v)}, {c.buf(y)}, {outer}, {chunk}, {total}, {offset});")
        offset += chunk


def _check_split(pn):
    x = pn.inputs[0].static_shape
    axis = pn.kwargs.get("axis", 0) % max(len(x), 1)
    if not x:
        return "a scalar input"
    if sum(o.static_shape[axis] for o in pn.outputs) != x[axis]:
        return "output sizes do not add up to the input's"
    if any(o.dtype != pn.inputs[0].dtype for o in pn.outputs):
        return "outputs of another element type"
    if any(len(o.static_shape) != len(x) or any(a != b for d, (a, b) in enumerate(zip(o.static_shape, x))
                                                if d != axis) for o in pn.outputs):
        return "outputs differ from the input off the axis"
    return None


# The sizes (attribute, input or num_outputs) are the outputs' static shapes along the axis.
@c_kernel("Split", check=_check_split)
def split(pn, c):
    x = pn.inputs[0]
    shape = c.shape(x)
    axis = pn.kwargs.get("axis", 0) % len(shape)
    outer, total, offset = prod(shape[:axis]), prod(shape[axis:]), 0
    for y in pn.outputs:
        chunk = prod(c.shape(y)[axis:])
        if chunk and outer:
            c.line(f"mt_split_part_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {outer}, {chunk}, {total}, {offset});")
        offset += chunk


# -- Slice --------------------------------------------------------------------------------------
def _slice_args(pn):
    """(starts, ends, axes, steps) as input positions or attribute lists (opset < 10)."""
    if pn.opset < 10:
        k = pn.kwargs
        return k.get("starts"), k.get("ends"), k.get("axes"), None
    return 1, 2, 3, 4


def _static_slice(xshape, starts, ends, axes, steps):
    """ONNX Slice on a static shape: per-axis (begin, step, length)."""
    rank = len(xshape)
    begin, step, length = [0] * rank, [1] * rank, list(xshape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a + rank if a < 0 else a
        if not 0 <= a < rank or st == 0:
            return None
        dim = xshape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if dim == 0:
            s, n = 0, 0
        elif st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            n = max(0, -(-(e - s) // st))
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            n = max(0, -(-(s - e) // -st))
        begin[a], step[a], length[a] = s, st, n
    return begin, step, length


def _slice_values(pn):
    """The node's slice as constants: (starts, ends, axes, steps) lists, or False when one is
    given at run time."""
    args = _slice_args(pn)
    if pn.opset < 10:
        return [ints(a) for a in args[:3]] + [None]
    vals = [_const_ints(pn, i) for i in args]
    return False if any(v is False for v in vals) else vals


def _check_slice(pn):
    x, y = pn.inputs[0], pn.outputs[0]
    if len(x.static_shape) > 16:
        return "rank above 16"
    lengths = {len(a) if isinstance(a, (list, tuple)) else prod(_given(pn, a).static_shape)
               for a in _slice_args(pn) if a is not None and (not isinstance(a, int) or _given(pn, a) is not None)}
    if len(lengths) > 1:
        return "starts, ends, axes and steps of different lengths"
    vals = _slice_values(pn)
    if vals:
        got = _static_slice(x.static_shape, *vals)
        if got is None:
            return "a zero step or an axis out of range"
        if tuple(got[2]) != y.static_shape:
            return f"slice of shape {got[2]} but the output is typed {y.static_shape}"
    elif vals is False:
        for i in range(1, 5):
            v = _given(pn, i)
            if v is not None and v.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
                return f"input {v.name!r} is {v.dtype} (Slice takes int32 or int64)"
        if pn.inputs[1].dtype != pn.inputs[2].dtype:
            return "starts and ends of different element types"
    return _check_same_data(pn)


@c_kernel("Slice", check=_check_slice)
def slice_(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xshape, yshape = c.shape(x), c.shape(y)
    vals = _slice_values(pn)
    if vals:
        begin, step, _ = _static_slice(xshape, *vals)
        sx = strides(xshape)
        _strided(c, x, y, yshape, [s * st for s, st in zip(sx, step)], sum(b * s for b, s in zip(begin, sx)))
        return
    if prod(yshape) == 0:
        return
    rank = len(xshape)
    starts, ends, axes, steps = (_given(pn, i) for i in range(1, 5))

    def ptr(v):
        return (c.buf(v), INDEX_CODE[v.dtype]) if v is not None else ("0", 0)

    c.line("{")
    c.line(f"    mt_i off, sy[{max(rank, 1)}];")
    (ps, cs), (pe, _), (pa, ca), (pt, ct) = ptr(starts), ptr(ends), ptr(axes), ptr(steps)
    c.checked(f"mt_slice_setup({rank}, {c.arr(xshape)}, {c.arr(yshape)}, {c.numel(starts)}, {ps}, {pe}, {cs}, "
              f"{pa}, {ca}, {pt}, {ct}, &off, sy)",
              f"starts/ends/axes/steps do not give the output's shape {yshape} from {xshape}, "
              "or a step is 0 or an axis out of range")
    c.line(f"    mt_strided_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {rank}, {c.arr(yshape)}, sy, off);")
    c.line("}")


# -- Expand, Tile, DepthToSpace, SpaceToDepth --------------------------------------------------
def _check_expand(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) > len(y):
        return "output rank below the input's"
    padded = (1,) * (len(y) - len(x)) + tuple(x)
    if any(a != b and a != 1 for a, b in zip(padded, y)):
        return f"input shape {x} does not broadcast to {y}"
    return _check_shape_arg(pn) or _check_same_data(pn)


# The shape input is not read: y's static shape is the broadcast result.
@c_kernel("Expand", check=_check_expand)
def expand(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    _emit_shape_check(pn, c)
    yshape = c.shape(y)
    xshape = (1,) * (len(yshape) - len(c.shape(x))) + tuple(c.shape(x))
    sx = strides(xshape)
    _strided(c, x, y, yshape, [0 if a == 1 and b != 1 else s for a, b, s in zip(xshape, yshape, sx)])


def _check_tile(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) != len(y) or any((a == 0 and b != 0) or (a and b % a) for a, b in zip(x, y)):
        return f"output shape {y} is not a tiling of {x}"
    return _check_shape_arg(pn) or _check_same_data(pn)


# Repeats are the output's shape over the input's; y is x viewed as (r0, n0, r1, n1, ...).
@c_kernel("Tile", check=_check_tile)
def tile(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xshape, yshape = c.shape(x), c.shape(y)
    _emit_shape_check(pn, c)
    if prod(yshape) == 0:
        return
    shape, sx = [], []
    for n, m, s in zip(xshape, yshape, strides(xshape)):
        shape += [m // n, n]
        sx += [0, s]
    _strided(c, x, y, shape, sx)


def _check_depth(pn):
    x = pn.inputs[0].static_shape
    b = pn.kwargs.get("blocksize")
    if len(x) != 4 or not b:
        return "input not 4-D"
    if pn.op_type == "DepthToSpace" and x[1] % (b * b):
        return "channels not a multiple of blocksize**2"
    if pn.op_type == "SpaceToDepth" and (x[2] % b or x[3] % b):
        return "height or width not a multiple of blocksize"
    n, ch, h, w = x
    want = (n, ch * b * b, h // b, w // b) if pn.op_type == "SpaceToDepth" else (n, ch // (b * b), h * b, w * b)
    return _output_is(pn, want) or _check_same_data(pn)


@c_kernel("DepthToSpace", "SpaceToDepth", check=_check_depth)
def depth_space(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    n, ch, h, w = c.shape(x)
    b = pn.kwargs["blocksize"]
    crd = text(pn.kwargs.get("mode")) == "CRD"
    if pn.op_type == "SpaceToDepth":
        view = (n, ch, h // b, b, w // b, b)
        perm = (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)
        out = tuple(view[p] for p in perm)
    elif crd:
        view, perm, out = (n, ch // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3), (n, ch // (b * b), h, b, w, b)
    else:
        view, perm, out = (n, b, b, ch // (b * b), h, w), (0, 3, 4, 1, 5, 2), (n, ch // (b * b), h, b, w, b)
    sv = strides(view)
    _strided(c, x, y, out, [sv[p] for p in perm])


# -- Gather and Scatter -------------------------------------------------------------------------
def _check_gather(pn):
    if pn.inputs[1].dtype not in GATHER_INDEX:
        return f"indices of {pn.inputs[1].dtype} (int32 or int64)"
    xs = pn.inputs[0].static_shape
    if not xs:
        return "a scalar input"
    if pn.op_type == "Gather":
        axis = pn.kwargs.get("axis", 0) % len(xs)
        return _output_is(pn, xs[:axis] + tuple(pn.inputs[1].static_shape) + xs[axis + 1:]) or _check_same_data(pn)
    return _check_same_data(pn)


@c_kernel("Gather", check=_check_gather)
def gather(pn, c):
    x, idx, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    shape = c.shape(x)
    axis = pn.kwargs.get("axis", 0) % len(shape)
    outer, dim, inner = prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])
    c.checked(f"mt_gather_{c.sfx(y)}({c.buf(x)}, {c.buf(idx)}, {INDEX_CODE[idx.dtype]}, {c.buf(y)}, {outer}, {dim}, "
              f"{c.numel(idx)}, {inner})", OUT_OF_RANGE)


def _check_gather_elements(pn):
    x, idx, y = pn.inputs[0].static_shape, pn.inputs[1].static_shape, pn.outputs[0].static_shape
    if not x or len(x) != len(idx) or tuple(idx) != tuple(y):
        return "indices and output shapes differ, or a scalar input"
    axis = pn.kwargs.get("axis", 0) % len(x)
    if any(i > d for a, (i, d) in enumerate(zip(idx, x)) if a != axis):
        return f"indices {idx} exceed the input {x} off the axis"
    return _check_gather(pn)


@c_kernel("GatherElements", check=_check_gather_elements)
def gather_elements(pn, c):
    x, idx, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    shape = c.shape(x)
    axis = pn.kwargs.get("axis", 0) % len(shape)
    c.checked(f"mt_gather_elements_{c.sfx(y)}({c.buf(x)}, {c.buf(idx)}, {INDEX_CODE[idx.dtype]}, {c.buf(y)}, "
              f"{len(shape)}, {c.arr(c.shape(y))}, {c.arr(strides(shape))}, {axis}, {shape[axis]})", OUT_OF_RANGE)


def _nd(pn, idx):
    """GatherND's (batch_dims, index tuple length)."""
    return pn.kwargs.get("batch_dims", 0), idx[-1]


def _check_gathernd(pn):
    data, idx = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if not idx:
        return "scalar indices"
    b, k = _nd(pn, idx)
    if b + k > len(data) or tuple(data[:b]) != tuple(idx[:b]):
        return "indices do not fit the data's shape"
    if pn.inputs[1].dtype not in GATHER_INDEX:
        return f"indices of {pn.inputs[1].dtype} (int32 or int64)"
    return _output_is(pn, tuple(idx[:-1]) + tuple(data[b + k:])) or _check_same_data(pn)


@c_kernel("GatherND", check=_check_gathernd)
def gathernd(pn, c):
    x, idx, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    data, q = c.shape(x), c.shape(idx)
    b, k = _nd(pn, q)
    nb, m = prod(data[:b]), prod(q[b:-1])
    c.checked(f"mt_gathernd_{c.sfx(y)}({c.buf(x)}, {c.buf(idx)}, {INDEX_CODE[idx.dtype]}, {c.buf(y)}, {nb}, "
              f"{prod(data[b:])}, {m}, {k}, {c.arr(data[b:b + k])}, {c.arr(strides(data)[b:b + k])}, "
              f"{prod(data[b + k:])})", OUT_OF_RANGE)


REDUCTION = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


def _check_scatter(pn):
    data, idx, upd = (v.static_shape for v in pn.inputs[:3])
    red = text(pn.kwargs.get("reduction", "none")) or "none"
    if red not in REDUCTION:
        return f"reduction {red!r} (C has {', '.join(REDUCTION)})"
    if red != "none" and pn.inputs[0].dtype == np.dtype(np.bool_):
        return f"reduction {red!r} on bool"
    if pn.inputs[1].dtype not in GATHER_INDEX:
        return f"indices of {pn.inputs[1].dtype} (int32 or int64)"
    if pn.inputs[2].dtype != pn.inputs[0].dtype:
        return "updates of another element type than data"
    if pn.op_type == "ScatterND":
        if not idx or idx[-1] > len(data) or tuple(upd) != tuple(idx[:-1]) + tuple(data[idx[-1]:]):
            return "indices and updates do not fit the data's shape"
    elif not data or len(idx) != len(data) or tuple(idx) != tuple(upd):
        return "indices and updates shapes differ, or a scalar input"
    else:
        axis = pn.kwargs.get("axis", 0) % len(data)
        if any(i > d for a, (i, d) in enumerate(zip(idx, data)) if a != axis):
            return f"indices {idx} exceed the data {data} off the axis"
    return _output_is(pn, data) or _check_same_data(pn)


@c_kernel("ScatterElements", "Scatter", "ScatterND", check=_check_scatter)
def scatter(pn, c):
    x, idx, upd, y = pn.inputs[0], pn.inputs[1], pn.inputs[2], pn.outputs[0]
    data = c.shape(x)
    red = REDUCTION[text(pn.kwargs.get("reduction", "none")) or "none"]
    c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")
    code = INDEX_CODE[idx.dtype]
    if pn.op_type == "ScatterND":
        k = c.shape(idx)[-1]
        c.checked(f"mt_scatternd_{c.sfx(y)}({c.buf(y)}, {c.buf(idx)}, {code}, {c.buf(upd)}, "
                  f"{prod(c.shape(idx)[:-1])}, {k}, {c.arr(data[:k])}, {c.arr(strides(data)[:k])}, "
                  f"{prod(data[k:])}, {red})", OUT_OF_RANGE)
    else:
        axis = pn.kwargs.get("axis", 0) % len(data)
        c.checked(f"mt_scatter_elements_{c.sfx(y)}({c.buf(y)}, {c.buf(idx)}, {code}, {c.buf(upd)}, {len(data)}, "
                  f"{c.arr(c.shape(idx))}, {c.arr(strides(data))}, {axis}, {data[axis]}, {red})", OUT_OF_RANGE)


# -- Pad ----------------------------------------------------------------------------------------
PAD_MODE = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


def _pad_begin(pn):
    """Leading pads per axis when the pads are known at render time (None: given at run time),
    and the trailing ones."""
    rank = len(pn.inputs[0].static_shape)
    if pn.opset < 11:
        pads, axes = ints(pn.kwargs.get("pads")), None
    else:
        pads, axes = _const_ints(pn, 1), _const_ints(pn, 3)
        if pads is False or axes is False:
            return None
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[i + len(axes)]
    return begin, end


def _check_pad(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    mode = text(pn.kwargs.get("mode", "constant"))
    if mode not in PAD_MODE:
        return f"mode {mode!r} (C has {', '.join(PAD_MODE)})"
    if len(x) > 16 or len(x) != len(y):
        return "rank above 16 or output rank differs"
    if mode != "constant" and any(a == 0 and b for a, b in zip(x, y)):
        return f"{mode} padding of an empty axis"
    pads = ints(pn.kwargs.get("pads")) if pn.opset < 11 else None
    npads = len(pads or []) if pn.opset < 11 else prod(pn.inputs[1].static_shape)
    axes = _given(pn, 3) if pn.opset >= 11 else None
    if npads != 2 * (prod(axes.static_shape) if axes is not None else len(x)):
        return f"{npads} pads for {prod(axes.static_shape) if axes is not None else len(x)} axes"
    got = _pad_begin(pn)
    if got is not None and any(a + b + e != o for a, b, e, o in zip(x, *got, y)):
        return f"pads do not give the output shape {y}"
    if pn.opset >= 11:
        for i in (1, 3):
            v = _given(pn, i)
            if v is not None and v.dtype not in INDEX_CODE:
                return f"input {v.name!r} is {v.dtype}"
        v = _given(pn, 2)
        if v is not None and (v.dtype != pn.inputs[0].dtype or not prod(v.static_shape)):
            return "constant_value of another element type or empty"
    return _check_same_data(pn)


@c_kernel("Pad", check=_check_pad)
def pad(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xshape, yshape = c.shape(x), c.shape(y)
    if prod(yshape) == 0:
        return
    mode = PAD_MODE[text(pn.kwargs.get("mode", "constant"))]
    if pn.opset < 11:
        value = c.literal(pn.kwargs.get("value", 0.0) or 0, y.dtype)
    else:
        v = _given(pn, 2)
        value = f"{c.buf(v)}[0]" if v is not None else c.literal(0, y.dtype)
    rank = len(xshape)
    got = _pad_begin(pn)
    if got is not None:
        c.line(f"mt_pad_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {rank}, {c.arr(xshape)}, {c.arr(yshape)}, "
               f"{c.arr(got[0])}, {mode}, {value});")
        return
    pads, axes = pn.inputs[1], _given(pn, 3)
    pa, ca = (c.buf(axes), INDEX_CODE[axes.dtype]) if axes is not None else ("0", 0)
    c.line("{")
    c.line(f"    mt_i begin[{max(rank, 1)}];")
    c.checked(f"mt_pad_setup({rank}, {c.arr(xshape)}, {c.arr(yshape)}, {c.buf(pads)}, {INDEX_CODE[pads.dtype]}, "
              f"{c.numel(pads)}, {pa}, {ca}, begin)",
              f"pads do not give the output's shape {yshape} from {xshape}, or an axis is out of range")
    c.line(f"    mt_pad_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {rank}, {c.arr(xshape)}, {c.arr(yshape)}, begin, "
           f"{mode}, {value});")
    c.line("}")


# -- CenterCropPad: a Pad whose leading pad is negative (a crop) or positive, centred ---------
def _crop_axes(pn):
    rank = len(pn.inputs[0].static_shape)
    return [a % rank for a in (ints(pn.kwargs.get("axes")) or range(rank))]


def _check_center_crop_pad(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    axes = _crop_axes(pn)
    if len(x) != len(y) or len(x) > 16 or any(a != b for d, (a, b) in enumerate(zip(x, y)) if d not in axes):
        return f"output shape {y} changes an axis outside {axes}"
    return _check_shape_arg(pn) or _check_same_data(pn)


# The shape input is the output's static shape on the axes; onnx centres with the extra element
# (odd difference) after the data when padding and cut from the end when cropping.
@c_kernel("CenterCropPad", check=_check_center_crop_pad)
def center_crop_pad(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xs, ys = c.shape(x), c.shape(y)
    _emit_shape_check(pn, c)
    if prod(ys) == 0:
        return
    begin = [(o - i) // 2 if o >= i else -((i - o) // 2) for i, o in zip(xs, ys)]
    c.line(f"mt_pad_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {len(xs)}, {c.arr(xs)}, {c.arr(ys)}, {c.arr(begin)}, 0, "
           f"{c.literal(0, y.dtype)});")


# -- Trilu, EyeLike, ConstantOfShape, Range, OneHot, ReverseSequence ---------------------------
def _check_trilu(pn):
    if len(pn.inputs[0].static_shape) < 2:
        return "input of rank < 2"
    k = _given(pn, 1)
    if k is not None and (k.dtype != np.dtype(np.int64) or prod(k.static_shape) != 1):
        return "k not one int64"
    return _output_is(pn, pn.inputs[0].static_shape) or _check_same_data(pn)


@c_kernel("Trilu", check=_check_trilu)
def trilu(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    k = _given(pn, 1)
    kv = f"(mt_i){c.buf(k)}[0]" if k is not None else "0"
    if prod(shape):
        c.line(f"mt_trilu_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {prod(shape[:-2])}, {shape[-2]}, {shape[-1]}, {kv}, "
               f"{int(pn.kwargs.get('upper', 1))});")


def _check_eyelike(pn):
    return _output_is(pn, pn.inputs[0].static_shape) if len(pn.outputs[0].static_shape) == 2 else "output not 2-D"


@c_kernel("EyeLike", check=_check_eyelike)
def eyelike(pn, c):
    y = pn.outputs[0]
    rows, cols = c.shape(y)
    c.line(f"mt_eye_{c.sfx(y)}({c.buf(y)}, {rows}, {cols}, {int(pn.kwargs.get('k', 0))});")


# The shape input is not read: y's static shape is it.
@c_kernel("ConstantOfShape", check=_check_shape_arg)
def constant_of_shape(pn, c):
    y = pn.outputs[0]
    _emit_shape_check(pn, c)
    value = pn.kwargs.get("value")
    fill = 0 if value is None else np.asarray(value).reshape(-1)[0]
    c.line(f"mt_fill_{c.sfx(y)}({c.buf(y)}, {c.numel(y)}, {c.literal(fill, y.dtype)});")


def _check_range(pn):
    if any(prod(v.static_shape) != 1 for v in pn.inputs):
        return "start, limit and delta must be scalars"
    if pn.outputs[0].dtype == np.dtype(np.bool_) or len(pn.outputs[0].static_shape) != 1:
        return "a bool range or an output not 1-D"
    return same_types(pn)


# y's static length already says how many steps; y[i] = start + i * delta as onnx's reference.
@c_kernel("Range", check=_check_range)
def range_(pn, c):
    start, limit, delta, y = pn.inputs[0], pn.inputs[1], pn.inputs[2], pn.outputs[0]
    c.checked(f"mt_range_len((double){c.buf(start)}[0], (double){c.buf(limit)}[0], (double){c.buf(delta)}[0]) "
              f"!= {c.numel(y)}", f"start, limit and delta do not give the compiled length {c.numel(y)}")
    c.line(f"mt_range_{c.sfx(y)}({c.buf(y)}, {c.numel(y)}, {c.buf(start)}[0], {c.buf(delta)}[0]);")


def _onehot_axis(pn):
    return pn.kwargs.get("axis", -1) % len(pn.outputs[0].static_shape)


def _check_onehot(pn):
    idx, vals, y = pn.inputs[0], pn.inputs[2], pn.outputs[0]
    if idx.dtype not in VALUE_CODE:
        return f"indices of {idx.dtype} (C reads integer, float32 and float64 indices)"
    if vals.dtype != y.dtype or prod(vals.static_shape) != 2:
        return "values not two of the output's type"
    axis = _onehot_axis(pn)
    ys = y.static_shape
    if tuple(ys[:axis]) + tuple(ys[axis + 1:]) != tuple(idx.static_shape):
        return "output shape is not the indices' with depth inserted"
    return _check_shape_arg(pn)


# The depth input is not read: it is the output's static size on the axis.
@c_kernel("OneHot", check=_check_onehot)
def onehot(pn, c):
    idx, vals, y = pn.inputs[0], pn.inputs[2], pn.outputs[0]
    axis, ys = _onehot_axis(pn), c.shape(y)
    _emit_shape_check(pn, c)
    c.line(f"mt_onehot_{c.sfx(y)}({c.buf(idx)}, {VALUE_CODE[idx.dtype]}, {c.buf(vals)}, {c.buf(y)}, "
           f"{prod(ys[:axis])}, {ys[axis]}, {prod(ys[axis + 1:])});")


def _check_reverse_sequence(pn):
    x, lens = pn.inputs[0], pn.inputs[1]
    k = pn.kwargs
    if len(x.static_shape) < 2 or {k.get("batch_axis", 1), k.get("time_axis", 0)} != {0, 1}:
        return "batch and time axes other than 0 and 1"
    if lens.dtype not in INDEX_CODE:
        return f"sequence_lens of {lens.dtype}"
    if prod(lens.static_shape) != x.static_shape[k.get("batch_axis", 1)]:
        return "sequence_lens does not hold one length per batch"
    return _output_is(pn, x.static_shape) or _check_same_data(pn)


@c_kernel("ReverseSequence", check=_check_reverse_sequence)
def reverse_sequence(pn, c):
    x, lens, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    shape = c.shape(x)
    if prod(shape):
        c.checked(f"mt_reverse_sequence_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {c.buf(lens)}, {INDEX_CODE[lens.dtype]}, "
                  f"{c.arr(shape[:2])}, {prod(shape[2:])}, {pn.kwargs.get('time_axis', 0)})",
                  "a sequence length is out of range (valid: 0 <= length <= the time axis' size)")


# -- Resize / Upsample ----------------------------------------------------------------------------
RESIZE_MODE = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2}
COORD_MODE = {"half_pixel": 0, "half_pixel_symmetric": 1, "pytorch_half_pixel": 2, "align_corners": 3,
              "asymmetric": 4, "tf_half_pixel_for_nn": 5, "tf_crop_and_resize": 6}
NEAREST_MODE = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}
ASPECT_POLICY = {"stretch": 0, "not_larger": 1, "not_smaller": 2}


def _nonempty(v):
    return v if v is not None and prod(v.static_shape) else None


def _resize_spec(pn):
    """The node's Resize settings; Upsample and Resize-10 are Resize with asymmetric coordinates
    and onnxruntime's legacy nearest rounding."""
    k, rank = pn.kwargs, len(pn.inputs[0].static_shape)
    legacy = pn.op_type == "Upsample" or pn.opset < 11
    spec = {"mode": text(k.get("mode", "nearest")), "roi": None, "scales": None, "sizes": None, "attr_scales": None,
            "ctm": "asymmetric" if legacy else text(k.get("coordinate_transformation_mode", "half_pixel")),
            "nearest": "legacy" if legacy else text(k.get("nearest_mode", "round_prefer_floor")),
            "policy": text(k.get("keep_aspect_ratio_policy", "stretch")) or "stretch",
            "cubic_a": float(k.get("cubic_coeff_a", -0.75)), "antialias": int(k.get("antialias", 0) or 0),
            "exclude": int(k.get("exclude_outside", 0) or 0), "extrapolation": float(k.get("extrapolation_value", 0.0)),
            "axes": [a % rank for a in (ints(k.get("axes")) or range(rank))]}
    if pn.op_type == "Upsample" and pn.opset < 9:
        spec["attr_scales"] = [float(s) for s in k.get("scales")]
    elif legacy:
        spec["scales"] = _nonempty(_given(pn, 1))
    else:
        spec["roi"], spec["scales"], spec["sizes"] = (_nonempty(_given(pn, i)) for i in (1, 2, 3))
    return spec


def _resize_tables(pn, spec):
    """Taps per axis (an upper bound when antialiasing depends on the run-time scale)."""
    xs, ys = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    reach = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2}[spec["mode"]]
    ntmax = []
    for d, (i, o) in enumerate(zip(xs, ys)):
        if d not in spec["axes"] or reach == 0:
            ntmax.append(1)
            continue
        s = min(max(o - 0.5, 0.5) / max(i, 1), 1.0) if spec["antialias"] else 1.0
        ntmax.append(2 * int(np.ceil(reach / s)) + 2)
    tbase = [sum(ys[e] * ntmax[e] for e in range(d)) for d in range(len(ys))]
    obase = [sum(ys[:d]) for d in range(len(ys))]
    total = sum(y * t for y, t in zip(ys, ntmax))
    return ntmax, tbase, obase, total


def _resize_scratch(pn) -> int:
    _, _, _, total = _resize_tables(pn, _resize_spec(pn))
    return 16 * total + sum(pn.outputs[0].static_shape) + 8


def _check_resize(pn):
    x = pn.inputs[0]
    spec = _resize_spec(pn)
    if spec["mode"] not in RESIZE_MODE:
        return f"mode {spec['mode']!r} (C has {', '.join(RESIZE_MODE)})"
    if spec["mode"] != "nearest" and x.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return f"{spec['mode']} interpolation of {x.dtype} (C interpolates float32 and float64)"
    if spec["ctm"] not in COORD_MODE:
        return f"coordinate_transformation_mode {spec['ctm']!r}"
    if spec["nearest"] != "legacy" and spec["nearest"] not in NEAREST_MODE:
        return f"nearest_mode {spec['nearest']!r}"
    if spec["policy"] not in ASPECT_POLICY:
        return f"keep_aspect_ratio_policy {spec['policy']!r}"
    xs, ys = x.static_shape, pn.outputs[0].static_shape
    if len(xs) > 16 or len(xs) != len(ys):
        return "rank above 16 or output rank differs"
    if any(a != b for d, (a, b) in enumerate(zip(xs, ys)) if d not in spec["axes"]):
        return f"output {ys} resizes an axis outside {spec['axes']}"
    if any(a == 0 and b for a, b in zip(xs, ys)):
        return "resizing an empty axis"
    if spec["attr_scales"] is None and spec["scales"] is None and spec["sizes"] is None:
        return "neither scales nor sizes given"
    n = len(spec["axes"])
    for key, dtypes, count in (("scales", (np.float32,), n), ("sizes", (np.int64,), n),
                               ("roi", (np.float32, np.float64), 2 * n)):
        v = spec[key]
        if v is not None and (v.dtype not in [np.dtype(t) for t in dtypes] or prod(v.static_shape) != count):
            return f"{key} {v.name!r} is {v.dtype} of shape {v.static_shape} (C reads {count} of {dtypes[0].__name__})"
    return _check_same_data(pn)


@c_kernel("Resize", "Upsample", check=_check_resize, scratch=_resize_scratch)
def resize(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xs, ys = c.shape(x), c.shape(y)
    if prod(ys) == 0:
        return
    spec = _resize_spec(pn)
    ntmax, tbase, obase, total = _resize_tables(pn, spec)
    rank = len(xs)
    roi = spec["roi"]
    nearest = -1 if spec["nearest"] == "legacy" else NEAREST_MODE[spec["nearest"]]
    c.line("{")
    c.line(f"    mt_i nt[{rank}];")
    c.line(f"    double *rw = (double *){c.scratch};")
    c.line(f"    mt_i *ri = (mt_i *)({c.scratch} + {8 * total});")
    c.line(f"    mt_bool *ro = (mt_bool *)({c.scratch} + {16 * total});")
    if spec["attr_scales"] is not None:
        c.line(f"    static const float attr_scales[] = {{{', '.join(repr(s) + 'f' for s in spec['attr_scales'])}}};")
        scales = "attr_scales"
    else:
        scales = c.buf(spec["scales"]) if spec["scales"] is not None else "0"
    sizes = c.buf(spec["sizes"]) if spec["sizes"] is not None and scales == "0" else "0"
    nt_arr, tb_arr, ob_arr = c.arr(ntmax), c.arr(tbase), c.arr(obase)
    c.checked(f"mt_resize_setup({rank}, {c.arr(xs)}, {c.arr(ys)}, {len(spec['axes'])}, {c.arr(spec['axes'])}, "
              f"{scales}, {sizes}, {c.buf(roi) if roi is not None else '0'}, "
              f"{int(roi is not None and roi.dtype == np.dtype(np.float64))}, {ASPECT_POLICY[spec['policy']]}, "
              f"{RESIZE_MODE[spec['mode']]}, {COORD_MODE[spec['ctm']]}, {nearest}, {spec['cubic_a']!r}, "
              f"{spec['antialias']}, {spec['exclude']}, {nt_arr}, {tb_arr}, {ob_arr}, nt, ri, rw, ro)",
              f"scales/sizes do not give the output's shape {ys} from {xs}")
    c.line(f"    mt_resize_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {rank}, {c.arr(ys)}, {c.arr(strides(xs))}, nt, {nt_arr}, "
           f"{tb_arr}, {ob_arr}, ri, rw, ro, {spec['extrapolation']!r});")
    c.line("}")


# -- Compress: data-dependent, but the compiled output length is checked against the condition
def _check_compress(pn):
    x, cond, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if cond.dtype != np.dtype(np.bool_) or len(cond.static_shape) != 1:
        return "condition not a 1-D bool tensor"
    axis = pn.kwargs.get("axis")
    if axis is None:
        return _check_same_data(pn) if len(y.static_shape) == 1 else "output not 1-D"
    xs, ys, axis = x.static_shape, y.static_shape, axis % max(len(x.static_shape), 1)
    if not xs or len(ys) != len(xs) or any(a != b for d, (a, b) in enumerate(zip(xs, ys)) if d != axis):
        return "output shape differs off the axis"
    return _check_same_data(pn)


@c_kernel("Compress", check=_check_compress)
def compress(pn, c):
    x, cond, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    xs, ys = c.shape(x), c.shape(y)
    axis = pn.kwargs.get("axis")
    if axis is None:
        outer, dim, inner, out_dim = 1, prod(xs), 1, ys[0]
    else:
        axis %= len(xs)
        outer, dim, inner, out_dim = prod(xs[:axis]), xs[axis], prod(xs[axis + 1:]), ys[axis]
    c.checked(f"mt_compress_{c.sfx(y)}({c.buf(x)}, {c.buf(cond)}, {c.numel(cond)}, {c.buf(y)}, {outer}, {dim}, "
              f"{inner}, {out_dim})", f"the condition selects another count than the compiled {out_dim}")


def _check_nonzero(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(y) != 2 or y[0] != max(len(x), 1) or pn.outputs[0].dtype != np.dtype(np.int64):
        return f"output {y} is not (rank, count) int64"
    return None


# Data-dependent like Compress: the compiled count is checked against the data.
@c_kernel("NonZero", check=_check_nonzero)
def nonzero(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xs, count = c.shape(x) or (1,), c.shape(y)[1]
    c.checked(f"mt_nonzero_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {len(xs)}, {c.arr(xs)}, {count})",
              f"the input has another number of nonzero elements than the compiled {count}")


def _check_bitcast(pn):
    x, y = pn.inputs[0], pn.outputs[0]
    if x.dtype.itemsize != y.dtype.itemsize or x.static_shape != y.static_shape:
        return f"{x.dtype} -> {y.dtype} changes the element size or the shape"
    return None


# The same bytes read as another type of the same width; bool takes each byte as 0 or 1.
@c_kernel("BitCast", check=_check_bitcast)
def bitcast(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if y.dtype == np.dtype(np.bool_):
        c.line(f"mt_bytes_to_bool((const uint8_t *){c.buf(x)}, {c.buf(y)}, {c.numel(y)});")
    else:
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")


# -- GridSample -----------------------------------------------------------------------------------
GRID_MODE = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2, "bicubic": 2}
GRID_PADDING = {"zeros": 0, "border": 1, "reflection": 2}


def _check_grid_sample(pn):
    x, g = pn.inputs[0], pn.inputs[1]
    xs, gs = x.static_shape, g.static_shape
    mode, pad = text(pn.kwargs.get("mode", "linear")), text(pn.kwargs.get("padding_mode", "zeros"))
    if x.dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or g.dtype != x.dtype:
        return f"input {x.dtype} and grid {g.dtype} (C samples float32 or float64, both the same)"
    if mode not in GRID_MODE or pad not in GRID_PADDING:
        return f"mode {mode!r} or padding_mode {pad!r}"
    r = len(xs) - 2
    if not 1 <= r <= 8 or len(gs) != r + 2 or gs[-1] != r or gs[0] != xs[0]:
        return f"grid {gs} does not fit the input {xs}"
    if not all(xs[2:]) and prod(gs):
        return "sampling an empty input"
    return _output_is(pn, tuple(xs[:2]) + tuple(gs[1:-1])) or _check_same_data(pn)


@c_kernel("GridSample", check=_check_grid_sample)
def grid_sample(pn, c):
    x, g, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    xs, gs = c.shape(x), c.shape(g)
    if prod(c.shape(y)) == 0:
        return
    mode = GRID_MODE[text(pn.kwargs.get("mode", "linear"))]
    pad = GRID_PADDING[text(pn.kwargs.get("padding_mode", "zeros"))]
    c.line(f"mt_grid_sample_{c.sfx(y)}({c.buf(x)}, {c.buf(g)}, {c.buf(y)}, {xs[0]}, {xs[1]}, {len(xs) - 2}, "
           f"{c.arr(xs[2:])}, {prod(gs[1:-1])}, {int(pn.kwargs.get('align_corners', 0) or 0)}, {mode}, {pad});")


def _check_affine_grid(pn):
    theta, size, g = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    ts, gs = theta.static_shape, g.static_shape
    r = len(gs) - 2
    if theta.dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or not 1 <= r <= 8:
        return f"theta of {theta.dtype}, or a grid of rank {len(gs)}"
    if tuple(ts) != (gs[0], r, r + 1) or gs[-1] != r:
        return f"theta {ts} does not fit the grid {gs}"
    if size.dtype not in INDEX_CODE or prod(size.static_shape) != r + 2:
        return f"size {size.name!r} is not {r + 2} integers"
    if size.kind == "constant":
        want = ints(size.value)
        if want[0] != gs[0] or tuple(want[2:]) != tuple(gs[1:-1]):
            return f"size {want} does not give the grid {gs}"
    return _check_same_data(pn)


# The size input restates the grid's static shape (its channel count aside): checked, not read.
@c_kernel("AffineGrid", check=_check_affine_grid)
def affine_grid(pn, c):
    theta, size, g = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    gs = c.shape(g)
    if size.kind != "constant":
        code = INDEX_CODE[size.dtype]
        c.checked(f"mt_check_dims({c.buf(size)}, {code}, 1, {c.arr(gs[:1])}) || "
                  f"mt_check_dims({c.buf(size)} + 2, {code}, {len(gs) - 2}, {c.arr(gs[1:-1])})",
                  f"input {size.name!r}: " + SHAPE_MISMATCH.format(shape=gs))
    if prod(gs):
        c.line(f"mt_affine_grid_{c.sfx(g)}({c.buf(theta)}, {c.buf(g)}, {gs[0]}, {len(gs) - 2}, {c.arr(gs[1:-1])}, "
               f"{int(pn.kwargs.get('align_corners', 0) or 0)});")
