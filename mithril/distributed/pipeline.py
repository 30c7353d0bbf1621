"""Pipeline parallelism: a plan cut into stages, one per device (group) of the pipeline axis.

The stages are contiguous runs of the plan's top-level nodes, balanced by the bytes each node
reads from parameters and writes (a proxy for its work); they are printed as the nested
functions gradient checkpointing prints (:mod:`mithril.backends.checkpoint`), called through the
backend's ``pipeline_stage(index, fn, *live_in)``, which runs stage ``index`` on its devices and
moves the values it reads there. Each parameter lives on the stage that first reads it.

A batch is cut into ``microbatches`` equal parts; the forward passes of all parts are issued
before their backward passes (GPipe), and a backend that dispatches asynchronously (JAX) keeps
every stage busy with a different part. Outputs are put back together: per-row outputs (dim 0
the micro-batch) are concatenated, scalars averaged (a batch-mean loss, as TrainModel's Mean
reduction gives: the mean of equal parts' means is the whole batch's), and gradients are summed
over the parts.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.checkpoint import Checkpointing, last_reads, segments_between
from ..errors import MeshError


def _nbytes(v) -> int:
    if v.static_shape is None:
        return 4
    return math.prod(v.static_shape) * (v.dtype.itemsize if v.dtype is not None and v.dtype != object else 4)


def pipeline_stages(owner: str, plan, n_stages: int) -> tuple[Checkpointing, dict[str, int]]:
    """``n_stages`` contiguous stages of ``plan``'s top-level nodes (a :class:`Checkpointing`
    whose segments the program calls through ``pipeline_stage``) and each parameter's stage."""
    nodes = plan.nodes
    if len(nodes) < n_stages:
        raise MeshError(f"{owner}: a pipeline of {n_stages} stages needs at least {n_stages} nodes; the model has "
                        f"{len(nodes)}")
    seen: set = set()
    cost = []
    derived: list[bool] = []  # work on parameters alone (a weight's Transpose): it joins its reader's stage
    from_params: set = set()
    for pn in nodes:
        only = all(v is None or v.kind in ("param", "constant") or id(v) in from_params for v in pn.inputs)
        derived.append(bool(pn.inputs) and only)
        if derived[-1]:
            from_params.update(id(o) for o in pn.outputs)
        c = sum(_nbytes(o) for o in pn.outputs)
        for v in pn.inputs:
            if v is not None and v.kind == "param" and v.name not in seen:
                seen.add(v.name)
                c += 2 * _nbytes(v)  # a weight's bytes stand for its multiply-adds
        cost.append(c)
    total = np.cumsum(cost)
    cuts = [0]
    for k in range(1, n_stages):
        at = min(max(int(np.searchsorted(total, total[-1] * k / n_stages)) + 1, cuts[-1] + 1), len(nodes) - (n_stages - k))
        limit = len(nodes) - (n_stages - k)
        back = at
        while back - 1 > cuts[-1] and derived[back - 1]:
            back -= 1
        if back - 1 > cuts[-1] or not derived[back - 1]:
            at = back
        else:  # the stage would hold parameter work alone: end it after that work's reader instead
            while at < limit and derived[at - 1]:
                at += 1
        cuts.append(at)
    cuts.append(len(nodes))
    segments = segments_between(plan, list(zip(cuts[:-1], cuts[1:])), last_reads(plan))
    stage_of: dict[str, int] = {}
    for seg in segments:
        for v in seg.inputs:
            if v.kind == "param":
                stage_of.setdefault(v.name, seg.index)
    return Checkpointing(plan, segments, [], call="pipeline_stage"), stage_of


def split_batch(owner: str, values: dict, names, parts: int) -> list[dict]:
    """``values`` cut into ``parts`` along dim 0 for ``names`` (the batched inputs); the others
    are the same in every part."""
    out = [dict(values) for _ in range(parts)]
    for name in names:
        v = values[name]
        n = v.shape[0]
        if n % parts:
            raise MeshError(f"{owner}: the batch of input {name!r} ({n}) is not a multiple of microbatches={parts}")
        step = n // parts
        for i in range(parts):
            out[i][name] = v[i * step:(i + 1) * step]
    return out
