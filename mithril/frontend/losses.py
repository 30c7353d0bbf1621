"""Losses, elementwise or per sample (reduce them with Mean/Sum): SquaredError, AbsoluteError,
CrossEntropy, BinaryCrossEntropy, KLDivergence, HingeLoss."""

from __future__ import annotations

import numpy as np

from .block import register
from .elementwise import broadcast_rule
from .model import In, Out, Primitive, ShapeView
from ..errors import ModelError


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
            raise ModelError(f"CrossEntropy input_type is 'logits' or 'probs', not {input_type!r}")
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


@register
class BinaryCrossEntropy(PairLoss):
    """Elementwise binary cross entropy against targets in [0, 1]; ``input_type`` "logits" (the
    stable ``max(x, 0) - x * t + log(1 + e ** -|x|)``) or "probs" (logs clamped at ``log(eps)``)."""

    def __init__(self, input_type: str = "logits", eps: float = 1e-12, name: str | None = None):
        if input_type not in ("logits", "probs"):
            raise ModelError(f"BinaryCrossEntropy input_type is 'logits' or 'probs', not {input_type!r}")
        self.input_type, self.eps = input_type, float(eps)
        super().__init__(name)

    def attributes(self):
        return {"input_type": self.input_type}

    def lower(self, g, input, target):
        if self.input_type == "logits":
            soft = g.op("Softplus", g.op("Neg", g.op("Abs", input)))
            return g.op("Add", g.op("Sub", g.op("Relu", input), g.op("Mul", input, target)), soft)
        eps, one = g.const(self.eps, like=input), g.const(1.0, like=input)
        log_p = g.op("Log", g.op("Max", input, eps))
        log_q = g.op("Log", g.op("Max", g.op("Sub", one, input), eps))
        return g.op("Neg", g.op("Add", g.op("Mul", target, log_p), g.op("Mul", g.op("Sub", one, target), log_q)))


@register
class KLDivergence(PairLoss):
    """Elementwise ``target * (log(target) - log_input)`` (0 where the target is 0), as PyTorch's
    ``kl_div(reduction="none")``: ``input`` holds log-probabilities, or probabilities with
    ``log_input=False`` (then clamped at ``eps`` before the log); ``target`` holds probabilities.
    Sum over the class axis for the divergence of each sample."""

    def __init__(self, log_input: bool = True, eps: float = 1e-12, name: str | None = None):
        self.log_input, self.eps = bool(log_input), float(eps)
        super().__init__(name)

    def attributes(self):
        return {"log_input": self.log_input}

    def lower(self, g, input, target):
        log_q = input if self.log_input else g.op("Log", g.op("Max", input, g.const(self.eps, like=input)))
        # the smallest normal float keeps log finite where the target is 0, so 0 * log stays 0
        tiny = g.const(np.finfo(g.dtype(target)).tiny, like=target)
        return g.op("Mul", target, g.op("Sub", g.op("Log", g.op("Max", target, tiny)), log_q))


@register
class HingeLoss(PairLoss):
    """Elementwise ``max(0, 1 - target * input)`` for targets in {-1, 1}."""

    def lower(self, g, input, target):
        return g.op("Relu", g.op("Sub", g.const(1.0, like=input), g.op("Mul", target, input)))
