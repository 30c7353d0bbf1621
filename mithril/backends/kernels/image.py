"""Image kernels: Resize, Upsample, GridSample, AffineGrid, RoiAlign, NonMaxSuppression.

Resize and GridSample are separable: each spatial axis contributes a few (index, weight) taps,
and the output is a weighted sum of gathers, so no kernel loops over pixels in Python.
"""

from __future__ import annotations

import itertools
import math

import numpy

from ..registry import kernel

# ---------------------------------------------------------------------------
# Shared helpers.


def host_floats(value) -> numpy.ndarray:
    """A static (host) input such as scales or roi as a flat float64 NumPy array."""
    return numpy.asarray(value, dtype=numpy.float64).reshape(-1)


def is_empty(value) -> bool:
    """Whether an optional input is absent or has no elements."""
    return value is None or numpy.asarray(value).size == 0


def compute_dtype(dtype):
    """The dtype an image interpolates in: float64 stays, every other type uses float32."""
    dtype = numpy.dtype(dtype)
    return dtype if dtype in (numpy.float32, numpy.float64) else numpy.dtype(numpy.float32)


def _to_dtype(y, dtype, xp):
    dtype = numpy.dtype(dtype)
    if dtype.kind in "iu":
        # Truncate like onnxruntime's integer Resize; clip so overshooting cubic taps saturate.
        info = numpy.iinfo(dtype)
        return xp.clip(y, info.min, info.max).astype(dtype)
    return y.astype(dtype)


def _keys_cubic(d, a, xp=numpy):
    # Keys' cubic convolution kernel (IEEE TASSP 1981, eq. 4) at distance d.
    d = xp.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return xp.where(d <= 1, near, xp.where(d < 2, far, 0))


# ---------------------------------------------------------------------------
# Resize / Upsample: per axis, source coordinates -> taps -> weighted gathers.


def _source_coords(out_len, in_len, scale, mode, roi_start, roi_end):
    # float32 arithmetic, as onnxruntime: it decides which pixel a coordinate on a .5 boundary picks.
    f32 = numpy.float32
    o = numpy.arange(out_len, dtype=f32)
    scale, in_len, roi_start, roi_end = f32(scale), f32(in_len), f32(roi_start), f32(roi_end)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_len > 1 else numpy.zeros(out_len, dtype=f32)
    if mode == "align_corners":
        # The fractional resized length (scale * in_len), intended per onnx/onnx#2462 and in the
        # suite's data; onnxruntime uses the integer length and differs when scale * in_len is not whole.
        resized = scale * in_len
        return o * (in_len - 1) / (resized - 1) if resized != 1 else numpy.zeros(out_len, dtype=f32)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if mode == "tf_crop_and_resize":
        if out_len > 1:
            return roi_start * (in_len - 1) + o * (roi_end - roi_start) * (in_len - 1) / (out_len - 1)
        return numpy.full(out_len, 0.5 * (roi_start + roi_end) * (in_len - 1), dtype=f32)
    raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(coords, nearest_mode, scale):
    if nearest_mode == "round_prefer_floor":
        return numpy.ceil(coords - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return numpy.floor(coords + 0.5)
    if nearest_mode == "floor":
        return numpy.floor(coords)
    if nearest_mode == "ceil":
        return numpy.ceil(coords)
    if nearest_mode == "legacy":
        # Resize-10/Upsample (as onnxruntime): truncate when upsampling, ceil when downsampling.
        return numpy.ceil(coords) if scale < 1 else numpy.trunc(coords)
    raise ValueError(f"unknown nearest_mode {nearest_mode!r}")


def _interpolation_taps(coords, mode, scale, cubic_coeff_a, antialias, nearest_mode):
    """(indices, weights), each (out_len, n_taps); indices may lie outside the input."""
    if mode == "nearest":
        idx = _nearest_index(coords, nearest_mode, scale)
        return idx[:, None].astype(numpy.int64), numpy.ones((len(coords), 1))
    # The left neighbour is ceil(x) - 1 so the fraction lies in (0, 1].
    left = numpy.ceil(coords) - 1
    ratio = coords - left
    # Antialiasing stretches the filter by 1/scale when downsampling.
    s = min(scale, 1.0) if antialias else 1.0
    if mode == "linear":
        start = math.floor(-1 / s) + 1
    elif mode == "cubic":
        start = math.floor(-2 / s) + 1
    else:
        raise ValueError(f"unknown Resize mode {mode!r}")
    offsets = numpy.arange(start, 2 - start, dtype=numpy.float64)
    dist = (offsets[None, :] - ratio[:, None]) * s
    if mode == "linear":
        weights = numpy.clip(1 - numpy.abs(dist), 0, 1)
    else:
        weights = _keys_cubic(dist, cubic_coeff_a)
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    idx = (left[:, None] + offsets[None, :]).astype(numpy.int64)
    return idx, weights


def resize_axis(x, axis, out_len, scale, *, mode, ctm, roi_start, roi_end, cubic_coeff_a, exclude_outside,
                extrapolation_value, nearest_mode, antialias, xp):
    """``x`` resized along ``axis`` to ``out_len`` samples: Resize's interpolation, one axis at a time."""
    in_len = x.shape[axis]
    coords = _source_coords(out_len, in_len, scale, ctm, roi_start, roi_end)
    idx, weights = _interpolation_taps(coords, mode, scale, cubic_coeff_a, antialias, nearest_mode)
    if exclude_outside and mode != "nearest":
        weights = numpy.where((idx < 0) | (idx >= in_len), 0.0, weights)
        weights = weights / weights.sum(axis=1, keepdims=True)
    idx = numpy.clip(idx, 0, in_len - 1)
    bshape = (out_len,) + (1,) * (x.ndim - axis - 1)
    if mode == "nearest":
        y = xp.take(x, idx[:, 0], axis=axis)
    else:
        weights = weights.astype(x.dtype)
        y = None
        for k in range(idx.shape[1]):
            term = xp.take(x, idx[:, k], axis=axis) * weights[:, k].reshape(bshape)
            y = term if y is None else y + term
    if ctm == "tf_crop_and_resize":
        outside = ((coords < 0) | (coords > in_len - 1)).reshape(bshape)
        y = xp.where(outside, xp.asarray(extrapolation_value, dtype=y.dtype), y)
    return y


def resize_array(x, roi, scales, sizes, *, mode, coordinate_transformation_mode, cubic_coeff_a, exclude_outside,
                 extrapolation_value, nearest_mode, antialias, axes, keep_aspect_ratio_policy, xp):
    """Resize on an array, given its inputs and attributes: the output sizes from ``sizes`` or
    ``scales`` (``axes`` and the aspect-ratio policy applied), then each resized axis in turn."""
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    in_sizes = numpy.array([x.shape[a] for a in axes], dtype=numpy.float64)
    if not is_empty(sizes):
        target = numpy.asarray(sizes, dtype=numpy.int64).reshape(-1)
        if keep_aspect_ratio_policy == "stretch":
            out_sizes = target
            axis_scales = target / in_sizes
        else:
            ratios = target / in_sizes
            s = ratios.min() if keep_aspect_ratio_policy == "not_larger" else ratios.max()
            out_sizes = numpy.floor(s * in_sizes + 0.5).astype(numpy.int64)
            axis_scales = numpy.full(len(axes), s)
    else:
        axis_scales = host_floats(scales)
        out_sizes = numpy.floor(in_sizes * axis_scales).astype(numpy.int64)
    if coordinate_transformation_mode == "tf_crop_and_resize" and not is_empty(roi):
        roi = host_floats(roi)
        starts, ends = roi[: len(axes)], roi[len(axes):]
    else:
        starts, ends = numpy.zeros(len(axes)), numpy.ones(len(axes))

    work = x.astype(compute_dtype(x.dtype)) if mode != "nearest" else x
    for i, axis in enumerate(axes):
        out_len, scale = int(out_sizes[i]), float(axis_scales[i])
        identity = out_len == x.shape[axis] and scale == 1.0 and (
            coordinate_transformation_mode != "tf_crop_and_resize" or (starts[i], ends[i]) == (0.0, 1.0)
        )
        if identity:
            continue
        work = resize_axis(
            work, axis, out_len, scale, mode=mode, ctm=coordinate_transformation_mode, roi_start=starts[i],
            roi_end=ends[i], cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
            extrapolation_value=extrapolation_value, nearest_mode=nearest_mode, antialias=antialias, xp=xp,
        )
    return work if work.dtype == x.dtype else _to_dtype(work, x.dtype, xp)


def _legacy_resize(x, scales, mode, xp):
    # Upsample and Resize-10: asymmetric coordinates, onnxruntime's legacy nearest rounding.
    return resize_array(
        x, None, scales, None, mode=mode, coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75,
        exclude_outside=0, extrapolation_value=0.0, nearest_mode="legacy", antialias=0, axes=None,
        keep_aspect_ratio_policy="stretch", xp=xp,
    )


@kernel("Resize", since=10, static_inputs=(1,))
def resize_10(x, scales, *, mode, xp):
    return _legacy_resize(x, scales, mode, xp)


@kernel("Resize", since=11, static_inputs=(1, 2, 3))
def resize(x, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode, cubic_coeff_a,
           exclude_outside, extrapolation_value, nearest_mode, antialias=0, axes=None,
           keep_aspect_ratio_policy="stretch", xp):
    # antialias/axes/keep_aspect_ratio_policy arrived in Resize-18 with defaults equal to the old behaviour.
    return resize_array(
        x, roi, scales, sizes, mode=mode, coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
        nearest_mode=nearest_mode, antialias=antialias, axes=axes,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy, xp=xp,
    )


@kernel("Upsample", since=7)
def upsample_7(x, *, mode, scales, xp):
    return _legacy_resize(x, scales, mode, xp)


@kernel("Upsample", since=9, static_inputs=(1,))
def upsample_9(x, scales, *, mode, xp):
    return _legacy_resize(x, scales, mode, xp)


# ---------------------------------------------------------------------------
# GridSample / AffineGrid.


def _reflect(c, lo, hi, xp):
    # Fold coordinates into [lo, hi], bouncing off each border in turn.
    span = hi - lo
    if span <= 0:
        return xp.full_like(c, lo)
    below = c < lo
    dist = xp.where(below, lo - c, c - hi)
    folds = xp.floor(dist / span)
    rest = dist - folds * span
    even = (folds % 2) == 0
    from_lo, from_hi = lo + rest, hi - rest
    folded = xp.where(below, xp.where(even, from_lo, from_hi), xp.where(even, from_hi, from_lo))
    return xp.where(below | (c > hi), folded, c)


def _grid_taps(c, size, mode, padding_mode, lo, hi, xp):
    """[(index, weight)] for one spatial axis; weight is 0 where a tap falls in zero padding."""
    if mode == "nearest":
        bases, weights = [xp.trunc(c)], [xp.ones_like(c)]
    elif mode == "linear":
        f = xp.floor(c)
        t = c - f
        bases, weights = [f, f + 1], [1 - t, t]
    else:
        f = xp.floor(c)
        t = c - f
        bases = [f - 1, f, f + 1, f + 2]
        # GridSample's cubic is Keys' kernel with a = -0.75 (as torch's bicubic).
        weights = [_keys_cubic(d, -0.75, xp) for d in (t + 1, t, 1 - t, 2 - t)]
    taps = []
    for base, w in zip(bases, weights):
        if padding_mode == "zeros":
            w = xp.where((base >= 0) & (base <= size - 1), w, 0)
        elif padding_mode == "reflection":
            base = xp.trunc(_reflect(base, lo, hi, xp))
        taps.append((xp.clip(base, 0, size - 1).astype(numpy.int64), w))
    return taps


@kernel("GridSample", since=16)
def grid_sample(x, grid, *, align_corners, mode, padding_mode, xp):
    # GridSample-16 spelled the modes bilinear/bicubic; 20 renamed them and went N-D.
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    n, c = x.shape[:2]
    dims = x.shape[2:]
    r = len(dims)
    out_spatial = grid.shape[1:-1]
    dtype = compute_dtype(x.dtype)
    g = grid.reshape(n, -1, r).astype(dtype)
    per_axis = []
    for i, size in enumerate(dims):
        # grid's last axis lists coordinates innermost first (x, y, z...).
        u = g[:, :, r - 1 - i]
        if align_corners:
            coord, lo, hi = (u + 1) / 2 * (size - 1), 0.0, size - 1.0
        else:
            coord, lo, hi = ((u + 1) * size - 1) / 2, -0.5, size - 0.5
        if mode == "nearest":
            coord = xp.round(coord)
        outside = (coord < lo) | (coord > hi)
        # Cubic border padding clamps each tap, not the coordinate (as torch and onnxruntime).
        if padding_mode == "border" and mode != "cubic":
            coord = xp.where(outside, xp.clip(coord, 0, size - 1), coord)
        elif padding_mode == "reflection":
            coord = _reflect(coord, lo, hi, xp)
        per_axis.append(_grid_taps(coord, size, mode, padding_mode, lo, hi, xp))
    strides = [int(numpy.prod(dims[i + 1:])) for i in range(r)]
    flat = x.reshape(n, c, -1).astype(dtype)
    y = None
    for combo in itertools.product(*per_axis):
        index = sum(idx * stride for (idx, _), stride in zip(combo, strides))
        weight = math.prod(w for _, w in combo)
        index = xp.broadcast_to(index[:, None, :], (n, c, index.shape[-1]))
        term = xp.take_along_axis(flat, index, axis=2) * weight[:, None, :].astype(dtype)
        y = term if y is None else y + term
    return _to_dtype(y.reshape((n, c) + tuple(out_spatial)), x.dtype, xp)


def _affine_base(size, align_corners):
    if size == 1 and align_corners:
        return numpy.zeros(1)
    if align_corners:
        return numpy.linspace(-1.0, 1.0, size)
    return (numpy.arange(size) * 2 + 1) / size - 1


@kernel("AffineGrid", since=20, static_inputs=(1,))
def affine_grid(theta, size, *, align_corners, xp):
    size = [int(s) for s in numpy.asarray(size).reshape(-1)]
    spatial = size[2:]
    axes = [_affine_base(s, align_corners) for s in spatial]
    mesh = numpy.meshgrid(*axes, indexing="ij")
    # Homogeneous coordinates, innermost axis first: (x, y[, z], 1).
    base = numpy.stack([*mesh[::-1], numpy.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    base = xp.asarray(base.astype(theta.dtype))
    grid = xp.matmul(base[None], xp.swapaxes(theta, 1, 2))
    # NumPy's bfloat16 matmul returns float32: the grid is theta's type.
    return grid.astype(theta.dtype).reshape((size[0], *spatial, len(spatial)))


# ---------------------------------------------------------------------------
# RoiAlign (onnxruntime's sampling, including its max mode over weighted corners).


def _roi_bilinear(coord, size):
    """Corner indices and weights of sample points along one axis, as onnxruntime computes them."""
    empty = (coord < -1.0) | (coord > size)
    coord = numpy.maximum(coord, 0)
    low = numpy.floor(coord).astype(numpy.int64)
    at_edge = low >= size - 1
    low = numpy.where(at_edge, size - 1, low)
    high = numpy.where(at_edge, size - 1, low + 1)
    coord = numpy.where(at_edge, low, coord)
    frac = coord - low
    return low, high, 1 - frac, frac, empty


@kernel("RoiAlign", since=10, host_only=True)
def roi_align(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio, spatial_scale,
              coordinate_transformation_mode="output_half_pixel"):
    # numpy-only: the sampling grid per ROI depends on ROI values when sampling_ratio is 0.
    x = numpy.asarray(x)
    dtype = x.dtype
    rois = numpy.asarray(rois, dtype=numpy.float64)
    batch_indices = numpy.asarray(batch_indices).astype(numpy.int64)
    num_rois = rois.shape[0]
    channels, height, width = x.shape[1:]
    half_pixel = coordinate_transformation_mode == "half_pixel"
    offset = 0.5 if half_pixel else 0.0
    y = numpy.zeros((num_rois, channels, output_height, output_width), dtype=dtype)
    for r in range(num_rois):
        x1, y1, x2, y2 = rois[r] * spatial_scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / output_height, roi_w / output_width
        grid_h = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_h / output_height))
        grid_w = sampling_ratio if sampling_ratio > 0 else int(math.ceil(roi_w / output_width))
        count = max(grid_h * grid_w, 1)
        if grid_h <= 0 or grid_w <= 0:
            continue  # an inverted half-pixel ROI has no sample points
        ys = y1 + (numpy.arange(output_height)[:, None] + (numpy.arange(grid_h)[None, :] + 0.5) / grid_h) * bin_h
        xs = x1 + (numpy.arange(output_width)[:, None] + (numpy.arange(grid_w)[None, :] + 0.5) / grid_w) * bin_w
        ylo, yhi, wy_lo, wy_hi, y_empty = _roi_bilinear(ys.reshape(-1), height)
        xlo, xhi, wx_lo, wx_hi, x_empty = _roi_bilinear(xs.reshape(-1), width)
        # A sample point outside the map contributes nothing (weights 0, pixel 0,0).
        empty = y_empty[:, None] | x_empty[None, :]
        img = x[batch_indices[r]].astype(numpy.float64)
        corners = []
        for yi, wy in ((ylo, wy_lo), (yhi, wy_hi)):
            for xi, wx in ((xlo, wx_lo), (xhi, wx_hi)):
                w = numpy.where(empty, 0.0, wy[:, None] * wx[None, :])
                yi_ = numpy.where(empty, 0, yi[:, None])
                xi_ = numpy.where(empty, 0, xi[None, :])
                corners.append(w * img[:, yi_, xi_])
        shape = (channels, output_height, grid_h, output_width, grid_w)
        if mode == "avg":
            out = sum(corners).reshape(shape).sum(axis=(2, 4)) / count
        else:
            out = numpy.maximum.reduce(corners).reshape(shape).max(axis=(2, 4))
        y[r] = out.astype(dtype)
    return y


# ---------------------------------------------------------------------------
# NonMaxSuppression.


def _scalar(value):
    return numpy.asarray(value).reshape(-1)[0]


def _corners(boxes, center_point_box):
    if center_point_box:
        xc, yc, w, h = boxes.T
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    a, b, c, d = boxes.T
    return numpy.minimum(a, c), numpy.minimum(b, d), numpy.maximum(a, c), numpy.maximum(b, d)


def _iou_with(i, y1, x1, y2, x2, area):
    ih = numpy.minimum(y2[i], y2) - numpy.maximum(y1[i], y1)
    iw = numpy.minimum(x2[i], x2) - numpy.maximum(x1[i], x1)
    inter = numpy.where((ih > 0) & (iw > 0), ih * iw, 0.0)
    union = area[i] + area - inter
    valid = (area[i] > 0) & (area > 0) & (union > 0) & (inter > 0)
    return numpy.where(valid, inter / numpy.where(union > 0, union, 1.0), 0.0)


@kernel("NonMaxSuppression", since=10, data_dependent_shape=True, host_only=True)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None, *,
                        center_point_box):
    # numpy-only: greedy selection with a data-dependent number of outputs.
    boxes = numpy.asarray(boxes, dtype=numpy.float64)
    scores = numpy.asarray(scores, dtype=numpy.float64)
    max_out = 0 if is_empty(max_output_boxes_per_class) else int(_scalar(max_output_boxes_per_class))
    iou_thr = 0.0 if is_empty(iou_threshold) else float(_scalar(iou_threshold))
    score_thr = None if is_empty(score_threshold) else float(_scalar(score_threshold))
    selected = []
    if max_out > 0:
        for b in range(boxes.shape[0]):
            y1, x1, y2, x2 = _corners(boxes[b], center_point_box)
            area = (y2 - y1) * (x2 - x1)
            for cls in range(scores.shape[1]):
                s = scores[b, cls]
                candidates = numpy.argsort(-s, kind="stable")
                if score_thr is not None:
                    candidates = candidates[s[candidates] > score_thr]
                kept = 0
                while candidates.size and kept < max_out:
                    best = candidates[0]
                    selected.append((b, cls, best))
                    kept += 1
                    rest = candidates[1:]
                    candidates = rest[_iou_with(best, y1, x1, y2, x2, area)[rest] <= iou_thr]
    return numpy.array(selected, dtype=numpy.int64).reshape(-1, 3)
