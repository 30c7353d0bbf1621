"""Transformers: a GPT-2 style language model (``create_gpt``), its decode step with a key/value cache
(``create_gpt_decoder``, for ``ml.generate``) and a small Vision Transformer."""

from __future__ import annotations

import numpy as np

from mithril.models import (
    MLP,
    Add,
    Convolution2D,
    Embedding,
    Flatten,
    Gelu,
    IOKey,
    LayerNorm,
    Linear,
    Mean,
    Model,
    Multiply,
    MultiHeadAttention,
    Primitive,
    Softmax,
    Subtract,
    TransformerBlock,
    Transpose,
)
from mithril.frontend.model import In, Out


class _Positions(Primitive):
    """Positions 0..T-1 (int64, [T]) of a token batch [N, T]; T stays dynamic on export."""

    ports = {"input": In(["N", "T"], type=None), "output": Out(["T"], type=int)}

    def lower(self, g, input):
        length = g.op("Squeeze", g.op("Shape", input, start=1, end=2, dtype=np.int64), g.ints([0]))
        return g.op("Range", g.const(0, dtype=np.int64), length, g.const(1, dtype=np.int64), dtype=np.int64)


def _ends(i: int, count: int) -> dict:
    """Bindings of the i-th of ``count`` chained blocks: the first reads ``input``, the last writes ``output``."""
    return {**({"input": "input"} if i == 0 else {}), **({"output": "output"} if i == count - 1 else {})}


def create_gpt(bias: bool, block_size: int, dims: int, num_heads: int, num_layers: int, vocab_size: int,
               name: str | None = None) -> Model:
    """GPT-2: token (``wte``) plus learned position (``wpe``) embeddings, ``num_layers`` pre-LN
    causal transformer blocks (``h.0`` ...; tanh-approximated GELU), a final ``ln_f`` and an
    ``lm_head`` without bias. Input token ids [N, T] (int64, T <= block_size); output logits
    [N, T, vocab_size].

    >>> create_gpt(bias=True, block_size=16, dims=8, num_heads=2, num_layers=1, vocab_size=32).shape_of("output")
    '[N, T, 32]'
    """
    model = Model(name)
    tokens = IOKey("input", shape=["N", "T"], type=int)
    model |= Embedding(vocab_size, dims, name="wte")(input=tokens)
    model |= _Positions(name="positions")(input=tokens)
    model |= Embedding(block_size, dims, name="wpe")(input=model.positions.output)
    model |= Add(name="embed")(left=model.wte.output, right=model.wpe.output)
    blocks = Model(name="h")
    for i in range(num_layers):
        layer = TransformerBlock(dims, num_heads, bias=bias, gelu_approximate="tanh", name=str(i))
        blocks.extend(layer, chain=i > 0, **_ends(i, num_layers))
    model |= blocks(input=model.embed.output)
    model += LayerNorm(use_bias=bias, name="ln_f")
    model += Linear(vocab_size, use_bias=False, name="lm_head")(output="output")
    return model


class _CachedBlock(Model):
    """One decode step of a :class:`TransformerBlock` over fixed-size key/value caches, with
    TransformerBlock's parameter names. The new token's key and value are written into row p by
    arithmetic (``cache * keep + new * write``: static shapes, so every backend runs it), and the
    query attends over the whole cache with the additive ``mask`` hiding rows not written yet.

    Layouts that let attention read the caches in place: keys [N, heads, block_size, head]
    (scores = keys @ query), values transposed [N, heads, head, block_size] (output = values @
    probabilities), the query and the output as columns; ``write``/``keep`` ([block_size, head])
    and ``write_t``/``keep_t`` ([head, block_size]) have whole rows, so no product broadcasts a
    single column (which ggml computes value by value)."""

    def __init__(self, dims: int, num_heads: int, block_size: int, bias: bool, name: str | None = None):
        super().__init__(name)
        head = dims // num_heads
        self |= LayerNorm(use_bias=bias, name="ln_1")(input=IOKey("input", shape=[None, 1, dims]))
        attn = Model(name="attn")
        for proj in ("q_proj", "k_proj", "v_proj"):
            attn |= Linear(dims, use_bias=bias, name=proj)(input="input")
        shapes = {"k": [None, num_heads, block_size, head], "v": [None, num_heads, head, block_size]}
        news = {"k": attn.k_proj.output.reshape(0, num_heads, 1, head),  # [N, heads, 1, head]
                "v": attn.v_proj.output.reshape(0, num_heads, head, 1)}  # [N, heads, head, 1]
        for kv, suffix in (("k", ""), ("v", "_t")):
            attn |= Multiply(name=f"{kv}_keep")(left=IOKey(f"{kv}_cache", shape=shapes[kv]), right=f"keep{suffix}")
            attn |= Multiply(name=f"{kv}_new")(left=news[kv], right=f"write{suffix}")
            attn |= Add(name=f"{kv}_write")(left=getattr(attn, f"{kv}_keep").output,
                                            right=getattr(attn, f"{kv}_new").output,
                                            output=IOKey(f"{kv}_cache_next", expose=True))
        query = attn.q_proj.output.reshape(0, num_heads, head, 1) * float(1 / np.sqrt(head))  # columns
        scores = (attn.k_write.output @ query).reshape(0, num_heads, 1, block_size)  # [N, heads, 1, block_size]
        attn |= Add(name="masked")(left=scores, right=IOKey("mask", shape=[1, block_size], type=float))
        attn |= Softmax(axis=-1, name="probs")(input=attn.masked.output)
        weighted = attn.v_write.output @ attn.probs.output.reshape(0, num_heads, block_size, 1)  # [N, heads, head, 1]
        attn |= Linear(dims, use_bias=bias, name="out_proj")(input=weighted.reshape(0, 1, dims), output="output")
        self |= attn(input=self.ln_1.output, **{k: k for k in ("write", "keep", "write_t", "keep_t", "mask", "k_cache",
                                                               "v_cache", "k_cache_next", "v_cache_next")})
        self |= Add(name="residual_1")(left="input", right=self.attn.output)
        self |= LayerNorm(use_bias=bias, name="ln_2")(input=self.residual_1.output)
        self |= MLP([Gelu(approximate="tanh"), None], [4 * dims, dims], use_bias=bias, name="mlp")(
            input=self.ln_2.output)
        self |= Add(name="residual_2")(left=self.residual_1.output, right=self.mlp.output, output="output")


def create_gpt_decoder(bias: bool, block_size: int, dims: int, num_heads: int, num_layers: int, vocab_size: int,
                       name: str | None = None) -> Model:
    """One decode step of :func:`create_gpt` with fixed-size key/value caches, for
    :func:`mithril.generate`; its parameters are create_gpt's, by the same names.

    Inputs: ``input`` [N, 1] (int64, the token at position p); ``position`` [1] (int64, p);
    ``mask`` [1, block_size] (float: 0 for positions 0..p, a large negative number after);
    ``write`` [block_size, head] (float: ones in row p, zeros elsewhere; head = dims // num_heads);
    per layer i the caches ``k_cache_i`` [N, num_heads, block_size, head] and ``v_cache_i``
    [N, num_heads, head, block_size] (values transposed; zeros before the first step).
    Outputs: ``output`` logits [N, 1, vocab_size], equal to create_gpt's at position p, and
    ``k_cache_i_next``/``v_cache_i_next``, the caches with position p written, fed back as the
    next step's ``k_cache_i``/``v_cache_i``. Every shape is static, so GGML and C run it.

    >>> create_gpt_decoder(bias=True, block_size=16, dims=8, num_heads=2, num_layers=1, vocab_size=32).shape_of(
    ...     "v_cache_0_next")
    '[N, 2, 4, 16]'
    """
    if dims % num_heads:
        raise ValueError(f"create_gpt_decoder: dims {dims} do not divide into {num_heads} heads")
    head = dims // num_heads
    cache = {"k": ["N", num_heads, block_size, head], "v": ["N", num_heads, head, block_size]}
    model = Model(name)
    model |= Embedding(vocab_size, dims, name="wte")(input=IOKey("input", shape=["N", 1], type=int))
    model |= Embedding(block_size, dims, name="wpe")(input=IOKey("position", shape=[1], type=int))
    model |= Add(name="embed")(left=model.wte.output, right=model.wpe.output)
    # the write masks in both layouts, once for every layer
    model |= Subtract(name="keep")(left=1.0, right=IOKey("write", shape=[block_size, head], type=float))
    model |= Transpose(name="write_t")(input="write")
    model |= Transpose(name="keep_t")(input=model.keep.output)
    blocks = Model(name="h")
    for i in range(num_layers):
        layer = _CachedBlock(dims, num_heads, block_size, bias, name=str(i))
        blocks.extend(layer, chain=i > 0, mask="mask", write="write", keep="keep", write_t="write_t", keep_t="keep_t",
                      k_cache=f"k_cache_{i}", v_cache=f"v_cache_{i}", k_cache_next=f"k_cache_{i}_next",
                      v_cache_next=f"v_cache_{i}_next", **_ends(i, num_layers))
    caches = {f"{kv}_cache_{i}{end}": IOKey(f"{kv}_cache_{i}{end}", shape=cache[kv])
              for i in range(num_layers) for kv in "kv" for end in ("", "_next")}
    model |= blocks(input=model.embed.output, mask=IOKey("mask", shape=[1, block_size], type=float), write="write",
                    keep=model.keep.output, write_t=model.write_t.output, keep_t=model.keep_t.output, **caches)
    model += LayerNorm(use_bias=bias, name="ln_f")
    model += Linear(vocab_size, use_bias=False, name="lm_head")(output="output")
    return model


class EncoderBlock(Model):
    """A pre-LN transformer encoder block (bidirectional attention) over [N, L, dims]:
    ``h = input + attn(ln_1(input))``, ``output = h + mlp(ln_2(h))``."""

    def __init__(self, dims: int, num_heads: int, mlp_ratio: int = 4, name: str | None = None):
        super().__init__(name)
        self |= LayerNorm(name="ln_1")(input=IOKey("input", shape=[None, None, dims]))
        self |= MultiHeadAttention(dims, num_heads, name="attn")(input=self.ln_1.output)
        self |= Add(name="residual_1")(left="input", right=self.attn.output)
        self |= LayerNorm(name="ln_2")(input=self.residual_1.output)
        self |= MLP([Gelu(), None], [mlp_ratio * dims, dims], name="mlp")(input=self.ln_2.output)
        self |= Add(name="residual_2")(left=self.residual_1.output, right=self.mlp.output, output="output")


def vit(image_size: int = 32, patch_size: int = 8, channels: int = 3, dims: int = 64, num_heads: int = 4,
        num_layers: int = 2, num_classes: int = 10, name: str | None = None) -> Model:
    """A small Vision Transformer (Dosovitskiy et al., 2020): non-overlapping patches embedded by a
    strided convolution, learned position embeddings, ``num_layers`` encoder blocks, a final
    LayerNorm, mean pooling over patches (as in Beyer et al., 2022, instead of a class token) and a
    linear ``head``. Input [N, channels, image_size, image_size]; output [N, num_classes].

    >>> vit(image_size=16, patch_size=4, dims=8, num_heads=2, num_layers=1, num_classes=5).shape_of("output")
    '[N, 5]'
    """
    if image_size % patch_size:
        raise ValueError(f"vit: image_size {image_size} is not a multiple of patch_size {patch_size}")
    patches = (image_size // patch_size) ** 2
    model = Model(name)
    model |= Convolution2D(patch_size, dims, stride=patch_size, name="patch_embed")(
        input=IOKey("input", shape=["N", channels, image_size, image_size]))
    model += Flatten(start_dim=2)
    model += Transpose(axes=(0, 2, 1), name="tokens")
    model |= Embedding(patches, dims, name="pos_embed")(input=np.arange(patches, dtype=np.int64))
    model |= Add(name="embed")(left=model.tokens.output, right=model.pos_embed.output)
    for i in range(num_layers):
        model += EncoderBlock(dims, num_heads, name=f"block{i}")
    model += LayerNorm(name="ln")
    model += Mean(axis=1, name="pool")
    model += Linear(num_classes, name="head")(output="output")
    return model
