"""A compiled GGML program: the plan partitioned into ggml segments (one ggml compute graph
each, built once) and the nodes NumPy runs between them.

Every segment lives in its own ggml context created with ``no_alloc``: the context holds only
tensor headers and the graph, and is sized to exactly what they take (the segment is first built
in scratch contexts to count them; :meth:`GGMLProgram._build`). Each ggml call is checked in
Python first (:mod:`.guard`): a node whose build makes one ggml would assert on runs on NumPy
instead (GGMLBackend.build_program). Weights
point at NumPy buffers the program keeps (float32 parameters without a copy; transposed,
half-precision or quantized ones converted once per parameter array), segment inputs at the
caller's arrays (swapped per call, views re-pointed), and the intermediates at one
buffer per segment placed by ``ggml_gallocr`` from the graph's lifetimes. ``evaluate`` sets the
input pointers and runs ``ggml_graph_compute`` with the segment's plan (its work buffer made once)
on the program's thread pool (started once: ggml's per-call threads cost milliseconds); outputs are copied out
of ggml's buffer (it is reused by the next call).
"""

from __future__ import annotations

import ctypes
import os
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CompileError, FallbackWarning, KernelError, KernelMissingError, MithrilError, NodeError
from ..plan import Plan, PlanNode, PlanValue
from ..segmented import SegmentedProgram, later_reads, segment_io, why_not
from ..segmented import Segment as NativeSegment
from ..segmented.threads import ThreadGovernor
from .guard import MAX_GRAPH_DEPTH, MAX_LIVE_ALLOCATIONS, Calls, graph_size, peak_allocations
from .ops import BOOL, F32, HALF, INDEX_DTYPES, MAX_DIMS, OPS, Builder, ne
# The families register their rules when imported.
from .ops import attention, elementwise, image, movement, nn, quantize_linear, recurrent  # noqa: F401
from .quantize import QuantizedTensor
from .threads import reads_f32_in_place, waits_passively


class GGMLFallbackWarning(FallbackWarning):
    """Nodes without a ggml rule run on NumPy between the ggml graphs (``fallback="numpy"``)."""


class GGMLKernelMissingError(KernelMissingError):
    """``GGMLBackend(fallback=None)`` and nodes without a ggml rule: all of them listed, with why."""


class GGMLMemoryError(CompileError):
    """The model needs more memory than ``GGMLBackend(mem_size=...)`` allows; says how much."""


def _ggml():
    from .threads import import_ggml

    return import_ggml()


def why_not_ggml(pn: PlanNode, pending: frozenset | set = frozenset()) -> str | None:
    """Why ``pn`` cannot run in ggml; None when it can (the segmented layer's capability under the
    ggml rules, :class:`~.ops.GGMLOp`'s hooks). ``pending``: values known only at the first
    evaluate (graph inputs a rule reads at build time, and the values whose shapes follow from
    them, see :func:`pending_values`): a node reading one passes for now and is checked in full
    when the program is built for those values."""
    return why_not(pn, OPS, pending)


def pending_values(plan: Plan) -> set[PlanValue]:
    """The graph inputs a ggml rule reads at build time (a Reshape's shape, a Slice's starts, a
    ReduceSum's axes given as data), and the values whose unknown shapes follow from them and
    from the fixed input shapes alone: the program is built at the first evaluate, for those
    inputs' values. Empty when the plan has subgraphs (their nodes read the outer values)."""
    if any(pn.subgraphs for pn in plan.nodes):
        return set()
    bound: set[PlanValue] = set()
    for pn in plan.nodes:
        rule = OPS.rule_for(pn)
        if rule is None:
            continue
        for i in rule.folded:
            v = pn.inputs[i] if i < len(pn.inputs) else None
            if v is not None and v.kind == "input" and v.static_shape is not None and v.dtype is not None \
                    and v.dtype.kind in "biuf":
                bound.add(v)
    if not bound:
        return set()
    pending = set(bound)
    for pn in plan.nodes:  # shapes a ggml rule makes from fixed or pending shapes and build-time values
        rule = OPS.rule_for(pn)
        if rule is None:
            continue
        ins = [v for v in pn.inputs if v is not None]
        if all(v.static_shape is not None or v in pending for v in ins) and \
                all(v.kind == "constant" or v in pending for i, v in enumerate(pn.inputs)
                    if i in rule.folded and v is not None):
            pending.update(v for v in pn.outputs if v.static_shape is None)
    return pending


class DeferredGGMLProgram:
    """A GGML program built at the first evaluate, when graph inputs a rule reads at build time
    are given as data (:func:`pending_values`): the plan is specialized to those inputs' values
    (they become constants, and the shapes that follow from them are read from one NumPy run of
    the plan), lowered by ``lower`` (the backend's fixed-shape lowering, checks included) and
    kept, keyed by the values' bytes; other values build another program (the last
    ``keep`` are kept)."""

    keep = 4
    filename = None  # no generated source (runner.node_error reads these)
    lines: dict = {}

    def __init__(self, plan: Plan, pending: set[PlanValue], lower):
        self.plan = plan
        self.bound = [v for v in plan.inputs if v in pending]
        self._lower = lower
        self._built: dict[tuple, GGMLProgram] = {}
        self.current: GGMLProgram | None = None

    @property
    def forward(self):
        return self.run

    def run(self, params: dict, data: dict, *, hook=None) -> dict:
        return self.program_for(params, data).run(params, data, hook=hook)

    def program_for(self, params: dict, data: dict) -> GGMLProgram:
        """The program built for the bound inputs' values in ``data`` (built now if not kept)."""
        values = [np.asarray(data[v.name]) for v in self.bound]
        key = tuple((a.dtype.str, a.shape, a.tobytes()) for a in values)
        program = self._built.pop(key, None)
        if program is None:
            program = self._lower(self.specialize(params or {}, data))
            while len(self._built) >= self.keep:
                self._built.pop(next(iter(self._built)))
        self._built[key] = program  # the newest last
        self.current = program
        return program

    def specialize(self, params: dict, data: dict) -> Plan:
        """The plan with the bound inputs as constants of ``data``'s values and every shape that
        follows from them filled in (read from the plan run once on NumPy)."""
        from dataclasses import replace

        from ..interpret import Interpreter

        plan = self.plan
        interpreter = Interpreter(plan)
        env: dict = {}

        def param(v):
            value = params[v.name]
            return value.dequantize() if isinstance(value, QuantizedTensor) else value

        for v in plan.inputs:
            env[v] = param(v) if v.kind == "param" else data[v.name]
        for v in plan.params:
            env.setdefault(v, param(v))
        with np.errstate(all="ignore"):  # NumPy reads the shapes here; ggml computes the values
            for pn in plan.nodes:
                args = [None if v is None else (v.value if v.kind == "constant" else env[v]) for v in pn.inputs]
                try:
                    env.update(zip(pn.outputs, interpreter.run_node(pn, args, env)))
                except MithrilError:
                    raise
                except Exception as exc:  # a kernel refusing these values: named as NumpyBackend names it
                    raise KernelError(f"the NumPy kernel failed: {type(exc).__name__}: {exc}", node=pn.label,
                                      op_type=pn.op_type, opset=pn.opset,
                                      shapes=[list(np.shape(a)) if hasattr(a, "shape") else None for a in args],
                                      dtypes=[str(getattr(a, "dtype", type(a).__name__)) for a in args]) from exc
        copies: dict[PlanValue, PlanValue] = {}

        def copy(v):
            if v is None:
                return None
            if v not in copies:
                if v in self.bound:
                    value = np.asarray(env[v])
                    copies[v] = replace(v, kind="constant", shape=tuple(value.shape), tensor=None, _array=value)
                elif v.static_shape is None and isinstance(env.get(v), np.ndarray):
                    copies[v] = replace(v, shape=tuple(env[v].shape))
                else:
                    copies[v] = v
            return copies[v]

        nodes = [replace(pn, inputs=tuple(map(copy, pn.inputs)), outputs=tuple(map(copy, pn.outputs)),
                         frees=tuple(map(copy, pn.frees))) for pn in plan.nodes]
        return replace(plan, inputs=[copy(v) for v in plan.inputs], params=[copy(v) for v in plan.params],
                       constants=[copy(v) for v in plan.constants], nodes=nodes,
                       outputs=[copy(v) for v in plan.outputs])

    def __getattr__(self, name):
        # The built program's reports (memory_report, quantization_report, segments...).
        if name.startswith("_") or name in ("current", "plan", "bound"):
            raise AttributeError(name)
        if self.current is None:  # an AttributeError: getattr(program, name, default) still answers
            raise AttributeError(f"GGMLBackend builds this program at its first evaluate (inputs "
                               f"{[v.name for v in self.bound]} are read when the ggml graph is made): "
                               f"{name} is known after it")
        return getattr(self.current, name)


@dataclass
class Segment(NativeSegment):
    """A run of nodes built as one ggml graph: ``inputs`` are read from Python (activations
    swapped in per call), ``outputs`` copied back; ``weights`` are read from parameters."""

    weights: list[PlanValue] = field(default_factory=list)
    graph: Any = None
    allocator: Any = None
    leaves: dict = field(default_factory=dict)  # PlanValue -> (tensor, staging array)
    results: dict = field(default_factory=dict)  # PlanValue -> tensor
    views: list = field(default_factory=list)  # (view tensor, its source tensor, byte offset)
    bounds: dict = field(default_factory=dict)  # index input -> (rows of the table it reads, the node)
    buffer_bytes: int = 0
    work_bytes: int = 0
    plan: Any = None  # ggml_cplan: threads, pool and work buffer
    work: np.ndarray | None = None


@dataclass
class _Weight:
    """A parameter or constant in ggml's layout: the source array (weakly), the buffer ggml reads,
    and every tensor (one per segment and layout user) that points at it."""

    value: PlanValue
    layout: str
    type_name: str
    tensors: list = field(default_factory=list)
    source: Any = None  # weakref to the array the buffer was made from
    # The memory that array viewed: (weakref to the array owning it, address, shape, strides,
    # dtype). Another view of the same memory (get_parameters() makes new views at each call) is
    # the same weight while the owner lives: it is not converted again.
    origin: tuple | None = None
    buffer: np.ndarray | None = None
    shape: tuple = ()  # the logical (NumPy-order) shape of the tensor ggml sees
    report: Any = None  # quantize.QuantizedWeight: bytes and error of a weight not stored as float32
    # Tensors whose bytes live in ggml's CPU_REPACK buffer (interleaved for its q4_0 gemm), each
    # with its own ggml backend buffer: (tensor, backend buffer, bytes). ``buffer`` is dropped once
    # every tensor of the weight has its repacked copy.
    repacked: list = field(default_factory=list)


class GGMLProgram(SegmentedProgram):
    """A lowered GGML program: ``forward(params, data)`` runs the steps, each Segment as one ggml
    graph and each other node on NumPy (``steps``: the GGML backend's partition of the plan)."""

    filename = None  # no generated source: runner.node_error reports a failure as it is
    lines: dict = {}
    segment_noun = "ggml graphs"
    segment_label = "ggml segment"
    report_labels = {"arena_bytes": "arena (ggml graphs)", "work_bytes": "work (ggml)"}
    profile_note = ("per partition: ggml-python has no per-node clocks, so each ggml segment (one "
                    "ggml_graph_compute) is one row, and each node NumPy runs between segments another")

    def __init__(self, plan: Plan, steps: list, *, weight_type: str = "f32", quantize: str | None = None,
                 num_threads: int | None = None, mem_size: int | None = None):
        from ..interpret import Interpreter
        from .quantize import WeightFormat

        ggml = _ggml()
        self.plan = plan
        self.num_threads = num_threads
        self.format = WeightFormat(weight_type, quantize, threads=num_threads or _default_threads())
        self.steps = steps
        self.fallback = [s for s in self.steps if not isinstance(s, Segment)]
        self.segments = [s for s in self.steps if isinstance(s, Segment)]
        self.interpreter = Interpreter(plan)
        # How a result's bytes read, by ggml type (float32 unless listed).
        self._result_types = {int(ggml.GGML_TYPE_I32): np.dtype(np.int32),
                              **{int(getattr(ggml, name)): dtype for name, dtype in HALF.items()}}
        self._weights: dict[tuple[PlanValue, str], _Weight] = {}
        # MatMul weights stay float32 [K, N] and are read in place where ggml can (threads.py).
        self._f32_in_place = (self.format.quantize is None and self.format.weight_type == "f32"
                              and reads_f32_in_place())
        self._constants: list[np.ndarray] = []
        self._find_io()
        # One ggml context per segment, each of exactly the bytes its tensors and graph take
        # (:meth:`_build`); ``_ctx`` is the one a build is writing to.
        self._contexts: list = []
        self._ctx = None
        self._cpu = ggml.ggml_backend_cpu_init()
        if not self._cpu:
            raise MithrilError("GGMLBackend: ggml's CPU backend did not start")
        self._buffer_type = ggml.ggml_backend_get_default_buffer_type(self._cpu)
        repack = _repack_buffer_type(self.format.quantize) if self.format.quantize in REPACKED else None
        self._repack_name, self._repack_type = repack or (None, None)
        self._repack_buffers: list = []  # ggml backend buffers the finalizer frees
        self._threads = num_threads or _default_threads()
        # Where ggml's threads spin at barriers (libgomp's default: .threads), calls move to one
        # thread while other processes hold the CPUs; where they sleep at once, every call runs on
        # every thread.
        self._governor = ThreadGovernor(self._threads, switch="MITHRIL_GGML_ADAPTIVE_THREADS", probe_one=True,
                                        enabled=not waits_passively())
        self._running_threads = self._threads
        pool_params = ggml.ggml_threadpool_params_default(self._threads)
        self._pool = ggml.ggml_threadpool_new(ctypes.byref(pool_params))
        if not self._pool:
            ggml.ggml_backend_free(self._cpu)
            raise MithrilError(f"GGMLBackend: ggml could not start {self._threads} threads")
        self._allocators: list = []
        self._finalizer = weakref.finalize(self, _free, self._contexts, self._cpu, self._pool, self._allocators,
                                           self._repack_buffers)
        with _Scratch() as scratch:
            for seg in self.segments:
                self._build(seg, scratch)
        self._drop_unread_weights()
        if mem_size is not None and self.total_bytes() > mem_size:
            raise GGMLMemoryError(
                f"GGMLBackend(mem_size={mem_size:,}): the model needs {self.total_bytes():,} bytes "
                f"({self._report_line()}); raise mem_size or quantize the weights")

    # ---- building -------------------------------------------------------------------------
    def _find_io(self) -> None:
        """Each segment's inputs (values read before it writes them: the activations, and the
        index inputs), weights (parameters and constants read as such) and outputs (values a later
        step or the caller reads)."""
        needed = later_reads(self.steps, self.plan.outputs)
        for si, seg in enumerate(self.steps):
            if not isinstance(seg, Segment):
                continue
            as_input, as_weight = set(), set()
            for pn in seg.nodes:
                rule = OPS.rule_for(pn)
                for i, v in rule.buffers(pn):
                    if i is not None:
                        weight = v.kind in ("param", "constant") and i not in rule.indices
                        (as_weight if weight else as_input).add(v)
            segment_io(seg, lambda v, si=si: needed(si, v),
                       lambda pn: [v for i, v in OPS.rule_for(pn).buffers(pn) if i is not None])
            read = seg.inputs
            seg.inputs = [v for v in read if v in as_input]
            seg.weights = [v for v in read if v in as_weight]

    def _build(self, seg: Segment, scratch: _Scratch) -> None:
        """Builds ``seg``'s ggml graph in a context of exactly the bytes it takes: the nodes are
        built once in scratch contexts, which counts the bytes each ggml call takes and the
        graph's nodes and leafs (and checks every call, :mod:`.guard`), then again in the
        segment's own context of that size, call by call as the first time."""
        ggml = _ggml()
        calls = Calls(ggml)
        weights = {key: len(w.tensors) for key, w in self._weights.items()}
        constants = len(self._constants)
        scratch.reset()
        calls.counting(scratch.next)
        try:
            nodes, leafs = self._graph_shape(seg, calls, self._make(seg, calls, {}, {}))
        finally:  # the scratch tensors are dropped: no weight or constant keeps one
            for key, w in self._weights.items():
                del w.tensors[weights.get(key, 0):]
            del self._constants[constants:]
        size = max(nodes, leafs, 1)  # ggml asserts n_nodes < size before each node it adds: size >= the count
        record = calls.record
        mem = sum(taken for _, taken in record) + int(ggml.ggml_graph_overhead_custom(size, False))
        ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
        if not ctx:
            raise MithrilError(f"GGMLBackend: ggml_init could not allocate a {mem:,}-byte context")
        self._contexts.append(ctx)
        self._ctx = ctx
        calls.replaying(ctx, record)
        results = self._make(seg, calls, seg.leaves, seg.bounds)
        gf = ggml.ggml_new_graph_custom(ctx, size, False)
        # The graph's order is the order the rules made its tensors (each tensor the outputs need,
        # expanded in turn), not ggml's depth-first walk from the outputs, which would schedule a
        # recurrence's input projections for every step before the first step runs: all alive at
        # once (see peak_allocations).
        _, _, needed = graph_size(list(results.values()))
        for t, _ in calls.made:
            if ctypes.addressof(t.contents) in needed:
                ggml.ggml_build_forward_expand(gf, t)
        for v, t in results.items():
            ggml.ggml_set_output(t)
            ggml.ggml_build_forward_expand(gf, t)
            seg.results[v] = t
        if int(ggml.ggml_used_mem(ctx)) != mem or ggml.ggml_graph_n_nodes(gf) != nodes:
            raise MithrilError(f"GGMLBackend: segment {seg.index}'s graph took {ggml.ggml_used_mem(ctx)} bytes and "
                               f"{ggml.ggml_graph_n_nodes(gf)} nodes, counted {mem} and {nodes}: a bug")
        peak, at = peak_allocations(gf)
        if peak > MAX_LIVE_ALLOCATIONS:  # ggml-alloc could run out of free blocks (an assertion)
            calls.node = next((pn for t, pn in calls.made if ctypes.addressof(t.contents) == at), None)
            calls.fail(f"ggml_gallocr_alloc_graph: {peak} intermediates allocated at once (ggml-alloc keeps at "
                       f"most 256 free blocks between them; at most {MAX_LIVE_ALLOCATIONS} here)")
        seg.graph = gf
        seg.allocator = ggml.ggml_gallocr_new(self._buffer_type)
        self._allocators.append(seg.allocator)
        if not ggml.ggml_gallocr_alloc_graph(seg.allocator, gf):
            raise MithrilError(f"GGMLBackend: ggml could not allocate segment {seg.index}'s intermediates")
        seg.buffer_bytes = ggml.ggml_gallocr_get_buffer_size(seg.allocator, 0)
        if self._repack_type is not None:  # before the plan: the repacked matmuls size its work buffer
            self._repack(gf)
        seg.plan = ggml.ggml_graph_plan(gf, self._threads, self._pool)
        seg.work_bytes = int(seg.plan.work_size)
        seg.work = np.empty(max(seg.work_bytes, 1), np.uint8)
        seg.plan.work_data = ctypes.cast(seg.work.ctypes.data, ctypes.POINTER(ctypes.c_uint8))
        # Views of tensors whose pointer changes (inputs per call, parameters when reloaded) are
        # re-pointed before each compute: ggml copies the source's pointer when it makes a view.
        external = {ctypes.addressof(t.contents): t for t, _ in seg.leaves.values()}
        for w in self._weights.values():
            external.update((ctypes.addressof(t.contents), t) for t in w.tensors)
        for i in range(ggml.ggml_graph_n_nodes(gf)):
            t = ggml.ggml_graph_node(gf, i)
            src = t.contents.view_src
            if src and ctypes.addressof(src.contents) in external:
                seg.views.append((t, external[ctypes.addressof(src.contents)], int(t.contents.view_offs)))

    def _make(self, seg: Segment, calls: Calls, leaves: dict, bounds: dict) -> dict:
        """Makes ``seg``'s tensors through ``calls``: its inputs (into ``leaves``: tensor and
        staging array), each node's by its rule, and the outputs (a copy where the value is a
        view or not the segment's own); returns the output tensors by value. Index inputs'
        row bounds go to ``bounds``."""
        ggml = _ggml()
        tensors: dict[PlanValue, Any] = {}
        half = {dtype: name for name, dtype in HALF.items()}
        for v in seg.inputs:
            # Indices as int32; a float16 or bfloat16 input as it is (a Cast converts it); else float32.
            if v.dtype in half:
                dtype, type_ = v.dtype, getattr(ggml, half[v.dtype])
            elif v.dtype in INDEX_DTYPES:
                dtype, type_ = np.dtype(np.int32), ggml.GGML_TYPE_I32
            else:
                dtype, type_ = F32, ggml.GGML_TYPE_F32
            t = calls.ggml_new_tensor_4d(self._ctx, type_, *ne(v.static_shape))
            stage = np.zeros(v.static_shape, dtype)
            t.contents.data = stage.ctypes.data
            ggml.ggml_set_input(t)
            leaves[v] = (t, stage)
            tensors[v] = t

        def in_context(make):  # the program's own tensor makers write to self._ctx
            def made():
                self._ctx = calls.ctx
                return make()
            return made

        def weight(v, layout="plain", matmul=False):
            return calls.around("weight", in_context(lambda: self._weight_tensor(v, layout, matmul)))

        def constant(array):
            return calls.around("constant", in_context(lambda: self._constant_tensor(array)))

        g = Builder(calls, self._ctx, tensors, weight, constant, bounds)
        g.producers = {v: pn for pn in seg.nodes for v in pn.outputs}
        g.f32_in_place = self._f32_in_place
        for pn in seg.nodes:
            calls.node = pn
            rule = OPS.rule_for(pn)
            try:
                out = rule.build(pn, g)
            except MithrilError:
                raise
            except Exception as exc:  # a rule's own mistake: name the node, never crash later in ggml
                ins = [v for v in pn.inputs if v is not None]
                raise NodeError(f"GGMLBackend could not build this node: {type(exc).__name__}: {exc}",
                                node=pn.label, op_type=pn.op_type, opset=pn.opset,
                                shapes=[v.static_shape for v in ins], dtypes=[str(v.dtype) for v in ins]) from exc
            outs = out if isinstance(out, (list, tuple)) else [out]
            for v, t in zip(pn.outputs, outs):
                if not v.name:  # an omitted optional output: nothing reads it
                    continue
                want = ne(v.static_shape)
                got = list(t.contents.ne[:MAX_DIMS])
                if got != want:  # the rule's result has the right elements in another shape
                    if prod(got) != prod(want):
                        calls.fail(f"a {got[::-1]} result for an output of shape {list(v.static_shape)}")
                    t = g.reshape(t, v.static_shape)
                tensors[v] = t
            calls.node = None
        results = {}
        for v in seg.outputs:
            t = tensors[v]
            if t.contents.view_src or v in seg.inputs or v.kind in ("param", "constant"):
                t = calls.ggml_cont(self._ctx, t)  # its own buffer, not a view into one gallocr reuses
            results[v] = t
        return results

    def _graph_shape(self, seg: Segment, calls: Calls, results: dict) -> tuple[int, int]:
        """(nodes, leafs) of ``seg``'s graph as its counting build made it; a graph deeper than
        ggml's recursive visit may go (:data:`.guard.MAX_GRAPH_DEPTH`) is refused at the first
        node whose outputs reach that depth."""
        nodes, leafs, depths = graph_size(list(results.values()))
        if max(depths.values(), default=0) > MAX_GRAPH_DEPTH:
            for t, pn in calls.made:
                deep = depths.get(ctypes.addressof(t.contents), 0)
                if pn is not None and deep > MAX_GRAPH_DEPTH:
                    calls.node = pn
                    calls.fail(f"a graph {deep} tensors deep (ggml_build_forward_expand recurses once per tensor; "
                               f"at most {MAX_GRAPH_DEPTH} here)")
        return nodes, leafs

    def _repack(self, gf) -> None:
        """Moves the quantized matmul weights of graph ``gf`` that ggml's CPU_REPACK or AMX buffer
        takes into it: their bytes are laid out there once (q4_0 and q4_K as 8x8 blocks for the AVX2
        gemm, 1.7x and 4.5x faster than llamafile's kernels; q8_0 as AMX tiles; see
        :data:`REPACKED`). ggml runs the buffer's kernel for every MUL_MAT whose first operand lives
        there, with no check of the other operand, and other ops would read the laid-out bytes as
        plain ones: a tensor moves only when every use is such a matmul that the kernel computes
        (float32 activations, no 4th dim; a 2-D weight of whole 8-row groups, 32-row tiles for AMX,
        see :func:`_repack_refusal`). Whether this CPU has a kernel for the type is read back from
        ggml (the tensor's ``extra`` after allocation); where it has none the tensor stays as it was."""
        ggml = _ggml()
        uses: dict[int, list] = {}
        for i in range(ggml.ggml_graph_n_nodes(gf)):
            node = ggml.ggml_graph_node(gf, i).contents
            for k, src in enumerate(node.src):
                if src:
                    uses.setdefault(ctypes.addressof(src.contents), []).append((node, k))
            if node.view_src:
                uses.setdefault(ctypes.addressof(node.view_src.contents), []).append((node, -1))
        for w in self._weights.values():
            if self._repack_name not in REPACKED.get(w.type_name, ()):  # another buffer's type
                continue
            rows = REPACK_ROWS.get((self._repack_name, w.type_name))
            for t in w.tensors:
                addr = ctypes.addressof(t.contents)
                if t.contents.buffer or _repack_refusal(ggml, t.contents, uses.get(addr, []), rows,
                                                        self._repack_name == b"AMX"):
                    continue
                size = int(ggml.ggml_backend_buft_get_alloc_size(self._repack_type, t))
                buf = ggml.ggml_backend_buft_alloc_buffer(self._repack_type, size)
                if not buf:
                    continue
                data = t.contents.data
                t.contents.data = None  # ggml_backend_tensor_alloc asserts an unplaced tensor
                with _ggml_log_muted():
                    ggml.ggml_backend_tensor_alloc(buf, t, ggml.ggml_backend_buffer_get_base(buf))
                if not t.contents.extra:  # no repacked kernel for this type or shape on this CPU
                    t.contents.buffer = None
                    t.contents.data = data
                    ggml.ggml_backend_buffer_free(buf)
                    continue
                self._repack_buffers.append(buf)
                w.repacked.append((t, buf, size))
                if w.buffer is not None:
                    with _ggml_log_muted():  # ggml logs each repacked tensor
                        ggml.ggml_backend_tensor_set(t, w.buffer.ctypes.data, 0, w.buffer.nbytes)

    def _drop_unread_weights(self) -> None:
        """Forgets weights no graph reads (a Transpose whose matmul reads the weight directly)."""
        ggml = _ggml()
        read: set[int] = set()
        for seg in self.segments:
            for i in range(ggml.ggml_graph_n_nodes(seg.graph)):
                node = ggml.ggml_graph_node(seg.graph, i).contents
                for src in list(node.src) + [node.view_src]:
                    if src:
                        read.add(ctypes.addressof(src.contents))
        for key, w in list(self._weights.items()):
            if not any(ctypes.addressof(t.contents) in read for t in w.tensors):
                del self._weights[key]

    def _new_tensor(self, shape, type_):
        ggml = _ggml()
        return ggml.ggml_new_tensor_4d(self._ctx, type_, *ne(shape))

    def _constant_tensor(self, array: np.ndarray):
        ggml = _ggml()
        type_ = ggml.GGML_TYPE_I32 if array.dtype == np.int32 else ggml.GGML_TYPE_F32
        t = self._new_tensor(array.shape if array.ndim else (1,), type_)
        self._constants.append(array)
        t.contents.data = array.ctypes.data
        return t

    def _weight_tensor(self, v: PlanValue, layout: str, matmul: bool = False):
        key = (v, layout, matmul)
        w = self._weights.get(key)
        if w is None:
            w = self._weights[key] = _Weight(v, layout, self.format.type_for(v, layout, v.static_shape, matmul))
            # A constant is converted now; a parameter when evaluate first passes its array.
            self._load(w, v.value if v.kind == "constant" else None)
        ggml = _ggml()
        t = ggml.ggml_new_tensor_4d(self._ctx, self.format.ggml_type(w.type_name), *ne(w.shape))
        t.contents.data = w.buffer.ctypes.data
        w.tensors.append(t)
        return t

    def _load(self, w: _Weight, array) -> None:
        """(Re)makes ``w``'s buffer from ``array`` and points its tensors at it. A
        :class:`~.quantize.QuantizedTensor` of ``w``'s type and layout lends its bytes as they are;
        another is dequantized and converted. A float32 array ggml reads as it is (no transpose
        or padding) is the buffer itself: a memory-mapped weight (ONNX external data) stays in
        the file's pages. A converted copy (transposed, half precision, quantized) replaces the
        original: the pages of a memory-mapped one are handed back once it is made, so each
        weight is resident once. A weight stored in a type other than float32 gets its report
        row (bytes, error against the float32 values), measured as it is converted."""
        from ..host_memory import release_mapped_pages
        from .quantize import QuantizedTensor, QuantizedWeight

        shape = w.value.static_shape
        if isinstance(array, QuantizedTensor) and (array.type_name, array.layout) == (w.type_name, w.layout) \
                and array.shape == tuple(shape):
            w.buffer, w.shape = array.data, array.stored_shape
            w.report = QuantizedWeight(w.value.name, w.type_name, w.layout, array.shape, int(array.data.nbytes),
                                       4 * prod(array.shape), None, None)
        else:
            dense = array.dequantize() if isinstance(array, QuantizedTensor) else array
            w.buffer, w.shape, w.report = self.format.convert_measured(w.value.name, dense, w.layout, w.type_name,
                                                                       shape)
            if isinstance(dense, np.ndarray) and not np.may_share_memory(w.buffer, dense):
                release_mapped_pages(dense)
        w.source, w.origin = None, _origin(array)
        if array is not None:
            try:
                w.source = weakref.ref(array)
            except TypeError:
                w.source = lambda: None
        repacked = {ctypes.addressof(t.contents) for t, _, _ in w.repacked}
        for t in w.tensors:
            if ctypes.addressof(t.contents) in repacked:
                with _ggml_log_muted():  # ggml logs each repacked tensor
                    _ggml().ggml_backend_tensor_set(t, w.buffer.ctypes.data, 0, w.buffer.nbytes)
            else:
                t.contents.data = w.buffer.ctypes.data
        if array is not None and repacked and len(repacked) == len(w.tensors):
            w.buffer = None  # every reader has its repacked copy

    def weight_buffer(self, w: _Weight) -> np.ndarray:
        """The bytes of ``w`` in its type and layout (the plain, not the repacked, form): its
        buffer, or, when every reader has a repacked copy and the buffer was dropped, made again
        from the array it was loaded from (what ``save_gguf`` writes)."""
        if w.buffer is not None:
            return w.buffer
        array = w.source() if w.source is not None else None
        if array is None:
            raise MithrilError(f"GGMLBackend: the array parameter {w.value.name!r} was loaded from is gone (ggml "
                               "keeps only its repacked copy); pass the parameters again")
        if isinstance(array, QuantizedTensor) and (array.type_name, array.layout) == (w.type_name, w.layout):
            return array.data
        dense = array.dequantize() if isinstance(array, QuantizedTensor) else array
        return self.format.convert(dense, w.layout, w.type_name, w.value.static_shape)[0]

    def quantization_report(self):
        """Each weight stored in a type other than float32 (quantized, or f16/bf16): its type,
        shape, bytes and error against the float32 values (relative RMS, largest absolute), and
        the matrices kept float with why. Rows come when the parameters are loaded (the first
        ``evaluate``, or a new array); ``str()`` of the report is a table.

        >>> import numpy as np, mithril as ml, models_zoo
        >>> pm = ml.compile(models_zoo.mlp(), ml.GGMLBackend(quantize="q8_0"), shapes={"input": [1, 16]},
        ...                 static_shapes=True, inference=True)
        >>> _ = pm.evaluate(pm.randomize_params(), {"input": np.ones((1, 16), np.float32)})
        >>> report = pm.program.quantization_report()
        >>> sorted({row.type_name for row in report}), all(row.rel_rms < 0.01 for row in report)
        (['q8_0'], True)
        """
        from .quantize import QuantizationReport

        rows = [w.report for w in self._weights.values() if w.report is not None]
        kept = list(dict.fromkeys(self.format.kept_float))
        return QuantizationReport(rows, kept)

    # ---- running --------------------------------------------------------------------------
    def total_bytes(self) -> int:
        return self.weight_bytes() + sum(s.buffer_bytes + s.work_bytes for s in self.segments)

    def weight_bytes(self) -> int:
        return sum(_stored_bytes(w) for w in self._weights.values())

    def weights_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self._weights.values():
            out[w.type_name] = out.get(w.type_name, 0) + _stored_bytes(w)
        return out

    def _report_line(self) -> str:
        types = ", ".join(f"{k} {v:,}" for k, v in sorted(self.weights_by_type().items()))
        return (f"weights {self.weight_bytes():,} [{types}], intermediates "
                f"{sum(s.buffer_bytes for s in self.segments):,}, work {sum(s.work_bytes for s in self.segments):,}")

    def memory_bytes(self) -> dict:
        return {"arena_bytes": sum(s.buffer_bytes for s in self.segments),
                "work_bytes": sum(s.work_bytes for s in self.segments),
                "weight_bytes": self.weight_bytes(), "weights_by_dtype": self.weights_by_type(),
                "total_bytes": self.total_bytes()}

    def bind(self, params: dict, data: dict) -> dict:
        """The run's environment, and the weights ggml reads re-read where ``params`` holds new arrays."""
        env: dict = {}
        dense = self._dense_params

        def param(v):  # a QuantizedTensor stays one unless a NumPy step reads it
            value = params[v.name]
            return value.dequantize() if v in dense and isinstance(value, QuantizedTensor) else value

        for v in self.plan.inputs:
            env[v] = param(v) if v.kind == "param" else data[v.name]
        for v in self.plan.params:
            if v not in env:
                env[v] = param(v)
        self._refresh_weights(params)
        return env

    def _refresh_weights(self, params: dict, keep_loaded: bool = False) -> None:
        """Re-reads a parameter whose array is not the one its buffer was made from (nor another
        view of the same memory, whose owner is alive: see :attr:`_Weight.origin`); with
        ``keep_loaded``, only those not loaded yet (a weight from other memory stays as it is)."""
        for w in self._weights.values():
            if w.value.kind != "param":
                continue
            array = params.get(w.value.name)
            if array is None:
                if w.source is None:
                    raise MithrilError(f"GGMLBackend: parameter {w.value.name!r} was not given")
                continue
            if w.source is not None and w.source() is array:
                continue
            if w.origin is not None and _same_memory(w.origin, array):
                if w.source() is None:  # a live view to make the plain bytes from (weight_buffer)
                    w.source = weakref.ref(array)
                continue
            if keep_loaded and w.source is not None:
                continue
            self._check(w.value, array)
            self._load(w, array)

    @property
    def _dense_params(self) -> set:
        """Parameters NumPy steps, segment inputs or the outputs read as arrays (a
        QuantizedTensor given for one of them is dequantized for those readers)."""
        found = self.__dict__.get("_dense_params_found")
        if found is None:
            found = {v for v in self.plan.outputs if v.kind == "param"}
            for step in self.steps:
                found.update(v for v in step.inputs if v is not None and v.kind == "param")
            self.__dict__["_dense_params_found"] = found
        return found

    def _check(self, v: PlanValue, arr) -> np.ndarray:
        shape = v.static_shape
        if isinstance(arr, QuantizedTensor) and arr.shape == tuple(shape) and v.dtype == F32:
            return arr
        if isinstance(arr, np.generic):
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray) or tuple(arr.shape) != tuple(shape) or arr.dtype != v.dtype:
            got = f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}"
            raise MithrilError(f"GGMLBackend: {v.name!r} must be a {v.dtype} array of shape {tuple(shape)} "
                               f"(the shape it was compiled for), got {got}")
        return arr

    @property
    def adaptive_threads(self) -> bool:
        """Whether calls move to one thread while other processes hold the CPUs: where ggml's
        OpenMP threads spin at barriers (docs/backends.md, threads on a busy machine)."""
        return self._governor.enabled

    def run(self, params: dict, data: dict, *, hook=None) -> dict:
        """The segmented run loop, every ggml graph on the threads the governor picks for the call."""
        threads = self._governor.begin()
        if threads != self._running_threads:
            for seg in self.segments:  # a plan made for more threads has work memory for fewer
                seg.plan.n_threads = threads
            self._running_threads = threads
        started = time.perf_counter()
        out = super().run(params, data, hook=hook)
        self._governor.end(time.perf_counter() - started)
        return out

    def run_segment(self, seg: Segment, env: dict) -> None:
        """Points the graph's input tensors at the inputs' buffers, computes, copies the outputs out."""
        ggml = _ggml()
        keep = []
        for v, (t, stage) in seg.leaves.items():
            arr = v.value if v.kind == "constant" else env[v]
            if isinstance(arr, np.ndarray) and arr.shape != v.static_shape and arr.size == stage.size == 1:
                arr = arr.reshape(v.static_shape)  # a scalar given as [1] (or the reverse): same bytes
            arr = self._check(v, arr)
            if v in seg.bounds:  # row indices: negatives wrapped, the range checked, int32 for ggml
                rows, pn = seg.bounds[v]
                wrapped = np.where(arr < 0, arr + rows, arr)
                if wrapped.size and (wrapped.min() < 0 or wrapped.max() >= rows):
                    bad = arr.reshape(-1)[np.argmax((wrapped < 0) | (wrapped >= rows))]
                    raise NodeError(f"GGMLBackend: index {int(bad)} of {v.name!r} is out of range for {rows} rows",
                                    node=pn.label, op_type=pn.op_type, opset=pn.opset,
                                    shapes=[x.static_shape for x in pn.inputs if x is not None],
                                    dtypes=[str(x.dtype) for x in pn.inputs if x is not None])
                np.copyto(stage, wrapped, casting="unsafe")
                ptr = stage.ctypes.data
            elif arr.flags.c_contiguous and arr.dtype == stage.dtype:
                ptr = arr.ctypes.data  # the caller's buffer, read in place
                keep.append(arr)
            else:  # a strided view, or a bool as float32 0/1
                np.copyto(stage, arr, casting="same_kind")
                ptr = stage.ctypes.data
            t.contents.data = ptr
        for view, src, offset in seg.views:
            view.contents.data = src.contents.data + offset
        status = ggml.ggml_graph_compute(seg.graph, ctypes.byref(seg.plan))
        if status != 0:
            raise MithrilError(f"GGMLBackend: ggml_graph_compute returned status {status} "
                               f"in segment {seg.index}")
        for v, t in seg.results.items():
            n = prod(v.static_shape)
            dtype = self._result_types.get(int(t.contents.type), F32)
            raw = (ctypes.c_uint8 * (n * dtype.itemsize)).from_address(t.contents.data)
            out = np.frombuffer(raw, dtype=dtype, count=n).reshape(v.static_shape)
            # A bool back from float32 0/1; an integer from its exact float32 (or int32) value.
            env[v] = out != 0 if v.dtype == BOOL else out.astype(v.dtype)
        del keep


def _origin(array) -> tuple | None:
    """What :attr:`_Weight.origin` records of ``array``: None unless it is a NumPy array whose
    owner is read-only (the model's own weights, get_parameters()' views, a memory map), whose
    bytes cannot have changed since."""
    if not isinstance(array, np.ndarray):
        return None
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if owner.flags.writeable:
        return None
    return (weakref.ref(owner), array.__array_interface__["data"][0], array.shape, array.strides, array.dtype.str)


def _same_memory(origin: tuple, array) -> bool:
    """Whether ``array`` views the memory ``origin`` was recorded from, as it was (its owner alive)."""
    if origin[0]() is None:
        return False
    other = _origin(array)
    return other is not None and other[1:] == origin[1:]


def _default_threads() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _stored_bytes(w: _Weight) -> int:
    """Bytes ``w`` holds: its buffer (unless every reader has a repacked copy) and the copies."""
    return (int(w.buffer.nbytes) if w.buffer is not None else 0) + sum(size for _, _, size in w.repacked)


# Quantized types whose matmul weights go to one of ggml's extra CPU buffers, which lay them out once
# for a faster kernel, in order of preference where this CPU has one: q4_0 and q4_K to CPU_REPACK
# (x86 with AVX2: 8x8 interleaved blocks), q8_0 to AMX (Intel AMX-INT8 tiles) or else CPU_REPACK
# (x86 with AVX2: 4 rows interleaved by 8 bytes, scripts/patches/ggml-q8_0-x86-repack.patch). On a
# 128x512x2048 matmul, one Sapphire Rapids thread: q4_0 3.2 ms repacked vs 5.7 on llamafile's
# kernel, q4_K 2.1 vs 9.2, float32 3.9; BERT-Small's forward at q8_0 went from 1.2x slower than
# float32 to 1.9x faster with AMX.
REPACKED = {"q4_0": (b"CPU_REPACK",), "q4_K": (b"CPU_REPACK",), "q8_0": (b"AMX", b"CPU_REPACK")}
# Weight rows a repacked kernel takes at a time (a 2-D weight of whole groups moves).
REPACK_ROWS = {(b"AMX", "q8_0"): 32, (b"CPU_REPACK", "q8_0"): 4}


def _repack_buffer_type(quantize: str):
    """(name, buffer type): the first ggml extra buffer type (one of the CPU device's) of
    :data:`REPACKED`'s choices for ``quantize`` that this CPU and ggml build have (AMX only where
    :func:`amx_works` says yes), or None."""
    ggml = _ggml()
    reg = ggml.ggml_backend_cpu_reg()
    dev = ggml.ggml_backend_reg_dev_get(reg, 0) if reg else None
    addr = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if dev else None
    if not addr:
        return None
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)(dev)
    found, i = {}, 0
    while bufts and bufts[i]:
        found.setdefault(ggml.ggml_backend_buft_name(bufts[i]), bufts[i])
        i += 1
    for name in REPACKED[quantize]:
        if name in found and (name != b"AMX" or amx_works()):
            return name, found[name]
    return None


_AMX: list[bool] = []  # amx_works' answer, once per process


def amx_works() -> bool:
    """Whether ggml's AMX matmul runs in this ggml build on this machine. ggml-python 0.0.45 as
    published loads an empty tile configuration (GCC 12 drops the stores to it) and the first AMX
    instruction dies with SIGILL, taking the process with it; scripts/dev.sh builds it patched
    (scripts/patches/ggml-amx-tilecfg.patch). So a child process runs one q8_0 matmul from the AMX
    buffer first, and a fault there is a "no". The answer is kept on disk per ggml library file.
    ``MITHRIL_GGML_AMX=0`` turns AMX off, ``=1`` on without asking."""
    setting = os.environ.get("MITHRIL_GGML_AMX", "").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    if setting in ("1", "on", "true", "yes"):
        return True
    if not _AMX:
        _AMX.append(_probe_amx())
    return _AMX[0]


def _probe_amx() -> bool:
    import hashlib
    import json
    import subprocess
    import sys

    from ..c.build import cache_dir

    lib = Path(_ggml().__file__).parent / "lib"
    files = sorted(lib.glob("libggml*"))
    stamp = repr([(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files])
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    record = cache_dir().parent / "ggml" / f"amx-{key}.json"
    try:
        return bool(json.loads(record.read_text())["works"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        done = subprocess.run([sys.executable, "-c", _AMX_PROBE], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "MITHRIL_GGML_AMX": "1"})
        works = done.returncode == 0 and done.stdout.strip().endswith("amx ok")
    except (OSError, subprocess.SubprocessError):
        return False  # not known, not recorded
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"works": works, "ggml": [str(f) for f in files]}))
    except OSError:
        pass
    return works


# One q8_0 matmul from the AMX buffer (8 rows: ggml's tile path, not its one-row VNNI one), checked
# against NumPy; "amx ok" when it ran there and agrees.
_AMX_PROBE = """
import numpy as np, onnx
from onnx import helper, numpy_helper
import mithril as ml
w = (np.arange(64 * 64, dtype=np.float32).reshape(64, 64) % 7 - 3) / 4
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "amx",
                      [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 64])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 64])],
                      [numpy_helper.from_array(w, "w")])
pm = ml.compile(ml.load_onnx(helper.make_model(g)), ml.GGMLBackend(quantize="q8_0", fallback=None))
x = (np.arange(8 * 64, dtype=np.float32).reshape(8, 64) % 5 - 2) / 2
y = pm.evaluate(pm.get_parameters(), {"x": x})["y"]
used = any(w.repacked for w in pm.program._weights.values())
print("amx ok" if used and np.allclose(y, x @ w, rtol=1e-2, atol=1e-1) else "amx not used or wrong")
"""


_MUTED: list = []  # the ggml log callback that drops messages, made once and kept alive


@contextmanager
def _ggml_log_muted():
    """ggml's log silenced (its CPU_REPACK buffer logs every tensor it repacks), then restored."""
    ggml = _ggml()
    if not _MUTED:
        _MUTED.append(ggml.ggml_log_callback(lambda level, text, data: None))
    callback, data = ggml.ggml_log_callback(), ctypes.c_void_p()
    ggml.ggml_log_get(ctypes.byref(callback), ctypes.byref(data))
    ggml.ggml_log_set(_MUTED[0], None)
    try:
        yield
    finally:
        ggml.ggml_log_set(callback, data)


def _repack_refusal(ggml, t, uses, rows: int | None = None, amx: bool = False) -> str | None:
    """Why weight tensor ``t`` (read by ``uses``: (node, source index), -1 for a view) may not
    move to the CPU_REPACK buffer (``amx``: the AMX one), whose kernel takes ``rows`` weight rows
    at a time (default 8; AMX's 32); None when it may. ggml runs the buffer's kernel for every
    MUL_MAT whose weight lives there without asking whether it can: what that kernel asserts on
    or cannot compute is refused here (an abort takes the process). AMX's (ggml's own test, which
    it does not apply at compute time): whole 32-row and 32-value tiles, both operands contiguous."""
    if not uses:
        return "read by no node"
    rows = rows or (32 if amx else 8)
    if t.ne[2] != 1 or t.ne[3] != 1 or t.ne[1] % rows or t.ne[0] % 32:
        return f"shape {list(t.ne)} (a matrix of whole {rows}-row groups and 32-value blocks)"
    for node, k in uses:
        if node.op != ggml.GGML_OP_MUL_MAT or k != 0:
            return "read by an op other than as a matmul's weight"
        x = node.src[1].contents
        if x.type != ggml.GGML_TYPE_F32 or x.ne[3] != 1 or node.ne[3] != 1:
            return "its matmul's activation is not float32 of at most 3 dims"
        if amx and not ggml.ggml_is_contiguous(node.src[1]):
            return "its matmul's activation is not contiguous"
    return None


def _free(contexts, cpu, pool, allocators, buffers=()) -> None:
    ggml = _ggml()
    for a in allocators:
        ggml.ggml_gallocr_free(a)
    for b in buffers:
        ggml.ggml_backend_buffer_free(b)
    ggml.ggml_threadpool_free(pool)
    ggml.ggml_backend_free(cpu)
    for ctx in contexts:
        ggml.ggml_free(ctx)


class _Scratch:
    """The ggml contexts a segment is first built in, to count what it makes (tensor headers
    only: no_alloc): :meth:`next` hands out one after another, made as needed and kept for the
    next segment (:meth:`reset`); all freed at the end."""

    OBJECTS = 4096  # tensor headers per context

    def __init__(self):
        self.contexts: list = []
        self.used = 0

    def reset(self) -> None:
        self.used = 0

    def next(self):
        ggml = _ggml()
        if self.used == len(self.contexts):
            mem = self.OBJECTS * int(ggml.ggml_tensor_overhead())
            ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
            if not ctx:
                raise MithrilError(f"GGMLBackend: ggml_init could not allocate a {mem:,}-byte context")
            self.contexts.append(ctx)
        ctx = self.contexts[self.used]
        ggml.ggml_reset(ctx)
        self.used += 1
        return ctx

    def __enter__(self) -> _Scratch:
        return self

    def __exit__(self, *exc) -> None:
        for ctx in self.contexts:
            _ggml().ggml_free(ctx)
        self.contexts = []


__all__ = ["DeferredGGMLProgram", "GGMLFallbackWarning", "GGMLKernelMissingError", "GGMLMemoryError", "GGMLProgram",
           "Segment", "pending_values", "why_not_ggml"]
