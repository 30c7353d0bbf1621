"""What the host CPU is, for the backends whose fastest kernel depends on it (XLA's YNNPACK
dots, MKL against oneDNN matmuls): read from /proc/cpuinfo and the process's CPU affinity."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def cpu_flags() -> tuple[str, frozenset[str]]:
    """The CPU's vendor id and feature flags from /proc/cpuinfo; ("", frozenset()) where there is none."""
    vendor, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity): what XLA:CPU sizes its thread pool by."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
