"""CLIP (Radford et al., 2021) built from Mithril blocks, with OpenAI's constructor.

``clip(...)`` takes the arguments of OpenAI's ``CLIP`` class and builds one of its two image
towers: a tuple ``vision_layers`` is the "ModifiedResNet" (RN50 is ``(3, 4, 6, 3)``), an int with
``vision_patch_size > 0`` the Vision Transformer. The text tower is the same for both.

Parameters carry the names of OpenAI's ``state_dict`` (``visual.layer1.0.conv1.weight``,
``transformer.resblocks.0.ln_1.weight``, ``text_projection``, ``logit_scale``), except that each
attention's fused ``in_proj_weight`` is split into ``q_proj``, ``k_proj`` and ``v_proj``;
:mod:`examples.clip.weights` maps OpenAI and transformers checkpoints onto them.
"""

from __future__ import annotations

import math

import numpy as np

from mithril.errors import ModelError
from mithril.frontend.model import In, Out, Param
from mithril.models import (
    Add,
    AvgPool2D,
    BatchNorm2D,
    Concat,
    Convolution2D,
    Embedding,
    Exponential,
    Flatten,
    IOKey,
    LayerNorm,
    Linear,
    MatrixMultiply,
    Mean,
    Model,
    Multiply,
    MultiHeadAttention,
    Primitive,
    Relu,
    ScaledDotProduct,
    Transpose,
)

# -- the pieces no Mithril block provides --------------------------------------------------------
class QuickGelu(Primitive):
    """``input * sigmoid(1.702 * input)``: the GELU approximation CLIP was trained with."""

    ports = {"input": In(["..."]), "output": Out(["..."])}

    def lower(self, g, input):
        return g.op("Mul", input, g.op("Sigmoid", g.op("Mul", input, g.const(1.702, like=input))))


class Parameter(Primitive):
    """A learned tensor of a fixed ``shape`` as a block output (positional embeddings, projection
    matrices, the logit scale). ``init`` is how export fills it when no value is given: "normal",
    "zeros", "ones" or an array."""

    def __init__(self, shape, init="normal", name: str | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.init = init
        super().__init__(name)

    def port_specs(self):
        return {"weight": Param(self.shape, init=self.init), "output": Out(self.shape)}

    def attributes(self):
        return {"shape": self.shape}

    def lower(self, g, weight):
        return g.op("Identity", weight)


class PrependClassToken(Primitive):
    """``[class_embedding; input]`` along the sequence: input [N, L, D], class_embedding [D],
    output [N, L + 1, D]."""

    ports = {"input": In(["N", "L", "D"]), "class_embedding": Param(["D"]), "output": Out(["N", None, "D"])}

    def infer(self, s):
        length = s["input"][1].root().value
        if length is not None:
            s.set("output", [s["input"][0], length + 1, s["input"][2]])

    def lower(self, g, input, class_embedding):
        token = g.op("Reshape", class_embedding, g.ints([1, 1, -1]))
        shape = g.op("Concat", g.op("Shape", input, end=1, dtype=np.int64), g.ints([1]),
                     g.op("Shape", input, start=2, dtype=np.int64), axis=0)
        return g.op("Concat", g.op("Expand", token, shape), input, axis=1)


class EotPool(Primitive):
    """The features at each sequence's end-of-text token: ``input[m, argmax(text[m]), :]``.
    CLIP's tokenizer gives EOT the largest id, so the argmax of the ids finds it (the first
    one where several tie). input [M, L, D], text [M, L] (int), output [M, D]."""

    ports = {"input": In(["M", "L", "D"]), "text": In(["M", "L"], type=int), "output": Out(["M", "D"])}

    def lower(self, g, input, text):
        eot = g.op("ArgMax", text, axis=-1, keepdims=1, dtype=np.int64)  # [M, 1]
        # GatherElements (it has a gradient rule) reads [M, 1, D] indices: the EOT position on every channel.
        shape = g.op("Concat", g.op("Shape", eot, dtype=np.int64), g.op("Shape", input, start=2, dtype=np.int64),
                     axis=0)
        index = g.op("Expand", g.op("Unsqueeze", eot, g.ints([2])), shape)
        return g.op("Squeeze", g.op("GatherElements", input, index, axis=1), g.ints([1]))


class L2Normalize(Primitive):
    """``input / ||input||`` over the last dim."""

    ports = {"input": In(["...", "d"]), "output": Out(["...", "d"])}

    def lower(self, g, input):
        return g.op("Div", input, g.reduce("ReduceL2", input, [-1], True))


def _learned(model: Model, name: str, shape, init="normal"):
    """Add a :class:`Parameter` whose value is named ``name`` in ``model``; its output connection."""
    model |= Parameter(shape, init=init, name=name)(weight=IOKey(name))
    return getattr(model, name).output


def _ends(i: int, count: int) -> dict:
    """Bindings of the i-th of ``count`` chained blocks: the first reads ``input``, the last writes ``output``."""
    return {**({"input": "input"} if i == 0 else {}), **({"output": "output"} if i == count - 1 else {})}


# -- the transformer both towers use -------------------------------------------------------------
class ResidualAttentionBlock(Model):
    """A pre-LN transformer block over [N, L, width]: ``h = input + attn(ln_1(input))``,
    ``output = h + mlp(ln_2(h))`` with ``mlp`` = ``c_fc`` (4 * width), QuickGELU, ``c_proj``.
    ``causal`` masks attention to earlier positions (the text tower)."""

    def __init__(self, width: int, heads: int, causal: bool, name: str | None = None):
        super().__init__(name)
        self |= LayerNorm(name="ln_1")(input=IOKey("input", shape=[None, None, width]))
        self |= MultiHeadAttention(width, heads, is_causal=causal, name="attn")(input=self.ln_1.output)
        self |= Add(name="residual_1")(left="input", right=self.attn.output)
        self |= LayerNorm(name="ln_2")(input=self.residual_1.output)
        mlp = Model(name="mlp")
        mlp |= Linear(4 * width, name="c_fc")(input="input")
        mlp += QuickGelu(name="gelu")
        mlp += Linear(width, name="c_proj")(output="output")
        self |= mlp(input=self.ln_2.output)
        self |= Add(name="residual_2")(left=self.residual_1.output, right=self.mlp.output, output="output")


def transformer(width: int, layers: int, heads: int, causal: bool, name: str = "transformer") -> Model:
    """``layers`` :class:`ResidualAttentionBlock` in a row, named ``<name>.resblocks.<i>``."""
    if layers < 1:
        raise ModelError(f"clip: a transformer needs at least one layer, got {layers}")
    blocks = Model(name="resblocks")
    for i in range(layers):
        blocks.extend(ResidualAttentionBlock(width, heads, causal, name=str(i)), chain=i > 0, **_ends(i, layers))
    model = Model(name)
    model |= blocks(input="input", output="output")
    return model


# -- the ResNet image tower ("ModifiedResNet") ----------------------------------------------------
class Bottleneck(Model):
    """1x1, 3x3, 1x1 (x4) convolutions with a residual connection. A stride > 1 is an average
    pool after the 3x3 convolution (anti-aliased downsampling), and on the shortcut before its
    1x1 convolution (``downsample.-1``, ``downsample.0``, ``downsample.1``)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, name: str | None = None):
        super().__init__(name)
        outplanes = planes * self.expansion
        self |= Convolution2D(1, planes, use_bias=False, name="conv1")(
            input=IOKey("input", shape=["N", inplanes, None, None]))
        self += BatchNorm2D(name="bn1")
        self += Relu(name="relu1")
        self += Convolution2D(3, planes, padding=1, use_bias=False, name="conv2")
        self += BatchNorm2D(name="bn2")
        self += Relu(name="relu2")
        if stride > 1:
            self += AvgPool2D(stride, name="avgpool")
        self += Convolution2D(1, outplanes, use_bias=False, name="conv3")
        self += BatchNorm2D(name="bn3")
        identity = self.input
        if stride > 1 or inplanes != outplanes:
            down = Model(name="downsample")
            first = {"input": "input"}
            if stride > 1:
                down |= AvgPool2D(stride, name="-1")(**first)
                first = {}
            down.extend(Convolution2D(1, outplanes, use_bias=False, name="0")(**first), chain=not first)
            down += BatchNorm2D(name="1")(output="output")
            self |= down(input="input")
            identity = self.downsample.output
        self |= Add(name="residual")(left=self.bn3.output, right=identity)
        self += Relu(name="relu3")(output="output")


class AttentionPool2d(Model):
    """Attention pooling: the mean of the [N, C, H, W] feature map, prepended to its H*W positions
    (plus ``positional_embedding`` [H*W + 1, C]), queries all of them through one multi-head
    attention (``q_proj``, ``k_proj``, ``v_proj``, ``c_proj``); output [N, output_dim]."""

    def __init__(self, spacial_dim: int, embed_dim: int, num_heads: int, output_dim: int, name: str | None = None):
        super().__init__(name)
        if embed_dim % num_heads:
            raise ModelError(f"clip: the attention pool's {embed_dim} channels do not divide into {num_heads} heads")
        head = embed_dim // num_heads
        self |= Flatten(start_dim=2)(input=IOKey("input", shape=["N", embed_dim, spacial_dim, spacial_dim]))
        self += Transpose(axes=(0, 2, 1), name="positions")  # [N, H*W, C]
        self |= Mean(axis=1, keepdim=True, name="mean")(input=self.positions.output)
        self |= Concat(n=2, axis=1, name="tokens")(input1=self.mean.output, input2=self.positions.output)
        pos = _learned(self, "positional_embedding", (spacial_dim ** 2 + 1, embed_dim))
        self |= Add(name="embed")(left=self.tokens.output, right=pos)
        x = self.embed.output
        self |= Linear(embed_dim, name="q_proj")(input=x[:, :1])  # only the mean token's output is kept
        self |= Linear(embed_dim, name="k_proj")(input=x)
        self |= Linear(embed_dim, name="v_proj")(input=x)

        def heads(c):  # [N, L, C] -> [N, heads, L, head]
            return c.reshape(0, 0, num_heads, head).transpose((0, 2, 1, 3))

        self |= ScaledDotProduct(name="attention")(
            query=heads(self.q_proj.output), key=heads(self.k_proj.output), value=heads(self.v_proj.output))
        pooled = self.attention.output.transpose((0, 2, 1, 3)).reshape(0, embed_dim)  # [N, 1, heads, head] -> [N, C]
        self |= Linear(output_dim, name="c_proj")(input=pooled, output="output")


def modified_resnet(layers, output_dim: int, heads: int, input_resolution: int = 224, width: int = 64,
                    name: str = "visual") -> Model:
    """OpenAI CLIP's ResNet: a stem of three 3x3 convolutions (``conv1`` stride 2, ``conv2``,
    ``conv3``) and a 2x2 average pool, four stages of :class:`Bottleneck` (``layer1``..``layer4``,
    ``width`` to 8 * ``width`` planes), and :class:`AttentionPool2d` (``attnpool``).
    Input [N, 3, R, R] with R = ``input_resolution``, a multiple of 32; output [N, output_dim]."""
    if input_resolution % 32:
        raise ModelError(f"clip: the ResNet tower needs image_resolution divisible by 32, got {input_resolution}")
    if len(layers) != 4:
        raise ModelError(f"clip: vision_layers of the ResNet tower are four stage depths, got {tuple(layers)}")
    model = Model(name)
    model |= Convolution2D(3, width // 2, stride=2, padding=1, use_bias=False, name="conv1")(
        input=IOKey("input", shape=["N", 3, input_resolution, input_resolution]))
    model += BatchNorm2D(name="bn1")
    model += Relu(name="relu1")
    model += Convolution2D(3, width // 2, padding=1, use_bias=False, name="conv2")
    model += BatchNorm2D(name="bn2")
    model += Relu(name="relu2")
    model += Convolution2D(3, width, padding=1, use_bias=False, name="conv3")
    model += BatchNorm2D(name="bn3")
    model += Relu(name="relu3")
    model += AvgPool2D(2, name="avgpool")
    inplanes = width
    for i, count in enumerate(layers):
        planes = width * 2 ** i
        stage = Model(name=f"layer{i + 1}")
        for j in range(count):
            unit = Bottleneck(inplanes, planes, stride=2 if i > 0 and j == 0 else 1, name=str(j))
            stage.extend(unit, chain=j > 0, **_ends(j, count))
            inplanes = planes * Bottleneck.expansion
        model += stage
    model += AttentionPool2d(input_resolution // 32, width * 32, heads, output_dim, name="attnpool")(output="output")
    return model


# -- the ViT image tower --------------------------------------------------------------------------
def vision_transformer(input_resolution: int, patch_size: int, width: int, layers: int, heads: int,
                       output_dim: int, name: str = "visual") -> Model:
    """OpenAI CLIP's Vision Transformer: patches embedded by ``conv1`` (no bias), a
    ``class_embedding`` token in front, ``positional_embedding``, ``ln_pre``, a bidirectional
    ``transformer``, ``ln_post`` of the class token and its projection ``proj`` [width, output_dim].
    Input [N, 3, R, R] with R = ``input_resolution``, a multiple of ``patch_size``; output [N, output_dim]."""
    if input_resolution % patch_size:
        raise ModelError(f"clip: image_resolution {input_resolution} is not a multiple of "
                         f"vision_patch_size {patch_size}")
    grid = input_resolution // patch_size
    model = Model(name)
    model |= Convolution2D(patch_size, width, stride=patch_size, use_bias=False, name="conv1")(
        input=IOKey("input", shape=["N", 3, input_resolution, input_resolution]))
    model += Flatten(start_dim=2)
    model += Transpose(axes=(0, 2, 1), name="patches")  # [N, grid * grid, width]
    model += PrependClassToken(name="class_token")(class_embedding=IOKey("class_embedding"))
    pos = _learned(model, "positional_embedding", (grid * grid + 1, width))
    model |= Add(name="embed")(left=model.class_token.output, right=pos)
    model += LayerNorm(name="ln_pre")
    model += transformer(width, layers, heads, causal=False)
    model |= LayerNorm(name="ln_post")(input=model.transformer.output[:, 0])
    proj = _learned(model, "proj", (width, output_dim))
    model |= MatrixMultiply(name="projection")(left=model.ln_post.output, right=proj, output="output")
    return model


# -- CLIP -----------------------------------------------------------------------------------------
def clip(embed_dim: int = 512, image_resolution: int = 224, vision_layers=(3, 4, 6, 3), vision_width: int = 64,
         vision_patch_size: int = 0, context_length: int = 77, vocab_size: int = 49408,
         transformer_width: int = 512, transformer_heads: int = 8, transformer_layers: int = 12,
         name: str = "clip") -> Model:
    """CLIP with OpenAI's constructor; the defaults are RN50.

    ``vision_layers`` picks the image tower: four stage depths (a tuple or list) give the ResNet
    (heads = ``vision_width * 32 // 64``, feature width ``vision_width * 32``); an int with
    ``vision_patch_size > 0`` gives a Vision Transformer of that many layers (heads =
    ``vision_width // 64``). The text tower: ``token_embedding`` plus ``positional_embedding``,
    ``transformer_layers`` causal pre-LN blocks with QuickGELU, ``ln_final``, the features at
    the end-of-text token (the largest id in each row) and ``text_projection``.

    Inputs: ``image`` float [N, 3, image_resolution, image_resolution] and ``text`` int64
    [M, context_length] (the two batch sizes may differ). Outputs:

    - ``image_features`` [N, embed_dim], ``text_features`` [M, embed_dim]: the projected
      features before normalization (OpenAI's ``encode_image`` / ``encode_text``,
      transformers' ``get_image_features`` / ``get_text_features``);
    - ``logits_per_image`` [N, M] = ``exp(logit_scale)`` times the cosine similarities of the
      normalized features, and ``logits_per_text`` [M, N], its transpose.

    >>> import numpy as np, mithril as ml
    >>> from examples.clip.model import clip
    >>> model = clip(embed_dim=16, image_resolution=32, vision_layers=(1, 1, 1, 1), vision_width=8,
    ...              context_length=8, vocab_size=100, transformer_width=16, transformer_heads=2,
    ...              transformer_layers=1)
    >>> pm = ml.compile(model, ml.NumpyBackend(), shapes={"image": [2, 3, 32, 32], "text": [3, 8]},
    ...                 data_keys={"image", "text"})
    >>> image = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    >>> text = np.array([[5, 7, 99, 0, 0, 0, 0, 0]] * 3, dtype=np.int64)  # 99: end of text
    >>> out = pm.evaluate(data={"image": image, "text": text})
    >>> out["image_features"].shape, out["text_features"].shape, out["logits_per_image"].shape
    ((2, 16), (3, 16), (2, 3))
    >>> bool(np.allclose(out["logits_per_text"], out["logits_per_image"].T))
    True
    """
    if isinstance(vision_layers, (tuple, list)):
        visual = modified_resnet(tuple(int(n) for n in vision_layers), embed_dim, heads=vision_width * 32 // 64,
                                 input_resolution=image_resolution, width=vision_width)
    elif isinstance(vision_layers, int) and not isinstance(vision_layers, bool):
        if vision_patch_size <= 0:
            raise ModelError(f"clip: an int vision_layers ({vision_layers}) is a Vision Transformer and needs "
                             f"vision_patch_size > 0, got {vision_patch_size}; for the ResNet pass four stage "
                             f"depths, e.g. vision_layers=(3, 4, 6, 3)")
        if vision_width < 64 or vision_width % 64:
            raise ModelError(f"clip: the Vision Transformer has vision_width // 64 heads of 64; vision_width "
                             f"{vision_width} is not a positive multiple of 64")
        visual = vision_transformer(image_resolution, vision_patch_size, vision_width, vision_layers,
                                    vision_width // 64, embed_dim)
    else:
        raise ModelError(f"clip: vision_layers is four stage depths (a tuple, ResNet) or a layer count "
                         f"(an int, Vision Transformer); got {vision_layers!r}")

    model = Model(name)
    model |= visual(input=IOKey("image", shape=["N", 3, image_resolution, image_resolution]),
                    output=IOKey("image_features", expose=True))

    text = IOKey("text", shape=["M", context_length], type=int)
    model |= Embedding(vocab_size, transformer_width, name="token_embedding")(input=text)
    pos = _learned(model, "positional_embedding", (context_length, transformer_width))
    model |= Add(name="text_embed")(left=model.token_embedding.output, right=pos)
    model |= transformer(transformer_width, transformer_layers, transformer_heads, causal=True)(
        input=model.text_embed.output)
    model |= LayerNorm(name="ln_final")(input=model.transformer.output)
    model |= EotPool(name="eot")(input=model.ln_final.output, text="text")
    projection = _learned(model, "text_projection", (transformer_width, embed_dim))
    model |= MatrixMultiply(name="text_projected")(left=model.eot.output, right=projection,
                                                   output=IOKey("text_features", expose=True))

    # Cosine similarities scaled by exp(logit_scale); logit_scale starts at log(1 / 0.07) as in OpenAI's.
    model |= L2Normalize(name="image_normalized")(input=model["image_features"])
    model |= L2Normalize(name="text_normalized")(input=model["text_features"])
    scale = _learned(model, "logit_scale", (), init=np.array(math.log(1 / 0.07), dtype=np.float32))
    model |= Exponential(name="logit_scale_exp")(input=scale)
    model |= Multiply(name="logits")(left=model.logit_scale_exp.output,
                                     right=model.image_normalized.output @ model.text_normalized.output.T,
                                     output=IOKey("logits_per_image", expose=True))
    model |= Transpose(name="logits_transposed")(input=model["logits_per_image"], output="logits_per_text")
    return model
