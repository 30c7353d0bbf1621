"""Node patterns GGML runs as one ggml op: exporters write GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``
(five nodes; ggml has no erf kernel, the Erf rule composes one from ``ggml_gelu_erf`` and a
series); the pattern becomes one ``Gelu`` node, which ``ggml_gelu_erf`` computes exactly in float32.
GPT-2's tanh form (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, nine nodes) becomes one
``Gelu(approximate="tanh")``, computed through ggml's vectorized silu (the Gelu rule says how).

The chains are matched by :mod:`mithril.backends.passes.gelu` (only where their scalars are
constants: a float initializer that is a parameter may be given another value at run time), and
fused only when the fused node runs in ggml: a node left to NumPy must be the plan's own, with
its own kernel.
"""

from __future__ import annotations

from dataclasses import replace

from ..passes import FuseGelu, GeluMatch
from ..plan import PlanNode


def ggml_gelu_pass(supported) -> FuseGelu:
    """:class:`~mithril.backends.passes.FuseGelu` making the ``Gelu`` node GGML's rule reads (the
    Erf's or Tanh's node, renamed, with ``approximate``), where ``supported(node)`` says it runs
    in ggml."""

    def make(m: GeluMatch) -> PlanNode | None:
        what = "GELU" if m.approximate == "none" else "tanh GELU"
        fused = replace(m.anchor, op_type="Gelu", inputs=(m.x,), outputs=m.last.outputs,
                        kwargs={"approximate": m.approximate}, frees=m.frees,
                        label=f"{m.anchor.label} ({what} of {len(m.chain)} nodes)")
        return fused if supported(fused) else None

    return FuseGelu(make)


__all__ = ["ggml_gelu_pass"]
