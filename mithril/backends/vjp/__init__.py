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

from importlib import import_module

from ...errors import MithrilError
from ..registry import KernelRegistry, _make_spec

RULES = KernelRegistry()


def vjp_rule(op_type: str, *, since: int = 1, domain: str = ""):
    """Register the vector-Jacobian rule of ``op_type`` from opset ``since`` on."""

    def wrap(fn):
        RULES.register("*", _make_spec(fn, op_type, domain, since))
        return fn

    return wrap


class NoGradientRuleError(MithrilError):
    """Gradients were asked for through nodes whose op has no vector-Jacobian rule."""

    def __init__(self, missing: list[tuple[str, str, int]]):
        self.missing = missing
        lines = [f"  node {label!r}: op {op} (opset {opset})" for label, op, opset in missing]
        super().__init__(
            f"no gradient rule for {len(missing)} node(s) on the path from the trainable values to the "
            "outputs (compile with inference=True, or leave these values out of trainable_keys/data_keys):\n"
            + "\n".join(lines)
        )


FAMILIES = ("elementwise", "nn", "normalization", "reduce", "shape", "image")

for _family in FAMILIES:
    import_module(f"{__name__}.{_family}")

from .program import GradientProgram, lower_vjp  # noqa: E402

__all__ = ["RULES", "GradientProgram", "NoGradientRuleError", "lower_vjp", "vjp_rule"]
