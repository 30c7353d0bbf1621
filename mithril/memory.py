"""What a compiled model holds in memory: ``pm.memory_report()``.

Every backend can tell the weight bytes (parameters and embedded constants, per dtype) and, when
every shape is static, what the plan's intermediates need: the naive sum (each intermediate in a
buffer of its own) and the peak of the values alive at once, from the plan's lifetimes (a value
dies after its last reader). The C backend places its intermediates in one arena planned from
those lifetimes, so it also reports the arena's real size; the other backends allocate through
their framework (NumPy, XLA, PyTorch, MLX), whose own allocator decides what is reused.

    >>> import mithril as ml
    >>> from mithril.models import Linear
    >>> pm = ml.compile(Linear(4), ml.NumpyBackend(), shapes={"input": [2, 3]})
    >>> report = pm.memory_report()
    >>> report.weight_bytes  # a 3x4 weight and 4 biases in float32
    64
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod


@dataclass(frozen=True)
class MemoryReport:
    """Bytes a compiled model holds (see the module docstring).

    ``weight_bytes``: parameters and embedded constants; ``weights_by_dtype``: the same per dtype
    name. ``naive_bytes``: every intermediate in its own buffer; ``peak_bytes``: the most
    intermediate bytes alive at once by the plan's lifetimes; both None when a shape is not static.
    ``arena_bytes``: the arena the C backend allocates (None on the other backends).
    ``backend``: the backend's name. ``note`` says what is not counted. ``labels``: what the
    program calls its own entries (``arena_bytes``, ``work_bytes``) when printed."""

    backend: str
    weight_bytes: int
    weights_by_dtype: dict[str, int] = field(default_factory=dict)
    naive_bytes: int | None = None
    peak_bytes: int | None = None
    arena_bytes: int | None = None
    note: str = ""
    work_bytes: int | None = None  # GGML: the compute graphs' work buffers
    total_bytes: int | None = None  # GGML: weights + intermediates + work, what mem_size bounds
    labels: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        def mib(n):
            return "unknown (a shape is not static)" if n is None else f"{n:,} bytes ({n / 2**20:.2f} MiB)"

        dtypes = ", ".join(f"{k} {v:,}" for k, v in sorted(self.weights_by_dtype.items()))
        rows = [("weights", mib(self.weight_bytes) + (f" [{dtypes}]" if dtypes else "")),
                ("intermediates, naive sum", mib(self.naive_bytes)),
                ("intermediates, peak alive", mib(self.peak_bytes))]
        if self.arena_bytes is not None:
            rows.append((self.labels.get("arena_bytes", "arena"), mib(self.arena_bytes)))
        if self.work_bytes is not None:
            rows.append((self.labels.get("work_bytes", "work"), mib(self.work_bytes)))
        if self.total_bytes is not None:
            rows.append(("total", mib(self.total_bytes)))
        lines = [f"memory of a model compiled for {self.backend}:"] + [f"  {k + ':':<27} {v}" for k, v in rows]
        if self.note:
            lines.append(f"  ({self.note})")
        return "\n".join(lines)


def _nbytes(v) -> int | None:
    shape = v.static_shape
    if shape is None or v.dtype is None or v.dtype.kind == "O":
        return None
    return prod(shape) * v.dtype.itemsize


def plan_memory(plan, backend: str, program=None) -> MemoryReport:
    """The report of ``plan`` lowered by ``backend`` (``program``: the lowered program; a
    segmented one (C, GGML) reports its arena, and what it calls its parts)."""
    by_dtype: dict[str, int] = {}
    for v in (*plan.params, *plan.constants, *(i for i in plan.inputs if i.kind == "param")):
        n = _nbytes(v)
        if n is not None:
            by_dtype[str(v.dtype)] = by_dtype.get(str(v.dtype), 0) + n
    naive: int | None = 0
    peak: int | None = 0
    live: dict = {}
    for pn in plan.nodes:
        for o in pn.outputs:
            n = _nbytes(o)
            if n is None:
                naive = peak = None
                break
            naive += n
            live[o] = n
        if peak is None:
            break
        peak = max(peak, sum(live.values()))
        for v in pn.frees:
            live.pop(v, None)
    arena = None
    told: dict = {}
    report = getattr(program, "memory_report", None)
    if callable(report):
        told = report()
        arena = told.get("arena_bytes")
    # GGML stores weights in its own types (float16, q8_0, ...): the program tells their bytes.
    by_dtype = told.get("weights_by_dtype", by_dtype)
    note = (f"NumPy nodes between {told.get('segment_noun', 'segments')} allocate their own outputs"
            if arena is not None and told.get("fallback_nodes") else "")
    return MemoryReport(backend, told.get("weight_bytes", sum(by_dtype.values())), by_dtype, naive, peak, arena, note,
                        told.get("work_bytes"), told.get("total_bytes"), told.get("labels", {}))


__all__ = ["MemoryReport", "plan_memory"]
