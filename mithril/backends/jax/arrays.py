"""JAX's array helpers (see :mod:`mithril.backends.numpy.arrays`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

sqrt = jnp.sqrt
zeros_like = jnp.zeros_like


def to_numpy(value) -> np.ndarray:
    """A NumPy array holding ``value`` (bfloat16 stays bfloat16: NumPy holds it through ml_dtypes)."""
    return np.asarray(value)


def update_scope():
    """JAX arrays update inside an x64 scope, as JaxBackend computes: float64 stays float64, and
    a jitted update is not retraced between calls made in and out of the scope."""
    return jax.enable_x64(True)


def jit(fn):
    """``fn`` as one XLA program (eager JAX dispatches each small op separately, which is slow)."""
    return jax.jit(fn)


def device_groups(values: dict) -> list[list]:
    """``values``' keys grouped by the devices their arrays are on (one group unless a pipeline
    put parameters on different devices): a jitted program takes arrays of one device set."""
    groups: dict = {}
    for k, v in values.items():
        devices = frozenset(getattr(getattr(v, "sharding", None), "device_set", ()) or ())
        groups.setdefault(devices, []).append(k)
    return list(groups.values())
