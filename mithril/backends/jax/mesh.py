"""JaxBackend's device mesh: a ``jax.sharding.Mesh`` and ``NamedSharding`` placements.

Nothing here partitions a program: ``jax.jit`` does (GSPMD), from the shardings of the arrays it
is given; this module only builds the mesh and puts arrays on it.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ..mesh import DeviceMesh, Spec
from ...errors import MeshError

_FLAG = "--xla_force_host_platform_device_count"

# Host devices Mithril asks JAX for when it starts JAX for a mesh: at least this many, so that a
# later, larger mesh in the same process (design 003 makes (2,) then (2, 2)) still finds its
# devices; JAX makes them only once, when it starts. XLA:CPU's devices share the process's
# thread pools, so more devices than cores cost a few idle threads, not memory or speed.
HOST_DEVICES = 8
_STARTED = "JAX had already started in this process"


def _started() -> bool:
    from jax._src import xla_bridge

    return getattr(xla_bridge, "backends_are_initialized", lambda: True)()


def _flag_count() -> int | None:
    """The host-device count ``XLA_FLAGS`` asks for, None where it asks for none."""
    found = re.findall(rf"{_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found else None


def ask_host_devices(jax, mesh: DeviceMesh) -> list[str]:
    """Before JAX starts its CPU client, have it make host devices for the mesh
    (``jax_num_cpu_devices``): a CPU has one device unless asked. Asks for
    ``max(mesh.size, HOST_DEVICES)`` where the count is left at its default, ``mesh.size`` where
    the user set a smaller one. Nothing where ``XLA_FLAGS`` asks for a count (the user's choice)
    or once JAX has started. Returns why it could not ask (for :func:`build_mesh`'s error)."""
    count, started = _flag_count(), _started()
    if count is not None or started:
        too_few = count is not None and count < mesh.size
        why = [f"XLA_FLAGS asks for {count} host device(s) ({_FLAG}={count})"] if too_few else []
        return why + [_STARTED] if started else why
    try:
        current = int(jax.config.jax_num_cpu_devices)
        if current < mesh.size:
            jax.config.update("jax_num_cpu_devices", max(mesh.size, HOST_DEVICES) if current < 1 else mesh.size)
    except AttributeError:  # an older jax without the option
        return ["this jax has no jax_num_cpu_devices option"]
    except RuntimeError:  # JAX started between the check and the update
        return [_STARTED]
    return []


def build_mesh(jax, platform: str, mesh: DeviceMesh, why: tuple[str, ...] | list[str] = ()):
    """The ``jax.sharding.Mesh`` over the first ``mesh.size`` devices of ``platform``, with
    automatic axes (the compiler chooses intermediate shardings; jax.make_mesh's explicit axes
    would make every op spell its output sharding). ``why``: what :func:`ask_host_devices` said,
    for the error when there are too few host devices."""
    devices = jax.devices(platform)
    if len(devices) < mesh.size:
        if platform == "cpu":
            n = mesh.size
            if _flag_count() is not None:
                fix = f"raise the count in XLA_FLAGS to {_FLAG}={n}"
            else:
                fix = (f"run with XLA_FLAGS={_FLAG}={n}, or create JaxBackend(device_mesh={mesh.shape}) (or call "
                       f"jax.config.update('jax_num_cpu_devices', {n})) before any other JAX work")
            if _STARTED in why:
                fix = f"in a new process, {fix}"
            how = f"{': ' + '; '.join(why) if why else ''}. JAX makes host devices only when it starts: {fix}."
        else:
            # Present but too few accelerators: an error, not the CPU (a user who asked for the GPU
            # would not want a silent move to host devices), as jax.make_mesh refuses it too.
            how = (f". Give a device_mesh of at most {len(devices)} device(s), or device='cpu' to run the mesh over "
                   f"the CPU's host devices.")
        raise MeshError(f"JaxBackend: device_mesh={mesh.shape} needs {mesh.size} devices, but jax sees {len(devices)} "
                        f"{platform} device(s){how}")
    from jax.sharding import Mesh

    grid = np.array(devices[:mesh.size], dtype=object).reshape(mesh.shape)
    try:
        from jax.sharding import AxisType

        return Mesh(grid, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.shape))
    except ImportError:  # jax < 0.5: every axis is automatic
        return Mesh(grid, mesh.axis_names)


def sharding(jax, jmesh, spec: Spec):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(jmesh, PartitionSpec(*spec))


def on_mesh(jax, jmesh, value) -> bool:
    """Whether ``value`` is a JAX array placed over this mesh's devices (by any sharding)."""
    s = getattr(value, "sharding", None)
    if s is None:
        return False
    try:
        return s.device_set == set(jmesh.devices.flat)
    except Exception:  # a tracer or an array being deleted
        return False


def per_device_bytes(arrays) -> dict:
    """Bytes of ``arrays`` each device holds: ``{device id: bytes}`` from their shards."""
    out: dict = {}
    for a in arrays:
        for shard in getattr(a, "addressable_shards", ()):
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out
