"""QuantizeLinear and DequantizeLinear in ggml for int8/int16/uint8/uint16 (held as their exact
float32 values, :data:`.SMALL_INTS`), per tensor, per axis or blocked, as the NumPy kernel
(:mod:`mithril.backends.kernels.quantize`) computes them: ``(x - zero_point) * scale`` in float32,
and ``x / scale`` rounded half to even plus the zero point, saturated to the integer's range."""

from __future__ import annotations

from math import prod

import numpy as np

from . import F32, SMALL_INTS, Builder, ggml_op
from .elementwise import operand, round_half_even


def _block(pn) -> int:
    return int(pn.kwargs.get("block_size") or 0)


def _check_param(pn, i: int) -> str | None:
    """Whether scale / zero point ``i`` broadcasts against x as the kernel reads it."""
    v = pn.inputs[i] if len(pn.inputs) > i else None
    if v is None:
        return None
    x, p = pn.inputs[0].static_shape, v.static_shape
    if prod(p) == 1 and _block(pn) <= 0:
        return None
    axis = int(pn.kwargs.get("axis", 1)) % len(x)
    if _block(pn) > 0:
        bs = _block(pn)
        if len(p) != len(x) or x[axis] % bs or p[axis] * bs != x[axis] or \
                any(a != b for d, (a, b) in enumerate(zip(p, x)) if d != axis):
            return f"a blocked {list(p)} parameter for {list(x)} (block {bs} dividing the axis)"
        return None
    if len(p) != 1 or p[0] != x[axis]:
        return f"a {list(p)} parameter for axis {axis} of {list(x)}"
    return None


def _param(pn, g: Builder, i: int):
    """Scale / zero point ``i`` repeated to x's shape (blocked: each value ``block_size`` times
    along the axis, by a repeat over an extra dim)."""
    x = tuple(pn.inputs[0].static_shape)
    t = g.contiguous(operand(pn, i, g))
    p = pn.inputs[i].static_shape
    if prod(p) == 1 and _block(pn) <= 0:
        return g.broadcast(g.reshape(t, (1,) * len(x)), x)
    axis = int(pn.kwargs.get("axis", 1)) % len(x)
    before, after = prod(x[:axis]), prod(x[axis + 1:])
    if _block(pn) > 0:
        bs = _block(pn)
        staged = g.reshape(t, (before, p[axis], 1, after))
        return g.reshape(g.broadcast(staged, (before, p[axis], bs, after)), x)
    shape = [1] * len(x)
    shape[axis] = x[axis]
    return g.broadcast(g.reshape(t, shape), x)


def _check_dequantize(pn) -> str | None:
    x, scale = pn.inputs[0], pn.inputs[1]
    if x.dtype not in SMALL_INTS or scale.dtype != F32 or pn.outputs[0].dtype != F32:
        return f"{x.dtype} values with a {scale.dtype} scale (ggml here: int8/16, uint8/16 and float32)"
    return _check_param(pn, 1) or _check_param(pn, 2)


@ggml_op("DequantizeLinear", check=_check_dequantize, dtypes=(F32, *SMALL_INTS))
def dequantize_linear(pn, g: Builder):
    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        x = gg.ggml_sub(ctx, x, _param(pn, g, 2))  # small integers: exact
    return gg.ggml_mul(ctx, x, _param(pn, g, 1))


def _check_quantize(pn) -> str | None:
    x, scale, out = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if x.dtype != F32 or scale.dtype != F32 or out.dtype not in SMALL_INTS:
        return f"{x.dtype} values with a {scale.dtype} scale to {out.dtype} (ggml here: float32 to int8/16, uint8/16)"
    if int(pn.kwargs.get("precision") or 0):
        return "a precision attribute"
    return _check_param(pn, 1) or _check_param(pn, 2)


@ggml_op("QuantizeLinear", check=_check_quantize, dtypes=(F32, *SMALL_INTS))
def quantize_linear(pn, g: Builder):
    gg, ctx = g.ggml, g.ctx
    y = round_half_even(g, gg.ggml_div(ctx, g.contiguous(operand(pn, 0, g)), _param(pn, g, 1)))
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        y = gg.ggml_add(ctx, y, _param(pn, g, 2))
    info = np.iinfo(pn.outputs[0].dtype)
    return g.clamp(y, float(info.min), float(info.max))


def _check_dynamic(pn) -> str | None:
    if pn.inputs[0].dtype != F32 or prod(pn.inputs[0].static_shape) >= 2 ** 31:
        return "an input other than float32"
    return None


@ggml_op("DynamicQuantizeLinear", check=_check_dynamic, dtypes=(F32, *SMALL_INTS))
def dynamic_quantize_linear(pn, g: Builder):
    """The range ``[min(x, 0), max(x, 0)]`` over 255 steps (the max by a max pool over all
    values), its zero point and ``x`` quantized to uint8, as the kernel: ``(y, scale, zero_point)``."""
    from .nn import row_max

    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    n = prod(pn.inputs[0].static_shape)
    flat = g.reshape(x, (1, n))
    top = gg.ggml_relu(ctx, row_max(g, flat))  # max(max(x), 0)
    low = gg.ggml_neg(ctx, gg.ggml_relu(ctx, row_max(g, gg.ggml_neg(ctx, flat))))  # min(min(x), 0)
    scale = gg.ggml_div(ctx, gg.ggml_sub(ctx, top, low), g.constant(np.full((1, 1), 255.0)))
    zero = gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, scale), -1.0, 1.0)  # 1 where the scale is 0
    safe = gg.ggml_add(ctx, scale, zero)
    zero_point = g.clamp(round_half_even(g, gg.ggml_div(ctx, gg.ggml_neg(ctx, low), safe)), 0.0, 255.0)
    y = round_half_even(g, gg.ggml_div(ctx, flat, g.broadcast(safe, (1, n))))
    y = g.clamp(gg.ggml_add(ctx, y, g.broadcast(zero_point, (1, n))), 0.0, 255.0)
    return g.reshape(y, pn.outputs[0].static_shape), scale, zero_point
