"""Elementwise blocks: arithmetic, math, activations, comparisons and logic.

Most are one line of the tables below: a unary block keeps its input's shape, a binary one
broadcasts. Blocks needing attributes or a composed lowering are small classes.
"""

from __future__ import annotations

import numpy as np

from . import shapes as S
from .block import register
from .model import In, Out, Primitive, ShapeView, broadcast_dims
from ..errors import ModelError


class Unary(Primitive):
    """Same shape in and out; lowers to one ONNX op."""

    ports = {"input": In(["..."]), "output": Out(["..."])}
    op_type = ""

    def lower(self, g, input):
        return g.op(self.op_type, input)


class Binary(Primitive):
    """NumPy-broadcasting ``left op right``; lowers to one ONNX op."""

    ports = {"left": In(None), "right": In(None), "output": Out(None)}
    op_type = ""

    def infer(self, s: ShapeView) -> None:
        broadcast_rule(s, ("left", "right"))

    def lower(self, g, left, right):
        return g.op(self.op_type, left, right)


def broadcast_rule(s: ShapeView, names) -> None:
    ports = s.block._ports
    dims = [s[n] for n in names]
    if all(d is not None for d in dims):
        out = dims[0]
        for d in dims[1:]:
            out = broadcast_dims(out, d)
        s.set("output", out)
        return
    # One operand with an open rank: the output is it when the others are scalars or the same shape.
    open_ = [n for n, d in zip(names, dims) if d is None]
    roots = {id(ports[n].shape.root()) for n in open_}
    if len(roots) == 1 and all(d == [] for d in dims if d is not None):
        S.unify_shapes(ports["output"].shape, ports[open_[0]].shape)


def _table(base, rows, **ports):
    for name, op_type, doc in rows:
        attrs = {"op_type": op_type, "__doc__": doc, "__module__": __name__, "__qualname__": name}
        if ports:
            attrs["ports"] = ports
        register(type(name, (base,), attrs))


# name, ONNX op, docstring
_table(Unary, [
    ("Negate", "Neg", "``-x``."),
    ("Exponential", "Exp", "``e ** x``."),
    ("Log", "Log", "Natural logarithm."),
    ("Sqrt", "Sqrt", "Square root."),
    ("Absolute", "Abs", "``|x|``."),
    ("Sine", "Sin", "Sine."),
    ("Cosine", "Cos", "Cosine."),
    ("Relu", "Relu", "``max(x, 0)``."),
    ("Sigmoid", "Sigmoid", "``1 / (1 + e ** -x)``."),
    ("Tanh", "Tanh", "Hyperbolic tangent."),
    ("Softplus", "Softplus", "``log(1 + e ** x)``."),
])
_table(Unary, [("LogicalNot", "Not", "Boolean not.")],
       input=In(["..."], bool), output=Out(["..."], bool))
_table(Binary, [
    ("Add", "Add", "``left + right`` (broadcasting)."),
    ("Subtract", "Sub", "``left - right``."),
    ("Multiply", "Mul", "``left * right``."),
    ("Divide", "Div", "``left / right`` (integer inputs divide with truncation, as ONNX Div)."),
    ("Power", "Pow", "``left ** right``."),
])
_table(Binary, [
    ("Greater", "Greater", "``left > right``."),
    ("GreaterEqual", "GreaterOrEqual", "``left >= right``."),
    ("Less", "Less", "``left < right``."),
    ("LessEqual", "LessOrEqual", "``left <= right``."),
    ("Equal", "Equal", "``left == right``."),
], left=In(None), right=In(None), output=Out(None, bool))
_table(Binary, [
    ("LogicalAnd", "And", "Boolean and."),
    ("LogicalOr", "Or", "Boolean or."),
    ("LogicalXor", "Xor", "Boolean xor."),
], left=In(None, bool), right=In(None, bool), output=Out(None, bool))


@register
class NotEqual(Binary):
    """``left != right``."""

    ports = {"left": In(None), "right": In(None), "output": Out(None, bool)}

    def lower(self, g, left, right):
        return g.op("Not", g.op("Equal", left, right, dtype=bool))


@register
class Buffer(Unary):
    """Identity: names or exposes a connection."""

    def lower(self, g, input):
        return g.op("Identity", input)


@register
class LeakyRelu(Unary):
    """``x`` for positive x, ``slope * x`` otherwise."""

    def __init__(self, slope: float = 0.01, name: str | None = None):
        self.slope = float(slope)
        super().__init__(name)

    def attributes(self):
        return {"slope": self.slope}

    def lower(self, g, input):
        return g.op("LeakyRelu", input, alpha=self.slope)


@register
class Gelu(Unary):
    """Gaussian error linear unit; ``approximate="tanh"`` for the tanh form."""

    def __init__(self, approximate: str | bool = "none", name: str | None = None):
        self.approximate = "tanh" if approximate in (True, "tanh") else "none"
        super().__init__(name)

    def attributes(self):
        return {"approximate": self.approximate}

    def lower(self, g, input):
        if g.opset >= 20:
            return g.op("Gelu", input, approximate=self.approximate)
        x = input
        half = g.const(0.5, like=x)
        one = g.const(1.0, like=x)
        if self.approximate == "tanh":
            inner = g.op("Mul", g.const(np.sqrt(2 / np.pi), like=x),
                         g.op("Add", x, g.op("Mul", g.const(0.044715, like=x), g.op("Mul", x, g.op("Mul", x, x)))))
            t = g.op("Tanh", inner)
        else:
            t = g.op("Erf", g.op("Div", x, g.const(np.sqrt(2.0), like=x)))
        return g.op("Mul", g.op("Mul", half, x), g.op("Add", one, t))


@register
class SiLU(Unary):
    """``x * sigmoid(x)`` (Swish)."""

    def lower(self, g, input):
        # Not Swish (opset 24): onnxruntime has no kernel for it.
        return g.op("Mul", input, g.op("Sigmoid", input))


@register
class Softmax(Unary):
    """Softmax along ``axis``."""

    def __init__(self, axis: int = -1, name: str | None = None):
        self.axis = int(axis)
        super().__init__(name)

    def attributes(self):
        return {"axis": self.axis}

    def lower(self, g, input):
        return g.op("Softmax", input, axis=self.axis)


@register
class Where(Primitive):
    """``input1`` where ``cond`` holds, else ``input2`` (broadcasting)."""

    ports = {"cond": In(None, bool), "input1": In(None), "input2": In(None), "output": Out(None)}

    def infer(self, s):
        broadcast_rule(s, ("cond", "input1", "input2"))

    def lower(self, g, cond, input1, input2):
        return g.op("Where", cond, input1, input2)


@register
class Cast(Primitive):
    """Converts the element type to ``dtype`` (an ml dtype)."""

    def __init__(self, dtype, name: str | None = None):
        from ..dtypes import as_dtype

        self.dtype = as_dtype(dtype)
        super().__init__(name)

    def port_specs(self):
        return {"input": In(["..."], None), "output": Out(["..."], self.dtype)}

    def attributes(self):
        return {"dtype": self.dtype.name}

    def lower(self, g, input):
        return g.op("Cast", input, to=self.dtype.onnx, dtype=self.dtype.numpy)


@register
class Dropout(Unary):
    """Zeroes each element with probability ``p`` and scales the rest by ``1 / (1 - p)`` when
    ``training``; the identity otherwise (lowered to Identity). ``seed`` fixes the ONNX op's seed."""

    def __init__(self, p: float = 0.5, training: bool = False, seed: int | None = None, name: str | None = None):
        if not 0 <= p < 1:
            raise ModelError(f"Dropout p must be in [0, 1), not {p}")
        self.p, self.training, self.seed = float(p), bool(training), seed
        super().__init__(name)

    def attributes(self):
        return {"p": self.p, "training": self.training}

    def lower(self, g, input):
        if not self.training:
            return g.op("Identity", input)
        return g.op("Dropout", input, g.const(self.p, like=input), g.const(True, dtype=np.bool_), seed=self.seed)


STOP_GRADIENT = "mithril.stop_gradient"


@register
class StopGradient(Unary):
    """The identity whose output gradients do not flow back through (``jax.lax.stop_gradient``,
    ``tensor.detach()``).

    ONNX has no such op: it lowers to an Identity node carrying the node metadata property
    ``mithril.stop_gradient = "true"`` (:data:`STOP_GRADIENT`). onnxruntime and inference ignore it.
    A pass before differentiation must keep these Identity nodes (the Identity elimination of
    ``specialize`` would drop them) and lower them to the backend's stop-gradient.
    """

    def lower(self, g, input):
        out = g.op("Identity", input)
        g.nodes[-1].metadata_props.add(key=STOP_GRADIENT, value="true")
        return out
