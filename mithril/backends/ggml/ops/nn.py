"""Neural-network ops in ggml: MatMul and Gemm (``ggml_mul_mat``, weights stored transposed and
possibly quantized), Softmax, LayerNormalization, BatchNormalization, 2-D Conv (im2col, or the
depthwise kernel), the 2-D pools, the reductions and ArgMax/ArgMin, the losses. Attention is in
:mod:`.attention`, RNN/GRU/LSTM in :mod:`.recurrent`.

``ggml_mul_mat(a, b)`` multiplies along both operands' ``ne[0]``: for ``X @ W`` (X ``[.., M, K]``,
W ``[K, N]``) ``a`` is W stored as ``[N, K]`` and ``b`` is X, and the result is ``[.., M, N]``.
``a``'s batch dims must divide ``b``'s; the rules repeat the left operand when they do not."""

from __future__ import annotations

from math import prod

import numpy as np

from ...kernels.geometry import window
from . import F32, SMALL_INTS, Builder, Stack, const_value, ggml_op, ne
from .elementwise import check_broadcast, operand
from .movement import permute


def as_text(value):
    """A string attribute as str (ONNX string attributes arrive as bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def _batch_fits(small, big) -> bool:
    """Whether ggml broadcasts batch dims ``small`` over ``big`` (each divides)."""
    return all(b % s == 0 for s, b in zip(small, big))


def _check_matmul(pn) -> str | None:
    a, b = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(a) < 1 or len(b) < 1 or (pn.op_type != "MatMul" and len(b) < 2):
        return "a 1-D right operand"
    return None


def _check_matmul_add(pn) -> str | None:
    problem = _check_matmul(pn)
    if problem is None and prod(pn.inputs[2].static_shape) != pn.inputs[1].static_shape[-1]:
        return "a bias that is not one value per output column"
    return problem


@ggml_op("MatMulAdd", domain="ai.mithril", check=_check_matmul_add)
def matmul_add(pn, g: Builder):
    y = matmul(pn, g)
    n = pn.inputs[1].static_shape[-1]
    return g.ggml.ggml_add(g.ctx, y, g.reshape(operand(pn, 2, g), (n,)))


@ggml_op("MatMul", check=_check_matmul)
def matmul(pn, g: Builder):
    b = pn.inputs[1]
    out = pn.outputs[0].static_shape
    x = g.contiguous(operand(pn, 0, g))
    if len(b.static_shape) == 1:  # a vector: already ggml's [N=1, K] row
        w = g.contiguous(operand(pn, 1, g))
    elif g.is_weight(b) and len(b.static_shape) == 2:
        return g.reshape(g.linear(b, "t", x), out)  # [K, N] stored as [N, K]
    elif g.transposed_weight(b) is not None:
        return g.reshape(g.linear(g.transposed_weight(b), "rows", x), out)  # already [N, K]
    else:
        w = g.ggml.ggml_cont(g.ctx, g.ggml.ggml_transpose(g.ctx, operand(pn, 1, g)))
    # Batch dims (ggml's ne[2], ne[3]): the weight's must divide the activation's.
    wb, xb = list(w.contents.ne[2:4]), list(x.contents.ne[2:4])
    if not _batch_fits(wb, xb):
        x = g.ggml.ggml_repeat_4d(g.ctx, x, x.contents.ne[0], x.contents.ne[1], *[max(p, q) for p, q in zip(wb, xb)])
    y = g.ggml.ggml_mul_mat(g.ctx, w, x)
    return g.reshape(y, out)


@ggml_op("Gemm")
def gemm(pn, g: Builder):
    a, b = pn.inputs[0], pn.inputs[1]
    c = pn.inputs[2] if len(pn.inputs) > 2 else None
    k = pn.kwargs
    x = operand(pn, 0, g)
    if k.get("transA"):
        x = g.ggml.ggml_transpose(g.ctx, x)
    x = g.contiguous(x)
    if g.is_weight(b):
        y = g.linear(b, "rows" if k.get("transB") else "t", x)
    elif g.transposed_weight(b) is not None and not k.get("transB"):
        y = g.linear(g.transposed_weight(b), "rows", x)
    else:
        w = operand(pn, 1, g)
        w = g.contiguous(w if k.get("transB") else g.ggml.ggml_transpose(g.ctx, w))
        y = g.ggml.ggml_mul_mat(g.ctx, w, x)
    alpha, beta = float(k.get("alpha", 1.0)), float(k.get("beta", 1.0))
    if alpha != 1.0:  # ggml_scale computes only a contiguous tensor (linear's result may be a view)
        y = g.ggml.ggml_scale(g.ctx, g.contiguous(y), alpha)
    if c is not None and beta != 0.0:
        bias = operand(pn, 2, g)
        if beta != 1.0:
            bias = g.ggml.ggml_scale(g.ctx, g.contiguous(bias), beta)
        y = g.ggml.ggml_add(g.ctx, y, g.contiguous(bias))
    return y


def _softmax_axis(pn) -> int:
    rank = len(pn.inputs[0].static_shape)
    default = -1 if pn.opset >= 13 else 1
    return int(pn.kwargs.get("axis", default)) % max(rank, 1)


def row_max(g: Builder, rows):
    """The max of each row of a contiguous matrix: a 1-D max pool as wide as the row."""
    n = int(rows.contents.ne[0])
    return g.ggml.ggml_pool_1d(g.ctx, rows, g.ggml.GGML_OP_POOL_MAX, n, n, 0)


def _log_softmax_rows(g: Builder, rows):
    """``x - max - log(sum(exp(x - max)))`` per row: no log of an underflowed softmax."""
    gg = g.ggml
    shifted = gg.ggml_sub(g.ctx, rows, row_max(g, rows))
    lse = gg.ggml_log(g.ctx, gg.ggml_sum_rows(g.ctx, gg.ggml_exp(g.ctx, shifted)))
    return gg.ggml_sub(g.ctx, shifted, lse)


def _finite_below(g: Builder, rows):
    """-inf raised to the lowest float32: the max pool starts from it, so a row of -inf would
    have no element at its max (a row mixing -inf and -FLT_MAX as its max ties them)."""
    return g.clamp(rows, float(np.finfo(np.float32).min), float("inf"))


def _hardmax_rows(g: Builder, rows):
    """1 at each row's first maximum, 0 elsewhere: equality with the row max as 0/1 (exact),
    then a running count (``cumsum``) keeps only the first."""
    gg, ctx = g.ggml, g.ctx
    rows = _finite_below(g, rows)
    below = gg.ggml_neg(ctx, gg.ggml_sub(ctx, rows, row_max(g, rows)))  # max - x >= 0
    at_max = gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, below), -1.0, 1.0)
    first = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_cumsum(ctx, at_max), -1.0, 1.5))
    return gg.ggml_mul(ctx, at_max, first)


@ggml_op("Softmax", "LogSoftmax", "Hardmax")
def softmax(pn, g: Builder):
    """Over the rows ggml reduces: opset < 13 flattens the axes from ``axis`` on into one row;
    opset 13 moves ``axis`` last and back."""
    s = tuple(pn.inputs[0].static_shape)
    rank, axis = len(s), _softmax_axis(pn)
    x = g.contiguous(operand(pn, 0, g))
    if pn.opset < 13 or axis == rank - 1:
        perm = list(range(rank))
        rows = g.reshape(x, (prod(s[:axis]), prod(s[axis:]))) if pn.opset < 13 else x
    else:
        perm = [a for a in range(rank) if a != axis] + [axis]
        rows = permute(g, x, perm)
    row_op = {"Softmax": lambda g, r: g.ggml.ggml_soft_max(g.ctx, r), "LogSoftmax": _log_softmax_rows,
              "Hardmax": _hardmax_rows}[pn.op_type]
    y = row_op(g, rows)
    if pn.opset < 13 or perm == list(range(rank)):
        return g.reshape(y, s)
    inverse = [perm.index(a) for a in range(rank)]
    return permute(g, g.reshape(y, [s[a] for a in perm]), inverse)


def _norm_axis(pn) -> int:
    rank = len(pn.inputs[0].static_shape)
    return int(pn.kwargs.get("axis", -1)) % rank


def _check_epsilon(pn) -> str | None:
    eps = float(pn.kwargs.get("epsilon", 1e-5))
    return None if np.float32(eps) >= 0 else f"epsilon={eps} (ggml's norms assert epsilon >= 0)"


def _check_layernorm(pn) -> str | None:
    if pn.op_type == "RMSNormalization" and len(pn.outputs) > 1:
        return "more than one output"
    if _check_epsilon(pn):
        return _check_epsilon(pn)
    if tuple(pn.outputs[0].static_shape) != tuple(pn.inputs[0].static_shape):
        return "a scale or bias larger than the input"
    return check_broadcast(pn)


@ggml_op("LayerNormalization", "RMSNormalization", check=_check_layernorm)
def layer_norm(pn, g: Builder):
    """The axes from ``axis`` on as one row (``ggml_norm`` / ``ggml_rms_norm``), then scale and bias."""
    s = tuple(pn.inputs[0].static_shape)
    axis = _norm_axis(pn)
    rows = g.reshape(operand(pn, 0, g), (prod(s[:axis]), prod(s[axis:])))
    eps = float(pn.kwargs.get("epsilon", 1e-5))
    fn = g.ggml.ggml_norm if pn.op_type == "LayerNormalization" else g.ggml.ggml_rms_norm
    y = g.reshape(fn(g.ctx, rows, eps), s)
    y = g.ggml.ggml_mul(g.ctx, y, g.contiguous(operand(pn, 1, g)))
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        y = g.ggml.ggml_add(g.ctx, y, g.contiguous(operand(pn, 2, g)))
    if len(pn.outputs) == 1:
        return y
    # Mean and 1 / sqrt(var + eps) per row, the statistics ggml_norm computes inside.
    gg, ctx = g.ggml, g.ctx
    mean = gg.ggml_mean(ctx, rows)
    var = gg.ggml_mean(ctx, gg.ggml_sqr(ctx, gg.ggml_sub(ctx, rows, mean)))
    inv = gg.ggml_div(ctx, g.constant(np.ones((prod(s[:axis]), 1), np.float32)),
                      gg.ggml_sqrt(ctx, gg.ggml_scale_bias(ctx, var, 1.0, eps)))
    return [y, mean, inv][:len(pn.outputs)]


def _check_batchnorm(pn) -> str | None:
    if pn.kwargs.get("training_mode") or len(pn.outputs) > 1:
        return "training mode (batch statistics)"
    x = pn.inputs[0].static_shape
    if len(x) < 2:
        return "an input without channels"
    if any(v is None or prod(v.static_shape) != x[1] for v in pn.inputs[1:5]):
        return f"scale, bias, mean or variance not one value per channel ({x[1]})"
    return None


@ggml_op("BatchNormalization", check=_check_batchnorm)
def batch_norm(pn, g: Builder):
    x = g.contiguous(operand(pn, 0, g))
    s = pn.inputs[0].static_shape
    per_channel = (1, s[1]) + (1,) * (len(s) - 2)

    def channel(i):
        return g.reshape(operand(pn, i, g), per_channel)

    gg = g.ggml
    # scale / sqrt(var + eps), computed in the graph from the parameters (they may change per call).
    inv = gg.ggml_sqrt(g.ctx, gg.ggml_scale_bias(g.ctx, channel(4), 1.0, float(pn.kwargs.get("epsilon", 1e-5))))
    factor = gg.ggml_div(g.ctx, channel(1), inv)
    shift = gg.ggml_sub(g.ctx, channel(2), gg.ggml_mul(g.ctx, channel(3), factor))
    return gg.ggml_add(g.ctx, gg.ggml_mul(g.ctx, x, factor), shift)


def _conv_window(pn):
    k = pn.kwargs
    x = pn.inputs[0].static_shape
    kernel = [int(d) for d in (k.get("kernel_shape") or pn.inputs[1].static_shape[2:])]

    def ints(name):
        value = k.get(name)
        return None if value is None else [int(v) for v in value]

    return window(x[2:], kernel, ints("strides"), ints("dilations"), ints("pads"),
                  as_text(k.get("auto_pad")) or "NOTSET", int(k.get("ceil_mode") or 0))


def _same_as_ggml(pn, win, size) -> str | None:
    """ggml pads both sides of each axis by the same amount: the window must read the same."""
    for n, k, s, d, b, o in zip(size, win.kernel, win.strides, win.dilations, win.begin, win.out):
        if (n + 2 * b - d * (k - 1) - 1) // s + 1 != o:
            return "padding ggml cannot express (it pads both sides equally)"
    return None


def _conv_pads(pn, win, size):
    """(begin, end) zero padding per spatial axis that the windows read, when padding the
    input by it and sliding without padding gives the node's output size; None otherwise."""
    pads = win.read_pads(size)
    for n, k, st, d, (b, e), o in zip(size, win.kernel, win.strides, win.dilations, pads, win.out):
        if (n + b + e - d * (k - 1) - 1) // st + 1 != o:
            return None
    return pads


def _window_problem(pn, win, size) -> str | None:
    """Why ggml cannot slide ``win`` over ``size``: strides or dilations below 1 (ggml divides by
    them), padding it cannot express, or a kernel larger than the padded input (ggml_im2col and
    the pools assert an output of at least one pixel; onnxruntime refuses such a node too)."""
    if min(win.strides) < 1 or min(win.dilations) < 1 or min(win.kernel) < 1 or min(win.begin + win.end) < 0:
        return f"strides {list(win.strides)}, dilations {list(win.dilations)}, kernel {list(win.kernel)}, pads"
    pads = _conv_pads(pn, win, size)
    if pads is None:
        return "padding ggml cannot express"
    for n, k, d, (b, e) in zip(size, win.kernel, win.dilations, pads):
        if n + b + e < d * (k - 1) + 1:
            return f"a kernel of {list(win.kernel)} larger than the padded input {list(size)}"
    return None


def _check_conv(pn) -> str | None:
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(x) not in (3, 4):
        return f"{len(x) - 2}-D convolution (ggml here: 1-D and 2-D)"
    if len(w) != len(x):
        return f"a {len(w)}-D kernel for a {len(x)}-D input"
    group = int(pn.kwargs.get("group") or 1)
    if group < 1 or x[1] % group or w[0] % group or w[1] * group != x[1]:
        return f"group={group} does not divide the channels"
    if len(pn.inputs) > 2 and pn.inputs[2] is not None and tuple(pn.inputs[2].static_shape) != (w[0],):
        return f"a bias of shape {list(pn.inputs[2].static_shape)} for {w[0]} output channels"
    win = _conv_window(pn)
    if tuple(win.kernel) != tuple(w[2:]):
        return f"kernel_shape {list(win.kernel)} for a kernel of {list(w[2:])}"
    return _window_problem(pn, win, x[2:])


@ggml_op("Conv", check=_check_conv)
def conv(pn, g: Builder):
    """1-D as 2-D with a height of 1; padding added to the input first (ggml pads both sides
    alike); groups as one convolution per group, concatenated (depthwise: ggml's direct kernel)."""
    gg, ctx = g.ggml, g.ctx
    xs, ws = list(pn.inputs[0].static_shape), list(pn.inputs[1].static_shape)
    one_d = len(xs) == 3
    x = g.contiguous(operand(pn, 0, g))
    w = g.weight(pn.inputs[1], "conv") if g.is_weight(pn.inputs[1]) else g.contiguous(g.t(pn.inputs[1]))
    if one_d:
        x = g.reshape(x, xs[:2] + [1, xs[2]])
        w = g.reshape(w, ws[:2] + [1, ws[2]])
    win = _conv_window(pn)
    pads = list(_conv_pads(pn, win, xs[2:]))
    strides, dilations = list(win.strides), list(win.dilations)
    if one_d:
        pads, strides, dilations = [(0, 0)] + pads, [1] + strides, [1] + dilations
    (pt, pb), (pl, pr) = pads
    if pt or pb or pl or pr:
        x = gg.ggml_pad_ext(ctx, x, pl, pr, pt, pb, 0, 0, 0, 0)
    (sh, sw), (dh, dw) = strides, dilations
    group = int(pn.kwargs.get("group") or 1)
    c, m = xs[1], ws[0]
    if group == 1:
        y = gg.ggml_conv_2d(ctx, w, x, sw, sh, 0, 0, dw, dh)
    elif group == c == m and ws[1] == 1:
        y = gg.ggml_conv_2d_dw_direct(ctx, w, x, sw, sh, 0, 0, dw, dh)
    else:  # one convolution per group, stacked along the channels as they are made (Stack)
        parts = Stack(g, 2)
        ci, mi = c // group, m // group
        for i in range(group):
            xn, wn = x.contents.ne, w.contents.ne
            xb, wb = x.contents.nb, w.contents.nb
            xg = gg.ggml_view_4d(ctx, x, xn[0], xn[1], ci, xn[3], xb[1], xb[2], xb[3], i * ci * xb[2])
            wg = gg.ggml_view_4d(ctx, w, wn[0], wn[1], wn[2], mi, wb[1], wb[2], wb[3], i * mi * wb[3])
            parts.add(gg.ggml_conv_2d(ctx, g.contiguous(wg), gg.ggml_cont(ctx, xg), sw, sh, 0, 0, dw, dh))
        y = parts.result()
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        y = gg.ggml_add(ctx, g.contiguous(y), g.reshape(operand(pn, 2, g), (1, m, 1, 1)))
    return y


def _check_pool(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(x) not in (3, 4):
        return f"{len(x) - 2}-D pooling (ggml here: 1-D and 2-D)"
    if len(pn.outputs) > 1:
        return "the Indices output"
    win = _conv_window(pn)
    if any(d != 1 for d in win.dilations):
        return "dilations"
    return _window_problem(pn, win, x[2:])


def _pool_divisor(pn, win, size):
    """The per-output divisor ONNX's AveragePool uses: the window's taps inside the input
    (count_include_pad=0) or inside the declared padding (1), one (out_h, out_w) map."""
    include = bool(pn.kwargs.get("count_include_pad"))
    counts = []
    for n, k, st, b, e, o in zip(size, win.kernel, win.strides, win.begin, win.end, win.out):
        lo, hi = (-b, n + e) if include else (0, n)
        start = np.arange(o) * st - b
        counts.append(np.clip(np.minimum(start + k, hi) - np.maximum(start, lo), 0, None))
    out = counts[0][:, None] * counts[1][None, :] if len(counts) == 2 else counts[0][None, :]
    return out.astype(np.float64)


def _check_lp_pool(pn) -> str | None:
    if int(pn.kwargs.get("p", 2)) not in (1, 2, 4):
        return f"p={pn.kwargs.get('p')} (ggml here: 1, 2, 4)"
    return _check_pool(pn)


@ggml_op("LpPool", check=_check_lp_pool)
def lp_pool(pn, g: Builder):
    """``(sum |x|^p)^(1/p)`` per window: an average pool of ``|x|^p`` over zero padding times
    the window size, then square roots (p = 2, 4)."""
    gg, ctx = g.ggml, g.ctx
    xs = list(pn.inputs[0].static_shape)
    x = g.contiguous(operand(pn, 0, g))
    p = int(pn.kwargs.get("p", 2))
    powered = gg.ggml_abs(ctx, x) if p == 1 else gg.ggml_sqr(ctx, x)
    if p == 4:
        powered = gg.ggml_sqr(ctx, powered)
    win = _conv_window(pn)
    pads = list(_conv_pads(pn, win, xs[2:]))
    kernel, strides = list(win.kernel), list(win.strides)
    if len(xs) == 3:
        powered = g.reshape(powered, xs[:2] + [1, xs[2]])
        pads, kernel, strides = [(0, 0)] + pads, [1] + kernel, [1] + strides
    (pt, pb), (pl, pr) = pads
    if pt or pb or pl or pr:
        powered = gg.ggml_pad_ext(ctx, powered, pl, pr, pt, pb, 0, 0, 0, 0)
    (kh, kw), (sh, sw) = kernel, strides
    y = gg.ggml_scale(ctx, gg.ggml_pool_2d(ctx, powered, gg.GGML_OP_POOL_AVG, kw, kh, sw, sh, 0.0, 0.0),
                      float(kh * kw))
    for _ in range({1: 0, 2: 1, 4: 2}[p]):
        y = gg.ggml_sqrt(ctx, y)
    return y


@ggml_op("GlobalMaxPool")
def global_max_pool(pn, g: Builder):
    s = pn.inputs[0].static_shape
    return row_max(g, g.reshape(operand(pn, 0, g), (prod(s[:2]), prod(s[2:]))))


@ggml_op("MaxPool", "AveragePool", check=_check_pool)
def pool(pn, g: Builder):
    """1-D as 2-D with a height of 1; the padding added to the input first (-inf for max,
    zeros for average, whose sums are then divided as ONNX counts the window)."""
    gg, ctx = g.ggml, g.ctx
    xs = list(pn.inputs[0].static_shape)
    x = g.contiguous(operand(pn, 0, g))
    win = _conv_window(pn)
    pads = list(_conv_pads(pn, win, xs[2:]))
    kernel, strides = list(win.kernel), list(win.strides)
    if len(xs) == 3:
        x = g.reshape(x, xs[:2] + [1, xs[2]])
        pads, kernel, strides = [(0, 0)] + pads, [1] + kernel, [1] + strides
    is_max = pn.op_type == "MaxPool"
    shape = xs[:2] + ([1] if len(xs) == 3 else []) + xs[2:]
    if any(b or e for b, e in pads):
        if is_max:
            # Concatenated -inf borders, width first (ggml dim 0) then height (dim 1).
            for dim, (b, e) in ((0, pads[1]), (1, pads[0])):
                for side, n in (("b", b), ("e", e)):
                    if not n:
                        continue
                    border = list(shape)
                    border[3 - dim] = n
                    fill = g.constant(np.full(border, -np.inf, np.float32))
                    x = gg.ggml_concat(ctx, fill, x, dim) if side == "b" else gg.ggml_concat(ctx, x, fill, dim)
                    shape[3 - dim] += n
        else:
            (pt, pb), (pl, pr) = pads
            x = gg.ggml_pad_ext(ctx, x, pl, pr, pt, pb, 0, 0, 0, 0)
    (kh, kw), (sh, sw) = kernel, strides
    op = gg.GGML_OP_POOL_MAX if is_max else gg.GGML_OP_POOL_AVG
    y = gg.ggml_pool_2d(ctx, x, op, kw, kh, sw, sh, 0.0, 0.0)
    if not is_max:
        factor = (kh * kw) / _pool_divisor(pn, win, xs[2:])
        if not np.all(factor == 1.0):
            y = gg.ggml_mul(ctx, y, g.constant(factor.astype(np.float32)))
    return y


@ggml_op("GlobalAveragePool")
def global_average_pool(pn, g: Builder):
    s = pn.inputs[0].static_shape
    rows = g.reshape(operand(pn, 0, g), (prod(s[:2]), prod(s[2:])))
    return g.ggml.ggml_mean(g.ctx, rows)


def _reduce_axes(pn):
    rank = len(pn.inputs[0].static_shape)
    axes = const_value(pn, 1) if pn.opset >= (18 if pn.op_type != "ReduceSum" else 13) else pn.kwargs.get("axes")
    if axes is None or np.size(axes) == 0:
        return list(range(rank)) if not pn.kwargs.get("noop_with_empty_axes") else []
    return sorted({int(a) % rank for a in np.asarray(axes).reshape(-1)})


REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
          "ReduceLogSum", "ReduceLogSumExp")


@ggml_op(*REDUCE, folded=(1,))
def reduce(pn, g: Builder):
    """The reduced axes moved last and flattened into rows, each row reduced by a ggml row op
    (max: a 1-D max pool as wide as the row)."""
    gg, ctx = g.ggml, g.ctx
    s = tuple(pn.inputs[0].static_shape)
    axes = _reduce_axes(pn)
    x = g.contiguous(operand(pn, 0, g))
    if not axes:  # noop_with_empty_axes
        return gg.ggml_cont(ctx, x)
    kept = [a for a in range(len(s)) if a not in axes]
    rows = g.reshape(permute(g, x, kept + axes), (prod(s[a] for a in kept), prod(s[a] for a in axes)))
    op = pn.op_type
    if op == "ReduceMin":
        return gg.ggml_neg(ctx, row_max(g, gg.ggml_neg(ctx, rows)))
    if op == "ReduceMax":
        return row_max(g, rows)
    if op == "ReduceMean":
        return gg.ggml_mean(ctx, rows)
    if op == "ReduceLogSumExp":
        top = row_max(g, rows)
        total = gg.ggml_sum_rows(ctx, gg.ggml_exp(ctx, gg.ggml_sub(ctx, rows, top)))
        return gg.ggml_add(ctx, gg.ggml_log(ctx, total), top)
    pre = {"ReduceL1": gg.ggml_abs, "ReduceL2": gg.ggml_sqr, "ReduceSumSquare": gg.ggml_sqr}.get(op)
    y = gg.ggml_sum_rows(ctx, pre(ctx, rows) if pre else rows)
    post = {"ReduceL2": gg.ggml_sqrt, "ReduceLogSum": gg.ggml_log}.get(op)
    return post(ctx, y) if post else y


def _check_arg_extreme(pn) -> str | None:
    if pn.inputs[0].dtype not in (F32, *SMALL_INTS) or pn.outputs[0].dtype != np.dtype(np.int64):
        return f"{pn.inputs[0].dtype} values or {pn.outputs[0].dtype} indices"
    s = pn.inputs[0].static_shape
    if s[int(pn.kwargs.get("axis", 0)) % len(s)] >= 2 ** 24:
        return "an axis of 2**24 or more"
    return None


@ggml_op("ArgMax", "ArgMin", check=_check_arg_extreme, dtypes=(F32, *SMALL_INTS, np.int64))
def arg_extreme(pn, g: Builder):
    """The reduced axis moved last: 1 where a row holds its max (of ``-x`` for ArgMin), the first
    (or last) of those kept by a running count (``cumsum``), then the index sum of ``onehot *
    arange``: exact in float32, read back as int64."""
    gg, ctx = g.ggml, g.ctx
    s = tuple(pn.inputs[0].static_shape)
    axis = int(pn.kwargs.get("axis", 0)) % len(s)
    x = g.contiguous(operand(pn, 0, g))
    if pn.op_type == "ArgMin":
        x = gg.ggml_neg(ctx, x)
    kept = [a for a in range(len(s)) if a != axis]
    n = s[axis]
    rows = _finite_below(g, g.reshape(permute(g, x, kept + [axis]), (prod(s) // n, n)))
    below = gg.ggml_neg(ctx, gg.ggml_sub(ctx, rows, row_max(g, rows)))  # max - x >= 0
    at_max = gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, below), -1.0, 1.0)
    count = gg.ggml_cumsum(ctx, at_max)
    if int(pn.kwargs.get("select_last_index", 0)):  # the count reaches the row's total there
        count = gg.ggml_sub(ctx, count, gg.ggml_sum_rows(ctx, at_max))
        pick = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, count, 1.0, 0.5))
    else:
        pick = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, count, -1.0, 1.5))
    onehot = gg.ggml_mul(ctx, at_max, pick)
    return gg.ggml_sum_rows(ctx, gg.ggml_mul(ctx, onehot, g.constant(np.arange(n, dtype=np.float32))))


def _check_top_k(pn) -> str | None:
    x = pn.inputs[0]
    if x.dtype not in (F32, *SMALL_INTS) or pn.outputs[1].dtype != np.dtype(np.int64):
        return f"{x.dtype} values or {pn.outputs[1].dtype} indices"
    s = x.static_shape
    n = s[int(pn.kwargs.get("axis", -1)) % len(s)]
    k = int(np.asarray(pn.inputs[1].value).reshape(-1)[0])
    if not 0 < k <= n:
        return f"k={k} for an axis of {n}"
    if prod(s) * n >= 2 ** 24 or prod(s) // n * k * n >= 2 ** 24:
        return "more than 2**24 comparisons (the ranks are counted in float32)"
    return None


@ggml_op("TopK", check=_check_top_k, folded=(1,), dtypes=(F32, *SMALL_INTS, np.int64))
def top_k(pn, g: Builder):
    """Each element's rank along the axis counted from all pairs (the larger ones, then the equal
    ones before it: ties keep the lower index first, as ONNX asks), then the element of rank r for
    each of the k slots: its index as the sum of ``onehot * arange``, its value by ``get_rows``."""
    gg, ctx = g.ggml, g.ctx
    s = tuple(pn.inputs[0].static_shape)
    rank_ = len(s)
    axis = int(pn.kwargs.get("axis", -1)) % rank_
    n = s[axis]
    k = int(np.asarray(pn.inputs[1].value).reshape(-1)[0])
    order = [a for a in range(rank_) if a != axis] + [axis]
    rows = g.reshape(permute(g, g.contiguous(operand(pn, 0, g)), order), (prod(s) // n, n))
    r = prod(s) // n
    keys = rows if int(pn.kwargs.get("largest", 1)) == 1 else gg.ggml_neg(ctx, rows)  # other than 1: smallest
    mine = g.broadcast(g.reshape(keys, (r, n, 1)), (r, n, n))  # [row, i, j] = x_i
    other = g.broadcast(g.reshape(keys, (r, 1, n)), (r, n, n))  # [row, i, j] = x_j
    diff = gg.ggml_sub(ctx, other, mine)
    greater = gg.ggml_step(ctx, diff)
    equal = gg.ggml_scale_bias(ctx, gg.ggml_add(ctx, greater, gg.ggml_step(ctx, gg.ggml_neg(ctx, diff))), -1.0, 1.0)
    earlier = g.constant(np.tri(n, n, -1, dtype=np.float32))  # j < i
    ranks = gg.ggml_sum_rows(ctx, gg.ggml_add(ctx, greater, gg.ggml_mul(ctx, equal, earlier)))  # [row, i, 1]
    slots = g.reshape(ranks, (r, 1, n))
    off = gg.ggml_sub(ctx, g.broadcast(slots, (r, k, n)), g.constant(np.arange(k, dtype=np.float32).reshape(k, 1)))
    onehot = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, gg.ggml_abs(ctx, off), -1.0, 0.5))  # rank == slot
    index = gg.ggml_sum_rows(ctx, gg.ggml_mul(ctx, onehot, g.constant(np.arange(n, dtype=np.float32))))  # [row, k, 1]
    # In [0, n) by construction, but for NaN keys (every comparison false: ranks may repeat, a
    # slot sum several positions): kept in range, as ggml_get_rows asserts while it computes.
    index = g.clamp(g.reshape(index, (r, k)), 0.0, float(n - 1))
    flat = gg.ggml_add(ctx, index, g.constant((np.arange(r, dtype=np.float32) * n).reshape(r, 1)))
    values = gg.ggml_get_rows(ctx, g.reshape(rows, (r * n, 1)),
                              gg.ggml_cast(ctx, g.reshape(flat, (r * k,)), gg.GGML_TYPE_I32))
    staged = [s[a] for a in order[:-1]] + [k]
    back = [order.index(a) for a in range(rank_)]
    return (permute(g, g.reshape(values, staged), back), permute(g, g.reshape(index, staged), back))


__all__ = ["ne"]


def _check_nll(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(x) < 2:
        return "an input without classes"
    if tuple(pn.inputs[1].static_shape) != (x[0],) + tuple(x[2:]):
        return f"labels of shape {list(pn.inputs[1].static_shape)} for an input {list(x)}"
    if len(pn.inputs) > 2 and pn.inputs[2] is not None and tuple(pn.inputs[2].static_shape) != (x[1],):
        return "weights that are not one per class"
    ignore = pn.kwargs.get("ignore_index")
    # Labels reach ggml wrapped into [0, C) and range-checked: an ignored label outside it
    # would be refused or confused with a class.
    if ignore is not None and not 0 <= int(ignore) < x[1]:
        return f"ignore_index {ignore} outside [0, {x[1]})"
    return None


def _picked(pn, g: Builder, rows, c: int):
    """``-rows[m, label[m]] * weight[label[m]]`` for each of the ``m`` rows (the labels as
    ggml row indices, range-checked per call), and the picked weights (None without weights)."""
    gg, ctx = g.ggml, g.ctx
    m = int(rows.contents.ne[1])
    labels = gg.ggml_reshape_2d(ctx, g.index(pn.inputs[1], c, pn), 1, m)
    # One class row of length 1 per sample: get_rows picks, in batch m, the row label[m].
    table = gg.ggml_reshape_3d(ctx, g.contiguous(rows), 1, c, m)
    loss = gg.ggml_neg(ctx, gg.ggml_reshape_1d(ctx, gg.ggml_get_rows(ctx, table, labels), m))
    w = None
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        weights = g.reshape(operand(pn, 2, g), (c, 1))
        w = gg.ggml_reshape_1d(ctx, gg.ggml_get_rows(ctx, weights, gg.ggml_reshape_1d(ctx, labels, m)), m)
    ignore = pn.kwargs.get("ignore_index")
    if ignore is not None:
        # 0 where the label (exact small integers in float32) is the ignored one, else 1.
        diff = gg.ggml_abs(ctx, gg.ggml_scale_bias(ctx, gg.ggml_reshape_1d(
            ctx, gg.ggml_cast(ctx, labels, gg.GGML_TYPE_F32), m), 1.0, -float(ignore)))
        keep = gg.ggml_step(ctx, gg.ggml_scale_bias(ctx, diff, 1.0, -0.5))
        w = keep if w is None else gg.ggml_mul(ctx, w, keep)
    return (loss, None) if w is None else (gg.ggml_mul(ctx, loss, w), w)


def _reduce_loss(pn, g: Builder, loss, w):
    gg, ctx = g.ggml, g.ctx
    reduction = as_text(pn.kwargs.get("reduction", "mean"))
    if reduction == "none":
        return loss
    total = gg.ggml_sum(ctx, loss)
    if reduction == "sum":
        return total
    if w is None:
        return gg.ggml_scale(ctx, total, 1.0 / int(loss.contents.ne[0]))
    return gg.ggml_div(ctx, total, gg.ggml_sum(ctx, w))


def _class_rows(pn, g: Builder, x):
    """``x`` (N, C, d...) as rows of classes: (N * d..., C), and the permutation used."""
    s = tuple(pn.inputs[0].static_shape)
    perm = [0] + list(range(2, len(s))) + [1]
    return g.reshape(permute(g, g.contiguous(x), perm), (prod(s) // s[1], s[1])), perm


@ggml_op("NegativeLogLikelihoodLoss", check=_check_nll, indices=(1,))
def nll_loss(pn, g: Builder):
    rows, _ = _class_rows(pn, g, operand(pn, 0, g))
    loss, w = _picked(pn, g, rows, pn.inputs[0].static_shape[1])
    return _reduce_loss(pn, g, loss, w)


@ggml_op("SoftmaxCrossEntropyLoss", check=_check_nll, indices=(1,))
def softmax_cross_entropy(pn, g: Builder):
    s = tuple(pn.inputs[0].static_shape)
    rows, perm = _class_rows(pn, g, operand(pn, 0, g))
    log_prob = _log_softmax_rows(g, rows)
    loss, w = _picked(pn, g, log_prob, s[1])
    outs = [_reduce_loss(pn, g, loss, w)]
    if len(pn.outputs) > 1 and pn.outputs[1] is not None:
        inverse = [perm.index(a) for a in range(len(s))]
        outs.append(permute(g, g.reshape(log_prob, [s[a] for a in perm]), inverse))
    return outs


def _check_lp_norm(pn) -> str | None:
    return None if int(pn.kwargs.get("p", 2)) in (1, 2) else f"p={pn.kwargs.get('p')}"


@ggml_op("LpNormalization", check=_check_lp_norm)
def lp_normalization(pn, g: Builder):
    """``x / ||x||_p`` along ``axis`` (moved last and back), p 1 or 2."""
    gg, ctx = g.ggml, g.ctx
    s = tuple(pn.inputs[0].static_shape)
    rank = len(s)
    axis = int(pn.kwargs.get("axis", -1)) % rank
    perm = [a for a in range(rank) if a != axis] + [axis]
    rows = permute(g, g.contiguous(operand(pn, 0, g)), perm)
    if int(pn.kwargs.get("p", 2)) == 2:
        norm = gg.ggml_sqrt(ctx, gg.ggml_sum_rows(ctx, gg.ggml_sqr(ctx, rows)))
    else:
        norm = gg.ggml_sum_rows(ctx, gg.ggml_abs(ctx, rows))
    norm = gg.ggml_add(ctx, norm, gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, norm), -1.0, 1.0))  # 0 / 1 for a zero row
    y = gg.ggml_div(ctx, rows, gg.ggml_repeat(ctx, norm, rows))
    return permute(g, y, [perm.index(a) for a in range(rank)])


@ggml_op("SwiGLU")
def swiglu(pn, g: Builder):
    gg, ctx = g.ggml, g.ctx
    a, b = (g.contiguous(operand(pn, i, g)) for i in (0, 1))
    alpha = float(pn.kwargs.get("alpha", 1.0))
    gate = gg.ggml_sigmoid(ctx, gg.ggml_scale(ctx, a, alpha) if alpha != 1.0 else a)
    return gg.ggml_mul(ctx, gg.ggml_mul(ctx, a, gate), b)


def _conv_transpose_geometry(pn):
    """Per spatial axis: (stride, dilation, padding before, padding after) of the equivalent
    stride-1 convolution over the zero-stuffed input; None when a side would need cropping."""
    from ...kernels.geometry import transposed_window

    k = pn.kwargs
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape

    def ints(name):
        value = k.get(name)
        return None if value is None else [int(v) for v in value]

    win = transposed_window(x[2:], w[2:], ints("strides"), ints("dilations"), ints("pads"),
                            as_text(k.get("auto_pad")) or "NOTSET", ints("output_padding"), ints("output_shape"))
    out = []
    for n, kk, s, d, b, o in zip(x[2:], w[2:], win.strides, win.dilations, win.begin, win.out):
        span = (kk - 1) * d
        before, after = span - b, o + b - (s * (n - 1) + 1)
        if before < 0 or after < 0:
            return None
        out.append((s, d, before, after))
    return out


def _check_conv_transpose(pn) -> str | None:
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(x) not in (3, 4):
        return f"{len(x) - 2}-D transposed convolution (ggml here: 1-D and 2-D)"
    group = int(pn.kwargs.get("group") or 1)
    if x[1] % group or w[0] != x[1]:
        return f"group={group} does not divide the channels"
    if _conv_transpose_geometry(pn) is None:
        return "pads larger than the kernel's reach"
    return None


@ggml_op("ConvTranspose", check=_check_conv_transpose)
def conv_transpose(pn, g: Builder):
    """The input zero-stuffed (stride - 1 zeros between pixels, by padding a new unit dim),
    padded, and convolved at stride 1 with the kernel flipped (``get_rows`` with reversed row
    indices) and its channel axes swapped; groups one by one, concatenated."""
    gg, ctx = g.ggml, g.ctx
    xs, ws = list(pn.inputs[0].static_shape), list(pn.inputs[1].static_shape)
    geo = _conv_transpose_geometry(pn)
    x = g.contiguous(operand(pn, 0, g))
    w = g.weight(pn.inputs[1]) if g.is_weight(pn.inputs[1]) else g.contiguous(g.t(pn.inputs[1]))
    if len(xs) == 3:
        xs, ws = xs[:2] + [1] + xs[2:], ws[:2] + [1] + ws[2:]
        x, w = g.reshape(x, xs), g.reshape(w, ws)
        geo = [(1, 1, 0, 0)] + geo
    n, cin, hh, ww = xs
    group = int(pn.kwargs.get("group") or 1)
    ci, co, kh, kw = cin // group, ws[1], ws[2], ws[3]
    (sh, dh, bh, ah), (sw, dw, bw, aw) = geo
    f = 4

    def flip_rows(t, rows, batch):  # reverse ggml dim 1 of a (n0, rows, batch) tensor
        idx = g.constant_i32(np.tile(np.arange(rows - 1, -1, -1, dtype=np.int32), (batch, 1)))
        return gg.ggml_get_rows(ctx, t, idx)

    def one_group(xg, wg):
        # Kernel (Ci, Co, KH, KW) -> (Co, Ci, KH, KW), flipped in KH and KW.
        wg = permute(g, wg, [1, 0, 2, 3])
        m = co * ci
        wg = flip_rows(gg.ggml_reshape_3d(ctx, wg, kw, kh, m), kh, m)
        wg = flip_rows(gg.ggml_cont(ctx, gg.ggml_permute(ctx, wg, 1, 0, 2, 3)), kw, m)  # ne (KH, KW, M)
        wg = gg.ggml_reshape_4d(ctx, gg.ggml_cont(ctx, gg.ggml_permute(ctx, wg, 1, 0, 2, 3)), kw, kh, ci, co)
        if sw > 1:  # stuff along W (ggml dim 0)
            xg = gg.ggml_pad_ext(ctx, gg.ggml_reshape_4d(ctx, xg, 1, ww, hh, ci * n), 0, sw - 1, 0, 0, 0, 0, 0, 0)
            xg = gg.ggml_reshape_4d(ctx, xg, sw * ww, hh, ci, n)
            xg = gg.ggml_cont(ctx, gg.ggml_view_4d(ctx, xg, sw * (ww - 1) + 1, hh, ci, n, sw * ww * f,
                                                   sw * ww * hh * f, sw * ww * hh * ci * f, 0))
        width = sw * (ww - 1) + 1
        if sh > 1:  # stuff along H (ggml dim 1)
            xg = gg.ggml_pad_ext(ctx, gg.ggml_reshape_4d(ctx, xg, width, 1, hh, ci * n), 0, 0, 0, sh - 1, 0, 0, 0, 0)
            xg = gg.ggml_reshape_4d(ctx, xg, width, sh * hh, ci, n)
            xg = gg.ggml_cont(ctx, gg.ggml_view_4d(ctx, xg, width, sh * (hh - 1) + 1, ci, n, width * f,
                                                   width * sh * hh * f, width * sh * hh * ci * f, 0))
        if bw or aw or bh or ah:
            xg = gg.ggml_pad_ext(ctx, xg, bw, aw, bh, ah, 0, 0, 0, 0)
        return gg.ggml_conv_2d(ctx, wg, xg, 1, 1, 0, 0, dw, dh)

    if group == 1:
        y = one_group(x, w)
    else:
        parts = Stack(g, 2)
        for i in range(group):
            xn, xb = x.contents.ne, x.contents.nb
            wn, wb = w.contents.ne, w.contents.nb
            xg = gg.ggml_view_4d(ctx, x, xn[0], xn[1], ci, xn[3], xb[1], xb[2], xb[3], i * ci * xb[2])
            wg = gg.ggml_view_4d(ctx, w, wn[0], wn[1], wn[2], ci, wb[1], wb[2], wb[3], i * ci * wb[3])
            xg, wg = gg.ggml_cont(ctx, xg), gg.ggml_cont(ctx, wg)
            parts.add(one_group(xg, wg))
        y = parts.result()
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        y = gg.ggml_add(ctx, g.contiguous(y), g.reshape(operand(pn, 2, g), (1, co * group, 1, 1)))
    return y


def _dft_axis(pn) -> int:
    rank = len(pn.inputs[0].static_shape)
    if pn.opset >= 20:
        v = const_value(pn, 2)
        axis = -2 if v is None else int(v.reshape(()))
    else:
        axis = int(pn.kwargs.get("axis", 1))
    return axis % rank


def _check_dft(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(pn.inputs) > 1 and pn.inputs[1] is not None:
        return "dft_length"
    if x[-1] not in (1, 2) or len(x) < 2 or _dft_axis(pn) == len(x) - 1:
        return "an input without a real/complex last axis, or the DFT along it"
    if pn.kwargs.get("inverse"):
        # The inverse of a transform gives values near zero that float32 sums miss by more than
        # the suite's atol (1e-7): refused rather than approximately right.
        return "an inverse DFT (float32 sums are not close enough to zero)"
    if pn.kwargs.get("onesided") and x[-1] != 1:
        return "a one-sided DFT of complex input"
    return None


@ggml_op("DFT", check=_check_dft, folded=(2,))
def dft(pn, g: Builder):
    """Forward only: the transform axis moved last, real and imaginary parts times constant
    cos/sin matrices (``mul_mat``), then the two parts stacked as the last axis again."""
    gg, ctx = g.ggml, g.ctx
    xs = list(pn.inputs[0].static_shape)
    rank, axis, c = len(xs), _dft_axis(pn), xs[-1]
    n = xs[axis]
    k = n // 2 + 1 if pn.kwargs.get("onesided") else n
    x = g.contiguous(operand(pn, 0, g))
    signal = xs[:-1]
    perm = [a for a in range(rank - 1) if a != axis] + [axis]
    rows = prod(signal) // n
    f = 4

    def part(j):  # real (0) or imaginary (1) part, the transform axis last: (rows, N)
        view = gg.ggml_view_2d(ctx, x, 1, prod(signal), c * f, j * f)
        return g.reshape(permute(g, g.reshape(gg.ggml_cont(ctx, view), signal), perm), (rows, n))

    angle = 2 * np.pi * np.outer(np.arange(k), np.arange(n)) / n
    cos, sin = np.cos(angle), -np.sin(angle)

    def times(rows_t, m):
        return gg.ggml_mul_mat(ctx, g.constant(m.astype(np.float32)), rows_t)  # (rows, K)

    xr = part(0)
    yr, yi = times(xr, cos), times(xr, sin)
    if c == 2:
        xi = part(1)
        yr = gg.ggml_sub(ctx, yr, times(xi, sin))
        yi = gg.ggml_add(ctx, yi, times(xi, cos))
    y = gg.ggml_concat(ctx, gg.ggml_reshape_3d(ctx, yr, 1, k, rows), gg.ggml_reshape_3d(ctx, yi, 1, k, rows), 0)
    moved = [signal[a] for a in perm[:-1]] + [k, 2]
    inverse_perm = [perm.index(a) for a in range(rank - 1)] + [rank - 1]
    return permute(g, g.reshape(y, moved), inverse_perm)


def _check_channel_norm(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(x) < 2:
        return "an input without channels"
    if _check_epsilon(pn):
        return _check_epsilon(pn)
    c = x[1]
    if pn.op_type == "GroupNormalization":
        groups = int(pn.kwargs.get("num_groups") or 0)
        if not groups or c % groups:
            return f"num_groups {groups} not dividing {c} channels"
        per = c if pn.opset >= 21 else groups
    else:
        per = c
    if any(prod(v.static_shape) != per for v in pn.inputs[1:3] if v is not None):
        return "scale or bias not one value per channel (or group)"
    return None


@ggml_op("InstanceNormalization", "GroupNormalization", check=_check_channel_norm)
def channel_norm(pn, g: Builder):
    """``ggml_norm`` over rows of each (sample, group) — a group of one channel for
    InstanceNormalization — then the per-channel (opset < 21 GroupNormalization: per-group)
    scale and bias."""
    gg, ctx = g.ggml, g.ctx
    s = list(pn.inputs[0].static_shape)
    n, c = s[0], s[1]
    groups = int(pn.kwargs.get("num_groups") or c) if pn.op_type == "GroupNormalization" else c
    rows = g.reshape(operand(pn, 0, g), (n * groups, prod(s) // (n * groups)))
    y = gg.ggml_norm(ctx, rows, float(pn.kwargs.get("epsilon", 1e-5)))
    per_group = pn.op_type == "GroupNormalization" and pn.opset < 21
    if per_group:  # scale and bias per group: (N, G, rest)
        y = g.reshape(y, (n, groups, prod(s) // (n * groups)))
        shape = (1, groups, 1)
    else:
        y = g.reshape(y, (n, c, prod(s[2:])))
        shape = (1, c, 1)
    y = gg.ggml_mul(ctx, y, g.reshape(operand(pn, 1, g), shape))
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        y = gg.ggml_add(ctx, y, g.reshape(operand(pn, 2, g), shape))
    return y


def _check_lrn(pn) -> str | None:
    x = pn.inputs[0].static_shape
    return None if len(x) >= 2 and int(pn.kwargs.get("size") or 0) >= 1 else "an input without channels"


@ggml_op("LRN", check=_check_lrn)
def lrn(pn, g: Builder):
    """``x / (bias + alpha / size * sum of x^2 over nearby channels) ** beta``: the channel sum
    as a zero-padded average pool along channels (moved to ggml's dim 0) times ``size``; the
    power as ``exp(beta * log(.))`` of a positive base."""
    gg, ctx, k = g.ggml, g.ctx, pn.kwargs
    s = list(pn.inputs[0].static_shape)
    n, c, rest = s[0], s[1], prod(s[2:])
    size = int(k["size"])
    alpha, beta, bias = float(k.get("alpha", 1e-4)), float(k.get("beta", 0.75)), float(k.get("bias", 1.0))
    x = g.reshape(operand(pn, 0, g), (n, c, rest))
    sq = permute(g, gg.ggml_sqr(ctx, x), [0, 2, 1])  # (N, rest, C): channels along ggml dim 0
    lo = (size - 1) // 2
    hi = size - 1 - lo
    padded = gg.ggml_pad_ext(ctx, sq, lo, hi, 0, 0, 0, 0, 0, 0)
    total = gg.ggml_pool_2d(ctx, padded, gg.GGML_OP_POOL_AVG, size, 1, 1, 1, 0.0, 0.0)  # mean of `size`
    base = gg.ggml_scale_bias(ctx, total, alpha, bias)  # alpha / size * sum + bias
    denom = gg.ggml_exp(ctx, gg.ggml_scale(ctx, gg.ggml_log(ctx, base), beta))
    return gg.ggml_div(ctx, x, permute(g, g.reshape(denom, (n, rest, c)), [0, 2, 1]))
