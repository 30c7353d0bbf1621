"""The registry of vector-Jacobian rules and the error for a missing one (see the package docstring)."""

from __future__ import annotations

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
