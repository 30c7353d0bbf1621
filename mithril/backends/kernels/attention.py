"""Attention kernels: Attention, FlexAttention, RotaryEmbedding, SwiGLU, LinearAttention, CausalConvWithState."""

from __future__ import annotations

import math

import numpy
from onnx import helper

from ..registry import kernel

_LOW_PRECISION = frozenset({"float16", "bfloat16"})


def _work_dtype(dtype):
    # float16/bfloat16 elementwise math runs in float32 (as onnxruntime accumulates).
    return numpy.dtype(numpy.float32) if numpy.dtype(dtype).name in _LOW_PRECISION else numpy.dtype(dtype)


def _matmul(a, b, xp):
    # Accumulate low-precision matmuls in float32, then round back to the operand type.
    if a.dtype.name in _LOW_PRECISION:
        return xp.matmul(a.astype(numpy.float32), b.astype(numpy.float32)).astype(a.dtype)
    return xp.matmul(a, b)


def _sigmoid(x, xp):
    return 1 / (1 + xp.exp(-x))


def _split_heads(x, num_heads):
    # (B, S, H*D) -> (B, H, S, D)
    b, s, _ = x.shape
    return x.reshape(b, s, num_heads, -1).transpose(0, 2, 1, 3)


def repeat_kv(x, groups, xp):
    """Grouped-query attention's K or V with each head repeated ``groups`` times (axis 1), so query
    head h reads K/V head h // groups."""
    return x if groups == 1 else xp.repeat(x, groups, axis=1)


def _masked_softmax(scores, xp):
    """Softmax over the last axis; a row whose every score is -inf gives zeros, not NaN."""
    row_max = xp.max(scores, axis=-1, keepdims=True)
    empty = xp.isneginf(row_max)
    e = xp.exp(scores - xp.where(empty, 0, row_max))
    total = xp.sum(e, axis=-1, keepdims=True)
    return xp.where(empty, 0, e / xp.where(empty, 1, total))


# ---------------------------------------------------------------------------
# Attention (opset 23; 24 adds nonpad_kv_seqlen, 25 adds sliding windows).


def allowed_keys(q_len, total, offset, is_causal, nonpad, left, right, xp):
    """Boolean (B or 1, 1, Sq, T) mask of the keys each query may see, or None when all may."""
    if not (is_causal or left >= 0 or right >= 0 or nonpad is not None):
        return None
    i = numpy.arange(q_len)[:, None]
    j = numpy.arange(total)[None, :]
    # Absolute query position; the offset is per batch for an external (nonpad) cache.
    pos = i + (offset.reshape(-1, 1, 1, 1) if hasattr(offset, "reshape") else offset)
    allowed = xp.ones((1, 1, q_len, total), dtype=bool)
    if is_causal:
        allowed = allowed & (j <= pos)
    if left >= 0:
        allowed = allowed & (j >= pos - left)
    if right >= 0:
        allowed = allowed & (j <= pos + right)
    if nonpad is not None:
        allowed = allowed & (j < nonpad.reshape(-1, 1, 1, 1))
    return allowed


@kernel("Attention", since=23)
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal,
              kv_num_heads, q_num_heads, qk_matmul_output_mode, scale, softcap, softmax_precision,
              left_window_size=-1, right_window_size=-1, num_outputs, xp):
    out_dtype = q.dtype
    packed = q.ndim == 3
    if packed:
        q = _split_heads(q, q_num_heads)
        k = _split_heads(k, kv_num_heads)
        v = _split_heads(v, kv_num_heads)
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        k = xp.concatenate([past_key, k], axis=2)
        v = xp.concatenate([past_value, v], axis=2)
    present_key, present_value = k, v
    batch, q_heads, q_len, head_size = q.shape
    total = k.shape[2]
    # Each step runs in the input type, as the ONNX function body does: the suite's bfloat16
    # cases are only reproducible with that rounding (matmuls still accumulate in float32).
    work = numpy.dtype(out_dtype)
    if scale is None:
        scale = 1 / math.sqrt(head_size)
    # Q and K are each scaled by sqrt(scale) before the matmul, to keep the product in range.
    root = xp.asarray(math.sqrt(scale), dtype=work)
    groups = q_heads // k.shape[1]
    kt = xp.swapaxes(repeat_kv(k, groups, xp), -1, -2)
    qk = _matmul(q * root, kt * root, xp)
    capped = softcap * xp.tanh(qk / softcap) if softcap else qk

    bias = None
    if attn_mask is not None:
        if attn_mask.shape[-1] < total:
            # A short mask is padded with "not attended" up to the total sequence length.
            pad = [(0, 0)] * (attn_mask.ndim - 1) + [(0, total - attn_mask.shape[-1])]
            fill = False if attn_mask.dtype == numpy.bool_ else -numpy.inf
            attn_mask = xp.pad(attn_mask, pad, constant_values=fill)
        if attn_mask.dtype == numpy.bool_:
            bias = xp.where(attn_mask, xp.asarray(0, dtype=work), xp.asarray(-numpy.inf, dtype=work))
        else:
            bias = attn_mask.astype(work)
    nonpad = nonpad_kv_seqlen
    if past_key is not None:
        offset = past_len
    elif nonpad is not None:
        offset = nonpad - q_len
    else:
        offset = 0
    allowed = allowed_keys(q_len, total, offset, is_causal, nonpad, left_window_size, right_window_size, xp)
    if allowed is not None:
        frontier = xp.where(allowed, xp.asarray(0, dtype=work), xp.asarray(-numpy.inf, dtype=work))
        bias = frontier if bias is None else bias + frontier
    scores = capped if bias is None else capped + bias

    softmax_dtype = work
    if softmax_precision is not None:
        softmax_dtype = numpy.dtype(helper.tensor_dtype_to_np_dtype(softmax_precision))
    probs = _masked_softmax(scores.astype(softmax_dtype), xp).astype(work)
    y = _matmul(probs, repeat_kv(v, groups, xp), xp)
    if packed:
        y = y.transpose(0, 2, 1, 3).reshape(batch, q_len, -1)
    if num_outputs < 4:
        return (y, present_key, present_value)[:num_outputs]
    qk_output = (qk, capped, scores, probs)[qk_matmul_output_mode]
    return y, present_key, present_value, qk_output.astype(out_dtype)


@kernel("FlexAttention", since=1, domain="ai.onnx.preview", graph_attributes=("score_mod", "prob_mod"))
def flex_attention(q, k, v, *, scale, softmax_precision, score_mod=None, prob_mod=None, xp):
    out_dtype = q.dtype
    if softmax_precision is not None:
        work = numpy.dtype(helper.tensor_dtype_to_np_dtype(softmax_precision))
    else:
        work = numpy.dtype(numpy.float64 if out_dtype == numpy.float64 else numpy.float32)
    if scale is None:
        scale = 1 / math.sqrt(q.shape[-1])
    groups = q.shape[1] // k.shape[1]
    kt = xp.swapaxes(repeat_kv(k.astype(work), groups, xp), -1, -2)
    scores = xp.matmul(q.astype(work), kt) * xp.asarray(scale, dtype=work)
    if score_mod is not None:
        scores = score_mod(scores)[0]
    probs = _masked_softmax(scores, xp)
    if prob_mod is not None:
        probs = prob_mod(probs)[0]
    return xp.matmul(probs, repeat_kv(v.astype(work), groups, xp)).astype(out_dtype)


# ---------------------------------------------------------------------------
# RotaryEmbedding, SwiGLU.


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, num_heads, rotary_embedding_dim,
                     xp):
    shape = x.shape
    if x.ndim == 4:
        x = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    else:
        x = x.reshape(shape[0], shape[1], num_heads, -1)
    head_size = x.shape[-1]
    rot = rotary_embedding_dim or head_size
    if position_ids is not None:
        cos_cache = xp.take(cos_cache, position_ids, axis=0)
        sin_cache = xp.take(sin_cache, position_ids, axis=0)
    cos = cos_cache[:, :, None, :]
    sin = sin_cache[:, :, None, :]
    rotated, kept = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:
        x1, x2 = rotated[..., : rot // 2], rotated[..., rot // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = xp.stack([real, imag], axis=-1).reshape(rotated.shape)
    else:
        rotated = xp.concatenate([real, imag], axis=-1)
    y = xp.concatenate([rotated, kept], axis=-1).astype(x.dtype)
    return y.transpose(0, 2, 1, 3) if len(shape) == 4 else y.reshape(shape)


@kernel("SwiGLU", since=28)
def swiglu(a, b, *, alpha, xp):
    work = _work_dtype(a.dtype)
    a_ = a.astype(work)
    return (a_ * _sigmoid(alpha * a_, xp) * b.astype(work)).astype(a.dtype)


# ---------------------------------------------------------------------------
# LinearAttention, CausalConvWithState (recurrent-state ops for linear-attention / SSM models).


@kernel("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size, kv_num_heads,
                     q_num_heads, scale, update_rule, node, xp):
    # The recurrence runs token by token; chunk_size is a GPU tuning hint with no effect on results.
    out_dtype = query.dtype
    work = _work_dtype(out_dtype)
    batch, steps, _ = query.shape
    q = query.astype(work).reshape(batch, steps, q_num_heads, -1)
    k = key.astype(work).reshape(batch, steps, kv_num_heads, -1)
    v = value.astype(work).reshape(batch, steps, kv_num_heads, -1)
    dk, dv = q.shape[-1], v.shape[-1]
    if not scale:
        scale = 1 / math.sqrt(dk)
    groups = q_num_heads // kv_num_heads
    if past_state is None:
        state = xp.zeros((batch, kv_num_heads, dk, dv), dtype=work)
    else:
        state = past_state.astype(work)
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"unknown LinearAttention update_rule {update_rule!r}")
    if gated:
        # Per-key-dimension decay (B, T, H*dk) or per-head decay (B, T, H), as a (dk, 1) row factor.
        g = decay.astype(work)
        g = g.reshape(batch, steps, kv_num_heads, -1, 1) if g.shape[-1] != kv_num_heads else g[..., None, None]
        g = xp.exp(g)
    if delta:
        bt = beta.astype(work)
        bt = xp.broadcast_to(bt, (batch, steps, kv_num_heads))[..., None, None]
    outputs = []
    for t in range(steps):
        kt, vt = k[:, t][..., :, None], v[:, t][..., None, :]  # (B, H, dk, 1), (B, H, 1, dv)
        if gated:
            state = g[:, t] * state
        if delta:
            predicted = xp.sum(state * kt, axis=-2, keepdims=True)  # S^T k: (B, H, 1, dv)
            state = state + bt[:, t] * kt * (vt - predicted)
        else:
            state = state + kt * vt
        shared = repeat_kv(state, groups, xp)  # (B, Hq, dk, dv)
        outputs.append(scale * xp.sum(q[:, t][..., :, None] * shared, axis=-2))  # (B, Hq, dv)
    y = xp.stack(outputs, axis=1).reshape(batch, steps, q_num_heads * dv).astype(out_dtype)
    state_dtype = node.output_dtypes[1] if len(node.output_dtypes) > 1 and node.output_dtypes[1] is not None else None
    if state_dtype is None:
        state_dtype = past_state.dtype if past_state is not None else out_dtype
    return y, state.astype(state_dtype)


@kernel("CausalConvWithState", since=27)
def causal_conv_with_state(x, weight, bias=None, past_state=None, *, activation, xp):
    batch, channels, length = x.shape
    width = weight.shape[-1]
    work = _work_dtype(x.dtype)
    if past_state is None:
        past_state = xp.zeros((batch, channels, width - 1), dtype=x.dtype)
    padded = xp.concatenate([past_state.astype(work), x.astype(work)], axis=-1)
    w = weight.reshape(channels, width).astype(work)
    y = sum(padded[:, :, j : j + length] * w[None, :, j : j + 1] for j in range(width))
    if bias is not None:
        y = y + bias.astype(work)[None, :, None]
    if activation in ("silu", "swish"):
        y = y * _sigmoid(y, xp)
    elif activation != "none":
        raise ValueError(f"unknown CausalConvWithState activation {activation!r}")
    present = padded[:, :, padded.shape[-1] - (width - 1) :]
    return y.astype(x.dtype), present.astype(x.dtype)
