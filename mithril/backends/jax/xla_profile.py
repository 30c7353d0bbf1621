"""Per-node time of a jitted JAX program, from XLA's own profiler.

A jitted forward runs as one XLA executable whose instructions (fusions, dots, convolutions,
copies) are not the ONNX nodes: XLA fuses a convolution's bias, the Clip after it and the pad of
the next layer into one loop. Timing the nodes one by one with the jit off measures another
program. Here the program that runs is the one measured:

1. The generated forward is printed with each kernel call inside ``jax.named_scope("mithril_node<i>")``
   (:func:`scoped_call`), so every HLO instruction's ``op_name`` names the node it came from.
2. Its per-call program (hoist.py's main, with the model's own compiler options) is compiled and
   run under ``jax.profiler``; XLA:CPU writes one event per executed instruction (thunk), named
   as in the compiled HLO.
3. Each instruction's time goes to one node: a fusion's to the node with the most arithmetic in
   it (a dot or convolution above all, then reductions, then elementwise ops), its other nodes
   being *fused into* that one; an instruction XLA made without metadata (a rewritten dot) to the
   node that reads its result.

Instructions run on XLA's threads and may overlap, so the rows' sum can exceed the wall time.
"""

from __future__ import annotations

import bisect
import glob
import re
import statistics
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import jax

SCOPE = "mithril_node"
_SCOPE_RE = re.compile(SCOPE + r"(\d+)")
_RUN = "mithril_run"
_END = "end: "
# What an instruction inside a fusion weighs when choosing the node a fusion's time goes to.
_HEAVY = {"dot": 1000, "convolution": 1000, "custom-call": 1000, "fft": 1000, "reduce-window": 30,
          "reduce": 10, "select-and-scatter": 30, "scatter": 10, "gather": 5, "sort": 30}
_FREE = {"parameter", "constant", "bitcast", "broadcast", "reshape", "tuple", "get-tuple-element", "iota",
         "slice", "copy", "transpose", "pad", "concatenate", "dynamic-slice", "bitcast-convert"}
# Instructions whose events enclose their body's (a Loop's while): their own time is their body's.
_CONTROL = {"while", "conditional", "call"}


def scoped_call(i, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its JAX ops named after node ``i`` (``emit_python(timed=True)``'s
    ``_timed``)."""
    with jax.named_scope(f"{SCOPE}{i}"):
        return fn(*args, **kwargs)


@dataclass
class Instruction:
    name: str
    opcode: str
    node: int | None  # the innermost mithril_node scope of its op_name
    computation: str
    calls: list[str] = field(default_factory=list)  # the computations it runs (a fusion's body)
    operands: list[str] = field(default_factory=list)


@dataclass
class ProgramTrace:
    """What :func:`trace` measured: ``runs`` (one dict per run: key -> seconds, a key being a
    node index or ``"XLA <opcode>"`` for an instruction no node claims), ``calls`` (key -> XLA
    instructions run per call), ``fused`` (node index -> the node whose row holds its time),
    ``run_seconds`` (each profiled call, wall clock)."""

    runs: list[dict]
    calls: dict
    fused: dict[int, int]
    run_seconds: list[float]


def parse_hlo(text: str) -> dict[str, Instruction]:
    """The instructions of a compiled module's HLO text (``Compiled.as_text()``), by name."""
    out: dict[str, Instruction] = {}
    computation = ""
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and " = " not in s.split("(", 1)[0]:
            m = re.match(r"(?:ENTRY )?%?([\w.\-]+)", s)
            computation = m.group(1) if m else ""
            continue
        m = re.match(r"(?:ROOT )?%([\w.\-]+) = (.*)$", s)
        if not m:
            continue
        name, rest = m.groups()
        if rest.startswith("("):  # a tuple type: skip its balanced parentheses
            depth = 0
            for j, ch in enumerate(rest):
                depth += (ch == "(") - (ch == ")")
                if depth == 0:
                    break
            rest = rest[j + 1:].lstrip()
        else:
            rest = rest.split(" ", 1)[-1]
        opcode, _, args = rest.partition("(")
        op_name = re.search(r'op_name="([^"]*)"', rest)
        scopes = _SCOPE_RE.findall(op_name.group(1)) if op_name else []
        calls = re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", rest)
        branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
        calls += re.findall(r"%([\w.\-]+)", branches.group(1)) if branches else []
        operands = re.findall(r"%([\w.\-]+)", args.split(")", 1)[0])
        out[name] = Instruction(name, opcode.strip(), int(scopes[-1]) if scopes else None, computation, calls,
                                operands)
    return out


def _weight(opcode: str) -> float:
    return _HEAVY.get(opcode, 0.0 if opcode in _FREE else 1.0)


def attribute(instructions: dict[str, Instruction]) -> tuple[dict[str, object], dict[int, int]]:
    """Each instruction -> the key its time goes to (a node index, or ``"XLA <opcode>"``), and each
    node that only ever runs inside another node's fusion -> that node."""
    body = defaultdict(list)
    for ins in instructions.values():
        body[ins.computation].append(ins)

    def weights(computation: str, seen: set) -> Counter:
        out = Counter()
        if computation in seen:
            return out
        seen.add(computation)
        for ins in body[computation]:
            if ins.node is not None:
                out[ins.node] += _weight(ins.opcode)
            for c in ins.calls:
                out.update(weights(c, seen))
        return out

    # Computations run inside one instruction (a fusion's body, a reduction's function): not thunks.
    inlined, stack = set(), [c for ins in instructions.values() if ins.opcode not in _CONTROL for c in ins.calls]
    while stack:
        c = stack.pop()
        if c not in inlined:
            inlined.add(c)
            stack += [d for ins in body[c] for d in ins.calls]
    readers = defaultdict(list)
    for ins in instructions.values():
        for o in ins.operands:
            readers[o].append(ins)
    owner: dict[str, object] = {}
    guests: dict[int, set] = defaultdict(set)
    for ins in instructions.values():
        if ins.computation in inlined:
            continue
        key = ins.node
        if ins.opcode == "fusion" or (ins.calls and ins.opcode not in _CONTROL):
            inner = weights(ins.calls[0], set()) if ins.calls else Counter()
            if inner:
                best = max(inner.values())
                # Ties (a fusion of equal elementwise work) go to the node the fusion's result is.
                key = ins.node if ins.node is not None and inner.get(ins.node) == best else max(inner, key=inner.get)
                guests[key].update(n for n in inner if n != key)
        if key is None:  # no metadata (a dot XLA rewrote): the node reading its result
            key = next((r.node for r in readers[ins.name] if r.node is not None), None)
        owner[ins.name] = key if key is not None else f"XLA {ins.opcode}"
    hosts = {k for k in owner.values() if isinstance(k, int)}
    fused = {g: h for h, gs in guests.items() for g in gs if g not in hosts}
    return owner, fused


def timed(starts: dict, ends: dict, instructions: dict[str, Instruction], spans: list) -> list[tuple]:
    """(start, duration, name) of each instruction run, in nanoseconds, from its launch events
    (``starts``: name -> [(start, end)]), XLA's ``"end: <name>"`` events (``ends``: name -> [time])
    and the profiled runs' ``spans``.

    An instruction's event covers its launch. XLA marks its completion with an end event, later for
    work it hands to its thread pool (an XNNPACK convolution): the span up to it is the time. But
    XLA records that mark when the launching thread gets back to it: after a long instruction
    run in between (GPT-2's last GELU fusion was marked done once its 27 ms LM head had run, 13-20
    ms late), and on a loaded machine after its run has returned, even after the instruction's
    next launch (an XNNPACK convolution's, one run late). So the marks go to the launches in
    order (each launch takes the first mark after it that no earlier launch took),
    a mark counts only inside its launch's run, and an instruction is done by the time an
    instruction reading its result is launched: that launch is its end where its mark came after
    the run; without an end event, the launch's own span."""
    launched = {name: sorted(a for a, _ in launches) for name, launches in starts.items()}
    readers = defaultdict(list)
    for ins in instructions.values():
        for o in ins.operands:
            readers[o].append(ins.name)

    def first_reader(name: str, t: float, seen: set) -> float:
        # The first launch at or after t of an instruction reading name's result; through readers
        # with no events of their own (a bitcast, a tuple), their readers.
        best = float("inf")
        for r in readers[name]:
            if r in seen:
                continue
            seen.add(r)
            if r in launched:
                times = launched[r]
                i = bisect.bisect_left(times, t)
                if i < len(times):
                    best = min(best, times[i])
            else:
                best = min(best, first_reader(r, t, seen))
        return best

    out = []
    for name, launches in starts.items():
        launches = sorted(launches)
        done = sorted(ends.get(name, ()))
        j = 0
        for a, b in launches:
            run_end = next((hi for lo, hi in spans if lo <= a <= hi), float("inf"))
            j = max(j, bisect.bisect_left(done, a))
            mark = done[j] if j < len(done) else None
            j += 1
            reader = first_reader(name, a, set())
            if mark is not None and mark <= run_end:
                finish = mark
            elif mark is not None and reader <= run_end:  # marked after its run returned
                finish = reader
            else:
                finish = b
            finish = max(b, min(finish, reader))
            out.append((a, finish - a, name))
    return out


def trace(hoisted, params, data, *, runs: int, warmup: int) -> ProgramTrace | None:
    """Run the per-call program of ``hoisted`` (a :class:`~.hoist.Hoisted` of a forward printed with
    :func:`scoped_call`) ``warmup`` + ``runs`` times, the last ``runs`` under ``jax.profiler``.
    None where this jax has no reader for its traces."""
    profile_data = getattr(jax.profiler, "ProfileData", None)
    if profile_data is None:
        return None
    main, state, _ = hoisted.prepared(params, data)
    compiled = main.lower(state, data).compile()
    instructions = parse_hlo(compiled.as_text())
    owner, fused = attribute(instructions)
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(compiled(state, data))
    with tempfile.TemporaryDirectory(prefix="mithril-xla-profile-") as directory:
        try:
            jax.profiler.start_trace(directory)
        except RuntimeError:  # the caller's own trace is running: one at a time
            return None
        try:
            for r in range(runs):
                with jax.profiler.TraceAnnotation(f"{_RUN}{r}"):
                    jax.block_until_ready(compiled(state, data))
        finally:
            jax.profiler.stop_trace()
        files = glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)
        if not files:
            return None
        planes = profile_data.from_file(files[0]).planes
    spans, starts, ends = [], defaultdict(list), defaultdict(list)
    for plane in planes:
        for line in plane.lines:
            for e in line.events:
                name = e.name
                if name.startswith(_RUN):
                    spans.append((e.start_ns, e.start_ns + e.duration_ns))
                elif name in instructions and instructions[name].opcode not in _CONTROL:
                    starts[name].append((e.start_ns, e.start_ns + e.duration_ns))
                elif name.startswith(_END) and name[len(_END):] in instructions:
                    ends[name[len(_END):]].append(e.start_ns)
    spans.sort()
    events = timed(starts, ends, instructions, spans)
    per_run = [defaultdict(float) for _ in spans]
    counts = [Counter() for _ in spans]
    for start, duration, name in events:
        for r, (a, b) in enumerate(spans):
            if a <= start <= b:
                per_run[r][owner[name]] += duration * 1e-9
                counts[r][owner[name]] += 1
                break
    calls = {k: round(statistics.median(c.get(k, 0) for c in counts)) for k in set().union(*counts)} if counts else {}
    return ProgramTrace([dict(r) for r in per_run], calls, fused, [(b - a) * 1e-9 for a, b in spans])


__all__ = ["ProgramTrace", "attribute", "parse_hlo", "scoped_call", "timed", "trace"]
