"""Elementwise ops in ggml: the four arithmetic ops with NumPy broadcasting, and the unary ops
ggml computes in float32.

ggml broadcasts only its second operand, and only by repeating it a whole number of times
(``ggml_can_repeat(b, a)``): a commutative op puts the full-shaped operand first; otherwise the
first operand is repeated to the output's shape (``ggml_repeat_4d``) before the op."""

from __future__ import annotations

from math import prod

import numpy as np

from . import BOOL, EXACT, F32, HALF, SMALL_INTS, Builder, const_value, ggml_op


def operand(pn, i: int, g: Builder):
    """Input ``i`` as a tensor: a weight (float32, as stored; a bool as 0/1) or an activation."""
    v = pn.inputs[i]
    return g.weight(v) if g.is_weight(v) else g.t(v)


def check_broadcast(pn) -> str | None:
    """Why ggml cannot broadcast this node's inputs to its output shape, or None when it can."""
    out = pn.outputs[0].static_shape
    for v in pn.inputs:
        s = v.static_shape
        if len(s) > len(out) or any(d not in (1, o) for d, o in zip(reversed(s), reversed(out))):
            return f"shape {list(s)} does not broadcast to {list(out)}"
    return None


BINARY = {"Add": ("ggml_add", True), "Sub": ("ggml_sub", False), "Mul": ("ggml_mul", True),
          "Div": ("ggml_div", False)}


@ggml_op(*BINARY, check=check_broadcast)
def binary(pn, g: Builder):
    name, commutative = BINARY[pn.op_type]
    out = pn.outputs[0].static_shape
    a, b = pn.inputs
    ta, tb = operand(pn, 0, g), operand(pn, 1, g)
    full_a = tuple(a.static_shape) == tuple(out)
    if not full_a and commutative and tuple(b.static_shape) == tuple(out):
        ta, tb = tb, ta
    elif not full_a:
        ta = g.broadcast(ta, out)
    return getattr(g.ggml, name)(g.ctx, g.contiguous(ta), g.contiguous(tb))


UNARY = {"Relu": "ggml_relu", "Sigmoid": "ggml_sigmoid", "Tanh": "ggml_tanh", "Exp": "ggml_exp",
         "Log": "ggml_log", "Sqrt": "ggml_sqrt", "Neg": "ggml_neg", "Abs": "ggml_abs", "Sin": "ggml_sin",
         "Cos": "ggml_cos", "Floor": "ggml_floor", "Ceil": "ggml_ceil", "Softplus": "ggml_softplus",
         "HardSwish": "ggml_hardswish", "Sign": "ggml_sgn"}


@ggml_op(*UNARY)
def unary(pn, g: Builder):
    return getattr(g.ggml, UNARY[pn.op_type])(g.ctx, g.contiguous(operand(pn, 0, g)))


@ggml_op("Identity", dtypes=EXACT)
def identity(pn, g: Builder):
    return g.ggml.ggml_cont(g.ctx, operand(pn, 0, g))


def _check_dropout(pn) -> str | None:
    training = False
    if pn.op_type == "Dropout" and len(pn.inputs) > 2 and pn.inputs[2] is not None:
        training = bool(np.asarray(pn.inputs[2].value))
    ratio = const_value(pn, 1) if pn.opset >= 12 else None
    ratio = float(pn.kwargs.get("ratio", 0.5)) if ratio is None else float(ratio.reshape(()))
    if training and ratio != 0:
        return "training mode"
    if len(pn.outputs) > 1 and pn.outputs[1].name and pn.outputs[1].dtype != BOOL:
        return f"a {pn.outputs[1].dtype} mask"
    return None


@ggml_op("Dropout", check=_check_dropout, folded=(1, 2), dtypes=(F32, BOOL))
def dropout(pn, g: Builder):
    """Inference (or a ratio of 0): the input, and a mask of ones (every element kept)."""
    y = g.ggml.ggml_cont(g.ctx, operand(pn, 0, g))
    if len(pn.outputs) < 2 or not pn.outputs[1].name:
        return y
    return y, g.ggml.ggml_cont(g.ctx, g.constant(np.ones(pn.outputs[1].static_shape, np.float32)))


def _gelu_check(pn) -> str | None:
    approximate = pn.kwargs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return None if approximate in ("none", "tanh") else f"approximate={approximate!r}"


@ggml_op("Gelu", check=_gelu_check)
def gelu(pn, g: Builder):
    """``ggml_gelu_erf`` is within 3.8e-7 of float64 (scripts/patches/ggml-f32-elementwise.patch:
    a fitted erfc, vectorized, relative accuracy kept in the negative tail); ``ggml_gelu`` (the
    tanh form) reads a float16 table (errors up to 2e-3), so the tanh form is composed.
    0.5 (1 + tanh u) is sigmoid(2u), and with d = 2 sqrt(2/pi) (1 + 0.044715 x^2) >= 1.59,
    2u = x d: GELU = x sigmoid(x d) = silu(x d) / d. ggml's silu is vectorized (its tanh calls
    libm per element): 0.8 ms instead of 14 for one of GPT-2's [128, 3072] activations on one
    thread, relative error 1e-6 against float64 (the tanh composition: 8e-5). ±inf give NaN
    (inf / inf), not ±inf or 0."""
    approximate = pn.kwargs.get("approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    x = g.contiguous(operand(pn, 0, g))
    gg, ctx = g.ggml, g.ctx
    if approximate != "tanh":
        return gg.ggml_gelu_erf(ctx, x)
    c = float(2 * np.sqrt(2 / np.pi))
    d = gg.ggml_scale_bias(ctx, gg.ggml_sqr(ctx, x), c * 0.044715, c)
    return gg.ggml_div(ctx, gg.ggml_silu(ctx, gg.ggml_mul(ctx, x, d)), d)


@ggml_op("LeakyRelu")
def leaky_relu(pn, g: Builder):
    return g.ggml.ggml_leaky_relu(g.ctx, g.contiguous(operand(pn, 0, g)), float(pn.kwargs.get("alpha", 0.01)), False)


@ggml_op("HardSigmoid")
def hard_sigmoid(pn, g: Builder):
    x = g.ggml.ggml_scale_bias(g.ctx, g.contiguous(operand(pn, 0, g)), float(pn.kwargs.get("alpha", 0.2)),
                               float(pn.kwargs.get("beta", 0.5)))
    return g.clamp(x, 0.0, 1.0)


def _clip_bounds(pn):
    if pn.opset < 11:
        return float(pn.kwargs.get("min", -np.inf)), float(pn.kwargs.get("max", np.inf))
    lo = const_value(pn, 1)
    hi = const_value(pn, 2)
    return (float(lo.reshape(())) if lo is not None else -np.inf), (float(hi.reshape(())) if hi is not None else np.inf)


def _check_clip(pn) -> str | None:
    if pn.opset >= 11:
        for i in (1, 2):
            v = pn.inputs[i] if len(pn.inputs) > i else None
            if v is not None and (v.kind != "constant" or np.size(v.value) != 1):
                return f"bound {v.name!r} given at run time"
    return None


@ggml_op("Clip", check=_check_clip, folded=(1, 2), dtypes=(F32, *SMALL_INTS))
def clip(pn, g: Builder):
    lo, hi = _clip_bounds(pn)
    if lo > hi:
        lo = hi  # ONNX: min > max gives max everywhere
    # ggml_clamp takes float bounds; infinities pass through ctypes as IEEE values.
    return g.clamp(operand(pn, 0, g), lo, hi)


def _exponents(pn) -> np.ndarray:
    """The exponent, broadcast to the output: a constant, or data the program was built for."""
    return np.broadcast_to(np.asarray(pn.inputs[1].value, dtype=np.float64), pn.outputs[0].static_shape)


def _check_pow(pn) -> str | None:
    x, out = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) > len(out) or any(d not in (1, o) for d, o in zip(reversed(x), reversed(out))):
        return f"shape {list(x)} does not broadcast to {list(out)}"
    values = np.unique(_exponents(pn))
    if not np.isfinite(values).all():
        return "an infinite or NaN exponent"
    if len(values) > 1 and 2 * prod(out) >= 2 ** 24:
        return "more than 2**23 elements (the picked positions are counted in float32)"
    return None


def _power(g: Builder, x, e: float, shape):
    """``x ** e``: an integer power by squaring (a negative one its reciprocal), ``sqrt`` for 0.5,
    else ``exp(e * log(x))`` (NaN below 0, as NumPy's float power)."""
    gg, ctx = g.ggml, g.ctx
    if e != round(e):
        size = gg.ggml_abs(ctx, x)
        y = gg.ggml_sqrt(ctx, size) if e == 0.5 else gg.ggml_exp(ctx, gg.ggml_scale(ctx, gg.ggml_log(ctx, size), e))
        return _nan_below_zero(g, x, y, None, shape)
    n, y, base = abs(int(e)), None, x
    while n:
        if n & 1:
            y = base if y is None else gg.ggml_mul(ctx, y, base)
        n >>= 1
        if n:
            base = gg.ggml_sqr(ctx, base)
    if y is None:  # x ** 0 is 1, NaN and inf included
        return gg.ggml_cont(ctx, g.constant(np.ones(shape, np.float32)))
    if y is x:
        y = gg.ggml_cont(ctx, x)
    return gg.ggml_div(ctx, g.constant(np.ones(shape, np.float32)), y) if e < 0 else y


def _nan_below_zero(g: Builder, x, y, where, shape):
    """``y`` with NaN where ``x`` is negative and finite (a fractional power of it; -inf's is
    inf or 0, as C's pow), and only where the constant 0/1 ``where`` is 1 when given."""
    gg, ctx = g.ggml, g.ctx
    finite = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_sub(ctx, x, x), 1.0, 1.0))
    mask = gg.ggml_mul(ctx, gg.ggml_step(ctx, gg.ggml_neg(ctx, x)), finite)
    if where is not None:
        mask = gg.ggml_mul(ctx, mask, g.constant(where))
    return select(g, mask, g.constant(np.full(shape, np.nan, np.float32)), y, shape)


def _general_power(g: Builder, x, e: np.ndarray, shape):
    """``x ** e`` for many exponents: ``exp(e * log|x|)``, then the sign of an odd whole power,
    NaN for a fractional power of a negative number, 1 where ``e`` is 0."""
    gg, ctx = g.ggml, g.ctx
    whole = e == np.round(e)
    log = gg.ggml_log(ctx, gg.ggml_abs(ctx, x))
    y = gg.ggml_exp(ctx, gg.ggml_mul(ctx, log, g.constant(e.astype(np.float32))))
    if not whole.all():
        y = _nan_below_zero(g, x, y, (~whole).astype(np.float32), shape)
    odd = (whole & (np.abs(np.fmod(e, 2)) == 1)).astype(np.float32)
    if odd.any():  # times -1 where x < 0 and the power is odd (exact)
        flip = gg.ggml_mul(ctx, gg.ggml_step(ctx, gg.ggml_neg(ctx, x)), g.constant(-2 * odd))
        y = gg.ggml_mul(ctx, y, gg.ggml_scale_bias(ctx, flip, 1.0, 1.0))
    if (e == 0).any():
        y = select(g, g.constant((e == 0).astype(np.float32)), g.constant(np.ones(shape, np.float32)), y, shape)
    return y


@ggml_op("Pow", check=_check_pow, folded=(1,))
def power(pn, g: Builder):
    """One power per distinct exponent value (at most 8; integers up to 64 by squaring), each
    element picked from its own (:func:`select` by a constant mask); more values:
    :func:`_general_power`."""
    out = pn.outputs[0].static_shape
    x = g.broadcast(g.contiguous(operand(pn, 0, g)), out)
    e = _exponents(pn)
    values = np.unique(e)
    if len(values) > 8 or (np.abs(values[values == np.round(values)]) > 64).any():
        return _general_power(g, x, np.ascontiguousarray(e), out)
    y = _power(g, x, float(values[0]), out)
    for value in values[1:]:
        y = select(g, g.constant((e == value).astype(np.float32)), _power(g, x, float(value), out), y, out)
    return y


@ggml_op("Reciprocal")
def reciprocal(pn, g: Builder):
    x = g.contiguous(operand(pn, 0, g))
    one = g.constant(np.ones(1, np.float32))
    return g.ggml.ggml_div(g.ctx, g.broadcast(one, pn.outputs[0].static_shape), x)


def _check_where(pn) -> str | None:
    cond, a, b = pn.inputs
    if cond.dtype != BOOL:
        return f"a {cond.dtype} condition"
    if 2 * prod(pn.outputs[0].static_shape) >= 2 ** 24:
        return "more than 2**23 elements (the picked positions are counted in float32)"
    return check_broadcast(pn)


@ggml_op("Where", check=_check_where, dtypes=EXACT)
def where(pn, g: Builder):
    """A constant condition with one constant branch (a causal mask): ``x * keep + fill``,
    ``keep`` 1 where the computed branch is taken and ``fill`` the constant branch elsewhere (0
    where ``keep`` is 1). Otherwise each output element is picked by :func:`select`."""
    cond, a, b = pn.inputs
    out = pn.outputs[0].static_shape
    if cond.kind != "constant" or (a.kind == "constant") == (b.kind == "constant"):
        return select(g, *(g.broadcast(g.contiguous(operand(pn, i, g)), out) for i in range(3)), out)
    keep = np.broadcast_to(np.asarray(cond.value, dtype=bool), out)
    computed, other = (1, b) if b.kind == "constant" else (2, a)
    if computed == 2:
        keep = ~keep
    fill = np.where(keep, 0.0, np.broadcast_to(np.asarray(other.value, dtype=np.float32), out))
    x = g.broadcast(g.contiguous(operand(pn, computed, g)), out)
    masked = g.ggml.ggml_mul(g.ctx, x, g.constant(keep.astype(np.float32)))
    return g.ggml.ggml_add(g.ctx, masked, g.constant(fill))


def _check_same_dtype(pn) -> str | None:
    # why_not_ggml has checked float32, bool or small integers in and out: the same dtype is a
    # copy, bool or an integer to float32 too (exact), float32 to bool a test.
    src, dst = pn.inputs[0].dtype, pn.outputs[0].dtype
    if src == F32 and dst in SMALL_INTS:  # truncated in ggml; out of range as NumPy's cast
        return None
    half = tuple(HALF.values())
    if src in half or dst in half:  # ggml converts float32 to and from float16 or bfloat16
        return None if F32 in (src, dst) or src == dst else f"a cast from {src} to {dst}"
    if dst == src or dst == F32 or BOOL in (src, dst):
        return None
    return f"a cast from {src} to {dst}"


@ggml_op("Cast", "CastLike", check=_check_same_dtype, dtypes=(*EXACT, *HALF.values()), dtype_only=(1,))
def cast(pn, g: Builder):
    x = operand(pn, 0, g)
    types = {dtype: getattr(g.ggml, name) for name, dtype in HALF.items()}
    src, dst = pn.inputs[0].dtype, pn.outputs[0].dtype
    if src in types or dst in types:  # a half input stays half until here (a constant is float32)
        want = types.get(dst, g.ggml.GGML_TYPE_F32)
        if x.contents.type != want:
            return g.ggml.ggml_cast(g.ctx, g.contiguous(x), want)
        return g.ggml.ggml_cont(g.ctx, x)
    if pn.outputs[0].dtype in SMALL_INTS and pn.inputs[0].dtype == F32:  # toward zero, as C's cast
        return g.ggml.ggml_trunc(g.ctx, g.contiguous(x))
    if pn.outputs[0].dtype == BOOL and pn.inputs[0].dtype != BOOL:  # x != 0, NaN included
        gg, ctx = g.ggml, g.ctx
        x = g.contiguous(x)
        finite = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_sub(ctx, x, x), 1.0, 1.0))
        signed = gg.ggml_add(ctx, gg.ggml_step(ctx, x), gg.ggml_step(ctx, gg.ggml_neg(ctx, x)))
        zero = gg.ggml_mul(ctx, finite, gg.ggml_scale_bias(ctx, signed, -1.0, 1.0))
        return gg.ggml_scale_bias(ctx, zero, -1.0, 1.0)
    return g.ggml.ggml_cont(g.ctx, x)


def _negative_part(g: Builder, x):
    """``min(x, 0)``, exactly."""
    gg = g.ggml
    return gg.ggml_neg(g.ctx, gg.ggml_relu(g.ctx, gg.ggml_neg(g.ctx, x)))


def _select(g: Builder, keep_a, a, b):
    """``a`` where ``keep_a`` is 1, ``b`` where it is 0: each product is exact (by 1 or 0)."""
    gg = g.ggml
    keep_b = gg.ggml_scale_bias(g.ctx, keep_a, -1.0, 1.0)
    return gg.ggml_add(g.ctx, gg.ggml_mul(g.ctx, a, keep_a), gg.ggml_mul(g.ctx, b, keep_b))


def _check_elu(pn) -> str | None:
    return "alpha=0" if pn.op_type == "Celu" and float(pn.kwargs.get("alpha", 1.0)) == 0 else None


@ggml_op("Elu", "Selu", "Celu", check=_check_elu)
def elu_family(pn, g: Builder):
    """``relu(x) + alpha * expm1(min(x, 0))`` (ggml's elu is alpha=1: expm1 below zero), Selu
    scaled by gamma, Celu with ``x / alpha`` inside the expm1."""
    gg, k = g.ggml, pn.kwargs
    x = g.contiguous(operand(pn, 0, g))
    default_alpha = {"Elu": 1.0, "Celu": 1.0, "Selu": 1.67326319217681884765625}[pn.op_type]
    alpha = float(k.get("alpha", default_alpha))
    inner = _negative_part(g, x)
    if pn.op_type == "Celu":
        inner = gg.ggml_scale(g.ctx, inner, 1.0 / alpha) if alpha != 1.0 else inner
    y = gg.ggml_add(g.ctx, gg.ggml_relu(g.ctx, x), gg.ggml_scale(g.ctx, gg.ggml_elu(g.ctx, inner), alpha))
    if pn.op_type == "Selu":
        y = gg.ggml_scale(g.ctx, y, float(k.get("gamma", 1.05070102214813232421875)))
    return y


@ggml_op("ThresholdedRelu")
def thresholded_relu(pn, g: Builder):
    gg = g.ggml
    x = g.contiguous(operand(pn, 0, g))
    # x - alpha > 0 exactly when x > alpha (float subtraction of unequal values is never 0).
    keep = gg.ggml_step(g.ctx, gg.ggml_scale_bias(g.ctx, x, 1.0, -float(pn.kwargs.get("alpha", 1.0))))
    return gg.ggml_mul(g.ctx, x, keep)


@ggml_op("Softsign")
def softsign(pn, g: Builder):
    gg = g.ggml
    x = g.contiguous(operand(pn, 0, g))
    return gg.ggml_div(g.ctx, x, gg.ggml_scale_bias(g.ctx, gg.ggml_abs(g.ctx, x), 1.0, 1.0))


@ggml_op("Mish")
def mish(pn, g: Builder):
    gg = g.ggml
    x = g.contiguous(operand(pn, 0, g))
    return gg.ggml_mul(g.ctx, x, gg.ggml_tanh(g.ctx, gg.ggml_softplus(g.ctx, x)))


@ggml_op("Swish")
def swish(pn, g: Builder):
    gg = g.ggml
    x = g.contiguous(operand(pn, 0, g))
    alpha = float(pn.kwargs.get("alpha", 1.0))
    return gg.ggml_mul(g.ctx, x, gg.ggml_sigmoid(g.ctx, gg.ggml_scale(g.ctx, x, alpha) if alpha != 1.0 else x))


def _check_prelu(pn) -> str | None:
    out = pn.outputs[0].static_shape
    if tuple(pn.inputs[0].static_shape) != tuple(out):
        return "a slope larger than the input"
    return check_broadcast(pn)


@ggml_op("PRelu", check=_check_prelu)
def prelu(pn, g: Builder):
    gg = g.ggml
    x = g.contiguous(operand(pn, 0, g))
    slope = g.contiguous(operand(pn, 1, g))
    # relu(x) + slope * min(x, 0): one of the two terms is exactly zero.
    return gg.ggml_add(g.ctx, gg.ggml_relu(g.ctx, x), gg.ggml_mul(g.ctx, _negative_part(g, x), slope))


def _check_variadic(pn) -> str | None:
    if not [v for v in pn.inputs if v is not None]:
        return "no inputs"
    if pn.op_type in ("Sum", "Mean") and pn.outputs[0].dtype != F32:
        return f"{pn.outputs[0].dtype} sums (float32 would not wrap as the integer type does)"
    return check_broadcast(pn)


@ggml_op("Sum", "Mean", "Max", "Min", check=_check_variadic, dtypes=(F32, *SMALL_INTS))
def variadic(pn, g: Builder):
    """Sum and Mean add; Max and Min pick with a 0/1 mask from ``step`` (exact, no rounding)."""
    gg = g.ggml
    out = pn.outputs[0].static_shape
    parts = [g.broadcast(g.contiguous(operand(pn, i, g)), out) for i, v in enumerate(pn.inputs) if v is not None]
    y = parts[0]
    for t in parts[1:]:
        if pn.op_type in ("Sum", "Mean"):
            y = gg.ggml_add(g.ctx, y, t)
        else:
            diff = gg.ggml_sub(g.ctx, t, y) if pn.op_type == "Max" else gg.ggml_sub(g.ctx, y, t)
            y = _select(g, gg.ggml_step(g.ctx, diff), t, y)
    if pn.op_type == "Mean" and len(parts) > 1:
        y = gg.ggml_scale(g.ctx, y, 1.0 / len(parts))
    return y if len(parts) > 1 else gg.ggml_cont(g.ctx, y)


@ggml_op("Sinh", "Cosh", "Tan")
def hyperbolic(pn, g: Builder):
    """sinh from ``expm1`` (no cancellation near 0), cosh from ``exp``, tan as sin / cos."""
    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    if pn.op_type == "Tan":
        return gg.ggml_div(ctx, gg.ggml_sin(ctx, x), gg.ggml_cos(ctx, x))
    fn = gg.ggml_expm1 if pn.op_type == "Sinh" else gg.ggml_exp
    a, b = fn(ctx, x), fn(ctx, gg.ggml_neg(ctx, x))
    return gg.ggml_scale(ctx, gg.ggml_sub(ctx, a, b) if pn.op_type == "Sinh" else gg.ggml_add(ctx, a, b), 0.5)


# ---- bools: float32 0.0 / 1.0 inside a graph ------------------------------------------------
def _not_nan(g: Builder, x):
    """1 where ``x`` is not NaN: finite (``x - x + 1 > 0``; NaN for inf and NaN) or nonzero
    (``step(x) + step(-x)``: 1 for +-inf, 0 for NaN)."""
    gg, ctx = g.ggml, g.ctx
    finite = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_sub(ctx, x, x), 1.0, 1.0))
    signed = gg.ggml_add(ctx, gg.ggml_step(ctx, x), gg.ggml_step(ctx, gg.ggml_neg(ctx, x)))
    return gg.ggml_add(ctx, finite, gg.ggml_mul(ctx, gg.ggml_scale_bias(ctx, finite, -1.0, 1.0), signed))


def _greater(g: Builder, a, b):
    """``a > b``: ``step(a - b)`` (inf - inf and NaN are not > 0; subnormal differences are kept)."""
    return g.ggml.ggml_step(g.ctx, g.ggml.ggml_sub(g.ctx, a, b))


def _equal(g: Builder, a, b):
    """``a == b``: neither side greater, and neither NaN (inf - inf is NaN, inf == inf)."""
    gg, ctx = g.ggml, g.ctx
    either = gg.ggml_add(ctx, _greater(g, a, b), _greater(g, b, a))
    same = gg.ggml_scale_bias(ctx, either, -1.0, 1.0)
    return gg.ggml_mul(ctx, gg.ggml_mul(ctx, same, _not_nan(g, a)), _not_nan(g, b))


def _check_compare(pn) -> str | None:
    if pn.outputs[0].dtype != BOOL:
        return "an output other than bool"
    return check_broadcast(pn)


@ggml_op("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal", check=_check_compare, dtypes=EXACT)
def compare(pn, g: Builder):
    out = pn.outputs[0].static_shape
    a, b = (g.broadcast(g.contiguous(operand(pn, i, g)), out) for i in range(2))
    op = pn.op_type
    if op in ("Less", "LessOrEqual"):
        a, b = b, a
    if op == "Equal":
        return _equal(g, a, b)
    if op in ("Greater", "Less"):
        return _greater(g, a, b)
    return g.ggml.ggml_add(g.ctx, _greater(g, a, b), _equal(g, a, b))  # exclusive: a sum of 0/1


def _check_logic(pn) -> str | None:
    return check_broadcast(pn)


@ggml_op("Not", "And", "Or", "Xor", check=_check_logic, dtypes=(BOOL,))
def logic(pn, g: Builder):
    """On 0/1: not ``1 - a``, and ``a * b``, or ``step(a + b)``, xor ``|a - b|``."""
    gg, ctx = g.ggml, g.ctx
    if pn.op_type == "Not":
        return gg.ggml_scale_bias(ctx, g.contiguous(operand(pn, 0, g)), -1.0, 1.0)
    out = pn.outputs[0].static_shape
    a, b = (g.broadcast(g.contiguous(operand(pn, i, g)), out) for i in range(2))
    if pn.op_type == "And":
        return gg.ggml_mul(ctx, a, b)
    if pn.op_type == "Or":
        return gg.ggml_step(ctx, gg.ggml_add(ctx, a, b))
    return gg.ggml_abs(ctx, gg.ggml_sub(ctx, a, b))


def _check_is(pn) -> str | None:
    return None if pn.inputs[0].dtype == F32 and pn.outputs[0].dtype == BOOL else "an input other than float32"


@ggml_op("IsNaN", "IsInf", check=_check_is, dtypes=(F32, BOOL))
def is_special(pn, g: Builder):
    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    not_nan = _not_nan(g, x)
    if pn.op_type == "IsNaN":
        return gg.ggml_scale_bias(ctx, not_nan, -1.0, 1.0)
    finite = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_sub(ctx, x, x), 1.0, 1.0))
    inf = gg.ggml_mul(ctx, not_nan, gg.ggml_scale_bias(ctx, finite, -1.0, 1.0))
    positive, negative = int(pn.kwargs.get("detect_positive", 1)), int(pn.kwargs.get("detect_negative", 1))
    if positive and negative:
        return inf
    if not positive and not negative:
        return gg.ggml_scale(ctx, inf, 0.0)
    side = gg.ggml_step(ctx, x if positive else gg.ggml_neg(ctx, x))
    return gg.ggml_mul(ctx, inf, side)


def _check_shrink(pn) -> str | None:
    return None if 2 * prod(pn.outputs[0].static_shape) < 2 ** 24 else "more than 2**23 elements"


@ggml_op("Shrink", check=_check_shrink)
def shrink(pn, g: Builder):
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between: picked by
    :func:`select` (no product with an infinite ``x``)."""
    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    lambd, bias = float(pn.kwargs.get("lambd", 0.5)), float(pn.kwargs.get("bias", 0.0))
    out = pn.outputs[0].static_shape
    above = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, x, 1.0, -lambd))  # x > lambd
    below = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, x, -1.0, -lambd))  # x < -lambd
    zero = g.constant(np.zeros(out, np.float32))
    inner = select(g, below, gg.ggml_scale_bias(ctx, x, 1.0, bias), zero, out)
    return select(g, above, gg.ggml_scale_bias(ctx, x, 1.0, -bias), inner, out)


def select(g: Builder, c, x, y, shape):
    """``x`` where ``c`` (float32 0/1) is 1, ``y`` where it is 0, all three of NumPy ``shape``
    (at most 2**23 elements): each element picked by ``get_rows`` from ``x`` and ``y`` stacked
    (``x * c + y * (1 - c)`` would turn an infinite value not taken into NaN)."""
    gg, ctx = g.ggml, g.ctx
    n = prod(shape)
    c, x, y = (g.reshape(t, (n, 1)) for t in (c, x, y))
    # Row i of x for c = 1, row n + i of y for c = 0.
    rows = gg.ggml_add(ctx, gg.ggml_scale_bias(ctx, g.reshape(c, (n,)), -float(n), float(n)),
                       g.constant(np.arange(n, dtype=np.float32)))
    picked = gg.ggml_get_rows(ctx, gg.ggml_concat(ctx, x, y, 1), gg.ggml_cast(ctx, rows, gg.GGML_TYPE_I32))
    return g.reshape(picked, shape)


def round_half_even(g: Builder, t):
    """``t`` rounded to the nearest integer, ties to even (NumPy's round): ``floor(t + 0.5)``,
    less 1 on a tie that lands on an odd number."""
    gg, ctx = g.ggml, g.ctx
    shifted = gg.ggml_scale_bias(ctx, t, 1.0, 0.5)
    r = gg.ggml_floor(ctx, shifted)
    tie = gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, gg.ggml_sub(ctx, shifted, r)), -1.0, 1.0)
    odd = gg.ggml_sub(ctx, r, gg.ggml_scale(ctx, gg.ggml_floor(ctx, gg.ggml_scale(ctx, r, 0.5)), 2.0))
    return gg.ggml_sub(ctx, r, gg.ggml_mul(ctx, tie, odd))


@ggml_op("Round")
def round_(pn, g: Builder):
    """Half to even, as NumPy (``ggml_round`` rounds half away from zero)."""
    return round_half_even(g, g.contiguous(operand(pn, 0, g)))


def _check_erf(pn) -> str | None:
    return None if 2 * prod(pn.outputs[0].static_shape) < 2 ** 24 else "more than 2**23 elements"


@ggml_op("Erf", check=_check_erf)
def erf(pn, g: Builder):
    """ggml has erf only inside ``gelu_erf(u) = u (1 + erf(u / sqrt 2)) / 2``: ``erf(z) =
    2 gelu_erf(z sqrt 2) / (z sqrt 2) - 1`` for |z| >= 0.5, and below, where that subtraction
    cancels, the Taylor series to z**11 (both within 5e-7 of erf in float32); z is clamped to
    [-10, 10] first (erf is +-1 there in float32; inf / inf would be NaN), and NaN kept."""
    gg, ctx = g.ggml, g.ctx
    x = g.contiguous(operand(pn, 0, g))
    z = g.clamp(x, -10.0, 10.0)
    out = pn.outputs[0].static_shape
    u = gg.ggml_scale(ctx, z, float(np.sqrt(2.0)))
    wide = gg.ggml_scale_bias(ctx, gg.ggml_div(ctx, gg.ggml_scale(ctx, gg.ggml_gelu_erf(ctx, u), 2.0), u), 1.0, -1.0)
    square = gg.ggml_sqr(ctx, z)
    series = gg.ggml_scale_bias(ctx, square, -1.0 / 1320, 1.0 / 216)
    for c in (-1.0 / 42, 1.0 / 10, -1.0 / 3, 1.0):  # Horner in z**2
        series = gg.ggml_scale_bias(ctx, gg.ggml_mul(ctx, series, square), 1.0, c)
    near = gg.ggml_scale(ctx, gg.ggml_mul(ctx, series, z), float(2 / np.sqrt(np.pi)))
    small = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_abs(ctx, z), -1.0, 0.5))  # |z| < 0.5
    y = select(g, small, near, wide, out)
    return select(g, gg.ggml_scale_bias(ctx, _not_nan(g, x), -1.0, 1.0), x, y, out)  # NaN stays NaN


def _check_mod(pn) -> str | None:
    if any(v.dtype not in SMALL_INTS for v in pn.inputs):
        return "values other than int8/int16/uint8/uint16 (a float remainder is not exact here)"
    if 2 * prod(pn.outputs[0].static_shape) >= 2 ** 24:
        return "more than 2**23 elements"
    return check_broadcast(pn)


@ggml_op("Mod", check=_check_mod, dtypes=SMALL_INTS)
def mod(pn, g: Builder):
    """``a - floor(a / b) * b`` (``trunc`` with fmod=1): exact for 16-bit integers in float32 (the
    quotient's error is below 1 / |b|); 0 where ``b`` is 0, as NumPy."""
    gg, ctx = g.ggml, g.ctx
    out = pn.outputs[0].static_shape
    a, b = (g.broadcast(g.contiguous(operand(pn, i, g)), out) for i in range(2))
    quotient = gg.ggml_div(ctx, a, b)
    whole = gg.ggml_trunc(ctx, quotient) if int(pn.kwargs.get("fmod", 0)) else gg.ggml_floor(ctx, quotient)
    rest = gg.ggml_sub(ctx, a, gg.ggml_mul(ctx, whole, b))
    zero = gg.ggml_scale_bias(ctx, gg.ggml_add(ctx, gg.ggml_step(ctx, b), gg.ggml_step(ctx, gg.ggml_neg(ctx, b))),
                              -1.0, 1.0)
    return select(g, zero, g.constant(np.zeros(out, np.float32)), rest, out)
