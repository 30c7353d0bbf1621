"""C rules for the attention ops (kernels: ``lib/mt_attention.h``): Attention (opsets 23 to 25: float
and bool masks, is_causal, sliding windows, softcap, grouped-query heads, 3-D inputs, past keys and
values, the scores output, nonpad_kv_seqlen) and RotaryEmbedding.

Both compute what :mod:`mithril.backends.kernels.attention` does. Shapes are static, so each
node's geometry is one constant array (its layout: ``lib/mt_attention.h``); 3-D and 4-D inputs
differ only in their strides. Attention's scores live in arena scratch, one slot per thread that
may run at once (:data:`SLOTS`), each the size of one work item: :data:`ROWS` query rows of one head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import FLOATS, c_kernel, strides

INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
ROWS = 32  # query rows per work item: 32 rows of 2048 float scores fill a quarter of L2
SLOTS = 64  # scratch slots: the most threads one Attention runs on
# softmax_precision (a TensorProto type) -> the NumPy type C computes the softmax in. FLOAT on
# float64 inputs runs in float64: C's softmax is never narrower than its input.
SOFTMAX_PRECISION = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _input(pn, i: int):
    return pn.inputs[i] if len(pn.inputs) > i and pn.inputs[i] is not None else None


def _output(pn, i: int):
    return pn.outputs[i] if len(pn.outputs) > i and pn.outputs[i].name else None


def _a64(n: int) -> int:
    return (n + 63) // 64 * 64


# ---------------------------------------------------------------------------------------------
# Attention


@dataclass(frozen=True)
class _Heads:
    """An Attention node's sizes, and its Q, K, V and Y strides along (batch, head, row)."""

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    P: int  # past keys
    D: int  # Q and K head size
    Dv: int
    packed: bool  # 3-D Q, K, V and Y: [batch, sequence, heads * head size]

    @property
    def keys(self) -> int:
        return self.P + self.Skv

    def walk(self, heads: int, rows: int, d: int) -> tuple[int, int, int]:
        if self.packed:
            return rows * heads * d, d, heads * d
        return heads * rows * d, rows * d, d

    @property
    def rows(self) -> int:
        return max(1, min(self.Sq, ROWS))

    @property
    def items(self) -> int:
        return self.B * self.Hq * -(-self.Sq // self.rows)


def _heads(pn) -> _Heads | str:
    """The node's sizes, or why they do not make an Attention."""
    q, k, v = (pn.inputs[i].static_shape for i in range(3))
    if len(q) not in (3, 4) or len(k) != len(q) or len(v) != len(q):
        return f"Q, K, V of ranks {len(q)}, {len(k)}, {len(v)} (C takes all 3-D or all 4-D)"
    if len(q) == 4:
        (B, Hq, Sq, D), (_, Hkv, Skv, Dk), (_, Hv, Sv, Dv) = q, k, v
    else:
        Hq, Hkv = int(pn.kwargs.get("q_num_heads") or 0), int(pn.kwargs.get("kv_num_heads") or 0)
        if Hq <= 0 or Hkv <= 0:
            return "3-D inputs without q_num_heads and kv_num_heads"
        if q[2] % Hq or k[2] % Hkv or v[2] % Hkv:
            return f"hidden sizes {q[2]}, {k[2]}, {v[2]} are not multiples of {Hq} and {Hkv} heads"
        (B, Sq, _), (_, Skv, _), (_, Sv, _) = q, k, v
        D, Dk, Dv, Hv = q[2] // Hq, k[2] // Hkv, v[2] // Hkv, Hkv
    if not B == k[0] == v[0]:
        return f"batch sizes of Q {q}, K {k}, V {v} differ"
    if Hkv <= 0 or Hq % Hkv or Hv != Hkv:
        return f"{Hq} query heads over {Hkv} key and {Hv} value heads"
    if Dk != D or Sv != Skv:
        return f"K {k} does not fit Q {q} and V {v}"
    pk, pv = _input(pn, 4), _input(pn, 5)
    if (pk is None) != (pv is None):
        return "past_key without past_value, or the reverse"
    P = pk.static_shape[2] if pk is not None and len(pk.static_shape) == 4 else 0
    if pk is not None and (tuple(pk.static_shape) != (B, Hkv, P, D) or tuple(pv.static_shape) != (B, Hkv, P, Dv)):
        return f"past_key {pk.static_shape} and past_value {pv.static_shape} are not [{B}, {Hkv}, past, {D} / {Dv}]"
    return _Heads(B, Hq, Hkv, Sq, Skv, P, D, Dv, len(q) == 3)


def _mask_walk(mask_shape, h: _Heads) -> tuple[int, int, int] | str:
    """The mask's strides along (batch, head, query row), or why it does not broadcast."""
    m = tuple(mask_shape)
    if not 1 <= len(m) <= 4:
        return f"attn_mask of rank {len(m)}"
    if m[-1] > h.keys:
        return f"attn_mask {m} has more than the {h.keys} keys"
    m = (1,) * (4 - len(m)) + m
    target = (h.B, h.Hq, h.Sq)
    if any(d not in (1, t) for d, t in zip(m[:3], target)):
        return f"attn_mask {tuple(mask_shape)} does not broadcast to {target + (m[3],)}"
    return tuple(0 if d == 1 and t != 1 else s for d, t, s in zip(m[:3], target, strides(m)[:3]))


def _softmax_wide(pn) -> bool | str:
    """Whether the softmax runs in float64 on a float32 input; or why C cannot run it as asked."""
    p = pn.kwargs.get("softmax_precision")
    if p is None:
        return False
    if int(p) not in SOFTMAX_PRECISION:
        return f"softmax_precision {int(p)} (C computes the softmax in float32 or float64)"
    return SOFTMAX_PRECISION[int(p)].itemsize > pn.inputs[0].dtype.itemsize


def _check_attention(pn):
    h = _heads(pn)
    if isinstance(h, str):
        return h
    dt = pn.inputs[0].dtype
    for i in (1, 2, 4, 5):
        v = _input(pn, i)
        if v is not None and v.dtype != dt:
            return f"input {v.name!r} is {v.dtype}, Q {dt}"
    mask = _input(pn, 3)
    if mask is not None:
        if mask.dtype not in (dt, BOOL):
            return f"attn_mask of dtype {mask.dtype} (C takes bool or Q's {dt})"
        walk = _mask_walk(mask.static_shape, h)
        if isinstance(walk, str):
            return walk
    nonpad = _input(pn, 6)
    if nonpad is not None and (nonpad.dtype != INT64 or tuple(nonpad.static_shape) != (h.B,)):
        return f"nonpad_kv_seqlen is {nonpad.dtype} {nonpad.static_shape}, not int64 [{h.B}]"
    wide = _softmax_wide(pn)
    if isinstance(wide, str):
        return wide
    mode = int(pn.kwargs.get("qk_matmul_output_mode") or 0)
    if _output(pn, 3) is not None and mode not in (0, 1, 2, 3):
        return f"qk_matmul_output_mode {mode}"
    y = (h.B, h.Sq, h.Hq * h.Dv) if h.packed else (h.B, h.Hq, h.Sq, h.Dv)
    want = {0: y, 1: (h.B, h.Hkv, h.keys, h.D), 2: (h.B, h.Hkv, h.keys, h.Dv), 3: (h.B, h.Hq, h.Sq, h.keys)}
    for i, shape in want.items():
        o = _output(pn, i)
        if o is None:
            continue
        if tuple(o.static_shape) != shape:
            return f"output {i} is typed {o.static_shape}, the kernel writes {shape}"
        if o.dtype != dt:
            return f"output {i} is {o.dtype}, Q {dt}"
    return None


def _kv_scratch(pn, h: _Heads) -> tuple[int, int]:
    """Bytes of scratch for the past and new keys, and for the values, where they have no present
    output to go to (0 without past keys: the products read K and V in place)."""
    if _input(pn, 4) is None:
        return 0, 0
    size = pn.inputs[0].dtype.itemsize
    k = 0 if _output(pn, 1) is not None else _a64(h.B * h.Hkv * h.keys * h.D * size)
    v = 0 if _output(pn, 2) is not None else _a64(h.B * h.Hkv * h.keys * h.Dv * size)
    return k, v


def _slots(h: _Heads) -> int:
    return max(1, min(h.items, SLOTS))


def _slot_bytes(h: _Heads, size: int) -> int:
    """lib/mt_attention.h's MT_ATT_SLOT."""
    return _a64(h.rows * h.keys * size) + _a64(h.rows * h.Dv * size) + _a64(2 * h.keys * 8)


def _attention_scratch(pn) -> int:
    h = _heads(pn)
    if isinstance(h, str):
        return 0
    return _slots(h) * _slot_bytes(h, pn.inputs[0].dtype.itemsize) + sum(_kv_scratch(pn, h))


@c_kernel("Attention", since=23, dtypes=FLOATS, check=_check_attention, scratch=_attention_scratch)
def attention(pn, c):
    h = _heads(pn)
    q, k, v, y = pn.inputs[0], pn.inputs[1], pn.inputs[2], pn.outputs[0]
    kw, T = pn.kwargs, c.ctype(y)
    mask, nonpad = _input(pn, 3), _input(pn, 6)
    mask_walk = _mask_walk(mask.static_shape, h) if mask is not None else (0, 0, 0)
    g = [h.B, h.Hq, h.Hkv, h.Sq, h.Skv, h.P, h.D, h.Dv,
         *h.walk(h.Hq, h.Sq, h.D), *h.walk(h.Hkv, h.Skv, h.D), *h.walk(h.Hkv, h.Skv, h.Dv), *h.walk(h.Hq, h.Sq, h.Dv),
         *mask_walk, mask.static_shape[-1] if mask is not None else 0,
         int(bool(kw.get("is_causal"))), int(kw.get("left_window_size", -1)), int(kw.get("right_window_size", -1)),
         int(_input(pn, 4) is not None), h.rows, _slots(h)]
    # past and new keys (values) go to present_key (present_value), else to scratch after the slots
    kv_bytes, at = _kv_scratch(pn, h), _slots(h) * _slot_bytes(h, y.dtype.itemsize)
    concat = []
    for out, size in zip((_output(pn, 1), _output(pn, 2)), kv_bytes):
        concat.append(c.buf(out) if out is not None else f"({T} *)({c.scratch} + {at})" if size else "0")
        at += size
    mf = c.buf(mask) if mask is not None and mask.dtype != BOOL else "0"
    mb = c.buf(mask) if mask is not None and mask.dtype == BOOL else "0"
    past = [c.buf(pn.inputs[i]) if _input(pn, i) is not None else "0" for i in (4, 5)]
    qk = c.buf(_output(pn, 3)) if _output(pn, 3) is not None else "0"
    scale = kw.get("scale")
    scale = 1 / math.sqrt(h.D) if scale is None else float(scale)
    c.line(f"mt_attention_{c.sfx(y)}({c.buf(q)}, {c.buf(k)}, {c.buf(v)}, {mf}, {mb}, {past[0]}, {past[1]}, "
           f"{c.buf(nonpad) if nonpad is not None else '0'}, {c.buf(y)}, {concat[0]}, {concat[1]}, {qk}, "
           f"{c.scratch}, {c.arr(g)}, {c.literal(scale, y.dtype)}, {c.literal(kw.get('softcap') or 0.0, y.dtype)}, "
           f"{int(kw.get('qk_matmul_output_mode') or 0)}, {int(_softmax_wide(pn) is True)});")


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding


@dataclass(frozen=True)
class _Rotary:
    B: int
    S: int
    H: int
    D: int
    rot: int
    walk: tuple[int, int, int]  # x's strides along (batch, position, head)


def _rotary(pn) -> _Rotary | str:
    x = tuple(pn.inputs[0].static_shape)
    if len(x) == 4:
        B, H, S, D = x
        walk = (H * S * D, D, S * D)
    elif len(x) == 3:
        H = int(pn.kwargs.get("num_heads") or 0)
        if H <= 0 or x[2] % H:
            return f"3-D input {x} without num_heads dividing its hidden size"
        (B, S, _), D = x, x[2] // H
        walk = (S * H * D, H * D, D)
    else:
        return f"input of rank {len(x)} (RotaryEmbedding takes 3-D or 4-D)"
    rot = int(pn.kwargs.get("rotary_embedding_dim") or 0) or D
    if rot % 2 or rot > D:
        return f"rotary_embedding_dim {rot} is odd or above the head size {D}"
    return _Rotary(B, S, H, D, rot, walk)


def _rotary_rows(pn, r: _Rotary) -> tuple[int, int] | str:
    """(the caches' rows, the batch step of the ids or caches: S, or 0 when one batch serves all),
    or why the caches and ids do not fit the input."""
    cos, sin, pos = pn.inputs[1], pn.inputs[2], _input(pn, 3)
    half = r.rot // 2
    if cos.static_shape != sin.static_shape:
        return f"cos_cache {cos.static_shape} and sin_cache {sin.static_shape} differ"
    shape = tuple(cos.static_shape)
    if pos is not None:
        if pos.dtype != INT64 or tuple(pos.static_shape) not in ((r.B, r.S), (1, r.S)):
            return f"position_ids is {pos.dtype} {pos.static_shape}, not int64 [{r.B} or 1, {r.S}]"
        if len(shape) != 2 or shape[1] != half:
            return f"cos_cache {shape} is not [positions, {half}]"
        return shape[0], r.S if pos.static_shape[0] == r.B else 0
    if shape not in ((r.B, r.S, half), (1, r.S, half)):
        return f"cos_cache {shape} without position_ids is not [{r.B} or 1, {r.S}, {half}]"
    return shape[0] * r.S, r.S if shape[0] == r.B else 0


def _check_rotary(pn):
    r = _rotary(pn)
    if isinstance(r, str):
        return r
    rows = _rotary_rows(pn, r)
    if isinstance(rows, str):
        return rows
    x, y = pn.inputs[0], pn.outputs[0]
    if any(v.dtype != x.dtype for v in (pn.inputs[1], pn.inputs[2], y)):
        return f"caches or output in another dtype than the input's {x.dtype}"
    if tuple(y.static_shape) != tuple(x.static_shape):
        return f"output is typed {y.static_shape}, the kernel writes {x.static_shape}"
    return None


@c_kernel("RotaryEmbedding", since=23, dtypes=FLOATS, check=_check_rotary)
def rotary_embedding(pn, c):
    r = _rotary(pn)
    rows, bstep = _rotary_rows(pn, r)
    x, y, pos = pn.inputs[0], pn.outputs[0], _input(pn, 3)
    sb, ss, sh = r.walk
    c.checked(f"mt_rotary_{c.sfx(y)}({c.buf(x)}, {c.buf(pn.inputs[1])}, {c.buf(pn.inputs[2])}, "
              f"{c.buf(pos) if pos is not None else '0'}, {c.buf(y)}, {r.B}, {r.S}, {r.H}, {r.D}, {r.rot}, {rows}, "
              f"{bstep}, {sb}, {ss}, {sh}, {int(bool(pn.kwargs.get('interleaved')))})",
              f"a position id is outside the caches' {rows} rows")
