"""Transformers: a GPT-2 style language model (``create_gpt``) and a small Vision Transformer."""

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
    MultiHeadAttention,
    Primitive,
    TransformerBlock,
    Transpose,
)
from mithril.frontend.model import In, Out

from .resnet import _ends


class _Positions(Primitive):
    """Positions 0..T-1 (int64, [T]) of a token batch [N, T]; T stays dynamic on export."""

    ports = {"input": In(["N", "T"], type=None), "output": Out(["T"], type=int)}

    def lower(self, g, input):
        length = g.op("Squeeze", g.op("Shape", input, start=1, end=2, dtype=np.int64), g.ints([0]))
        return g.op("Range", g.const(0, dtype=np.int64), length, g.const(1, dtype=np.int64), dtype=np.int64)


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
