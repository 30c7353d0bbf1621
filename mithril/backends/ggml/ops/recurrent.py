"""Recurrent ops in ggml: RNN, GRU and LSTM unrolled over the (fixed) sequence, and
CausalConvWithState. Moved from :mod:`.nn`; registered the same way (the program imports every
family module)."""

from __future__ import annotations

import numpy as np

from . import Builder, Stack, ggml_op
from .elementwise import operand
from .nn import as_text


GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _check_recurrent(pn) -> str | None:
    ins = list(pn.inputs) + [None] * (8 - len(pn.inputs))
    if ins[4] is not None:
        return "sequence_lens (lengths known only at run time)"
    k = pn.kwargs
    default = {"RNN": ["tanh"], "GRU": ["sigmoid", "tanh"], "LSTM": ["sigmoid", "tanh", "tanh"]}[pn.op_type]
    acts = [as_text(a).lower() for a in (k.get("activations") or [])]
    if acts and acts != default * (len(acts) // len(default)):
        return f"activations {acts} (ggml here: the defaults)"
    if k.get("clip") is not None or int(k.get("input_forget") or 0):
        return "clip or input_forget"
    if len(pn.inputs[0].static_shape) != 3:
        return "an input that is not 3-D"
    x = pn.inputs[0].static_shape
    b, i_size = (x[0], x[2]) if int(k.get("layout") or 0) else (x[1], x[2])
    h = int(k.get("hidden_size") or 0)
    dirs = 2 if as_text(k.get("direction") or "forward") == "bidirectional" else 1
    n = GATES[pn.op_type]
    want = {1: (dirs, n * h, i_size), 2: (dirs, n * h, h), 3: (dirs, 2 * n * h), 7: (dirs, 3 * h)}
    for i, shape in want.items():
        if i < len(ins) and ins[i] is not None and tuple(ins[i].static_shape) != shape:
            return f"input {i} of shape {list(ins[i].static_shape)}, not {list(shape)}"
    state = (b, dirs, h) if int(k.get("layout") or 0) else (dirs, b, h)
    for i in (5, 6):
        if ins[i] is not None and tuple(ins[i].static_shape) != state:
            return f"an initial state of shape {list(ins[i].static_shape)}"
    return None


@ggml_op("RNN", "GRU", "LSTM", check=_check_recurrent)
def recurrent(pn, g: Builder):
    """Unrolled over the (fixed) sequence: per step and direction, two ``mul_mat`` (input and
    hidden state) and the gates of ONNX's default activations (sigmoid, tanh)."""
    gg, ctx, k = g.ggml, g.ctx, pn.kwargs
    ins = list(pn.inputs) + [None] * (8 - len(pn.inputs))
    op = pn.op_type
    n_gates = GATES[op]
    layout = int(k.get("layout") or 0)
    xs = pn.inputs[0].static_shape
    s, b, i_size = (xs[1], xs[0], xs[2]) if layout else xs
    h = int(k["hidden_size"])
    direction = as_text(k.get("direction") or "forward")
    dirs = 2 if direction == "bidirectional" else 1
    f = 4
    x = g.contiguous(operand(pn, 0, g))
    w_all, r_all = (g.contiguous(operand(pn, i, g)) for i in (1, 2))
    bias = g.contiguous(operand(pn, 3, g)) if ins[3] is not None else None
    peep = g.contiguous(operand(pn, 7, g)) if op == "LSTM" and ins[7] is not None else None

    def state(i, d):
        if ins[i] is None:
            return g.constant(np.zeros((b, h), np.float32))
        t = g.contiguous(operand(pn, i, g))
        if layout:  # (B, D, H)
            return gg.ggml_cont(ctx, gg.ggml_view_2d(ctx, t, h, b, dirs * h * f, d * h * f))
        return gg.ggml_cont(ctx, gg.ggml_view_2d(ctx, t, h, b, h * f, d * b * h * f))

    def gate(t, j):  # gate j of a (B, G*H) result
        return gg.ggml_cont(ctx, gg.ggml_view_2d(ctx, t, h, b, n_gates * h * f, j * h * f))

    def vec(t, j, offset):  # a 1-D slice of H values at (offset + j) * H
        return gg.ggml_view_1d(ctx, t, h, (offset + j) * h * f)

    # Y, each direction's steps stacked along time as they are made (Stack: a few blocks alive,
    # not every step): (H, B, 1, S) with layout 0, (H, 1, S, B) with layout 1.
    step_ne, time_dim = ((h, 1, 1, b), 2) if layout else ((h, b, 1, 1), 3)
    ys, finals, cells = [], [], []
    for d in range(dirs):
        w = gg.ggml_view_2d(ctx, w_all, i_size, n_gates * h, i_size * f, d * n_gates * h * i_size * f)
        r = gg.ggml_view_2d(ctx, r_all, h, n_gates * h, h * f, d * n_gates * h * h * f)
        wb = rb = None
        if bias is not None:
            wb = gg.ggml_view_1d(ctx, bias, n_gates * h, d * 2 * n_gates * h * f)
            rb = gg.ggml_view_1d(ctx, bias, n_gates * h, (d * 2 + 1) * n_gates * h * f)
        hs = state(5, d)
        cs = state(6, d) if op == "LSTM" else None
        reverse = direction == "reverse" or d == 1
        steps = Stack(g, time_dim, reverse)
        for t in (range(s - 1, -1, -1) if reverse else range(s)):
            if layout:
                xt = gg.ggml_cont(ctx, gg.ggml_view_2d(ctx, x, i_size, b, s * i_size * f, t * i_size * f))
            else:
                xt = gg.ggml_view_2d(ctx, x, i_size, b, i_size * f, t * b * i_size * f)
            xw = gg.ggml_mul_mat(ctx, w, xt)  # (B, G*H)
            hr = gg.ggml_mul_mat(ctx, r, hs)
            if wb is not None:
                xw = gg.ggml_add(ctx, xw, wb)
                hr = gg.ggml_add(ctx, hr, rb)
            if op == "RNN":
                hs = gg.ggml_tanh(ctx, gg.ggml_add(ctx, xw, hr))
            elif op == "GRU":
                z = gg.ggml_sigmoid(ctx, gg.ggml_add(ctx, gate(xw, 0), gate(hr, 0)))
                rr = gg.ggml_sigmoid(ctx, gg.ggml_add(ctx, gate(xw, 1), gate(hr, 1)))
                if int(k.get("linear_before_reset") or 0):
                    hh = gg.ggml_mul(ctx, rr, gate(hr, 2))
                else:
                    rh = gg.ggml_view_2d(ctx, r, h, h, h * f, 2 * h * h * f)
                    hh = gg.ggml_mul_mat(ctx, rh, gg.ggml_mul(ctx, rr, hs))
                    if rb is not None:
                        hh = gg.ggml_add(ctx, hh, vec(rb, 2, 0))
                cand = gg.ggml_tanh(ctx, gg.ggml_add(ctx, gate(xw, 2), hh))
                # (1 - z) * cand + z * h
                hs = gg.ggml_add(ctx, cand, gg.ggml_mul(ctx, z, gg.ggml_sub(ctx, hs, cand)))
            else:
                pre = [gg.ggml_add(ctx, gate(xw, j), gate(hr, j)) for j in range(4)]  # i, o, f, c
                if peep is not None:
                    pre[0] = gg.ggml_add(ctx, pre[0], gg.ggml_mul(ctx, cs, vec(peep, 0, 3 * d)))
                    pre[2] = gg.ggml_add(ctx, pre[2], gg.ggml_mul(ctx, cs, vec(peep, 2, 3 * d)))
                ig, fg = gg.ggml_sigmoid(ctx, pre[0]), gg.ggml_sigmoid(ctx, pre[2])
                cs = gg.ggml_add(ctx, gg.ggml_mul(ctx, fg, cs), gg.ggml_mul(ctx, ig, gg.ggml_tanh(ctx, pre[3])))
                if peep is not None:
                    pre[1] = gg.ggml_add(ctx, pre[1], gg.ggml_mul(ctx, cs, vec(peep, 1, 3 * d)))
                hs = gg.ggml_mul(ctx, gg.ggml_sigmoid(ctx, pre[1]), gg.ggml_tanh(ctx, cs))
            steps.add(gg.ggml_reshape_4d(ctx, hs, *step_ne))
        ys.append(steps.result())
        finals.append(hs)
        cells.append(cs)

    def stack(parts, dim, ne):
        out = None
        for p in parts:
            p = gg.ggml_reshape_4d(ctx, g.contiguous(p), *ne)
            out = p if out is None else gg.ggml_concat(ctx, out, p, dim)
        return out

    y = ys[0] if dirs == 1 else gg.ggml_concat(ctx, ys[0], ys[1], 1 if layout else 2)
    if layout:  # Y (B, S, D, H) = ne (H, D, S, B); Y_h (B, D, H) = ne (H, D, B)
        last = [stack(v, 1, (h, 1, b, 1)) for v in ((finals, cells) if op == "LSTM" else (finals,))]
    else:  # Y (S, D, B, H) = ne (H, B, D, S); Y_h (D, B, H) = ne (H, B, D)
        last = [stack(v, 2, (h, b, 1, 1)) for v in ((finals, cells) if op == "LSTM" else (finals,))]
    return [y, *last][:len(pn.outputs)]


def _check_causal_conv(pn) -> str | None:
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(x) != 3 or len(w) != 3 or w[0] != x[1] or w[1] != 1:
        return "not a depthwise (C, 1, K) kernel over (B, C, L)"
    ins = list(pn.inputs) + [None] * (4 - len(pn.inputs))
    if ins[2] is not None and tuple(ins[2].static_shape) != (x[1],):
        return "a bias that is not one per channel"
    if ins[3] is not None and tuple(ins[3].static_shape) != (x[0], x[1], w[2] - 1):
        return "a past state that is not (B, C, K - 1)"
    if as_text(pn.kwargs.get("activation") or "none") not in ("none", "silu", "swish"):
        return f"activation {pn.kwargs.get('activation')!r}"
    return None


@ggml_op("CausalConvWithState", check=_check_causal_conv)
def causal_conv_with_state(pn, g: Builder):
    """The state (or zeros) before the input along L, then ``sum_j window_j * w[:, j]`` over
    shifted views (the reference's order), bias, SiLU; the last K-1 steps are the new state."""
    gg, ctx = g.ggml, g.ctx
    b, c, n = pn.inputs[0].static_shape
    k = pn.inputs[1].static_shape[2]
    ins = list(pn.inputs) + [None] * (4 - len(pn.inputs))
    x = g.contiguous(operand(pn, 0, g))
    w = g.contiguous(operand(pn, 1, g))
    past = g.contiguous(operand(pn, 3, g)) if ins[3] is not None else g.constant(np.zeros((b, c, k - 1), np.float32))
    padded = gg.ggml_concat(ctx, past, x, 0) if k > 1 else x
    total, f = n + k - 1, 4
    y = None
    for j in range(k):
        window = gg.ggml_cont(ctx, gg.ggml_view_3d(ctx, padded, n, c, b, total * f, c * total * f, j * f))
        col = gg.ggml_reshape_3d(ctx, gg.ggml_cont(ctx, gg.ggml_view_2d(ctx, w, 1, c, k * f, j * f)), 1, c, 1)
        term = gg.ggml_mul(ctx, window, col)
        y = term if y is None else gg.ggml_add(ctx, y, term)
    if ins[2] is not None:
        y = gg.ggml_add(ctx, y, g.reshape(operand(pn, 2, g), (1, c, 1)))
    if as_text(pn.kwargs.get("activation") or "none") in ("silu", "swish"):
        y = gg.ggml_mul(ctx, y, gg.ggml_sigmoid(ctx, y))
    outs = [y]
    if len(pn.outputs) > 1:
        outs.append(gg.ggml_cont(ctx, gg.ggml_view_3d(ctx, padded, k - 1, c, b, total * f, c * total * f, n * f)))
    return outs
