"""TorchBackend's device mesh: ``torch.distributed``'s ``DeviceMesh`` and DTensor placements.

One process per device (torchrun, ``mithril launch``, or
:func:`mithril.distributed.launch.spawn`): the mesh spans the process group, and an array split
over it is a ``DTensor`` whose placements (``Shard(d)`` or ``Replicate()`` per mesh dim) come
from Mithril's per-dim spec. Nothing here partitions a program: DTensor does, op by op, from
its inputs' placements, inserting the collectives (all-reduce, all-gather, reduce-scatter);
this module builds the mesh, places arrays on it, and runs the ops DTensor has no sharding rule
for on whole (replicated) tensors.
"""

from __future__ import annotations

import os
import re
import warnings

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.overrides import TorchFunctionMode

from ..mesh import DeviceMesh, Spec
from ...errors import MeshError, ReplicatedOpsWarning
from . import xp as _xp

_xp.DTENSOR = DTensor  # the facade gives NumPy the whole array of a DTensor


def _how_to_launch(mesh: DeviceMesh) -> str:
    return (f"start one process per device: torchrun --nproc-per-node {mesh.size} script.py, or "
            f"mithril launch --nproc {mesh.size} script.py (from Python: "
            f"mithril.distributed.launch.spawn(fn, {mesh.size}))")


def join_process_group(mesh: DeviceMesh, device_type: str) -> None:
    """The default process group, initialized from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) where nobody has yet: gloo on the CPU,
    NCCL on CUDA. Its size must be the mesh's."""
    if not dist.is_available():
        raise MeshError(f"TorchBackend: device_mesh={mesh.shape} needs torch.distributed, which this torch build "
                        f"lacks")
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise MeshError(f"TorchBackend: device_mesh={mesh.shape} runs over {mesh.size} processes, and this "
                            f"process is not one of a process group (no torch.distributed process group, no "
                            f"RANK/WORLD_SIZE in the environment): {_how_to_launch(mesh)}")
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    world = dist.get_world_size()
    if world != mesh.size:
        raise MeshError(f"TorchBackend: device_mesh={mesh.shape} needs {mesh.size} processes, but the process group "
                        f"has {world}: {_how_to_launch(mesh)}")


def build_mesh(device_type: str, mesh: DeviceMesh):
    """``torch.distributed.device_mesh.init_device_mesh`` over the process group, named axes."""
    from torch.distributed.device_mesh import init_device_mesh

    join_process_group(mesh, device_type)
    return init_device_mesh(device_type, mesh.shape, mesh_dim_names=mesh.axis_names)


def placements(mesh: DeviceMesh, spec: Spec) -> tuple:
    """Per mesh axis: ``Shard(d)`` for the array dim ``d`` the spec splits over it, else ``Replicate()``."""
    return tuple(next((Shard(d) for d, a in enumerate(spec) if a == axis), Replicate()) for axis in mesh.axis_names)


def is_dtensor(value) -> bool:
    return isinstance(value, DTensor)


def shard(tmesh, mesh: DeviceMesh, value: torch.Tensor, spec: Spec) -> DTensor:
    """``value`` (the whole array, the same on every rank: rank 0's is scattered) as a DTensor
    split by ``spec``."""
    return distribute_tensor(value, tmesh, placements(mesh, spec))


def from_local(tmesh, mesh: DeviceMesh, part: torch.Tensor, spec: Spec) -> DTensor:
    """This process's ``part`` of an array split by ``spec``, as the DTensor of the whole."""
    return DTensor.from_local(part, tmesh, placements(mesh, spec), run_check=False)


def no_partial(value):
    """A DTensor with a pending sum (``Partial``) reduced to whole (``Replicate``) on that axis;
    anything else as it is. Outputs handed to users hold no pending sums."""
    if isinstance(value, DTensor) and any(p.is_partial() for p in value.placements):
        return value.redistribute(value.device_mesh, [Replicate() if p.is_partial() else p for p in value.placements])
    return value


def like(grad, param):
    """``grad`` with ``param``'s placements (a data-parallel gradient's pending sum becomes an
    all-reduce, a sharded parameter's a reduce-scatter), so an optimizer meets equal placements."""
    if isinstance(param, DTensor):
        if not isinstance(grad, DTensor):
            return DTensor.from_local(grad, param.device_mesh, [Replicate()] * param.device_mesh.ndim,
                                      run_check=False).redistribute(param.device_mesh, param.placements)
        if tuple(grad.placements) != tuple(param.placements):
            return grad.redistribute(param.device_mesh, param.placements)
    return grad


def like_output(cotangent, output):
    """A cotangent (a whole tensor, the same on every process) placed as its DTensor output is
    (a pending sum counts as whole)."""
    if isinstance(output, DTensor) and not isinstance(cotangent, DTensor):
        whole = [Replicate() if p.is_partial() else p for p in output.placements]
        return distribute_tensor(cotangent, output.device_mesh, whole)
    return cotangent


def local_bytes(values) -> int:
    """Bytes this process holds of ``values``: a DTensor's local shard, a tensor's whole."""
    total = 0
    for v in values:
        t = v.to_local() if isinstance(v, DTensor) else v
        if isinstance(t, torch.Tensor) and not t.is_meta:  # meta: another pipeline stage's parameter
            total += t.numel() * t.element_size()
    return total


# aten ops this process gave a replicated sharding rule (they had none), and ops reported in a warning.
_REGISTERED: set = set()
_WARNED: set = set()
_COLLECTING: list = []  # while a gradient pass runs: the ops its forward ran replicated, warned with its own
_MISSING = re.compile(r"Operator (aten\.\w+\.\w+) does not have a sharding strategy")


def replicating_missing_ops(run, attempts: int = 16):
    """``run()``; where DTensor has no sharding rule for an aten op (a backward op such as
    ``avg_pool2d_backward``, which no torch function mode sees), that op gets one that runs it on
    whole tensors (every input ``Replicate()``: DTensor gathers them) and ``run`` runs again.
    One :class:`ReplicatedOpsWarning` lists the ops found."""
    found = set()
    _COLLECTING.append(found)
    try:
        for _ in range(attempts):
            try:
                return run()
            except (NotImplementedError, RuntimeError) as exc:
                op = _missing_op(exc)
                if op is None or op in _REGISTERED:
                    raise
                _register_replicated(op)
                found.add(str(op).removeprefix("aten.").removesuffix(".default"))
        return run()
    finally:
        _COLLECTING.remove(found)
        warn_replicated(found)


def _missing_op(exc: Exception):
    m = _MISSING.search(str(exc))
    if m is None:
        return None
    _, name, overload = m.group(1).split(".")
    try:
        return getattr(getattr(torch.ops.aten, name), overload)
    except AttributeError:
        return None


def _register_replicated(op) -> None:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor.experimental import register_sharding

    returns = len(op._schema.returns)

    def whole(*args, **kwargs):
        return [([Replicate()] * returns, [Replicate() if isinstance(a, DTensorSpec) else None for a in args])]

    register_sharding(op)(whole)
    _REGISTERED.add(op)


def warn_replicated(ops) -> None:
    """One :class:`ReplicatedOpsWarning` for the ops of ``ops`` not reported yet in this process."""
    if _COLLECTING:
        _COLLECTING[-1].update(ops)
        return
    new = set(ops) - _WARNED
    if new:
        _WARNED.update(new)
        warnings.warn(f"TorchBackend: DTensor has no sharding rule for {', '.join(sorted(new))}: "
                      f"{'these ops run' if len(new) > 1 else 'this op runs'} on whole (replicated) tensors, "
                      f"gathered from their shards", ReplicatedOpsWarning, stacklevel=3)


def _is_missing_rule(exc: Exception) -> bool:
    text = str(exc).lower()
    return "sharding strategy" in text or "sharding propagation" in text or "does not have a sharding" in text


# DTensor's convolution rule gives the output the input's placement and ignores the weight's: a
# weight split by FSDP or tensor parallelism computed wrong local channels (ResNet-18, torch 2.13).
_CONVOLUTIONS = frozenset(f for f in (
    getattr(torch.nn.functional, name, None) for name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d",
                                                          "conv_transpose2d", "conv_transpose3d")) if f is not None) | {
    torch.convolution}


# Gather's lookup (xp.take): DTensor's rules for index_select and its backward's index_add_ differ
# between torch versions (torch 2.11's backward met a whole index and a split gradient: "Number of
# indices (32) should be equal to source.size(dim): (16)", the GPT's four strategies on the device
# machine, where running only the split index's lookups locally left them failing); the lookup runs
# on local tensors instead (_local_index_select), by a split index or a whole one.
_INDEX_SELECTS = frozenset({torch.index_select, torch.Tensor.index_select})

# LayerNormalization (F.layer_norm): torch 2.11's DTensor rule left an FSDP-split weight split
# ("Expected weight to be of same shape as normalized_shape, but got weight of shape [8] and
# normalized_shape = [16]", the GPT under fsdp); it runs on local tensors instead (_local_layer_norm).
_LAYER_NORMS = frozenset({torch.nn.functional.layer_norm, torch.layer_norm})


class MeshMode(TorchFunctionMode):
    """The torch ops of a program over DTensors. A plain tensor that meets a DTensor (a constant,
    positions made by Range, a value computed on the host) becomes a replicated DTensor: the
    same on every process, as each process computed it. (DTensor's own ``implicit_replication``
    does this only inside each op, and loses gradients: ``index_select``'s backward of a
    pending-sum gradient with a plain index came out zero, torch 2.13.) An op DTensor can't split
    (no sharding rule) runs on whole tensors: its DTensor arguments redistributed to
    ``Replicate()``, the op on the local (whole) tensors, its tensor outputs replicated DTensors;
    autograd follows (``to_local``/``from_local`` are differentiable). A convolution's split
    weight and bias are gathered whole first (DTensor's rule would ignore their split), and its
    input's split channels or positions too; its batch stays split, and it runs on the local
    tensors; so do a lookup (``index_select``) and a LayerNorm. Those gathered
    weights and the replicated ops are collected in ``ops``."""

    active = 0  # MeshModes entered and not left (a program's forward, a recomputed checkpoint)

    def __init__(self, ops: set):
        super().__init__()
        self.ops = ops

    def __enter__(self):
        MeshMode.active += 1
        return super().__enter__()

    def __exit__(self, *exc):
        MeshMode.active -= 1
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tmesh = _mesh_of(args, kwargs)
        if tmesh is None:
            return func(*args, **kwargs)
        whole = [Replicate()] * tmesh.ndim

        def replicated(v):
            if isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
                return DTensor.from_local(v, tmesh, whole, run_check=False)
            if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
                return type(v)(replicated(x) for x in v)
            return v

        args, kwargs = replicated(args), {k: replicated(v) for k, v in kwargs.items()}
        if func in _CONVOLUTIONS:
            args, kwargs = self._conv_arguments(func, tmesh, args, kwargs)
            return _local_convolution(func, tmesh, args, kwargs)
        if func in _INDEX_SELECTS:
            out = _local_index_select(func, tmesh, args, kwargs)
            if out is not NotImplemented:
                return out
        if func in _LAYER_NORMS:
            out = _local_layer_norm(func, tmesh, args, kwargs)
            if out is not NotImplemented:
                return out
        try:
            return func(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as exc:
            if not _is_missing_rule(exc):
                raise
        self.ops.add(getattr(func, "__name__", str(func)))

        def local(v):
            if isinstance(v, DTensor):
                return v.redistribute(tmesh, whole).to_local()
            if isinstance(v, (list, tuple)):
                return type(v)(local(x) for x in v)
            return v

        out = func(*local(args), **{k: local(v) for k, v in kwargs.items()})
        return replicated(out)

    def _conv_arguments(self, func, tmesh, args, kwargs):
        def gathered(v, keep_batch):
            if not isinstance(v, DTensor):
                return v
            want = [p if not p.is_shard() or (keep_batch and p.dim == 0) else Replicate() for p in v.placements]
            if want == list(v.placements):
                return v
            self.ops.add(f"{getattr(func, '__name__', 'convolution')}'s split weights")
            return v.redistribute(tmesh, want)

        args = list(args)
        for i in range(min(len(args), 3)):
            args[i] = gathered(args[i], keep_batch=i == 0)
        for name in ("input", "weight", "bias"):
            if name in kwargs:
                kwargs[name] = gathered(kwargs[name], keep_batch=name == "input")
        return tuple(args), kwargs


def _whole_local(v, tmesh, split_like):
    """``v`` (a weight, a table) for an op run on local tensors whose operand is placed as
    ``split_like``: gathered whole on every process (a split or a pending sum redistributed), its
    local copy, whose gradient is a pending sum over the mesh axes ``split_like`` splits (each
    process's share of the batch adds its part). Anything not a DTensor as it is."""
    from torch.distributed.tensor import Partial

    if not isinstance(v, DTensor):
        return v
    if any(not p.is_replicate() for p in v.placements):
        v = v.redistribute(tmesh, [Replicate()] * tmesh.ndim)
    return v.to_local(grad_placements=[Partial() if p.is_shard() else Replicate() for p in split_like])


def _local_convolution(func, tmesh, args, kwargs):
    """A convolution whose input is split on its batch only and whose weight and bias are whole
    (after ``MeshMode._conv_arguments``), run on each process's local tensors: its output is split
    as its input is. DTensor's own convolution handler is not used: up to torch 2.11 it took
    every split input for a split of the width (tensor-parallel convolution) and refused most
    geometries ("input_size[-1] is divisible by stride[-1] and stride[-1] equals
    kernel_size[-1]"); torch 2.13's skips that for a batch split. The weight's and bias's
    gradients are pending sums over the axes the batch is split on."""
    x = args[0] if args else kwargs["input"]
    if not isinstance(x, DTensor):
        return func(*args, **kwargs)
    if any(p.is_partial() for p in x.placements):  # a pending sum: the bias would be added on every process
        x = x.redistribute(tmesh, [Replicate() if p.is_partial() else p for p in x.placements])
    args = tuple(x.to_local() if i == 0 else _whole_local(v, tmesh, x.placements) for i, v in enumerate(args))
    kwargs = {k: x.to_local() if k == "input" else _whole_local(v, tmesh, x.placements) for k, v in kwargs.items()}
    out = func(*args, **kwargs)
    return DTensor.from_local(out, tmesh, x.placements, run_check=False)


def _local_index_select(func, tmesh, args, kwargs):
    """``index_select(values, dim, index)`` with an index whole or split on its dim 0, run on
    each process's local tensors: the values whole (gathered where split; their gradient a pending
    sum over the axes the index is split on, as each process looks up its own rows), the output
    split on ``dim`` as the index is. Its backward meets the output's gradient redistributed as
    the output was made (``from_local``'s rule), so index and gradient agree whatever DTensor did
    in between. NotImplemented for an index with a pending sum or other splits, or values that are
    not a DTensor (DTensor's rule runs)."""
    names = ("input", "dim", "index")
    bound = dict(zip(names, args), **kwargs)
    values, dim, index = bound.get("input", bound.get("self")), bound.get("dim"), bound.get("index")
    if set(bound) - {"input", "self", "dim", "index"} or not isinstance(index, DTensor) or \
            not all(p.is_replicate() or (p.is_shard() and p.dim == 0) for p in index.placements) or \
            not isinstance(values, DTensor):
        return NotImplemented
    dim = dim % values.ndim
    out = func(_whole_local(values, tmesh, index.placements), dim, index.to_local())
    return DTensor.from_local(out, tmesh, [Shard(dim) if p.is_shard() else Replicate() for p in index.placements],
                              run_check=False)


def _local_layer_norm(func, tmesh, args, kwargs):
    """``layer_norm(input, normalized_shape, weight, bias, eps)`` on each process's local tensors:
    the input keeps its splits on the leading (not normalized) dims, others are gathered; the
    weight and bias are gathered whole (their gradients pending sums over the axes the input is
    split on); the output is split as the input. NotImplemented for an input that is not a
    DTensor (DTensor's rule runs)."""
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    bound = dict(zip(names, args), **kwargs)
    x = bound.get("input")
    if set(bound) - set(names) or not isinstance(x, DTensor) or "normalized_shape" not in bound:
        return NotImplemented
    lead = x.ndim - len(tuple(bound["normalized_shape"]))
    keep = [p if p.is_shard() and p.dim < lead else Replicate() for p in x.placements]
    if keep != list(x.placements):
        x = x.redistribute(tmesh, keep)
    out = func(x.to_local(), tuple(bound["normalized_shape"]), _whole_local(bound.get("weight"), tmesh, x.placements),
               _whole_local(bound.get("bias"), tmesh, x.placements), bound.get("eps", 1e-5))
    return DTensor.from_local(out, tmesh, x.placements, run_check=False)


def under_mesh_mode(fn):
    """``fn`` run under a :class:`MeshMode` where none is active: a checkpointed segment that
    autograd recomputes in the backward pass, outside the program's forward."""
    def run(*args):
        if MeshMode.active:
            return fn(*args)
        ops: set = set()
        with MeshMode(ops):
            out = fn(*args)
        warn_replicated(ops)
        return out

    return run


def _mesh_of(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, DTensor):
            return v.device_mesh
        if isinstance(v, (list, tuple)):
            m = _mesh_of(v, {})
            if m is not None:
                return m
    return None


class OnMesh:
    """The generated forward over DTensors, under :class:`MeshMode` (plain tensors meeting
    DTensors are replicated ones; ops without a sharding rule run replicated, one
    :class:`ReplicatedOpsWarning` per program listing them); outputs hold no pending sums."""

    def __init__(self, forward):
        self.forward = forward
        self.ops: set = set()

    def __call__(self, params, data):
        with MeshMode(self.ops):
            out = self.forward(params, data)
        warn_replicated(self.ops)
        return {k: _xp.TorchArray(no_partial(v.native)) if isinstance(v, _xp.TorchArray) else v
                for k, v in out.items()}


__all__ = ["DTensor", "MeshMode", "OnMesh", "build_mesh", "from_local", "like", "like_output", "local_bytes",
           "no_partial", "placements", "shard"]
