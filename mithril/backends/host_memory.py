"""Host memory as backends see it: copies aligned the way XLA:CPU adopts them without a copy,
and the process's resident memory."""

from __future__ import annotations

import os
import sys

import numpy as np


# XLA:CPU's buffer alignment in bytes: jax.device_put adopts a NumPy array aligned so instead of
# copying it (JaxBackend.share, the JAX hoisted parameter work).
ALIGNMENT = 64


def aligned_copy(value: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """A C-contiguous copy of ``value`` whose data starts on an ``alignment``-byte boundary."""
    value = np.asarray(value)
    raw = np.empty(value.nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start:start + value.nbytes].view(value.dtype).reshape(value.shape)
    np.copyto(out, value)
    return out


def process_memory_info() -> dict:
    """The process's resident memory now (``used``) and at most so far (``peak``), in MB."""
    peak = used = None
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = maxrss / 2**20 if sys.platform == "darwin" else maxrss / 2**10  # bytes on macOS, KB on Linux
    except ImportError:  # Windows
        pass
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, AttributeError):
        used = peak
    if peak is None or (used is not None and used > peak):
        peak = used  # ru_maxrss is sampled; the current size bounds it from below
    return {"used": used, "peak": peak, "source": "process resident memory (RSS)"}
