"""Losses, elementwise or per sample (reduce them with Mean/Sum): SquaredError, AbsoluteError,
CrossEntropy."""

from __future__ import annotations

import numpy as np

from .block import register
from .elementwise import broadcast_rule
from .model import In, Out, Primitive, ShapeView


class PairLoss(Primitive):
    """``f(input, target)`` elementwise with broadcasting."""

    ports = {"input": In(None), "target": In(None), "output": Out(None)}

    def infer(self, s: ShapeView) -> None:
        broadcast_rule(s, ("input", "target"))


@register
class SquaredError(PairLoss):
    """``(input - target) ** 2``."""

    def lower(self, g, input, target):
        d = g.op("Sub", input, target)
        return g.op("Mul", d, d)


@register
class AbsoluteError(PairLoss):
    """``|input - target|``."""

    def lower(self, g, input, target):
        return g.op("Abs", g.op("Sub", input, target))


@register
class CrossEntropy(Primitive):
    """Per-sample cross entropy over the class axis 1: input [N, C, ...] (``input_type`` "logits"
    or "probs"), target class indices [N, ...] (``categorical=True``) or probabilities [N, C, ...]."""

    def __init__(self, input_type: str = "logits", categorical: bool = True, eps: float = 1e-12,
                 name: str | None = None):
        if input_type not in ("logits", "probs"):
            raise ValueError(f"CrossEntropy input_type is 'logits' or 'probs', not {input_type!r}")
        self.input_type, self.categorical, self.eps = input_type, bool(categorical), float(eps)
        super().__init__(name)

    def port_specs(self):
        target = In(["N", "..."], int) if self.categorical else In(["N", "C", "..."])
        return {"input": In(["N", "C", "..."]), "target": target, "output": Out(["N", "..."])}

    def attributes(self):
        return {"input_type": self.input_type, "categorical": self.categorical}

    def _log_probs(self, g, x):
        if self.input_type == "logits":
            return g.op("LogSoftmax", x, axis=1)
        return g.op("Log", g.op("Max", x, g.const(self.eps, like=x)))

    def lower(self, g, input, target):
        logp = self._log_probs(g, input)
        if self.categorical:
            idx = g.op("Unsqueeze", target, g.ints([1]), dtype=np.int64)
            picked = g.op("GatherElements", logp, idx, axis=1)
            return g.op("Neg", g.op("Squeeze", picked, g.ints([1])))
        return g.op("Neg", g.reduce("ReduceSum", g.op("Mul", target, logp), [1], False))
