"""C rules for MatMul/Gemm, convolution, pooling, normalization, Softmax, Dropout, the losses and
the onnxruntime contrib ops transformers use (kernels: ``lib/mt_nn*.h``; the GEMM: ``lib/mt_gemm*.h``).

Window ops (Conv, ConvTranspose, the pools) take their geometry from the shared
:mod:`mithril.backends.kernels.geometry` at render time (auto_pad, ceil_mode, output_padding and
output_shape mean what they mean on every backend) and pass it as one constant array of 21
numbers, 1-D and 2-D windows padded to 3-D with unit leading axes (see ``lib/mt_nn.h``).
"""

from __future__ import annotations

from math import prod

import numpy as np

from ...kernels.geometry import transposed_window, window
from . import B_TRANSPOSED, CLAMP, FLOATS, RESIDUAL, broadcast_strides, c_kernel, ints, same_types, text

MAX_SPATIAL = 3  # the window kernels take up to three spatial axes


def _has(pn, i: int) -> bool:
    return len(pn.inputs) > i and pn.inputs[i] is not None


def _bias(pn, c, i: int = 2) -> str:
    return c.buf(pn.inputs[i]) if _has(pn, i) else "0"


def _shapes_are(pn, want: dict[int, tuple]) -> str | None:
    """Why the plan's output shapes are not what the kernel writes (output index -> shape), so
    that no call can write past a buffer on a malformed plan; None when they are."""
    for i, shape in want.items():
        if len(pn.outputs) > i and pn.outputs[i].name and tuple(pn.outputs[i].static_shape) != tuple(shape):
            return f"output {i} is typed {pn.outputs[i].static_shape}, the kernel writes {tuple(shape)}"
    return None


def _numels_are(pn, want: dict[int, int]) -> str | None:
    for i, n in want.items():
        if len(pn.outputs) > i and pn.outputs[i].name and prod(pn.outputs[i].static_shape) != n:
            return f"output {i} holds {prod(pn.outputs[i].static_shape)} values, the kernel writes {n}"
    return None


def _same_shape(pn) -> str | None:
    """A ``check`` for ops whose outputs have the input's shape and element type."""
    x = pn.inputs[0].static_shape
    return _shapes_are(pn, {i: x for i in range(len(pn.outputs))}) or same_types(pn)


# ---------------------------------------------------------------------------------------------
# MatMul / Gemm


def _operand_shapes(pn):
    """The static shapes of A and B (B as the product reads it: the transpose of the [N, K] input
    a folded weight Transpose left, :data:`B_TRANSPOSED`)."""
    sa, sb = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    return sa, (tuple(sb[::-1]) if pn.kwargs.get(B_TRANSPOSED) else sb)


def _matmul_shapes(pn):
    """(A as [..., M, K], B as [..., K, N], broadcast batch shape) with 1-D operands promoted."""
    sa, sb = _operand_shapes(pn)
    a = (1, sa[0]) if len(sa) == 1 else tuple(sa)
    b = (sb[0], 1) if len(sb) == 1 else tuple(sb)
    batch = tuple(np.broadcast_shapes(a[:-2], b[:-2]))
    return a, b, batch


def _check_matmul(pn):
    sa, sb = _operand_shapes(pn)
    if pn.kwargs.get(B_TRANSPOSED) and len(sb) != 2:
        return "a transposed B that is not a matrix"
    if not sa or not sb:
        return "0-d MatMul operand"
    try:
        a, b, _ = _matmul_shapes(pn)
    except ValueError:
        return f"batch dims of {sa} and {sb} do not broadcast"
    if a[-1] != b[-2]:
        return f"inner dims of {sa} and {sb} differ"
    if pn.op_type == "MatMulAdd" and prod(pn.inputs[2].static_shape) != b[-1]:
        return "bias is not one row"
    _, _, batch = _matmul_shapes(pn)
    out = batch + ((a[-2],) if len(sa) > 1 else ()) + ((b[-1],) if len(sb) > 1 else ())
    return _shapes_are(pn, {0: out}) or same_types(pn)


@c_kernel("MatMul", dtypes=FLOATS, check=_check_matmul)
@c_kernel("MatMulAdd", domain="ai.mithril", dtypes=FLOATS, check=_check_matmul)
def matmul(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    sa, sb, batch = _matmul_shapes(pn)
    M, K, N = sa[-2], sa[-1], sb[-1]
    bias = _bias(pn, c) if pn.op_type == "MatMulAdd" else "0"
    one, sfx = c.literal(1, y.dtype), c.sfx(y)
    # A 1-D B is a [K, 1] column: its rows are one element apart either way. A transposed B
    # (B_TRANSPOSED) is the [N, K] matrix as stored: its rows along K are one element apart.
    br, bc = (1, K) if pn.kwargs.get(B_TRANSPOSED) else (N, 1)
    tail = f"{K}, 1, {br}, {bc}, 0, 1, {one}, {one});"
    if prod(sb[:-2]) == 1:  # B is one matrix: every row of A in one GEMM
        c.line(f"mt_gemm_{sfx}({c.buf(a)}, {c.buf(b)}, {bias}, {c.buf(y)}, {prod(sa[:-1])}, {N}, {K}, " + tail)
        return
    Q = prod(batch)
    if tuple(sa[:-2]) == batch and tuple(sb[:-2]) == batch:
        qa, qb = "q", "q"
    else:  # broadcast batch dims: each product's matrix index in A and in B
        qa = f"{c.arr(batch_index(sa[:-2], batch))}[q]"
        qb = f"{c.arr(batch_index(sb[:-2], batch))}[q]"
    c.line(f"for (mt_i q = 0; q < {Q}; q++) mt_gemm_{sfx}({c.buf(a)} + {qa} * {M * K}, {c.buf(b)} + {qb} * {K * N}, "
           f"{bias}, {c.buf(y)} + q * {M * N}, {M}, {N}, {K}, " + tail)


def batch_index(shape, batch) -> list[int]:
    """For each position of ``batch`` (row-major), the matrix it reads in an operand of batch ``shape``."""
    if not batch:
        return [0]
    st = broadcast_strides(shape, batch)
    grid = np.indices(batch).reshape(len(batch), -1)
    return [int(v) for v in (grid * np.asarray(st)[:, None]).sum(axis=0)]


def _check_gemm(pn):
    if _has(pn, 2) and len(pn.inputs[2].static_shape) > 2:
        return "bias of rank > 2"
    sa, sb, k = pn.inputs[0].static_shape, pn.inputs[1].static_shape, pn.kwargs
    if len(sa) != 2 or len(sb) != 2:
        return "operands are not matrices"
    M, K = (sa[1], sa[0]) if k.get("transA", 0) else tuple(sa)
    K2, N = (sb[1], sb[0]) if k.get("transB", 0) else tuple(sb)
    if K != K2:
        return f"inner dims of {sa} and {sb} differ"
    return _shapes_are(pn, {0: (M, N)}) or same_types(pn)


@c_kernel("Gemm", dtypes=FLOATS, check=_check_gemm)
def gemm(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    sa, sb, k = c.shape(a), c.shape(b), pn.kwargs
    ta, tb = k.get("transA", 0), k.get("transB", 0)
    M, K = (sa[1], sa[0]) if ta else (sa[0], sa[1])
    N = sb[0] if tb else sb[1]
    ar, ac = (1, M) if ta else (K, 1)
    br, bc = (1, K) if tb else (N, 1)
    bias, cr, cc = "0", 0, 0
    beta = k.get("beta", 1.0)
    if _has(pn, 2) and beta != 0:
        bias = c.buf(pn.inputs[2])
        cr, cc = broadcast_strides(c.shape(pn.inputs[2]), (M, N))
    c.line(f"mt_gemm_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {bias}, {c.buf(y)}, {M}, {N}, {K}, {ar}, {ac}, {br}, {bc}, "
           f"{cr}, {cc}, {c.literal(k.get('alpha', 1.0), y.dtype)}, {c.literal(beta, y.dtype)});")


# ---------------------------------------------------------------------------------------------
# Window geometry


def _pad3(values, fill) -> list[int]:
    return [fill] * (MAX_SPATIAL - len(values)) + [int(v) for v in values]


def window_geometry(size, out, kernel, strides, begin, dilations, end=None) -> list[int]:
    """The 21 numbers a window kernel reads (``lib/mt_nn.h``), padded to three spatial axes."""
    end = end if end is not None else [0] * len(size)
    return (_pad3(size, 1) + _pad3(out, 1) + _pad3(kernel, 1) + _pad3(strides, 1) + _pad3(begin, 0)
            + _pad3(dilations, 1) + _pad3(end, 0))


def node_window(pn, kernel):
    """The :class:`Window` of a Conv or pool node with this kernel shape, from its attributes."""
    k = pn.kwargs
    return window(pn.inputs[0].static_shape[2:], kernel, ints(k.get("strides")) or None,
                  ints(k.get("dilations")) or None, ints(k.get("pads")) or None,
                  text(k.get("auto_pad")) or "NOTSET", int(k.get("ceil_mode") or 0))


def _check_spatial(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(x) < 3 or len(x) - 2 > MAX_SPATIAL:
        return f"{len(x) - 2}-D window (C has 1-D to {MAX_SPATIAL}-D)"
    return None


def _check_out(pn, channels: int, out) -> str | None:
    want = (pn.inputs[0].static_shape[0], channels) + tuple(out)
    return _shapes_are(pn, {i: want for i in range(len(pn.outputs))})


# ---------------------------------------------------------------------------------------------
# Conv / ConvTranspose


# Winograd F(2x2, 3x3) (lib/mt_nn_winograd_t.h) where it pays: enough channels that the 16 GEMMs
# run at speed, and enough output for its transforms to be a small part (ResNet-18 on one core:
# the 56x56, 28x28 and 14x14 convolutions 1.6-2x faster; 7x7 ones are not).
WINOGRAD_MIN_CHANNELS = 16
WINOGRAD_MIN_OUTPUT = 14 * 14


def conv_kind(pn) -> tuple[str, object]:
    """How a Conv runs: ("pointwise" | "depthwise" | "winograd" | "im2col", its window)."""
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    group = int(pn.kwargs.get("group") or 1)
    win = node_window(pn, w[2:])
    if w[1] == 1 and group == x[1] and group > 1:
        return "depthwise", win
    if (group == 1 and len(x) == 4 and tuple(w[2:]) == (3, 3) and tuple(win.strides) == (1, 1)
            and tuple(win.dilations) == (1, 1) and min(x[1], w[0]) >= WINOGRAD_MIN_CHANNELS
            and prod(win.out) >= WINOGRAD_MIN_OUTPUT):
        return "winograd", win
    if all(v == 1 for v in (*win.kernel, *win.strides)) and not any(win.begin) and not any(win.end):
        return "pointwise", win
    return "im2col", win


def check_conv(pn):
    """Why C cannot run this Conv node, or None when it can."""
    why = _check_spatial(pn)
    if why:
        return why
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    group = int(pn.kwargs.get("group") or 1)
    if len(w) != len(x) or w[1] * group != x[1] or w[0] % group:
        return f"W {w} does not fit X {x} with group={group}"
    if _has(pn, 2) and prod(pn.inputs[2].static_shape) != w[0]:
        return "bias is not one value per output channel"
    if pn.kwargs.get(RESIDUAL) and (not _has(pn, 3) or pn.inputs[3].static_shape != pn.outputs[0].static_shape
                                    or conv_kind(pn)[0] not in FUSES_RESIDUAL):
        return "a fused residual must be shaped like the output, on a GEMM convolution"
    return _check_out(pn, w[0], conv_kind(pn)[1].out) or same_types(pn)


# The Conv kinds whose kernel adds a residual (mt_conv's GEMM epilogue); render.fuse asks.
FUSES_RESIDUAL = ("pointwise", "im2col")


def fuses_residual(pn) -> bool:
    """Whether this Conv's kernel can add an Add's other operand before storing."""
    return conv_kind(pn)[0] in FUSES_RESIDUAL


def _conv_scratch(pn) -> int:
    kind, win = conv_kind(pn)
    if kind == "winograd":  # U, V and the products (mt_conv_winograd)
        x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
        tiles = prod((o + 1) // 2 for o in win.out)
        stride = lambda n: (n + 15) // 16 * 16 + 16  # noqa: E731 - mt_winograd_stride
        return 16 * (stride(w[0] * x[1]) + stride(x[1] * tiles) + stride(w[0] * tiles)) * pn.outputs[0].dtype.itemsize
    if kind != "im2col":
        return 0
    w = pn.inputs[1].static_shape
    return prod(w[1:]) * prod(win.out) * pn.outputs[0].dtype.itemsize


@c_kernel("Conv", dtypes=FLOATS, check=check_conv, scratch=_conv_scratch)
def conv(pn, c):
    x, w, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    N, C = c.shape(x)[:2]
    M = c.shape(w)[0]
    kind, win = conv_kind(pn)
    g = c.arr(window_geometry(c.shape(x)[2:], win.out, win.kernel, win.strides, win.begin, win.dilations))
    sfx, bias = c.sfx(y), _bias(pn, c)
    # A Relu or Clip the renderer fused into this node (render.fuse): its bounds.
    lo, hi = (c.literal(b, y.dtype) for b in pn.kwargs.get(CLAMP, (-np.inf, np.inf)))
    if kind == "depthwise":
        c.line(f"mt_conv_depthwise_{sfx}({c.buf(x)}, {c.buf(w)}, {bias}, {c.buf(y)}, {N}, {C}, {M}, {g}, {lo}, {hi});")
        return
    if kind == "winograd":
        H, W = c.shape(x)[2:]
        c.line(f"mt_conv_winograd_{sfx}({c.buf(x)}, {c.buf(w)}, {bias}, {c.buf(y)}, ({c.ctype(y)} *){c.scratch}, "
               f"{N}, {C}, {M}, {H}, {W}, {win.out[0]}, {win.out[1]}, {win.begin[0]}, {win.begin[1]}, {lo}, {hi});")
        return
    col = f"({c.ctype(y)} *){c.scratch}" if kind == "im2col" else "0"
    res = c.buf(pn.inputs[3]) if pn.kwargs.get(RESIDUAL) else "0"  # render.fuse
    c.line(f"mt_conv_{sfx}({c.buf(x)}, {c.buf(w)}, {bias}, {res}, {c.buf(y)}, {col}, {N}, {C}, {M}, "
           f"{int(pn.kwargs.get('group') or 1)}, {g}, {lo}, {hi});")


def _transposed(pn):
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    k = pn.kwargs
    return transposed_window(x[2:], w[2:], ints(k.get("strides")) or None, ints(k.get("dilations")) or None,
                             ints(k.get("pads")) or None, text(k.get("auto_pad")) or "NOTSET",
                             ints(k.get("output_padding")) or None, ints(k.get("output_shape")) or None)


def _check_conv_transpose(pn):
    why = _check_spatial(pn)
    if why:
        return why
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    group = int(pn.kwargs.get("group") or 1)
    if len(w) != len(x) or w[0] != x[1] or x[1] % group:
        return f"W {w} does not fit X {x} with group={group}"
    if pn.outputs[0].static_shape[1] != w[1] * group:
        return "output channels differ from W's"
    if _has(pn, 2) and prod(pn.inputs[2].static_shape) != w[1] * group:
        return "bias is not one value per output channel"
    return _check_out(pn, w[1] * group, _transposed(pn).out) or same_types(pn)


def _conv_transpose_scratch(pn) -> int:
    x, w = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    return prod(w[1:]) * prod(x[2:]) * pn.outputs[0].dtype.itemsize


@c_kernel("ConvTranspose", dtypes=FLOATS, check=_check_conv_transpose, scratch=_conv_transpose_scratch)
def conv_transpose(pn, c):
    x, w, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    N, C = c.shape(x)[:2]
    geo = _transposed(pn)
    g = c.arr(window_geometry(c.shape(x)[2:], geo.out, geo.kernel, geo.strides, geo.begin, geo.dilations))
    c.line(f"mt_conv_transpose_{c.sfx(y)}({c.buf(x)}, {c.buf(w)}, {_bias(pn, c)}, {c.buf(y)}, "
           f"({c.ctype(y)} *){c.scratch}, {N}, {C}, {c.shape(y)[1]}, {int(pn.kwargs.get('group') or 1)}, {g});")


# ---------------------------------------------------------------------------------------------
# Pooling


def check_pool(pn):
    """Why C cannot run this pool node, or None when it can."""
    why = _check_spatial(pn)
    if why:
        return why
    kernel = ints(pn.kwargs.get("kernel_shape")) or []
    if len(kernel) != len(pn.inputs[0].static_shape) - 2:
        return f"kernel_shape {kernel} does not fit the input's spatial rank"
    if len(pn.outputs) > 1 and pn.outputs[1].dtype != np.dtype(np.int64):
        return "Indices output is not int64"
    if len(pn.outputs) > 1 and pn.outputs[1].static_shape != pn.outputs[0].static_shape:
        return "Indices shape differs from Y's"
    if pn.outputs[0].dtype != pn.inputs[0].dtype:
        return "output dtype differs from the input's"
    return _check_out(pn, pn.inputs[0].static_shape[1], node_window(pn, kernel).out)


@c_kernel("MaxPool", dtypes=FLOATS | {np.dtype(np.int8), np.dtype(np.uint8)}, check=check_pool)
def max_pool(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    win = node_window(pn, ints(pn.kwargs["kernel_shape"]))
    g = c.arr(window_geometry(shape[2:], win.out, win.kernel, win.strides, win.begin, win.dilations, win.end))
    indices, istr = "0", "0"
    if len(pn.outputs) > 1:
        size = shape[2:]
        # Flat positions: spatial axes row-major, or column-major with storage_order=1.
        order = range(len(size)) if pn.kwargs.get("storage_order") else range(len(size) - 1, -1, -1)
        steps, step = [0] * len(size), 1
        for i in order:
            steps[i] = step
            step *= size[i]
        indices, istr = f"(int64_t *){c.buf(pn.outputs[1])}", c.arr(_pad3(steps, 0))
    c.line(f"mt_maxpool_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {indices}, {shape[0] * shape[1]}, {g}, {istr});")


@c_kernel("AveragePool", "LpPool", dtypes=FLOATS, check=check_pool)
def average_pool(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape, k = c.shape(x), pn.kwargs
    win = node_window(pn, ints(k["kernel_shape"]))
    g = c.arr(window_geometry(shape[2:], win.out, win.kernel, win.strides, win.begin, win.dilations, win.end))
    if pn.op_type == "LpPool":
        mode, p = 2, k.get("p", 2)
    else:
        mode, p = int(bool(k.get("count_include_pad"))), 1
    c.line(f"mt_pool_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {shape[0] * shape[1]}, {g}, {mode}, "
           f"{c.literal(p, y.dtype)});")


GLOBAL_POOLS = {"GlobalAveragePool": 0, "GlobalMaxPool": 1, "GlobalLpPool": 2}


def _check_global_pool(pn):
    x = pn.inputs[0].static_shape
    if len(x) < 2:
        return "input of rank < 2"
    return _shapes_are(pn, {0: tuple(x[:2]) + (1,) * (len(x) - 2)}) or same_types(pn)


@c_kernel(*GLOBAL_POOLS, dtypes=FLOATS, check=_check_global_pool)
def global_pool(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    s = c.shape(x)
    p = pn.kwargs.get("p", 2) if pn.op_type == "GlobalLpPool" else 1
    c.line(f"mt_global_pool_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {s[0] * s[1]}, {prod(s[2:])}, "
           f"{GLOBAL_POOLS[pn.op_type]}, {c.literal(p, y.dtype)});")


def _unpool_shapes(pn):
    """(the shape MaxPool would invert, the output shape)."""
    x, k = pn.inputs[0].static_shape, pn.kwargs
    geo = transposed_window(x[2:], ints(k["kernel_shape"]), ints(k.get("strides")) or None, None,
                            ints(k.get("pads")) or None)
    return tuple(x[:2]) + tuple(geo.out), tuple(pn.outputs[0].static_shape)


def _check_unpool(pn):
    why = _check_spatial(pn)
    if why:
        return why
    if pn.inputs[1].dtype != np.dtype(np.int64) or pn.inputs[1].static_shape != pn.inputs[0].static_shape:
        return "indices are not int64 of X's shape"
    inferred, out = _unpool_shapes(pn)
    if out[:2] != inferred[:2] or len(out) != len(inferred) or (not _has(pn, 2) and out != inferred):
        return f"output shape {out} does not fit the unpooled shape {inferred}"
    if pn.outputs[0].dtype != pn.inputs[0].dtype:
        return "output dtype differs from the input's"
    return None


# output_shape (input 2) is read through the output's static shape, so it may come at run time.
@c_kernel("MaxUnpool", dtypes=FLOATS, check=_check_unpool)
def max_unpool(pn, c):
    x, ind, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    inferred, out = _unpool_shapes(pn)
    c.checked(f"mt_maxunpool_{c.sfx(y)}({c.buf(x)}, (const int64_t *){c.buf(ind)}, {c.buf(y)}, {c.numel(x)}, "
              f"{out[0] * out[1]}, {c.arr(_pad3(inferred[2:], 1))}, {c.arr(_pad3(out[2:], 1))})",
              "an index is outside the unpooled shape")


# ---------------------------------------------------------------------------------------------
# Normalization


def _check_batchnorm(pn):
    k = pn.kwargs
    training = bool(k.get("training_mode"))
    if pn.opset < 14 and (len(pn.outputs) > 1 or (k.get("is_test") == 0 and "is_test" in pn.attributes)):
        return "training mode before opset 14"
    if len(pn.outputs) > 1 and not training:
        return "running statistics asked for outside training mode"
    C = pn.inputs[0].static_shape[1] if len(pn.inputs[0].static_shape) > 1 else 1
    if any(prod(v.static_shape) != C for v in pn.inputs[1:5]):
        return "parameters are not one value per channel (spatial=0)"
    if any(o.dtype != pn.inputs[0].dtype for o in pn.outputs if o.name):
        return "outputs in another dtype than X"
    return _shapes_are(pn, {0: pn.inputs[0].static_shape}) or _numels_are(pn, {1: C, 2: C}) or same_types(pn)


@c_kernel("BatchNormalization", dtypes=FLOATS, check=_check_batchnorm)
def batchnorm(pn, c):
    x, scale, bias, mean, var = pn.inputs[:5]
    y, s = pn.outputs[0], c.shape(pn.inputs[0])
    args = (f"{c.buf(x)}, {c.buf(scale)}, {c.buf(bias)}, {c.buf(mean)}, {c.buf(var)}, {c.buf(y)}")
    dims = f"{s[0]}, {s[1] if len(s) > 1 else 1}, {prod(s[2:])}"
    eps = pn.kwargs.get("epsilon", 1e-5)
    if pn.kwargs.get("training_mode"):  # batch statistics; the running ones updated with momentum
        stats = [c.buf(o) if o.name else "0" for o in pn.outputs[1:3]] + ["0"] * (3 - len(pn.outputs))
        c.line(f"mt_batchnorm_train_{c.sfx(y)}({args}, {stats[0]}, {stats[1]}, {dims}, {float(eps)!r}, "
               f"{float(pn.kwargs.get('momentum', 0.9))!r});")
        return
    c.line(f"mt_batchnorm_{c.sfx(y)}({args}, {dims}, {c.literal(eps, y.dtype)});")


def _layernorm_axis(pn) -> int:
    rank = len(pn.inputs[0].static_shape)
    return int(pn.kwargs.get("axis", -1)) % max(rank, 1)


def _row_step(shape, inner_shape) -> int | None:
    """1 when a parameter of ``shape`` covers the normalized dims ``inner_shape`` element for
    element, 0 when it is one value, None otherwise (a partial broadcast C does not take)."""
    n = prod(shape)
    if n == 1:
        return 0
    if len(shape) <= len(inner_shape) and n == prod(inner_shape) and \
            tuple(shape) == tuple(inner_shape[len(inner_shape) - len(shape):]):
        return 1
    return None


def _check_layernorm(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    inner = x[_layernorm_axis(pn):]
    for i in (1, 2):
        if _has(pn, i) and _row_step(pn.inputs[i].static_shape, inner) is None:
            return f"{pn.inputs[i].name!r} {pn.inputs[i].static_shape} broadcasts partly over {tuple(inner)}"
    if any(o.dtype != pn.inputs[0].dtype for o in pn.outputs):
        return "Mean/InvStdDev in another dtype than X"
    rows = prod(x[:_layernorm_axis(pn)])
    return _shapes_are(pn, {0: x}) or _numels_are(pn, {1: rows, 2: rows}) or same_types(pn)


@c_kernel("LayerNormalization", dtypes=FLOATS, check=_check_layernorm)
def layernorm(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    s = c.shape(x)
    axis = _layernorm_axis(pn)
    inner = s[axis:]
    ss = _row_step(c.shape(pn.inputs[1]), inner)
    bs = _row_step(c.shape(pn.inputs[2]), inner) if _has(pn, 2) else 0
    stats = [c.buf(o) if o.name else "0" for o in pn.outputs[1:3]] + ["0"] * (3 - len(pn.outputs))
    c.line(f"mt_layernorm_{c.sfx(y)}({c.buf(x)}, {c.buf(pn.inputs[1])}, {_bias(pn, c)}, {c.buf(y)}, {stats[0]}, "
           f"{stats[1]}, {prod(s[:axis])}, {prod(inner)}, {ss}, {bs}, {float(pn.kwargs.get('epsilon', 1e-5))!r});")


def _check_channel_norm(pn):
    x = pn.inputs[0].static_shape
    if len(x) < 2:
        return "input of rank < 2"
    if pn.op_type == "GroupNormalization":
        G = int(pn.kwargs["num_groups"])
        if G < 1 or x[1] % G:
            return f"num_groups={G} does not divide {x[1]} channels"
        want = x[1] if pn.opset >= 21 else G
    else:
        want = x[1]
    if any(prod(v.static_shape) != want for v in pn.inputs[1:3]):
        return f"scale and bias are not {want} values"
    return _same_shape(pn)


@c_kernel("InstanceNormalization", "GroupNormalization", dtypes=FLOATS, check=_check_channel_norm)
def channel_norm(pn, c):
    x, scale, bias = pn.inputs[:3]
    y, s = pn.outputs[0], c.shape(x)
    G = int(pn.kwargs["num_groups"]) if pn.op_type == "GroupNormalization" else s[1]
    per_group = int(pn.op_type == "GroupNormalization" and pn.opset < 21)
    c.line(f"mt_groupnorm_{c.sfx(y)}({c.buf(x)}, {c.buf(scale)}, {c.buf(bias)}, {c.buf(y)}, {s[0]}, {G}, "
           f"{s[1] // G}, {prod(s[2:])}, {per_group}, {float(pn.kwargs.get('epsilon', 1e-5))!r});")


def _check_lrn(pn):
    if len(pn.inputs[0].static_shape) < 2:
        return "input of rank < 2"
    return _same_shape(pn)


@c_kernel("LRN", dtypes=FLOATS, check=_check_lrn)
def lrn(pn, c):
    x, y, k = pn.inputs[0], pn.outputs[0], pn.kwargs
    s = c.shape(x)
    c.line(f"mt_lrn_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {s[0]}, {s[1]}, {prod(s[2:])}, {int(k['size'])}, "
           f"{float(k.get('alpha', 1e-4))!r}, {float(k.get('beta', 0.75))!r}, {float(k.get('bias', 1.0))!r});")


def _mvn_axes(pn) -> list[int]:
    rank = len(pn.inputs[0].static_shape)
    axes = ints(pn.kwargs.get("axes"))
    return sorted({a % rank for a in (axes if axes is not None else [0, 2, 3])})


def _check_mvn(pn):
    rank = len(pn.inputs[0].static_shape)
    axes = ints(pn.kwargs.get("axes"))
    if rank == 0 or any(not -rank <= a < rank for a in (axes if axes is not None else [0, 2, 3])):
        return f"axes out of range for rank {rank}"
    return _same_shape(pn)


def _mvn_scratch(pn) -> int:
    shape = pn.inputs[0].static_shape
    return 2 * 8 * prod(d for i, d in enumerate(shape) if i not in _mvn_axes(pn))


@c_kernel("MeanVarianceNormalization", dtypes=FLOATS, check=_check_mvn, scratch=_mvn_scratch)
def mvn(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape, axes = c.shape(x), _mvn_axes(pn)
    kept = [d if i not in axes else 1 for i, d in enumerate(shape)]
    gstr = [0 if i in axes else st for i, st in enumerate(_contiguous(kept))]
    c.line(f"mt_mvn_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, (double *){c.scratch}, {len(shape)}, {c.arr(shape)}, "
           f"{c.arr(gstr)}, {prod(kept)}, {prod(shape[i] for i in axes)});")


def _contiguous(shape) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


# ---------------------------------------------------------------------------------------------
# Softmax family, Dropout

SOFTMAX_MODES = {"Softmax": 0, "LogSoftmax": 1, "Hardmax": 2}


@c_kernel(*SOFTMAX_MODES, dtypes=FLOATS, check=_same_shape)
def softmax(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    s = c.shape(x)
    axis = pn.kwargs.get("axis", -1 if pn.opset >= 13 else 1) % max(len(s), 1)
    if pn.opset >= 13:
        outer, mid, inner = prod(s[:axis]), s[axis] if s else 1, prod(s[axis + 1:])
    else:  # before 13 the input is coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])]
        outer, mid, inner = prod(s[:axis]), prod(s[axis:]), 1
    c.line(f"mt_softmax_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {outer}, {mid}, {inner}, {SOFTMAX_MODES[pn.op_type]});")


def _constant(pn, i: int):
    """Input ``i``'s value when it is a constant, else None."""
    v = pn.inputs[i] if _has(pn, i) else None
    return None if v is None or v.kind != "constant" else np.asarray(v.value).reshape(-1)


def _check_dropout(pn):
    k = pn.kwargs
    if pn.opset < 7 and not k.get("is_test"):
        return "training mode (is_test=0)"
    training, ratio = _constant(pn, 2), _constant(pn, 1)
    if _has(pn, 2) and training is None:
        return "training_mode given at run time"
    if training is not None and bool(training[0]) and not (ratio is not None and float(ratio[0]) == 0):
        return "training mode with a nonzero ratio (C runs Dropout in inference)"
    if pn.outputs[0].dtype != pn.inputs[0].dtype:
        return "output dtype differs from the input's"
    if len(pn.outputs) > 1 and pn.outputs[1].name and pn.outputs[1].dtype not in FLOATS | {np.dtype(np.bool_)}:
        return f"mask of dtype {pn.outputs[1].dtype}"
    return _shapes_are(pn, {0: pn.inputs[0].static_shape, 1: pn.inputs[0].static_shape})


# Dropout is the identity with an all-true mask (ones before opset 10) in inference, and in
# training with ratio 0.
@c_kernel("Dropout", check=_check_dropout, alias=True)
def dropout(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if c.buf(x) != c.buf(y):
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")
    if len(pn.outputs) > 1 and pn.outputs[1].name:
        mask = pn.outputs[1]
        if mask.dtype == np.dtype(np.bool_):
            c.line(f"memset({c.buf(mask)}, 1, {c.numel(mask)});")
        else:
            c.line(f"mt_fill_one_{c.sfx(mask)}({c.buf(mask)}, {c.numel(mask)});")


# ---------------------------------------------------------------------------------------------
# onnxruntime contrib ops that exported transformers use

MS = "com.microsoft"
GELUS = {"Gelu": 0, "BiasGelu": 0, "FastGelu": 1}


def _check_gelu(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    if _has(pn, 1) and tuple(pn.inputs[1].static_shape) not in ((x[-1],), (1,) * (len(x) - 1) + (x[-1],)):
        return f"bias {pn.inputs[1].static_shape} is not one row of {x[-1]}"
    return _same_shape(pn)


@c_kernel(*GELUS, domain=MS, dtypes=FLOATS, check=_check_gelu)
def gelu(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    cols = c.shape(x)[-1]
    c.line(f"mt_gelu_bias_{c.sfx(y)}({c.buf(x)}, {_bias(pn, c, 1)}, {c.buf(y)}, {prod(c.shape(x)[:-1])}, {cols}, "
           f"{GELUS[pn.op_type]});")


def _check_skip_layernorm(pn):
    x = pn.inputs[0].static_shape
    if not x:
        return "0-d input"
    if pn.inputs[1].static_shape != x:
        return f"skip {pn.inputs[1].static_shape} differs from the input's shape {x}"
    for i in (2, 3, 4):
        if _has(pn, i) and prod(pn.inputs[i].static_shape) != x[-1]:
            return f"{pn.inputs[i].name!r} is not one row of {x[-1]}"
    if any(o.dtype != pn.inputs[0].dtype for o in pn.outputs if o.name):
        return "statistics in another dtype than the input"
    rows = prod(x[:-1])
    return _shapes_are(pn, {0: x, 3: x}) or _numels_are(pn, {1: rows, 2: rows}) or same_types(pn)


@c_kernel("SkipLayerNormalization", domain=MS, dtypes=FLOATS, check=_check_skip_layernorm)
def skip_layernorm(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    cols = c.shape(x)[-1]
    extra = [c.buf(pn.outputs[i]) if len(pn.outputs) > i and pn.outputs[i].name else "0" for i in (1, 2, 3)]
    c.line(f"mt_skip_layernorm_{c.sfx(y)}({c.buf(x)}, {c.buf(pn.inputs[1])}, {c.buf(pn.inputs[2])}, "
           f"{_bias(pn, c, 3)}, {_bias(pn, c, 4)}, {c.buf(y)}, {', '.join(extra)}, {prod(c.shape(x)[:-1])}, {cols}, "
           f"{float(pn.kwargs.get('epsilon', 1e-12))!r});")


# ---------------------------------------------------------------------------------------------
# Losses


def _check_loss(pn):
    x = pn.inputs[0].static_shape
    t = pn.inputs[1]
    if len(x) < 2:
        return "input of rank < 2"
    if t.dtype != np.dtype(np.int64):
        return f"target of dtype {t.dtype} (C takes int64)"
    if tuple(t.static_shape) != tuple(x[:1]) + tuple(x[2:]):
        return f"target {t.static_shape} does not fit input {x}"
    if _has(pn, 2) and pn.inputs[2].static_shape != (x[1],):
        return "weight is not one value per class"
    if text(pn.kwargs.get("reduction", "mean")) not in ("none", "sum", "mean"):
        return f"reduction {pn.kwargs.get('reduction')!r}"
    if any(o.dtype != pn.inputs[0].dtype for o in pn.outputs if o.name):
        return "outputs in another dtype than the input"
    none = text(pn.kwargs.get("reduction", "mean")) == "none"
    return _shapes_are(pn, {0: t.static_shape} if none else {1: x}) or _shapes_are(pn, {1: x}) or \
        _numels_are(pn, {} if none else {0: 1})


def _loss_scratch(pn) -> int:
    # SoftmaxCrossEntropyLoss keeps its log-probabilities in scratch when they are not an output.
    if pn.op_type == "SoftmaxCrossEntropyLoss" and not (len(pn.outputs) > 1 and pn.outputs[1].name):
        return prod(pn.inputs[0].static_shape) * pn.inputs[0].dtype.itemsize
    return 0


@c_kernel("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", dtypes=FLOATS, check=_check_loss,
          scratch=_loss_scratch)
def loss(pn, c):
    x, target, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    s = c.shape(x)
    N, C, D = s[0], s[1], prod(s[2:])
    log_prob = c.buf(x)
    if pn.op_type == "SoftmaxCrossEntropyLoss":
        log_prob = c.buf(pn.outputs[1]) if _loss_scratch(pn) == 0 else f"({c.ctype(x)} *){c.scratch}"
        c.line(f"mt_softmax_{c.sfx(x)}({c.buf(x)}, {log_prob}, {N}, {C}, {D}, 1);")
    ignore = pn.kwargs.get("ignore_index")
    reduction = {"none": 0, "sum": 1, "mean": 2}[text(pn.kwargs.get("reduction", "mean"))]
    c.checked(f"mt_nll_{c.sfx(x)}({log_prob}, (const int64_t *){c.buf(target)}, {_bias(pn, c)}, {c.buf(y)}, {N}, "
              f"{C}, {D}, {int(ignore is not None)}, {int(ignore or 0)}LL, {reduction})",
              "a target is outside [0, classes)")
