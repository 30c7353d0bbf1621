"""Where a compiled model's time goes: seconds per op type and per node, on any backend.

:func:`profile` runs a :class:`~mithril.physical_model.PhysicalModel` a few times with a clock around
each node and returns a :class:`ProfileReport`. How each backend is measured:

- NumPy, Torch: the generated program is printed again with each kernel call timed
  (``emit_python(timed=True)``); Torch on a GPU synchronizes after each kernel.
- JAX, jitted: XLA's profiler times each instruction of the compiled program (a fusion, a dot),
  each given to the node it came from (``mithril/backends/jax/xla_profile.py``): *per XLA op*.
- MLX (and JAX un-jitted): ``mx.compile`` hides the ops, so the same timed program runs op by op
  (eagerly, ``block_until_ready`` / ``mx.eval`` after each node): *eager per-op time*, shown
  beside the compiled wall time.
- Segmented backends (C, GGML): the program's run hook times each node NumPy runs between the
  native segments, and each segment whole (GGML: one ``ggml_graph_compute``), *per partition*;
  where the native code keeps per-node clocks (``program.node_clocks()``: C, from a library built
  with ``MITHRIL_C_PROFILE=1``, built here when the model's own was not) a row per node instead.

The report also holds the un-instrumented wall time (``pm.evaluate`` as a user calls it), so the
clocks' overhead is visible.

>>> import mithril as ml, numpy as np
>>> from mithril.profile import profile
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Exp", ["y"], ["z"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
...     [helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 64])])
>>> pm = ml.compile(ml.load_onnx(helper.make_model(g)), ml.NumpyBackend(), inference=True)
>>> report = profile(pm, None, {"x": np.ones((64, 64), np.float32)}, runs=3)
>>> sorted(row.op_type for row in report.op_types)
['Exp', 'Relu']
>>> round(sum(row.share for row in report.op_types))
100
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .backends.segmented import Segment, SegmentedBackend
from .errors import MithrilError

# What each backend's rows measure (ProfileReport.method).
KERNEL = "kernel"  # each kernel call of the generated program, as it runs
EAGER_OP = "eager op"  # each node run op by op with the jit off (MLX; JAX where it has no trace reader)
XLA_OP = "XLA op"  # each instruction of the jitted XLA program, by XLA's profiler, given to its node (JAX)
C_NODE = "C node"  # the C library's per-node clocks
PARTITION = "partition"  # a ggml segment, or a node NumPy runs between segments

_PYTHON_BACKENDS = ("numpy", "torch", "jax", "mlx")
# Attributes that make two nodes of one op type and shape cost differently (ProfileReport.by_signature).
_COST_ATTRIBUTES = ("group", "strides", "dilations", "kernel_shape", "transA", "transB")


@dataclass
class OpTypeTime:
    """One op type: ``calls`` and ``ms`` per run, ``share`` in % of the profiled nodes' time."""

    op_type: str
    calls: int
    ms: float
    share: float


@dataclass
class NodeTime:
    """One node (or, on GGML, one ggml segment): its op type, the shapes of its inputs
    (None for an absent or non-array input), ``calls`` and ``ms`` per run, ``share`` in %."""

    name: str
    op_type: str
    input_shapes: list
    calls: int
    ms: float
    share: float
    # The attributes the node sets whose values are short (group, strides, kernel_shape, axis...).
    attributes: dict = field(default_factory=dict)


@dataclass
class ProfileReport:
    """What :func:`profile` measured.

    ``op_types`` and ``nodes``: rows sorted by time, slowest first (per run). ``method``: what a
    row's clock covers (``"kernel"``, ``"XLA op"``, ``"eager op"``, ``"C node"`` or ``"partition"``;
    ``note`` says it in words). ``wall_ms``: median time of an un-instrumented ``pm.evaluate``
    (jitted where the model was compiled with jit); ``eager_ms``: the generated program run without
    jit or clocks (Python backends but jitted JAX); ``instrumented_ms``: median time of a profiled run, whose excess
    over ``eager_ms`` (or ``wall_ms``) is the clocks' overhead; ``nodes_ms``: the rows' sum.
    """

    backend: str
    method: str
    note: str
    runs: int
    jitted: bool
    wall_ms: float
    eager_ms: float | None
    instrumented_ms: float
    op_types: list[OpTypeTime] = field(default_factory=list)
    nodes: list[NodeTime] = field(default_factory=list)

    @property
    def nodes_ms(self) -> float:
        return sum(r.ms for r in self.nodes)

    def by_signature(self) -> list[OpTypeTime]:
        """Rows per op type, input shapes and the attributes that change a kernel's cost (group,
        strides, dilations, kernel_shape), slowest first: which Conv of which shape takes the time.
        ``op_type`` holds the signature, as ``Conv [1, 32, 112, 112]x[32, 1, 3, 3] group=32``."""
        total = self.nodes_ms or 1.0
        rows: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for r in self.nodes:
            shapes = "x".join(str(s) for s in r.input_shapes if s)
            extra = "".join(f" {k}={r.attributes[k]}" for k in _COST_ATTRIBUTES if k in r.attributes)
            rows[f"{r.op_type} {shapes}{extra}"][0] += r.calls
            rows[f"{r.op_type} {shapes}{extra}"][1] += r.ms
        return sorted((OpTypeTime(k, n, ms, 100 * ms / total) for k, (n, ms) in rows.items()), key=lambda r: -r.ms)

    def to_dict(self) -> dict:
        """Plain data (for ``json.dump``): every field, and ``nodes_ms``."""
        return {**asdict(self), "nodes_ms": self.nodes_ms}

    def write_json(self, path: str | os.PathLike, **extra) -> None:
        """:meth:`to_dict` as JSON, after the ``extra`` keys (the command adds ``model`` and ``inputs``)."""
        with open(path, "w") as f:
            json.dump({**extra, **self.to_dict()}, f, indent=1)

    def summary(self) -> str:
        """Two lines: what was measured, and the wall times beside the rows' sum."""
        parts = [f"{self.backend}: {self.note}", f"per run, median of {self.runs}: "
                 f"{'jitted ' if self.jitted else ''}wall {self.wall_ms:.3f} ms"]
        if self.eager_ms is not None:
            parts[1] += f", {'eager ' if self.jitted else 'program '}{self.eager_ms:.3f} ms"
        parts[1] += f"; profiled run {self.instrumented_ms:.3f} ms, of which the rows {self.nodes_ms:.3f} ms"
        return "\n".join(parts)

    def op_table(self):
        """A rich table of op types, slowest first."""
        from rich.table import Table

        t = Table(title=f"Time per op type ({self.backend}, {self.method} clocks, per run)")
        for col in ("op type", "calls", "ms", "share %"):
            t.add_column(col, justify="left" if col == "op type" else "right", overflow="fold")
        for r in self.op_types:
            t.add_row(r.op_type, str(r.calls), f"{r.ms:.3f}", f"{r.share:.1f}")
        return t

    def node_table(self, top: int = 10):
        """A rich table of the ``top`` slowest nodes (GGML: partitions)."""
        from rich.table import Table

        what = "partitions" if self.method == PARTITION else "nodes"
        t = Table(title=f"Top {min(top, len(self.nodes))} {what} ({self.backend}, per run)")
        for col in ("node", "op type", "input shapes", "calls", "ms", "share %"):
            t.add_column(col, justify="right" if col in ("calls", "ms", "share %") else "left", overflow="fold")
        for r in self.nodes[:top]:
            shapes = ", ".join("-" if s is None else "x".join(map(str, s)) or "scalar" for s in r.input_shapes)
            t.add_row(r.name, r.op_type, shapes, str(r.calls), f"{r.ms:.3f}", f"{r.share:.1f}")
        return t

    def __str__(self) -> str:
        lines = [self.summary(), f"{'op type':24s} {'calls':>6s} {'ms':>10s} {'share %':>8s}"]
        lines += [f"{r.op_type:24s} {r.calls:6d} {r.ms:10.3f} {r.share:8.1f}" for r in self.op_types]
        return "\n".join(lines)


def profile(pm, params: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None, *,
            runs: int = 10, warmup: int = 1) -> ProfileReport:
    """Run ``pm`` (a compiled model) ``runs`` times after ``warmup`` runs with a clock around each
    node, and time ``runs`` un-instrumented ``pm.evaluate(params, data)`` calls. ``params``:
    None for the model's own; ``data``: every input, NumPy or backend arrays. See the module's
    docstring for what each backend's clocks cover. Profile a model compiled with
    ``inference=True``: a compiled TrainModel's evaluate also computes gradients, which the wall
    time would then include and the rows would not.
    """
    if runs < 1 or warmup < 0:
        raise MithrilError(f"profile: runs must be at least 1 and warmup at least 0, got runs={runs}, warmup={warmup}")
    backend = pm.backend
    data = {} if data is None else dict(data)
    if not params:  # fetched once: pm.evaluate(None, ...) would copy every weight in each timed call
        params = pm.get_parameters()
    sync = backend.synchronize
    jitted = pm.jitted is not None

    def evaluate():
        sync(pm.evaluate(params, data))

    wall = _median_ms(evaluate, runs, warmup)
    prepared_params, prepared_data, _, _ = pm.prepare(params, data, None)
    name = backend.name
    traced = _profile_jitted(pm, prepared_params, prepared_data, runs, warmup) if jitted else None
    if traced is not None:
        clock, instrumented = traced
        eager, method = None, XLA_OP
        note = ("XLA's profiler on the compiled per-call program: each XLA instruction run (a fusion, dot, "
                "convolution, copy) given to the node it came from, a fusion's to the node with the most arithmetic "
                "in it, which names the others (+); instructions may overlap on XLA's threads")
    elif name in _PYTHON_BACKENDS:
        clock, instrumented, eager = _profile_python(pm, prepared_params, prepared_data, sync, runs, warmup)
        method = EAGER_OP if name in ("jax", "mlx") else KERNEL
        note = {"jax": "eager per-op time: each node run op by op with jit off (block_until_ready after each); "
                       "the jitted program fuses them",
                "mlx": "eager per-op time: each node run op by op with mx.compile off (mx.eval after each); "
                       "the compiled program fuses them",
                "torch": "time of each kernel call of the generated program"
                         + (" (torch.cuda.synchronize after each)" if _on_gpu(backend) else "")
                         + ("; run eagerly: the torch.compile'd program fuses them" if jitted else ""),
                "numpy": "time of each kernel call of the generated program"}[name]
        wrapped = getattr(pm.program, "wrapped", None)
        if wrapped is not None:  # a wrapper may say itself how it runs the program (Torch's oneDNN graph)
            note += getattr(wrapped, "profile_note", "; the rows leave out the backend's wrapper around the program "
                            "(autocast, a compute dtype, devices), which the wall time includes")
    elif isinstance(backend, SegmentedBackend):
        clock, instrumented, method, note = _profile_segmented(pm, prepared_params, prepared_data, runs, warmup)
        eager = None
    else:
        raise MithrilError(f"profile: no profiler for backend {name!r}")
    report = clock.report()
    return ProfileReport(name, method, note, runs, jitted, wall, eager, instrumented, *report)


# -- clocks ------------------------------------------------------------------------------


class _Clock:
    """Seconds per key in each run, and calls; a call made inside another timed call (a Loop or
    If body's nodes) is taken out of the outer one's time, so each row is the node's own time."""

    def __init__(self, sync: Callable[[Any], None] = lambda out: None,
                 traced: Callable[[tuple], bool] = lambda args: False):
        self.sync = sync
        # JAX: a Loop/Scan/If body that lax traces gets tracers; its nodes' time (tracing) stays the parent's.
        self.traced = traced
        self.seconds: dict[Any, float] = defaultdict(float)  # this run's
        self.calls: dict[Any, int] = defaultdict(int)  # every run's
        self.runs: list[dict[Any, float]] = []
        self.rows: dict[Any, tuple[str, str, list]] = {}  # key -> (name, op type, input shapes)
        self._inner = 0.0

    def timed(self, key, fn, *args, **kwargs):
        if self.traced(args):
            return fn(*args, **kwargs)
        outer, self._inner = self._inner, 0.0
        start = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            self.sync(out)
        finally:
            spent = time.perf_counter() - start
            self.seconds[key] += spent - self._inner
            self.calls[key] += 1
            self._inner = outer + spent
        if key not in self.rows:
            self.describe(key, args)
        return out

    def describe(self, key, args) -> None:  # the caller names its keys
        pass

    def add(self, key, seconds: float, calls: int = 1) -> None:
        self.seconds[key] += seconds
        self.calls[key] += calls

    def end_run(self) -> None:
        self.runs.append(dict(self.seconds))
        self.seconds.clear()
        self._inner = 0.0

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.runs.clear()
        self._inner = 0.0

    def report(self) -> tuple[list[OpTypeTime], list[NodeTime]]:
        """Rows, slowest first: each key's median seconds over the runs (robust to a run that a
        busy machine stalled), its calls per run, and its share of the rows' sum."""
        runs = max(len(self.runs), 1)
        keys = dict.fromkeys(k for r in self.runs for k in r)
        median = {k: statistics.median(r.get(k, 0.0) for r in self.runs) for k in keys}
        total = sum(median.values()) or 1.0
        nodes = []
        by_type: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for key, seconds in median.items():
            name, op_type, shapes, attributes = self.rows[key]
            calls = round(self.calls[key] / runs)
            nodes.append(NodeTime(name, op_type, shapes, calls, 1e3 * seconds, 100 * seconds / total, attributes))
            by_type[op_type][0] += seconds
            by_type[op_type][1] += calls
        op_types = [OpTypeTime(op, calls, 1e3 * s, 100 * s / total) for op, (s, calls) in by_type.items()]
        return sorted(op_types, key=lambda r: -r.ms), sorted(nodes, key=lambda r: -r.ms)


def _attributes(pn) -> dict:
    """The node's short attributes, as JSON takes them: numbers, strings, and up to 8 numbers."""
    out = {}
    for k, v in pn.attributes.items():
        if isinstance(v, (bool, int, float, str)) and len(str(v)) <= 32:
            out[k] = v
        elif isinstance(v, (tuple, list)) and len(v) <= 8 and all(isinstance(x, (int, float)) for x in v):
            out[k] = list(v)
    return out


def _static_shapes(pn) -> list:
    """The compile-time shape of each input of plan node ``pn`` (None where absent or unknown)."""
    return [None if v is None or v.static_shape is None else list(v.static_shape) for v in pn.inputs]


def _shape(value) -> list[int] | None:
    shape = getattr(value, "shape", None)
    try:
        return None if shape is None else [int(d) for d in shape]
    except TypeError:  # a symbolic or traced shape
        return None


def _median_ms(call: Callable[[], Any], runs: int, warmup: int, after: Callable[[], None] | None = None) -> float:
    """Median milliseconds of ``runs`` calls after ``warmup``; ``after`` runs after each timed call,
    outside its time."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return 1e3 * statistics.median(times)


def _on_gpu(backend) -> bool:
    """Torch on CUDA: kernels return before the GPU has run them."""
    return backend.name == "torch" and "cuda" in f"{backend.device} {getattr(backend, '_device', '')}"


# -- Python backends: the program printed again with timed kernel calls -------------------


def _profile_python(pm, params, data, sync, runs: int, warmup: int):
    from .backends.emit_python import emit_python

    backend = pm.backend
    clock = _Clock(sync, backend.is_traced)
    namespace = {**backend.program_namespace(), "_timed": clock.timed}
    plan = backend.forward_plan(pm.plan)
    program = emit_python(plan, namespace=namespace, constant=backend.constant, timed=True)
    nodes = program.timed_nodes
    # Nodes the backend runs inside another (Torch: Conv -> Add -> Relu as one oneDNN call) get
    # a row of no calls naming their host, whose row names them, as the C backend's do.
    fused_into = _fused_into(pm.plan, plan)
    guests = defaultdict(list)
    for guest, host in fused_into.items():
        guests[host].append(guest)
    for pn in pm.plan.nodes:
        if pn.label in fused_into:
            shapes = _static_shapes(pn)
            clock.rows[("fused", pn.label)] = (f"{pn.label} (fused into {fused_into[pn.label]})", pn.op_type, shapes,
                                               _attributes(pn))

    def describe(key, args):
        pn = nodes[key]
        name = pn.label + "".join(f" (+ {g})" for g in guests.get(pn.label, ()))
        shapes = [_shape(a) for a in args[:len(pn.inputs)]]
        while shapes and shapes[-1] is None:  # optional inputs left out
            shapes.pop()
        clock.rows[key] = (name, pn.op_type, shapes, _attributes(pn))

    def end_run():
        for guest in fused_into:
            clock.add(("fused", guest), 0.0, 0)
        clock.end_run()

    clock.describe = describe
    forward = program.forward

    def run(fn):
        return lambda: sync(fn(params, data))

    with backend.scope():  # entered once: its cost (a BLAS thread cap) is no node's
        eager = _median_ms(run(pm.program.forward), runs, warmup)
        for _ in range(warmup):
            run(forward)()
        clock.reset()
        instrumented = _median_ms(run(forward), runs, 0, end_run)
    return clock, instrumented, eager


def _profile_jitted(pm, params, data, runs: int, warmup: int):
    """The jitted program's own per-node time, where the backend's profiler gives it
    (:meth:`~mithril.backends.backend.Backend.profile_jitted`): (clock, ms per profiled run), or None."""
    from .backends.emit_python import emit_python

    backend = pm.backend
    plan = backend.forward_plan(pm.plan)
    printed = []

    def print_program(call):
        printed.append(emit_python(plan, namespace={**backend.program_namespace(), "_timed": call},
                                   constant=backend.constant, timed=True))
        return printed[-1].forward

    trace = backend.profile_jitted(pm.jitted, print_program, params, data, runs=runs, warmup=warmup)
    if trace is None or not trace.runs:
        return None
    nodes = printed[-1].timed_nodes
    guests = defaultdict(list)
    for guest, host in trace.fused.items():
        guests[host].append(nodes[guest].label)
    clock = _Clock()

    def shapes(pn) -> list:
        out = _static_shapes(pn)
        while out and out[-1] is None:  # optional inputs left out
            out.pop()
        return out

    for key in trace.calls:
        if isinstance(key, int):
            pn = nodes[key]
            name = pn.label + "".join(f" (+ {g})" for g in guests.get(key, ()))
            clock.rows[key] = (name, pn.op_type, shapes(pn), _attributes(pn))
        else:  # an instruction XLA made that no node's scope names
            clock.rows[key] = (key, key, [], {})
    for guest, host in trace.fused.items():
        pn = nodes[guest]
        clock.rows[("fused", guest)] = (f"{pn.label} (fused into {nodes[host].label})", pn.op_type, shapes(pn),
                                        _attributes(pn))
    # Nodes that run no instruction of their own or in another's (a Flatten XLA makes a bitcast).
    free = [i for i in range(len(nodes)) if i not in trace.calls and i not in trace.fused]
    for i in free:
        clock.rows[("free", i)] = (f"{nodes[i].label} (no XLA work)", nodes[i].op_type, shapes(nodes[i]),
                                   _attributes(nodes[i]))
    for run in trace.runs:
        for key, calls in trace.calls.items():
            clock.add(key, run.get(key, 0.0), calls)
        for key in [("fused", g) for g in trace.fused] + [("free", i) for i in free]:
            clock.add(key, 0.0, 0)
        clock.end_run()
    return clock, 1e3 * statistics.median(trace.run_seconds)


def _fused_into(plan, program_plan) -> dict[str, str]:
    """The label of each node of ``plan`` that ``program_plan`` (the backend's forward plan) runs
    inside another node -> that node's label: the node writing its output, or, for an
    intermediate result (an Add between a Conv and its Relu), the host of the node reading it."""
    kept = {pn.label for pn in program_plan.nodes}
    writer = {v: pn.label for pn in program_plan.nodes for v in pn.outputs}
    readers = defaultdict(list)
    for pn in plan.nodes:
        for v in pn.inputs:
            if v is not None:
                readers[v].append(pn)

    def host(pn, depth: int = 0):
        for v in pn.outputs:
            if v in writer:
                return writer[v]
        for v in pn.outputs:
            for r in readers[v]:
                if r.label not in kept and depth < 8:
                    return host(r, depth + 1)
        return None

    return {pn.label: h for pn in plan.nodes if pn.label not in kept and (h := host(pn)) is not None}


# -- segmented backends (C, GGML): per node where the native code has clocks, else per partition --


def _profile_segmented(pm, params, data, runs: int, warmup: int):
    """Through the program's run hook: each node NumPy runs timed as it runs; each segment timed
    whole, unless the native code keeps per-node clocks (C built with ``MITHRIL_C_PROFILE=1``,
    built here when the model's own library has none): then a row per node, from those clocks."""
    program = pm.program.program_for(params, data)  # a program built at its first evaluate is built now
    if program.node_clocks() is None:
        program = pm.backend.lower_clocked(pm.plan) or program
    clocked = program.node_clocks() is not None
    clock = _Clock()
    index = {id(pn): i for i, pn in enumerate(program.plan.nodes)}
    in_native: list = []  # (slot, whether fused into another) of the nodes the native code runs, with clocks
    if clocked:
        in_native = _clocked_rows(program, clock)
    seen = [s for _, s in program.node_clocks()] if clocked else []

    def hook(step, fn, *args):
        if isinstance(step, Segment):
            if clocked:  # the node clocks hold its time
                return fn(*args)
            key = ("segment", step.index)
            if key not in clock.rows:
                kinds = ", ".join(dict.fromkeys(pn.op_type for pn in step.nodes))
                clock.rows[key] = (f"{program.segment_label} {step.index}: {len(step.nodes)} nodes ({kinds})",
                                   program.segment_label,
                                   [None if v is None else list(v.static_shape or ()) for v in step.inputs], {})
            return clock.timed(key, fn, *args)
        key = index.get(id(step), ("node", id(step)))
        if key not in clock.rows:
            clock.rows[key] = (f"{step.label} (on NumPy)", step.op_type, [_shape(a) for a in args[1]],
                               _attributes(step))
        return clock.timed(key, fn, *args)

    def end_run():  # the node clocks are running sums: this run's seconds are the differences
        if clocked:
            now = [s for _, s in program.node_clocks()]
            for i, fused in in_native:
                clock.add(i, 0.0 if fused else now[i] - seen[i], 0 if fused else 1)
            seen[:] = now
        clock.end_run()

    def run():
        program.run(params, data, hook=hook)

    for _ in range(warmup):
        run()
    end_run()
    clock.reset()
    instrumented = _median_ms(run, runs, 0, end_run)
    if clocked:
        return clock, instrumented, program.clock_method, program.clock_note
    return clock, instrumented, PARTITION, program.profile_note


def _clocked_rows(program, clock: _Clock) -> list:
    """The rows of the plan nodes the native code runs, by plan position: (slot, whether fused
    into another node) for each. A node fused into
    another (Conv + Relu: the fused node writes the activation's output, its clock covers both)
    gets a row of no calls naming its host, whose row names it."""
    producer = {v: pn for step in program.steps if isinstance(step, Segment) for pn in step.nodes for v in pn.outputs}
    fallback = {id(pn) for pn in program.fallback}
    fused_into = {pn.label: host.label for pn in program.plan.nodes if pn.outputs
                  and (host := producer.get(pn.outputs[0])) is not None and host.label != pn.label}
    rows = []
    for i, pn in enumerate(program.plan.nodes):
        if id(pn) in fallback:
            continue  # timed as NumPy runs it
        shapes = _static_shapes(pn)
        if pn.label in fused_into:
            clock.rows[i] = (f"{pn.label} (fused into {fused_into[pn.label]})", pn.op_type, shapes, _attributes(pn))
        else:
            guests = [name for name, host in fused_into.items() if host == pn.label]
            clock.rows[i] = (pn.label + "".join(f" (+ {g})" for g in guests), pn.op_type, shapes, _attributes(pn))
        rows.append((i, pn.label in fused_into))
    return rows


__all__ = ["NodeTime", "OpTypeTime", "ProfileReport", "profile"]
