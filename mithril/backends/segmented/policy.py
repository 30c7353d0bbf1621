"""What a segmented backend asks of a model before it partitions it, and what it does with the
nodes it can't run: fixed input shapes, the ``fallback`` option, and the one warning (or the
refusal) that lists the nodes left to NumPy."""

from __future__ import annotations

from ...errors import BackendOptionError, CompileError, FallbackWarning, KernelMissingError

FALLBACKS = ("numpy", None)


def check_fallback(owner: str, fallback) -> str | None:
    """``fallback`` when it is one of :data:`FALLBACKS` (``"numpy"``: nodes without a rule run
    on NumPy; None: they are refused); else an error naming ``owner`` (the backend's class)."""
    if fallback not in FALLBACKS:
        raise BackendOptionError(f"{owner}: fallback must be 'numpy' or None, got {fallback!r}")
    return fallback


def check_fixed_shapes(owner: str, plan) -> None:
    """Every graph input's shape fixed (maps, sequences and strings aside: NumPy runs what reads
    them); else an error listing those that are not."""
    loose = [f"{v.name} {list(v.shape) if v.shape is not None else '(rank unknown)'}"
             for v in plan.inputs if v.kind == "input" and v.static_shape is None
             and v.dtype is not None and v.dtype.kind != "O"]
    if loose:
        raise CompileError(f"{owner} needs every input shape fixed; give shapes= (and static_shapes=True) "
                           f"for: {', '.join(loose)}")


def apply_fallback(owner: str, noun: str, fallback: str | None, missing: list,
                   warning: type[Warning] = FallbackWarning, error: type[Exception] = KernelMissingError) -> None:
    """``missing``: (plan node, why) of the nodes without a native rule. None of them: nothing.
    With ``fallback=None``: ``error`` listing them all; else one ``warning`` listing them."""
    if not missing:
        return
    listed = ", ".join(f"{pn.label} ({pn.op_type}: {why})" for pn, why in missing)
    if fallback is None:
        raise error(f"{owner}(fallback=None): {len(missing)} node(s) have no {noun}: {listed}")
    from ..options import warn_user

    warn_user(f"{owner}: {len(missing)} node(s) run on NumPy (no {noun}): {listed}", warning)


__all__ = ["FALLBACKS", "apply_fallback", "check_fallback", "check_fixed_shapes"]
