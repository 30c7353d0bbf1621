"""Image resampling in ggml: Resize (opset 11+), with the tables the shared NumPy kernel
(:mod:`mithril.backends.kernels.image`) computes, made once when the graph is built.

Resize is separable and, per axis, linear in its input: ``nearest`` picks one input element per
output element (``get_rows`` on the elements, the picked index found by running the kernel on
``arange``: exact, as the kernel), ``linear`` and ``cubic`` multiply each resized axis by a
fixed ``[out, in]`` matrix (the kernel's taps and weights applied to the identity, through
``ggml_mul_mat``; an infinite input then spreads NaN along its row, where the kernel's few taps
would not). ``tf_crop_and_resize`` positions outside the input get the extrapolation value."""

from __future__ import annotations

from math import prod

import numpy as np

from ...kernels.image import _host_floats, _is_empty, _resize, _resize_axis
from . import Builder, const_value, ggml_op
from .elementwise import operand
from .movement import permute

_ATTRIBUTES = ("mode", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside", "extrapolation_value",
               "nearest_mode", "antialias", "axes", "keep_aspect_ratio_policy")
_DEFAULTS = {"antialias": 0, "axes": None, "keep_aspect_ratio_policy": "stretch"}


def _attributes(pn) -> dict:
    out = {}
    for name in _ATTRIBUTES:
        value = pn.kwargs.get(name, _DEFAULTS.get(name))
        out[name] = value.decode() if isinstance(value, bytes) else value
    return out


def _inputs(pn):
    return const_value(pn, 1), const_value(pn, 2), const_value(pn, 3)


def _axis_tables(pn) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(axis, ``[out, in]`` matrix, rows outside the input) for each axis the kernel resizes, as
    its ``_resize`` chooses lengths, scales and crop boxes."""
    a = _attributes(pn)
    roi, scales, sizes = _inputs(pn)
    shape = pn.inputs[0].static_shape
    rank = len(shape)
    axes = list(range(rank)) if a["axes"] is None else [int(x) % rank for x in a["axes"]]
    in_sizes = np.array([shape[x] for x in axes], dtype=np.float64)
    if not _is_empty(sizes):
        target = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if a["keep_aspect_ratio_policy"] == "stretch":
            out_sizes, axis_scales = target, target / in_sizes
        else:
            ratios = target / in_sizes
            s = ratios.min() if a["keep_aspect_ratio_policy"] == "not_larger" else ratios.max()
            out_sizes, axis_scales = np.floor(s * in_sizes + 0.5).astype(np.int64), np.full(len(axes), s)
    else:
        axis_scales = _host_floats(scales)
        out_sizes = np.floor(in_sizes * axis_scales).astype(np.int64)
    crop = a["coordinate_transformation_mode"] == "tf_crop_and_resize" and not _is_empty(roi)
    box = _host_floats(roi) if crop else np.concatenate([np.zeros(len(axes)), np.ones(len(axes))])
    tables = []
    for i, axis in enumerate(axes):
        out_len, scale, start, end = int(out_sizes[i]), float(axis_scales[i]), box[i], box[len(axes) + i]
        if out_len == shape[axis] and scale == 1.0 and (
                a["coordinate_transformation_mode"] != "tf_crop_and_resize" or (start, end) == (0.0, 1.0)):
            continue  # the kernel leaves this axis as it is
        eye = np.eye(shape[axis], dtype=np.float32)
        matrix = _resize_axis(eye, 0, out_len, scale, mode=a["mode"], ctm=a["coordinate_transformation_mode"],
                              roi_start=start, roi_end=end, cubic_coeff_a=a["cubic_coeff_a"],
                              exclude_outside=a["exclude_outside"], extrapolation_value=np.nan,
                              nearest_mode=a["nearest_mode"], antialias=a["antialias"], xp=np)
        outside = np.isnan(matrix).any(axis=1)
        tables.append((axis, np.where(outside[:, None], 0.0, matrix).astype(np.float32), outside))
    return tables


def _check_resize(pn) -> str | None:
    if pn.opset < 11:
        return "Resize-10 (legacy rounding)"
    a = _attributes(pn)
    if a["mode"] not in ("nearest", "linear", "cubic"):
        return f"mode={a['mode']!r}"
    if a["mode"] == "nearest" and prod(pn.inputs[0].static_shape) >= 2 ** 31 - 1:
        return "an input of 2**31 elements or more"
    return None


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
        picked = _resize(probe, *_inputs(pn), **{**a, "extrapolation_value": np.nan}, xp=np)
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
