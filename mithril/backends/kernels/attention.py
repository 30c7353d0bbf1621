"""attention kernels."""

from __future__ import annotations

from ..registry import kernel  # noqa: F401
