"""C rules for elementwise ops, casts and reductions (kernels: ``lib/mt_elementwise*.h``).

Broadcasting ops collapse the output's dims first (size-1 dims dropped, neighbours merged where
every input walks them contiguously), so ``x + bias`` is one flat loop per row. Integer Div and
Mod are checked kernels: a zero divisor (or INT_MIN / -1) raises a NodeError instead of crashing.
Float -> integer Cast saturates (NaN -> 0, out of range -> the type's lowest or highest value).
Reduce* axes, CumSum's axis and Clip's bounds may be constants or come at run time (read in C,
and checked against the shapes the model was compiled for).
"""

from __future__ import annotations

from math import prod

import numpy as np

from . import ALL, FLOATS, INTS, NUMBERS, SIGNED, STORAGE, TYPE_CODE, broadcast_strides, c_kernel, ints, strides, text

BOOL = frozenset({np.dtype(np.bool_)})
INT64 = np.dtype(np.int64)


def _types(pn, inputs=None):
    return [v.dtype for i, v in enumerate(pn.inputs) if v is not None and (inputs is None or i in inputs)]


def _all_same(pn, allowed, inputs=None, out=None) -> str | None:
    """Every (listed) input of one dtype among ``allowed``; the output that dtype (or ``out``)."""
    dts = _types(pn, inputs)
    if not dts:
        return "no inputs"
    if any(d != dts[0] for d in dts):
        return f"inputs of different dtypes ({', '.join(sorted(set(map(str, dts))))})"
    if dts[0] not in allowed:
        return f"dtype {dts[0]} (the C kernel has {', '.join(sorted(map(str, allowed)))})"
    want = dts[0] if out is None else np.dtype(out)
    for o in pn.outputs:
        if o.dtype != want:
            return f"output {o.name!r} is {o.dtype}, expected {want}"
    return None


def collapse(shape, *walks):
    """The output ``shape`` and each input's element strides along it, with size-1 dims dropped
    and neighbouring dims merged where every walk is contiguous across them (rank >= 1)."""
    dims: list[tuple[int, list[int]]] = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        ss = [w[i] for w in walks]
        if dims and all(p == s * d for p, s in zip(dims[-1][1], ss)):
            dims[-1] = (dims[-1][0] * d, ss)
        else:
            dims.append((d, ss))
    if not dims:
        return [1], [[0] for _ in walks]
    return [d for d, _ in dims], [[ss[k] for _, ss in dims] for k in range(len(walks))]


def _legacy_shape(pn, a_shape, b_shape):
    """B's shape as NumPy broadcasting sees it: before opset 7, ``broadcast=1`` with ``axis``
    aligns B's dims with A's from ``axis``."""
    k = pn.kwargs
    if pn.opset < 7 and k.get("broadcast") and k.get("axis") is not None and len(b_shape):
        axis = k["axis"] + len(a_shape) if k["axis"] < 0 else k["axis"]
        return tuple(b_shape) + (1,) * (len(a_shape) - axis - len(b_shape))
    return tuple(b_shape)


def _broadcasts(pn, shapes, out) -> bool:
    try:
        return tuple(np.broadcast_shapes(*shapes)) == tuple(out)
    except ValueError:
        return False


def _walk(c, out, *shapes):
    """Collapsed rank, shape array and one stride array per input, as C names."""
    shape, walks = collapse(out, *[broadcast_strides(s, out) for s in shapes])
    return len(shape), c.arr(shape), [c.arr(w) for w in walks]


def _emit_binary(c, kernel, a, b, y, b_shape=None, checked=None):
    out = c.shape(y)
    if c.numel(y) == 0:
        return
    rank, shape, (sa, sb) = _walk(c, out, c.shape(a), c.shape(b) if b_shape is None else b_shape)
    call = f"{kernel}({c.buf(a)}, {c.buf(b)}, {c.buf(y)}, {rank}, {shape}, {sa}, {sb})"
    if checked:
        c.checked(call, checked)
    else:
        c.line(call + ";")


# ---------------------------------------------------------------- one input

# op -> (kernel, element types, attributes passed as the kernel's a and b)
UNARY = {
    "Relu": ("relu", FLOATS | SIGNED, ()), "Neg": ("neg", FLOATS | SIGNED, ()), "Abs": ("abs", NUMBERS, ()),
    "Sign": ("sign", NUMBERS, ()), "Not": ("not", BOOL, ()), "BitwiseNot": ("bitwise_not", INTS, ()),
    **{op: (op.lower(), FLOATS, ()) for op in (
        "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
        "Asinh", "Acosh", "Atanh", "Ceil", "Floor", "Round", "Reciprocal", "Softplus", "Softsign", "Mish")},
    "HardSwish": ("hard_swish", FLOATS, ()),
    "LeakyRelu": ("leaky_relu", FLOATS, ("alpha",)), "Elu": ("elu", FLOATS, ("alpha",)),
    "Selu": ("selu", FLOATS, ("alpha", "gamma")), "Celu": ("celu", FLOATS, ("alpha",)),
    "HardSigmoid": ("hard_sigmoid", FLOATS, ("alpha", "beta")),
    "ThresholdedRelu": ("thresholded_relu", FLOATS, ("alpha",)), "Swish": ("swish", FLOATS, ("alpha",)),
    "Shrink": ("shrink", FLOATS, ("bias", "lambd")),
    "Gelu": ("gelu", FLOATS, ()),
}


def _check_unary(pn):
    kernel, allowed, _ = UNARY[pn.op_type]
    if pn.op_type == "Gelu" and text(pn.kwargs.get("approximate", "none")) not in ("none", "tanh"):
        return f"approximate={pn.kwargs.get('approximate')!r} (C has 'none', 'tanh')"
    return _all_same(pn, allowed)


@c_kernel(*UNARY, check=_check_unary)
def unary(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    kernel, _, attrs = UNARY[pn.op_type]
    if pn.op_type == "Gelu" and text(pn.kwargs.get("approximate", "none")) == "tanh":
        kernel = "gelu_tanh"
    a, b = (list(attrs) + [None, None])[:2]
    ab = [c.literal(pn.kwargs[n] if n else 0, x.dtype) for n in (a, b)]
    c.line(f"mt_{kernel}_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)}, {ab[0]}, {ab[1]});")


def _check_isx(pn):
    return _all_same(pn, FLOATS, out=np.bool_)


@c_kernel("IsNaN", "IsInf", check=_check_isx)
def is_special(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if pn.op_type == "IsNaN":
        a = b = 0
    else:
        a, b = pn.kwargs.get("detect_positive", 1), pn.kwargs.get("detect_negative", 1)
    c.line(f"mt_{pn.op_type.lower()}_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)}, "
           f"{c.literal(a, x.dtype)}, {c.literal(b, x.dtype)});")


# ---------------------------------------------------------------- Clip


def _check_clip(pn):
    x = pn.inputs[0]
    for v in pn.inputs[1:]:
        if v is not None and (v.dtype != x.dtype or prod(v.static_shape) != 1):
            return f"bound {v.name!r} is {v.dtype} {list(v.static_shape)} (C takes a {x.dtype} scalar)"
    return _all_same(pn, NUMBERS, inputs={0})


def _bound(value, dtype, c) -> str:
    """A Clip bound as a C constant: infinities for floats, the type's <stdint.h> limits for the
    absent bounds of integers (a literal INT64_MIN does not exist in C)."""
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if int(value) <= info.min:
            return "0" if dt.kind == "u" else f"INT{8 * dt.itemsize}_MIN"
        if int(value) >= info.max:
            return f"{'U' if dt.kind == 'u' else ''}INT{8 * dt.itemsize}_MAX"
    return c.literal(value, dt)


@c_kernel("Clip", check=_check_clip)
def clip(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    info = np.iinfo(x.dtype) if x.dtype.kind in "iu" else None
    low, high = (-np.inf, np.inf) if info is None else (info.min, info.max)
    bounds = []
    for i, name, default in ((1, "min", low), (2, "max", high)):
        if pn.opset < 11:
            bounds.append(_bound(pn.kwargs.get(name, default), x.dtype, c))
        elif len(pn.inputs) > i and pn.inputs[i] is not None:
            bounds.append(f"{c.buf(pn.inputs[i])}[0]")
        else:
            bounds.append(_bound(default, x.dtype, c))
    c.line(f"mt_clip_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)}, {bounds[0]}, {bounds[1]});")


# ---------------------------------------------------------------- two inputs, broadcasting

# op -> (kernel, element types, output dtype (None: the inputs'))
BINARY = {
    "Add": ("add", NUMBERS, None), "Sub": ("sub", NUMBERS, None), "Mul": ("mul", NUMBERS, None),
    "Div": ("div", NUMBERS, None),
    "Equal": ("equal", NUMBERS | BOOL, np.bool_), "Less": ("less", NUMBERS, np.bool_),
    "Greater": ("greater", NUMBERS, np.bool_), "LessOrEqual": ("less_equal", NUMBERS, np.bool_),
    "GreaterOrEqual": ("greater_equal", NUMBERS, np.bool_),
    "And": ("and", BOOL, None), "Or": ("or", BOOL, None), "Xor": ("xor", BOOL, None),
    "BitwiseAnd": ("bitwise_and", INTS, None), "BitwiseOr": ("bitwise_or", INTS, None),
    "BitwiseXor": ("bitwise_xor", INTS, None), "Mod": ("mod", NUMBERS, None), "BitShift": ("shift", INTS, None),
    "PRelu": ("prelu", FLOATS | SIGNED, None),
}


def _b_shape(pn):
    a, b = pn.inputs[0], pn.inputs[1]
    if pn.op_type == "PRelu" and pn.opset < 7:
        s = b.static_shape
        if len(s) == 1 and len(a.static_shape) > 2 and s[0] == a.static_shape[1]:
            return tuple(s) + (1,) * (len(a.static_shape) - 2)  # a [C] slope is per channel
    return _legacy_shape(pn, a.static_shape, b.static_shape)


def _check_binary(pn):
    kernel, allowed, out = BINARY[pn.op_type]
    why = _all_same(pn, allowed, out=out)
    if why:
        return why
    if not _broadcasts(pn, [pn.inputs[0].static_shape, _b_shape(pn)], pn.outputs[0].static_shape):
        return f"shapes {list(pn.inputs[0].static_shape)} and {list(pn.inputs[1].static_shape)} do not broadcast " \
               f"to {list(pn.outputs[0].static_shape)}"
    if pn.op_type == "BitShift" and text(pn.kwargs.get("direction")) not in ("LEFT", "RIGHT"):
        return f"direction={pn.kwargs.get('direction')!r}"
    return None


@c_kernel(*BINARY, check=_check_binary)
def binary(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    kernel = BINARY[pn.op_type][0]
    if pn.op_type == "Mod" and pn.kwargs.get("fmod", 0):
        kernel = "fmod"
    if pn.op_type == "BitShift":
        kernel += "_left" if text(pn.kwargs["direction"]) == "LEFT" else "_right"
    checked = None
    if a.dtype.kind in "iu" and pn.op_type in ("Div", "Mod"):
        checked = ("an integer division by zero" + (" (or the lowest value divided by -1)"
                                                    if pn.op_type == "Div" and a.dtype.kind == "i" else ""))
    _emit_binary(c, f"mt_{kernel}_{c.sfx(a)}", a, b, y, _b_shape(pn), checked)


def _check_pow(pn):
    x, e, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    for v in (x, e):
        if v.dtype not in NUMBERS:
            return f"dtype {v.dtype} of {v.name!r} (C has {', '.join(sorted(map(str, NUMBERS)))})"
    if y.dtype != x.dtype:
        return f"output is {y.dtype}, the base {x.dtype}"
    if not _broadcasts(pn, [x.static_shape, _b_shape(pn)], y.static_shape):
        return f"shapes {list(x.static_shape)} and {list(e.static_shape)} do not broadcast"
    return None


@c_kernel("Pow", check=_check_pow)
def power(pn, c):  # mt_pow computes a row whose exponent is 2 or 3 as products (lib/mt_elementwise.h)
    x, e, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    _emit_binary(c, f"mt_pow_{c.sfx(x)}_{c.sfx(e)}", x, e, y, _b_shape(pn))


# ---------------------------------------------------------------- variadic, Where

VARIADIC = {"Sum": ("add", FLOATS), "Mean": ("add", FLOATS), "Max": ("max", NUMBERS), "Min": ("min", NUMBERS)}


def _check_variadic(pn):
    why = _all_same(pn, VARIADIC[pn.op_type][1])
    if why:
        return why
    shapes = [v.static_shape for v in pn.inputs if v is not None]
    if not _broadcasts(pn, shapes, pn.outputs[0].static_shape):
        return f"shapes {', '.join(str(list(s)) for s in shapes)} do not broadcast"
    return None


@c_kernel(*VARIADIC, check=_check_variadic)
def variadic(pn, c):
    xs = [v for v in pn.inputs if v is not None]
    y = pn.outputs[0]
    if c.numel(y) == 0:
        return
    kernel = f"mt_{VARIADIC[pn.op_type][0]}_{c.sfx(y)}"
    if len(xs) == 1:
        c.line(f"mt_copy_bytes({c.buf(xs[0])}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")
    else:
        _emit_binary(c, kernel, xs[0], xs[1], y)
        for x in xs[2:]:
            _emit_binary(c, kernel, y, x, y)  # y is already the output's shape
    if pn.op_type == "Mean" and len(xs) > 1:
        c.line(f"mt_scale_{c.sfx(y)}({c.buf(y)}, {c.buf(y)}, {c.numel(y)}, {c.literal(1 / len(xs), y.dtype)}, 0);")


def _check_where(pn):
    cond, a, b = pn.inputs
    if cond.dtype != np.dtype(np.bool_):
        return f"condition is {cond.dtype}"
    why = _all_same(pn, ALL, inputs={1, 2})
    if why:
        return why
    if not _broadcasts(pn, [v.static_shape for v in pn.inputs], pn.outputs[0].static_shape):
        return "shapes do not broadcast"
    return None


@c_kernel("Where", check=_check_where)
def where(pn, c):
    cond, a, b = pn.inputs
    y = pn.outputs[0]
    if c.numel(y) == 0:
        return
    rank, shape, (sc, sa, sb) = _walk(c, c.shape(y), c.shape(cond), c.shape(a), c.shape(b))
    c.line(f"mt_where_{c.sfx(y)}({c.buf(cond)}, {c.buf(a)}, {c.buf(b)}, {c.buf(y)}, {rank}, {shape}, {sc}, {sa}, "
           f"{sb});")


# ---------------------------------------------------------------- Cast


def _check_cast(pn):
    if pn.op_type == "Cast" and "to" not in pn.kwargs:
        return "no 'to'"
    if pn.kwargs.get("round_mode", "up") not in ROUND_MODES:
        return f"round_mode {pn.kwargs['round_mode']!r}"
    return None


ROUND_MODES = {"up": 0, "down": 1, "nearest": 2}


@c_kernel("Cast", "CastLike", check=_check_cast, storage=True)
def cast(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if x.dtype == y.dtype:
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")
    elif x.dtype in STORAGE or y.dtype in STORAGE:
        saturate = int(pn.kwargs.get("saturate", 1))
        mode = ROUND_MODES[pn.kwargs.get("round_mode", "up")]
        c.line(f"mt_cast_any({c.buf(x)}, {TYPE_CODE[x.dtype]}, {c.buf(y)}, {TYPE_CODE[y.dtype]}, {c.numel(y)}, "
               f"{saturate}, {mode});")
    else:
        c.line(f"mt_cast_{c.sfx(x)}_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {c.numel(y)});")


# ---------------------------------------------------------------- reductions

REDUCE = {"ReduceSum": ("sum", NUMBERS), "ReduceMean": ("mean", NUMBERS), "ReduceMax": ("max", NUMBERS | BOOL),
          "ReduceMin": ("min", NUMBERS | BOOL), "ReduceProd": ("prod", NUMBERS), "ReduceL1": ("l1", NUMBERS),
          "ReduceL2": ("l2", FLOATS), "ReduceLogSum": ("log_sum", FLOATS),
          "ReduceLogSumExp": ("log_sum_exp", FLOATS), "ReduceSumSquare": ("sum_square", NUMBERS)}


def _axes_input(pn):
    return pn.inputs[1] if len(pn.inputs) > 1 and pn.inputs[1] is not None else None


def _given_axes(pn) -> list[int] | None:
    """The axes as given (attribute or constant input; [] when absent); None at run time."""
    axes = pn.kwargs.get("axes")
    v = _axes_input(pn)
    if axes is None and v is not None:
        if v.kind != "constant":
            return None
        axes = ints(v.value)
    return list(axes or [])


def reduce_axes(pn) -> list[int] | None:
    """The reduced axes (normalized, sorted); None when they come at run time."""
    rank = len(pn.inputs[0].static_shape)
    axes = _given_axes(pn)
    if axes is None:
        return None
    if not axes:
        return [] if pn.kwargs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a % rank for a in axes})


def _reduced_shape(shape, axes, keepdims):
    return [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]


def _check_reduce(pn):
    x, y = pn.inputs[0], pn.outputs[0]
    why = _all_same(pn, REDUCE[pn.op_type][1], inputs={0})
    if why:
        return why
    rank = len(x.static_shape)
    axes = _given_axes(pn)
    if axes is None:
        v = _axes_input(pn)
        if v.dtype != INT64:
            return f"axes are {v.dtype}"
        if rank > 16:
            return "rank > 16 with axes given at run time"
        return None
    if any(not -rank <= a < rank for a in axes):
        return f"axes {axes} out of range for rank {rank}"
    keep = pn.kwargs.get("keepdims", 1) == 1
    if _reduced_shape(x.static_shape, reduce_axes(pn), keep) != list(y.static_shape):
        return f"reduced shape differs from the output's {list(y.static_shape)}"
    return None


def _split_dims(shape, axes):
    """(kept sizes, kept strides, reduced sizes, reduced strides), size-1 dims dropped."""
    st = strides(shape)
    kept = [(d, s) for i, (d, s) in enumerate(zip(shape, st)) if i not in axes and d != 1]
    red = [(d, s) for i, (d, s) in enumerate(zip(shape, st)) if i in axes and d != 1]
    if any(d == 0 for i, d in enumerate(shape) if i in axes):
        red = [(0, 0)]
    return [d for d, _ in kept], [s for _, s in kept], [d for d, _ in red], [s for _, s in red]


ROWS = ("max", "min", "sum", "prod", "sum_square", "l1", "mean", "l2", "log_sum")
BOOL_DT = np.dtype(np.bool_)


def _rows(shape, axes):
    """(outer, r, inner) when the reduced dims (size-1 dims aside) are one block with kept dims
    after it; None otherwise (inner reductions, or blocks split by kept dims)."""
    dims = [(d, i in axes) for i, d in enumerate(shape) if d != 1]
    flags = [red for _, red in dims]
    if True not in flags or not flags or flags[-1]:
        return None
    first, last = flags.index(True), len(flags) - 1 - flags[::-1].index(True)
    if not all(flags[first:last + 1]):
        return None
    sizes = [d for d, _ in dims]
    return prod(sizes[:first]), prod(sizes[first:last + 1]), prod(sizes[last + 1:])


@c_kernel(*REDUCE, check=_check_reduce)
def reduce(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    if c.numel(y) == 0:
        return
    fn = f"mt_reduce_{REDUCE[pn.op_type][0]}_{c.sfx(x)}"
    axes = reduce_axes(pn)
    keep = int(pn.kwargs.get("keepdims", 1) == 1)
    if axes is not None:
        ks, kt, rs, rt = _split_dims(shape, axes)
        count = prod(shape[i] for i in axes)
        scale = "NAN" if count == 0 else repr(1.0 / count)
        rows = _rows(shape, axes)
        op = REDUCE[pn.op_type][0]
        if rows and op in ROWS and (x.dtype in FLOATS or op not in ("mean", "l2", "log_sum")) and \
                (x.dtype != BOOL_DT or op in ("max", "min")):
            outer, r, inner = rows
            c.line(f"mt_reduce_rows_{op}_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {outer}, {r}, {inner}, {scale});")
            return
        c.line(f"{fn}({c.buf(x)}, {c.buf(y)}, {c.numel(y)}, {len(ks)}, {c.arr(ks)}, {c.arr(kt)}, {len(rs)}, "
               f"{c.arr(rs)}, {c.arr(rt)}, {scale});")
        return
    v = _axes_input(pn)
    c.line("{")
    c.line("    int kr, rr; mt_i ks[16], kt[16], rs[16], rt[16];")
    noop = int(pn.kwargs.get("noop_with_empty_axes", 0))
    c.checked(f"mt_reduce_setup({len(shape)}, {c.arr(shape)}, {c.buf(v)}, {c.numel(v)}, {noop}, {keep}, "
              f"{len(c.shape(y))}, {c.arr(c.shape(y) or [1])}, &kr, ks, kt, &rr, rs, rt)",
              "the axes are out of range or reduce to another shape than the compiled one")
    c.line("    mt_i count = 1; for (int d = 0; d < rr; d++) count *= rs[d];")
    c.line(f"    {fn}({c.buf(x)}, {c.buf(y)}, {c.numel(y)}, kr, ks, kt, rr, rs, rt, count ? 1.0 / count : NAN);")
    c.line("}")


def _arg_axis(pn):
    rank = len(pn.inputs[0].static_shape)
    return pn.kwargs.get("axis", 0) % max(rank, 1)


def _check_arg(pn):
    x, y = pn.inputs[0], pn.outputs[0]
    if x.dtype not in NUMBERS:
        return f"dtype {x.dtype} (the C kernel has {', '.join(sorted(map(str, NUMBERS)))})"
    if y.dtype != INT64:
        return f"output is {y.dtype}"
    rank = len(x.static_shape)
    if rank == 0:
        return None
    axis = pn.kwargs.get("axis", 0)
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for rank {rank}"
    if x.static_shape[axis % rank] == 0 and prod(y.static_shape) > 0:
        return "ArgMax/ArgMin over an empty axis"
    return None


@c_kernel("ArgMax", "ArgMin", check=_check_arg)
def arg_reduce(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = c.shape(x)
    if c.numel(y) == 0:
        return
    if not shape:
        c.line(f"{c.buf(y)}[0] = 0;")
        return
    axis = _arg_axis(pn)
    outer, n, inner = prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])
    c.line(f"mt_{pn.op_type.lower()}_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {outer}, {n}, {inner}, "
           f"{int(bool(pn.kwargs.get('select_last_index', 0)))});")


def _check_cumsum(pn):
    x, axis = pn.inputs[0], pn.inputs[1]
    why = _all_same(pn, NUMBERS, inputs={0})
    if why:
        return why
    if axis.dtype not in (np.dtype(np.int32), INT64) or prod(axis.static_shape) != 1:
        return f"axis is {axis.dtype} {list(axis.static_shape)}"
    if not x.static_shape:
        return f"{pn.op_type} of a scalar"
    return None


@c_kernel("CumProd", since=26, check=_check_cumsum)
@c_kernel("CumSum", check=_check_cumsum)
def cumsum(pn, c):
    x, axis, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if c.numel(y) == 0:
        return
    shape = c.shape(x)
    flags = f"{int(bool(pn.kwargs.get('exclusive', 0)))}, {int(bool(pn.kwargs.get('reverse', 0)))}"
    c.line("{")
    c.line("    mt_i outer, n, inner;")
    c.checked(f"mt_axis_split({len(shape)}, {c.arr(shape)}, (mt_i){c.buf(axis)}[0], &outer, &n, &inner)",
              "the axis is out of range")
    c.line(f"    mt_cumulate_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, outer, n, inner, {flags}, "
           f"{int(pn.op_type == 'CumProd')});")
    c.line("}")
