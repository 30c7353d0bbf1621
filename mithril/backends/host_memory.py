"""Host memory as backends see it: copies aligned the way XLA:CPU adopts them without a copy,
the process's resident memory, and the pages of memory-mapped weights handed back."""

from __future__ import annotations

import mmap
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


def mapped_file(array) -> mmap.mmap | None:
    """The read-only memory map whose bytes ``array`` views (through views and memoryviews:
    onnx_ir's external data, ``np.frombuffer`` of an ``mmap``), or None (its own memory, or a
    writable map)."""
    base = array
    while True:
        nxt = base.base if isinstance(base, np.ndarray) else base.obj if isinstance(base, memoryview) else None
        if nxt is None:
            break
        base = nxt
    if not isinstance(base, mmap.mmap):
        return None
    try:
        with memoryview(base) as view:
            return base if view.readonly else None
    except (ValueError, TypeError):  # closed
        return None


def release_mapped_pages(array: np.ndarray) -> bool:
    """Hands back the resident pages of the file region ``array`` reads when it views a read-only
    memory map (:func:`mapped_file`): a backend that made its own converted copy (transposed,
    quantized) stops holding the weight twice. The pages are clean copies of the file (a
    read-only shared map cannot differ from it): reading ``array`` again faults them back in
    from the page cache or the disk. Returns whether pages were released (Linux and macOS)."""
    mm = mapped_file(array) if isinstance(array, np.ndarray) else None
    if mm is None or array.size == 0 or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    low = high = 0
    for n, stride in zip(array.shape, array.strides):
        low += min(0, stride * (n - 1))
        high += max(0, stride * (n - 1))
    start = array.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data + low
    end = min(start - low + high + array.itemsize, len(mm))
    start -= start % mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (OSError, ValueError):
        return False
    return True


# Below this NumPy's allocator gives no huge-page advice, and a mapping of its own is no gain.
_OWN_MAPPING_FROM = 4 << 20


def page_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` (uint8, writable) for a weight a backend converts once and keeps: from 4 MiB
    on, a private anonymous mapping of its own (unmapped when the array goes), in base pages,
    populated when it is made (``MAP_POPULATE`` where the OS has it). NumPy advises huge pages
    for such allocations (``MADV_HUGEPAGE``), and first touching them cost 3.1 s of system time
    per GiB in a Firecracker VM against 0.6 s in 4 KiB pages; populating the base pages in one
    call costs a third of touching them one fault at a time (0.08 s against 0.25 s for 256 MiB
    on a Xeon VM). A weight matrix is read row by row, where huge pages gain little."""
    if nbytes < _OWN_MAPPING_FROM or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(max(nbytes, 1), np.uint8)
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)
