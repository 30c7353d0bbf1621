"""What runs an op on a backend, per opset range: the answer ``mithril ops`` and ``mithril
inspect`` print, asked of each backend class (``Backend.op_ranges``). A backend over ``xp``
runs the kernel registry's choice (its override, else the shared kernel); a segmented backend
(C, GGML) its own rule where it has one, else NumPy's kernel as the fallback.

>>> import mithril as ml
>>> [(r.first, r.last, r.kind) for r in ml.NumpyBackend.op_ranges("Softmax")]
[(1, 12, 'shared'), (13, None, 'shared')]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OpSupport:
    """Opsets ``first`` to ``last`` (None: every later one) of an op run by ``function``
    (``module.function``, defined at ``location``, ``path:line``). ``kind``: ``"shared"`` (the
    shared kernel), ``"override"`` (the backend's own kernel), a segmented backend's rule noun
    (``"C kernel"``), or ``"NumPy fallback"``. ``meta``: what the kernel declares, as words."""

    first: int
    last: int | None
    function: str
    kind: str
    location: str
    meta: str = ""

    def covers(self, opset: int) -> bool:
        return self.first <= opset and (self.last is None or opset <= self.last)


def kernel_meta(spec) -> str:
    """The metadata a registry kernel declares, as ``name=value`` words (defaults left out)."""
    words = []
    if spec.static_inputs:
        words.append(f"static_inputs={','.join(map(str, spec.static_inputs))}")
    if spec.graph_attributes:
        words.append(f"graph_attributes={','.join(spec.graph_attributes)}")
    for flag in ("host_only", "emit_required", "nondeterministic", "data_dependent_shape"):
        if getattr(spec, flag):
            words.append(flag)
    if spec.output_shapes is not None:
        words.append("output_shapes")
    if spec.reason:
        words.append(f"reason: {spec.reason}")
    return "  ".join(words)


def registry_ranges(backend: str, op_type: str, domain: str = "") -> list[OpSupport]:
    """The kernel registry's answer for ``backend``: per opset range, its override or the shared kernel."""
    from .registry import REGISTRY

    overrides = {id(spec) for spec in REGISTRY.entries(op_type, domain, backend)}
    return [OpSupport(first, last, spec.function, "override" if id(spec) in overrides else "shared", spec.location,
                      kernel_meta(spec)) for first, last, spec in REGISTRY.ranges(op_type, domain, backend)]


def merge_ranges(starts, pick: Callable[[int], OpSupport | None]) -> list[OpSupport]:
    """Ranges from the opsets where something may change (``starts``) and ``pick(opset)``, what
    runs at that opset: consecutive starts with the same answer are one range."""
    out: list[OpSupport] = []
    for since in sorted(set(starts)):
        found = pick(since)
        if out and found is not None and (found.function, found.kind) == (out[-1].function, out[-1].kind):
            continue
        if out and out[-1].last is None:
            out[-1] = OpSupport(out[-1].first, since - 1, out[-1].function, out[-1].kind, out[-1].location,
                                out[-1].meta)
        if found is not None:
            out.append(OpSupport(since, None, found.function, found.kind, found.location, found.meta))
    return out


__all__ = ["OpSupport", "kernel_meta", "merge_ranges", "registry_ranges"]
