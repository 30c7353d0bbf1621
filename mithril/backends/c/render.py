"""The C renderer: a lowering plan as one C translation unit, partitioned into C segments.

:func:`render` walks the plan once. Each node that has a C kernel (``mithril/backends/c/lib``)
for the program's element type, with every float value's shape known, joins the current C
segment; any other node ends it and runs on NumPy (the shared kernels). A segment becomes one
function ``int seg<k>(void *const *io, char *arena)``: ``io`` holds the segment's inputs and
outputs (NumPy buffers, passed without copying), ``arena`` the intermediates, at offsets
planned from the values' lifetimes (a buffer is reused once its last reader has run).

The source holds only the calls, the shapes as constants and the arena layout; the kernels are
``static inline`` functions of the kernel library ``lib/`` (one header per op family, included
by ``lib/mithril_kernels.h``); :mod:`.ops` says, per op, when a node can run in C and what it calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import prod

import numpy as np

from ..passes import ConvChain, FuseConvChains, PassManager
from ..plan import Plan, PlanNode, PlanValue, reads_of
from .ops import C_TYPES, CLAMP, FUSES_ACTIVATION, KERNELS, RESIDUAL, CKernel, Emitter
from .ops import autodiff, elementwise, movement, nn  # noqa: F401 - the families register their rules
from .ops.nn import fuses_residual
from . import nchwc  # noqa: E402 - after the op families: it registers its kernels beside them

ALIGN = 64  # bytes: arena offsets start on a cache line


@dataclass
class Segment:
    """A run of nodes rendered as the C function ``seg<index>``: ``io`` lists the values passed
    from Python (inputs first, then ``outputs``, which Python allocates)."""

    index: int
    nodes: list[PlanNode]
    inputs: list[PlanValue] = field(default_factory=list)
    outputs: list[PlanValue] = field(default_factory=list)


@dataclass
class CSource:
    """What :func:`render` returns: the C source, the steps (a Segment, or a PlanNode NumPy runs),
    the arena size in bytes and the nodes left to NumPy."""

    source: str
    steps: list
    arena_bytes: int
    fallback: list[PlanNode]
    naive_bytes: int = 0
    # A segment's nonzero return k means failures[k - 1]: the node and what went wrong.
    failures: list[tuple[PlanNode, str]] = field(default_factory=list)


def kernel_of(pn: PlanNode) -> CKernel | None:
    return KERNELS.get((pn.domain, pn.op_type))


def _tensor_inputs(pn: PlanNode) -> list[PlanValue]:
    """The inputs a C kernel reads as buffers (folded ones, like Reshape's shape, are read at
    render time into the generated constants)."""
    rule = kernel_of(pn)
    skip = set(rule.folded) if rule is not None else set()
    return [v for i, v in enumerate(pn.inputs) if v is not None and i not in skip]


def why_not_c(pn: PlanNode, dtype=None) -> str | None:
    """Why ``pn`` cannot run in C; None when it can. ``dtype`` is accepted for callers that
    pass the program's element type; values carry their own."""
    rule = kernel_of(pn)
    if rule is None or pn.subgraphs:
        return "no C kernel"
    for i in rule.folded:
        if i < len(pn.inputs) and pn.inputs[i] is not None and pn.inputs[i].kind != "constant":
            return f"input {i} ({pn.inputs[i].name!r}) given at run time"
    for v in _tensor_inputs(pn) + list(pn.outputs):
        if v.dtype not in C_TYPES:
            return f"dtype {v.dtype} of {v.name!r} (C has {', '.join(str(d) for d in C_TYPES)})"
        if v.static_shape is None:
            return f"shape of {v.name!r} not fixed"
        if v.kind == "constant" and tuple(np.shape(v.value)) != v.static_shape:
            return f"constant {v.name!r} holds shape {np.shape(v.value)}, typed {v.static_shape}"
    if rule.dtypes is not None and pn.inputs and pn.inputs[0] is not None and pn.inputs[0].dtype not in rule.dtypes:
        return f"dtype {pn.inputs[0].dtype} (the C kernel has {', '.join(sorted(map(str, rule.dtypes)))})"
    return rule.check(pn) if rule.check is not None else None


class _Renderer:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.lines: list[str] = []
        self.consts = 0
        # What each nonzero return of a segment means: (node label, op type, problem), 1-based.
        self.problems: list[str] = []
        self.failures: list[tuple[PlanNode, str]] = []
        self.slots = {id(pn): i for i, pn in enumerate(plan.nodes)}

    def arr(self, values, ctype="mt_i") -> str:
        """A static const array of ``values`` in the generated file; its name."""
        self.consts += 1
        name = f"k{self.consts}"
        values = [int(v) for v in values] or [0]  # C has no empty arrays
        self.lines.append(f"    static const {ctype} {name}[] = {{{', '.join(map(str, values))}}};")
        return name

    def node(self, pn: PlanNode, buf, scratch: str | None) -> None:
        self.lines.append(f"    /* {pn.label} ({pn.op_type}) */")
        # Built with MT_PROFILE (MITHRIL_C_PROFILE=1), each node's seconds add up in mt_prof[].
        slot = self.slots.get(id(pn), len(self.plan.nodes))  # gradient nodes share the last slot
        self.lines.append(f"    MT_PROF_BEGIN({len(self.lines)});")
        mark = len(self.lines) - 1
        before = len(self.problems)
        kernel_of(pn).emit(pn, Emitter(self, buf, scratch))
        self.lines.append(f"    MT_PROF_END({mark}, {slot});")
        self.failures += [(pn, p) for p in self.problems[before:]]


def preamble(plan: Plan, title: str, headers: tuple[str, ...] = ("mithril_kernels.h",)) -> list[str]:
    """The generated file's first lines: what it is, the kernel headers, ``mt_set_threads`` and the
    profile hooks."""
    return [f"/* Generated by Mithril's C backend: {title}. */", *(f'#include "{h}"' for h in headers), "",
            "#ifdef _OPENMP", "#include <omp.h>", "void mt_set_threads(int n) { omp_set_num_threads(n); }",
            "#else", "void mt_set_threads(int n) { (void)n; }", "#endif", "", *profile_preamble(plan)]


@dataclass
class SegmentLayout:
    """Where a segment's values live: ``buf(v)`` is the C expression of value ``v``'s buffer (an
    ``io`` slot or an arena offset), ``scratch[j]`` the arena offset of node ``j``'s scratch."""

    buf: Callable[[PlanValue], str]
    scratch: dict[int, int]
    arena_bytes: int
    naive_bytes: int


def layout_segment(step: Segment, later_reads: Callable[[PlanValue], bool], reads, writes, scratch_of,
                   alias=lambda node: False) -> SegmentLayout:
    """Fills ``step.inputs`` (values read before this segment writes them) and ``step.outputs``
    (values written here that ``later_reads`` says are needed after it), then plans the arena:
    every other written value and each node's scratch get first-fit offsets from their lifetimes.
    ``reads(node)``/``writes(node)`` list a node's buffers, ``scratch_of(node)`` its scratch bytes,
    ``alias(node)`` whether its output is its first input's bytes (a view sharing the storage)."""
    produced = {w for node in step.nodes for w in writes(node)}
    seen: set[PlanValue] = set()
    for node in step.nodes:
        for v in reads(node):
            if v not in produced and v not in seen:
                seen.add(v)
                step.inputs.append(v)
    step.outputs.extend(w for node in step.nodes for w in writes(node) if later_reads(w))
    io = {v: f"(({C_TYPES[v.dtype][0]} *)io[{i}])" for i, v in enumerate(step.inputs + step.outputs)}
    # Views of intermediates share their input's buffer; each storage's life spans its aliases'.
    root: dict[PlanValue, PlanValue] = {}
    for node in step.nodes:
        if alias(node):
            o, src = writes(node)[0], reads(node)[0]
            if o not in io and src not in step.outputs:
                root[o] = root.get(src, src)
    life: dict[object, list[int]] = {}
    sizes: dict[object, int] = {}
    for j, node in enumerate(step.nodes):
        for v in reads(node):
            key = root.get(v, v)
            if key in life:
                life[key][1] = j
        for w in writes(node):
            key = root.get(w, w)
            if key not in io and key not in life:
                life[key] = [j, j]
                sizes[key] = prod(w.static_shape) * w.dtype.itemsize
        if scratch_of(node):
            life[("scratch", j)] = [j, j]
            sizes[("scratch", j)] = scratch_of(node)
    offsets, size = _plan_arena([(key, sizes[key], f, l) for key, (f, l) in life.items()])

    def buf(v):
        key = root.get(v, v)
        if v in io or key in io:
            return io[v if v in io else key]
        return f"(({C_TYPES[v.dtype][0]} *)(arena + {offsets[key]}))"

    scratch = {key[1]: off for key, off in offsets.items() if isinstance(key, tuple) and key[0] == "scratch"}
    return SegmentLayout(buf, scratch, size, sum(sizes.values()))


def profile_preamble(plan: Plan) -> list[str]:
    """Lines that, built with ``MT_PROFILE`` (``MITHRIL_C_PROFILE=1``), add each plan node's seconds
    into ``mt_prof[i]`` (``double *mt_profile(void)``; the last slot holds nodes outside the plan,
    such as gradient rules); without it the timing macros are empty (lib/mt_base.h)."""
    return ["#ifdef MT_PROFILE", "#include <time.h>",
            f"static double mt_prof[{len(plan.nodes) + 1}];",
            "double *mt_profile(void) { return mt_prof; }",
            "static double mt_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); "
            "return t.tv_sec + 1e-9 * t.tv_nsec; }",
            "#define MT_PROF_BEGIN(i) double mt_t##i = mt_now()",
            "#define MT_PROF_END(i, slot) mt_prof[slot] += mt_now() - mt_t##i", "#endif", ""]


def _scratch_bytes(pn: PlanNode) -> int:
    rule = kernel_of(pn)
    return rule.scratch(pn) if rule is not None and rule.scratch is not None else 0


def _plan_arena(items: list[tuple[object, int, int, int]]) -> tuple[dict, int]:
    """First-fit offsets for (key, bytes, first step, last step): two items share bytes only
    when their step ranges do not overlap. Returns key -> offset and the arena size."""
    placed: list[tuple[int, int, int, int]] = []  # offset, size, first, last
    offsets, top = {}, 0
    for key, size, first, last in sorted(items, key=lambda t: -t[1]):
        size = -(-size // ALIGN) * ALIGN
        busy = sorted((o, o + s) for o, s, f, l in placed if not (l < first or f > last))
        at = 0
        for lo, hi in busy:
            if at + size <= lo:
                break
            at = max(at, hi)
        placed.append((at, size, first, last))
        offsets[key] = at
        top = max(top, at + size)
    return offsets, top


def _clamp_bounds(pn: PlanNode) -> tuple[float, float] | None:
    """(lo, hi) when ``pn`` is a Relu, or a Clip whose bounds are known at compile."""
    if pn.op_type == "Relu" and pn.domain == "":
        return 0.0, float("inf")
    if pn.op_type != "Clip" or pn.domain != "":
        return None
    if pn.opset < 11:
        return float(pn.kwargs.get("min", -np.inf)), float(pn.kwargs.get("max", np.inf))
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        v = pn.inputs[i] if len(pn.inputs) > i else None
        if v is None:
            bounds.append(float(default))
        elif v.kind == "constant" and np.size(v.value) == 1:
            bounds.append(float(np.asarray(v.value).reshape(())))
        else:
            return None
    lo, hi = bounds
    return (hi if lo > hi else lo), hi  # Clip's rule: a > b gives b


class FuseConvEpilogues(FuseConvChains):
    """What a Conv's kernel can apply as it stores, folded into that Conv (the shared matcher of
    :mod:`mithril.backends.passes.conv`): an Add whose other operand exists when the Conv runs
    (``kwargs[RESIDUAL]``, that operand the Conv's fourth input), then a Relu or constant-bound Clip
    (``kwargs[CLAMP]``). The fused node runs where the Conv ran."""

    name = "c-fuse-conv-epilogues"
    at_conv = True

    def takes_conv(self, index, conv):
        return (conv.domain, conv.op_type) in FUSES_ACTIVATION and CLAMP not in conv.kwargs and why_not_c(conv) is None

    def takes_residual(self, index, conv, add, residual):
        y = add.outputs[0]
        made = index.producer(residual)
        return (RESIDUAL not in conv.kwargs and fuses_residual(conv) and why_not_c(add) is None
                and y.static_shape == residual.static_shape and y.dtype == residual.dtype
                # the residual must exist when the Conv runs, not only when the Add did
                and (made is None or index.position(made) < index.position(conv)))

    def takes_activation(self, index, act, chain):
        if _clamp_bounds(act) is None or act.inputs[0].dtype != act.outputs[0].dtype or why_not_c(act) is not None:
            return False
        return chain.add is None or why_not_c(self._node(chain)) is None

    def make(self, index, chain):
        return self._node(chain)

    @staticmethod
    def _node(chain: ConvChain) -> PlanNode:
        conv, inputs, kwargs = chain.conv, chain.conv.inputs, dict(chain.conv.kwargs)
        if chain.add is not None:
            inputs = (*inputs, *(None,) * (3 - len(inputs)), chain.residual)
            kwargs[RESIDUAL] = True
        if chain.act is not None:
            kwargs[CLAMP] = _clamp_bounds(chain.act)
        return replace(conv, inputs=inputs, outputs=chain.last.outputs, kwargs=kwargs)


def fuse(plan: Plan) -> tuple[list[PlanNode], dict[int, PlanNode]]:
    """The plan's nodes after :class:`FuseConvEpilogues`, and by id of each fused node the plan
    node it replaces (profile slots)."""
    result = PassManager([FuseConvEpilogues()])(plan)
    return list(result.plan.nodes), result.origins


def render(plan: Plan, dtype=None, blocked_layout: bool | None = None, pack_params: bool = False) -> CSource:
    """The plan as C source and the steps that run it (see the module docstring). Each value
    has its own element type; ``dtype`` is accepted for callers that pass the program's.
    ``blocked_layout`` (default: unless ``MITHRIL_C_NCHWC=0``) runs chains of 1x1 and depthwise
    convolutions with constant weights in NCHWc (:mod:`.nchwc`); ``pack_params`` takes
    parameters as fixed weights too (an export)."""
    if blocked_layout is None:
        blocked_layout = nchwc.enabled()
    r = _Renderer(plan)
    steps: list = []
    fallback: list[PlanNode] = []
    nodes, fused = fuse(plan)
    r.slots.update({new: r.slots[id(old)] for new, old in fused.items()})
    for pn in nodes:
        if why_not_c(pn) is None:
            if not steps or not isinstance(steps[-1], Segment):
                steps.append(Segment(len([s for s in steps if isinstance(s, Segment)]), []))
            steps[-1].nodes.append(pn)
        else:
            steps.append(pn)
            fallback.append(pn)

    # Who reads each value, by step.
    readers: dict[PlanValue, list[int]] = {}
    for i, step in enumerate(steps):
        for pn in step.nodes if isinstance(step, Segment) else [step]:
            for v in reads_of(pn):
                readers.setdefault(v, []).append(i)
    plan_outputs = set(plan.outputs)
    if blocked_layout:  # chains of 1x1 and depthwise convolutions in NCHWc (nchwc.py)
        for si, step in enumerate(steps):
            if isinstance(step, Segment):
                step.nodes, made = nchwc.block_segment(
                    step.nodes, lambda v, si=si: v in plan_outputs or any(i > si for i in readers.get(v, [])),
                    pack_params)
                r.slots.update({new: r.slots.get(id(old), len(plan.nodes)) for new, old in made.items()})

    r.lines += preamble(plan, "one function per C segment of the model")
    arena_bytes, naive = 0, 0
    for si, step in enumerate(steps):
        if not isinstance(step, Segment):
            continue
        lay = layout_segment(step, lambda v, si=si: v in plan_outputs or any(i > si for i in readers.get(v, [])),
                             _tensor_inputs, lambda pn: pn.outputs, _scratch_bytes, lambda pn: kernel_of(pn).alias)
        arena_bytes = max(arena_bytes, lay.arena_bytes)
        naive += lay.naive_bytes
        r.lines.append(f"int seg{step.index}(void *const *io, char *arena) {{")
        r.lines.append("    (void)io; (void)arena;")
        for j, pn in enumerate(step.nodes):
            r.node(pn, lay.buf, f"(arena + {lay.scratch[j]})" if j in lay.scratch else None)
        r.lines += ["    return 0;", "}", ""]
    return CSource("\n".join(r.lines) + "\n", steps, arena_bytes, fallback, naive, r.failures)


__all__ = ["CSource", "Segment", "SegmentLayout", "kernel_of", "layout_segment", "preamble", "render", "why_not_c"]
