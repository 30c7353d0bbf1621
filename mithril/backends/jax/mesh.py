"""JaxBackend's device mesh: a ``jax.sharding.Mesh`` and ``NamedSharding`` placements.

Nothing here partitions a program: ``jax.jit`` does (GSPMD), from the shardings of the arrays it
is given; this module only builds the mesh and puts arrays on it.
"""

from __future__ import annotations

import os

import numpy as np

from ..mesh import DeviceMesh, Spec
from ...errors import MeshError

_FLAG = "--xla_force_host_platform_device_count"


def _started() -> bool:
    from jax._src import xla_bridge

    return getattr(xla_bridge, "backends_are_initialized", lambda: True)()


def ask_host_devices(jax, mesh: DeviceMesh) -> None:
    """Before JAX starts its CPU client, have it make as many host devices as the mesh needs
    (``jax_num_cpu_devices``): a CPU has one device unless asked. A no-op once JAX has started, or
    where ``XLA_FLAGS`` already asks for a count (the user's choice)."""
    if _started() or _FLAG in os.environ.get("XLA_FLAGS", ""):
        return
    try:
        if int(jax.config.jax_num_cpu_devices) < mesh.size:
            jax.config.update("jax_num_cpu_devices", mesh.size)
    except (AttributeError, RuntimeError):  # an older jax without the option
        pass


def build_mesh(jax, platform: str, mesh: DeviceMesh):
    """The ``jax.sharding.Mesh`` over the first ``mesh.size`` devices of ``platform``, with
    automatic axes (the compiler chooses intermediate shardings; jax.make_mesh's explicit axes
    would make every op spell its output sharding)."""
    devices = jax.devices(platform)
    if len(devices) < mesh.size:
        how = ""
        if platform == "cpu":
            how = (f" On the CPU, JAX makes host devices when asked before it starts: run with "
                   f"XLA_FLAGS={_FLAG}={mesh.size}, or create JaxBackend(device_mesh={mesh.shape}) (or call "
                   f"jax.config.update('jax_num_cpu_devices', {mesh.size})) before any other JAX work.")
            if _started():
                how += " JAX has already started in this process, so start a new one."
        raise MeshError(f"JaxBackend: device_mesh={mesh.shape} needs {mesh.size} devices, but jax sees {len(devices)} "
                        f"{platform} device(s).{how}")
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
