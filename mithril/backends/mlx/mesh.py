"""MlxBackend's device mesh: one process per device over ``mlx.core.distributed``.

MLX has no global (sharded) array: each process holds ordinary ``mx.array`` values, and the
collectives (``all_sum``, ``all_gather``) join them. So a mesh run is single-program-multiple-
data as ``torch.distributed`` users write it by hand: every process runs the same script on the
same global batch, :func:`local_part` cuts it to this rank's rows, the program runs on them,
:class:`OnMesh` joins the outputs (per-row outputs gathered, others averaged) and
:func:`reduce_gradients` sums the gradients over the ranks. MLX differentiates through its
collectives (``all_sum``'s vjp passes the cotangent through, ``all_gather``'s takes the rank's
rows), which is what makes a joined output's gradient the single-process one.

Processes come from ``mlx.launch --backend ring -n N script.py``, or any launcher that sets
``MLX_RANK`` and ``MLX_HOSTFILE`` (the ring backend's environment); a torchrun-style ``RANK``
stands for ``MLX_RANK`` where a hostfile is given, so
``mithril.distributed.launch.spawn(fn, N, env={"MLX_HOSTFILE": path})`` starts a ring too.
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from ...distributed.mesh import DeviceMesh
from ...errors import MeshError


def _how_to_launch(mesh: DeviceMesh) -> str:
    return (f"start {mesh.size} processes with mlx.launch --backend ring -n {mesh.size} script.py (or set MLX_RANK "
            f"and MLX_HOSTFILE, a JSON list of one ['host:port'] per rank, in each)")


def join_group(mesh: DeviceMesh):
    """The global ``mx.distributed`` group of the ring backend, whose size must be the mesh's."""
    if not mx.distributed.is_available():
        raise MeshError(f"MlxBackend: device_mesh={mesh.shape} needs mlx.core.distributed, which this mlx build lacks")
    if "MLX_RANK" not in os.environ and "RANK" in os.environ and "MLX_HOSTFILE" in os.environ:
        os.environ["MLX_RANK"] = os.environ["RANK"]  # a torchrun-style launcher (mithril.distributed.launch.spawn)
    if "MLX_RANK" not in os.environ or "MLX_HOSTFILE" not in os.environ:
        raise MeshError(f"MlxBackend: device_mesh={mesh.shape} runs over {mesh.size} processes, and this process is "
                        f"not one of a ring group (no MLX_RANK/MLX_HOSTFILE in the environment): "
                        f"{_how_to_launch(mesh)}")
    try:
        group = mx.distributed.init(strict=True, backend="ring")
    except RuntimeError as exc:
        raise MeshError(f"MlxBackend: device_mesh={mesh.shape}: the ring group did not start ({exc}); "
                        f"{_how_to_launch(mesh)}") from exc
    if group.size() != mesh.size:
        raise MeshError(f"MlxBackend: device_mesh={mesh.shape} needs {mesh.size} processes, but the ring group has "
                        f"{group.size()}: {_how_to_launch(mesh)}")
    return group


def coordinate(mesh: DeviceMesh, rank: int, axis: str) -> int:
    """This rank's index along mesh ``axis`` (ranks fill the mesh in row-major order)."""
    return int(np.unravel_index(rank, mesh.shape)[mesh.axis_names.index(axis)])


def local_part(value, mesh: DeviceMesh, rank: int, spec):
    """This rank's part of ``value`` (the whole array, the same on every rank) cut by ``spec``
    (the mesh axis of each dim, None for whole)."""
    index = []
    for dim, axis in enumerate(spec):
        if axis is None:
            index.append(slice(None))
            continue
        n, size = mesh.axis_size(axis), value.shape[dim]
        if size % n:
            raise MeshError(f"MlxBackend: dim {dim} ({size}) of an array of shape {tuple(value.shape)} can't be split "
                            f"over mesh axis {axis!r} of {n} devices: {size} is not a multiple of {n}")
        i = coordinate(mesh, rank, axis)
        index.append(slice(i * (size // n), (i + 1) * (size // n)))
    return value[tuple(index)] if index else value


def batched_inputs(plan) -> set[str]:
    """The data inputs of the lowering plan that hold a batch (at least one dim, not strings):
    the ones data parallel splits on dim 0, as :func:`mithril.distributed.plan_sharding` does."""
    params = {v.name for v in plan.params}
    return {v.name for v in plan.inputs if v.name not in params and v.shape is not None and len(v.shape)
            and (v.dtype is None or v.dtype != object)}


def batched_outputs(plan) -> dict[str, bool]:
    """Per output of the lowering plan: whether it is per-row (its dim 0 is a data input's dim
    0, the batch), so that the ranks' parts are gathered; otherwise (a scalar loss) averaged."""
    split = batched_inputs(plan)
    batch = {v.shape[0] for v in plan.inputs if v.name in split}
    return {v.name: v.shape is not None and len(v.shape) > 0 and v.shape[0] in batch for v in plan.outputs}


class OnMesh:
    """The generated forward on this rank's rows, its outputs joined over the ranks: per-row
    outputs (:func:`batched_outputs`) gathered in rank order (``all_gather``), the others
    averaged (``all_sum`` / ranks: a batch-mean loss of equal parts is the mean of the parts'),
    so every rank sees what one process computes on the whole batch. A non-floating output that
    is not per-row (a count, a shape) is this rank's own."""

    def __init__(self, forward, group, plan, wrap, unwrap):
        self.forward, self.group = forward, group
        self.batched, self.split_inputs = batched_outputs(plan), batched_inputs(plan)
        self.wrap, self.unwrap = wrap, unwrap

    def __call__(self, params, data):
        out = self.forward(params, data)
        joined = {}
        for name, value in out.items():
            native = self.unwrap(value)
            if not isinstance(native, mx.array):
                joined[name] = value
            elif self.batched.get(name) and native.ndim:
                joined[name] = self.wrap(mx.distributed.all_gather(native, group=self.group))
            elif mx.issubdtype(native.dtype, mx.floating):
                joined[name] = self.wrap(mx.distributed.all_sum(native, group=self.group) * (1.0 / self.group.size()))
            else:
                joined[name] = value
        return joined


def reduce_gradients(grads: dict, group, gathered) -> dict:
    """Each rank's gradients -> the whole batch's: a parameter's (and a whole data input's) summed
    over the ranks (each rank's is its rows' share: the cotangent reached it through the
    averaged or gathered outputs), a split data input's gathered (its rows, in rank order)."""
    out = {}
    for name, g in grads.items():
        if name in gathered:
            out[name] = mx.distributed.all_gather(g, group=group)
        else:
            out[name] = mx.distributed.all_sum(g, group=group)
    return out


def local_bytes(values) -> int:
    """Bytes this process holds of ``values``."""
    return sum(v.nbytes for v in values if isinstance(v, mx.array))
