"""C rules for MatMul/Gemm, convolution, pooling, normalization and Softmax
(kernels: ``lib/mt_nn*.h``)."""

from __future__ import annotations

from math import prod

from . import FLOATS, same_types, broadcast_strides, c_kernel, ints, text


def _check_matmul(pn):
    a, b = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(a) < 2 or len(b) < 2:
        return "1-D MatMul operand"
    if len(b) > 2 and a[:-2] != b[:-2]:
        return "broadcast batch dims"
    if pn.op_type == "MatMulAdd" and prod(pn.inputs[2].static_shape) != b[-1]:
        return "bias is not one row"
    return same_types(pn)


@c_kernel("MatMul", dtypes=FLOATS, check=_check_matmul)
@c_kernel("MatMulAdd", domain="ai.mithril", dtypes=FLOATS, check=_check_matmul)
def matmul(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    sa, sb = c.shape(a), c.shape(b)
    M, K, N = sa[-2], sa[-1], sb[-1]
    bias = c.buf(pn.inputs[2]) if pn.op_type == "MatMulAdd" else "0"
    one = c.literal(1, y.dtype)
    if len(sb) == 2:
        c.line(f"mt_gemm_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {bias}, {c.buf(y)}, {prod(sa[:-1])}, {N}, {K}, {K}, 1, "
               f"{N}, 1, 0, 1, {one}, {one});")
    else:
        c.line(f"for (mt_i q = 0; q < {prod(sa[:-2])}; q++) mt_gemm_{c.sfx(y)}({c.buf(a)} + q * {M * K}, "
               f"{c.buf(b)} + q * {K * N}, {bias}, {c.buf(y)} + q * {M * N}, {M}, {N}, {K}, {K}, 1, {N}, 1, 0, 1, "
               f"{one}, {one});")


def _check_gemm(pn):
    if len(pn.inputs) > 2 and pn.inputs[2] is not None and len(pn.inputs[2].static_shape) > 2:
        return "bias of rank > 2"
    return same_types(pn)


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
    if len(pn.inputs) > 2 and pn.inputs[2] is not None:
        bias = c.buf(pn.inputs[2])
        cr, cc = broadcast_strides(c.shape(pn.inputs[2]), (M, N))
    c.line(f"mt_gemm_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {bias}, {c.buf(y)}, {M}, {N}, {K}, {ar}, {ac}, {br}, {bc}, "
           f"{cr}, {cc}, {c.literal(k.get('alpha', 1.0), y.dtype)}, {c.literal(k.get('beta', 1.0), y.dtype)});")


def _no_auto_pad(pn) -> bool:
    return text(pn.kwargs.get("auto_pad", "NOTSET")) in ("NOTSET", None, "")


def _check_window(pn):
    x = pn.inputs[0].static_shape
    k = pn.kwargs
    if len(x) != 4:
        return f"{len(x) - 2}-D window (C has 2-D)"
    if not _no_auto_pad(pn):
        return "auto_pad"
    if pn.op_type == "Conv" and pn.inputs[1].static_shape[1] * k.get("group", 1) != x[1]:
        return "group does not divide channels"
    if pn.op_type == "MaxPool" and (len(pn.outputs) > 1 or k.get("num_outputs", 1) > 1):
        return "Indices output"
    if pn.op_type == "AveragePool" and any(d != 1 for d in (k.get("dilations") or [])):
        return "dilated AveragePool"
    return same_types(pn)


def _conv_scratch(pn) -> int:
    w, y = pn.inputs[1].static_shape, pn.outputs[0].static_shape
    return w[1] * w[2] * w[3] * y[2] * y[3] * pn.outputs[0].dtype.itemsize


@c_kernel("Conv", dtypes=FLOATS, check=_check_window, scratch=_conv_scratch)
def conv(pn, c):
    x, w, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    N, C, H, W = c.shape(x)
    M, _, KH, KW = c.shape(w)
    OH, OW = c.shape(y)[2:]
    k = pn.kwargs
    pads = ints(k.get("pads")) or [0, 0, 0, 0]
    st = ints(k.get("strides")) or [1, 1]
    dl = ints(k.get("dilations")) or [1, 1]
    bias = c.buf(pn.inputs[2]) if len(pn.inputs) > 2 and pn.inputs[2] is not None else "0"
    c.line(f"mt_conv2d_{c.sfx(y)}({c.buf(x)}, {c.buf(w)}, {bias}, {c.buf(y)}, ({c.ctype(y)} *){c.scratch}, "
           f"{N}, {C}, {H}, {W}, {M}, {KH}, {KW}, {OH}, {OW}, {k.get('group', 1)}, {st[0]}, {st[1]}, "
           f"{pads[0]}, {pads[1]}, {dl[0]}, {dl[1]});")


@c_kernel("MaxPool", "AveragePool", dtypes=FLOATS, check=_check_window)
def pool(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    N, C, H, W = c.shape(x)
    OH, OW = c.shape(y)[2:]
    k = pn.kwargs
    KH, KW = ints(k["kernel_shape"])
    pads = ints(k.get("pads")) or [0, 0, 0, 0]
    st = ints(k.get("strides")) or [1, 1]
    if pn.op_type == "MaxPool":
        dl = ints(k.get("dilations")) or [1, 1]
        c.line(f"mt_maxpool2d_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {N * C}, {H}, {W}, {OH}, {OW}, {KH}, {KW}, "
               f"{st[0]}, {st[1]}, {pads[0]}, {pads[1]}, {dl[0]}, {dl[1]});")
    else:
        c.line(f"mt_avgpool2d_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {N * C}, {H}, {W}, {OH}, {OW}, {KH}, {KW}, "
               f"{st[0]}, {st[1]}, {pads[0]}, {pads[1]}, {pads[2]}, {pads[3]}, "
               f"{int(bool(k.get('count_include_pad', 0)))});")


@c_kernel("GlobalAveragePool", dtypes=FLOATS, check=same_types)
def global_avgpool(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    s = c.shape(x)
    c.line(f"mt_global_avgpool_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {s[0] * s[1]}, {prod(s[2:])});")


def _check_batchnorm(pn):
    k = pn.kwargs
    if len(pn.outputs) > 1 or k.get("training_mode") or (k.get("is_test") == 0 and "is_test" in pn.attributes):
        return "training mode"
    return same_types(pn)


@c_kernel("BatchNormalization", dtypes=FLOATS, check=_check_batchnorm)
def batchnorm(pn, c):
    x, scale, bias, mean, var = pn.inputs[:5]
    y, s = pn.outputs[0], c.shape(pn.inputs[0])
    c.line(f"mt_batchnorm_{c.sfx(y)}({c.buf(x)}, {c.buf(scale)}, {c.buf(bias)}, {c.buf(mean)}, {c.buf(var)}, "
           f"{c.buf(y)}, {s[0]}, {s[1] if len(s) > 1 else 1}, {prod(s[2:])}, "
           f"{c.literal(pn.kwargs.get('epsilon', 1e-5), y.dtype)});")


@c_kernel("Softmax", "LogSoftmax", dtypes=FLOATS, check=same_types)
def softmax(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    s = c.shape(x)
    axis = pn.kwargs.get("axis", -1 if pn.opset >= 13 else 1) % max(len(s), 1)
    if pn.opset >= 13:
        outer, mid, inner = prod(s[:axis]), s[axis] if s else 1, prod(s[axis + 1:])
    else:
        outer, mid, inner = prod(s[:axis]), prod(s[axis:]), 1
    c.line(f"mt_softmax_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {outer}, {mid}, {inner}, "
           f"{int(pn.op_type == 'LogSoftmax')});")
