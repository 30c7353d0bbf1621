"""MlxBackend's device mesh: one process per device over ``mlx.core.distributed``.

MLX has no global (sharded) array: each process holds ordinary ``mx.array`` values, and the
collectives (``all_sum``, ``all_gather``) join them. So a mesh run is single-program-multiple-
data as ``torch.distributed`` users write it by hand: every process runs the same script on the
same global batch and parameters. Data parallel: :func:`local_part` cuts the batch to this
rank's rows, :class:`OnMesh` joins the outputs (per-row outputs gathered, others averaged) and
sums the gradients over the ranks. Tensor parallel: each rank holds its part of the split weights
(:func:`local_shape`), and :func:`tensor_parallel_plan` swaps the kernels of the split matmuls
and embeddings for ones that meet over the ranks (Megatron's pairing, as ``mlx.nn``'s
``AllToShardedLinear`` / ``ShardedToAllLinear``, and its vocabulary-parallel embedding). MLX differentiates through its
collectives (``all_sum``'s vjp passes the cotangent through, ``all_gather``'s takes the rank's
rows), which is what makes a joined output's gradient the single-process one.

Processes come from ``mlx.launch --backend ring -n N script.py``, or any launcher that sets
``MLX_RANK`` and ``MLX_HOSTFILE`` (the ring backend's environment); a torchrun-style ``RANK``
stands for ``MLX_RANK`` where a hostfile is given, so
``mithril.distributed.launch.spawn(fn, N, env={"MLX_HOSTFILE": path})`` starts a ring too.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import mlx.core as mx
import numpy as np

from ..mesh import DeviceMesh
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


def local_shape(shape, mesh: DeviceMesh, spec) -> tuple:
    """The shape of one rank's part of an array of ``shape`` split by ``spec``."""
    return tuple(size // mesh.axis_size(a) if a is not None else size for size, a in zip(shape, spec))


def whole(native, mesh: DeviceMesh, group, spec):
    """The whole array of which ``native`` is this rank's part (split by ``spec``; every rank
    calls it): the parts gathered along each split dim, in rank order."""
    for dim, axis in enumerate(spec):
        if axis is not None:
            native = gather_dim(native, dim, group)
    return native


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
    """The generated forward over the ranks, by the strategy of the
    :class:`~mithril.distributed.ShardingPlan` the backend placed the call's values by
    (``active()``):

    - data parallel: the program on this rank's rows, its outputs joined: per-row outputs
      (:func:`batched_outputs`) gathered in rank order (``all_gather``), the others averaged
      (``all_sum`` / ranks: a batch-mean loss of equal parts is the mean of the parts'), so every
      rank sees what one process computes on the whole batch. A non-floating output that is not
      per-row (a count) is this rank's own.
    - tensor parallel: the program of :func:`tensor_parallel_plan` on the whole batch and this
      rank's parts of the split parameters (as ``MlxBackend.place`` holds them; whole ones are
      cut on the way in); every output is whole on every rank.

    :meth:`reduce` turns a rank's gradients into the one-process gradients."""

    def __init__(self, forward, group, mesh: DeviceMesh, plan, wrap, unwrap, lower_plan, active):
        self.forward, self.group, self.mesh, self.plan = forward, group, mesh, plan
        self.batched, self.split_inputs = batched_outputs(plan), batched_inputs(plan)
        self.wrap, self.unwrap = wrap, unwrap
        self.lower_plan, self.active = lower_plan, active  # plan -> (forward, source); () -> ShardingPlan
        self._tensor: dict = {}  # id(ShardingPlan) -> (ShardingPlan, forward, split params, split outputs)
        self.tensor_source = None  # the generated source of the tensor-parallel program, once made
        self.mode = "data"
        self.cut: set[str] = set()  # split parameters the last tensor-parallel call got whole
        self.gathered: set[str] = set()  # parameters the last fsdp call gathered from this rank's part

    def _tensor_program(self, sharding):
        found = self._tensor.get(id(sharding))
        if found is None or found[0] is not sharding:
            tp_plan, split_params, split_outputs = tensor_parallel_plan(self.plan, sharding, self.group, self.wrap,
                                                                        self.unwrap)
            forward, self.tensor_source = self.lower_plan(tp_plan)
            found = (sharding, forward, split_params, split_outputs)
            self._tensor[id(sharding)] = found
        return found

    def __call__(self, params, data):
        sharding = self.active()
        if sharding is not None and "tensor" in sharding.strategies:
            self.mode = "tensor"
            _, forward, split_params, split_outputs = self._tensor_program(sharding)
            rank = self.group.rank()
            # Parameters placed come as this rank's parts; whole ones (given as they are to a
            # program of one's own) are cut here, and their gradients summed (see reduce).
            self.cut = {k for k in split_params if k in params
                        and tuple(self.unwrap(params[k]).shape) == tuple(sharding.shapes[k])}
            params = {k: self.wrap(local_part(self.unwrap(v), self.mesh, rank, split_params[k]))
                      if k in self.cut else v for k, v in params.items()}
            out = forward(params, data)
            return {k: self.wrap(gather_dim(self.unwrap(v), split_outputs[k], self.group)) if k in split_outputs
                    else v for k, v in out.items()}
        self.mode, self.gathered = "data", set()
        if sharding is not None and "fsdp" in sharding.strategies:
            # Fully sharded: each parameter placed as this rank's part is gathered whole for the
            # call (gathered_param: its gradient comes back reduced over the ranks and cut to
            # the part); whole ones given run as under data parallel.
            self.mode = "fsdp"
            self.gathered = {k for k in params if k in sharding.shapes and any(a is not None for a in sharding.spec(k))
                             and tuple(self.unwrap(params[k]).shape) != tuple(sharding.shapes[k])}
            params = {k: self.wrap(gathered_param(self.unwrap(v), sharding.spec(k), self.group))
                      if k in self.gathered else v for k, v in params.items()}
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

    def reduce(self, grads: dict) -> dict:
        """A rank's gradients (of the last call's mode) -> the one-process gradients.

        Data parallel: a parameter's (and a whole data input's) summed over the ranks (each
        rank's is its rows' share: the cotangent reached it through the averaged or gathered
        outputs), a split data input's gathered (its rows, in rank order). Fully sharded: as
        data parallel, but a parameter held as this rank's part has its part's gradient already
        (summed over the ranks by :func:`gathered_param`'s vjp). Tensor parallel: a
        split parameter's gradient is that of the part this rank holds (where the part was cut
        from a whole parameter inside the call, the parts' gradients, zero outside each part,
        are summed into the whole one); the others are whole on every rank already (Megatron's
        identity-forward, all-sum-backward operator sits before every column-split matmul, and
        a vocabulary-split lookup's all_sum passes the cotangent whole to every rank)."""
        out = {}
        if self.mode == "tensor":
            for name, g in grads.items():
                out[name] = mx.distributed.all_sum(g, group=self.group) if name in self.cut else g
            return out
        for name, g in grads.items():
            if name in self.gathered:  # fsdp: reduced and cut by gathered_param's vjp
                out[name] = g
            elif name in self.split_inputs:
                out[name] = mx.distributed.all_gather(g, group=self.group)
            else:
                out[name] = mx.distributed.all_sum(g, group=self.group)
        return out


def gathered_param(part, spec, group):
    """FSDP's gather before use: the whole parameter of which ``part`` is this rank's (split on
    the one dim ``spec`` names), differentiable so that the part's gradient is the ranks' whole
    gradients summed, cut to this rank's part: a reduce-scatter. The ring backend has no
    ``sum_scatter`` ("[ring] sum_scatter not supported" in mlx 0.32), so it is an ``all_sum``
    then this rank's slice: the gradient traffic of data parallel, the memory of a part."""
    dim = next(i for i, a in enumerate(spec) if a is not None)

    @mx.custom_function
    def gather(p):
        return gather_dim(p, dim, group)

    @gather.vjp
    def scatter(primals, cotangent, output):
        size = primals[0].shape[dim] if isinstance(primals, (list, tuple)) else primals.shape[dim]
        start = group.rank() * size
        summed = mx.distributed.all_sum(cotangent, group=group)
        return mx.take(summed, mx.arange(start, start + size), axis=dim)

    return gather(part)


def gather_dim(native, dim, group):
    """The whole of an array split on ``dim`` over ``group``'s ranks (in rank order)."""
    if dim == 0:
        return mx.distributed.all_gather(native, group=group)
    moved = mx.moveaxis(native, dim, 0)
    return mx.moveaxis(mx.distributed.all_gather(moved, group=group), 0, dim)


# Ops through which a split last dim (features) keeps its meaning: elementwise ones. A binary op
# keeps it when its other operands are split alike (a split bias) or broadcast along that dim.
_UNARY_KEEP = {"Relu", "Gelu", "Tanh", "Sigmoid", "Erf", "Sqrt", "Exp", "Neg", "Cast", "Identity", "LeakyRelu",
               "Elu", "HardSigmoid", "HardSwish", "Mish", "Softplus", "Selu", "Celu", "Sin", "Cos", "Abs"}
_BINARY_KEEP = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}


def _weight_param(pn, index):
    """For a MatMul/MatMulAdd whose weight is a 2-D parameter (read directly or through a
    Transpose, Cast or Identity): ``(parameter, its output-features dim, its input-features
    dim)``; else None."""
    if pn.op_type not in ("MatMul", "MatMulAdd") or len(pn.inputs) < 2 or pn.inputs[1] is None:
        return None
    v, transposed = pn.inputs[1], False
    while v.kind == "node":
        src = index.producer(v)
        if src is None or src.op_type not in ("Transpose", "Cast", "Identity"):
            return None
        if src.op_type == "Transpose":
            if tuple(src.kwargs.get("perm") or ()) != (1, 0):
                return None
            transposed = not transposed
        v = src.inputs[0]
    if v.kind != "param" or v.static_shape is None or len(v.static_shape) != 2:
        return None
    return (v, 0, 1) if transposed else (v, 1, 0)


def tensor_parallel_plan(plan, sharding, group, wrap, unwrap):
    """The lowering ``plan`` rewritten for Megatron-style tensor parallelism over ``group``:
    ``(plan, {split parameter: spec}, {output: its split dim})``.

    Kernels change, values do not (the emitted program keeps its lines and lifetimes). A split
    value is followed by the dim it is split on: a column-split MatMul (its weight split on
    output features) reads its input through Megatron's ``f`` (identity forward, ``all_sum`` of
    the gradient backward: ``mlx.nn.layers.distributed.sum_gradients``) and gives its last dim
    split; elementwise ops, transposes, reshapes that keep the split dim's blocks whole (heads out
    of features and back), matmuls between values split on the same batch dim (attention's
    heads) and softmaxes over another axis keep a value split; a row-split MatMul (weight split
    on input features) sums the ranks' partial products with ``all_sum`` (its bias added once,
    after); an embedding table split on its rows (Megatron's vocabulary-parallel embedding) looks
    up the ids in this rank's rows, zero elsewhere, and sums over the ranks; an op that needs a
    split value whole gets it by ``all_gather`` first. What MLX meshes do not split
    (convolutions, Gemm) is a MeshError."""
    from mlx.nn.layers.distributed import sum_gradients

    axis = sharding.strategies["tensor"]
    n = group.size()
    specs = {k: tuple(s) for k, s in sharding.specs.items() if k in sharding.shapes}
    index = plan.index
    split: dict[int, int] = {}  # id of a value -> the dim split over the ranks
    handled: set[str] = set()
    nodes = []
    f = sum_gradients(group)

    def split_param(v):
        return v is not None and v.kind == "param" and specs.get(v.name, ())[-1:] == (axis,)

    def replaced(pn, fn):
        return dataclasses.replace(pn, spec=dataclasses.replace(pn.spec, fn=fn))

    def ndim(v):
        return None if v.shape is None else len(v.shape)

    def keeps_elementwise(pn, ins):
        """The output's split dim, if an elementwise op keeps its inputs' split (each operand
        split on the same output dim, a split bias on the last, or broadcast along it)."""
        out_nd = ndim(pn.outputs[0])
        if out_nd is None or any(ndim(v) is None for v in ins):
            return None
        dims = {out_nd - ndim(v) + split[id(v)] for v in ins if id(v) in split}
        if len(dims) != 1:
            return None
        d, = dims
        for v in ins:
            if id(v) in split:
                continue
            if split_param(v):
                if ndim(v) != 1 or d != out_nd - 1:
                    return None
                continue
            j = d - (out_nd - ndim(v))
            if j >= 0 and v.shape[j] != 1:
                return None
        return d

    for pn in plan.nodes:
        found = _weight_param(pn, index)
        spec = specs.get(found[0].name) if found else None
        if found and spec and axis in spec:
            param, out_dim, in_dim = found
            handled.add(param.name)
            bias = pn.inputs[2] if pn.op_type == "MatMulAdd" else None
            x = pn.inputs[0]
            if spec.index(axis) == out_dim:
                if id(x) in split:
                    raise MeshError(f"MlxBackend: tensor parallel: {pn.op_type} {pn.label!r} reads features already "
                                    f"split, yet its weight {param.name!r} is split on its output features")
                if bias is not None:
                    if not split_param(bias):
                        raise MeshError(f"MlxBackend: tensor parallel: the bias {bias.name!r} of {pn.op_type} "
                                        f"{pn.label!r} must be split with its weight's output features")
                    handled.add(bias.name)
                nodes.append(replaced(pn, _column(pn.spec.fn, f, wrap, unwrap)))
                split[id(pn.outputs[0])] = ndim(pn.outputs[0]) - 1
            else:
                if split.get(id(x)) != ndim(x) - 1:
                    raise MeshError(f"MlxBackend: tensor parallel: {pn.op_type} {pn.label!r} splits its weight "
                                    f"{param.name!r} on input features its input does not have split")
                nodes.append(replaced(pn, _row(pn.spec.fn, group, wrap, unwrap)))
            continue
        table = pn.inputs[0] if pn.op_type == "Gather" and pn.inputs else None
        if table is not None and table.kind == "param" and specs.get(table.name, ())[:1] == (axis,) \
                and int(pn.kwargs.get("axis", 0)) == 0 and id(pn.inputs[1]) not in split \
                and all(a is None for a in specs[table.name][1:]):
            handled.add(table.name)
            nodes.append(replaced(pn, _vocab(pn.spec.fn, sharding.shapes[table.name][0], group, wrap, unwrap)))
            continue
        ins = [v for v in pn.inputs if v is not None]
        if not any(id(v) in split for v in ins):
            nodes.append(pn)
            continue
        out = pn.outputs[0] if len(pn.outputs) == 1 and not pn.subgraphs else None
        kept = None  # the output's split dim, where the op keeps the split
        x = pn.inputs[0]
        if out is None:
            pass
        elif pn.op_type in _UNARY_KEEP and len(ins) == 1:
            kept = split[id(x)]
        elif pn.op_type in _BINARY_KEEP or pn.op_type == "Where":
            kept = keeps_elementwise(pn, ins)
        elif pn.op_type == "Transpose" and id(x) in split:
            perm = tuple(pn.kwargs.get("perm") or range(ndim(x) - 1, -1, -1))
            kept = perm.index(split[id(x)])
        elif pn.op_type in ("Softmax", "LogSoftmax") and ndim(x) is not None:
            kept = split[id(x)] if int(pn.kwargs.get("axis", -1)) % ndim(x) != split[id(x)] else None
        elif pn.op_type == "MatMul" and len(ins) == 2 and all(id(v) in split for v in ins):
            a, b = ins  # a batched matmul of two split values: each rank its own heads
            da, db = split[id(a)], split[id(b)]
            nd = ndim(out)
            if ndim(a) == ndim(b) == nd and da == db < nd - 2:
                kept = da
        elif pn.op_type == "Reshape" and id(x) in split and x.shape is not None and out.shape is not None:
            kept = _reshaped_dim(tuple(x.shape), tuple(out.shape), split[id(x)], n)
            if kept is not None:
                local = list(out.shape)
                local[kept] //= n
                split[id(out)] = kept
                handled.update(v.name for v in ins if split_param(v))
                nodes.append(replaced(pn, _local_reshape(pn.spec.fn, tuple(local))))
                continue
        if kept is not None:
            handled.update(v.name for v in ins if split_param(v))
            split[id(out)] = kept
            nodes.append(pn)
        else:  # the whole values first
            where = {i: split[id(v)] for i, v in enumerate(pn.inputs) if v is not None and id(v) in split}
            nodes.append(replaced(pn, _gathered(pn.spec.fn, where, group, wrap, unwrap)))
    left = sorted(set(specs) - handled)
    if left:
        raise MeshError(f"MlxBackend: tensor parallel on MLX splits MatMul weights (and their biases) and embedding "
                        f"tables only; {', '.join(left[:4])} {'is' if len(left) == 1 else 'are'} split by the plan and "
                        f"not read by one (convolutions and Gemm run split on JaxBackend and TorchBackend)")
    split_outputs = {v.name: split[id(v)] for v in plan.outputs if id(v) in split}
    return dataclasses.replace(plan, nodes=nodes), {k: specs[k] for k in handled if k in specs}, split_outputs


def _reshaped_dim(shape, out, d, n):
    """The dim of a reshape's output that holds the ranks' blocks of dim ``d`` of its input, when
    each block stays one contiguous range of it (features cut into heads, heads merged back);
    else None."""
    before = int(np.prod(shape[:d], dtype=np.int64))
    e = next((i for i in range(len(out) + 1) if int(np.prod(out[:i], dtype=np.int64)) == before), None)
    if e is None or e == len(out):
        return None
    while e < len(out) - 1 and out[e] == 1 and shape[d] != 1:
        e += 1
    size, want = shape[d], out[e]
    if want == size:
        return e
    if size % want == 0 and want % n == 0:  # dim d cut into out[e], out[e + 1], ...
        prods = np.cumprod(out[e:])
        return e if size in prods else None
    if want % size == 0:  # dim d merged with the dims after it
        prods = np.cumprod(shape[d:])
        return e if want in prods else None
    return None


def _local_reshape(fn, local):
    @functools.wraps(fn)
    def local_reshape(x, shape, **kwargs):
        return fn(x, np.array(local, dtype=np.int64), **kwargs)

    local_reshape.__name__ = f"{fn.__name__}_split_heads"  # the generated line names the change
    return local_reshape


def _vocab(fn, rows, group, wrap, unwrap):
    """Megatron's vocabulary-parallel embedding: this rank's rows of the table looked up where an
    id falls in them (zero elsewhere), the ranks' lookups summed."""
    @functools.wraps(fn)
    def vocab_split(table, ids, **kwargs):
        native = unwrap(table)
        part = native.shape[0]
        start = group.rank() * part
        i = unwrap(ids)
        i = mx.where(i < 0, i + rows, i) - start
        inside = (i >= 0) & (i < part)
        found = unwrap(fn(table, wrap(mx.where(inside, i, 0)), **kwargs))
        found = found * mx.expand_dims(inside, tuple(range(i.ndim, found.ndim))).astype(found.dtype)
        return wrap(mx.distributed.all_sum(found, group=group))

    vocab_split.__name__ = f"{fn.__name__}_vocab_split"  # the generated line names the change
    return vocab_split


def _column(fn, f, wrap, unwrap):
    @functools.wraps(fn)
    def column_split(x, *rest, **kwargs):
        return fn(wrap(f(unwrap(x))), *rest, **kwargs)

    column_split.__name__ = f"{fn.__name__}_column_split"  # the generated line names the change
    return column_split


def _row(fn, group, wrap, unwrap):
    @functools.wraps(fn)
    def row_split(x, w, *bias, **kwargs):
        if bias:  # MatMulAdd: the partial products summed, the bias added once
            y = unwrap(fn(x, w, bias[0] * 0, **kwargs))
            return wrap(mx.distributed.all_sum(y, group=group)) + bias[0].astype(wrap(y).dtype)
        return wrap(mx.distributed.all_sum(unwrap(fn(x, w, **kwargs)), group=group))

    row_split.__name__ = f"{fn.__name__}_row_split"  # the generated line names the change
    return row_split


def _gathered(fn, where, group, wrap, unwrap):
    @functools.wraps(fn)
    def whole_features(*args, **kwargs):
        args = [wrap(gather_dim(unwrap(a), where[i], group)) if i in where else a for i, a in enumerate(args)]
        return fn(*args, **kwargs)

    whole_features.__name__ = f"{fn.__name__}_whole_features"  # the generated line names the change
    return whole_features
