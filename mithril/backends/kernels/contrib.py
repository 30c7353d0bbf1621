"""onnxruntime's own dialect: the com.microsoft contrib ops its graph optimizations and its
transformer optimizer write (fused convolutions and GEMMs, GELU variants, skip/embed layer norms,
multi-head and group-query attention, rotary embeddings, 2/4/8-bit block-quantized MatMulNBits), the
two it registers in the ONNX domain (SimplifiedLayerNormalization, and LayerNormalization before
opset 17), and the com.microsoft.nchwc layout ops ORT_ENABLE_ALL writes on x86.

Semantics follow onnxruntime's contrib-op documentation and its CPU kernels; each kernel reuses the
standard op's helper (convolution, Gemm, layer norm, softmax, rotary embedding) for the shared part.
The quantized-activation contrib ops (QLinear*, QAttention, DynamicQuantize*) live in contrib_quantize.py.
"""

from __future__ import annotations

import functools
import math

import numpy

from ...dtypes import np_dtype_of_onnx
from ...errors import UnsupportedAttributeError
from ..registry import kernel
from . import attention as _attention
from . import elementwise as _elementwise
from . import normalization as _normalization

MS = "com.microsoft"


def _unsupported(node, message: str) -> UnsupportedAttributeError:
    return UnsupportedAttributeError(message, node=node.name, op_type=node.op_type, opset=node.opset)


# A fused op runs the standard ops it fuses through ``standard`` (registry.StandardKernels): the
# kernels the plan resolved on its backend (XLA's or torch's convolution where the backend overrides
# Conv) at the model's ai.onnx opset, so it runs as fast as those ops; ``ctx`` passes on the
# backend's options for them.


def _work(dtype):
    # float16/bfloat16 statistics and softmaxes run in float32, as onnxruntime's CPU kernels do.
    return numpy.dtype(numpy.float32) if numpy.dtype(dtype).name in ("float16", "bfloat16") else numpy.dtype(dtype)


# ---------------------------------------------------------------------------------------------
# Activations fused into FusedConv / FusedGemm (onnxruntime's MLAS activation kinds and functors)


# activation -> its attributes and their defaults (onnxruntime's functors' defaults)
_ACTIVATIONS = {
    "Relu": {}, "Tanh": {}, "Sigmoid": {},
    "LeakyRelu": {"alpha": 0.01},
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5},
    "Elu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "ThresholdedRelu": {"alpha": 1.0},
    "Clip": {"min": -numpy.inf, "max": numpy.inf},
}


def _activate(y, activation, params: dict, node, standard, xp, ctx):
    """``activation`` applied to y; ``params`` holds the activation's own attributes by ONNX name."""
    if activation is None or activation == "" or activation == "Identity":
        return y
    if activation not in _ACTIVATIONS:
        raise _unsupported(node, f"activation {activation!r} is not implemented (one of {sorted(_ACTIVATIONS)})")
    attrs = {k: default if params.get(k) is None else params[k] for k, default in _ACTIVATIONS[activation].items()}
    if activation == "Clip":
        return xp.clip(y, attrs["min"], attrs["max"]).astype(y.dtype)
    return standard(activation, y, xp=xp, ctx=ctx, **attrs)


# FusedConv's activation_params are positional: LeakyRelu [alpha], Clip [min, max], HardSigmoid [alpha, beta].
_ACTIVATION_OPS = tuple(op for op in _ACTIVATIONS if op != "Clip")  # Clip runs as xp.clip
_CONV_ACTIVATION_PARAMS = {"LeakyRelu": ("alpha",), "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta")}


@kernel("FusedConv", domain=MS, standard_ops=("Conv", *_ACTIVATION_OPS))
def fused_conv(X, W, B=None, Z=None, *, activation, activation_params, auto_pad, dilations, group, kernel_shape,
               pads, strides, node, standard, xp, ctx=None):
    y = standard("Conv", X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                 pads=pads, strides=strides, xp=xp, ctx=ctx)
    if Z is not None:
        # The residual input is added before the activation (Conv + Add + Relu fusion).
        y = y + Z
    names = _CONV_ACTIVATION_PARAMS.get(activation, ())
    params = dict(zip(names, activation_params or ()))
    return _activate(y, activation, params, node, standard, xp, ctx)


@kernel("FusedGemm", domain=MS, standard_ops=("Gemm", *_ACTIVATION_OPS))
def fused_gemm(A, B, C=None, *, alpha, beta, transA, transB, activation, activation_alpha, activation_beta,
               activation_gamma, node, standard, xp, ctx=None):
    y = standard("Gemm", A, B, C, alpha=alpha, beta=beta, transA=transA, transB=transB, xp=xp, ctx=ctx)
    params = {"alpha": activation_alpha, "beta": activation_beta, "gamma": activation_gamma}
    return _activate(y, activation, params, node, standard, xp, ctx)


def _batch_transposed(x, xp):
    # transBatch: the first axis moves behind the batch axes, (D0, D1, ..., Dn-2, Dn-1) -> (D1, ..., Dn-2, D0, Dn-1).
    if x.ndim < 3:
        return x
    return xp.transpose(x, tuple(range(1, x.ndim - 1)) + (0, x.ndim - 1))


@kernel("FusedMatMul", domain=MS, standard_ops=("MatMul",))
def fused_matmul(A, B, *, alpha, transA, transB, transBatchA, transBatchB, standard, xp, ctx=None):
    if transBatchA:
        A = _batch_transposed(A, xp)
    if transBatchB:
        B = _batch_transposed(B, xp)
    if transA and A.ndim >= 2:
        A = xp.swapaxes(A, -1, -2)
    if transB and B.ndim >= 2:
        B = xp.swapaxes(B, -1, -2)
    y = standard("MatMul", A, B, xp=xp, ctx=ctx)
    return y if alpha == 1 else (y * alpha).astype(y.dtype)


# ---------------------------------------------------------------------------------------------
# GELU family, BiasAdd, BiasSoftmax


@kernel("Gelu", domain=MS, standard_ops=("Gelu",))
def gelu(X, *, standard, xp, ctx=None):
    return standard("Gelu", X, approximate="none", xp=xp, ctx=ctx)


@kernel("BiasGelu", domain=MS, standard_ops=("Gelu",))
def bias_gelu(A, B, *, standard, xp, ctx=None):
    return standard("Gelu", A + B, approximate="none", xp=xp, ctx=ctx)


@kernel("FastGelu", domain=MS, standard_ops=("Gelu",))
def fast_gelu(X, bias=None, *, standard, xp, ctx=None):
    # 0.5 x (1 + tanh(0.797885 x + 0.035677 x^3)) is the tanh approximation, sqrt(2/pi) (x + 0.044715 x^3).
    return standard("Gelu", X if bias is None else X + bias, approximate="tanh", xp=xp, ctx=ctx)


@kernel("QuickGelu", since=1, domain=MS)
def quick_gelu(X, *, alpha, xp):
    return _elementwise.swish(X, alpha=alpha, xp=xp)


@kernel("BiasAdd", since=1, domain=MS)
def bias_add(X, bias, skip, *, xp):
    return X + bias + skip


@kernel("BiasSoftmax", since=1, domain=MS)
def bias_softmax(data, bias, *, axis, is_inner_broadcast, xp):
    # The bias broadcasts as NumPy does once it has the data's rank: an inner broadcast (the bias
    # lacks the axes between the batch and `axis`) lines up on the leading axes, an outer one on the
    # trailing axes.
    if bias.ndim < data.ndim:
        if is_inner_broadcast:
            bias = xp.reshape(bias, bias.shape[:1] + (1,) * (data.ndim - bias.ndim) + bias.shape[1:])
        else:
            bias = xp.reshape(bias, (1,) * (data.ndim - bias.ndim) + bias.shape)
    x = data + bias
    axis = axis + x.ndim if axis < 0 else axis
    work = _work(x.dtype)
    flat = xp.reshape(x.astype(work), x.shape[:axis] + (-1,))
    e = xp.exp(flat - xp.max(flat, axis=-1, keepdims=True))
    return xp.reshape(e / xp.sum(e, axis=-1, keepdims=True), x.shape).astype(data.dtype)


# ---------------------------------------------------------------------------------------------
# Layer norms: statistics over the last axis (or [axis, rank)), in float32 for half types.


def _layer_norm_stats(x, axes, epsilon, simplified, xp):
    """(normalized x, mean or None, inverse standard deviation), statistics keeping their axes."""
    if simplified:
        inv_std = 1 / xp.sqrt(xp.mean(x * x, axis=axes, keepdims=True) + epsilon)
        return x * inv_std, None, inv_std
    mean, var = _normalization.moments(x, axes, xp)
    inv_std = 1 / xp.sqrt(var + epsilon)
    return (x - mean) * inv_std, mean, inv_std


def _skip_layer_norm(x, skip, gamma, beta, bias, epsilon, simplified, num_outputs, xp):
    total = x + skip
    if bias is not None:
        total = total + bias
    work = _work(x.dtype)
    normalized, mean, inv_std = _layer_norm_stats(total.astype(work), (-1,), epsilon, simplified, xp)
    y = normalized * gamma.astype(work)
    if beta is not None:
        y = y + beta.astype(work)
    if num_outputs == 1:
        return y.astype(x.dtype)
    # Mean and inverse standard deviation are float32 (the stash type), one per row; an RMS norm has
    # no mean and writes zeros there.
    if mean is None:
        mean = xp.zeros(inv_std.shape, dtype=work)
    return y.astype(x.dtype), mean.astype(numpy.float32), inv_std.astype(numpy.float32), total


@kernel("SkipLayerNormalization", since=1, domain=MS)
def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, *, epsilon, num_outputs, xp):  # noqa: A002
    return _skip_layer_norm(input, skip, gamma, beta, bias, epsilon, False, num_outputs, xp)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS)
def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon, num_outputs, xp):  # noqa: A002
    return _skip_layer_norm(input, skip, gamma, None, bias, epsilon, True, num_outputs, xp)


# onnxruntime registers SimplifiedLayerNormalization (RMS norm) in the ONNX domain, from version 1.
@kernel("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(X, scale, *, axis, epsilon, stash_type, num_outputs, xp):
    axis = axis + X.ndim if axis < 0 else axis
    xs = X.astype(np_dtype_of_onnx(stash_type))
    normalized, _, inv_std = _layer_norm_stats(xs, tuple(range(axis, X.ndim)), epsilon, True, xp)
    y = normalized.astype(X.dtype) * scale
    return y if num_outputs == 1 else (y, inv_std)


# onnxruntime's LayerNormFusion writes ONNX-domain LayerNormalization whatever the opset; onnxruntime
# registers it from version 1 with the attributes and outputs of version 17.
kernel("LayerNormalization", since=1)(_normalization.layer_normalization)


# ---------------------------------------------------------------------------------------------
# EmbedLayerNormalization (BERT's embeddings + layer norm + mask length)


@kernel("EmbedLayerNormalization", since=1, domain=MS)
def embed_layer_normalization(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding=None,
                              gamma=None, beta=None, mask=None, position_ids=None, *, epsilon, mask_index_type,
                              num_outputs, xp):
    batch, seq = input_ids.shape
    embedding = xp.take(word_embedding, input_ids.astype(numpy.int32), axis=0)
    if position_ids is None:
        positions = xp.take(position_embedding, xp.arange(seq, dtype=numpy.int32), axis=0)[None]
    else:
        positions = xp.take(position_embedding, position_ids.astype(numpy.int32), axis=0)
    embedding = embedding + positions
    if segment_ids is not None and segment_embedding is not None:
        embedding = embedding + xp.take(segment_embedding, segment_ids.astype(numpy.int32), axis=0)
    work = _work(embedding.dtype)
    normalized, _, _ = _layer_norm_stats(embedding.astype(work), (-1,), epsilon, False, xp)
    y = (normalized * gamma.astype(work) + beta.astype(work)).astype(embedding.dtype)
    if num_outputs == 1:
        return y
    # mask_index: the number of attended tokens per sequence (0 without a mask).
    if mask is None:
        mask_index = xp.zeros((batch,), dtype=numpy.int32)
    else:
        mask_index = xp.sum((mask != 0).astype(numpy.int32), axis=-1).astype(numpy.int32)
    return y, mask_index, embedding


# ---------------------------------------------------------------------------------------------
# Attention (packed QKV projection) and MultiHeadAttention


def _heads(x, num_heads):
    # (B, S, N*H) -> (B, N, S, H)
    b, s, _ = x.shape
    return x.reshape(b, s, num_heads, -1).transpose(0, 2, 1, 3)


def _key_mask(mask, batch, q_len, total, xp):
    """A boolean (B, 1, S or 1, T) mask of the keys each query may see, from onnxruntime's mask
    formats: end positions (B), end and start positions (2B), a raw (B, T) or (B, S, T) 0/1 mask."""
    if mask.ndim == 1:
        j = xp.arange(total, dtype=numpy.int32)[None, :]
        ends = mask[:batch].astype(numpy.int32)[:, None]
        allowed = j < ends
        if mask.shape[0] == 2 * batch:
            allowed = allowed & (j >= mask[batch:].astype(numpy.int32)[:, None])
        return allowed[:, None, None, :]
    if mask.ndim == 2:
        return (mask != 0)[:, None, None, :]
    return (mask != 0)[:, None, :, :]


def _check_mask(mask, batch, node):
    if mask is None:
        return
    if mask.ndim == 4 or (mask.ndim == 1 and mask.shape[0] not in (batch, 2 * batch)):
        raise _unsupported(node, f"mask of shape {tuple(mask.shape)} (Megatron 4D or (3B+2) cumulative) "
                                 "is not implemented")


def _scaled_dot_product(q, k, v, *, mask, attention_bias, causal, scale, mask_filter_value, xp):
    """softmax(scale * q k' + attention_bias + mask) v on (B, N, S, H) heads; also returns the
    pre-softmax scores. Padding adds ``mask_filter_value`` (not -inf), as onnxruntime fills it."""
    batch, _, q_len, head_size = q.shape
    total = k.shape[2]
    out_dtype = q.dtype
    work = _work(out_dtype)
    if scale is None or scale == 0:
        scale = 1 / math.sqrt(head_size)
    scores = xp.matmul(q.astype(work), xp.swapaxes(k.astype(work), -1, -2)) * xp.asarray(scale, dtype=work)
    if attention_bias is not None:
        scores = scores + attention_bias.astype(work)
    if mask is not None:
        fill = -10000.0 if mask_filter_value is None else mask_filter_value
        allowed = _key_mask(mask, batch, q_len, total, xp)
        scores = scores + xp.where(allowed, xp.asarray(0, dtype=work), xp.asarray(fill, dtype=work))
    if causal and q_len > 1:
        # Future keys read the lowest float, whatever mask_filter_value is (onnxruntime's causal mask).
        i = numpy.arange(q_len)[:, None] + (total - q_len)
        frontier = xp.asarray(numpy.arange(total)[None, :] <= i)[None, None]
        scores = xp.where(frontier, scores, xp.asarray(numpy.finfo(work).min, dtype=work))
    e = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
    probs = e / xp.sum(e, axis=-1, keepdims=True)
    y = xp.matmul(probs, v.astype(work))
    return y.astype(out_dtype), scores.astype(out_dtype)


def _merge_heads(y):
    b, n, s, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * h)


@kernel("Attention", domain=MS, standard_ops=("MatMul",))
def contrib_attention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,  # noqa: A002
                      past_sequence_length=None, *, num_heads, qkv_hidden_sizes, scale, mask_filter_value,
                      unidirectional, do_rotary=None, past_present_share_buffer=None, rotary_embedding_dim=None,
                      num_outputs, node, standard, xp, ctx=None):
    if do_rotary:
        raise _unsupported(node, "do_rotary=1 is not implemented")
    if past_present_share_buffer:
        raise _unsupported(node, "past_present_share_buffer=1 (a preallocated KV cache) is not implemented")
    batch = input.shape[0]
    _check_mask(mask_index, batch, node)
    if qkv_hidden_sizes:
        q_size, k_size, _ = qkv_hidden_sizes
    else:
        q_size = k_size = weights.shape[1] // 3
    qkv = standard("MatMul", input, weights, xp=xp, ctx=ctx)
    if bias is not None:
        qkv = qkv + bias
    q = _heads(qkv[..., :q_size], num_heads)
    k = _heads(qkv[..., q_size : q_size + k_size], num_heads)
    v = _heads(qkv[..., q_size + k_size :], num_heads)
    if past is not None:
        k = xp.concatenate([past[0], k], axis=2)
        v = xp.concatenate([past[1], v], axis=2)
    y, _ = _scaled_dot_product(q, k, v, mask=mask_index, attention_bias=attention_bias, causal=unidirectional,
                               scale=scale, mask_filter_value=mask_filter_value, xp=xp)
    y = _merge_heads(y)
    if num_outputs == 1:
        return y
    return y, xp.stack([k, v], axis=0)


@kernel("MultiHeadAttention", since=1, domain=MS)
def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                         past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *,
                         num_heads, scale, mask_filter_value, unidirectional, num_outputs, node, xp):
    if cache_indirection is not None:
        raise _unsupported(node, "cache_indirection (beam search) is not implemented")
    batch = query.shape[0]
    _check_mask(key_padding_mask, batch, node)
    if key is None:
        # Packed QKV: (B, S, N, 3, H).
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        if bias is not None:
            hidden = q.shape[1] * q.shape[3]
            q, k, v = (t + bias[i * hidden : (i + 1) * hidden].reshape(1, num_heads, 1, -1)
                       for i, t in enumerate((q, k, v)))
    else:
        q_hidden = query.shape[-1]
        if bias is not None:
            query = query + bias[:q_hidden]
        q = _heads(query, num_heads)
        if value is None:
            # Packed KV: (B, L, N, 2, H).
            k, v = (key[:, :, :, i].transpose(0, 2, 1, 3) for i in range(2))
            if bias is not None:
                k = k + bias[q_hidden : 2 * q_hidden].reshape(1, num_heads, 1, -1)
                v = v + bias[2 * q_hidden :].reshape(1, num_heads, 1, -1)
        elif key.ndim == 4:
            # Key and value already projected into heads (B, N, L, H): cross-attention's cached K/V.
            k, v = key, value
        else:
            if bias is not None:
                key = key + bias[q_hidden : 2 * q_hidden]
                value = value + bias[2 * q_hidden :]
            k, v = _heads(key, num_heads), _heads(value, num_heads)
    if past_key is not None:
        k = xp.concatenate([past_key, k], axis=2)
        v = xp.concatenate([past_value, v], axis=2)
    y, scores = _scaled_dot_product(q, k, v, mask=key_padding_mask, attention_bias=attention_bias,
                                    causal=unidirectional, scale=scale, mask_filter_value=mask_filter_value, xp=xp)
    return (_merge_heads(y), k, v, scores)[:num_outputs] if num_outputs > 1 else _merge_heads(y)


# ---------------------------------------------------------------------------------------------
# Rotary embeddings


@kernel("RotaryEmbedding", since=1, domain=MS)
def contrib_rotary_embedding(input, position_ids, cos_cache, sin_cache, *, interleaved, num_heads,  # noqa: A002
                             rotary_embedding_dim, is_packed_batching=None, scale=None, node, xp):
    if is_packed_batching:
        raise _unsupported(node, "is_packed_batching=1 (ragged batches) is not implemented")
    if scale is not None and scale != 1.0:
        raise _unsupported(node, f"scale={scale} is not implemented")
    seq = input.shape[-2] if input.ndim == 4 else input.shape[1]
    if position_ids.ndim == 1 or (position_ids.ndim == 2 and position_ids.shape == (1, 1) and seq != 1):
        # A single value is the offset of the first token (the past sequence length).
        position_ids = xp.reshape(position_ids, (1, 1)) + xp.arange(seq, dtype=position_ids.dtype)[None, :]
    if input.ndim == 3 and not num_heads:
        num_heads = input.shape[-1] // (2 * cos_cache.shape[-1])
    return _attention.rotary_embedding(input, cos_cache, sin_cache, position_ids.astype(numpy.int32),
                                       interleaved=interleaved or 0, num_heads=num_heads,
                                       rotary_embedding_dim=rotary_embedding_dim or 0, xp=xp)


@kernel("GemmaRotaryEmbedding", since=1, domain=MS)
def gemma_rotary_embedding(emb, q, q_rot, k, k_rot, *, xp):
    sin = xp.expand_dims(xp.sin(emb).astype(q.dtype), 1)
    cos = xp.expand_dims(xp.cos(emb).astype(q.dtype), 1)
    return q * cos + q_rot * sin, k * cos + k_rot * sin


# ---------------------------------------------------------------------------------------------
# MatMulNBits: weights quantized in blocks of K, 2/4/8 bits packed low bits first.


def _unpack_bits(packed, bits: int, xp):
    """uint8 (..., n) holding 8/bits values per byte, lowest bits first -> int32 (..., n * 8/bits)."""
    wide = packed.astype(numpy.int32)
    per_byte = 8 // bits
    if per_byte == 1:
        return wide
    parts = [(wide // (1 << (bits * i))) % (1 << bits) for i in range(per_byte)]
    return xp.reshape(xp.stack(parts, axis=-1), packed.shape[:-1] + (packed.shape[-1] * per_byte,))


def _dequantize_nbits(B, scales, zero_points, g_idx, *, K, N, bits, block_size, dtype, xp):
    """The (N, K) float weight of MatMulNBits."""
    k_blocks = -(-K // block_size)
    q = _unpack_bits(xp.reshape(B, (N, -1)), bits, xp)[:, : k_blocks * block_size]  # (N, k_blocks * block)
    scales = xp.reshape(scales, (N, k_blocks)).astype(dtype)
    if zero_points is None:
        zero = xp.full((N, k_blocks), float(1 << (bits - 1)), dtype=dtype)
    elif numpy.dtype(zero_points.dtype) == numpy.uint8:
        zero = _unpack_bits(xp.reshape(zero_points, (N, -1)), bits, xp)[:, :k_blocks].astype(dtype)
    else:
        zero = xp.reshape(zero_points, (N, k_blocks)).astype(dtype)
    if g_idx is not None:
        # Act-order quantization: column k reads the scale and zero point of block g_idx[k].
        index = g_idx.astype(numpy.int32)[:K]
        return (q[:, :K].astype(dtype) - xp.take(zero, index, axis=1)) * xp.take(scales, index, axis=1)
    q = xp.reshape(q, (N, k_blocks, block_size)).astype(dtype)
    w = (q - zero[:, :, None]) * scales[:, :, None]
    return xp.reshape(w, (N, k_blocks * block_size))[:, :K]


@kernel("MatMulNBits", domain=MS, standard_ops=("MatMul",))
def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits, block_size,
                 accuracy_level=0, weight_prepacked=0, node, standard, xp, ctx=None):
    if bits not in (2, 4, 8):
        raise _unsupported(node, f"bits={bits} is not implemented (2, 4 or 8)")
    if weight_prepacked:
        raise _unsupported(node, f"weight_prepacked={weight_prepacked} (a CUDA layout) is not implemented")
    # accuracy_level only lets onnxruntime quantize A internally; the float result is the reference.
    work = _work(A.dtype)
    if 0 in B.shape:
        # An omitted projection: zeros, or the broadcast bias.
        y = xp.zeros(A.shape[:-1] + (N,), dtype=A.dtype)
        return y if bias is None else y + bias
    w = _dequantize_nbits(B, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size, dtype=work,
                          xp=xp)
    y = standard("MatMul", A.astype(work), xp.swapaxes(w, 0, 1), xp=xp, ctx=ctx)
    if bias is not None:
        y = y + bias.astype(work)
    return y.astype(A.dtype)


# ---------------------------------------------------------------------------------------------
# GroupQueryAttention (LLM decoders: shared K/V heads, a KV cache indexed by seqlens_k)


def _gqa_unsupported(node, **inputs_and_attrs):
    for name, value in inputs_and_attrs.items():
        if value is not None and value is not False and value not in ("NONE", 0):
            raise _unsupported(node, f"{name} (quantized KV cache, Q/K norm, padded chunks or a windowed cache) "
                                     "is not implemented")


def _softmax_with_sink(scores, allowed, sink, xp):
    """Softmax over the last axis of the allowed scores (the others get 0); ``sink`` (or None) is one more
    logit in every denominator, as a head sink or smooth softmax (sink 0) adds."""
    scores = xp.where(allowed, scores, xp.asarray(-numpy.inf, dtype=scores.dtype))
    row_max = xp.max(scores, axis=-1, keepdims=True)
    if sink is not None:
        row_max = xp.maximum(row_max, sink)
    e = xp.exp(scores - row_max)
    total = xp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        total = total + xp.exp(sink - row_max)
    return e / total


@kernel("GroupQueryAttention", since=1, domain=MS, static_inputs=(6,))
def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                          total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                          attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
                          k_norm_weight=None, query_seqlens=None, *, num_heads, kv_num_heads, scale, softcap,
                          local_window_size, do_rotary, rotary_interleaved, smooth_softmax, causal, qk_output,
                          k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=None, sliding_window_cache=0,
                          num_outputs, node, xp):
    _gqa_unsupported(node, k_scale=k_scale, v_scale=v_scale, k_quant_type=k_quant_type, v_quant_type=v_quant_type,
                     kv_cache_bit_width=kv_cache_bit_width, q_norm_weight=q_norm_weight,
                     k_norm_weight=k_norm_weight, query_seqlens=query_seqlens,
                     sliding_window_cache=sliding_window_cache)
    out_dtype = query.dtype
    work = _work(out_dtype)
    batch, seq = query.shape[:2]
    if key is None:
        # Packed QKV: (B, S, (N + 2 Nkv) H).
        head_size = query.shape[-1] // (num_heads + 2 * kv_num_heads)
        q_size, kv_size = num_heads * head_size, kv_num_heads * head_size
        query, key, value = (query[..., :q_size], query[..., q_size : q_size + kv_size],
                             query[..., q_size + kv_size :])
    q, k, v = _heads(query, num_heads), _heads(key, kv_num_heads), _heads(value, kv_num_heads)
    head_size = q.shape[-1]
    total = int(numpy.asarray(total_sequence_length).reshape(()))
    past_len = 0 if past_key is None else past_key.shape[2]
    # The first prompt fills the cache from 0; later steps append after seqlens_k + 1 - S cached tokens.
    prompt = seq == total
    present_len = max(total, past_len)
    lengths = seqlens_k.astype(numpy.int32) + 1  # (B,) tokens in the cache after this step
    start = xp.zeros_like(lengths) if prompt else lengths - seq  # (B,) where the new tokens go
    positions = start[:, None] + xp.arange(seq, dtype=numpy.int32)[None, :]  # (B, S) absolute positions
    if do_rotary:
        rot_positions = positions if position_ids is None else position_ids.astype(numpy.int32)
        rotate = functools.partial(_attention.rotary_embedding, cos_cache=cos_cache, sin_cache=sin_cache,
                                   position_ids=rot_positions, interleaved=rotary_interleaved or 0, num_heads=0,
                                   rotary_embedding_dim=cos_cache.shape[-1] * 2, xp=xp)
        q, k = rotate(q), rotate(k)

    # The cache after this step: past rows before `start`, the new rows at [start, start + S), zeros after.
    slots = xp.arange(present_len, dtype=numpy.int32)[None, :]  # (1, L)
    offset = slots - start[:, None]  # (B, L): which new row lands in each slot
    pick = (offset[:, :, None] == xp.arange(seq, dtype=numpy.int32)[None, None, :]).astype(k.dtype)  # (B, L, S)
    is_new = ((offset >= 0) & (offset < seq))[:, None, :, None]
    is_past = (slots < start[:, None])[:, None, :, None]

    def cache(past, new):
        placed = xp.matmul(pick[:, None], new)  # one-hot rows: exact copies
        if past is None:
            kept = xp.zeros(placed.shape, dtype=placed.dtype)
        else:
            kept = past if past_len == present_len else xp.pad(past, [(0, 0), (0, 0), (0, present_len - past_len),
                                                                      (0, 0)])
        zero = xp.zeros((), dtype=placed.dtype)
        return xp.where(is_new, placed, xp.where(is_past, kept, zero))

    present_key, present_value = cache(past_key, k), cache(past_value, v)
    groups = num_heads // kv_num_heads
    keys = _attention.repeat_kv(present_key, groups, xp).astype(work)
    values = _attention.repeat_kv(present_value, groups, xp).astype(work)
    if scale is None or scale == 0:
        scale = 1 / math.sqrt(head_size)
    scores = xp.matmul(q.astype(work), xp.swapaxes(keys, -1, -2)) * xp.asarray(scale, dtype=work)
    if softcap:
        scores = softcap * xp.tanh(scores / softcap)
    if attention_bias is not None:
        bias = attention_bias.astype(work)
        if bias.shape[-1] < present_len:
            bias = xp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, present_len - bias.shape[-1])])
        scores = scores + bias[..., :present_len]
    pos = positions[:, None, :, None]  # (B, 1, S, 1)
    allowed = slots[:, None, None, :] < lengths[:, None, None, None]
    if causal:
        allowed = allowed & (slots[:, None, None, :] <= pos)
        if local_window_size is not None and local_window_size > 0:
            allowed = allowed & (slots[:, None, None, :] > pos - local_window_size)
    sink = None
    if head_sink is not None:
        sink = head_sink.astype(work).reshape(1, -1, 1, 1)
    elif smooth_softmax == 1:
        sink = xp.zeros((), dtype=work)
    probs = _softmax_with_sink(scores, allowed, sink, xp)
    y = _merge_heads(xp.matmul(probs, values)).astype(out_dtype)
    outputs = (y, present_key, present_value)
    if num_outputs > 3:
        # Before softmax, the keys a query may not see read 0.
        qk = xp.where(allowed, scores, xp.zeros((), dtype=work)) if qk_output == 1 else probs
        outputs += (qk.astype(out_dtype),)
    return outputs[:num_outputs] if num_outputs > 1 else y


# ---------------------------------------------------------------------------------------------
# com.microsoft.nchwc: ORT_ENABLE_ALL's NCHWc layout on x86 (MLAS's channel-blocked convolutions).
#
# onnxruntime holds these tensors as (N, C/b, H, W, b) blocks of b channels; here they stay NCHW with
# the channels padded to a multiple of b, which every op between ReorderInput and ReorderOutput (Conv,
# pools, Sum/Add/Relu/Concat moved inside by the layout pass) computes the same. Only the filters,
# which the layout pass rewrote in place, must be read back in MLAS's block order.

NCHWC = "com.microsoft.nchwc"


def _nchwc_block(node) -> int:
    """MLAS's block: 16 channels where AVX-512F runs, else 8 (x86-64). The model does not record it;
    onnxruntime warns that such a model is for the machine that optimized it."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise _unsupported(node, f"NCHWc filters of an x86-64 optimized model on {platform.machine()}: "
                                 "the block size is unknown here")
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return 16 if features.get("AVX512F") else 8


def _nchwc_filter(R, block: int, blocked_input: bool):
    """The OIHW filter (output channels padded to the block) from MLAS's OIHWBo layout (NCHW input or
    depthwise: output channels blocked) or OIHWBiBo (blocked input: input then output channels blocked)."""
    o, i, kh, kw = R.shape
    if blocked_input:
        r = R.reshape(o // block, i // block, kh, kw, block, block)
        return r.transpose(0, 5, 1, 4, 2, 3).reshape(o, i, kh, kw)
    return R.reshape(o // block, i, kh, kw, block).transpose(0, 4, 1, 2, 3).reshape(o, i, kh, kw)


def _pad_channels(x, channels: int, xp):
    missing = channels - x.shape[1]
    return x if missing <= 0 else xp.pad(x, [(0, 0), (0, missing)] + [(0, 0)] * (x.ndim - 2))


@kernel("ReorderInput", since=1, domain=NCHWC)
def nchwc_reorder_input(X, *, channels_last, node, xp):
    if channels_last:
        X = xp.transpose(X, (0, X.ndim - 1) + tuple(range(1, X.ndim - 1)))
    block = _nchwc_block(node)
    return _pad_channels(X, -(-X.shape[1] // block) * block, xp)


@kernel("ReorderOutput", since=1, domain=NCHWC)
def nchwc_reorder_output(X, *, channels, channels_last, xp):
    y = X[:, :channels] if channels else X
    return xp.transpose(y, (0,) + tuple(range(2, y.ndim)) + (1,)) if channels_last else y


@kernel("Conv", domain=NCHWC, standard_ops=("Conv", *_ACTIVATION_OPS))
def nchwc_conv(X, W, B=None, Sum=None, *, activation, activation_params, auto_pad, dilations, group, kernel_shape,
               pads, strides, node, standard, xp, ctx=None):
    block = _nchwc_block(node)
    depthwise = group > 1
    if depthwise and W.shape[1] != 1:
        raise _unsupported(node, f"group={group} with {W.shape[1]} input channels per group is not an NCHWc layout")
    # A filter reading fewer channels than a block takes NCHW input (the first layer); the others read blocks.
    blocked_input = not depthwise and W.shape[1] >= block
    w = _nchwc_filter(W, block, blocked_input)
    channels = w.shape[0]
    if depthwise:
        group = channels  # the padding channels are groups of their own, with zero filters
    X = _pad_channels(X, w.shape[1] * group, xp)
    if B is not None and B.shape[0] < channels:
        B = xp.pad(B, [(0, channels - B.shape[0])])
    y = standard("Conv", X, w.astype(X.dtype), B, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides, xp=xp, ctx=ctx)
    if Sum is not None:
        y = y + Sum
    params = dict(zip(_CONV_ACTIVATION_PARAMS.get(activation, ()), activation_params or ()))
    return _activate(y, activation, params, node, standard, xp, ctx)


@kernel("MaxPool", domain=NCHWC, standard_ops=("MaxPool",))
def nchwc_max_pool(X, *, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides, standard, xp,
                   ctx=None):
    return standard("MaxPool", X, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations,
                    kernel_shape=kernel_shape, pads=pads, storage_order=storage_order, strides=strides, xp=xp, ctx=ctx)


@kernel("AveragePool", domain=NCHWC, standard_ops=("AveragePool",))
def nchwc_average_pool(X, *, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides,
                       standard, xp, ctx=None):
    return standard("AveragePool", X, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                    dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides, xp=xp, ctx=ctx)


@kernel("GlobalAveragePool", domain=NCHWC, standard_ops=("GlobalAveragePool",))
def nchwc_global_average_pool(X, *, standard, xp, ctx=None):
    return standard("GlobalAveragePool", X, xp=xp, ctx=ctx)


@kernel("GlobalMaxPool", domain=NCHWC, standard_ops=("GlobalMaxPool",))
def nchwc_global_max_pool(X, *, standard, xp, ctx=None):
    return standard("GlobalMaxPool", X, xp=xp, ctx=ctx)


# Resize-10 reads (X, scales) and has one mode: the call below is written for Resize-11's inputs and modes.
@kernel("Upsample", domain=NCHWC, standard_ops={"Resize": 11})
def nchwc_upsample(X, *, scales, mode, coordinate_transformation_mode, standard, xp, ctx=None):
    # Integer scales: nearest repeats each pixel (the floor of x / scale), linear interpolates as Resize does.
    return standard("Resize", X, None, numpy.asarray(scales, dtype=numpy.float32), None, mode=mode,
                    coordinate_transformation_mode=coordinate_transformation_mode, cubic_coeff_a=-0.75,
                    exclude_outside=0, extrapolation_value=0.0, nearest_mode="floor", xp=xp, ctx=ctx)
