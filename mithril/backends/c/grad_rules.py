"""The C backward kernels, per op family: each prints the calls into ``lib/mt_grad.h`` that
write a node's input gradients from its output's cotangent, and says where it cannot
(registered with :func:`~.grad_items.grad_kernel`)."""

from __future__ import annotations

from math import prod

import numpy as np

from .grad_items import Item, grad_kernel
from .ops import FLOATS, broadcast_strides, ints, strides


def _floats_only(item: Item) -> str | None:
    for k, d in enumerate(item.grads):
        if d is not None and item.x(k).dtype != item.g.dtype:
            return f"input {item.x(k).name!r} is {item.x(k).dtype}, the cotangent {item.g.dtype}"
    return None


def _only_first(item: Item) -> str | None:
    if any(d is not None for d in item.grads[1:]):
        return "a gradient wanted for an input other than the first"
    return _floats_only(item)


@grad_kernel("Relu", check=_only_first)
def relu_grad(item, c):
    g, x, dx = item.g, item.x(0), item.dx(0)
    c.line(f"mt_grad_relu_{c.sfx(g)}({c.buf(g)}, {c.buf(x)}, {c.buf(dx)}, {c.numel(dx)});")


def _check_clip(item):
    for k, v in enumerate(item.node.inputs[1:], 1):
        if v is not None and (v.dtype != item.x(0).dtype or v.static_shape is None or prod(v.static_shape) != 1):
            return f"bound {v.name!r} is not a {item.x(0).dtype} scalar"
        if item.dx(k) is not None and item.x(0) is v:
            return "one value at several wanted inputs"
    return _floats_only(item)


@grad_kernel("Clip", check=_check_clip)
def clip_grad(item, c):
    g, pn = item.g, item.node
    bounds = []
    for i, name, default in ((1, "min", -np.inf), (2, "max", np.inf)):
        if pn.opset < 11:
            bounds.append(c.literal(pn.kwargs.get(name, default), g.dtype))
        elif len(pn.inputs) > i and pn.inputs[i] is not None:
            bounds.append(f"{c.buf(pn.inputs[i])}[0]")
        else:
            bounds.append(c.literal(default, g.dtype))
    a = item.x(0) if pn.opset < 11 else pn.outputs[0]
    grads = [c.buf(item.dx(k)) if item.dx(k) is not None else "NULL" for k in range(3)]
    c.line(f"mt_grad_clip_{c.sfx(g)}({c.buf(g)}, {c.buf(a)}, {grads[0]}, {c.numel(g)}, {bounds[0]}, {bounds[1]}, "
           f"{int(pn.opset < 11)}, {grads[1]}, {grads[2]});")


@grad_kernel("Tanh", "Sigmoid", "Exp", "Sqrt", check=_only_first)
def from_output_grad(item, c):
    g, y, dx = item.g, item.node.outputs[0], item.dx(0)
    name = {"Tanh": "tanh", "Sigmoid": "sigmoid", "Exp": "exp", "Sqrt": "sqrt"}[item.node.op_type]
    c.line(f"mt_grad_{name}_{c.sfx(g)}({c.buf(g)}, {c.buf(y)}, {c.buf(dx)}, {c.numel(dx)});")


@grad_kernel("Neg", "Identity", check=_only_first)
def scale_grad(item, c):
    g, dx = item.g, item.dx(0)
    s = -1 if item.node.op_type == "Neg" else 1
    c.line(f"mt_grad_scale_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {c.numel(dx)}, {c.literal(s, g.dtype)});")


@grad_kernel("StopGradient", domain="ai.mithril", check=_only_first)
def stop_gradient_grad(item, c):
    dx = item.dx(0)
    c.line(f"memset({c.buf(dx)}, 0, {c.numel(dx) * dx.dtype.itemsize});")


def _dropout_mode(item) -> tuple[bool, float] | None:
    """(training, ratio) of a Dropout, None when either is given at run time."""
    pn = item.node
    if pn.opset < 12:
        return False, 0.5
    ratio, mode = item.x(1), item.x(2)
    if any(v is not None and v.kind != "constant" for v in (ratio, mode)):
        return None
    training = mode is not None and bool(np.asarray(mode.value).reshape(-1)[0])
    return training, 0.5 if ratio is None else float(np.asarray(ratio.value).reshape(-1)[0])


def _check_dropout(item):
    if _dropout_mode(item) is None:
        return "ratio or training_mode given at run time"
    return _only_first(item)


@grad_kernel("Dropout", check=_check_dropout)
def dropout_grad(item, c):
    g, y, dx = item.g, item.node.outputs[0], item.dx(0)
    training, ratio = _dropout_mode(item)
    if not training:
        c.line(f"mt_grad_scale_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {c.numel(dx)}, {c.literal(1, g.dtype)});")
        return
    c.line(f"mt_grad_dropout_{c.sfx(g)}({c.buf(g)}, {c.buf(y)}, {c.buf(dx)}, {c.numel(dx)}, "
           f"{c.literal(1 / (1 - ratio), g.dtype)});")


@grad_kernel("Reshape", "Flatten", "Squeeze", "Unsqueeze", check=_only_first)
def view_grad(item, c):
    g, dx = item.g, item.dx(0)
    c.line(f"mt_copy_bytes({c.buf(g)}, {c.buf(dx)}, {c.numel(dx) * dx.dtype.itemsize});")


@grad_kernel("Transpose", check=_only_first)
def transpose_grad(item, c):
    g, x, dx = item.g, item.x(0), item.dx(0)
    xs = c.shape(x)
    perm = ints(item.kwargs.get("perm")) or list(range(len(xs)))[::-1]
    st = strides(xs)
    sx = [st[p] for p in perm]
    shape = c.shape(g)
    zeros = c.arr([0] * len(shape))
    c.line(f"mt_grad_unbroadcast_{c.sfx(g)}({c.buf(g)}, 0, 0, {c.buf(dx)}, {c.numel(dx)}, {len(shape)}, "
           f"{c.arr(shape)}, {zeros}, {zeros}, {c.arr(sx)}, {c.literal(1, g.dtype)}, 0);")


def _check_binary(item):
    y = item.node.outputs[0].static_shape
    if tuple(item.g.static_shape) != tuple(y):
        return "cotangent shape differs from the output's"
    for k in (0, 1):
        if len(item.x(k).static_shape) > len(y):
            return "input of higher rank than the output"
    return _floats_only(item)


@grad_kernel("Add", "Sub", "Mul", "Div", check=_check_binary)
def binary_grad(item, c):
    g = item.g
    shape = c.shape(g)
    op = item.node.op_type
    a, b = item.x(0), item.x(1)
    strides_of = {v: broadcast_strides(c.shape(v), shape) for v in (a, b)}
    if a is b:  # x * x, x + x: one gradient, both terms
        dx = item.dx(0)
        mul = a if op == "Mul" else None
        zeros = [0] * len(shape)
        c.line(f"mt_grad_unbroadcast_{c.sfx(g)}({c.buf(g)}, {c.buf(mul) if mul is not None else 0}, 0, {c.buf(dx)}, "
               f"{c.numel(dx)}, {len(shape)}, {c.arr(shape)}, {c.arr(strides_of[a] if mul is not None else zeros)}, "
               f"{c.arr(zeros)}, {c.arr(strides_of[a])}, {c.literal(2, g.dtype)}, 0);")
        return
    for k in (0, 1):
        dx = item.dx(k)
        if dx is None:
            continue
        x, other = item.x(k), item.x(1 - k)
        s = -1 if (op in ("Sub", "Div") and k == 1) else 1
        if op in ("Add", "Sub") and tuple(c.shape(x)) == tuple(shape):
            c.line(f"mt_grad_scale_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {c.numel(dx)}, {c.literal(s, g.dtype)});")
            continue
        # Mul: g * other; Div: da = g / b, db = -g * a / b^2.
        mul = other if op == "Mul" else a if (op == "Div" and k == 1) else None
        div = b if op == "Div" else None
        sm = strides_of[mul] if mul is not None else [0] * len(shape)
        sd = strides_of[div] if div is not None else [0] * len(shape)
        c.line(f"mt_grad_unbroadcast_{c.sfx(g)}({c.buf(g)}, {c.buf(mul) if mul is not None else 0}, "
               f"{c.buf(div) if div is not None else 0}, {c.buf(dx)}, {c.numel(dx)}, {len(shape)}, {c.arr(shape)}, "
               f"{c.arr(sm)}, {c.arr(sd)}, {c.arr(strides_of[x])}, {c.literal(s, g.dtype)}, "
               f"{int(k == 1 and op == 'Div')});")


def _check_sum(item):
    y = item.node.outputs[0].static_shape
    if any(len(v.static_shape) > len(y) for v in item.node.inputs if v is not None):
        return "input of higher rank than the output"
    return _floats_only(item)


@grad_kernel("Sum", check=_check_sum)
def sum_grad(item, c):
    g = item.g
    shape = c.shape(g)
    zeros = [0] * len(shape)
    for k, dx in enumerate(item.grads):
        if dx is None:
            continue
        n = sum(1 for j, v in enumerate(item.node.inputs) if v is item.x(k) and item.rule.needs[j])
        if tuple(c.shape(dx)) == tuple(shape):
            c.line(f"mt_grad_scale_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {c.numel(dx)}, {c.literal(n, g.dtype)});")
        else:
            c.line(f"mt_grad_unbroadcast_{c.sfx(g)}({c.buf(g)}, 0, 0, {c.buf(dx)}, {c.numel(dx)}, {len(shape)}, "
                   f"{c.arr(shape)}, {c.arr(zeros)}, {c.arr(zeros)}, {c.arr(broadcast_strides(c.shape(dx), shape))}, "
                   f"{c.literal(n, g.dtype)}, 0);")


# MatMul / MatMulAdd / Gemm: products of the cotangent with the other operand, through mt_gemm with
# transposed strides (A(i,k) = A[i*ar + k*ac], B(k,j) = B[k*br + j*bc]).


def _check_matmul(item):
    a, b = item.x(0).static_shape, item.x(1).static_shape
    if len(a) < 2 or len(b) != 2:
        return f"MatMul of ranks {len(a)} and {len(b)} (the C backward takes [..., M, K] @ [K, N])"
    if item.node.op_type == "MatMulAdd" and prod(item.x(2).static_shape) != b[1]:
        return "bias is not one row"
    return _floats_only(item)


def _gemm(c, t, A, B, Y, M, N, K, ar, ac, br, bc, alpha=1):
    c.line(f"mt_gemm_{c.sfx(t)}({A}, {B}, 0, {Y}, {M}, {N}, {K}, {ar}, {ac}, {br}, {bc}, 0, 0, "
           f"{c.literal(alpha, t)}, {c.literal(0, t)});")


@grad_kernel("MatMul", check=_check_matmul)
@grad_kernel("MatMulAdd", domain="ai.mithril", check=_check_matmul)
def matmul_grad(item, c):
    g, a, b = item.g, item.x(0), item.x(1)
    (K, N), M = c.shape(b), prod(c.shape(a)[:-1])  # a's leading dims fold into M: one GEMM
    t = g.dtype
    if item.dx(0) is not None:  # dA[M,K] = G[M,N] @ B^T
        _gemm(c, t, c.buf(g), c.buf(b), c.buf(item.dx(0)), M, K, N, N, 1, 1, N)
    if item.dx(1) is not None:  # dB[K,N] = A^T @ G
        _gemm(c, t, c.buf(a), c.buf(g), c.buf(item.dx(1)), K, N, M, 1, K, N, 1)
    if item.dx(2) is not None:
        c.line(f"mt_grad_colsum_{c.sfx(g)}({c.buf(g)}, {c.buf(item.dx(2))}, {M}, {N});")


def _check_gemm(item):
    if len(item.x(0).static_shape) != 2 or len(item.x(1).static_shape) != 2:
        return "Gemm operands are not 2-D"
    return _floats_only(item)


@grad_kernel("Gemm", check=_check_gemm)
def gemm_grad(item, c):
    g, a, b = item.g, item.x(0), item.x(1)
    k = item.kwargs
    ta, tb = int(k.get("transA") or 0), int(k.get("transB") or 0)
    alpha, beta = float(k.get("alpha", 1.0)), float(k.get("beta", 1.0))
    M, N = c.shape(g)
    K = c.shape(a)[0] if ta else c.shape(a)[1]
    t = g.dtype
    # op(B)(k, n) = B[k*obr + n*obc]
    obr, obc = (1, K) if tb else (N, 1)
    oar, oac = (1, M) if ta else (K, 1)  # op(A)(m, k) = A[m*oar + k*oac]
    if item.dx(0) is not None:
        if not ta:  # dA[M,K] = alpha G @ op(B)^T: B'(n, k) = op(B)(k, n)
            _gemm(c, t, c.buf(g), c.buf(b), c.buf(item.dx(0)), M, K, N, N, 1, obc, obr, alpha)
        else:  # dA[K,M] = alpha op(B) @ G^T
            _gemm(c, t, c.buf(b), c.buf(g), c.buf(item.dx(0)), K, M, N, obr, obc, 1, N, alpha)
    if item.dx(1) is not None:
        if not tb:  # dB[K,N] = alpha op(A)^T @ G
            _gemm(c, t, c.buf(a), c.buf(g), c.buf(item.dx(1)), K, N, M, oac, oar, N, 1, alpha)
        else:  # dB[N,K] = alpha G^T @ op(A)
            _gemm(c, t, c.buf(g), c.buf(a), c.buf(item.dx(1)), N, K, M, 1, N, oar, oac, alpha)
    dc = item.dx(2)
    if dc is not None:
        shape = c.shape(g)
        zeros = c.arr([0, 0])
        c.line(f"mt_grad_unbroadcast_{c.sfx(g)}({c.buf(g)}, 0, 0, {c.buf(dc)}, {c.numel(dc)}, 2, {c.arr(shape)}, "
               f"{zeros}, {zeros}, {c.arr(broadcast_strides(c.shape(item.x(2)), shape))}, {c.literal(beta, t)}, 0);")


def _softmax_split(item):
    shape = item.x(0).static_shape
    rank = len(shape)
    axis = item.kwargs.get("axis")
    if item.node.opset < 13:
        axis = (1 if axis is None else int(axis)) % max(rank, 1)
        return prod(shape[:axis]), prod(shape[axis:]), 1
    axis = (-1 if axis is None else int(axis)) % max(rank, 1)
    return prod(shape[:axis]), shape[axis] if rank else 1, prod(shape[axis + 1:])


@grad_kernel("Softmax", "LogSoftmax", check=_only_first)
def softmax_grad(item, c):
    g, y, dx = item.g, item.node.outputs[0], item.dx(0)
    outer, n, inner = _softmax_split(item)
    c.line(f"mt_grad_softmax_{c.sfx(g)}({c.buf(g)}, {c.buf(y)}, {c.buf(dx)}, {outer}, {n}, {inner}, "
           f"{int(item.node.op_type == 'LogSoftmax')});")


def _reduce_axes(item) -> list[int] | None:
    """The reduced axes (None: not known at render time)."""
    pn, rank = item.node, len(item.x(0).static_shape)
    axes = None
    if len(pn.inputs) > 1 and pn.inputs[1] is not None:
        if pn.inputs[1].kind != "constant":
            return None
        axes = ints(pn.inputs[1].value)
    elif pn.kwargs.get("axes") is not None:
        axes = ints(pn.kwargs["axes"])
    if not axes:
        return [] if pn.kwargs.get("noop_with_empty_axes") else list(range(rank))
    return sorted(a % rank for a in axes)


def _check_reduce(item):
    if _reduce_axes(item) is None:
        return "axes given at run time"
    return _only_first(item)


@grad_kernel("ReduceMean", "ReduceSum", check=_check_reduce)
def reduce_grad(item, c):
    g, x, dx = item.g, item.x(0), item.dx(0)
    xs = c.shape(x)
    axes = _reduce_axes(item)
    keep = [1 if i in axes else d for i, d in enumerate(xs)]
    count = prod(xs[i] for i in axes) if axes else 1
    s = 1.0 / count if item.node.op_type == "ReduceMean" and count else 1.0
    c.line(f"mt_grad_expand_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {len(xs)}, {c.arr(xs)}, "
           f"{c.arr(broadcast_strides(keep, xs))}, {c.literal(s, g.dtype)});")


@grad_kernel("GlobalAveragePool", check=_only_first)
def global_average_pool_grad(item, c):
    g, x, dx = item.g, item.x(0), item.dx(0)
    xs = c.shape(x)
    keep = list(xs[:2]) + [1] * (len(xs) - 2)
    c.line(f"mt_grad_expand_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {len(xs)}, {c.arr(xs)}, "
           f"{c.arr(broadcast_strides(keep, xs))}, {c.literal(1.0 / max(prod(xs[2:]), 1), g.dtype)});")


def _check_gather_elements(item):
    if item.x(1).dtype != np.dtype(np.int64):
        return f"indices are {item.x(1).dtype} (the C backward takes int64)"
    return _only_first(item)


@grad_kernel("GatherElements", check=_check_gather_elements)
def gather_elements_grad(item, c):
    g, idx, dx = item.g, item.x(1), item.dx(0)
    xs = c.shape(item.x(0))
    axis = int(item.kwargs.get("axis") or 0) % max(len(xs), 1)
    c.checked(f"mt_grad_gather_elements_{c.sfx(g)}({c.buf(g)}, (const int64_t *){c.buf(idx)}, {c.buf(dx)}, "
              f"{len(xs)}, {c.arr(c.shape(idx))}, {c.arr(xs)}, {axis})", "an index is out of range")


# Convolution and pools: the forward rule's window geometry (ops/nn.py).


def _conv_parts(item):
    from .ops.nn import conv_kind, window_geometry

    x = item.x(0).static_shape
    kind, win = conv_kind(item.node)
    return kind, win, window_geometry(x[2:], win.out, win.kernel, win.strides, win.begin, win.dilations)


def _check_conv(item):
    from .ops.nn import check_conv as forward_check

    why = forward_check(item.node)
    return why or _floats_only(item)


_CONV_CHUNK = 1 << 24  # elements of one chunk's side-by-side columns (64 MiB in float32)


def _conv_chunk(item) -> tuple[int, int, int, int]:
    """(images per chunk, R, Mg, P) of a Conv's backward (mt_grad_conv)."""
    kind, win, _ = _conv_parts(item)
    x, w = item.x(0).static_shape, item.x(1).static_shape
    group = int(item.kwargs.get("group") or 1)
    R, P = prod(w[1:]), prod(win.out)
    return max(1, min(x[0], _CONV_CHUNK // max(R * P, 1))), R, w[0] // group, P


def _conv_scratch(item) -> int:
    nb, R, Mg, P = _conv_chunk(item)
    return (R * nb * P + Mg * nb * P + R * P + Mg * R) * item.g.dtype.itemsize


@grad_kernel("Conv", check=_check_conv, scratch=_conv_scratch)
def conv_grad(item, c):
    g, x, w = item.g, item.x(0), item.x(1)
    N, C = c.shape(x)[:2]
    M = c.shape(w)[0]
    kind, win, geo = _conv_parts(item)
    nb = _conv_chunk(item)[0]
    bufs = [c.buf(d) if d is not None else "0" for d in (item.dx(0), item.dx(1), item.dx(2))]
    c.line(f"mt_grad_conv_{c.sfx(g)}({c.buf(x)}, {c.buf(w)}, {c.buf(g)}, {bufs[0]}, {bufs[1]}, {bufs[2]}, "
           f"({c.ctype(g)} *){c.scratch}, {int(kind == 'pointwise')}, {nb}, {N}, {C}, {M}, "
           f"{int(item.kwargs.get('group') or 1)}, {c.arr(geo)});")


def _check_pool(item):
    from .ops.nn import check_pool as forward_check

    if len(item.node.outputs) > 1:
        return "MaxPool with its Indices output"
    if item.node.op_type == "AveragePool" and item.x(0).dtype not in FLOATS:
        return f"dtype {item.x(0).dtype}"
    return forward_check(item.node) or _only_first(item)


@grad_kernel("MaxPool", "AveragePool", check=_check_pool)
def pool_grad(item, c):
    from .ops.nn import window_geometry, node_window

    g, x, dx = item.g, item.x(0), item.dx(0)
    shape = c.shape(x)
    win = node_window(item.node, ints(item.kwargs["kernel_shape"]))
    geo = c.arr(window_geometry(shape[2:], win.out, win.kernel, win.strides, win.begin, win.dilations, win.end))
    if item.node.op_type == "MaxPool":
        c.line(f"mt_grad_maxpool_{c.sfx(g)}({c.buf(x)}, {c.buf(g)}, {c.buf(dx)}, {shape[0] * shape[1]}, {geo});")
    else:
        mode = int(bool(item.kwargs.get("count_include_pad")))
        c.line(f"mt_grad_avgpool_{c.sfx(g)}({c.buf(g)}, {c.buf(dx)}, {shape[0] * shape[1]}, {geo}, {mode});")


def _bn_training(item) -> bool:
    pn = item.node
    return bool(item.kwargs.get("training_mode")) if pn.opset >= 14 else len(pn.outputs) > 1


def _check_batchnorm(item):
    pn, k = item.node, item.kwargs
    if _bn_training(item) and len(pn.outputs) > 1 and any(o.dtype != item.g.dtype for o in pn.outputs[1:3]):
        return "statistics outputs of another dtype"
    if item.dx(3) is not None or item.dx(4) is not None:
        return "gradients of the running statistics wanted"
    if not k.get("spatial", 1):
        return "spatial=0"
    s = item.x(0).static_shape
    C = s[1] if len(s) > 1 else 1
    if any(prod(v.static_shape) != C for v in pn.inputs[1:5]):
        return "parameters are not one value per channel"
    return _floats_only(item)


@grad_kernel("BatchNormalization", check=_check_batchnorm)
def batchnorm_grad(item, c):
    g, x, scale, mean, var = item.g, item.x(0), item.x(1), item.x(3), item.x(4)
    s = c.shape(x)
    bufs = [c.buf(d) if d is not None else "0" for d in (item.dx(0), item.dx(1), item.dx(2))]
    c.line(f"mt_grad_batchnorm_{c.sfx(g)}({c.buf(x)}, {c.buf(g)}, {c.buf(scale)}, {c.buf(mean)}, {c.buf(var)}, "
           f"{bufs[0]}, {bufs[1]}, {bufs[2]}, {s[0]}, {s[1] if len(s) > 1 else 1}, {prod(s[2:])}, "
           f"{c.literal(item.kwargs.get('epsilon', 1e-5), g.dtype)}, {int(_bn_training(item))});")
