"""Gradient of Resize/Upsample: linear and separable in the input, so per resized axis the
gradient is the transpose of that axis's (out_len, in_len) interpolation matrix. The matrix is
the forward kernel's own axis step applied to an identity, so the two never disagree."""

from __future__ import annotations

import numpy

from ..kernels.image import compute_dtype, host_floats, is_empty, resize_axis
from .rules import vjp_rule


def _axis_matrix(in_len, out_len, scale, **options):
    eye = numpy.eye(in_len, dtype=numpy.float64)
    # extrapolation_value=0: tf_crop_and_resize's fill does not depend on the input.
    return resize_axis(eye, 0, out_len, scale, extrapolation_value=0.0, xp=numpy, **options)


def _resize_vjp(g, x, roi, scales, sizes, *, mode, coordinate_transformation_mode, cubic_coeff_a, exclude_outside,
                nearest_mode, antialias, axes, keep_aspect_ratio_policy, y):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    in_sizes = numpy.array([x.shape[a] for a in axes], dtype=numpy.float64)
    out_sizes = [y.shape[a] for a in axes]
    if not is_empty(sizes):
        target = numpy.asarray(sizes, dtype=numpy.int64).reshape(-1)
        ratios = target / in_sizes
        if keep_aspect_ratio_policy == "stretch":
            axis_scales = ratios
        else:
            s = ratios.min() if keep_aspect_ratio_policy == "not_larger" else ratios.max()
            axis_scales = numpy.full(len(axes), s)
    else:
        axis_scales = host_floats(scales)
    if coordinate_transformation_mode == "tf_crop_and_resize" and not is_empty(roi):
        roi = host_floats(roi)
        starts, ends = roi[: len(axes)], roi[len(axes):]
    else:
        starts, ends = numpy.zeros(len(axes)), numpy.ones(len(axes))
    gx = g.astype(compute_dtype(g.dtype))
    for i, axis in enumerate(axes):
        out_len, scale = int(out_sizes[i]), float(axis_scales[i])
        if out_len == x.shape[axis] and scale == 1.0 and (
            coordinate_transformation_mode != "tf_crop_and_resize" or (starts[i], ends[i]) == (0.0, 1.0)
        ):
            continue
        m = _axis_matrix(x.shape[axis], out_len, scale, mode=mode, ctm=coordinate_transformation_mode,
                         roi_start=starts[i], roi_end=ends[i], cubic_coeff_a=cubic_coeff_a,
                         exclude_outside=exclude_outside, nearest_mode=nearest_mode, antialias=antialias)
        gx = numpy.moveaxis(numpy.tensordot(m.astype(gx.dtype).T, numpy.moveaxis(gx, axis, 0), axes=1), 0, axis)
    return gx.astype(x.dtype)


@vjp_rule("Resize", since=11)
def resize_vjp(g, x, roi=None, scales=None, sizes=None, *, mode, coordinate_transformation_mode, cubic_coeff_a,
               exclude_outside, extrapolation_value, nearest_mode, antialias=0, axes=None,
               keep_aspect_ratio_policy="stretch", y):
    gx = _resize_vjp(g, x, roi, scales, sizes, mode=mode, coordinate_transformation_mode=coordinate_transformation_mode,
                     cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, nearest_mode=nearest_mode,
                     antialias=antialias, axes=axes, keep_aspect_ratio_policy=keep_aspect_ratio_policy, y=y)
    return gx, None, None, None


def _legacy(g, x, scales, mode, y):
    return _resize_vjp(g, x, None, scales, None, mode=mode, coordinate_transformation_mode="asymmetric",
                       cubic_coeff_a=-0.75, exclude_outside=0, nearest_mode="legacy", antialias=0, axes=None,
                       keep_aspect_ratio_policy="stretch", y=y)


@vjp_rule("Resize", since=10)
@vjp_rule("Upsample", since=9)
def resize_10_vjp(g, x, scales, *, mode, y):
    return _legacy(g, x, scales, mode, y), None


@vjp_rule("Upsample", since=7)
def upsample_7_vjp(g, x, *, mode, scales, y):
    return (_legacy(g, x, scales, mode, y),)
