"""What a compiled model hands its backend at run time, and how a failure is named.

:class:`Program` is what :meth:`Backend.vjp <mithril.backends.backend.Backend.vjp>` receives;
:func:`node_error` turns an exception raised inside generated code into a
:class:`~mithril.errors.KernelError` naming the node. ``mithril.compile`` runs programs with
these; backends use them too, so they live here (a backend never imports ``mithril.compile``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EvaluationError, JitTraceError, KernelError, MithrilError, describe_node


@dataclass(frozen=True)
class Program:
    """A compiled model's program as its backend runs it.

    ``forward``: the generated eager ``forward(params, data)``. ``jitted``: what
    :meth:`Backend.jit` made of it, or None (jit off, blocked at compile, or fallen back after a
    failed trace): a backend may use it for gradients too, and lets a trace failure raise (the
    caller then runs once more with ``jitted=None``). ``backward``: what
    :meth:`Backend.lower_backward` returned (a gradient program), or None.
    """

    forward: Callable
    jitted: Callable | None = None
    backward: Any = None


class JitFallbackWarning(UserWarning):
    """The whole-graph jit could not trace the program; it runs eagerly instead."""


def node_error(program, exc: Exception) -> Exception:
    """Find the generated line of ``program`` (a lowered program with ``filename`` and ``lines``)
    that failed and name its node, input shapes and dtypes; an EvaluationError when the failure
    is outside the program's kernel calls."""
    tb = exc.__traceback__
    site = frame = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == program.filename and tb.tb_lineno in program.lines:
            site, frame = program.lines[tb.tb_lineno], tb.tb_frame
        tb = tb.tb_next
    if site is None:
        # A backward pass that ran no line of the program (Torch's autograd engine): the forward
        # line of the op whose gradient failed, where the backend found it (``forward_frames``).
        lines = [line for filename, line in getattr(exc, "forward_frames", ())
                 if filename == program.filename and line in program.lines]
        if lines:
            site = program.lines[lines[-1]]
            return KernelError(f"the gradient of kernel {site.kernel} failed: {type(exc).__name__}: {exc}",
                               node=site.label, op_type=site.op_type, opset=site.opset)
        # failed outside the generated program's kernel calls
        return EvaluationError(f"evaluate failed: {type(exc).__name__}: {exc}")
    shapes, dtypes = [], []
    for var in site.input_vars:
        val = frame.f_locals.get(var) if var is not None else None
        shapes.append(list(np.shape(val)) if val is not None and hasattr(val, "shape") else None)
        dtypes.append(str(getattr(val, "dtype", type(val).__name__)) if val is not None else None)
    return KernelError(
        f"kernel {site.kernel} failed: {type(exc).__name__}: {exc}",
        node=site.label, op_type=site.op_type, opset=site.opset, shapes=shapes, dtypes=dtypes,
    )


def jit_fallback_reason(program, exc: Exception) -> str:
    """Why a jitted run of ``program`` failed, in one line (a JitFallbackWarning's): the node
    whose generated line was being traced or run, when known, and the failure's first line."""
    if isinstance(exc, JitTraceError):
        frames, reason = exc.where, str(exc)
    elif isinstance(exc, MithrilError):
        return _first_line(str(exc))
    else:
        frames, reason = [], f"{type(exc).__name__}: {_first_line(str(exc))}"
        tb = exc.__traceback__
        while tb is not None:
            frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
    sites = [program.lines[line] for filename, line in frames
             if filename == program.filename and line in program.lines]
    if not sites:
        return reason
    site = sites[-1]  # the innermost generated line
    return f"{describe_node(site.label, site.op_type, site.opset)}: {reason}"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "no message")


__all__ = ["JitFallbackWarning", "Program", "jit_fallback_reason", "node_error"]
