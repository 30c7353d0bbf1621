"""Optimizer kernels of the ai.onnx.preview.training domain: Adagrad, Adam, Momentum.

Each takes R (learning rate), T (update count) and then n tensors X, n gradients G and n (or 2n)
state tensors, grouped by kind: X1..Xn, G1..Gn, S1..Sn; outputs are grouped the same way.
"""

from __future__ import annotations

from ..registry import kernel

TRAINING = "ai.onnx.preview.training"


def _groups(tensors, kinds, op):
    if len(tensors) % kinds:
        raise ValueError(f"{op} takes {kinds} tensors per optimized variable, got {len(tensors)}")
    n = len(tensors) // kinds
    return [tensors[i * n : (i + 1) * n] for i in range(kinds)]


def _cast(value, like, xp):
    return xp.asarray(value, dtype=like.dtype)


@kernel("Adagrad", since=1, domain=TRAINING)
def adagrad(r, t, *tensors, decay_factor, epsilon, norm_coefficient, xp):
    xs, gs, hs = _groups(tensors, 3, "Adagrad")
    rate = r / (1 + t * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        new_x.append(x - _cast(rate, x, xp) * g_reg / (xp.sqrt(h_new) + epsilon))
        new_h.append(h_new)
    return (*new_x, *new_h)


@kernel("Adam", since=1, domain=TRAINING)
def adam(r, t, *tensors, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post, xp):
    xs, gs, vs, hs = _groups(tensors, 4, "Adam")
    # Bias correction from the first step on (T > 0); T == 0 uses R as is.
    first = t <= 0
    correction = xp.sqrt(1 - beta**t) / xp.where(first, 1.0, 1 - alpha**t)
    rate = xp.where(first, r, r * correction)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - _cast(rate, x, xp) * v_new / (xp.sqrt(h_new) + epsilon)
        new_x.append((1 - norm_coefficient_post) * x_new)
        new_v.append(v_new)
        new_h.append(h_new)
    return (*new_x, *new_v, *new_h)


@kernel("Momentum", since=1, domain=TRAINING)
def momentum(r, t, *tensors, alpha, beta, mode, norm_coefficient, xp):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode {mode!r} is not 'standard' or 'nesterov'")
    xs, gs, vs = _groups(tensors, 3, "Momentum")
    beta_adjusted = xp.where(t > 0, beta, 1.0)  # the first step takes the whole gradient
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + _cast(beta_adjusted, x, xp) * g_reg
        step = g_reg + alpha * v_new if mode == "nesterov" else v_new
        new_x.append(x - _cast(r, x, xp) * step)
        new_v.append(v_new)
    return (*new_x, *new_v)
