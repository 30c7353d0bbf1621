"""What every backend checks its options and devices with: device names (``"cuda:1"``), the
one-device mesh of a backend that cannot split, sizes in bytes (``"4GB"``), and the one-line
warning pointed at the user's code when the machine cannot honour an option."""

from __future__ import annotations

import os
import re
import sys
import warnings

import numpy as np

from ..errors import BackendOptionError, BackendOptionWarning, DeviceFallbackWarning, MeshError


# Device kinds the backends know; which are present depends on the machine.
DEVICE_KINDS = ("cpu", "gpu", "cuda", "mps", "tpu")
_DEVICE_NAME = re.compile(r"^(?P<kind>[a-z]+)(?::(?P<index>\d+))?$")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mithril/


def warn_user(message: str, category: type[Warning] = BackendOptionWarning) -> None:
    """One warning line, attributed to the first caller outside Mithril (the user's line)."""
    frame, level = sys._getframe(1), 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def device_kind(backend, device, kinds=DEVICE_KINDS) -> tuple[str, int | None]:
    """``"cuda:1"`` -> ``("cuda", 1)``; a name that is no device kind of ``kinds`` is an error
    listing them."""
    match = _DEVICE_NAME.match(str(device).strip().lower()) if isinstance(device, str) else None
    if match is None or match["kind"] not in kinds:
        raise BackendOptionError(
            f"{type(backend).__name__}: {device!r} is not a device; devices are named "
            f"{', '.join(kinds)} (optionally with ':<index>', e.g. '{kinds[1] if len(kinds) > 1 else kinds[0]}:0')")
    return match["kind"], int(match["index"]) if match["index"] is not None else None


def cpu_device(backend, device) -> str:
    """For a CPU-only backend: ``"cpu"`` for any real device name, warning once when another
    was asked for; an error for a name that is no device."""
    kind, _ = device_kind(backend, device)
    if kind != "cpu":
        warn_user(f"{type(backend).__name__} runs on the CPU only; device {device!r} is not used, running on cpu",
                  DeviceFallbackWarning)
    return "cpu"


def check_device_mesh(backend, mesh, tensor_split=None):
    """``device_mesh``: None or a mesh of one device ((1,), (1, 1)) -> the mesh as a tuple (or
    None), for a backend that runs on one device: larger meshes are refused."""
    if mesh is None:
        if tensor_split is not None:
            raise BackendOptionError(f"{type(backend).__name__}: tensor_split needs a device_mesh")
        return None
    dims = (mesh,) if isinstance(mesh, int) else mesh
    if not isinstance(dims, (tuple, list)) or not dims or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise BackendOptionError(f"{type(backend).__name__}: device_mesh must be a tuple of positive ints "
                                 f"such as (1,) or (2, 2), got {mesh!r}")
    if int(np.prod(dims)) > 1:
        raise MeshError(
            f"{type(backend).__name__}: device_mesh={tuple(dims)} asks for {int(np.prod(dims))} devices; "
            f"{type(backend).__name__} runs on one device (use device_mesh=None or (1,)). JaxBackend shards "
            "programs over device meshes (docs/distributed.md)")
    return tuple(dims)


def parse_bytes(value, what: str = "memory_limit") -> int:
    """``4 * 2**30``, ``"4GB"``, ``"512MB"``, ``"1.5GiB"`` -> bytes. KB/MB/GB/TB count in 1024s,
    as the KiB/MiB/GiB/TiB spellings do (``4 * 1024**3`` is "4GB" in Mithril's documents)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0:
        return int(value)
    units = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", value.lower()) if isinstance(value, str) else None
    if match is None or float(match[1]) <= 0:
        raise BackendOptionError(f"{what} takes a positive number of bytes or a size such as '4GB' or '512MB', "
                                 f"got {value!r}")
    return int(float(match[1]) * units[match[2]])
