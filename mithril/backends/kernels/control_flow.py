"""control_flow kernels."""

from __future__ import annotations

from ..registry import kernel  # noqa: F401
