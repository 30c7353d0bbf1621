"""Image resampling in ggml: Resize and Upsample, with the tables the shared NumPy kernel
(:mod:`mithril.backends.kernels.image`) computes, made once when the graph is built.

Resize is separable and, per axis, linear in its input: ``nearest`` picks one input element per
output element (``get_rows`` on the elements, the picked index found by running the kernel on
``arange``: exact, as the kernel), ``linear`` and ``cubic`` multiply each resized axis by a
fixed ``[out, in]`` matrix (the kernel's taps and weights applied to the identity, through
``ggml_mul_mat``; an infinite input then spreads NaN along its row, where the kernel's few taps
would not). ``tf_crop_and_resize`` positions outside the input get the extrapolation value."""

from __future__ import annotations

import itertools
from math import prod

import numpy as np

from ...kernels.image import host_floats, is_empty, resize_array, resize_axis
from . import Builder, const_value, ggml_op
from .elementwise import operand
from .movement import permute

_ATTRIBUTES = ("mode", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside", "extrapolation_value",
               "nearest_mode", "antialias", "axes", "keep_aspect_ratio_policy")
_DEFAULTS = {"antialias": 0, "axes": None, "keep_aspect_ratio_policy": "stretch"}


def _legacy(pn) -> bool:
    """Upsample and Resize-10: asymmetric coordinates and onnxruntime's legacy nearest rounding."""
    return pn.op_type == "Upsample" or pn.opset < 11


def _attributes(pn) -> dict:
    if _legacy(pn):
        mode = pn.kwargs.get("mode", "nearest")
        return {"mode": mode.decode() if isinstance(mode, bytes) else mode,
                "coordinate_transformation_mode": "asymmetric", "cubic_coeff_a": -0.75, "exclude_outside": 0,
                "extrapolation_value": 0.0, "nearest_mode": "legacy", "antialias": 0, "axes": None,
                "keep_aspect_ratio_policy": "stretch"}
    out = {}
    for name in _ATTRIBUTES:
        value = pn.kwargs.get(name, _DEFAULTS.get(name))
        out[name] = value.decode() if isinstance(value, bytes) else value
    return out


def _inputs(pn):
    """(roi, scales, sizes)."""
    if _legacy(pn):
        scales = pn.kwargs.get("scales") if pn.op_type == "Upsample" and pn.opset < 9 else const_value(pn, 1)
        return None, np.asarray(scales, dtype=np.float32), None
    return const_value(pn, 1), const_value(pn, 2), const_value(pn, 3)


def _axis_tables(pn) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(axis, ``[out, in]`` matrix, rows outside the input) for each axis the kernel resizes, as
    its ``resize_array`` chooses lengths, scales and crop boxes."""
    a = _attributes(pn)
    roi, scales, sizes = _inputs(pn)
    shape = pn.inputs[0].static_shape
    rank = len(shape)
    axes = list(range(rank)) if a["axes"] is None else [int(x) % rank for x in a["axes"]]
    in_sizes = np.array([shape[x] for x in axes], dtype=np.float64)
    if not is_empty(sizes):
        target = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if a["keep_aspect_ratio_policy"] == "stretch":
            out_sizes, axis_scales = target, target / in_sizes
        else:
            ratios = target / in_sizes
            s = ratios.min() if a["keep_aspect_ratio_policy"] == "not_larger" else ratios.max()
            out_sizes, axis_scales = np.floor(s * in_sizes + 0.5).astype(np.int64), np.full(len(axes), s)
    else:
        axis_scales = host_floats(scales)
        out_sizes = np.floor(in_sizes * axis_scales).astype(np.int64)
    crop = a["coordinate_transformation_mode"] == "tf_crop_and_resize" and not is_empty(roi)
    box = host_floats(roi) if crop else np.concatenate([np.zeros(len(axes)), np.ones(len(axes))])
    tables = []
    for i, axis in enumerate(axes):
        out_len, scale, start, end = int(out_sizes[i]), float(axis_scales[i]), box[i], box[len(axes) + i]
        if out_len == shape[axis] and scale == 1.0 and (
                a["coordinate_transformation_mode"] != "tf_crop_and_resize" or (start, end) == (0.0, 1.0)):
            continue  # the kernel leaves this axis as it is
        eye = np.eye(shape[axis], dtype=np.float32)
        matrix = resize_axis(eye, 0, out_len, scale, mode=a["mode"], ctm=a["coordinate_transformation_mode"],
                             roi_start=start, roi_end=end, cubic_coeff_a=a["cubic_coeff_a"],
                             exclude_outside=a["exclude_outside"], extrapolation_value=np.nan,
                             nearest_mode=a["nearest_mode"], antialias=a["antialias"], xp=np)
        outside = np.isnan(matrix).any(axis=1)
        tables.append((axis, np.where(outside[:, None], 0.0, matrix).astype(np.float32), outside))
    return tables


def _check_resize(pn) -> str | None:
    a = _attributes(pn)
    if a["mode"] not in ("nearest", "linear", "cubic"):
        return f"mode={a['mode']!r}"
    if a["mode"] == "nearest" and prod(pn.inputs[0].static_shape) >= 2 ** 31 - 1:
        return "an input of 2**31 elements or more"
    return None


@ggml_op("Upsample", check=_check_resize, folded=(1,))
@ggml_op("Resize", check=_check_resize, folded=(1, 2, 3))
def resize(pn, g: Builder):
    gg, ctx = g.ggml, g.ctx
    a = _attributes(pn)
    shape, out = tuple(pn.inputs[0].static_shape), tuple(pn.outputs[0].static_shape)
    x = g.contiguous(operand(pn, 0, g))
    fill = float(a["extrapolation_value"])
    if a["mode"] == "nearest":
        # The kernel on 0, 1, 2, ... gives the index each output element reads (NaN: outside).
        probe = np.arange(prod(shape), dtype=np.float64).reshape(shape)
        picked = resize_array(probe, *_inputs(pn), **{**a, "extrapolation_value": np.nan}, xp=np)
        rows = np.where(np.isnan(picked), prod(shape), picked).astype(np.int32).reshape(-1)
        table = gg.ggml_concat(ctx, g.reshape(x, (prod(shape), 1)), g.constant(np.full((1, 1), fill)), 1)
        return g.reshape(gg.ggml_get_rows(ctx, table, g.constant_i32(rows)), out)
    rank = len(shape)
    y, current = x, list(shape)
    outside = np.zeros(out, bool)
    for axis, matrix, out_rows in _axis_tables(pn):
        order = [d for d in range(rank) if d != axis] + [axis]
        moved = gg.ggml_mul_mat(ctx, g.constant(matrix), permute(g, y, order))  # [.., in] -> [.., out]
        current[axis] = matrix.shape[0]
        back = [order.index(d) for d in range(rank)]
        y = permute(g, g.reshape(moved, [current[d] for d in order]), back)
        view = [1] * rank
        view[axis] = len(out_rows)
        outside |= out_rows.reshape(view)
    if fill != 0 and outside.any():  # x + 0 inside, 0 + fill outside: exact
        y = gg.ggml_add(ctx, g.contiguous(y), g.constant(np.where(outside, fill, 0.0)))
    return y if y is not x else gg.ggml_cont(ctx, x)


def _grid_mode(pn) -> str:
    mode = pn.kwargs.get("mode", "linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)


def _check_grid_sample(pn) -> str | None:
    x, grid = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(x) != 4 or len(grid) != 4 or grid[-1] != 2 or grid[0] != x[0]:
        return "an input other than (N, C, H, W) with an (N, H', W', 2) grid"
    if _grid_mode(pn) not in ("nearest", "linear", "cubic"):
        return f"mode={_grid_mode(pn)!r}"
    padding = pn.kwargs.get("padding_mode", "zeros")
    if (padding.decode() if isinstance(padding, bytes) else padding) not in ("zeros", "border", "reflection"):
        return f"padding_mode={padding!r}"
    n, c, h, w = x
    if 2 * n * c * h * w >= 2 ** 24 or 2 * n * grid[1] * grid[2] >= 2 ** 24:
        return "more than 2**23 elements (positions are counted in float32)"
    return None


@ggml_op("GridSample", check=_check_grid_sample)
def grid_sample(pn, g: Builder):
    """The NumPy kernel's steps, on float32 in ggml: per spatial axis the grid's coordinate is
    mapped to pixels (rounded half to even for ``nearest``), clamped or reflected by the padding
    mode, split into taps (index, weight); each pair of taps reads the input by ``get_rows`` on its
    elements and adds ``value * weight``. Every choice is a :func:`select` (exact)."""
    from .elementwise import select

    gg, ctx = g.ggml, g.ctx
    n, c, h, w = pn.inputs[0].static_shape
    _, ho, wo, _ = pn.inputs[1].static_shape
    p = ho * wo
    shape = (n, p)
    mode = _grid_mode(pn)
    padding = pn.kwargs.get("padding_mode", "zeros")
    padding = padding.decode() if isinstance(padding, bytes) else padding
    align = bool(int(pn.kwargs.get("align_corners", 0)))
    grid = g.contiguous(operand(pn, 1, g))

    def affine(t, scale, bias):
        return gg.ggml_scale_bias(ctx, t, float(scale), float(bias))

    def above(t, bound):  # 1 where t > bound
        return gg.ggml_step(ctx, affine(t, 1.0, -bound))

    def below(t, bound):  # 1 where t < bound
        return gg.ggml_step(ctx, affine(t, -1.0, bound))

    def either(a, b):  # 0/1 or
        return gg.ggml_step(ctx, gg.ggml_add(ctx, a, b))

    def pick(mask, a, b):
        return select(g, mask, a, b, shape)

    def reflect(t, lo, hi):
        span = hi - lo
        if span <= 0:
            return affine(t, 0.0, lo)  # every coordinate is lo (t is finite here)
        low = below(t, lo)
        dist = pick(low, affine(t, -1.0, lo), affine(t, 1.0, -hi))
        folds = gg.ggml_floor(ctx, affine(dist, 1.0 / span, 0.0))
        rest = gg.ggml_sub(ctx, dist, affine(folds, span, 0.0))
        odd = gg.ggml_sub(ctx, folds, affine(gg.ggml_floor(ctx, affine(folds, 0.5, 0.0)), 2.0, 0.0))
        even = affine(odd, -1.0, 1.0)
        from_lo, from_hi = affine(rest, 1.0, lo), affine(rest, -1.0, hi)
        folded = pick(low, pick(even, from_lo, from_hi), pick(even, from_hi, from_lo))
        return pick(either(low, above(t, hi)), folded, t)

    def keys(d, near):  # Keys' cubic (a = -0.75) at |d| <= 1 (near) or 1 < |d| < 2
        a = -0.75
        d2 = gg.ggml_sqr(ctx, d)
        if near:
            return affine(gg.ggml_mul(ctx, affine(d, a + 2, -(a + 3)), d2), 1.0, 1.0)
        return affine(gg.ggml_mul(ctx, affine(gg.ggml_mul(ctx, affine(d, a, -5 * a), d), 1.0, 8 * a), d), 1.0, -4 * a)

    axes = []
    for i, size in enumerate((h, w)):
        # The grid's last axis lists x (width) first.
        nb = list(grid.contents.nb)
        u = gg.ggml_view_4d(ctx, grid, 1, wo, ho, n, nb[1], nb[2], nb[3], (1 - i) * nb[0])
        u = g.reshape(gg.ggml_cont(ctx, u), shape)
        if align:
            coord, lo, hi = affine(u, (size - 1) / 2, (size - 1) / 2), 0.0, size - 1.0
        else:
            coord, lo, hi = affine(u, size / 2, (size - 1) / 2), -0.5, size - 0.5
        if mode == "nearest":  # round half to even: floor(t + 0.5), less 1 on an odd tie
            r = gg.ggml_floor(ctx, affine(coord, 1.0, 0.5))
            tie = affine(gg.ggml_step(ctx, gg.ggml_sub(ctx, affine(coord, 1.0, 0.5), r)), -1.0, 1.0)
            odd = gg.ggml_sub(ctx, r, affine(gg.ggml_floor(ctx, affine(r, 0.5, 0.0)), 2.0, 0.0))
            coord = gg.ggml_sub(ctx, r, gg.ggml_mul(ctx, tie, odd))
        outside = either(below(coord, lo), above(coord, hi))
        if padding == "border" and mode != "cubic":
            coord = pick(outside, g.clamp(coord, 0.0, size - 1), coord)
        elif padding == "reflection":
            coord = reflect(coord, lo, hi)
        if mode == "nearest":
            bases, weights = [gg.ggml_trunc(ctx, coord)], [None]
        else:
            f = gg.ggml_floor(ctx, coord)
            t = gg.ggml_sub(ctx, coord, f)
            if mode == "linear":
                bases, weights = [f, affine(f, 1.0, 1.0)], [affine(t, -1.0, 1.0), t]
            else:
                bases = [affine(f, 1.0, k) for k in (-1.0, 0.0, 1.0, 2.0)]
                weights = [keys(affine(t, 1.0, 1.0), False), keys(t, True), keys(affine(t, -1.0, 1.0), True),
                           keys(affine(t, -1.0, 2.0), False)]
        taps = []
        for base, weight in zip(bases, weights):
            if padding == "zeros":  # no weight outside [0, size - 1]
                inside = affine(either(below(base, 0.0), above(base, size - 1.0)), -1.0, 1.0)
                weight = inside if weight is None else gg.ggml_mul(ctx, weight, inside)
            elif padding == "reflection":
                base = gg.ggml_trunc(ctx, reflect(base, lo, hi))
            taps.append((g.clamp(base, 0.0, size - 1), weight))
        axes.append(taps)
    table = g.reshape(g.contiguous(operand(pn, 0, g)), (n * c * h * w, 1))
    # Element (n, c, y, x) is row (n * C + c) * H * W + y * W + x.
    first = g.constant((np.arange(n * c, dtype=np.float32) * (h * w)).reshape(n, c, 1))
    y = None
    for (row, wy), (col, wx) in itertools.product(*axes):
        index = g.reshape(gg.ggml_add(ctx, affine(row, w, 0.0), col), (n, 1, p))
        index = gg.ggml_add(ctx, g.broadcast(index, (n, c, p)), first)
        picked = gg.ggml_get_rows(ctx, table, g.reshape(gg.ggml_cast(ctx, index, gg.GGML_TYPE_I32), (n * c * p,)))
        picked = g.reshape(picked, (n, c, p))
        weight = wy if wx is None else wx if wy is None else gg.ggml_mul(ctx, wy, wx)
        term = picked if weight is None else gg.ggml_mul(ctx, picked, g.reshape(weight, (n, 1, p)))
        y = term if y is None else gg.ggml_add(ctx, y, term)
    return g.reshape(y if y is not picked else gg.ggml_cont(ctx, y), (n, c, ho, wo))
