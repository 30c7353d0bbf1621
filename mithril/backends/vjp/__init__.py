"""Vector-Jacobian rules: the gradient of each ONNX op, written once in NumPy.

A rule takes the cotangent of the node's output first, then the node's inputs in ONNX order,
and the node's attributes as keyword-only parameters (filled exactly as for kernels). It may
also declare ``needs`` (a bool per input: whose gradient is wanted), ``y`` (the node's first
output), ``outputs`` (all its outputs), ``opset`` and ``num_outputs``. For an op whose schema
allows several outputs the cotangent is a tuple with None for outputs that get none. A rule
returns a tuple with one entry per input: an array shaped like that input where ``needs`` says
so, None elsewhere::

    @vjp_rule("Mul", since=7)
    def mul(g, a, b, *, needs):
        return (unbroadcast(g * b, a.shape) if needs[0] else None,
                unbroadcast(g * a, b.shape) if needs[1] else None)

Rules live in a :class:`~mithril.backends.registry.KernelRegistry` of their own, so they
resolve like kernels: the newest ``since`` <= the model's opset. :func:`lower_vjp` turns a
graph into one generated program that runs the forward kernels, keeps what the rules read and
runs the rules in reverse topological order (see :mod:`.program`).
"""

from __future__ import annotations

# The rule families register their rules on import.
from . import elementwise, image, nn, normalization, reduce, shape  # noqa: F401
from .program import GradientPlan, GradientProgram, lower_vjp, plan_gradients
from .rules import RULES, NoGradientRuleError, vjp_rule

__all__ = ["RULES", "GradientPlan", "GradientProgram", "plan_gradients", "NoGradientRuleError", "lower_vjp", "vjp_rule"]
