"""C rules for signal, contraction and detection ops (kernels: ``lib/mt_signal.h``): Einsum, DFT
(opsets 17 and 20), STFT, Col2Im, DeformConv (2-D), RoiAlign and NonMaxSuppression.

Each computes what :mod:`mithril.backends.kernels` does (NumPy's FFT, einsum, onnxruntime's
RoiAlign sampling). Inputs that size things may come at run time (DFT's axis and dft_length,
STFT's frame step and length, Col2Im's image and block shapes): the kernels read them and stop
the segment with a NodeError when they do not give the shapes the model was compiled for.
NonMaxSuppression's count depends on the data: as NonZero's, the compiled count is checked.

Einsum runs as one strided loop nest over the output and the summed labels, or, for two float
operands and a large enough contraction, as batched GEMMs (operands packed into scratch only where
their labels are not already one row and one column stride apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from ...kernels.geometry import window
from . import FLOATS, NUMBERS, c_kernel, ints, same_types, strides, text
from .elementwise import collapse

INT64 = np.dtype(np.int64)
INDEX = frozenset({np.dtype(np.int32), INT64})
FFT_SLOTS = 16  # the most threads one DFT or STFT runs on (each needs its own lines of scratch)
EINSUM_MAX_OPS = 8  # MT_EIN_MAXOPS
EINSUM_MAX_DIMS = 32  # MT_EIN_MAXDIMS
EINSUM_GEMM_MIN = 4096  # M * N * K of one batch from which Einsum runs as GEMMs
COL2IM_MAX_DIMS = 8  # MT_COL_MAXDIMS
ALIGN = 64


def _given(pn, i: int):
    """Input ``i`` when the node has it and it holds values (an empty optional input is absent)."""
    v = pn.inputs[i] if i < len(pn.inputs) else None
    return v if v is not None and (v.static_shape is None or prod(v.static_shape) > 0) else None


def _const_int(v) -> int:
    return int(np.asarray(v.value).reshape(-1)[0])


def _scalar_arg(pn, i: int, dtypes=INDEX) -> tuple[int | None, object, str | None]:
    """Input ``i`` as a scalar: (value when constant or absent (None: given at run time), the
    run-time value or None, why it cannot be read)."""
    v = _given(pn, i)
    if v is None:
        return None, None, None
    if v.dtype not in dtypes or prod(v.static_shape) != 1:
        return None, None, (f"input {v.name!r} is {v.dtype} {list(v.static_shape)} (C reads one "
                            f"{' or '.join(sorted(map(str, dtypes)))})")
    return (_const_int(v), None, None) if v.kind == "constant" else (None, v, None)


def _read(c, value: int | None, v, default: int) -> str:
    """A C expression for a scalar argument: the constant, the run-time value, or the default."""
    if v is not None:
        return f"(mt_i){c.buf(v)}[0]"
    return str(default if value is None else value)


def _a64(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _typed_like(pn, *positions: int) -> str | None:
    """Why the output's element type is not that of the inputs at ``positions`` (the data; index and
    size inputs aside); None when it is."""
    dt = pn.outputs[0].dtype
    for i in positions:
        v = _given(pn, i)
        if v is not None and v.dtype != dt:
            return f"input {v.name!r} is {v.dtype}, the output {dt}"
    return None


def _shape_is(pn, want, i: int = 0) -> str | None:
    y = pn.outputs[i].static_shape
    return None if tuple(y) == tuple(want) else f"output {i} is typed {tuple(y)}, the op gives {tuple(want)}"


# ---------------------------------------------------------------------------------------------
# Einsum


@dataclass(frozen=True)
class _Einsum:
    """An equation bound to shapes: each operand's labels (letters; the dims under an ellipsis as
    -1, -2, ... from the right, so that they line up across operands), the output's, the summed
    ones, each label's size, and each operand's element stride per label (0 where it lacks the
    label or broadcasts a 1; a repeated label's strides added: a diagonal)."""

    ops: tuple[tuple, ...]
    out: tuple
    summed: tuple
    sizes: dict
    st: tuple[dict, ...]


def _einsum(pn) -> _Einsum | str:
    """The node's equation bound to its input shapes, or why it cannot be (NumPy's reading: an
    implicit output is the broadcast dims, then the letters used once, alphabetically)."""
    eq = (text(pn.kwargs.get("equation")) or "").replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(pn.inputs):
        return f"equation {eq!r} names {len(terms)} operands, the node has {len(pn.inputs)}"
    ops, ell = [], 0
    for term, v in zip(terms, pn.inputs):
        rank = len(v.static_shape)
        head, dots, tail = term.partition("...")
        if "." in head + tail or not all(ch.isalpha() for ch in head + tail):
            return f"equation {eq!r}: term {term!r} is not letters around one ellipsis"
        e = rank - len(head) - len(tail)
        if e < 0 or (e and not dots):
            return f"equation {eq!r}: term {term!r} does not fit an operand of rank {rank}"
        ell = max(ell, e)
        ops.append(tuple(head) + tuple(range(-e, 0)) + tuple(tail))
    letters = [ch for labels in ops for ch in labels if isinstance(ch, str)]
    if arrow:
        head, dots, tail = rhs.partition("...")
        if "." in head + tail or not all(ch.isalpha() for ch in head + tail):
            return f"equation {eq!r}: output {rhs!r} is not letters around one ellipsis"
        out = tuple(head) + (tuple(range(-ell, 0)) if dots else ()) + tuple(tail)
    else:  # implicit: the broadcast dims, then the letters used once, in alphabetical order
        out = tuple(range(-ell, 0)) + tuple(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    if len(set(out)) != len(out) or any(isinstance(label, str) and label not in letters for label in out):
        return f"equation {eq!r}: the output repeats a label or names one no operand has"
    sizes: dict = {}
    for labels, v in zip(ops, pn.inputs):
        for label, d in zip(labels, v.static_shape):
            if sizes.get(label, 1) not in (1, d) and d != 1:
                return f"equation {eq!r}: label {label!r} is {sizes[label]} and {d}"
            sizes[label] = max(sizes.get(label, 1), d) if d else 0
    for label in out:
        sizes.setdefault(label, 1)
    st = []
    for labels, v in zip(ops, pn.inputs):
        walk: dict = {}
        for label, d, s in zip(labels, v.static_shape, strides(v.static_shape)):
            walk[label] = walk.get(label, 0) + (s if d != 1 else 0)
        st.append(walk)
    seen = dict.fromkeys(label for labels in ops for label in labels)
    summed = tuple(label for label in seen if label not in out)
    return _Einsum(tuple(ops), out, summed, sizes, tuple(st))


def _check_einsum(pn):
    if not pn.inputs or len(pn.inputs) > EINSUM_MAX_OPS:
        return f"{len(pn.inputs)} operands (C takes 1 to {EINSUM_MAX_OPS})"
    e = _einsum(pn)
    if isinstance(e, str):
        return e
    if len(e.summed) > EINSUM_MAX_DIMS:
        return f"{len(e.summed)} summed labels (C takes up to {EINSUM_MAX_DIMS})"
    return _shape_is(pn, [e.sizes[label] for label in e.out]) or same_types(pn)


def _group(e: _Einsum, st: dict, labels) -> tuple[int, int] | None:
    """(size, stride) of ``labels`` walked as one dim; None when their strides do not line up."""
    dims, (walk,) = collapse([e.sizes[label] for label in labels], [st.get(label, 0) for label in labels])
    return (dims[0], walk[0]) if len(dims) == 1 else None


@dataclass(frozen=True)
class _Operand:
    """One GEMM operand: the node's input read in place, or packed into scratch as
    [batch..., rows, cols] (``pack`` bytes at offset ``at``)."""

    index: int
    rows: tuple
    cols: tuple
    row_stride: int
    col_stride: int
    batch_st: list[int]
    pack: int = 0
    at: int = 0


def _einsum_gemm(pn, e: _Einsum):
    """The GEMM plan of a two-operand float Einsum: (A, B, batch labels, whether Y is written in place,
    scratch bytes); None when the loop nest serves (small, empty, or more or fewer operands)."""
    if len(e.ops) != 2 or pn.inputs[0].dtype not in FLOATS:
        return None
    la, lb = set(e.ops[0]), set(e.ops[1])
    bat = [label for label in e.out if label in la and label in lb]
    m = [label for label in e.out if label in la and label not in lb]
    n = [label for label in e.out if label in lb and label not in la]
    k = list(e.summed)
    size = {g: prod(e.sizes[label] for label in labels) for g, labels in (("m", m), ("n", n), ("k", k))}
    if size["m"] * size["n"] * size["k"] < EINSUM_GEMM_MIN:
        return None
    first, second = 0, 1
    direct = list(e.out) == bat + m + n
    if not direct and list(e.out) == bat + n + m:  # Y[n, m]: B's rows times A's columns
        first, second, m, n, direct = 1, 0, n, m, True
    item, at = pn.inputs[0].dtype.itemsize, 0
    bshape = [e.sizes[label] for label in bat]

    def operand(i, rows, cols):
        nonlocal at
        st = e.st[i]
        r, q = _group(e, st, rows), _group(e, st, cols)
        if r is not None and q is not None:
            return _Operand(i, tuple(rows), tuple(cols), r[1], q[1], [st.get(label, 0) for label in bat])
        nr, nq = prod(e.sizes[label] for label in rows), prod(e.sizes[label] for label in cols)
        op = _Operand(i, tuple(rows), tuple(cols), nq, 1, strides(bshape + [nr * nq])[:-1], pack=prod(bshape) * nr * nq,
                      at=at)
        at += _a64(op.pack * item)
        return op

    a, b = operand(first, m, k), operand(second, k, n)
    return a, b, bat, direct, at + (0 if direct else _a64(prod(e.sizes[label] for label in e.out) * item))


def _einsum_scratch(pn) -> int:
    e = _einsum(pn)
    plan = None if isinstance(e, str) else _einsum_gemm(pn, e)
    return plan[-1] if plan else 0


def _loop_nest(c, ops: list[tuple[str, dict]], out, summed, sizes, y: str, ctype: str, sfx: str) -> None:
    """Prints mt_einsum over ``ops`` ((pointer, strides by label)) into the C-contiguous ``y``."""
    oshape = [sizes[label] for label in out]
    walks = [[st.get(label, 0) for label in out] for _, st in ops] + [strides(oshape)]
    odims, owalks = collapse(oshape, *walks)
    sdims, swalks = collapse([sizes[label] for label in summed], *[[st.get(label, 0) for label in summed]
                                                                  for _, st in ops])
    if prod(sdims) == 1:  # nothing to sum: the kernel multiplies (or, one operand, copies)
        sdims, swalks = [], [[] for _ in ops]
    table = [s for k in range(len(ops)) for s in owalks[k] + swalks[k]]
    pointers = ", ".join(p for p, _ in ops)
    c.line(f"mt_einsum_{sfx}({len(ops)}, (const {ctype} *const[]){{{pointers}}}, {y}, {len(odims)}, "
           f"{c.arr(odims)}, {len(sdims)}, {c.arr(sdims)}, {c.arr(table)});")


@c_kernel("Einsum", since=12, dtypes=NUMBERS, check=_check_einsum, scratch=_einsum_scratch)
def einsum(pn, c):
    y = pn.outputs[0]
    if c.numel(y) == 0:
        return
    e = _einsum(pn)
    ctype, sfx = c.ctype(y), c.sfx(y)
    plan = _einsum_gemm(pn, e)
    if plan is None:
        _loop_nest(c, [(c.buf(v), st) for v, st in zip(pn.inputs, e.st)], e.out, e.summed, e.sizes, c.buf(y),
                   ctype, sfx)
        return
    a, b, bat, direct, total = plan
    item = y.dtype.itemsize
    ptr = {}
    for op in (a, b):
        ptr[op.index] = c.buf(pn.inputs[op.index])
        if op.pack:  # [batch, rows, cols] from the input's strides
            packed = f"(({ctype} *)({c.scratch} + {op.at}))"
            _loop_nest(c, [(ptr[op.index], e.st[op.index])], tuple(bat) + op.rows + op.cols, (), e.sizes, packed,
                       ctype, sfx)
            ptr[op.index] = packed
    mshape = [e.sizes[label] for label in bat + list(a.rows) + list(b.cols)]
    ystrides = strides(mshape)[:len(bat)]
    target = c.buf(y) if direct else f"(({ctype} *)({c.scratch} + {total - _a64(c.numel(y) * item)}))"
    M, N, K = (prod(e.sizes[label] for label in g) for g in (a.rows, b.cols, a.cols))
    bshape = [e.sizes[label] for label in bat]
    c.line(f"mt_einsum_gemm_{sfx}({ptr[a.index]}, {ptr[b.index]}, {target}, {len(bat)}, {c.arr(bshape)}, "
           f"{c.arr(a.batch_st + b.batch_st + ystrides)}, {M}, {N}, {K}, {a.row_stride}, {a.col_stride}, "
           f"{b.row_stride}, {b.col_stride});")
    if not direct:  # [batch, m, n] to the output's order
        labels = tuple(bat) + a.rows + b.cols
        _loop_nest(c, [(target, dict(zip(labels, strides(mshape))))], e.out, (), e.sizes, c.buf(y), ctype, sfx)


# ---------------------------------------------------------------------------------------------
# DFT / STFT


def _largest_prime(n: int) -> int:
    res = 1
    while n % 2 == 0:
        res, n = 2, n // 2
    x = 3
    while x * x <= n:
        while n % x == 0:
            res, n = x, n // x
        x += 2
    return n if n > 1 else res


def _fft_cost(n: int) -> float:
    ni, result = n, 0.0
    while n % 2 == 0:
        result, n = result + 2, n // 2
    x = 3
    while x * x <= n:
        while n % x == 0:
            result, n = result + (x if x <= 5 else 1.1 * x), n // x
        x += 2
    if n > 1:
        result += n if n <= 5 else 1.1 * n
    return result * ni


def _good_size(n: int) -> int:
    """The smallest 2^a 3^b 5^c 7^d 11^e >= n (pocketfft's good_size_cmplx)."""
    if n <= 12:
        return n
    best = 2 * n
    f11 = 1
    while f11 < best:
        f117 = f11
        while f117 < best:
            f1175 = f117
            while f1175 < best:
                x = f1175
                while x < n:
                    x *= 2
                while True:
                    if x < n:
                        x *= 3
                    elif x > n:
                        best = min(best, x)
                        if x & 1:
                            break
                        x >>= 1
                    else:
                        return n
                f1175 *= 5
            f117 *= 7
        f11 *= 11
    return best


def _bluestein(n: int) -> bool:
    p = 0 if n < 50 else _largest_prime(n)
    return p * p > n and 1.5 * 2 * _fft_cost(_good_size(2 * n - 1)) < _fft_cost(n)


def _twsize(n: int) -> int:
    """Complex twiddles of pocketfft's FFTPACK plan of length n."""
    factors, m = [], n
    while m % 8 == 0:
        factors, m = factors + [8], m // 8
    while m % 4 == 0:
        factors, m = factors + [4], m // 4
    if m % 2 == 0:
        factors, m = [2] + factors, m // 2
    d = 3
    while d * d <= m:
        while m % d == 0:
            factors, m = factors + [d], m // d
        d += 2
    if m > 1:
        factors.append(m)
    size, l1 = 0, 1
    for ip in factors if n > 1 else []:
        ido = n // (l1 * ip)
        size += (ip - 1) * (ido - 1) + (ip if ip > 11 else 0)
        l1 *= ip
    return size


def _fft_bytes(n: int, lines: int) -> int:
    """Scratch bytes of a transform of length n over ``lines`` lines, in complex doubles (enough for
    complex floats too): the plan and a line's buffers per thread (lib/mt_signal.h's
    mt_fft_plan_size and mt_fft_line_size, mirrored)."""
    if _bluestein(n):
        n2 = _good_size(2 * n - 1)
        plan, line = _twsize(n2) + n + n2 // 2 + 1, n + 2 * n2
    else:
        plan, line = _twsize(n), 2 * n
    return _a64(plan * 16) + max(min(FFT_SLOTS, lines), 1) * _a64(line * 16)


def _dft_args(pn):
    """((axis value, run-time axis), (dft_length value, run-time dft_length), problem)."""
    if pn.opset < 20:
        axis = (int(pn.kwargs.get("axis", 1)), None, None)
    else:
        axis = _scalar_arg(pn, 2, frozenset({INT64}))
        if axis[0] is None and axis[1] is None and axis[2] is None:
            axis = (-2, None, None)
    length = _scalar_arg(pn, 1)
    return axis, length, axis[2] or length[2]


def _dft_out(xs, axis: int, n: int, inverse: bool, onesided: bool):
    """(The output shape of a DFT of ``xs`` along ``axis``, None when there is none; the length, n < 0
    resolved to the default), as lib/mt_signal.h's mt_dft_geometry."""
    rank = len(xs)
    if axis < 0:
        axis += rank
    if not 0 <= axis <= rank - 2:
        return None, n
    irfft = inverse and onesided
    if n < 0:
        n = 2 * (xs[axis] - 1) if irfft else xs[axis]
    if n < 1:
        return None, n
    out = list(xs)
    out[axis] = n if irfft or not onesided else n // 2 + 1
    out[-1] = 1 if irfft else 2
    return tuple(out), n


def _dft_candidates(pn) -> list[tuple[int, int]]:
    """The (axis, length) pairs that give the output shape, over what run-time inputs may hold."""
    xs, ys = tuple(pn.inputs[0].static_shape), tuple(pn.outputs[0].static_shape)
    (axis, axis_v, _), (n, n_v, _), _ = _dft_args(pn)
    inverse, onesided = bool(pn.kwargs.get("inverse", 0)), bool(pn.kwargs.get("onesided", 0))
    rank, found = len(xs), []
    for a in ([axis] if axis_v is None else range(rank - 1)):
        an = a + rank if a < 0 else a
        if not 0 <= an < rank:
            continue
        if n_v is None:
            lengths = [-1 if n is None else n]
        elif onesided and not inverse:
            lengths = [2 * (ys[an] - 1), 2 * ys[an] - 1]
        else:
            lengths = [ys[an]]
        for length in lengths:
            out, resolved = _dft_out(xs, an, length, inverse, onesided)
            if out == ys:
                found.append((an, resolved))
    return found


def _check_dft(pn):
    x = pn.inputs[0].static_shape
    if len(x) < 2 or x[-1] not in (1, 2):
        return f"input {tuple(x)} does not end in a real (1) or complex (2) pair"
    _, _, problem = _dft_args(pn)
    if problem:
        return problem
    if not _dft_candidates(pn):
        return f"no axis and dft_length give the output {tuple(pn.outputs[0].static_shape)} from {tuple(x)}"
    return _typed_like(pn, 0)


def _dft_lines(xs, axis: int) -> int:
    return prod(xs[:axis]) * prod(xs[axis + 1:-1])


def _dft_scratch(pn) -> int:
    xs = pn.inputs[0].static_shape
    return max([_fft_bytes(n, _dft_lines(xs, a)) for a, n in _dft_candidates(pn)] + [64])


def _dft_precision(pn) -> str:
    """The FFT's element type, as NumPy's: float32 for the inverse of float32 data (its scale is a
    float32), double otherwise (irfft too, which NumPy runs as a real FFT)."""
    inverse, onesided = bool(pn.kwargs.get("inverse", 0)), bool(pn.kwargs.get("onesided", 0))
    return "f32" if inverse and not onesided and pn.inputs[0].dtype == np.dtype(np.float32) else "f64"


@c_kernel("DFT", since=17, dtypes=FLOATS, check=_check_dft, scratch=_dft_scratch)
def dft(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    (axis, axis_v, _), (n, n_v, _), _ = _dft_args(pn)
    xs, ys = c.shape(x), c.shape(y)
    c.line("{")
    c.line("    mt_dft_geom g;")
    c.checked(f"mt_dft_geometry({len(xs)}, {c.arr(xs)}, {c.arr(ys)}, {_read(c, axis, axis_v, -2)}, "
              f"{_read(c, n, n_v, -1)}, {int(bool(pn.kwargs.get('inverse', 0)))}, "
              f"{int(bool(pn.kwargs.get('onesided', 0)))}, &g)",
              f"axis and dft_length do not give the output shape {tuple(ys)} the model was compiled for")
    c.checked(f"mt_dft_lines_{_dft_precision(pn)}({c.buf(x)}, {c.buf(y)}, {int(x.dtype.itemsize == 8)}, &g, "
              f"{c.scratch}, {_dft_scratch(pn)})", "the transform does not fit the scratch planned for it")
    c.line("}")


def _stft_args(pn):
    """(frame_step, frame_length and the window (None when absent), problem)."""
    step = _scalar_arg(pn, 1)
    length = _scalar_arg(pn, 3)
    return step, length, _given(pn, 2), step[2] or length[2]


def _stft_lengths(pn) -> list[int]:
    """The frame lengths that give the output shape, over what run-time inputs may hold."""
    (_, L, cin), (_, frames, bins, _) = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    step, (n, n_v, _), win, _ = _stft_args(pn)
    onesided = bool(pn.kwargs.get("onesided", 1))
    wlen = win.static_shape[0] if win is not None else None
    if n_v is not None:
        lengths = [2 * (bins - 1), 2 * bins - 1] if onesided else [bins]
    else:
        lengths = [n if n is not None else wlen if wlen is not None else L]
    found = []
    for length in lengths:
        if not 1 <= length <= L or (wlen is not None and wlen != length):
            continue
        if (length // 2 + 1 if onesided else length) != bins:
            continue
        if step[0] is not None and (step[0] < 1 or (L - length) // step[0] + 1 != frames):
            continue
        found.append(length)
    return found


def _check_stft(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    if len(x) != 3 or x[-1] not in (1, 2):
        return f"signal {tuple(x)} is not [batch, length, 1 or 2]"
    if len(y) != 4 or y[0] != x[0] or y[3] != 2:
        return f"output {tuple(y)} is not [batch, frames, bins, 2]"
    step, _, win, problem = _stft_args(pn)
    if problem:
        return problem
    if step[0] is None and step[1] is None:
        return "no frame_step"
    if win is not None and (len(win.static_shape) != 1 or win.dtype != pn.inputs[0].dtype):
        return f"window {win.name!r} is {win.dtype} {list(win.static_shape)}, not a vector of the signal's type"
    if not _stft_lengths(pn):
        return f"no frame length and step give the output {tuple(y)} from {tuple(x)}"
    return _typed_like(pn, 0, 2)


def _stft_scratch(pn) -> int:
    lines = pn.outputs[0].static_shape[0] * pn.outputs[0].static_shape[1]
    return max([_fft_bytes(n, lines) for n in _stft_lengths(pn)] + [64])


@c_kernel("STFT", since=17, dtypes=FLOATS, check=_check_stft, scratch=_stft_scratch)
def stft(pn, c):
    """In double, as NumPy transforms the frames (see :func:`_dft_precision`)."""
    x, y = pn.inputs[0], pn.outputs[0]
    (step, step_v, _), (n, n_v, _), win, _ = _stft_args(pn)
    B, L, cin = c.shape(x)
    _, frames, bins, _ = c.shape(y)
    wlen = win.static_shape[0] if win is not None else -1
    step = _read(c, step, step_v, 0)
    c.line("{")
    c.line(f"    const mt_i n = mt_stft_length({L}, {step}, {_read(c, n, n_v, -1)}, {wlen}, {frames}, {bins}, "
           f"{int(bool(pn.kwargs.get('onesided', 1)))});")
    c.checked("!n", f"frame_step and frame_length do not give the output shape {tuple(c.shape(y))} the model was "
                    f"compiled for")
    c.checked(f"mt_stft_lines_f64({c.buf(x)}, {c.buf(win) if win is not None else '0'}, {c.buf(y)}, "
              f"{int(x.dtype.itemsize == 8)}, {B}, {L}, {cin}, {step}, n, {frames}, {bins}, {c.scratch}, "
              f"{_stft_scratch(pn)})", "the transform does not fit the scratch planned for it")
    c.line("}")


# ---------------------------------------------------------------------------------------------
# Col2Im


def _col2im_attrs(pn, nd: int):
    k = pn.kwargs
    return (ints(k.get("dilations")) or [1] * nd, ints(k.get("pads")) or [0] * (2 * nd),
            ints(k.get("strides")) or [1] * nd)


def _check_col2im(pn):
    x, y = pn.inputs[0].static_shape, pn.outputs[0].static_shape
    nd = len(y) - 2
    if len(x) != 3 or nd < 1 or nd > COL2IM_MAX_DIMS or x[0] != y[0]:
        return f"input {tuple(x)} and output {tuple(y)} are not [N, C * block, L] and [N, C, image...] " \
               f"(C takes 1 to {COL2IM_MAX_DIMS} image axes)"
    dil, pads, st = _col2im_attrs(pn, nd)
    if len(dil) != nd or len(pads) != 2 * nd or len(st) != nd or min(dil + st) < 1:
        return f"dilations {dil}, pads {pads} or strides {st} do not fit {nd} image axes"
    for i in (1, 2):
        v = pn.inputs[i]
        if v.dtype != INT64 or prod(v.static_shape) != nd:
            return f"input {v.name!r} is {v.dtype} {list(v.static_shape)}, not {nd} int64"
    image, block = pn.inputs[1], pn.inputs[2]
    if image.kind == "constant" and ints(image.value) != list(y[2:]):
        return f"image_shape {ints(image.value)} is not the output's {list(y[2:])}"
    if block.kind == "constant":
        win = window(y[2:], ints(block.value), st, dil, pads)
        if y[1] * prod(ints(block.value)) != x[1] or prod(win.out) != x[2]:
            return f"block_shape {ints(block.value)} does not give the input {tuple(x)}"
    return _typed_like(pn, 0)


@c_kernel("Col2Im", since=18, dtypes=NUMBERS, check=_check_col2im)
def col2im(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    xs, ys = c.shape(x), c.shape(y)
    nd = len(ys) - 2
    dil, pads, st = _col2im_attrs(pn, nd)
    g = [nd, *ys[2:], *dil, *pads, *st]
    c.checked(f"mt_col2im_image_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {c.buf(pn.inputs[1])}, {c.buf(pn.inputs[2])}, {xs[0]}, "
              f"{ys[1]}, {xs[1]}, {xs[2]}, {c.arr(g)})",
              f"image_shape and block_shape do not give the shapes {tuple(xs)} -> {tuple(ys)} the model was "
              f"compiled for")


# ---------------------------------------------------------------------------------------------
# DeformConv


def _deform_geometry(pn) -> list[int] | str:
    x, w, off = (pn.inputs[i].static_shape for i in range(3))
    if len(x) != 4 or len(w) != 4:
        return f"{len(x) - 2}-D DeformConv (C has 2-D)"
    k = pn.kwargs
    N, C, H, W = x
    M = w[0]
    group, og = int(k.get("group") or 1), int(k.get("offset_group") or 1)
    kernel = ints(k.get("kernel_shape")) or list(w[2:])
    if list(kernel) != list(w[2:]) or group < 1 or og < 1 or C % group or M % group or C % og or w[1] * group != C:
        return f"W {tuple(w)} does not fit X {tuple(x)} with group={group}, offset_group={og}, kernel_shape={kernel}"
    win = window((H, W), kernel, ints(k.get("strides")) or None, ints(k.get("dilations")) or None,
                 ints(k.get("pads")) or None)
    taps = prod(kernel)
    if tuple(off) != (N, og * taps * 2, *win.out):
        return f"offset {tuple(off)} is not {(N, og * taps * 2, *win.out)}"
    b, mask = _given(pn, 3), _given(pn, 4)
    if b is not None and tuple(b.static_shape) != (M,):
        return f"B {tuple(b.static_shape)} is not ({M},)"
    if mask is not None and tuple(mask.static_shape) != (N, og * taps, *win.out):
        return f"mask {tuple(mask.static_shape)} is not {(N, og * taps, *win.out)}"
    return [N, C, H, W, M, group, og, *kernel, *win.out, *win.strides, *win.begin, *win.dilations]


def _check_deform_conv(pn):
    g = _deform_geometry(pn)
    if isinstance(g, str):
        return g
    return _shape_is(pn, (g[0], g[4], g[9], g[10])) or same_types(pn)


def _deform_scratch(pn) -> int:
    g = _deform_geometry(pn)
    return 0 if isinstance(g, str) else g[1] * g[7] * g[8] * g[9] * g[10] * pn.inputs[0].dtype.itemsize


@c_kernel("DeformConv", since=19, dtypes=FLOATS, check=_check_deform_conv, scratch=_deform_scratch)
def deform_conv(pn, c):
    y = pn.outputs[0]
    if c.numel(y) == 0:
        return
    x, w, off = pn.inputs[:3]
    b, mask = _given(pn, 3), _given(pn, 4)
    col = f"({c.ctype(y)} *){c.scratch}" if c.scratch else "0"
    c.line(f"mt_deform_conv_{c.sfx(y)}({c.buf(x)}, {c.buf(w)}, {c.buf(off)}, {c.buf(b) if b is not None else '0'}, "
           f"{c.buf(mask) if mask is not None else '0'}, {c.buf(y)}, {col}, {c.arr(_deform_geometry(pn))});")


# ---------------------------------------------------------------------------------------------
# RoiAlign


def _roi_mode(pn) -> tuple[str, str]:
    k = pn.kwargs
    return text(k.get("mode")) or "avg", text(k.get("coordinate_transformation_mode")) or "output_half_pixel"


def _check_roi_align(pn):
    x, rois, idx = (v.static_shape for v in pn.inputs[:3])
    if len(x) != 4 or len(rois) != 2 or rois[1] != 4 or tuple(idx) != (rois[0],):
        return f"X {tuple(x)}, rois {tuple(rois)} and batch_indices {tuple(idx)} are not [N, C, H, W], [R, 4], [R]"
    if pn.inputs[2].dtype != INT64 or pn.inputs[1].dtype != pn.inputs[0].dtype:
        return f"rois is {pn.inputs[1].dtype} and batch_indices {pn.inputs[2].dtype}"
    mode, ctm = _roi_mode(pn)
    if mode not in ("avg", "max"):
        return f"mode {mode!r} (C has avg and max)"
    if ctm not in ("half_pixel", "output_half_pixel"):
        return f"coordinate_transformation_mode {ctm!r}"
    k = pn.kwargs
    want = (rois[0], x[1], int(k.get("output_height", 1)), int(k.get("output_width", 1)))
    return _shape_is(pn, want) or _typed_like(pn, 0, 1)


@c_kernel("RoiAlign", since=10, dtypes=FLOATS, check=_check_roi_align)
def roi_align(pn, c):
    x, rois, idx = pn.inputs[:3]
    y = pn.outputs[0]
    N, C, H, W = c.shape(x)
    R, _, oh, ow = c.shape(y)
    mode, ctm = _roi_mode(pn)
    k = pn.kwargs
    c.checked(f"mt_roi_align_{c.sfx(y)}({c.buf(x)}, {c.buf(rois)}, {c.buf(idx)}, {c.buf(y)}, {N}, {C}, {H}, {W}, "
              f"{R}, {oh}, {ow}, {int(k.get('sampling_ratio', 0))}, {float(k.get('spatial_scale', 1.0))!r}, "
              f"{int(ctm == 'half_pixel')}, {int(mode == 'max')})",
              f"a batch index is outside [0, {N})")


# ---------------------------------------------------------------------------------------------
# NonMaxSuppression


def _check_nms(pn):
    boxes, scores, y = pn.inputs[0].static_shape, pn.inputs[1].static_shape, pn.outputs[0].static_shape
    if len(boxes) != 3 or boxes[2] != 4 or len(scores) != 3 or (scores[0], scores[2]) != (boxes[0], boxes[1]):
        return f"boxes {tuple(boxes)} and scores {tuple(scores)} are not [B, S, 4] and [B, C, S]"
    if pn.inputs[1].dtype != pn.inputs[0].dtype:
        return f"scores are {pn.inputs[1].dtype}, boxes {pn.inputs[0].dtype}"
    if len(y) != 2 or y[1] != 3 or pn.outputs[0].dtype != INT64:
        return f"output {tuple(y)} {pn.outputs[0].dtype} is not [count, 3] int64"
    for i, kinds in ((2, "iu"), (3, "fiu"), (4, "fiu")):
        v = _given(pn, i)
        if v is not None and v.dtype.kind not in kinds:
            return f"input {v.name!r} is {v.dtype}"
    return None


def _nms_scratch(pn) -> int:
    """Five doubles (corners, area) and three indices (order, merge, kept) a box (lib/mt_signal.h's mt_nms)."""
    return 64 + 64 * pn.inputs[0].static_shape[1]


@c_kernel("NonMaxSuppression", since=10, dtypes=FLOATS, check=_check_nms, scratch=_nms_scratch)
def non_max_suppression(pn, c):
    boxes, scores, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    B, S, _ = c.shape(boxes)
    C = c.shape(scores)[1]
    count = c.shape(y)[0]
    max_out, iou, thr = (_given(pn, i) for i in (2, 3, 4))
    c.checked(f"mt_nms_{c.sfx(boxes)}({c.buf(boxes)}, {c.buf(scores)}, {c.buf(y)}, {B}, {C}, {S}, "
              f"{int(bool(pn.kwargs.get('center_point_box', 0)))}, "
              f"{f'(int64_t){c.buf(max_out)}[0]' if max_out is not None else '0'}, "
              f"{f'(double){c.buf(iou)}[0]' if iou is not None else '0.0'}, {int(thr is not None)}, "
              f"{f'(double){c.buf(thr)}[0]' if thr is not None else '0.0'}, {count}, {c.scratch})",
              f"the boxes select another count than the compiled {count}")
