"""Which mesh axis splits each parameter and input: the strategies as placement rules.

``ml.compile(model, backend, parallel=...)`` turns a strategy into one :class:`ShardingPlan`,
a per-dim spec for every parameter and data input, found by walking the lowering plan. The
engine does the rest: JAX's compiler (GSPMD) partitions the jitted program from the inputs'
shardings and inserts the collectives (the gradients' all-reduce in data parallel, the
all-gathers of fully sharded parameters, the partial sums of a row-split matmul);
``torch.distributed``'s DTensor does the same per op. A placement never changes a result, only
where the work and the memory go: the single-device run is the reference every test compares to.

Strategies (``parallel=``, a name or a dict ``{strategy: mesh axis}``):

- ``"data"``: data inputs split on dim 0 (the batch) over the axis, parameters whole on every
  device; gradients come out summed over the devices (all-reduced).
- ``"fsdp"``: as ``"data"``, and every parameter split on its first dim that divides (ZeRO-3:
  each device holds about 1/N of the parameters and of the optimizer state, gathered per use).
- ``"tensor"`` (``"model"``): Megatron-style. A MatMul/Gemm weight is split column-wise (its
  output features) unless its input already carries a split feature dim, then row-wise (its
  input features), so an MLP block's two matmuls and attention's Q/K/V and output projections
  pair up with one partial sum between them; the split is followed through elementwise ops,
  reshapes, transposes, softmax and matmuls between activations (attention heads). Conv weights
  are split on output channels (or input channels after a split), the same way; embedding
  tables (a Gather's parameter) on their rows, the vocabulary.

``sharding={regex: spec}`` overrides per name (parameters and data inputs): a spec is a tuple
with one mesh axis name or None per dim (JAX's PartitionSpec), ``()`` or None for whole.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import MeshError, ReplicatedOpsWarning
from ..backends.mesh import DeviceMesh, Spec, check_batch, check_divides, spec_str

STRATEGIES = ("data", "fsdp", "tensor", "pipeline")
_ALIASES = {"model": "tensor", "data_parallel": "data", "tensor_parallel": "tensor", "model_parallel": "tensor",
            "fully_shard": "fsdp", "zero3": "fsdp", "pipeline_parallel": "pipeline"}
# The axis a strategy takes by default: its usual name where the mesh has it, else the first axis
# (tensor parallel: the last one).
_DEFAULT_AXIS = {"data": "data", "fsdp": "data", "tensor": "model", "pipeline": "pipe"}


@dataclass
class ShardingPlan:
    """``specs``: name -> per-dim mesh axes (parameters and data inputs; names absent are whole on
    every device); ``replicated``: parameters a strategy left whole, with why; ``strategies``:
    strategy -> the mesh axis it uses. ``print(plan)`` shows the table."""

    mesh: DeviceMesh
    strategies: dict[str, str]
    specs: dict[str, Spec] = field(default_factory=dict)
    replicated: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # parameters'
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # data inputs'
    itemsizes: dict[str, int] = field(default_factory=dict)
    # Pipeline parallel: the stages (a Checkpointing whose segments the program calls through
    # backend.pipeline_stage), each parameter's stage, and the micro-batches a batch is cut into.
    pipeline: object = None
    stages: dict[str, int] = field(default_factory=dict)
    microbatches: int = 1

    def spec(self, name: str) -> Spec:
        shape = self.shapes.get(name, self.input_shapes.get(name, ()))
        return self.specs.get(name) or (None,) * len(shape)

    def per_device_bytes(self, names=None) -> int:
        """Bytes one device holds of ``names`` (default: every parameter planned) by the specs."""
        total = 0
        names = list(self.shapes if names is None else names)
        if self.stages:  # pipeline: each device holds its stage's parameters; the largest stage's
            per_stage: dict[int, int] = {}
            for name in names:
                stage = self.stages.get(name, 0)
                per_stage[stage] = per_stage.get(stage, 0) + int(np.prod(self.shapes[name], dtype=np.int64)) * \
                    self.itemsizes.get(name, 4)
            return max(per_stage.values(), default=0)
        for name in names:
            n = int(np.prod(self.shapes[name], dtype=np.int64))
            for axis in self.spec(name):
                if axis is not None:
                    n //= self.mesh.axis_size(axis)
            total += n * self.itemsizes.get(name, 4)
        return total

    def __str__(self) -> str:
        lines = [f"mesh {self.mesh}; " + ", ".join(f"{s} over {a!r}" for s, a in self.strategies.items())
                 + (f", {self.microbatches} micro-batches" if self.pipeline is not None else "")]
        width = max((len(n) for n in self.shapes), default=4)
        for name, shape in self.shapes.items():
            why = self.replicated.get(name)
            where = f"stage {self.stages[name]}" if name in self.stages else spec_str(self.spec(name))
            lines.append(f"  {name:<{width}}  {str(tuple(shape)):<18} {where}" + (f"  ({why})" if why else ""))
        return "\n".join(lines)


def parse_parallel(owner: str, parallel, mesh: DeviceMesh) -> dict[str, str]:
    """``parallel``: a strategy name or ``{strategy: axis}`` -> ``{strategy: axis}``, checked
    against the mesh's axes."""
    if isinstance(parallel, str):
        parallel = {parallel: None}
    if isinstance(parallel, Mapping):
        parallel = {k: v for k, v in parallel.items() if k != "microbatches"}
    if not isinstance(parallel, Mapping) or not parallel:
        raise MeshError(f"{owner}: parallel= takes a strategy ({', '.join(STRATEGIES)}) or a dict "
                        f"{{strategy: mesh axis}} such as {{'data': 'data', 'tensor': 'model'}}, got {parallel!r}")
    out: dict[str, str] = {}
    for key, axis in parallel.items():
        strategy = _ALIASES.get(key, key)
        if strategy not in STRATEGIES:
            raise MeshError(f"{owner}: unknown parallel strategy {key!r}; strategies: {', '.join(STRATEGIES)} "
                            f"(aliases: {', '.join(sorted(_ALIASES))})")
        if axis is None:
            wanted = _DEFAULT_AXIS[strategy]
            axis = wanted if wanted in mesh.axis_names else mesh.axis_names[-1 if strategy == "tensor" else 0]
        if axis not in mesh.axis_names:
            raise MeshError(f"{owner}: parallel={dict(parallel)} puts {strategy} on axis {axis!r}, but the mesh's "
                            f"axes are {mesh.axis_names} (device_mesh={mesh.shape})")
        if strategy in out:
            raise MeshError(f"{owner}: parallel names {strategy} twice")
        out[strategy] = axis
    if "pipeline" in out and set(out) - {"pipeline", "data"}:
        raise MeshError(f"{owner}: pipeline parallel runs alone or with data parallel on a second axis for now "
                        f"(its stages are whole programs on their devices); got {dict(parallel)}")
    if "data" in out and "fsdp" in out and out["data"] != out["fsdp"]:
        raise MeshError(f"{owner}: fsdp shards parameters over the data axis; give it the data axis "
                        f"({out['data']!r}) or leave data out")
    used = [a for s, a in out.items() if s not in ("data", "fsdp")] + list({out.get("data"), out.get("fsdp")} - {None})
    if len(used) != len(set(used)):
        raise MeshError(f"{owner}: parallel={dict(parallel)} gives one mesh axis to two strategies; give each its "
                        f"own axis (device_mesh=(2, 2) has 'data' and 'model')")
    return out


def microbatches(owner: str, parallel, mesh: DeviceMesh | None) -> int:
    """The micro-batches a pipeline cuts each batch into: ``parallel``'s ``"microbatches"``
    (default: one per stage); 1 without a pipeline."""
    if mesh is None or parallel is None or "pipeline" not in parse_parallel(owner, parallel, mesh):
        if isinstance(parallel, Mapping) and "microbatches" in parallel:
            raise MeshError(f"{owner}: microbatches is a pipeline option; parallel={dict(parallel)} has no pipeline")
        return 1
    axis = parse_parallel(owner, parallel, mesh)["pipeline"]
    n = parallel.get("microbatches", mesh.axis_size(axis)) if isinstance(parallel, Mapping) else mesh.axis_size(axis)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise MeshError(f"{owner}: microbatches must be a positive int, got {n!r}")
    return n


def plan_sharding(owner: str, plan, mesh: DeviceMesh, parallel, rules=None) -> ShardingPlan:
    """The :class:`ShardingPlan` of a lowering plan: ``parallel`` (None: data parallel on the data
    axis) and the ``rules`` (``sharding=``) over it."""
    strategies = parse_parallel(owner, "data" if parallel is None else parallel, mesh)
    params = {v.name: v for v in plan.params}
    inputs = {v.name: v for v in plan.inputs if v.name not in params}
    out = ShardingPlan(mesh, strategies)
    for name, v in params.items():
        out.shapes[name] = tuple(v.static_shape or ())
        out.itemsizes[name] = np.dtype(v.dtype).itemsize if v.dtype is not None and v.dtype != object else 8
    floating = {n for n, v in params.items() if v.dtype is not None and v.dtype != object and
                np.issubdtype(v.dtype, np.floating)}
    specs: dict[str, list] = {n: [None] * len(out.shapes[n]) for n in params}
    if "tensor" in strategies:
        _tensor_parallel(plan, mesh, strategies["tensor"], specs, floating, out.replicated)
    if "fsdp" in strategies:
        _fully_sharded(mesh, strategies["fsdp"], specs, out.shapes, floating, out.replicated)
    if "pipeline" in strategies:
        from .pipeline import pipeline_stages

        out.pipeline, out.stages = pipeline_stages(owner, plan, mesh.axis_size(strategies["pipeline"]))
        out.microbatches = microbatches(owner, parallel, mesh)
    batch_axis = strategies.get("data") or strategies.get("fsdp")
    if batch_axis is not None:
        for name, v in inputs.items():
            # A symbolic batch is split too: whether it divides is checked when the data comes.
            if v.shape is not None and len(v.shape) and (v.dtype is None or v.dtype != object):
                specs[name] = [batch_axis] + [None] * (len(v.shape) - 1)
    out.input_shapes = {n: tuple(v.shape) for n, v in inputs.items() if v.shape is not None}
    _apply_rules(owner, mesh, rules, specs, {**out.shapes, **out.input_shapes}, out.replicated)
    for name, spec in specs.items():
        shape = out.shapes[name] if name in out.shapes else out.input_shapes[name]
        what = f"input {name!r}" if name in inputs else f"parameter {name!r}"
        if name in inputs:
            check_batch(owner, mesh, name, shape, tuple(spec))
        check_divides(owner, mesh, shape, tuple(spec), what)
        if any(a is not None for a in spec):
            out.specs[name] = tuple(spec)
    _warn_replicated(owner, strategies, out)
    return out


# Ops a split feature (or head) dim passes through unchanged in meaning.
_KEEPS_SPLIT = {"Relu", "Gelu", "Tanh", "Sigmoid", "Erf", "Mul", "Add", "Sub", "Div", "Pow", "Sqrt", "Exp", "Neg",
                "Cast", "Identity", "Dropout", "Reshape", "Transpose", "Softmax", "Where", "LeakyRelu", "Elu",
                "HardSigmoid", "HardSwish", "Clip", "BatchNormalization", "MaxPool", "AveragePool", "Split",
                "Squeeze", "Unsqueeze", "Mish", "Softplus", "Selu", "Celu", "Sin", "Cos", "Max", "Min"}


def _tensor_parallel(plan, mesh, axis, specs, floating, replicated) -> None:
    n = mesh.axis_size(axis)
    split = set()  # values (by id) whose feature or head dim is split
    index = plan.index
    for pn in plan.nodes:
        ins = [v for v in pn.inputs if v is not None]
        found = _weight(pn, index, specs, floating)
        if found is not None:
            param, out_dim, in_dim = found
            dims = param.static_shape
            row = id(pn.inputs[0]) in split
            dim = in_dim if row else out_dim
            if dims[dim] % n:
                replicated[param.name] = (f"{pn.op_type} {'input' if row else 'output'} features {dims[dim]} not a "
                                          f"multiple of {n}")
            elif pn.op_type == "Conv" and row and int(pn.kwargs.get("group", 1) or 1) != 1:
                replicated[param.name] = "grouped Conv"
            else:
                specs[param.name][dim] = axis
                if not row:
                    split.add(id(pn.outputs[0]))
                    bias = pn.inputs[2] if len(pn.inputs) > 2 else None
                    if bias is not None and bias.kind == "param" and len(specs.get(bias.name, ())) == 1 \
                            and bias.name in floating and bias.static_shape[0] == dims[out_dim]:
                        specs[bias.name][0] = axis
            continue
        table = pn.inputs[0] if pn.op_type == "Gather" and pn.inputs else None
        if table is not None and table.kind == "param" and table.name in floating and \
                int(pn.kwargs.get("axis", 0) or 0) == 0 and len(specs.get(table.name, ())) >= 1:
            # An embedding: its rows (the vocabulary) split, as Megatron's vocab-parallel embedding;
            # each device looks up the ids in its rows and the results are summed.
            if table.static_shape[0] % n == 0:
                specs[table.name][0] = axis
            else:
                replicated[table.name] = f"embedding rows {table.static_shape[0]} not a multiple of {n}"
            continue
        if not any(id(v) in split for v in ins):
            continue
        if pn.op_type in _KEEPS_SPLIT or pn.op_type in ("MatMul", "MatMulAdd"):
            if pn.op_type == "Add":  # a column-split matmul's bias, added after it
                for v in ins:
                    if v.kind == "param" and v.name in floating and len(specs.get(v.name, ())) == 1:
                        if v.static_shape[0] % n == 0:
                            specs[v.name][0] = axis
            split.update(id(o) for o in pn.outputs)


def _weight(pn, index, specs, floating):
    """For a MatMul/MatMulAdd/Gemm/Conv whose weight is a parameter (read directly or through a
    Transpose, Cast or Identity): ``(parameter, its output-features dim, its input-features
    dim)``; else None."""
    if pn.op_type not in ("MatMul", "MatMulAdd", "Gemm", "Conv") or len(pn.inputs) < 2 or pn.inputs[1] is None:
        return None
    v, perm = pn.inputs[1], None
    while v.kind == "node":
        src = index.producer(v)
        if src is None or src.op_type not in ("Transpose", "Cast", "Identity"):
            return None
        if src.op_type == "Transpose":
            p = tuple(src.kwargs.get("perm") or ())
            if p != (1, 0):
                return None
            perm = None if perm else (1, 0)
        v = src.inputs[0]
    if v.kind != "param" or v.name not in floating or v.static_shape is None:
        return None
    rank = len(v.static_shape)
    if pn.op_type == "Conv":
        return (v, 0, 1) if perm is None else None
    if rank != 2:
        return None
    out_dim, in_dim = (0, 1) if pn.op_type == "Gemm" and pn.kwargs.get("transB") else (1, 0)
    if perm:
        out_dim, in_dim = in_dim, out_dim
    return v, out_dim, in_dim


def _fully_sharded(mesh, axis, specs, shapes, floating, replicated) -> None:
    n = mesh.axis_size(axis)
    for name, shape in shapes.items():
        if name not in floating or not shape:
            continue
        spec = specs[name]
        dim = next((d for d in range(len(shape)) if spec[d] is None and shape[d] % n == 0), None)
        if dim is None:
            replicated.setdefault(name, f"no dim of {shape} is a multiple of {n}")
        else:
            spec[dim] = axis


def _apply_rules(owner, mesh, rules, specs, shapes, replicated) -> None:
    if not rules:
        return
    if not isinstance(rules, Mapping):
        raise MeshError(f"{owner}: sharding= takes {{name regex: spec}}, e.g. {{r'fc1\\.weight': (None, 'model')}}, "
                        f"got {rules!r}")
    for pattern, spec in rules.items():
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise MeshError(f"{owner}: sharding rule {pattern!r} is not a regular expression: {exc}") from None
        matched = [n for n in shapes if rx.search(n)]
        if not matched:
            raise MeshError(f"{owner}: sharding rule {pattern!r} matches no parameter or input; names: "
                            f"{', '.join(list(shapes)[:8])}{'...' if len(shapes) > 8 else ''}")
        for name in matched:
            rank = len(shapes[name])
            given = () if spec is None else tuple(spec)
            if given and len(given) != rank:
                raise MeshError(f"{owner}: sharding rule {pattern!r} gives {given} for {name!r}, which has "
                                f"{rank} dims {shapes[name]}: give one mesh axis or None per dim")
            bad = [a for a in given if a is not None and a not in mesh.axis_names]
            if bad:
                raise MeshError(f"{owner}: sharding rule {pattern!r} names axis {bad[0]!r}; the mesh's axes are "
                                f"{mesh.axis_names}")
            specs[name] = list(given) if given else [None] * rank
            replicated.pop(name, None)


def _warn_replicated(owner, strategies, out: ShardingPlan) -> None:
    split_params = [s for s in strategies if s in ("tensor", "fsdp")]
    if not split_params:
        return
    whole = [n for n in out.shapes if n not in out.specs and len(out.shapes[n]) >= 2]
    listed = {n: out.replicated.get(n, "no rule splits it") for n in whole}
    listed.update({n: why for n, why in out.replicated.items() if n not in out.specs})
    if listed:
        shown = "; ".join(f"{n} {out.shapes[n]}: {why}" for n, why in list(listed.items())[:12])
        more = f" and {len(listed) - 12} more" if len(listed) > 12 else ""
        warnings.warn(f"{owner}: {' and '.join(split_params)} parallel leaves {len(listed)} parameter(s) whole on every "
                      f"device: {shown}{more}", ReplicatedOpsWarning, stacklevel=6)
