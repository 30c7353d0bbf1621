"""C rules for the quantization ops (kernels: ``lib/mt_quantize.h``): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv.

They compute what :mod:`mithril.backends.kernels.quantize` does, bit for bit (round half to even,
saturation to the output's range). Scales and zero points are read at run time; their layout
(per tensor, per axis, blocked) is fixed at render time from the static shapes.

(De)QuantizeLinear also take the storage-only types (:data:`~.STORAGE`): int4/uint4/int2/uint2 and
float8/float4 quantized values, float16/bfloat16/float8e8m0 scales, float16/bfloat16 x and outputs.
Those run through one kernel over ``lib/mt_convert.h``'s type codes, element by element; the
8- and 16-bit integers with float32/float64 scales keep their typed, vectorized kernels.
"""

from __future__ import annotations

from math import prod

import ml_dtypes
import numpy as np

from ....dtypes import np_dtype_of_onnx
from . import FLOATS, TYPE_CODE, c_kernel
from .nn import MAX_SPATIAL, batch_index, node_window, window_geometry

I8 = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})
INT32 = np.dtype(np.int32)
F64 = np.dtype(np.float64)
HALVES = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
# The quantized types C only stores: through the kernels over type codes (mt_quantize_linear_any_*).
NARROW = frozenset(np.dtype(t) for t in (
    ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2, ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float4_e2m1fn))
TYPED = I8 | {np.dtype(np.int16), np.dtype(np.uint16)}  # the quantized types of the typed kernels
QUANTIZE_IN = FLOATS | HALVES | {INT32}  # x of QuantizeLinear
SCALES = FLOATS | HALVES | {np.dtype(ml_dtypes.float8_e8m0fnu)}
QUANTIZED = TYPED | NARROW  # QuantizeLinear's outputs
DEQUANTIZE_IN = QUANTIZED | {INT32}
DEQUANTIZED = FLOATS | HALVES  # DequantizeLinear's outputs


def _input(pn, i: int):
    return pn.inputs[i] if len(pn.inputs) > i and pn.inputs[i] is not None else None


def _names(dtypes) -> str:
    return ", ".join(sorted(map(str, dtypes)))


def _is_one(v) -> bool:
    return prod(v.static_shape) == 1


# ---------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear


def _walk(x_shape, param, axis: int, block: int) -> list[int] | str:
    """How ``param`` (a scale or zero point) lies over x: ``{outer, n, inner, bs, so, sa, si}``
    (``lib/mt_quantize.h``), with the NumPy kernel's reading of its shape; or why C cannot."""
    numel, ps = prod(x_shape), tuple(param.static_shape)
    if not ps or (prod(ps) == 1 and block <= 0):  # per tensor
        return [1, 1, numel, 1, 0, 0, 0]
    rank = len(x_shape)
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for {tuple(x_shape)}"
    axis %= rank
    outer, n, inner = prod(x_shape[:axis]), x_shape[axis], prod(x_shape[axis + 1:])
    if block > 0:
        nb = -(-n // block)
        want = tuple(x_shape[:axis]) + (nb,) + tuple(x_shape[axis + 1:])
        if ps != want:
            return f"{param.name!r} is {ps}, blocks of {block} along axis {axis} of {tuple(x_shape)} need {want}"
        if inner == 1 and n % block == 0:  # runs of one whole block each
            return [outer, nb, block, 1, nb, 1, 0]
        return [outer, n, inner, block, nb * inner, inner, 1]
    if ps != (n,):
        return f"{param.name!r} is {ps}, per axis {axis} of {tuple(x_shape)} needs ({n},)"
    if inner == 1:  # the last axis: one run per row, reading consecutive parameters
        return [outer, 1, n, 1, 0, 0, 1]
    return [outer, n, inner, 1, 0, 1, 0]


def _param_walk(pn, x, scale, zero_point) -> list[int] | str:
    axis, block = pn.kwargs.get("axis"), int(pn.kwargs.get("block_size") or 0)
    axis = 1 if axis is None else int(axis)  # opset 10 has no axis (its scale is one value)
    walk = _walk(x.static_shape, scale, axis, block)
    if zero_point is not None and not isinstance(walk, str):
        zp_walk = _walk(x.static_shape, zero_point, axis, block)
        if zp_walk != walk:
            return zp_walk if isinstance(zp_walk, str) else \
                f"zero point {zero_point.static_shape} and scale {scale.static_shape} are laid out differently"
    return walk


def _division_type(pn, scale) -> np.dtype:
    """The type x / scale is computed in, as the NumPy kernel's: the precision attribute, else
    float64 for a float64 scale and float32 for the others."""
    precision = int(pn.kwargs.get("precision") or 0)
    return np_dtype_of_onnx(precision) if precision else F64 if scale.dtype == F64 else np.dtype(np.float32)


def _check_quantize(pn):
    x, scale, zp, y = pn.inputs[0], pn.inputs[1], _input(pn, 2), pn.outputs[0]
    if x.dtype not in QUANTIZE_IN:
        return f"x of dtype {x.dtype} (the C kernel quantizes {_names(QUANTIZE_IN)})"
    if scale.dtype not in SCALES:
        return f"scale of dtype {scale.dtype} (the C kernel divides by {_names(SCALES)})"
    if y.dtype not in QUANTIZED:
        return f"output of dtype {y.dtype} (the C kernel writes {_names(QUANTIZED)})"
    if zp is not None and zp.dtype != y.dtype:
        return f"zero point of dtype {zp.dtype}, the output {y.dtype}"
    if _division_type(pn, scale) not in FLOATS:
        return f"precision {_division_type(pn, scale)} (the C kernel divides in {_names(FLOATS)})"
    if tuple(y.static_shape) != tuple(x.static_shape):
        return f"output is typed {y.static_shape}, the kernel writes {x.static_shape}"
    walk = _param_walk(pn, x, scale, zp)
    return walk if isinstance(walk, str) else None


@c_kernel("QuantizeLinear", since=10, check=_check_quantize, storage=True)
def quantize_linear(pn, c):
    x, scale, zp, y = pn.inputs[0], pn.inputs[1], _input(pn, 2), pn.outputs[0]
    walk = c.arr(_param_walk(pn, x, scale, zp))
    work = _division_type(pn, scale)
    zpb = c.buf(zp) if zp is not None else "0"
    if x.dtype in FLOATS | {INT32} and scale.dtype == work and y.dtype in TYPED:
        c.line(f"mt_quantize_linear_{c.sfx(x)}_{c.sfx(scale)}_{c.sfx(y)}({c.buf(x)}, {c.buf(scale)}, {zpb}, "
               f"{c.buf(y)}, {walk});")
        return
    c.line(f"mt_quantize_linear_any_{c.sfx(work)}({c.buf(x)}, {TYPE_CODE[x.dtype]}, {c.buf(scale)}, "
           f"{TYPE_CODE[scale.dtype]}, {zpb}, {c.buf(y)}, {TYPE_CODE[y.dtype]}, {walk}, "
           f"{int(pn.kwargs.get('saturate', 1))});")


def _check_dequantize(pn):
    x, scale, zp, y = pn.inputs[0], pn.inputs[1], _input(pn, 2), pn.outputs[0]
    if x.dtype not in DEQUANTIZE_IN:
        return f"x of dtype {x.dtype} (the C kernel dequantizes {_names(DEQUANTIZE_IN)})"
    if zp is not None and zp.dtype != x.dtype:
        return f"zero point of dtype {zp.dtype}, x {x.dtype}"
    if scale.dtype not in SCALES:
        return f"scale of dtype {scale.dtype} (the C kernel multiplies by {_names(SCALES)})"
    if y.dtype not in DEQUANTIZED:
        return f"output of dtype {y.dtype} (the C kernel writes {_names(DEQUANTIZED)})"
    if tuple(y.static_shape) != tuple(x.static_shape):
        return f"output is typed {y.static_shape}, the kernel writes {x.static_shape}"
    walk = _param_walk(pn, x, scale, zp)
    return walk if isinstance(walk, str) else None


@c_kernel("DequantizeLinear", since=10, check=_check_dequantize, storage=True)
def dequantize_linear(pn, c):
    x, scale, zp, y = pn.inputs[0], pn.inputs[1], _input(pn, 2), pn.outputs[0]
    walk = c.arr(_param_walk(pn, x, scale, zp))
    zpb = c.buf(zp) if zp is not None else "0"
    if x.dtype in TYPED | {INT32} and scale.dtype in FLOATS and y.dtype in FLOATS:
        c.line(f"mt_dequantize_linear_{c.sfx(x)}_{c.sfx(scale)}_{c.sfx(y)}({c.buf(x)}, {c.buf(scale)}, {zpb}, "
               f"{c.buf(y)}, {walk});")
        return
    c.line(f"mt_dequantize_linear_any({c.buf(x)}, {TYPE_CODE[x.dtype]}, {c.buf(scale)}, {TYPE_CODE[scale.dtype]}, "
           f"{zpb}, {c.buf(y)}, {TYPE_CODE[y.dtype]}, {walk});")


def _check_dynamic(pn):
    x, outs = pn.inputs[0], pn.outputs
    want = [(np.dtype(np.uint8), tuple(x.static_shape)), (np.dtype(np.float32), ()), (np.dtype(np.uint8), ())]
    if x.dtype != np.dtype(np.float32):
        return f"x of dtype {x.dtype} (the C kernel quantizes float32)"
    for o, (dt, shape) in zip(outs, want):
        if o.name and (o.dtype != dt or prod(o.static_shape) != prod(shape)):
            return f"output {o.name!r} is {o.dtype} {o.static_shape}, the kernel writes {dt} {shape}"
    return None


@c_kernel("DynamicQuantizeLinear", since=11, check=_check_dynamic)
def dynamic_quantize_linear(pn, c):
    x = pn.inputs[0]
    y, scale, zp = (c.buf(o) if o is not None and o.name else "0" for o in (*pn.outputs, None, None)[:3])
    c.line(f"mt_dynamic_quantize_linear_f32({c.buf(x)}, {y}, {scale}, {zp}, {c.numel(x)});")


# ---------------------------------------------------------------------------------------------
# MatMulInteger / QLinearMatMul


def _matmul_dims(pn, ai: int, bi: int):
    """(A as [..., M, K], B as [..., K, N], batch shape) with 1-D operands promoted; or why not."""
    sa, sb = pn.inputs[ai].static_shape, pn.inputs[bi].static_shape
    if not sa or not sb:
        return "0-d operand"
    a = (1, sa[0]) if len(sa) == 1 else tuple(sa)
    b = (sb[0], 1) if len(sb) == 1 else tuple(sb)
    try:
        batch = tuple(np.broadcast_shapes(a[:-2], b[:-2]))
    except ValueError:
        return f"batch dims of {sa} and {sb} do not broadcast"
    if a[-1] != b[-2]:
        return f"inner dims of {sa} and {sb} differ"
    out = batch + ((a[-2],) if len(sa) > 1 else ()) + ((b[-1],) if len(sb) > 1 else ())
    if tuple(pn.outputs[0].static_shape) != out:
        return f"output is typed {pn.outputs[0].static_shape}, the kernel writes {out}"
    return a, b, batch


def _stride(v, length: int, along: str) -> int | str:
    """How a scale or zero point steps along A's rows or the columns: 0 (one value), 1 (one each)."""
    if v is None or _is_one(v):
        return 0
    if tuple(v.static_shape) == (length,):
        return 1
    return f"{v.name!r} is {v.static_shape}: one value or one per {along} ({length},)"


def _matmul_params(pn, a_params, b_params) -> dict[int, int] | str:
    """Each present scale or zero point's stride: A's per row, B's (and y's) per column."""
    dims = _matmul_dims(pn, 0, 3 if pn.op_type == "QLinearMatMul" else 1)
    if isinstance(dims, str):
        return dims
    (M, _), N = dims[0][-2:], dims[1][-1]
    out = {}
    for positions, length, along in ((a_params, M, "row of A"), (b_params, N, "column")):
        for i in positions:
            step = _stride(_input(pn, i), length, along)
            if isinstance(step, str):
                return step
            out[i] = step
    return out


def _calls(c, dims, rows_shared: bool):
    """The loop over the batch (C text, empty for one product), each product's A, B and Y element
    offsets, and its rows M."""
    sa, sb, batch = dims
    M, K, N = sa[-2], sa[-1], sb[-1]
    Q = prod(batch)
    if prod(sb[:-2]) == 1 and rows_shared:  # B is one matrix: every row of A in one product
        return "", "0", "0", "0", prod(sa[:-1])
    if Q == 1:
        return "", "0", "0", "0", M
    if tuple(sa[:-2]) == batch and tuple(sb[:-2]) == batch:
        qa, qb = "q", "q"
    else:  # broadcast batch dims: each product's matrix in A and in B
        qa, qb = (f"{c.arr(batch_index(s[:-2], batch))}[q]" for s in (sa, sb))
    return f"for (mt_i q = 0; q < {Q}; q++) ", f"{qa} * {M * K}", f"{qb} * {K * N}", f"q * {M * N}", M


def _check_matmul_integer(pn):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if a.dtype not in I8 or b.dtype not in I8:
        return f"A {a.dtype} and B {b.dtype} (the C kernel multiplies {_names(I8)})"
    for i, like in ((2, a), (3, b)):
        zp = _input(pn, i)
        if zp is not None and zp.dtype != like.dtype:
            return f"zero point {zp.name!r} of dtype {zp.dtype}, its operand {like.dtype}"
    if y.dtype != INT32:
        return f"output of dtype {y.dtype} (the C kernel writes int32)"
    steps = _matmul_params(pn, (2,), (3,))
    return steps if isinstance(steps, str) else None


@c_kernel("MatMulInteger", since=10, check=_check_matmul_integer)
def matmul_integer(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    azp, bzp = _input(pn, 2), _input(pn, 3)
    steps, dims = _matmul_params(pn, (2,), (3,)), _matmul_dims(pn, 0, 1)
    loop, qa, qb, qy, M = _calls(c, dims, rows_shared=steps[2] == 0)
    K, N = dims[0][-1], dims[1][-1]
    c.line(f"{loop}mt_matmul_integer_{c.sfx(a)}_{c.sfx(b)}({c.buf(a)} + {qa}, {c.buf(b)} + {qb}, "
           f"{c.buf(azp) if azp is not None else '0'}, {steps[2]}, {c.buf(bzp) if bzp is not None else '0'}, "
           f"{steps[3]}, {c.buf(y)} + {qy}, {M}, {N}, {K});")


def _check_qlinear_matmul(pn):
    a, b, y = pn.inputs[0], pn.inputs[3], pn.outputs[0]
    if any(_input(pn, i) is None for i in range(8)):
        return "a missing input (QLinearMatMul takes eight)"
    for v in (a, b, y):
        if v.dtype not in I8:
            return f"{v.name!r} of dtype {v.dtype} (the C kernel has {_names(I8)})"
    for zp, like in ((2, a), (5, b), (7, y)):
        if pn.inputs[zp].dtype != like.dtype:
            return f"zero point {pn.inputs[zp].name!r} of dtype {pn.inputs[zp].dtype}, its operand {like.dtype}"
    for i in (1, 4, 6):
        if pn.inputs[i].dtype != np.dtype(np.float32):
            return f"scale {pn.inputs[i].name!r} of dtype {pn.inputs[i].dtype} (the C kernel has float32)"
    steps = _matmul_params(pn, (1, 2), (4, 5, 6, 7))
    return steps if isinstance(steps, str) else None


@c_kernel("QLinearMatMul", since=10, check=_check_qlinear_matmul)
def qlinear_matmul(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[3], pn.outputs[0]
    steps, dims = _matmul_params(pn, (1, 2), (4, 5, 6, 7)), _matmul_dims(pn, 0, 3)
    loop, qa, qb, qy, M = _calls(c, dims, rows_shared=steps[1] == steps[2] == 0)
    K, N = dims[0][-1], dims[1][-1]
    p = {i: f"{c.buf(pn.inputs[i])}, {steps[i]}" for i in (1, 2, 4, 5, 6, 7)}
    c.line(f"{loop}mt_qlinear_matmul_{c.sfx(a)}_{c.sfx(b)}_{c.sfx(y)}({c.buf(a)} + {qa}, {p[1]}, {p[2]}, "
           f"{c.buf(b)} + {qb}, {p[4]}, {p[5]}, {p[6]}, {p[7]}, {c.buf(y)} + {qy}, {M}, {N}, {K});")


# ---------------------------------------------------------------------------------------------
# ConvInteger / QLinearConv


def _conv_window(pn, wi: int):
    return node_window(pn, pn.inputs[wi].static_shape[2:])


def _check_conv(pn, xi: int, wi: int, x_params, w_params, out_dtypes) -> str | None:
    x, w, y = pn.inputs[xi], pn.inputs[wi], pn.outputs[0]
    xs, ws = x.static_shape, w.static_shape
    if not 1 <= len(xs) - 2 <= MAX_SPATIAL:
        return f"{len(xs) - 2}-D window (C has 1-D to {MAX_SPATIAL}-D)"
    if x.dtype not in I8 or w.dtype not in I8:
        return f"x {x.dtype} and w {w.dtype} (the C kernel convolves {_names(I8)})"
    if y.dtype not in out_dtypes:
        return f"output of dtype {y.dtype} (the C kernel writes {_names(out_dtypes)})"
    group = int(pn.kwargs.get("group") or 1)
    if len(ws) != len(xs) or ws[1] * group != xs[1] or ws[0] % group:
        return f"W {ws} does not fit X {xs} with group={group}"
    kernel = pn.kwargs.get("kernel_shape")
    if kernel and tuple(int(k) for k in kernel) != tuple(ws[2:]):
        return f"kernel_shape {tuple(kernel)} differs from W's {tuple(ws[2:])}"
    for positions, length in ((x_params, 1), (w_params, ws[0])):
        for i in positions:
            v = _input(pn, i)
            if v is not None and not _is_one(v) and tuple(v.static_shape) != (length,):
                return f"{v.name!r} is {v.static_shape}: one value{' or one per output channel' * (length > 1)}"
    want = (xs[0], ws[0]) + tuple(_conv_window(pn, wi).out)
    if tuple(y.static_shape) != want:
        return f"output is typed {y.static_shape}, the kernel writes {want}"
    return None


def _col_bytes(pn, xi: int, wi: int) -> int:
    """The im2col scratch of an integer convolution (0 for a 1x1 window read in place)."""
    w, win = pn.inputs[wi].static_shape, _conv_window(pn, wi)
    in_place = all(v == 1 for v in (*win.kernel, *win.strides)) and not any(win.begin) and not any(win.end)
    return 0 if in_place else prod(w[1:]) * prod(win.out) * pn.inputs[xi].dtype.itemsize


def _conv_call(pn, c, xi: int, wi: int, xzp, wzp, y: str, col: str) -> str:
    """The mt_conv_integer call writing int32 results to ``y`` (im2col into ``col``)."""
    x, w = pn.inputs[xi], pn.inputs[wi]
    N, C = c.shape(x)[:2]
    M = c.shape(w)[0]
    win = _conv_window(pn, wi)
    g = c.arr(window_geometry(c.shape(x)[2:], win.out, win.kernel, win.strides, win.begin, win.dilations))
    wzs = 0 if wzp is None or _is_one(wzp) else 1
    return (f"mt_conv_integer_{c.sfx(x)}_{c.sfx(w)}({c.buf(x)}, {c.buf(w)}, {c.buf(xzp) if xzp is not None else '0'}, "
            f"{c.buf(wzp) if wzp is not None else '0'}, {wzs}, {y}, {col}, {N}, {C}, {M}, "
            f"{int(pn.kwargs.get('group') or 1)}, {g});")


def _check_conv_integer(pn):
    for i, like in ((2, 0), (3, 1)):
        zp = _input(pn, i)
        if zp is not None and zp.dtype != pn.inputs[like].dtype:
            return f"zero point {zp.name!r} of dtype {zp.dtype}, its operand {pn.inputs[like].dtype}"
    return _check_conv(pn, 0, 1, (2,), (3,), {INT32})


@c_kernel("ConvInteger", since=10, check=_check_conv_integer, scratch=lambda pn: _col_bytes(pn, 0, 1))
def conv_integer(pn, c):
    x = pn.inputs[0]
    col = f"({c.ctype(x)} *){c.scratch}" if _col_bytes(pn, 0, 1) else "0"
    c.line(_conv_call(pn, c, 0, 1, _input(pn, 2), _input(pn, 3), c.buf(pn.outputs[0]), col))


def _check_qlinear_conv(pn):
    if any(_input(pn, i) is None for i in range(8)):
        return "a missing input (QLinearConv takes eight, and a bias)"
    for zp, like in ((2, 0), (5, 3), (7, 0)):
        want = pn.outputs[0].dtype if zp == 7 else pn.inputs[like].dtype
        if pn.inputs[zp].dtype != want:
            return f"zero point {pn.inputs[zp].name!r} of dtype {pn.inputs[zp].dtype}, its operand {want}"
    for i in (1, 4, 6):
        if pn.inputs[i].dtype != np.dtype(np.float32):
            return f"scale {pn.inputs[i].name!r} of dtype {pn.inputs[i].dtype} (the C kernel has float32)"
    why = _check_conv(pn, 0, 3, (1, 2, 6, 7), (4, 5), I8)
    bias = _input(pn, 8)
    if not why and bias is not None and (bias.dtype != INT32 or bias.static_shape != pn.inputs[3].static_shape[:1]):
        return f"bias {bias.dtype} {bias.static_shape}: one int32 per output channel"
    return why


def _qlinear_conv_scratch(pn) -> int:
    return prod(pn.outputs[0].static_shape) * INT32.itemsize + _col_bytes(pn, 0, 3)  # int32 results, then col


@c_kernel("QLinearConv", since=10, check=_check_qlinear_conv, scratch=_qlinear_conv_scratch)
def qlinear_conv(pn, c):
    y, bias = pn.outputs[0], _input(pn, 8)
    acc = f"(int32_t *){c.scratch}"
    col = f"({c.ctype(pn.inputs[0])} *)({c.scratch} + {prod(y.static_shape) * INT32.itemsize})" \
        if _col_bytes(pn, 0, 3) else "0"
    c.line(_conv_call(pn, c, 0, 3, pn.inputs[2], pn.inputs[5], acc, col))
    N, M = c.shape(y)[:2]
    wss = 0 if _is_one(pn.inputs[4]) else 1
    b = c.buf
    c.line(f"mt_qlinear_conv_requantize_{c.sfx(y)}({acc}, {b(bias) if bias is not None else '0'}, {b(pn.inputs[1])}, "
           f"{b(pn.inputs[4])}, {wss}, {b(pn.inputs[6])}, {b(pn.inputs[7])}, {b(y)}, {N}, {M}, "
           f"{prod(c.shape(y)[2:])});")
