"""Gradients of the matmul family, convolutions and pools.

Convolution gradients reuse the forward kernel's window geometry and taps: the weight gradient
is the output gradient times the im2col columns (a correlation), the input gradient is the
weights' transpose times the output gradient, added back into the image with ``fold_columns`` (the
ConvTranspose scatter). Pools add each window's share back through the same taps.
"""

from __future__ import annotations

import math

import numpy

from ..kernels.geometry import window
from ..kernels.nn import fold_columns, lowest, xp_matmul, pad_spatial, window_taps, window_counts
from .rules import vjp_rule
from .elementwise import unbroadcast


def _t(a):
    return numpy.swapaxes(a, -1, -2)


@vjp_rule("MatMul", since=1)
def matmul_vjp(g, a, b, *, needs):
    # numpy.matmul's 1-D promotion, undone at the end.
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = g
    if a.ndim == 1:
        g2 = numpy.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = numpy.expand_dims(g2, -1)
    ga = gb = None
    if needs[0]:
        ga = unbroadcast(xp_matmul(g2, _t(b2), numpy), a2.shape).reshape(a.shape)
    if needs[1]:
        if b2.ndim == 2 and a2.ndim > 2:
            # Activations (..., n, k) times weights (k, m): one matmul over the folded batch.
            k, m = b2.shape
            gb = xp_matmul(_t(a2.reshape(-1, k)), g2.reshape(-1, m), numpy)
        else:
            gb = unbroadcast(xp_matmul(_t(a2), g2, numpy), b2.shape)
        gb = gb.reshape(b.shape)
    return ga, gb


@vjp_rule("MatMulAdd", since=1, domain="ai.mithril")
def matmul_add_vjp(g, x, w, b, *, needs):
    gx, gw = matmul_vjp(g, x, w, needs=needs[:2])
    gb = g.reshape(-1, g.shape[-1]).sum(axis=0) if needs[2] else None
    return gx, gw, gb


@vjp_rule("Gemm", since=1)
def gemm_vjp(g, a, b, c=None, *, alpha, beta, transA, transB, broadcast=0, needs):
    at = a.T if transA else a
    bt = b.T if transB else b
    ga = gb = gc = None
    if needs[0]:
        ga = xp_matmul(g, bt.T, numpy) * numpy.asarray(alpha, g.dtype)
        ga = ga.T if transA else ga
    if needs[1]:
        gb = xp_matmul(at.T, g, numpy) * numpy.asarray(alpha, g.dtype)
        gb = gb.T if transB else gb
    if c is not None and needs[2]:
        gc = unbroadcast(g * numpy.asarray(beta, g.dtype), c.shape)
    return ga, gb, gc


# ---------------------------------------------------------------------------------------------
# Convolution


def _im2col(x, win):
    padded = pad_spatial(x, win, 0, numpy)
    return numpy.stack([tap for _, tap in window_taps(padded, win)], axis=2)  # (n, c, taps, *out)


def _canvas_crop(win, size):
    canvas = tuple(max(e, b + n) for e, b, n in zip(win.extent, win.begin, size))
    crop = (Ellipsis, *(slice(b, b + n) for b, n in zip(win.begin, size)))
    return canvas, crop


@vjp_rule("Conv", since=1)
def conv_vjp(g, x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, needs):
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    size = x.shape[2:]
    win = window(size, w.shape[2:], strides, dilations, pads, auto_pad)
    taps, length = math.prod(win.kernel), math.prod(win.out)
    g4 = g.reshape(n, group, mg, length)
    gx = gw = gb = None
    if needs[1]:
        cols = _im2col(x, win).reshape(n, group, cg * taps, length)
        # Fold the batch into the matmul's inner axis: (group, mg, n*L) @ (group, n*L, cg*taps).
        gf = numpy.transpose(g4, (1, 2, 0, 3)).reshape(group, mg, n * length)
        cf = numpy.transpose(cols, (1, 0, 3, 2)).reshape(group, n * length, cg * taps)
        gw = xp_matmul(gf, cf, numpy).reshape(w.shape)
    if needs[0]:
        wt = _t(w.reshape(group, mg, cg * taps))  # (group, cg*taps, mg)
        cols = xp_matmul(wt, g4, numpy).reshape((n, c, taps) + win.out)
        canvas, crop = _canvas_crop(win, size)
        gx = fold_columns(cols, win.out, win, canvas)[crop]
    if b is not None and needs[2]:
        gb = numpy.sum(g, axis=(0,) + tuple(range(2, g.ndim))).astype(b.dtype)
    return gx, gw, gb


# ---------------------------------------------------------------------------------------------
# Pooling


@vjp_rule("MaxPool", since=1)
def max_pool_vjp(g, x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0,
                 outputs):
    gy, y = (g[0] if isinstance(g, tuple) else g), outputs[0]  # MaxPool-8 added the indices output
    win = window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padded = pad_spatial(x, win, lowest(x.dtype), numpy)
    # numpy-only: each window's gradient goes to its first maximum, added in place through tap views.
    canvas = numpy.zeros(padded.shape, dtype=gy.dtype)
    taken = numpy.zeros(y.shape, dtype=bool)
    zero = numpy.zeros((), gy.dtype)
    for (_, tap), (_, into) in zip(window_taps(padded, win), window_taps(canvas, win)):
        hit = (tap == y) & ~taken
        taken |= hit
        into += numpy.where(hit, gy, zero)
    return (canvas[(Ellipsis, *(slice(b, b + n) for b, n in zip(win.begin, x.shape[2:])))],)


@vjp_rule("AveragePool", since=1)
def average_pool_vjp(g, x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, count_include_pad=0,
                     dilations=None):
    size = x.shape[2:]
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    share = g / numpy.asarray(window_counts(size, win, count_include_pad), dtype=g.dtype)
    canvas = numpy.zeros(x.shape[:2] + _canvas_crop(win, size)[0], dtype=g.dtype)
    for _, into in window_taps(canvas, win):
        into += share
    return (canvas[(Ellipsis, *(slice(b, b + n) for b, n in zip(win.begin, size)))],)


@vjp_rule("GlobalAveragePool", since=1)
def global_average_pool_vjp(g, x):
    count = math.prod(x.shape[2:])
    return (numpy.broadcast_to(g / numpy.asarray(count, g.dtype), x.shape),)


@vjp_rule("GlobalMaxPool", since=1)
def global_max_pool_vjp(g, x, *, y):
    hits = x == y
    count = numpy.sum(hits, axis=tuple(range(2, x.ndim)), keepdims=True)
    return (numpy.where(hits, g / count, 0).astype(g.dtype),)
