"""Attention in ggml: Attention (opset 23+, grouped heads, masks, caches), the preview
FlexAttention, RotaryEmbedding and LinearAttention. Moved from :mod:`.nn`; registered the same way
(the program imports every family module)."""

from __future__ import annotations

from math import prod

import numpy as np

from . import BOOL, F32, Builder, Stack, ggml_op
from .elementwise import operand
from .movement import permute
from .nn import row_max, as_text


def _attention_dims(pn):
    """(batch, q heads, kv heads, q length, total kv length) of an Attention node."""
    q, k = pn.inputs[0].static_shape, pn.inputs[1].static_shape
    if len(q) == 3:
        hq, hk = int(pn.kwargs.get("q_num_heads") or 0), int(pn.kwargs.get("kv_num_heads") or 0)
        s, t = q[1], k[1]
    else:
        hq, hk, s, t = q[1], k[1], q[2], k[2]
    past = pn.inputs[4] if len(pn.inputs) > 4 else None
    if past is not None:
        t += past.static_shape[2]
    return q[0], hq, hk, s, t


def _masked_softmax(g: Builder, scores):
    """Softmax over rows where an all-masked (-inf) row gives zeros: the max clamped finite,
    then 0 / (0 + 1)."""
    gg, ctx = g.ggml, g.ctx
    big = float(np.finfo(np.float32).max)
    top = g.clamp(row_max(g, scores), -big, big)
    e = gg.ggml_exp(ctx, gg.ggml_sub(ctx, scores, top))
    total = gg.ggml_sum_rows(ctx, e)
    empty = gg.ggml_scale_bias(ctx, gg.ggml_step(ctx, total), -1.0, 1.0)
    return gg.ggml_div(ctx, e, gg.ggml_add(ctx, total, empty))


def _check_flex(pn) -> str | None:
    q, k, v = (x.static_shape for x in pn.inputs[:3])
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[1] % k[1] or k[1] != v[1]:
        return "heads that are not 4-D or not grouped"
    if q[0] != k[0] or k[0] != v[0] or q[3] != k[3] or k[2] != v[2]:
        return "Q, K, V of inconsistent batch, lengths or head sizes"
    if pn.kwargs.get("softmax_precision") not in (None, 0, 1):
        return "softmax_precision other than float32"
    return None


@ggml_op("FlexAttention", domain="ai.onnx.preview", check=_check_flex)
def flex_attention(pn, g: Builder):
    """Without score_mod / prob_mod (a node with subgraphs is not ggml's): Attention's core."""
    gg, ctx = g.ggml, g.ctx
    q, k, v = (g.contiguous(operand(pn, i, g)) for i in range(3))
    scale = pn.kwargs.get("scale")
    scale = 1 / np.sqrt(pn.inputs[0].static_shape[-1]) if scale is None else float(scale)
    scores = gg.ggml_scale(ctx, gg.ggml_mul_mat(ctx, k, q), float(scale))
    return gg.ggml_mul_mat(ctx, permute(g, v, [0, 1, 3, 2]), _masked_softmax(g, scores))


def _heads4(shape, heads):
    """(B, H, S, D) of a 4-D attention input or of a 3-D (B, S, H*D) one."""
    if len(shape) == 4:
        return tuple(shape)
    return (shape[0], heads, shape[1], shape[2] // heads)


def _check_attention(pn) -> str | None:
    ins = list(pn.inputs) + [None] * (7 - len(pn.inputs))
    q, k, v, mask, past_k, past_v, nonpad = ins[:7]
    if nonpad is not None:
        return "nonpad_kv_seqlen (lengths known only at run time)"
    others = [x for i, x in enumerate(list(pn.inputs) + list(pn.outputs)) if x is not None and i != 3]
    if any(x.dtype == BOOL for x in others):
        return "a bool input other than the mask"
    if (past_k is None) != (past_v is None):
        return "past_key without past_value"
    if len(q.static_shape) != len(k.static_shape) or len(q.static_shape) not in (3, 4):
        return "Q, K of different ranks"
    if pn.kwargs.get("softmax_precision") not in (None, 0, 1):
        return "softmax_precision other than float32"
    b, hq, hk, s, t = _attention_dims(pn)
    if not hq or not hk or hq % hk:
        return "query heads not a multiple of the key/value heads"
    if len(q.static_shape) == 3 and (q.static_shape[2] % hq or k.static_shape[2] % hk or v.static_shape[2] % hk):
        return "hidden sizes not divisible by the head counts"
    qs, ks, vs = (_heads4(x.static_shape, h) for x, h in ((q, hq), (k, hk), (v, hk)))
    if qs[0] != ks[0] or ks[0] != vs[0] or qs[3] != ks[3] or ks[1:3] != vs[1:3]:
        return "Q, K, V of inconsistent batch, heads, lengths or head sizes"
    if past_k is not None:
        pk, pv = past_k.static_shape, past_v.static_shape
        if len(pk) != 4 or len(pv) != 4 or pk[:2] != ks[:2] or pv[:2] != vs[:2] or pk[3] != ks[3] \
                or pv[3] != vs[3] or pk[2] != pv[2]:
            return "past key/value shapes that do not extend K and V"
    if mask is not None:
        m = mask.static_shape
        full = (b, hq, s, t)
        if len(m) > 4 or m[-1] != t or any(d not in (1, f) for d, f in zip(reversed(m), reversed(full))):
            return f"an attention mask of shape {list(m)} (ggml: dims 1 or the scores')"
    if len(pn.outputs) > 3 and pn.outputs[3] is not None and int(pn.kwargs.get("qk_matmul_output_mode") or 0) > 3:
        return "qk_matmul_output_mode > 3"
    return None


@ggml_op("Attention", check=_check_attention, dtypes=(F32, BOOL))
def attention(pn, g: Builder):
    """``softmax(Q K^T * scale (+ softcap, mask)) V`` with two ``mul_mat`` (ggml broadcasts K/V
    heads over query heads as GQA does); the causal/window mask is a constant, and a row with
    every key masked gives zeros (the softmax is spelled out for that)."""
    from ...kernels.attention import allowed_keys

    gg, ctx, kw = g.ggml, g.ctx, pn.kwargs
    ins = list(pn.inputs) + [None] * (7 - len(pn.inputs))
    b, hq, hk, s, t = _attention_dims(pn)

    def heads(i, h):  # (B, S, H*D) -> (B, H, S, D); 4-D inputs as they are
        x = g.contiguous(operand(pn, i, g))
        shape = ins[i].static_shape
        if len(shape) == 4:
            return x
        return permute(g, g.reshape(x, (shape[0], shape[1], h, shape[2] // h)), [0, 2, 1, 3])

    q, k, v = heads(0, hq), heads(1, hk), heads(2, hk)
    past = ins[4] is not None
    if past:
        k = gg.ggml_concat(ctx, g.contiguous(operand(pn, 4, g)), k, 1)
        v = gg.ggml_concat(ctx, g.contiguous(operand(pn, 5, g)), v, 1)
    d = int(q.contents.ne[0])
    scale = kw.get("scale")
    scale = 1 / np.sqrt(d) if scale is None else float(scale)
    root = float(np.sqrt(scale))
    qk = gg.ggml_mul_mat(ctx, gg.ggml_scale(ctx, k, root), gg.ggml_scale(ctx, q, root))  # (B, Hq, S, T)
    softcap = float(kw.get("softcap") or 0.0)
    capped = gg.ggml_scale(ctx, gg.ggml_tanh(ctx, gg.ggml_scale(ctx, qk, 1 / softcap)), softcap) if softcap else qk
    scores = capped
    if ins[3] is not None:
        mask = g.contiguous(operand(pn, 3, g))
        if ins[3].dtype == BOOL:  # log(1) = 0 where a key is seen, log(0) = -inf where it is not
            mask = gg.ggml_log(ctx, mask)
        scores = gg.ggml_add(ctx, scores, mask)
    offset = ins[4].static_shape[2] if past else 0
    allowed = allowed_keys(s, t, offset, bool(kw.get("is_causal")), None, int(kw.get("left_window_size", -1)),
                           int(kw.get("right_window_size", -1)), np)
    if allowed is not None:
        scores = gg.ggml_add(ctx, scores, g.constant(np.where(allowed, 0.0, -np.inf).astype(np.float32)))
    probs = _masked_softmax(g, scores)
    y = gg.ggml_mul_mat(ctx, permute(g, v, [0, 1, 3, 2]), probs)  # V^T (B, Hk, Dv, T) -> (B, Hq, S, Dv)
    if len(ins[0].static_shape) == 3:
        y = permute(g, y, [0, 2, 1, 3])
    outs = [y, gg.ggml_cont(ctx, k), gg.ggml_cont(ctx, v)]
    if len(pn.outputs) > 3:
        outs.append(gg.ggml_cont(ctx, (qk, capped, scores, probs)[int(kw.get("qk_matmul_output_mode") or 0)]))
    return [o if v is not None else None for o, v in zip(outs, pn.outputs)]


def _check_rotary(pn) -> str | None:
    x = pn.inputs[0].static_shape
    if len(x) not in (3, 4):
        return f"a {len(x)}-D input"
    heads = x[1] if len(x) == 4 else int(pn.kwargs.get("num_heads") or 0)
    if not heads or (len(x) == 3 and x[2] % heads):
        return "num_heads missing or not dividing the hidden size"
    d = x[3] if len(x) == 4 else x[2] // heads
    rot = int(pn.kwargs.get("rotary_embedding_dim") or 0) or d
    if rot % 2 or rot > d:
        return f"rotary_embedding_dim {rot} for heads of {d}"
    has_pos = len(pn.inputs) > 3 and pn.inputs[3] is not None
    cache = pn.inputs[1].static_shape
    tokens = x[0] * (x[2] if len(x) == 4 else x[1])
    if cache[-1] != rot // 2 or (not has_pos and (len(cache) != 3 or prod(cache[:2]) != tokens)):
        return f"a cos/sin cache of shape {list(cache)}"
    if has_pos and len(cache) != 2:
        return "a cache of more than 2 dims with position ids"
    if has_pos and prod(pn.inputs[3].static_shape) != x[0] * (x[2] if len(x) == 4 else x[1]):
        return "position ids that are not one per token"
    if tuple(pn.inputs[2].static_shape) != tuple(cache):
        return "cos and sin caches of different shapes"
    return None


@ggml_op("RotaryEmbedding", check=_check_rotary, indices=(3,))
def rotary_embedding(pn, g: Builder):
    """In the (B, S, H, D) layout: the cos/sin rows for each position (``get_rows``), the pairs
    (halves, or even/odd elements seen as a dim of 2) rotated, the rest of each head kept."""
    gg, ctx = g.ggml, g.ctx
    xs = list(pn.inputs[0].static_shape)
    x = g.contiguous(operand(pn, 0, g))
    if len(xs) == 4:
        b, h, s, d = xs
        x = permute(g, x, [0, 2, 1, 3])
    else:
        b, s = xs[0], xs[1]
        h = int(pn.kwargs["num_heads"])
        d = xs[2] // h
        x = g.reshape(x, (b, s, h, d))
    x = g.contiguous(x)
    rot = int(pn.kwargs.get("rotary_embedding_dim") or 0) or d
    half = rot // 2

    def table(i):
        t = g.contiguous(operand(pn, i, g))
        if len(pn.inputs) > 3 and pn.inputs[3] is not None:
            rows = pn.inputs[i].static_shape[0]
            idx = gg.ggml_reshape_1d(ctx, g.index(pn.inputs[3], rows, pn), b * s)
            t = gg.ggml_get_rows(ctx, t, idx)
        return t

    f = 4  # bytes per float32
    if int(pn.kwargs.get("interleaved") or 0):
        # ne (2, D/2, H, S*B): element pairs along ggml dim 0.
        pairs = gg.ggml_reshape_4d(ctx, x, 2, d // 2, h, s * b)
        x1, x2 = (gg.ggml_cont(ctx, gg.ggml_view_4d(ctx, pairs, 1, half, h, s * b, 2 * f, d * f, h * d * f, o * f))
                  for o in (0, 1))
        cos, sin = (gg.ggml_reshape_4d(ctx, table(i), 1, half, 1, s * b) for i in (1, 2))
    else:
        x1, x2 = (gg.ggml_cont(ctx, gg.ggml_view_4d(ctx, x, half, h, s, b, d * f, h * d * f, s * h * d * f, o * f))
                  for o in (0, half))
        cos, sin = (gg.ggml_reshape_4d(ctx, table(i), half, 1, s, b) for i in (1, 2))
    real = gg.ggml_sub(ctx, gg.ggml_mul(ctx, x1, cos), gg.ggml_mul(ctx, x2, sin))
    imag = gg.ggml_add(ctx, gg.ggml_mul(ctx, x1, sin), gg.ggml_mul(ctx, x2, cos))
    y = gg.ggml_reshape_4d(ctx, gg.ggml_concat(ctx, real, imag, 0), rot, h, s, b)
    if rot < d:
        kept = gg.ggml_cont(ctx, gg.ggml_view_4d(ctx, x, d - rot, h, s, b, d * f, h * d * f, s * h * d * f, rot * f))
        y = gg.ggml_concat(ctx, y, kept, 0)
    if len(xs) == 4:
        return permute(g, y, [0, 2, 1, 3])
    return y


def _check_linear_attention(pn) -> str | None:
    k = pn.kwargs
    rule = as_text(k.get("update_rule") or "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        return f"update_rule {rule!r}"
    ins = list(pn.inputs) + [None] * (6 - len(pn.inputs))
    q, key, v = (x.static_shape for x in ins[:3])
    hq, hk = int(k.get("q_num_heads") or 0), int(k.get("kv_num_heads") or 0)
    if len(q) != 3 or not hq or not hk or hq % hk or q[2] % hq or key[2] % hk or v[2] % hk:
        return "heads not given or not dividing"
    b, t = q[:2]
    if "gated" in rule and (ins[4] is None or ins[4].static_shape not in ((b, t, key[2]), (b, t, hk))):
        return "a decay that is not (B, T, H*dk) or (B, T, H)"
    if "delta" in rule and (ins[5] is None or ins[5].static_shape not in ((b, t, hk), (b, t, 1))):
        return "a beta that is not (B, T, H) or (B, T, 1)"
    if key[:2] != (b, t) or v[:2] != (b, t) or q[2] // hq != key[2] // hk:
        return "Q, K, V of inconsistent batch, length or head size"
    if ins[3] is not None and tuple(ins[3].static_shape) != (b, hk, key[2] // hk, v[2] // hk):
        return "a past state that is not (B, H, dk, dv)"
    return None


@ggml_op("LinearAttention", check=_check_linear_attention)
def linear_attention(pn, g: Builder):
    """Unrolled token by token, the state kept transposed (B, H, dv, dk) so that both ``S^T k``
    and the output ``q S`` are ``mul_mat`` over dk (query heads grouped as ggml broadcasts)."""
    gg, ctx, kw = g.ggml, g.ctx, pn.kwargs
    ins = list(pn.inputs) + [None] * (6 - len(pn.inputs))
    rule = as_text(kw.get("update_rule") or "gated_delta")
    b, steps, _ = pn.inputs[0].static_shape
    hq, hk = int(kw["q_num_heads"]), int(kw["kv_num_heads"])
    dk, dv = pn.inputs[1].static_shape[2] // hk, pn.inputs[2].static_shape[2] // hk
    scale = float(kw.get("scale") or 0.0) or 1 / np.sqrt(dk)
    q, k, v = (g.contiguous(operand(pn, i, g)) for i in range(3))
    f = 4

    def step(x, t, heads, width, shape):  # token t of a (B, T, heads*width) input, as ggml ne ``shape``
        view = gg.ggml_view_4d(ctx, x, width, heads, 1, b, width * f, heads * width * f, steps * heads * width * f,
                               t * heads * width * f)
        return gg.ggml_reshape_4d(ctx, gg.ggml_cont(ctx, view), *shape)

    if ins[3] is not None:  # (B, H, dk, dv) -> ne (dk, dv, H, B)
        state = permute(g, g.contiguous(operand(pn, 3, g)), [0, 1, 3, 2])
    else:
        state = g.constant(np.zeros((b, hk, dv, dk), np.float32))
    decay = g.contiguous(operand(pn, 4, g)) if "gated" in rule else None
    beta = g.contiguous(operand(pn, 5, g)) if "delta" in rule else None
    outs = Stack(g, 1)  # ne (dv, T, Hq, B), stacked as the tokens are made (a few blocks alive, not T)
    for t in range(steps):
        kt = step(k, t, hk, dk, (dk, 1, hk, b))
        vt = step(v, t, hk, dv, (1, dv, hk, b))
        if decay is not None:
            per_key = decay.contents.ne[0] != hk
            gt = step(decay, t, hk, dk, (dk, 1, hk, b)) if per_key else step(decay, t, 1, hk, (1, 1, hk, b))
            state = gg.ggml_mul(ctx, state, gg.ggml_exp(ctx, gt))
        if beta is not None:
            nb = int(beta.contents.ne[0])
            bt = step(beta, t, 1, nb, (1, 1, nb, b))
            predicted = gg.ggml_reshape_4d(ctx, gg.ggml_mul_mat(ctx, state, kt), 1, dv, hk, b)  # S^T k
            update = gg.ggml_mul(ctx, gg.ggml_sub(ctx, vt, predicted), bt)
        else:
            update = vt
        state = gg.ggml_add(ctx, state, gg.ggml_mul(ctx, gg.ggml_repeat(ctx, kt, state), update))
        qt = step(q, t, hq, dk, (dk, 1, hq, b))
        outs.add(gg.ggml_scale(ctx, gg.ggml_mul_mat(ctx, state, qt), scale))  # (dv, 1, Hq, B)
    y = outs.result()
    y = permute(g, g.reshape(y, (b, hq, steps, dv)), [0, 2, 1, 3])
    result = [y]
    if len(pn.outputs) > 1:
        result.append(permute(g, g.reshape(state, (b, hk, dv, dk)), [0, 1, 3, 2]))
    return result
