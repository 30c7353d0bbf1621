"""Every ggml call a GGML graph is built with, checked in Python before ggml sees it.

ggml answers a call it cannot do with ``GGML_ASSERT`` (or ``GGML_ABORT``), which calls
``abort()``: the interpreter dies with SIGABRT and nothing above it can catch it. The rules'
``check`` functions refuse such nodes first (they run on NumPy instead); this module is the
backstop under them. The rules build through :class:`Calls`, a stand-in for the ``ggml``
module that runs, before each call that makes tensors, the Python form of that ggml
function's assertions (:data:`BEFORE`, read from ggml 0.15.3's ``ggml.c``, the version
ggml-python 0.0.45 vendors), and, after it, checks each tensor the call made against what
ggml's CPU kernel for its op asserts or assumes when the graph is computed (:func:`kernel_problem`,
from ``ggml-cpu/ops.cpp``, ``unary-ops.cpp``, ``binary-ops.cpp`` and ``ggml-cpu.c``): types,
strides, shapes, parameters, and that a view stays inside the tensor it views. A call or a
tensor that fails is a :class:`GGMLPreconditionError` naming the node, raised before the
graph is built. A ggml function without an entry in :data:`BEFORE` is refused too: a new
call a rule makes is audited before it is used.

:class:`Calls` also counts: every tensor header goes into a ggml context sized in advance (an
exhausted context is another assertion), so each segment is built once in a scratch context
(:meth:`Calls.counting`; another scratch context is taken whenever one runs low), which tells
the bytes every call takes and the graph's nodes, and then in a context of exactly that size
(:meth:`Calls.replaying`), each call checked against the bytes it took the first time.
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Callable

from ...errors import MithrilError, NodeError

# The most objects one ggml call makes: ggml_conv_2d makes 7 (im2col, two reshapes, the matmul,
# a reshape, a permute, a cont); the others make one. The counting build takes another scratch
# context before a call finds less room than this.
ROOM_OBJECTS = 16
# No tensor of more bytes than this is made (ggml's size arithmetic is size_t; a model asking
# for more is refused before any of it can wrap).
MAX_TENSOR_BYTES = 1 << 46
# The deepest chain of sources ggml_build_forward_expand may recurse through: its visit is
# recursive in C, and a deeper graph overflows the thread's stack (SIGSEGV). Measured with
# ggml-python 0.0.45 on the 8 MiB main-thread stack: a chain of 100,000 ops built, 200,000 did
# not; this leaves room for a thread's smaller stack.
MAX_GRAPH_DEPTH = 20_000
# ggml-alloc's dynamic allocator keeps at most 256 free blocks per chunk and asserts past it
# (MAX_FREE_BLOCKS in ggml-alloc.c); free blocks are separated by allocated ones, so a graph
# whose allocations live at most this many at a time cannot run out.
MAX_LIVE_ALLOCATIONS = 254


class GGMLPreconditionError(NodeError):
    """A ggml call or tensor a rule made that ggml would refuse with an assertion (which aborts
    the process), found before the graph is built: the node, the ggml function and the
    condition that fails (``reason``). GGMLBackend then runs the node on NumPy."""

    def __init__(self, reason: str, **node):
        self.reason = reason
        super().__init__(f"GGMLBackend: {reason}", **node)


def _ggml():
    import ggml

    return ggml


# ---- tensor facts, as ggml.c computes them -------------------------------------------------
def ne(t) -> list[int]:
    return t.contents.ne[:4]


def nb(t) -> list[int]:
    return t.contents.nb[:4]


def _type(t) -> int:
    return t.contents.type


_SIZES: dict[int, tuple[int, int]] = {}


def _sizes(type_: int) -> tuple[int, int]:
    """(ggml_type_size, ggml_blck_size) of a type (asked of ggml once per type)."""
    found = _SIZES.get(type_)
    if found is None:
        g = _ggml()
        found = _SIZES[type_] = (int(g.ggml_type_size(type_)), int(g.ggml_blck_size(type_)))
    return found


def _type_size(g, type_: int) -> int:
    return _sizes(type_)[0]


def _blck(g, type_: int) -> int:
    return _sizes(type_)[1]


def _extent(c) -> int:
    """ggml_nbytes of tensor contents ``c``, in Python (no size_t wrap): the bytes from its first
    element to past its last."""
    n, s = c.ne[:4], c.nb[:4]
    if n[0] <= 0 or n[1] <= 0 or n[2] <= 0 or n[3] <= 0:
        return 0
    size, blck = _sizes(c.type)
    tail = (n[1] - 1) * s[1] + (n[2] - 1) * s[2] + (n[3] - 1) * s[3]
    if blck == 1:
        return size + (n[0] - 1) * s[0] + tail
    return n[0] * s[0] // blck + tail


def _nbytes(t) -> int:
    return _extent(t.contents)


def _contiguous(t) -> bool:
    return bool(_ggml().ggml_is_contiguous(t))


def _rows_contiguous(t) -> bool:
    g = _ggml()
    return ne(t)[0] == _blck(g, _type(t)) or nb(t)[0] == _type_size(g, _type(t))


def _padded_1d(t) -> bool:
    g = _ggml()
    n, s = ne(t), nb(t)
    return s[0] == _type_size(g, _type(t)) and s[2] == s[1] * n[1] and s[3] == s[2] * n[2]


def _can_repeat(small, big) -> bool:
    a, b = ne(small), ne(big)
    if any(d == 0 for d in a):
        return any(d == 0 for d in b)
    return all(y % x == 0 for x, y in zip(a, b))


def _same_shape(a, b) -> bool:
    return ne(a) == ne(b)


def _quantized(type_: int) -> bool:
    return bool(_ggml().ggml_is_quantized(type_))


def _type_name(type_: int) -> str:
    g = _ggml()
    try:
        return g.ggml_type_name(type_).decode()
    except Exception:  # noqa: BLE001 - an out-of-range type has no name
        return f"type {type_}"


def _is_tensor(x) -> bool:
    return isinstance(x, ctypes._Pointer) and bool(x)


def _conv_out(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """ggml_calc_conv_output_size (C's integer division truncates toward zero)."""
    return int((size + 2 * pad - dilation * (kernel - 1) - 1) / stride) + 1


def _pool_out(size: int, kernel: int, stride: int, pad: float) -> int:
    """ggml_calc_pool_output_size: ``(ins + 2 * p - ks) / s + 1`` in float, truncated."""
    return int((size + 2 * pad - kernel) / stride + 1)


# ---- before a call: the assertions of the ggml function itself ----------------------------
def _require(ok: bool, text: str) -> str | None:
    return None if ok else text


def _tensors(*ts) -> str | None:
    for i, t in enumerate(ts):
        if not _is_tensor(t):
            return f"argument {i + 1} is not a tensor"
    return None


def _ints(values, lo: int, hi: int = 2**31 - 1, what: str = "parameters") -> str | None:
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            return f"{what} {list(values)} (each an int in [{lo}, {hi}])"
    return None


def _extents(values) -> str | None:
    return _ints(values, 1, 2**62, "extents")


def _binary(ctx, a, b):  # ggml_add_impl & co: GGML_ASSERT(ggml_can_repeat(b, a))
    return _tensors(a, b) or _require(_can_repeat(b, a), f"{ne(b)} does not repeat to {ne(a)} (ggml_can_repeat)")


def _unary(ctx, a, *rest):  # ggml_unary_impl: GGML_ASSERT(ggml_is_contiguous_rows(a))
    return _tensors(a) or _require(_rows_contiguous(a), "rows not contiguous (ggml_is_contiguous_rows)")


def _one(ctx, a, *rest):  # ops whose constructor asserts nothing (checked after, by KERNELS)
    return _tensors(a)


def _scale(ctx, a, *rest):  # ggml_scale_impl: GGML_ASSERT(ggml_is_padded_1d(a))
    return _tensors(a) or _require(_padded_1d(a), "not padded 1-D (ggml_is_padded_1d)")


def _reshape(ctx, a, *shape):  # ggml_reshape_Nd: contiguous, same number of elements
    return (_tensors(a) or _extents(shape) or _require(_contiguous(a), "a reshape of a non-contiguous tensor")
            or _require(math.prod(ne(a)) == math.prod(shape),
                        f"{ne(a)} reshaped to {list(shape)} (ggml_nelements differs)"))


def _view(n_dims: int):
    """ggml_view_Nd: ggml_new_tensor_impl asserts ``data_size + offset <= ggml_nbytes(base)``
    (the view's contiguous size); the strided extent inside the base is checked after the call
    (a view reaching past its base reads memory not its own, no assertion)."""

    def check(ctx, a, *args):
        shape, strides, offset = list(args[:n_dims]), list(args[n_dims:2 * n_dims - 1]), args[-1]
        problem = _tensors(a) or _extents(shape) or _ints(strides + [offset], 0, 2**62, "strides and offset")
        if problem:
            return problem
        g = _ggml()
        base = a.contents.view_src if a.contents.view_src else a
        offset += int(a.contents.view_offs) if a.contents.view_src else 0
        type_ = _type(a)
        if _quantized(type_) and shape[0] % _blck(g, type_):
            return f"a view of {shape[0]} values of {_type_name(type_)} (whole blocks of {_blck(g, type_)})"
        data = math.prod(shape[1:]) * shape[0] * _type_size(g, type_) // _blck(g, type_)
        return _require(data + offset <= _nbytes(base),
                        f"a view of {data} bytes at offset {offset} of a {_nbytes(base)}-byte tensor")

    return check


def _concat(ctx, a, b, dim):  # ggml_concat
    problem = _tensors(a, b) or _ints([dim], 0, 3, "dim")
    if problem:
        return problem
    if _type(a) != _type(b):
        return f"concat of {_type_name(_type(a))} and {_type_name(_type(b))}"
    na, nb_ = ne(a), ne(b)
    return _require(all(x == y for d, (x, y) in enumerate(zip(na, nb_)) if d != dim),
                    f"concat of {na} and {nb_} along dim {dim}")


def _mul_mat(ctx, a, b):  # ggml_mul_mat: ggml_can_mul_mat(a, b), !ggml_is_transposed(a) or a read in place
    problem = _tensors(a, b)
    if problem:
        return problem
    na, nb_ = ne(a), ne(b)
    if na[0] != nb_[0] or nb_[2] % na[2] or nb_[3] % na[3]:
        return f"mul_mat of {na} and {nb_} (ggml_can_mul_mat)"
    if nb(a)[0] > nb(a)[1] and _in_place(a, b):
        return None
    return _require(nb(a)[0] <= nb(a)[1], "a transposed first operand (ggml_is_transposed)")


def _in_place(a, b) -> bool:
    """ggml_mul_mat's transposed first operand as the patched ggml takes it (threads.reads_f32_in_place):
    float32 elements a row apart, its rows contiguous; the second operand float32, its rows contiguous."""
    from .threads import reads_f32_in_place

    f32 = _types()[0]
    return (reads_f32_in_place() and _type(a) == f32 and _type(b) == f32 and nb(a)[1] == 4
            and nb(b)[0] == 4)


def _get_rows(ctx, a, b):  # ggml_get_rows
    problem = _tensors(a, b)
    if problem:
        return problem
    na, nb_ = ne(a), ne(b)
    if na[2] != nb_[1] or na[3] != nb_[2] or nb_[3] != 1:
        return f"get_rows of {na} by indices {nb_}"
    return _require(_type(b) == _ggml().GGML_TYPE_I32, f"{_type_name(_type(b))} indices (ggml: i32)")


def _pad_ext(ctx, a, *pads):  # ggml_pad_ext: no assertion; a negative pad reads outside the source
    return _tensors(a) or _ints(list(pads), 0, 2**31 - 1, "pads")


def _cast(ctx, a, type_):
    problem = _tensors(a) or _ints([type_], 0, _ggml().GGML_TYPE_COUNT - 1, "type")
    if problem:
        return problem
    return _require(_copyable(_type(a), type_), f"a copy from {_type_name(_type(a))} to {_type_name(type_)}")


def _repeat_4d(ctx, a, *shape):  # ggml_repeat_4d: each extent a multiple of a's
    problem = _tensors(a) or _extents(shape)
    if problem:
        return problem
    return _require(all(y % x == 0 for x, y in zip(ne(a), shape)), f"{ne(a)} repeated to {list(shape)}")


def _repeat(ctx, a, b):  # ggml_repeat: ggml_can_repeat(a, b)
    return _tensors(a, b) or _require(_can_repeat(a, b), f"{ne(a)} repeated to {ne(b)}")


def _pool(op, kernels, strides, pads, a):
    g = _ggml()
    problem = _tensors(a) or _ints([op], 0, 1, "pool op") or _ints(list(kernels) + list(strides), 1)
    if problem:
        return problem
    if any(not isinstance(p, (int, float)) or not 0 <= p < 2**31 for p in pads):
        return f"pool pads {list(pads)}"
    if op not in (g.GGML_OP_POOL_MAX, g.GGML_OP_POOL_AVG):
        return f"pool op {op}"
    sizes = ne(a)
    out = [_pool_out(sizes[i], k, s, p) for i, (k, s, p) in enumerate(zip(kernels, strides, pads))]
    return _require(min(out) > 0, f"a {list(kernels)} pool window larger than the input {sizes[:len(kernels)]}")


def _pool_2d(ctx, a, op, k0, k1, s0, s1, p0, p1):
    return _pool(op, (k0, k1), (s0, s1), (p0, p1), a)


def _pool_1d(ctx, a, op, k0, s0, p0):
    return _pool(op, (k0,), (s0,), (p0,), a)


def _permute(ctx, a, *axes):  # ggml_permute
    return _tensors(a) or _ints(list(axes), 0, 3, "axes") or _require(len(set(axes)) == 4, f"axes {list(axes)}")


def _cumsum(ctx, a):  # ggml_cumsum: GGML_ASSERT(a->type == GGML_TYPE_F32)
    return _tensors(a) or _require(_type(a) == _ggml().GGML_TYPE_F32, f"cumsum of {_type_name(_type(a))}")


def _soft_max(ctx, a):  # ggml_soft_max_impl: GGML_ASSERT(ggml_is_contiguous(a))
    return _tensors(a) or _require(_contiguous(a), "soft_max of a non-contiguous tensor")


def _conv_2d(ctx, a, b, s0, s1, p0, p1, d0, d1):
    """ggml_conv_2d: ggml_im2col (a->ne[2] == b->ne[2], both output sizes > 0; the strides
    divide), then ggml_reshape_2d of the kernel (contiguous) and ggml_mul_mat."""
    problem = _tensors(a, b) or _ints([s0, s1, d0, d1], 1) or _ints([p0, p1], 0)
    if problem:
        return problem
    ka, xb = ne(a), ne(b)
    if ka[2] != xb[2]:
        return f"a kernel of {ka[2]} input channels over {xb[2]} channels (ggml_im2col)"
    oh, ow = _conv_out(xb[1], ka[1], s1, p1, d1), _conv_out(xb[0], ka[0], s0, p0, d0)
    if oh <= 0 or ow <= 0:
        return f"a {ka[1]}x{ka[0]} kernel larger than the {xb[1]}x{xb[0]} (padded) input (ggml_im2col: b too small)"
    return _require(_contiguous(a), "a non-contiguous kernel (ggml_reshape_2d)")


def _conv_2d_dw_direct(ctx, a, b, s0, s1, p0, p1, d0, d1):  # ggml_conv_2d_dw_direct
    problem = _tensors(a, b) or _ints([s0, s1, d0, d1], 1) or _ints([p0, p1], 0)
    if problem:
        return problem
    ka, xb = ne(a), ne(b)
    if ka[2] != 1 or ka[3] != xb[2]:
        return f"a depthwise kernel {ka} over {xb}"
    oh, ow = _conv_out(xb[1], ka[1], s1, p1, d1), _conv_out(xb[0], ka[0], s0, p0, d0)
    return _require(oh > 0 and ow > 0,
                    f"a {ka[1]}x{ka[0]} kernel larger than the {xb[1]}x{xb[0]} (padded) input")


def _new_tensor_4d(ctx, type_, *shape):
    return _ints([type_], 0, _ggml().GGML_TYPE_COUNT - 1, "type") or _extents(shape)


def _graph_io(a):  # ggml_set_input / ggml_set_output: flags only
    return _tensors(a)


# The ggml functions the rules may call, each with the Python form of its assertions (ggml.c).
BEFORE: dict[str, Callable] = {
    "ggml_add": _binary, "ggml_sub": _binary, "ggml_mul": _binary, "ggml_div": _binary,
    "ggml_scale": _scale, "ggml_scale_bias": _scale,
    **{f"ggml_{op}": _unary for op in ("abs", "sgn", "neg", "step", "tanh", "elu", "relu", "sigmoid", "exp",
                                       "floor", "ceil", "round", "trunc", "softplus", "expm1", "hardswish",
                                       "gelu_erf", "silu")},
    **{f"ggml_{op}": _one for op in ("cont", "transpose", "sum", "sum_rows", "mean", "log", "sqrt", "sqr", "sin",
                                     "cos", "norm", "rms_norm", "leaky_relu", "clamp")},
    "ggml_reshape_1d": _reshape, "ggml_reshape_2d": _reshape, "ggml_reshape_3d": _reshape,
    "ggml_reshape_4d": _reshape,
    "ggml_view_1d": _view(1), "ggml_view_2d": _view(2), "ggml_view_3d": _view(3), "ggml_view_4d": _view(4),
    "ggml_concat": _concat, "ggml_mul_mat": _mul_mat, "ggml_get_rows": _get_rows,
    "ggml_pad_ext": _pad_ext, "ggml_pad": _pad_ext, "ggml_cast": _cast,
    "ggml_repeat_4d": _repeat_4d, "ggml_repeat": _repeat,
    "ggml_pool_2d": _pool_2d, "ggml_pool_1d": _pool_1d, "ggml_permute": _permute, "ggml_cumsum": _cumsum,
    "ggml_soft_max": _soft_max, "ggml_conv_2d": _conv_2d, "ggml_conv_2d_dw_direct": _conv_2d_dw_direct,
    "ggml_new_tensor_4d": _new_tensor_4d,
}


# ---- after a call: what the CPU kernel of each tensor's op asserts or assumes ---------------
def _types():
    g = _ggml()
    return g.GGML_TYPE_F32, g.GGML_TYPE_F16, g.GGML_TYPE_BF16, g.GGML_TYPE_I32


def _copyable(src: int, dst: int) -> bool:
    """ggml_compute_forward_dup's cases (ops.cpp): the same type copies bytes; float32 to
    float16, bfloat16 or int32; float16 and bfloat16 to each other and float32; int32 to float32."""
    f32, f16, bf16, i32 = _types()
    if src == dst:
        return src in (f32, f16, bf16, i32)
    return (src, dst) in {(f32, f16), (f32, bf16), (f32, i32), (f16, bf16), (f16, f32), (bf16, f16), (bf16, f32),
                          (i32, f32)}


def _src(t, i):
    s = t.contents.src[i]
    return s if s else None


def _k_copy(t):
    s = _src(t, 0)
    return _require(_copyable(_type(s), _type(t)) and math.prod(ne(s)) == math.prod(ne(t)),
                    f"a copy of {_type_name(_type(s))} {ne(s)} to {_type_name(_type(t))} {ne(t)}")


def _k_binary(t):
    """binary-ops.cpp: apply_binary_op asserts ggml_can_repeat(src1, src0), the same shape as
    dst, contiguous elements in src0 and dst; binary_op's type cases (else GGML_ABORT)."""
    f32, f16, bf16, _ = _types()
    a, b = _src(t, 0), _src(t, 1)
    combos = {(f32, f32, f32), (f16, f16, f16), (bf16, bf16, bf16), (bf16, f32, bf16), (bf16, f32, f32),
              (f16, f32, f16), (f16, f32, f32)}
    if (_type(a), _type(b), _type(t)) not in combos:
        return f"an elementwise op on {_type_name(_type(a))} and {_type_name(_type(b))}"
    if nb(a)[0] != _type_size(_ggml(), _type(a)):
        return "an elementwise op on a first operand with strided elements"
    return _require(_can_repeat(b, a) and _same_shape(a, t), f"an elementwise op on {ne(a)} and {ne(b)}")


def _float_rows(t, types) -> str | None:
    """A kernel reading src0 row by row as the given types: contiguous elements."""
    s = _src(t, 0)
    if _type(s) not in types:
        return f"{_type_name(_type(s))} input"
    return _require(nb(s)[0] == _type_size(_ggml(), _type(s)), "an input with strided elements")


def _k_unary(t):
    """unary-ops.cpp unary_op: (f32|f16|bf16) -> itself or f32, contiguous rows; gelu_erf and
    silu (ops.cpp) take f32 and f16."""
    g = _ggml()
    f32, f16, bf16, _ = _types()
    s = _src(t, 0)
    pair = (_type(s), _type(t))
    if t.contents.op == g.GGML_OP_UNARY:
        op = int(t.contents.op_params[0])
        audited = {getattr(g, f"GGML_UNARY_OP_{n}") for n in (
            "ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "EXP", "FLOOR", "CEIL", "ROUND", "TRUNC",
            "SOFTPLUS", "EXPM1", "HARDSWISH", "GELU_ERF", "SILU")}
        if op not in audited:
            return f"unary op {op}"
        if op in (g.GGML_UNARY_OP_GELU_ERF, g.GGML_UNARY_OP_SILU) and pair not in {(f32, f32), (f16, f16)}:
            return f"{_type_name(pair[0])} input"
    if pair not in {(f32, f32), (f16, f16), (bf16, bf16), (bf16, f32), (f16, f32)}:
        return f"{_type_name(pair[0])} input to {_type_name(pair[1])}"
    if not (_rows_contiguous(s) and _rows_contiguous(t) and _same_shape(s, t)):
        return "rows not contiguous"
    return _require(nb(s)[0] == _type_size(g, _type(s)), "an input with strided elements")


def _k_scale(t):  # ggml_compute_forward_scale: f32, both contiguous
    s = _src(t, 0)
    return _require(_type(s) == _types()[0] and _contiguous(s) and _contiguous(t), "scale of a non-contiguous or "
                    f"{_type_name(_type(s))} tensor")


def _k_f32_rows(t):  # sum_rows, mean, cumsum (ops.cpp): f32, contiguous elements
    return _float_rows(t, (_types()[0],))


def _k_sum(t):  # ggml_compute_forward_sum: f32, f16, bf16
    f32, f16, bf16, _ = _types()
    return _float_rows(t, (f32, f16, bf16))


def _k_repeat(t):  # ggml_compute_forward_repeat: f32/i32 or f16/bf16/i16, contiguous elements
    g = _ggml()
    f32, f16, bf16, i32 = _types()
    problem = _float_rows(t, (f32, i32, f16, bf16, g.GGML_TYPE_I16))
    return problem or _require(_can_repeat(_src(t, 0), t), f"{ne(_src(t, 0))} repeated to {ne(t)}")


def _k_concat(t):  # ggml_compute_forward_concat: any type, both sources of it
    a, b = _src(t, 0), _src(t, 1)
    return _require(_type(a) == _type(b) == _type(t) and not _quantized(_type(a)),
                    f"concat of {_type_name(_type(a))}")


def _eps(t) -> float:
    return struct.unpack("f", struct.pack("i", int(t.contents.op_params[0])))[0]


def _k_norm(t):  # norm_f32, rms_norm_f32: f32 rows, GGML_ASSERT(eps >= 0.0f)
    eps = _eps(t)
    if not eps >= 0.0:  # NaN too
        return f"epsilon {eps} (ggml asserts eps >= 0)"
    return _float_rows(t, (_types()[0],)) or _require(_same_shape(_src(t, 0), t), "a norm of another shape")


def _k_mul_mat(t):
    """ggml_compute_forward_mul_mat (ggml-cpu.c): src0's and src1's elements contiguous (nb00,
    nb10 the type size), a float32 result; src0 float or quantized, src1 float32."""
    g = _ggml()
    f32, f16, bf16, _ = _types()
    a, b = _src(t, 0), _src(t, 1)
    if not (_type(a) in (f32, f16, bf16) or _quantized(_type(a))) or _type(b) != f32:
        return f"mul_mat of {_type_name(_type(a))} by {_type_name(_type(b))}"
    if nb(a)[0] != _type_size(g, _type(a)) and _in_place(a, b):
        return None
    if nb(a)[0] != _type_size(g, _type(a)) or nb(b)[0] != _type_size(g, _type(b)):
        return "mul_mat of an operand with strided elements"
    return None


def _k_get_rows(t):  # ggml_compute_forward_get_rows: float, i32 or quantized rows; i32 indices
    g = _ggml()
    f32, f16, bf16, i32 = _types()
    a, b = _src(t, 0), _src(t, 1)
    if not (_type(a) in (f32, f16, bf16, i32) or _quantized(_type(a))) or _type(b) != i32:
        return f"get_rows of {_type_name(_type(a))} by {_type_name(_type(b))}"
    return _require(nb(a)[0] == _type_size(g, _type(a)), "get_rows of strided elements")


def _k_soft_max(t):  # ggml_compute_forward_soft_max: f32, contiguous, no mask here
    s = _src(t, 0)
    return _require(_type(s) == _types()[0] and _contiguous(s) and _src(t, 1) is None,
                    "soft_max of a non-contiguous or non-f32 tensor")


def _k_pool(t):  # pool_1d_ksp, pool_2d: f32/f16 read plane by plane (contiguous)
    f32, f16, _, _ = _types()
    s = _src(t, 0)
    if _type(s) not in (f32, f16) or not _contiguous(s):
        return "a pool of a non-contiguous or non-float tensor"
    params = [int(x) for x in t.contents.op_params[:7]]
    kernels_strides = params[1:3] + params[3:5] if t.contents.op == _ggml().GGML_OP_POOL_2D else params[1:3]
    return _require(min(kernels_strides) >= 1, f"pool parameters {params}")


def _k_im2col(t):
    """im2col_f32: src1 and dst f32; im2col_f16: src0 f16, src1 f16/f32, dst f16; src1's
    elements contiguous; strides and dilations at least 1 (they divide)."""
    g = _ggml()
    f32, f16, _, _ = _types()
    a, b = _src(t, 0), _src(t, 1)
    if _type(t) == f32:
        ok = _type(b) == f32
    else:
        ok = _type(t) == f16 and _type(a) == f16 and _type(b) in (f16, f32)
    if not ok:
        return f"im2col of {_type_name(_type(a))} and {_type_name(_type(b))} to {_type_name(_type(t))}"
    p = [int(x) for x in t.contents.op_params[:6]]
    if min(p[0], p[1], p[4], p[5]) < 1 or min(p[2], p[3]) < 0:
        return f"im2col parameters {p}"
    return _require(nb(b)[0] == _type_size(g, _type(b)), "im2col of strided elements")


def _k_conv_2d_dw(t):  # ggml_compute_forward_conv_2d_dw: f32, contiguous (whcn) layouts
    f32 = _types()[0]
    k, x = _src(t, 0), _src(t, 1)
    if _type(k) != f32 or _type(x) != f32 or not _contiguous(k) or not _contiguous(x) or not _contiguous(t):
        return "a depthwise conv of non-contiguous or non-f32 tensors"
    return _require(ne(k)[3] == ne(x)[2] and ne(t)[3] == ne(x)[3], "a depthwise kernel of other channels")


def _k_pad(t):  # ggml_compute_forward_pad: f32, pads >= 0 (a negative one reads outside), not circular
    s = _src(t, 0)
    pads = [int(x) for x in t.contents.op_params[:9]]
    if _type(s) != _types()[0] or _type(t) != _types()[0]:
        return f"a pad of {_type_name(_type(s))}"
    return _require(min(pads[:8]) >= 0 and pads[8] == 0, f"pad parameters {pads}")


def _k_leaky_relu(t):  # leaky_relu_f32/f16: contiguous rows
    f32, f16, _, _ = _types()
    s = _src(t, 0)
    return _float_rows(t, (f32, f16)) or _require(
        bool(_ggml().ggml_is_contiguous_1(s)) and bool(_ggml().ggml_is_contiguous_1(t)), "rows not contiguous")


def _k_clamp(t):  # clamp_f32/f16: nb0 == nb00 == the type size
    f32, f16, _, _ = _types()
    return _float_rows(t, (f32, f16)) or _require(nb(t)[0] == _type_size(_ggml(), _type(t)), "strided elements")


def _k_none(t):
    return None


def _kernels() -> dict[int, Callable]:
    g = _ggml()
    table = {
        "NONE": _k_none, "VIEW": _k_none, "RESHAPE": _k_none, "PERMUTE": _k_none, "TRANSPOSE": _k_none,
        "CONT": _k_copy, "DUP": _k_copy, "CPY": _k_copy,
        "ADD": _k_binary, "SUB": _k_binary, "MUL": _k_binary, "DIV": _k_binary,
        "UNARY": _k_unary, "SQR": _k_unary, "SQRT": _k_unary, "LOG": _k_unary, "SIN": _k_unary, "COS": _k_unary,
        "SCALE": _k_scale, "SUM": _k_sum, "SUM_ROWS": _k_f32_rows, "MEAN": _k_f32_rows, "CUMSUM": _k_f32_rows,
        "REPEAT": _k_repeat, "CONCAT": _k_concat, "NORM": _k_norm, "RMS_NORM": _k_norm, "MUL_MAT": _k_mul_mat,
        "GET_ROWS": _k_get_rows, "SOFT_MAX": _k_soft_max, "POOL_1D": _k_pool, "POOL_2D": _k_pool,
        "IM2COL": _k_im2col, "CONV_2D_DW": _k_conv_2d_dw, "PAD": _k_pad, "LEAKY_RELU": _k_leaky_relu,
        "CLAMP": _k_clamp,
    }
    return {int(getattr(g, f"GGML_OP_{name}")): check for name, check in table.items()}


_KERNELS: list[dict] = []


def kernel_problem(t) -> str | None:
    """Why ggml could not compute tensor ``t`` (its op's CPU kernel would assert, or read or
    write outside its tensors); None when it can."""
    if not _KERNELS:
        _KERNELS.append(_kernels())
    c = t.contents
    n = c.ne[:4]
    if min(n) < 1:
        return f"a tensor of extents {n}"
    type_ = c.type
    if not 0 <= type_ < _ggml().GGML_TYPE_COUNT:
        return f"type {type_}"
    size_, blck = _sizes(type_)
    if blck > 1 and n[0] % blck:
        return f"a row of {n[0]} values of {_type_name(type_)} (whole blocks of {blck})"
    size = _extent(c)
    if size > MAX_TENSOR_BYTES:
        return f"a tensor of {size:,} bytes"
    src = c.view_src
    if src:  # a view reads and writes only inside its base
        end = c.view_offs + size
        if end > _nbytes(src):
            return f"a view reaching byte {end} of a {_nbytes(src)}-byte tensor"
    check = _KERNELS[0].get(c.op)
    if check is None:
        return f"ggml op {_ggml().ggml_op_name(c.op).decode()} (no audited CPU kernel)"
    return check(t)


# ---- the stand-in for the ggml module ------------------------------------------------------
def _makes_tensors(fn) -> bool:
    g = _ggml()
    return getattr(fn, "restype", None) is ctypes.POINTER(g.ggml_tensor) and bool(getattr(fn, "argtypes", None)) \
        and fn.argtypes[0] is ctypes.c_void_p


class Calls:
    """The ``ggml`` module as a segment's build sees it: attributes are ggml's, and each
    function that makes tensors in the context is checked before (:data:`BEFORE`) and its
    tensors after (:func:`kernel_problem`). ``node`` is the plan node being built (errors name
    it). :meth:`counting` and :meth:`replaying` set how the context's room is watched."""

    def __init__(self, ggml):
        self._g = ggml
        self.ctx = None
        self.node = None
        self._record: list[tuple[str, int]] = []
        self._replay: list[tuple[str, int]] | None = None
        self._more: Callable | None = None
        self._room = ROOM_OBJECTS * int(ggml.ggml_tensor_overhead())
        self._calls = 0
        self._last = None
        self.made: list = []  # (tensor, the node building it or None) for every tensor made here, in order

    # -- modes --------------------------------------------------------------------------------
    def counting(self, more: Callable) -> None:
        """The counting build: ``more()`` gives a scratch context, and another whenever the one in
        use has less room than one call may take (:data:`ROOM_OBJECTS`). Every call and every
        tensor is checked; the bytes each call takes are recorded (:attr:`record`)."""
        self._more, self._replay = more, None
        self._start(more())

    def replaying(self, ctx, record: list[tuple[str, int]]) -> None:
        """The real build, into ``ctx`` (sized exactly from the counting build's :attr:`record`):
        call ``i`` must be the same function and find room for the bytes it took then. The calls
        are the counting build's, checked then: not again."""
        self._more, self._replay = None, record
        self._start(ctx)

    def _start(self, ctx) -> None:
        self.ctx, self._record, self._calls, self._last, self.made, self.node = ctx, [], 0, None, [], None

    @property
    def record(self) -> list[tuple[str, int]]:
        return self._record

    # -- the module's attributes --------------------------------------------------------------
    def __getattr__(self, name: str):  # first use of ``name``: kept in the instance after
        attr = getattr(self._g, name)
        if callable(attr) and _makes_tensors(attr):
            check = BEFORE.get(name)

            def wrapped(*args, _name=name, _fn=attr, _check=check):
                return self.call(_name, _fn, args, _check)

            attr = wrapped
        self.__dict__[name] = attr
        return attr

    def call(self, name: str, fn: Callable, args: tuple, check: Callable | None = None):
        """``fn(*args)`` (ggml function ``name``; its first argument, a context, is replaced by
        the one in use) with its checks and the context's room."""
        if self._replay is None:
            if check is None:
                check = BEFORE.get(name)
            if check is None:
                self.fail(f"{name}, which has no audited preconditions (guard.BEFORE)")
            problem = check(*args)
            if problem:
                self.fail(f"{name}: {problem}")
        rest = tuple(args[1:])
        return self.around(name, lambda: fn(self.ctx, *rest))

    def around(self, name: str, make: Callable):
        """``make()``, which makes tensors in :attr:`ctx` (a ggml call, or a weight, constant or
        input the program makes), with the room watched and, counting, each tensor checked."""
        g = self._g
        used = int(g.ggml_used_mem(self.ctx))
        room = int(g.ggml_get_mem_size(self.ctx)) - used
        if self._replay is None:
            if room < self._room:  # another scratch context: the count goes on there
                self.ctx, self._last = self._more(), None
                used = int(g.ggml_used_mem(self.ctx))
        else:
            i = self._calls
            if i >= len(self._replay) or self._replay[i][0] != name or self._replay[i][1] > room:
                want = self._replay[i] if i < len(self._replay) else None
                raise MithrilError(f"GGMLBackend: the graph's second build differs from its first at call {i} "
                                   f"({name}, {room} bytes left; the first build made {want}): a rule builds "
                                   "differently for the same node, which is a bug")
        out = make()
        self._record.append((name, int(g.ggml_used_mem(self.ctx)) - used))
        self._calls += 1
        self._collect(name)
        return out

    def _collect(self, name: str | None = None) -> None:
        """Notes (and, counting, checks) the tensors made in :attr:`ctx` since the last call."""
        g = self._g
        t = g.ggml_get_next_tensor(self.ctx, self._last) if self._last else g.ggml_get_first_tensor(self.ctx)
        while t:
            self._last = t
            self.made.append((t, self.node))
            if self._replay is None:
                problem = kernel_problem(t)
                if problem:
                    made = "a leaf" if t.contents.op == g.GGML_OP_NONE else g.ggml_op_desc(t).decode()
                    self.fail(f"{made} ({name}): {problem}")
            t = g.ggml_get_next_tensor(self.ctx, t)

    def fail(self, text: str):
        """Raises :class:`GGMLPreconditionError` for ``text``, naming the node being built."""
        pn = self.node
        if pn is None:
            raise GGMLPreconditionError(f"ggml would abort on {text}")
        ins = [v for v in pn.inputs if v is not None]
        raise GGMLPreconditionError(f"ggml would abort on {text}", node=pn.label, op_type=pn.op_type, opset=pn.opset,
                                    shapes=[v.static_shape for v in ins], dtypes=[str(v.dtype) for v in ins])


# ---- the graph: its size, its depth, its allocations ---------------------------------------
class _Fields:
    """Tensor fields read at an address (the graph walks below touch thousands of tensors;
    ctypes pointers are slow to follow)."""

    def __init__(self):
        g = _ggml()
        t = g.ggml_tensor
        self.src = (ctypes.c_void_p * len(t().src)).from_address
        self.src_off = t.src.offset
        self.view_src_off, self.op_off, self.flags_off = t.view_src.offset, t.op.offset, t.flags.offset
        self.data_off, self.buffer_off = t.data.offset, t.buffer.offset

    def srcs(self, a: int) -> list[int]:
        return [s for s in self.src(a + self.src_off) if s]

    def int_at(self, a: int, off: int) -> int:
        return ctypes.c_int.from_address(a + off).value

    def ptr_at(self, a: int, off: int) -> int | None:
        return ctypes.c_void_p.from_address(a + off).value


_FIELDS: list[_Fields] = []


def _fields() -> _Fields:
    if not _FIELDS:
        _FIELDS.append(_Fields())
    return _FIELDS[0]


def _address(t) -> int:
    return ctypes.cast(t, ctypes.c_void_p).value


def graph_size(outputs) -> tuple[int, int, dict[int, int]]:
    """(nodes, leafs, depths) of the graph ``ggml_build_forward_expand`` makes from ``outputs``
    in order: a tensor with no op and without the PARAM flag is a leaf (ggml_visit_parents_graph),
    every other tensor a node. ``depths``: by tensor address, the longest chain of sources
    from it (ggml's visit recurses that deep)."""
    g, f = _ggml(), _fields()
    param, none = int(g.GGML_TENSOR_FLAG_PARAM), int(g.GGML_OP_NONE)
    depth: dict[int, int] = {}
    seen: set[int] = set()
    nodes = leafs = 0
    for out in outputs:
        stack = [(_address(out), False)]
        while stack:
            a, done = stack.pop()
            if done:
                srcs = [s for s in f.srcs(a) if s != a]  # ggml_cast: src[1] is itself
                depth[a] = 1 + max((depth[s] for s in srcs), default=0)
                if f.int_at(a, f.op_off) == none and not f.int_at(a, f.flags_off) & param:
                    leafs += 1
                else:
                    nodes += 1
                continue
            if a in seen:
                continue
            seen.add(a)
            stack.append((a, True))
            for s in reversed(f.srcs(a)):
                if s not in seen:
                    stack.append((s, False))
    return nodes, leafs, depth


def peak_allocations(gf) -> tuple[int, int | None]:
    """The most intermediate tensors ``ggml_gallocr_alloc_graph`` holds allocated at once for
    graph ``gf`` (ggml_gallocr_alloc_graph_impl's walk: each node allocated in order, a parent
    freed after its last child and last view, outputs never), and the address of the node being
    allocated then. An upper bound: a node ggml places in its parent's memory
    (ggml_op_can_inplace) counts as one more. ggml-alloc keeps one free block per gap between
    allocations, at most 256 per chunk (it asserts past that): a graph whose peak is at most
    :data:`MAX_LIVE_ALLOCATIONS` is safe."""
    g, f = _ggml(), _fields()
    output, none = int(g.GGML_TENSOR_FLAG_OUTPUT), int(g.GGML_OP_NONE)
    nodes = [_address(g.ggml_graph_node(gf, i)) for i in range(g.ggml_graph_n_nodes(gf))]
    children: dict[int, int] = {}
    views: dict[int, int] = {}
    srcs = {a: f.srcs(a) for a in nodes}
    for a in nodes:
        base = f.ptr_at(a, f.view_src_off)
        if base and f.int_at(a, f.op_off) != none:
            views[base] = views.get(base, 0) + 1
        for s in srcs[a]:
            children[s] = children.get(s, 0) + 1
    allocated: set[int] = set()
    live = peak = 0
    at = None
    for a in nodes:
        if not f.ptr_at(a, f.view_src_off) and not f.ptr_at(a, f.data_off) and not f.ptr_at(a, f.buffer_off) \
                and a not in allocated:
            allocated.add(a)
            live += 1
            if live > peak:
                peak, at = live, a
        for s in srcs[a]:
            children[s] -= 1
            if children[s] or views.get(s, 0):
                continue
            base = f.ptr_at(s, f.view_src_off)
            if base:
                views[base] -= 1
                if views[base] or children.get(base, 0):
                    continue
                s = base
            if s in allocated and not f.int_at(s, f.flags_off) & output:
                allocated.discard(s)
                live -= 1
    return peak, at


__all__ = ["BEFORE", "Calls", "GGMLPreconditionError", "MAX_GRAPH_DEPTH", "MAX_LIVE_ALLOCATIONS",
           "ROOM_OBJECTS", "graph_size", "kernel_problem", "peak_allocations"]
