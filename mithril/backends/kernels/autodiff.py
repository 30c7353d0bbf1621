"""Autodiff markers: Mithril-internal ops (domain ``ai.mithril``) that the passes create.

``StopGradient`` is the identity on values; backends with autodiff override it so gradients stop.
"""

from __future__ import annotations

from ..registry import kernel


@kernel("StopGradient", since=1, domain="ai.mithril")
def stop_gradient(x):
    return x
