"""The registry of vector-Jacobian rules and the error for a missing one (see the package docstring)."""

from __future__ import annotations

from ...errors import MithrilError
from ..registry import CUSTOM_DOMAIN, STANDARD_DOMAINS, KernelRegistry, make_spec

RULES = KernelRegistry()


def vjp_rule(op_type: str, *, since: int = 1, domain: str = "", replace: bool = False):
    """Register the vector-Jacobian rule of ``op_type`` from opset ``since`` on."""

    def wrap(fn):
        RULES.register("*", make_spec(fn, op_type, domain, since), replace=replace)
        return fn

    return wrap


class NoGradientRuleError(MithrilError):
    """Gradients were asked for through nodes whose op has no vector-Jacobian rule."""

    def __init__(self, missing: list[tuple[str, str, int]]):
        self.missing = missing
        lines = [f"  node {label!r}: op {op} (opset {opset})" for label, op, opset in missing]
        # An op of a user's domain (domain::op): its rule is the user's to give.
        custom = [op for _, op, _ in missing if "::" in op and op.split("::")[0] not in STANDARD_DOMAINS]
        hint = ""
        if custom:
            domain, _, op_type = custom[0].partition("::")
            args = f"{op_type!r}, fn" + ("" if domain == CUSTOM_DOMAIN else f", domain={domain!r}")
            hint = (f"\n{custom[0]} is a custom op: give its gradient rule in NumPy with "
                    f"register_op({args}, vjp=rule) or @vjp_rule({op_type!r}, domain={domain!r}) "
                    "(mithril.backends.vjp; docs/custom_ops.md), or differentiate on JAX, Torch or MLX")
        super().__init__(
            f"no gradient rule for {len(missing)} node(s) on the path from the trainable values to the "
            "outputs (compile with inference=True, or leave these values out of trainable_keys/data_keys):\n"
            + "\n".join(lines) + hint
        )
