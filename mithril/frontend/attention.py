"""Attention: ScaledDotProduct, MultiHeadAttention, TransformerBlock (pre-LN, GPT-style)."""

from __future__ import annotations

import math

import numpy as np

from .block import BLOCKS, register
from .elementwise import Gelu
from .model import In, IOKey, Model, Out, Primitive
from .nn import MLP, LayerNorm, Linear
from ..errors import ModelError


@register
class ScaledDotProduct(Primitive):
    """``softmax(query @ key.T * scale + mask) @ value``: query [..., L, E], key [..., S, E],
    value [..., S, Ev], output [..., L, Ev]. ``scale`` defaults to ``1 / sqrt(E)``.

    ``is_causal`` lets position l attend to keys 0..l only (PyTorch's lower-triangular [L, S] mask).
    ``use_mask`` adds a ``mask`` terminal broadcasting to [..., L, S]: boolean (True takes part) or
    additive float, as in ``torch.nn.functional.scaled_dot_product_attention``.
    """

    def __init__(self, is_causal: bool = False, use_mask: bool = False, scale: float | None = None,
                 name: str | None = None):
        self.is_causal, self.use_mask = bool(is_causal), bool(use_mask)
        self.scale = None if scale is None else float(scale)
        super().__init__(name)

    def port_specs(self):
        ports = {"query": In(["...", "L", "E"]), "key": In(["...", "S", "E"]), "value": In(["...", "S", "Ev"])}
        if self.use_mask:
            ports["mask"] = In(None, type=None)
        ports["output"] = Out(["...", "L", "Ev"])
        return ports

    def attributes(self):
        return {"is_causal": self.is_causal, "use_mask": self.use_mask, "scale": self.scale}

    def lower(self, g, query, key, value, mask=None):
        rank = len(self._ports["query"].shape.dims())
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        scores = g.op("MatMul", query, g.op("Transpose", key, perm=perm))
        e = self._ports["query"].shape.dims()[-1].root().value
        if self.scale is not None or e is not None:
            scale = g.const(self.scale if self.scale is not None else 1 / math.sqrt(e), like=query)
        else:
            e = g.op("Cast", g.op("Shape", query, start=-1, dtype=np.int64), to=_onnx_type(g.dtype(query)),
                     dtype=g.dtype(query))
            scale = g.op("Reciprocal", g.op("Sqrt", e))
        scores = g.op("Mul", scores, scale)
        neg_inf = g.const(-np.inf, like=scores)
        if self.is_causal:
            size = g.op("Concat", g.op("Shape", query, start=-2, end=-1, dtype=np.int64),
                        g.op("Shape", key, start=-2, end=-1, dtype=np.int64), axis=0)
            ones = g.op("ConstantOfShape", size, value=_ones_tensor(g.dtype(query)), dtype=g.dtype(query))
            keep = g.op("Cast", g.op("Trilu", ones, upper=0), to=onnx_bool(), dtype=np.bool_)
            scores = g.op("Where", keep, scores, neg_inf)
        if mask is not None:
            if g.dtype(mask) == np.bool_:
                scores = g.op("Where", mask, scores, neg_inf)
            else:
                scores = g.op("Add", scores, mask)
        return g.op("MatMul", g.op("Softmax", scores, axis=-1), value)


def _onnx_type(dtype) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def onnx_bool() -> int:
    return _onnx_type(np.bool_)


def _ones_tensor(dtype):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ones(1, dtype=dtype))


@register
class MultiHeadAttention(Model):
    """Self-attention over input [N, L, dims] with ``num_heads`` heads: ``q_proj``, ``k_proj``,
    ``v_proj`` and ``out_proj`` are Linear blocks (weight [dims, dims], bias [dims] when ``bias``),
    so parameters are named ``<name>.q_proj.weight`` and so on. Terminals ``input``, ``output``.

    >>> from mithril.models import MultiHeadAttention
    >>> m = MultiHeadAttention(dims=8, num_heads=2, is_causal=True)
    >>> m.shape_of("output")
    '[d, d1, 8]'
    """

    def __init__(self, dims: int, num_heads: int, bias: bool = True, is_causal: bool = False,
                 name: str | None = None):
        super().__init__(name)
        if dims % num_heads:
            raise ModelError(f"MultiHeadAttention: dims {dims} do not divide into {num_heads} heads")
        self.dims, self.num_heads, self.bias, self.is_causal = dims, num_heads, bias, is_causal
        head = dims // num_heads
        for proj in ("q_proj", "k_proj", "v_proj"):
            self |= Linear(dims, use_bias=bias, name=proj)(input=IOKey("input", shape=[None, None, dims]))

        def heads(c):  # [N, L, dims] -> [N, heads, L, head]
            return c.reshape(0, 0, num_heads, head).transpose((0, 2, 1, 3))

        self |= ScaledDotProduct(is_causal=is_causal, name="attention")(
            query=heads(self.q_proj.output), key=heads(self.k_proj.output), value=heads(self.v_proj.output))
        merged = self.attention.output.transpose((0, 2, 1, 3)).reshape(0, 0, dims)
        self |= Linear(dims, use_bias=bias, name="out_proj")(input=merged, output="output")


@register
class TransformerBlock(Model):
    """A pre-LN GPT-style block over input [N, L, dims]:
    ``h = input + attn(ln_1(input))`` (causal self-attention), ``output = h + mlp(ln_2(h))`` where
    ``mlp`` is Linear(mlp_ratio * dims) -> Gelu -> Linear(dims). Children: ``ln_1``, ``attn``
    (MultiHeadAttention), ``ln_2``, ``mlp`` (``linear_0``, ``linear_1``).

    >>> from mithril.models import TransformerBlock
    >>> TransformerBlock(dims=8, num_heads=2).shape_of("output")
    '[d, d1, 8]'
    """

    def __init__(self, dims: int, num_heads: int, mlp_ratio: int = 4, bias: bool = True,
                 gelu_approximate: str = "none", eps: float = 1e-5, name: str | None = None):
        super().__init__(name)
        self.dims, self.num_heads = dims, num_heads
        self |= LayerNorm(eps=eps, use_bias=bias, name="ln_1")(input=IOKey("input", shape=[None, None, dims]))
        self |= MultiHeadAttention(dims, num_heads, bias=bias, is_causal=True, name="attn")(input=self.ln_1.output)
        self |= BLOCKS["Add"](name="residual_1")(left="input", right=self.attn.output)
        self |= LayerNorm(eps=eps, use_bias=bias, name="ln_2")(input=self.residual_1.output)
        self |= MLP([Gelu(approximate=gelu_approximate), None], [mlp_ratio * dims, dims], use_bias=bias,
                    name="mlp")(input=self.ln_2.output)
        self |= BLOCKS["Add"](name="residual_2")(left=self.residual_1.output, right=self.mlp.output, output="output")

