"""A device mesh as Mithril describes it, before any engine builds it (in the backends layer:
every backend with meshes reads it; :mod:`mithril.distributed` re-exports it).

``device_mesh=(2, 2)`` on a backend is a grid of devices with one name per axis: the engine
behind the backend builds the real mesh (``jax.sharding.Mesh``, ``torch.distributed``'s
``DeviceMesh``) from this description. Axis names default by the mesh's rank, as JAX and torch
users write them: ``("data",)``, ``("data", "model")``, ``("data", "model", "pipe")``.

A ``tensor_split`` says how one array is cut over the mesh: entry ``i`` is the array dim split
over mesh axis ``i`` (None: the array is whole on every device along that axis). ``(0,)`` on a
1-D mesh splits dim 0 (the batch); ``(0, 1)`` on a 2x2 mesh splits rows over ``"data"`` and
columns over ``"model"``; ``(None, 0)`` replicates over ``"data"`` and splits dim 0 over
``"model"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import BackendOptionError, MeshError

DEFAULT_AXIS_NAMES = {1: ("data",), 2: ("data", "model"), 3: ("data", "model", "pipe")}

# A per-dim sharding: the mesh axis each array dim is split over (None: not split).
Spec = tuple  # tuple[str | None, ...]


@dataclass(frozen=True)
class DeviceMesh:
    """``shape`` (devices per axis) and ``axis_names``; ``size`` devices in all."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def axis_size(self, axis: str) -> int:
        return self.shape[self.axis_names.index(axis)]

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}={d}" for n, d in zip(self.axis_names, self.shape)) + ")"


def parse_mesh(owner: str, device_mesh, axis_names=None) -> DeviceMesh | None:
    """``device_mesh`` (None, an int, or a tuple of positive ints) and ``axis_names`` -> a
    :class:`DeviceMesh` (None for None)."""
    if device_mesh is None:
        if axis_names is not None:
            raise BackendOptionError(f"{owner}: axis_names needs a device_mesh")
        return None
    dims = (device_mesh,) if isinstance(device_mesh, int) and not isinstance(device_mesh, bool) else device_mesh
    if (not isinstance(dims, (tuple, list)) or not dims
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)):
        raise BackendOptionError(f"{owner}: device_mesh must be a tuple of positive ints such as (1,), (4,) or "
                                 f"(2, 2), got {device_mesh!r}")
    dims = tuple(int(d) for d in dims)
    if axis_names is None:
        if len(dims) not in DEFAULT_AXIS_NAMES:
            raise BackendOptionError(f"{owner}: a {len(dims)}-D device_mesh needs axis_names (one name per axis)")
        names = DEFAULT_AXIS_NAMES[len(dims)]
    else:
        names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if len(names) != len(dims) or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise BackendOptionError(f"{owner}: axis_names must be {len(dims)} distinct strings, one per axis of "
                                     f"device_mesh={dims}, got {axis_names!r}")
    return DeviceMesh(dims, names)


def split_spec(owner: str, mesh: DeviceMesh, shape: Sequence[int], tensor_split) -> Spec:
    """``tensor_split`` for an array of ``shape`` on ``mesh`` -> its per-dim spec (the axis each
    dim is split over). None splits dim 0 over the first axis (the batch over ``"data"``)."""
    if tensor_split is None:
        tensor_split = (0,) if len(shape) else ()
    elif isinstance(tensor_split, int) and not isinstance(tensor_split, bool):
        tensor_split = (tensor_split,)
    if not isinstance(tensor_split, (tuple, list)) or len(tensor_split) > len(mesh.shape):
        raise BackendOptionError(f"{owner}: tensor_split gives, per mesh axis {mesh.axis_names}, the array dim split "
                                 f"over it (or None); got {tensor_split!r}")
    spec: list[str | None] = [None] * len(shape)
    for axis, dim in zip(mesh.axis_names, tensor_split):
        if dim is None:
            continue
        if not isinstance(dim, int) or isinstance(dim, bool) or not -len(shape) <= dim < len(shape):
            raise BackendOptionError(f"{owner}: tensor_split={tuple(tensor_split)} names dim {dim!r}, but the array "
                                     f"has shape {tuple(shape)}")
        dim %= len(shape)
        if spec[dim] is not None:
            raise BackendOptionError(f"{owner}: tensor_split={tuple(tensor_split)} splits dim {dim} twice")
        spec[dim] = axis
    check_divides(owner, mesh, shape, tuple(spec), "the array")
    return tuple(spec)


def check_divides(owner: str, mesh: DeviceMesh, shape: Sequence[int], spec: Spec, what: str) -> None:
    """Every split dim divides evenly over its axis."""
    for dim, axis in enumerate(spec):
        if axis is None or not isinstance(shape[dim], int):  # a symbolic dim: checked when the value comes
            continue
        n = mesh.axis_size(axis)
        if shape[dim] % n:
            raise MeshError(f"{owner}: {what} of shape {tuple(shape)} can't be split on dim {dim} ({shape[dim]}) over "
                            f"mesh axis {axis!r} of {n} devices: {shape[dim]} is not a multiple of {n}")


def spec_str(spec: Spec) -> str:
    """A spec as JAX's PartitionSpec prints: ``('data', None)``; ``()`` for replicated."""
    if not any(a is not None for a in spec):
        return "replicated"
    return repr(tuple(spec))


def check_batch(owner: str, mesh: DeviceMesh, name: str, shape, spec: Spec) -> None:
    """A data input's batch (dim 0) divides over the axis that splits it."""
    if spec and spec[0] is not None and isinstance(shape[0], int) and shape[0] % mesh.axis_size(spec[0]):
        raise MeshError(f"{owner}: the batch of input {name!r} ({shape[0]}, dim 0 of {tuple(shape)}) is not a multiple "
                        f"of the {mesh.axis_size(spec[0])} devices of mesh axis {spec[0]!r}; use a batch that is, or "
                        f"sharding={{{name!r}: ()}} to keep it whole")
