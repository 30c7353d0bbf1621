"""TorchBackend's pipeline parallel: one stage per process, activations and gradients sent point to point.

``ml.compile(..., parallel="pipeline")`` on ``TorchBackend(device_mesh=(N,))`` cuts the plan into
N stages (:mod:`mithril.distributed.pipeline`) and prints them as nested functions that the
program calls through ``_backend.pipeline_stage(index, fn, *live_in)``. Every process runs the
whole printed program; stage ``i`` computes on process ``i`` only. There the values it reads
that an earlier stage made (or a parameter that an earlier stage holds, a tied weight) are
received from that stage's process (``torch.distributed.recv``), and what it makes that a later
stage reads is sent there (``isend``); the other processes pass placeholders through. The plan's
outputs are broadcast from the process that made them, so every process returns the same outputs
(a training loop runs unchanged on every rank). Each process holds its own stage's parameters;
the others' are ``meta`` tensors (shape and dtype, no storage).

Gradients (:meth:`PipelineForward.vjp_parts`, GPipe): the forward pass of every micro-batch, then
their backward passes, last first: a stage receives the gradients of its outputs from the stages
that read them, runs ``torch.autograd.grad`` over its own part of the graph, and sends the
gradients of what it received back to where it came from. A data input's gradient is summed
over the processes (each stage adds the part it read).

Why not ``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe``, torch 2.13): a
stage there is an ``nn.Module`` whose positional inputs are the previous stage's outputs only
(``forward_one_chunk``: non-first stages take ``_retrieve_recv_activations``), while a Mithril
stage reads values from any earlier stage (a residual stream, the target read by the loss in the
last stage, a tied embedding) and host values (NumPy shape arithmetic) that are not tensors; its
``step`` cuts the whole batch itself, while ``PhysicalModel.evaluate`` hands the backend
micro-batches already cut (``vjp_parts``); its backward needs a ``loss_fn(output, target)`` on
the last stage outside the model, while a TrainModel's loss is an output of the graph and
``evaluate`` takes cotangents for any output; and its outputs stay on the last stage. Point to
point sends of the values each stage reads do what its schedule does (fill, then drain) without
routing every value through every stage in between.
"""

from __future__ import annotations

import contextvars
import pickle

import numpy as np
import torch
import torch.distributed as dist

from ...errors import MeshError
from . import xp as _xp

# The pipeline run in progress in this process (a PipelineForward call sets it); the program's
# _backend.pipeline_stage calls go to it. The extent of one call (what each stage received and
# sent), not a backend option: the generated program's stage calls carry no per-call argument.
_RUN: contextvars.ContextVar = contextvars.ContextVar("mithril_torch_pipeline_run", default=None)

_HEADER = 18  # header ints: kind (dtype index, -1 pickled host value), ndim, dims


class Routing:
    """Who computes and reads what. ``inputs[i]``: per argument of stage ``i``, the stage that
    has it (an earlier stage's output, or the stage holding a parameter), or None (data, given
    on every process). ``sends[k]``: ``(key, stage)`` pairs, what stage ``k`` sends where, in the
    order the receivers read them; a key is ``("out", position)`` or ``("param", name)``.
    ``owner``: parameter -> the stage holding it (the first that reads it, as
    :func:`mithril.distributed.pipeline.pipeline_stages` places them). ``outputs``: plan output
    name -> ``(stage, position)`` of the stage output it is, None when no stage makes it."""

    def __init__(self, plan, stages):
        segments = stages.segments
        self.n = len(segments)
        made = {}
        self.owner: dict[str, int] = {}
        for seg in segments:
            for pos, v in enumerate(seg.outputs):
                made[id(v)] = (seg.index, pos)
            for v in seg.inputs:
                if v.kind == "param":
                    self.owner.setdefault(v.name, seg.index)
        self.inputs: list[list] = []
        self.sends: list[list] = [[] for _ in segments]
        for seg in segments:
            srcs = []
            for v in seg.inputs:
                if v.kind == "param" and self.owner[v.name] != seg.index:
                    src, key = self.owner[v.name], ("param", v.name)
                elif id(v) in made:
                    src, key = made[id(v)][0], ("out", made[id(v)][1])
                else:
                    src, key = None, None
                srcs.append(src)
                if src is not None:
                    self.sends[src].append((key, seg.index))
            self.inputs.append(srcs)
        self.outputs = {v.name: made.get(id(v)) for v in plan.outputs}
        self.output_order = [v.name for v in plan.outputs]
        self.n_outputs = [len(seg.outputs) for seg in segments]


# -- point to point and broadcast with a header (shape, dtype) --------------------------------------
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _payload(value, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(header, data)`` for a tensor or a host value (pickled into bytes)."""
    t = value.native if isinstance(value, _xp.TorchArray) else value
    if isinstance(t, torch.Tensor) and t.dtype in _DTYPES and t.ndim <= _HEADER - 2:
        kind, data = _DTYPES.index(t.dtype), _row_major(t)
    else:
        kind = -1
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)
    dims = list(data.shape)
    header = torch.tensor([kind, len(dims)] + dims + [0] * (_HEADER - 2 - len(dims)), dtype=torch.int64,
                          device=device)
    return header, data


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached with row-major strides. gloo sends, receives and reduces contiguous tensors
    only, and a value may come in another layout (TorchBackend's CPU convolutions and the ops
    after them run channels_last); every buffer that crosses processes is row-major, sender's
    and receiver's alike, so the bytes mean the same on both sides."""
    return t.detach().contiguous(memory_format=torch.contiguous_format)


def _unpack(header: torch.Tensor, device) -> torch.Tensor:
    kind, ndim = int(header[0]), int(header[1])
    shape = [int(d) for d in header[2:2 + ndim]]
    return torch.empty(shape, dtype=torch.uint8 if kind < 0 else _DTYPES[kind], device=device), kind


def _value(kind, data):
    if kind < 0:
        return pickle.loads(data.cpu().numpy().tobytes())
    return _xp.TorchArray(data)


def send(value, dst: int, device, works: list) -> None:
    header, data = _payload(value, device)
    works.append(dist.isend(header, dst))
    works.append(dist.isend(data, dst))
    works.append((header, data))  # kept alive until the sends are waited on


def recv(src: int, device):
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src)
    data, kind = _unpack(header, device)
    dist.recv(data, src)
    return _value(kind, data)


def broadcast(value, src: int, rank: int, device):
    """``value`` (given on ``src``) on every process."""
    if rank == src:
        header, data = _payload(value, device)
        dist.broadcast(header, src)
        dist.broadcast(data, src)
        return value.native.detach() if isinstance(value, _xp.TorchArray) else value
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.broadcast(header, src)
    data, kind = _unpack(header, device)
    dist.broadcast(data, src)
    return data if kind >= 0 else _value(kind, data)


def wait(works: list) -> None:
    for w in works:
        if not isinstance(w, tuple):
            w.wait()
    works.clear()


def _floating(value) -> bool:
    t = value.native if isinstance(value, _xp.TorchArray) else value
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _native(value):
    return value.native if isinstance(value, _xp.TorchArray) else value


class _Run:
    """One forward pass of one micro-batch on this process: what its stage received (by
    argument) and made, kept for its backward pass when ``record``."""

    def __init__(self, routing: Routing, rank: int, device, record: bool):
        self.routing, self.rank, self.device, self.record = routing, rank, device, record
        self.works: list = []
        self.received: list = []  # (argument position, src stage, value) of what this stage received
        self.outputs: tuple = ()
        self.params: dict = {}  # this stage's parameters as it read them (leaves when recording)

    def stage(self, index: int, fn, args):
        routing = self.routing
        if index != self.rank:
            return (None,) * routing.n_outputs[index]
        args = list(args)
        for pos, src in enumerate(routing.inputs[index]):
            if src is None or src == index:
                continue
            value = recv(src, self.device)
            if self.record and _floating(value):
                value = _xp.TorchArray(value.native.detach().requires_grad_(True))
            args[pos] = value
            self.received.append((pos, src, value))
        with torch.set_grad_enabled(self.record):
            out = fn(*args)
        self.outputs = out
        for key, dst in routing.sends[index]:
            send(out[key[1]] if key[0] == "out" else self.params[key[1]], dst, self.device, self.works)
        return out


class PipelineForward:
    """The printed program's forward on a pipeline: every process runs it, each computing its
    own stage (:class:`_Run`); the plan's outputs broadcast from their stage's process."""

    def __init__(self, forward, routing: Routing, device):
        self.forward, self.routing, self.device = forward, routing, device

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def _run(self, params, data, record: bool) -> tuple[_Run, dict]:
        run = _Run(self.routing, self.rank, self.device, record)
        run.params = {k: v for k, v in params.items() if self.routing.owner.get(k) == run.rank}
        token = _RUN.set(run)
        try:
            out = self.forward(params, data)
        finally:
            _RUN.reset(token)
        return run, out

    def _broadcast_outputs(self, out: dict) -> dict:
        result = dict(out)
        device = self.device
        for name in self.routing.output_order:
            made = self.routing.outputs.get(name)
            if made is not None and name in out:
                result[name] = broadcast(out[name], made[0], self.rank, device)
        return result

    def __call__(self, params, data):
        run, out = self._run(params, data, record=False)
        wait(run.works)
        return self._broadcast_outputs(out)

    def vjp_parts(self, parts, diff_params, diff_data) -> list:
        """GPipe over ``parts`` (``(params, data, cotangents)`` per micro-batch): every forward
        pass, then the backward passes, last part first -> ``[(outputs, gradients)...]`` equal on
        every process for outputs and data gradients; a parameter's gradient is real on the
        process holding it, a ``meta`` tensor elsewhere."""
        rank, routing = self.rank, self.routing
        pending = []
        with torch.enable_grad():
            for params, data, cotangents in parts:
                params, data = dict(params), dict(data)
                leaves = {}
                for src, names in ((params, [k for k in diff_params if routing.owner.get(k, rank) == rank]),
                                   (data, diff_data)):
                    for k in names:
                        leaf = _native(src[k]).detach().requires_grad_(True)
                        leaves[k] = leaf
                        src[k] = _xp.TorchArray(leaf)
                run, out = self._run(params, data, record=True)
                pending.append((run, out, leaves, params, cotangents))
        results: list = [None] * len(parts)
        for i in reversed(range(len(pending))):
            run, out, leaves, params, cotangents = pending[i]
            results[i] = self._backward(run, out, leaves, params, cotangents, diff_params, diff_data)
        for run, *_ in pending:
            wait(run.works)
        return [(self._broadcast_outputs(out), grads) for (run, out, *_), (_, grads) in zip(pending, results)]

    def _backward(self, run: _Run, out: dict, leaves: dict, params: dict, cotangents: dict, diff_params,
                  diff_data):
        routing, rank, device = self.routing, run.rank, run.device
        outputs = run.outputs
        cots: dict[int, torch.Tensor] = {}
        for name, g in cotangents.items():
            made = routing.outputs.get(name)
            if g is not None and made is not None and made[0] == rank:
                g = _native(g)
                g = g.to(device) if isinstance(g, torch.Tensor) else _xp.tensor_from_numpy(np.asarray(g), device)
                cots[made[1]] = g if made[1] not in cots else cots[made[1]] + g
        extra: dict[str, torch.Tensor] = {}  # gradients of this stage's parameters that later stages read
        for key, dst in routing.sends[rank]:  # the gradients of what this stage sent, back from where it went
            value = outputs[key[1]] if key[0] == "out" else run.params[key[1]]
            if not _floating(value):
                continue
            g = torch.empty_like(_native(value).detach(), memory_format=torch.contiguous_format)
            dist.recv(g, dst)
            if key[0] == "out":
                cots[key[1]] = g if key[1] not in cots else cots[key[1]] + g
            else:
                extra[key[1]] = g if key[1] not in extra else extra[key[1]] + g
        roots, root_cots = [], []
        for pos, g in cots.items():
            t = _native(outputs[pos])
            if isinstance(t, torch.Tensor) and t.requires_grad:
                roots.append(t)
                root_cots.append(g)
        received = [(src, _native(v)) for _, src, v in run.received if _floating(v)]
        wrt = list(leaves.values()) + [t for _, t in received]
        grads = list(torch.autograd.grad(roots, wrt, root_cots, allow_unused=True)) if roots and wrt else \
            [None] * len(wrt)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, grads)]
        mine = dict(zip(leaves, grads[:len(leaves)]))
        for (src, _), g in zip(received, grads[len(leaves):]):  # its shape is known there: no header
            g = _row_major(g)
            run.works += [dist.isend(g, src), (g,)]
        result = {}
        for k in diff_params:
            if k in mine:
                result[k] = mine[k] + extra[k] if k in extra else mine[k]
            else:  # another stage's parameter: its gradient lives there
                p = _native(params[k])
                result[k] = torch.zeros(p.shape, dtype=p.dtype, device="meta")
        for k in diff_data:
            g = mine[k].detach().clone(memory_format=torch.contiguous_format)
            dist.all_reduce(g)  # each stage's share of a data input's gradient, summed
            result[k] = g
        return out, result


def pipeline_forward(forward, plan, stages, device) -> PipelineForward:
    """The printed ``forward`` of ``plan`` with its pipeline ``stages`` (a Checkpointing), run
    on this process's ``device``."""
    return PipelineForward(forward, Routing(plan, stages), device)


def stage(index: int, fn, args):
    """``_backend.pipeline_stage``: stage ``index`` of the run in progress."""
    run = _RUN.get()
    if run is None:
        raise MeshError("TorchBackend: a pipeline stage ran outside its program's forward (PipelineForward)")
    return run.stage(index, fn, args)


def placeholder(value):
    """A parameter this process does not hold: a ``meta`` tensor of its shape and dtype."""
    t = _native(value)
    if isinstance(t, torch.Tensor):
        return t if t.is_meta else torch.empty(t.shape, dtype=t.dtype, device="meta")
    arr = np.asarray(t)
    return torch.empty(arr.shape, dtype=_xp.TO_TORCH[arr.dtype], device="meta")


def gather(values: dict, owner: dict, rank: int, device) -> dict:
    """Each parameter of ``values`` whole on every process, broadcast from the stage that holds
    it (``owner``: name -> stage); others as they are."""
    out = {}
    for name in sorted(values):
        v = values[name]
        if name in owner:
            out[name] = broadcast(v, owner[name], rank, device)
        else:
            out[name] = v
    return {k: out[k] for k in values}
