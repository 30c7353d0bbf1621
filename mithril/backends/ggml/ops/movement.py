"""Data movement in ggml: reshapes (views of contiguous tensors), Transpose (a permuted view made
contiguous), Concat, Slice (a strided view made contiguous) and Gather on rows (``get_rows``)."""

from __future__ import annotations

from math import prod

import numpy as np

from ...plan import squeeze_output_problem
from . import EXACT, F32, MAX_DIMS, SMALL_INTS, Builder, fill_value, ggml_axis, ggml_op, ne
from .elementwise import operand


def _check_view(pn) -> str | None:
    if prod(pn.inputs[0].static_shape) != prod(pn.outputs[0].static_shape):
        return "input and output sizes differ"
    return squeeze_output_problem(pn)


@ggml_op("Reshape", "Flatten", "Squeeze", "Unsqueeze", check=_check_view, folded=(1,), dtypes=EXACT)
def reshape(pn, g: Builder):
    return g.reshape(operand(pn, 0, g), pn.outputs[0].static_shape)


def permute(g: Builder, x, perm) -> object:
    """``np.transpose(x, perm)`` as a contiguous tensor (``x`` itself for the identity)."""
    rank = len(perm)
    if list(perm) == list(range(rank)):
        return x
    # NumPy: output axis j reads input axis perm[j]. ggml_permute: source dim s goes to position axes[s].
    axes = list(range(MAX_DIMS))
    for j, p in enumerate(perm):
        axes[ggml_axis(p, rank)] = ggml_axis(j, rank)
    return g.ggml.ggml_cont(g.ctx, g.ggml.ggml_permute(g.ctx, x, *axes))


@ggml_op("Transpose", dtypes=EXACT)
def transpose(pn, g: Builder):
    x = operand(pn, 0, g)
    rank = len(pn.inputs[0].static_shape)
    perm = pn.kwargs.get("perm")
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    y = permute(g, x, perm)
    return y if y is not x else g.ggml.ggml_cont(g.ctx, x)


def _check_concat(pn) -> str | None:
    if len([v for v in pn.inputs if v is not None]) < 1:
        return "no inputs"
    return None


@ggml_op("Concat", check=_check_concat, dtypes=EXACT)
def concat(pn, g: Builder):
    rank = len(pn.outputs[0].static_shape)
    dim = ggml_axis(int(pn.kwargs.get("axis", 0)), rank)
    parts = [g.contiguous(operand(pn, i, g)) for i, v in enumerate(pn.inputs) if v is not None]
    out = parts[0]
    for t in parts[1:]:
        out = g.ggml.ggml_concat(g.ctx, out, t, dim)
    return out if len(parts) > 1 else g.ggml.ggml_cont(g.ctx, out)


def _slice_ranges(pn) -> list[tuple[int, int, int]] | None:
    """(start, stop, step) per NumPy axis of input 0, from the constant starts/ends/axes/steps
    (opset 10+) or the attributes (opset < 10)."""
    shape = pn.inputs[0].static_shape
    if pn.opset < 10:
        starts, ends = pn.kwargs.get("starts"), pn.kwargs.get("ends")
        axes, steps = pn.kwargs.get("axes"), None
    else:
        def arg(i):
            v = pn.inputs[i] if len(pn.inputs) > i else None
            return None if v is None else [int(x) for x in np.asarray(v.value).reshape(-1)]

        starts, ends, axes, steps = arg(1), arg(2), arg(3), arg(4)
    axes = list(range(len(starts))) if axes is None else [int(a) % len(shape) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    ranges = [(0, d, 1) for d in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        ranges[a] = slice(int(s), int(e), int(st)).indices(shape[a])
    return ranges


def _check_slice(pn) -> str | None:
    ranges = _slice_ranges(pn)
    if any(st != 1 for _, _, st in ranges):
        return "steps other than 1"
    return None


@ggml_op("Slice", check=_check_slice, folded=(1, 2, 3, 4), dtypes=EXACT)
def slice_(pn, g: Builder):
    x = operand(pn, 0, g)
    rank = len(pn.inputs[0].static_shape)
    ranges = _slice_ranges(pn)
    nb = list(x.contents.nb[:MAX_DIMS])
    offset = sum(start * nb[ggml_axis(a, rank)] for a, (start, _, _) in enumerate(ranges))
    extents = [max(stop - start, 0) for start, stop, _ in ranges]
    n = [int(d) for d in reversed(extents)] + [1] * (MAX_DIMS - rank)
    view = g.ggml.ggml_view_4d(g.ctx, x, *n, nb[1], nb[2], nb[3], offset)
    return g.ggml.ggml_cont(g.ctx, view)


def _check_gather(pn) -> str | None:
    data, idx = pn.inputs[0], pn.inputs[1]
    if len(idx.static_shape) + len(data.static_shape) - 1 > MAX_DIMS:
        return "an output of more than 4 dims"
    return None


@ggml_op("Gather", check=_check_gather, indices=(1,), dtypes=EXACT)
def gather(pn, g: Builder):
    """``get_rows`` on a matrix: the gathered axis moved first and the others flattened into
    each row (a weight matrix gathered on axis 0 is read as stored, maybe quantized)."""
    data, idx = pn.inputs[0], pn.inputs[1]
    shape = list(data.static_shape)
    rank = len(shape)
    axis = int(pn.kwargs.get("axis", 0)) % rank
    rows = shape[axis]
    if g.is_weight(data) and rank == 2 and axis == 0:
        table = g.weight(data, "rows")
    else:
        perm = [axis] + [a for a in range(rank) if a != axis]
        moved = permute(g, g.contiguous(operand(pn, 0, g)), perm)
        table = g.reshape(moved, (rows, prod(shape) // rows))
    if idx.kind == "constant":
        values = np.asarray(idx.value).astype(np.int64).reshape(-1)
        values = np.where(values < 0, values + rows, values)
        if values.size and (values.min() < 0 or values.max() >= rows):
            raise ValueError(f"index out of range [{-rows}, {rows})")
        index = g.constant_i32(values.astype(np.int32))
    else:
        index = g.index(idx, rows, pn)
    count = int(np.prod(idx.static_shape, dtype=np.int64))
    picked = g.ggml.ggml_get_rows(g.ctx, table, g.ggml.ggml_reshape_1d(g.ctx, index, count))
    if axis == 0:
        return picked
    # (indices..., the other axes in order) -> the axis's place taken by the index dims.
    others = [shape[a] for a in range(rank) if a != axis]
    k = len(idx.static_shape)
    staged = g.reshape(picked, list(idx.static_shape) + others)
    order = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + rank - 1))
    return permute(g, staged, order)


def _split_sizes(pn) -> list[int]:
    d = pn.inputs[0].static_shape[int(pn.kwargs.get("axis", 0)) % len(pn.inputs[0].static_shape)]
    split = pn.inputs[1] if len(pn.inputs) > 1 else None
    if split is not None:
        return [int(s) for s in np.asarray(split.value).reshape(-1)]
    if pn.kwargs.get("split") is not None:
        return [int(s) for s in pn.kwargs["split"]]
    n = int(pn.kwargs.get("num_outputs") or len(pn.outputs))
    chunk = -(-d // n)
    return [min(chunk, d - i * chunk) for i in range(n)]


def _check_split(pn) -> str | None:
    sizes = _split_sizes(pn)
    axis = int(pn.kwargs.get("axis", 0)) % len(pn.inputs[0].static_shape)
    if len(sizes) != len(pn.outputs) or sum(sizes) != pn.inputs[0].static_shape[axis] or min(sizes) < 1:
        return f"split sizes {sizes} for {len(pn.outputs)} outputs"
    return None


@ggml_op("Split", check=_check_split, folded=(1,), dtypes=EXACT)
def split(pn, g: Builder):
    """Each part a strided view of the input, made contiguous."""
    x = g.contiguous(operand(pn, 0, g))
    shape = list(pn.inputs[0].static_shape)
    rank = len(shape)
    axis = int(pn.kwargs.get("axis", 0)) % rank
    nb = list(x.contents.nb[:MAX_DIMS])
    parts, start = [], 0
    for size in _split_sizes(pn):
        extents = shape[:axis] + [size] + shape[axis + 1:]
        n = [int(d) for d in reversed(extents)] + [1] * (MAX_DIMS - rank)
        view = g.ggml.ggml_view_4d(g.ctx, x, *n, nb[1], nb[2], nb[3], start * nb[ggml_axis(axis, rank)])
        parts.append(g.ggml.ggml_cont(g.ctx, view))
        start += size
    return parts


def _check_block(pn) -> str | None:
    x = pn.inputs[0].static_shape
    bs = int(pn.kwargs.get("blocksize") or 0)
    if len(x) != 4 or bs < 1:
        return "an input that is not (N, C, H, W)"
    if pn.op_type == "DepthToSpace" and x[1] % (bs * bs):
        return "channels not a multiple of blocksize**2"
    if pn.op_type == "SpaceToDepth" and (x[2] % bs or x[3] % bs):
        return "H or W not a multiple of blocksize"
    return None


@ggml_op("DepthToSpace", "SpaceToDepth", check=_check_block)
def depth_space(pn, g: Builder):
    """Six-dim reshapes done with four: one (N, C, H, W) slice per block offset (i, j), picked
    or placed by strided views, interleaved by concatenating along a new unit dim of 1."""
    gg, ctx, f = g.ggml, g.ctx, 4
    n, c, h, w = pn.inputs[0].static_shape
    bs = int(pn.kwargs["blocksize"])
    mode = pn.kwargs.get("mode") or "DCR"
    crd = (mode.decode() if isinstance(mode, bytes) else mode) == "CRD"
    x = g.contiguous(operand(pn, 0, g))

    def cat(parts, dim):
        out = parts[0]
        for p in parts[1:]:
            out = gg.ggml_concat(ctx, out, p, dim)
        return out

    if pn.op_type == "DepthToSpace":
        co = c // (bs * bs)
        rows = []
        for i in range(bs):
            cols = []
            for j in range(bs):
                k = i * bs + j
                # DCR: channels k*C'..; CRD: channels c'*bs*bs + k (a stride of bs*bs channels).
                step, first = (bs * bs, k) if crd else (1, k * co)
                view = gg.ggml_view_4d(ctx, x, w, h, co, n, w * f, step * w * h * f, c * w * h * f, first * w * h * f)
                cols.append(gg.ggml_reshape_4d(ctx, gg.ggml_cont(ctx, view), 1, w, h, co * n))
            row = gg.ggml_reshape_4d(ctx, cat(cols, 0), bs * w, h, co, n)  # w*bs + j
            rows.append(gg.ggml_reshape_4d(ctx, row, bs * w, 1, h, co * n))
        return gg.ggml_reshape_4d(ctx, cat(rows, 1), bs * w, bs * h, co, n)  # h*bs + i
    wo, ho = w // bs, h // bs
    parts = []
    for i in range(bs):
        for j in range(bs):
            cols = gg.ggml_view_4d(ctx, gg.ggml_reshape_4d(ctx, x, bs, wo, h, c * n), 1, wo, h, c * n,
                                   bs * f, w * f, w * h * f, j * f)  # x[..., j::bs]
            cols = gg.ggml_reshape_4d(ctx, gg.ggml_cont(ctx, cols), wo, bs, ho, c * n)
            tile = gg.ggml_view_4d(ctx, cols, wo, 1, ho, c * n, wo * f, wo * bs * f, wo * h * f, i * wo * f)
            tile = gg.ggml_cont(ctx, tile)  # x[..., i::bs, j::bs]
            parts.append(gg.ggml_reshape_4d(ctx, tile, wo, ho, 1, c * n) if crd else
                         gg.ggml_reshape_4d(ctx, tile, wo, ho, c, n))
    return gg.ggml_reshape_4d(ctx, cat(parts, 2), wo, ho, c * bs * bs, n)


def _check_expand(pn) -> str | None:
    x, out = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) > len(out) or any(d not in (1, o) for d, o in zip(reversed(x), reversed(out))):
        return f"shape {list(x)} does not broadcast to {list(out)}"
    return None


@ggml_op("Expand", check=_check_expand, folded=(1,), dtypes=EXACT)
def expand(pn, g: Builder):
    return g.ggml.ggml_cont(g.ctx, g.broadcast(g.contiguous(operand(pn, 0, g)), pn.outputs[0].static_shape))


def _check_tile(pn) -> str | None:
    x, out = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) != len(out) or any(o % d for d, o in zip(x, out)):
        return f"{list(out)} is not a whole number of {list(x)}"
    return None


@ggml_op("Tile", check=_check_tile, folded=(1,), dtypes=EXACT)
def tile(pn, g: Builder):
    """``ggml_repeat`` lays copies of the input side by side along each dim: ``np.tile``."""
    x = g.contiguous(operand(pn, 0, g))
    return g.ggml.ggml_repeat_4d(g.ctx, x, *ne(pn.outputs[0].static_shape))


def _pads(pn) -> list[tuple[int, int]]:
    """(before, after) per NumPy axis of input 0."""
    rank = len(pn.inputs[0].static_shape)
    if pn.opset < 11:
        pads = [int(p) for p in pn.kwargs.get("pads")]
        axes = list(range(rank))
    else:
        pads = [int(p) for p in np.asarray(pn.inputs[1].value).reshape(-1)]
        axes_v = pn.inputs[3] if len(pn.inputs) > 3 and pn.inputs[3] is not None else None
        axes = list(range(rank)) if axes_v is None else [int(a) % rank for a in np.asarray(axes_v.value).reshape(-1)]
    out = [(0, 0)] * rank
    for i, a in enumerate(axes):
        out[a] = (pads[i], pads[i + len(axes)])
    return out


def _pad_value(pn) -> float:
    if pn.opset < 11:
        return float(pn.kwargs.get("value", 0.0))
    v = pn.inputs[2] if len(pn.inputs) > 2 else None
    return 0.0 if v is None else float(np.asarray(v.value).reshape(()))


def _check_pad(pn) -> str | None:
    mode = pn.kwargs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        return f"mode={mode!r}"
    if pn.inputs[0].dtype not in (F32, *SMALL_INTS) and _pad_value(pn) != 0:
        return "a fill value in a bool pad"
    if any(b < 0 or a < 0 for b, a in _pads(pn)):
        return "negative pads (a crop)"
    return None


@ggml_op("Pad", check=_check_pad, folded=(1, 2, 3), dtypes=EXACT)
def pad(pn, g: Builder):
    """``ggml_pad_ext`` pads with zeros; another fill value is added where the pads are (known
    at build time, so the sum is exact: ``x + 0`` inside, ``0 + value`` outside)."""
    pads = _pads(pn)
    rank = len(pads)
    flat = []
    for d in range(MAX_DIMS):  # ggml's dims: ne[0] is the last NumPy axis
        flat += list(pads[rank - 1 - d]) if d < rank else [0, 0]
    y = g.ggml.ggml_pad_ext(g.ctx, g.contiguous(operand(pn, 0, g)), *flat)
    value = _pad_value(pn)
    if value == 0:
        return y
    inside = np.zeros(pn.outputs[0].static_shape, bool)
    inside[tuple(slice(b, b + d) for (b, _), d in zip(pads, pn.inputs[0].static_shape))] = True
    return g.ggml.ggml_add(g.ctx, y, g.constant(np.where(inside, 0.0, value).astype(np.float32)))


_FILLED = (*EXACT, np.dtype(np.int32), np.dtype(np.int64))


def _check_filled(pn) -> str | None:
    if pn.op_type == "EyeLike" and len(pn.outputs[0].static_shape) != 2:
        return "an input that is not a matrix"
    value = np.asarray(fill_value(pn))
    if value.dtype.kind == "O" or not np.array_equal(value.astype(np.float32).astype(value.dtype), value):
        return "values float32 does not hold exactly"
    return None


@ggml_op("EyeLike", check=_check_filled, dtype_only=(0,), dtypes=_FILLED)  # only the input's shape counts
@ggml_op("ConstantOfShape", check=_check_filled, folded=(0,), dtypes=_FILLED)
def filled(pn, g: Builder):
    """A tensor of values known when the graph is built (a fill, or the identity), copied out of
    a constant: every value float32 holds exactly, read back as the output's dtype."""
    return g.ggml.ggml_cont(g.ctx, g.constant(np.asarray(fill_value(pn), dtype=np.float32)))


def _check_gather_elements(pn) -> str | None:
    data, idx = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(idx) != len(data):
        return "indices of another rank than the data"
    axis = int(pn.kwargs.get("axis", 0)) % len(data)
    if any(i > d for a, (i, d) in enumerate(zip(idx, data)) if a != axis):
        return f"indices {list(idx)} wider than the data {list(data)}"
    if 2 * prod(data) >= 2 ** 24 or 2 * prod(idx) >= 2 ** 24:
        return "more than 2**23 elements (positions are counted in float32)"
    return None


@ggml_op("GatherElements", check=_check_gather_elements, indices=(1,), dtypes=EXACT)
def gather_elements(pn, g: Builder):
    """Each output element's position in the data, ``index * stride(axis)`` plus its own
    coordinates on the other axes (a constant), picked by ``get_rows`` on the elements."""
    gg, ctx = g.ggml, g.ctx
    data, idx = pn.inputs[0], pn.inputs[1]
    shape, out = tuple(data.static_shape), tuple(idx.static_shape)
    axis = int(pn.kwargs.get("axis", 0)) % len(shape)
    strides = [prod(shape[a + 1:]) for a in range(len(shape))]
    coords = np.indices(out)
    base = sum((coords[a] * strides[a] for a in range(len(shape)) if a != axis),
               np.zeros(out, np.int64)).astype(np.float32)  # 1-D data: no other axis, a base of 0
    if idx.kind == "constant":
        values = np.asarray(idx.value).astype(np.int64)
        values = np.where(values < 0, values + shape[axis], values)
        if values.size and (values.min() < 0 or values.max() >= shape[axis]):
            raise ValueError(f"index out of range [{-shape[axis]}, {shape[axis]})")
        rows = g.constant_i32((base + values * strides[axis]).reshape(-1))
    else:
        picked = gg.ggml_cast(ctx, g.index(idx, shape[axis], pn), gg.GGML_TYPE_F32)
        rows = gg.ggml_add(ctx, gg.ggml_scale(ctx, g.reshape(picked, out), float(strides[axis])), g.constant(base))
        rows = gg.ggml_cast(ctx, g.reshape(rows, (prod(out),)), gg.GGML_TYPE_I32)
    table = g.reshape(g.contiguous(operand(pn, 0, g)), (prod(shape), 1))
    return g.reshape(gg.ggml_get_rows(ctx, table, rows), out)


def _crop_pad(pn) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(crop start, kept extent, (pad before, pad after)) per axis, as the NumPy kernel: a crop
    window starts rounded down, an odd pad puts the extra element after."""
    shape = list(pn.inputs[0].static_shape)
    rank = len(shape)
    axes = pn.kwargs.get("axes")
    axes = range(rank) if axes is None else [int(a) % rank for a in axes]
    starts, kept, widths = [0] * rank, list(shape), [(0, 0)] * rank
    for axis, size in zip(axes, np.asarray(pn.inputs[1].value).reshape(-1)):
        size, dim = int(size), shape[axis]
        if dim > size:
            starts[axis], kept[axis] = (dim - size) // 2, size
        elif dim < size:
            before = (size - dim) // 2
            widths[axis] = (before, size - dim - before)
    return starts, kept, widths


def _check_crop_pad(pn) -> str | None:
    sizes = np.asarray(pn.inputs[1].value).reshape(-1)
    axes = pn.kwargs.get("axes")
    if (sizes < 1).any() or len(sizes) != (len(pn.inputs[0].static_shape) if axes is None else len(axes)):
        return f"sizes {sizes.tolist()}"
    return None


@ggml_op("CenterCropPad", check=_check_crop_pad, folded=(1,), dtypes=EXACT)
def center_crop_pad(pn, g: Builder):
    """A strided view for the crop (made contiguous), ``ggml_pad_ext`` (zeros) for the pad."""
    x = g.contiguous(operand(pn, 0, g))
    starts, kept, widths = _crop_pad(pn)
    rank = len(kept)
    nb = list(x.contents.nb[:MAX_DIMS])
    offset = sum(start * nb[ggml_axis(a, rank)] for a, start in enumerate(starts))
    n = [int(d) for d in reversed(kept)] + [1] * (MAX_DIMS - rank)
    y = g.ggml.ggml_cont(g.ctx, g.ggml.ggml_view_4d(g.ctx, x, *n, nb[1], nb[2], nb[3], offset))
    if not any(b or a for b, a in widths):
        return y
    flat = []
    for d in range(MAX_DIMS):
        flat += list(widths[rank - 1 - d]) if d < rank else [0, 0]
    return g.ggml.ggml_pad_ext(g.ctx, y, *flat)
