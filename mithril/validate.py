"""Validate a backend's numerics against a reference (onnxruntime, another backend, or outputs saved
on another machine), down to the first node that diverges.

>>> import mithril as ml                                           # doctest: +SKIP
>>> report = ml.validate("resnet18.onnx", ml.NumpyBackend())       # doctest: +SKIP
>>> report.passed, report.outputs[0].max_abs_err                   # doctest: +SKIP
>>> ml.validate("resnet18.onnx", ml.JaxBackend(), reference="torch:dtype=bfloat16")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from .array_files import load_arrays, save_arrays
from .backends.backend import Backend
from .dtypes import np_dtype_of_onnx
from .errors import (BackendUnavailableError, InputError, MithrilError, UnsupportedAttributeError,
                     UnsupportedDomainError, UnsupportedDTypeError, UnsupportedOpError, UnsupportedOpsError,
                     ValidationError, public_api)
from .onnx_bridge.load import OnnxModel, load_onnx
from .runners import BackendRunner, Runner, compute_dtype, ort_session, parse_runner

# Per-dtype tolerance: |got - ref| <= atol + rtol * |ref| elementwise. float32 allows for the
# reassociation that different BLAS/conv algorithms do over deep networks.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
EXACT = (0.0, 0.0)
# The dtypes whose bit patterns the ULP distance reads.
ULP_DTYPES = ("float16", "bfloat16", "float32", "float64")
# The per-node search compares the values of at most this many bytes at once (per runner).
DEFAULT_MEMORY_BUDGET = 512 * 2**20
# What a backend raises when it cannot run a model at all (not a wrong answer): with
# ``skip_unsupported`` the backend is listed with the reason and the others still run.
CANNOT_RUN = (UnsupportedOpsError, UnsupportedOpError, UnsupportedDomainError, UnsupportedAttributeError,
              UnsupportedDTypeError, BackendUnavailableError)

# A tolerance: one figure for every output, or output name -> figure ("*" for the others).
Tolerance = Union[float, Mapping[str, float], None]


def tolerance_for(dtype, compute=None) -> tuple[float, float]:
    """The tolerance for values of ``dtype``; ``compute``, the dtype the backend computed them in
    (a float16 backend runs a float32 file in float16, its outputs cast back), loosens it to that
    dtype's when it is the coarser."""
    rtol, atol = TOLERANCES.get(np.dtype(dtype).name, EXACT)
    if compute is not None and np.dtype(dtype).kind == "f" and np.dtype(compute).name in TOLERANCES:
        c_rtol, c_atol = TOLERANCES.get(np.dtype(compute).name, EXACT)
        rtol, atol = max(rtol, c_rtol), max(atol, c_atol)
    return rtol, atol


def tolerance_of(tol: Tolerance, name: str) -> float | None:
    """The figure ``tol`` gives the value ``name``: itself when a number, ``tol[name]`` (else
    ``tol["*"]``) when a mapping; None leaves the dtype's tolerance."""
    if tol is None:
        return None
    if isinstance(tol, Mapping):
        got = tol.get(name, tol.get("*"))
        return None if got is None else float(got)
    return float(tol)


def _coarser(*dtypes) -> np.dtype | None:
    """The coarsest of the float dtypes given (None ignored): the one the tolerance follows."""
    found = [np.dtype(d) for d in dtypes if d is not None]
    return max(found, key=lambda d: float(ml_dtypes.finfo(d).eps)) if found else None


@dataclass
class OutputReport:
    """One output of one backend against the reference.

    ``max_abs_err``: the largest |got - ref|. ``max_rel_err``: ``max_abs_err`` over the output's
    scale, the largest finite |ref| (0 where both are 0; inf where the reference is all zeros and
    the output is not), so an output with zeros in it still gets a relative figure that means
    something. ``max_ulp``/``p99_ulp``: the largest and the 99th-percentile distance in units in
    the last place of the reference's dtype (float16, bfloat16, float32, float64; None for other
    dtypes), counted on the ordered bit patterns, NaN against NaN 0, NaN against a number inf.
    ``mismatches``: the elements outside ``atol + rtol * |ref|`` (for integers, bools and strings:
    the elements not equal), of ``elements``; None when the shapes or dtypes differ.
    ``worst_index``: the element of the largest error (integers, bools, strings: the first that
    differs), with its value in the backend (``worst_got``) and in the reference (``worst_ref``).
    """

    name: str
    backend: str
    shape: tuple
    dtype: str
    max_abs_err: float
    max_rel_err: float
    rtol: float
    atol: float
    passed: bool
    note: str = ""
    max_ulp: float | None = None
    p99_ulp: float | None = None
    mismatches: int | None = None
    elements: int = 0
    worst_index: tuple | None = None
    worst_got: Any = None
    worst_ref: Any = None

    @staticmethod
    def ulp_text(ulp: float | None) -> str:
        return "-" if ulp is None else f"{ulp:.4g}"

    def mismatch_text(self) -> str:
        return "-" if self.mismatches is None else f"{self.mismatches}/{self.elements}"

    def worst_text(self) -> str:
        if self.worst_index is None:
            return "-"
        show = (lambda v: f"{v:.6g}") if isinstance(self.worst_got, float) else repr
        return f"{list(self.worst_index)}: {show(self.worst_got)} / {show(self.worst_ref)}"


@dataclass
class NodeReport:
    """The first node, in topological order, whose output leaves tolerance."""

    node: str
    op_type: str
    output: str
    max_abs_err: float
    max_rel_err: float
    isolated_max_abs_err: float | None
    local_error: bool  # True: the node alone on the reference's inputs diverges (a kernel error)
    reference: str = "onnxruntime"
    index: int = 0  # the output's place among the values compared, in topological order

    def describe(self) -> str:
        kind = (f"a local kernel error: the node alone, on {self.reference}'s inputs, diverges"
                if self.local_error else
                f"accumulated drift: the node alone, on {self.reference}'s inputs, agrees")
        return (f"first divergent node {self.node!r} ({self.op_type}), output {self.output!r}: "
                f"max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}; {kind}"
                + (f" (isolated max abs err {self.isolated_max_abs_err:.3g})"
                   if self.isolated_max_abs_err is not None else ""))


@dataclass
class ValueCheck:
    """One intermediate value compared by the per-node search: the figures, not the arrays."""

    index: int
    value: str
    node: str
    op_type: str
    max_abs_err: float
    max_rel_err: float
    passed: bool


@dataclass
class ValidationReport:
    """``outputs``: one row per backend and output. ``reference``: what the backends were compared
    with. ``first_divergence`` and ``node_errors`` (per backend, the values the per-node search
    compared, in topological order): with ``per_node``. ``skipped``: backend -> why it could not
    run the model (``skip_unsupported``); ``errors``: backend -> the error it raised while running
    (a failure). ``passed``: every output of every backend that ran is within tolerance, and none
    raised."""

    model: str
    inputs: dict[str, np.ndarray]
    outputs: list[OutputReport] = field(default_factory=list)
    first_divergence: dict[str, NodeReport | None] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    reference: str = "onnxruntime"
    node_errors: dict[str, list[ValueCheck]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and not self.errors

    def table(self):
        """A rich table; on a narrow terminal a cell folds onto the next line (``overflow="fold"``)
        instead of losing digits to an ellipsis."""
        from rich.table import Table

        t = Table(title=f"Validation against {self.reference}: {self.model}")
        for col in ("backend", "output", "shape", "dtype", "max abs err", "max rel err", "max ulp", "p99 ulp",
                    "mismatches", "worst element (got / ref)", "tolerance (rtol/atol)", "result"):
            t.add_column(col, justify="right" if "err" in col or "ulp" in col or col == "mismatches" else "left",
                         overflow="fold")
        for o in self.outputs:
            t.add_row(o.backend, o.name, str(list(o.shape)), o.dtype, f"{o.max_abs_err:.3g}", f"{o.max_rel_err:.3g}",
                      o.ulp_text(o.max_ulp), o.ulp_text(o.p99_ulp), o.mismatch_text(), o.worst_text(),
                      f"{o.rtol:g} / {o.atol:g}", "[green]pass[/green]" if o.passed else f"[red]FAIL[/red] {o.note}")
        return t

    def __str__(self) -> str:
        lines = [f"Validation against {self.reference}: {self.model}",
                 f"{'backend':8s} {'output':24s} {'shape':18s} {'dtype':9s} {'max abs':>10s} {'max rel':>10s} "
                 f"{'max ulp':>9s} {'mismatches':>12s}  result"]
        for o in self.outputs:
            lines.append(f"{o.backend:8s} {o.name:24s} {str(list(o.shape)):18s} {o.dtype:9s} {o.max_abs_err:10.3g} "
                         f"{o.max_rel_err:10.3g} {o.ulp_text(o.max_ulp):>9s} {o.mismatch_text():>12s}  "
                         f"{'pass' if o.passed else 'FAIL ' + o.note}")
        for b, d in self.first_divergence.items():
            lines.append(f"{b}: " + (d.describe() if d else "no node leaves tolerance"))
        for b, reason in self.errors.items():
            lines.append(f"{b}: FAILED: {reason}")
        for b, reason in self.skipped.items():
            lines.append(f"{b}: not run: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The whole report as plain JSON values: the inputs as their shapes and dtypes, every
        float finite or one of the strings ``"inf"``, ``"-inf"``, ``"nan"``, tuples as lists."""
        return {
            "model": self.model,
            "reference": self.reference,
            "passed": self.passed,
            "inputs": {k: {"shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in self.inputs.items()},
            "outputs": [_plain(o) for o in self.outputs],
            "first_divergence": {b: _plain(d) for b, d in self.first_divergence.items()},
            "node_errors": {b: [_plain(c) for c in checks] for b, checks in self.node_errors.items()},
            "skipped": dict(self.skipped),
            "errors": dict(self.errors),
        }

    def to_json(self, path) -> None:
        """Write :meth:`to_dict` to ``path`` (strict JSON: no NaN or Infinity literals)."""
        try:
            with open(path, "w") as f:
                json.dump(self.to_dict(), f, indent=1, allow_nan=False)
        except OSError as exc:
            raise InputError(f"cannot write the report to {path}: {exc}") from exc

    def to_html(self, path=None) -> str:
        """A self-contained HTML page: the per-output table, and for a per-node search a plot of
        each compared value's relative error against its place in topological order, the first
        divergent node marked (PNG images inline). Written to ``path`` when given; returned."""
        from .validation_page import validation_page

        page = validation_page(self)
        if path is not None:
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(page)
            except OSError as exc:
                raise InputError(f"cannot write the report to {path}: {exc}") from exc
        return page


def _plain(x):
    """``x`` as JSON values: dataclasses as dicts, non-finite floats as strings."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, complex):
        return [_plain(x.real), _plain(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, (bytes, np.ndarray)):
        return str(x)
    return x


def _as_maps(value) -> list[dict] | None:
    """A sequence of maps (ai.onnx.ml ZipMap's output) as a list of dicts; None for a tensor."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        value = [v.item() if isinstance(v, np.ndarray) else v for v in value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        return list(value)
    return None


def ulp_distance(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place of their (shared) float dtype, as float64:
    each bit pattern mapped to its place on the ordered line of floats (-0 and +0 one place), the
    distance between places counted in uint64 (no overflow); NaN against NaN is 0, NaN against
    anything else inf.

    >>> ulp_distance(np.float32([1.0, 0.0, -0.0]), np.nextafter(np.float32([1.0, 0.0, 0.0]), np.float32(2)))
    array([1., 1., 1.])
    """
    got, ref = np.asarray(got), np.asarray(ref)
    bits = got.dtype.itemsize * 8
    as_uint = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    sign = np.uint64(1) << np.uint64(bits - 1)
    a = got.view(as_uint).astype(np.uint64)
    b = ref.view(as_uint).astype(np.uint64)
    mag_a, mag_b = a & (sign - np.uint64(1)), b & (sign - np.uint64(1))
    same_side = (a & sign) == (b & sign)
    dist = np.where(same_side, np.maximum(mag_a, mag_b) - np.minimum(mag_a, mag_b), mag_a + mag_b).astype(np.float64)
    nan_a, nan_b = np.isnan(got), np.isnan(ref)
    dist[nan_a & nan_b] = 0.0
    dist[nan_a ^ nan_b] = np.inf
    return dist


def _scalar(arr: np.ndarray, index: tuple):
    v = arr[index]
    if isinstance(v, np.generic):
        kind = arr.dtype.kind
        return float(v) if kind in "fV" else (complex(v) if kind == "c" else v.item())
    return v


# Elements compared at a time: the float64 temporaries of a block stay a few MiB, whatever the
# size of the output (the per-node search holds its memory budget).
BLOCK = 1 << 18


def compare(name: str, backend: str, got, ref, rtol: float | None = None, atol: float | None = None,
            compute=None, *, ulp: bool = True) -> OutputReport:
    """One output against the reference's, within ``rtol``/``atol`` or the tolerance of its dtype
    (and of ``compute``, the dtype the backend computed in: :func:`tolerance_for`). Integers,
    bools and strings compare exactly. The figures: :class:`OutputReport` (``ulp=False`` leaves
    the ULP distances out, which hold a float64 per element for the percentile)."""
    ref_maps = _as_maps(ref)
    if ref_maps is not None:  # the same keys row by row, then the values as a float32 matrix
        got_maps = _as_maps(got)
        if got_maps is None or [list(m) for m in got_maps] != [list(m) for m in ref_maps]:
            return OutputReport(name, backend, np.shape(got), "seq(map)", float("inf"), float("inf"), 0.0, 0.0,
                                False, "map keys differ from the reference's")
        ref = np.array([[m[k] for k in m] for m in ref_maps], np.float32)
        got = np.array([[g[k] for k in m] for g, m in zip(got_maps, ref_maps)], np.float32)
    ref = np.asarray(ref)
    got = np.asarray(got)
    d_rtol, d_atol = tolerance_for(ref.dtype, compute)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return OutputReport(name, backend, got.shape, str(got.dtype), float("inf"), float("inf"), rtol, atol, False,
                            f"expected {list(ref.shape)} {ref.dtype}")
    if ref.dtype.kind in "biuOUSMm":
        return _compare_exactly(name, backend, got, ref)
    wide = np.complex128 if ref.dtype.kind == "c" else np.float64
    top = None
    if compute is not None and np.dtype(compute).name in TOLERANCES and ref.dtype.kind != "c":
        # A value beyond the computing dtype's range is held to its largest finite value (the
        # precision pass clamps a float32 -3.4e38 mask to float16's -65504, not -inf).
        top = float(ml_dtypes.finfo(compute).max)
        if top >= float(ml_dtypes.finfo(ref.dtype).max):
            top = None
    g_flat, r_flat = got.reshape(-1), ref.reshape(-1)
    ulps = np.empty(ref.size, np.float64) if ulp and ref.dtype.name in ULP_DTYPES else None
    abs_err, worst, scale, mismatches, nan_ok = 0.0, None, 0.0, 0, True
    with np.errstate(all="ignore"):
        for start in range(0, ref.size, BLOCK):
            g = g_flat[start:start + BLOCK].astype(wide)
            r = r_flat[start:start + BLOCK].astype(wide)
            if top is not None:
                r = np.where(np.isfinite(r), np.clip(r, -top, top), r)
            g_nan, r_nan = np.isnan(g), np.isnan(r)
            nan_ok = nan_ok and bool(np.array_equal(g_nan, r_nan))
            diff = np.abs(g - r)
            diff[g_nan & r_nan] = 0.0
            diff[g_nan ^ r_nan] = np.inf
            diff[np.isinf(g) & (g == r)] = 0.0
            mag = np.abs(r)
            finite = mag[np.isfinite(mag)]
            if finite.size:
                scale = max(scale, float(finite.max()))
            mismatches += int(np.count_nonzero(~(diff <= atol + rtol * np.nan_to_num(mag, copy=False))))
            at = int(np.argmax(diff))
            if worst is None or diff[at] > abs_err:
                abs_err, worst = float(diff[at]), start + at
            if ulps is not None:
                near = r.astype(ref.dtype) if top is not None else r_flat[start:start + BLOCK]
                ulps[start:start + BLOCK] = ulp_distance(g_flat[start:start + BLOCK], near)
    rel_err = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else float("inf"))
    max_ulp = p99_ulp = None
    if ulps is not None:
        max_ulp, p99_ulp = (float(ulps.max()), float(np.percentile(ulps, 99, method="higher"))) if ulps.size else (0.0, 0.0)
    index = tuple(int(i) for i in np.unravel_index(worst, ref.shape)) if worst is not None else None
    return OutputReport(name, backend, got.shape, str(got.dtype), abs_err, rel_err, rtol, atol, mismatches == 0,
                        "" if nan_ok else "NaN positions differ", max_ulp, p99_ulp, mismatches, int(got.size), index,
                        _scalar(got, index) if index is not None else None,
                        _scalar(ref, index) if index is not None else None)


def _compare_exactly(name: str, backend: str, got: np.ndarray, ref: np.ndarray) -> OutputReport:
    """Integers, bools, strings: every element equal. The error figures are |got - ref| for
    numbers (inf for other kinds that differ); the worst element is the first that differs."""
    differs = np.asarray(got != ref)
    if differs.shape != ref.shape:  # elements that do not compare one by one (objects)
        differs = np.full(ref.shape, not np.array_equal(got, ref))
    mismatches = int(np.count_nonzero(differs))
    if ref.dtype.kind in "biu" and ref.size:
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        abs_err = float(diff.max())
        scale = float(np.abs(ref.astype(np.float64)).max())
        rel_err = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else float("inf"))
    else:
        abs_err = rel_err = 0.0 if mismatches == 0 else float("inf")
    first = tuple(int(i) for i in np.argwhere(differs)[0]) if mismatches else None
    return OutputReport(name, backend, got.shape, str(got.dtype), abs_err, rel_err, 0.0, 0.0, mismatches == 0, "",
                        None, None, mismatches, int(got.size), first,
                        _scalar(got, first) if first is not None else None,
                        _scalar(ref, first) if first is not None else None)


def model_inputs(model: OnnxModel) -> dict:
    """The graph inputs a caller feeds (those that are not also initializers), by name."""
    inits = model.graph.initializers
    return {v.name: v for v in model.graph.inputs if v.name not in inits}


def _declared(v) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else str(d) for d in v.shape) + "]"


def check_input_names(model: OnnxModel, names, flag: str = "inputs") -> None:
    """Refuse a name that is not an input of the model, listing the inputs (and the closest one)."""
    known = list(model_inputs(model))
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"{flag}: the model has no input {name!r}; its inputs: {', '.join(known) or 'none'}{hint}")


def check_inputs(model: OnnxModel, inputs: dict[str, Any] | None = None, shapes: dict[str, Any] | None = None,
                 *, flags: tuple[str, str] = ("inputs", "shapes")) -> None:
    """Refuse, with :class:`~mithril.errors.InputError`, a name in ``inputs`` or ``shapes`` that is
    not an input of the model, a shape or array whose rank or fixed dims differ from the declared
    ones, and an array of another dtype. ``flags`` name the two arguments in messages (the CLI
    passes ``("--input", "--shape")``)."""
    declared = model_inputs(model)
    for flag, given in zip(flags, (inputs or {}, shapes or {})):
        check_input_names(model, given, flag)
    for name in set(inputs or {}) & set(shapes or {}):
        raise InputError(f"{flags[0]} {name} and {flags[1]} {name}: give the array or a shape for random data, not both")
    for flag, name, shape, arr in ([(flags[0], k, np.shape(v), v) for k, v in (inputs or {}).items()]
                                   + [(flags[1], k, tuple(v), None) for k, v in (shapes or {}).items()]):
        v = declared[name]
        if not isinstance(v.type, ir.TensorType):
            continue
        if arr is not None and v.dtype is not None:
            want = np_dtype_of_onnx(int(v.dtype))
            got = np.asarray(arr).dtype
            if want.kind not in "OUS" and got != want:
                raise InputError(f"{flag} {name}: a {got} array; the model's input {name!r} is {want}")
        if v.shape is None:
            continue
        if len(shape) != len(v.shape):
            raise InputError(f"{flag} {name}: shape {list(shape)} has rank {len(shape)}; the model's input "
                             f"{name!r} has rank {len(v.shape)}: {_declared(v)}")
        for i, (want, got) in enumerate(zip(v.shape, shape)):
            if isinstance(want, int) and want != got:
                raise InputError(f"{flag} {name}: shape {list(shape)} has {got} at dim {i}; the model's input "
                                 f"{name!r} is {_declared(v)}")


def random_inputs(model: OnnxModel, shapes: dict[str, Any] | None = None, seed: int = 0,
                  given: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Random inputs of the declared dtype for every input not in ``given``; symbolic dims take
    ``shapes`` or 1."""
    rng = np.random.default_rng(seed)
    shapes = shapes or {}
    out = {}
    for v in model_inputs(model).values():
        if given and v.name in given:
            continue
        if not isinstance(v.type, ir.TensorType):
            raise ValidationError(f"input {v.name!r} is not a tensor ({v.type}); pass it explicitly")
        dtype = np_dtype_of_onnx(int(v.dtype))
        if v.name in shapes:
            shape = tuple(int(d) for d in shapes[v.name])
        elif v.shape is None:
            raise ValidationError(f"input {v.name!r} has no declared shape; give one with --shape {v.name}=...")
        else:
            shape = tuple(d if isinstance(d, int) else 1 for d in v.shape)
        if dtype.kind == "f" or dtype.name == "bfloat16":
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            arr = rng.integers(0, 10, size=shape).astype(dtype)
        else:
            raise ValidationError(f"cannot make random data for input {v.name!r} of dtype {dtype}; pass it explicitly")
        out[v.name] = arr
    return out


def as_runner(backend) -> Runner:
    """A Runner as given; a Backend (or anything else, a name included: compile refuses it
    clearly, as ``ml.compile`` does) behind a :class:`~mithril.runners.BackendRunner`."""
    if isinstance(backend, Runner):
        return backend
    if isinstance(backend, Backend):
        return BackendRunner(backend)
    return BackendRunner(backend, name=repr(backend))


def _run_reference(runner: Runner, model, inputs: dict, outputs: list[str] | None = None) -> dict:
    """``runner.run``, its failure a :class:`~mithril.errors.ValidationError` naming the reference."""
    try:
        return runner.run(model, inputs, outputs)
    except ValidationError:
        raise
    except Exception as exc:  # onnxruntime's own errors, or a backend's MithrilError
        raise ValidationError(f"the reference {runner.name} could not run the model: {exc}") from exc


def _quiet(message: str) -> None:
    pass


# -- the per-node search ---------------------------------------------------------------------------
@dataclass
class _Value:
    """A node output the per-node search compares."""

    name: str
    node: int  # the producing node's place in the graph
    label: str
    op_type: str
    nbytes: int | None  # None: a shape inference left unknown
    info: onnx.ValueInfoProto


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The values ``node`` reads, those its subgraphs read from outside included."""
    names = {n for n in node.input if n}
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else []) + list(attr.graphs):
            inner = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                names |= _names_read(n) - inner
    return names


def _typed_values(proto: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, onnx.ValueInfoProto]:
    """Every value's inferred type, the graph inputs taken at the shapes of ``inputs`` (a failed
    inference leaves the types the file declares)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    for vi in fixed.graph.input:
        if vi.name in inputs and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in np.shape(inputs[vi.name]):
                shape.dim.add().dim_value = int(d)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fixed = onnx.shape_inference.infer_shapes(fixed, strict_mode=False)
    except Exception:  # noqa: BLE001 - the declared types still serve
        pass
    types = {}
    for vi in list(fixed.graph.input) + list(fixed.graph.value_info) + list(fixed.graph.output):
        types[vi.name] = onnx.ValueInfoProto()
        types[vi.name].CopyFrom(vi)  # a copy: a reference would keep the inferred model (weights) alive
    return types


def _nbytes(info: onnx.ValueInfoProto) -> int | None:
    t = info.type.tensor_type
    if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
        return None
    itemsize = np_dtype_of_onnx(t.elem_type).itemsize
    return math.prod(d.dim_value for d in t.shape.dim) * itemsize


def _values_to_compare(proto: onnx.ModelProto, types: dict) -> list[_Value]:
    """The node outputs of the main graph with a known tensor type, in topological order."""
    out = []
    for i, node in enumerate(proto.graph.node):
        for name in node.output:
            info = types.get(name)
            if name and info is not None and info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
                out.append(_Value(name, i, node.name or f"{node.op_type}#{i}", node.op_type, _nbytes(info), info))
    return out


def _prefix_model(proto: onnx.ModelProto, upto: int, outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """The graph's first ``upto`` nodes, with ``outputs`` as its outputs and only the inputs and
    initializers they read."""
    nodes = proto.graph.node[:upto]
    read = set().union(*(_names_read(n) for n in nodes)) if nodes else set()
    read |= {o.name for o in outputs}
    graph = onnx.helper.make_graph(
        nodes, proto.graph.name or "prefix", [vi for vi in proto.graph.input if vi.name in read], outputs,
        initializer=[t for t in proto.graph.initializer if t.name in read],
        sparse_initializer=[t for t in proto.graph.sparse_initializer if t.values.name in read])
    model = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version,
                                   functions=list(proto.functions))
    return model


def _chunks(values: list[_Value], needs: dict[str, list[str]], sizes: dict[str, int], budget: float):
    """Consecutive runs of ``values`` whose bytes, with the bytes of the earlier values their nodes
    read (``needs``: the isolated re-run is fed them), stay within ``budget``; a value larger than
    the budget is a chunk alone."""
    chunk: list[_Value] = []
    held: set[str] = set()
    total = 0
    for v in values:
        new = [n for n in [v.name, *needs.get(v.name, [])] if n not in held]
        cost = sum(sizes.get(n, 0) for n in new)
        if chunk and total + cost > budget:
            yield chunk, held, total
            chunk, held, total = [], set(), 0
            new = [n for n in [v.name, *needs.get(v.name, [])] if n not in held]
            cost = sum(sizes.get(n, 0) for n in new)
        chunk.append(v)
        held |= set(new)
        total += cost
    if chunk:
        yield chunk, held, total


def _isolated_node_error(proto: onnx.ModelProto, node: onnx.NodeProto, ref_values: dict, runner: Runner,
                         reference: Runner, tolerance=lambda name: (None, None),
                         compute=None) -> tuple[float, bool] | None:
    """Run one node alone on the reference and on ``runner``, fed the reference's inputs: the
    largest error of its outputs, and whether every output stays within tolerance element by
    element (``tolerance(name)`` gives its rtol, atol; None: the dtype's), as the search judged
    them; None when the node cannot run alone."""
    inputs = [n for n in node.input if n]
    init_map = {t.name: t for t in proto.graph.initializer}
    if any(n not in ref_values and n not in init_map for n in inputs):
        return None
    feeds = {}
    graph_inputs = []
    initializers = []
    for n in dict.fromkeys(inputs):
        if n in ref_values:
            arr = np.asarray(ref_values[n])
            feeds[n] = arr
            graph_inputs.append(onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        else:
            initializers.append(init_map[n])
    outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    single = onnx.helper.make_model(
        onnx.helper.make_graph([node], "isolated", graph_inputs, outs, initializer=initializers),
        opset_imports=list(proto.opset_import), ir_version=proto.ir_version, functions=list(proto.functions),
    )
    try:
        want = reference.run(single, feeds)
        got = runner.run(single, feeds)
    except Exception:  # noqa: BLE001 - a node that cannot run alone (outer-scope reads): no verdict
        return None
    rows = [compare(name, runner.name, got[name], want[name], *tolerance(name), compute, ulp=False)
            for name in want if name in got]
    return (max(r.max_abs_err for r in rows), all(r.passed for r in rows)) if rows else None


def first_divergent_node(model, backend, inputs: dict[str, np.ndarray], rtol: Tolerance = None,
                         atol: Tolerance = None, progress: Callable[[str], None] | None = None, *,
                         reference=None, memory_budget: float | None = DEFAULT_MEMORY_BUDGET,
                         trace: list[ValueCheck] | None = None) -> NodeReport | None:
    """Compare the intermediate values of ``backend`` (a Backend or a Runner) and ``reference``
    (a runner spec, Backend or Runner; None is onnxruntime) in topological order; return the first
    out of tolerance, or None.

    Memory stays bounded: the values are taken in consecutive chunks whose estimated bytes (from
    the inferred shapes; an unknown one counted as the largest known) stay within
    ``memory_budget`` (None: no bound), each chunk a run of the model's prefix up to it on both
    runners with only that chunk's values as outputs, compared and freed before the next. The
    reference also returns the earlier values the chunk's nodes read, so the first diverging node
    is then re-run alone on the reference's inputs: a local kernel error when it still diverges,
    accumulated drift when it agrees. ``trace`` receives a :class:`ValueCheck` per value compared;
    ``progress`` a line per stage and per chunk.
    """
    say = progress or _quiet
    runner, ref = as_runner(backend), parse_runner(reference)
    proto = load_onnx(model).to_proto()
    types = _typed_values(proto, inputs)
    values = _values_to_compare(proto, types)
    known = [v.nbytes for v in values if v.nbytes is not None] + [np.asarray(a).nbytes for a in inputs.values()]
    unknown_size = max(known, default=0)
    sizes = {v.name: v.nbytes if v.nbytes is not None else unknown_size for v in values}
    produced = {v.name for v in values}
    by_name = {v.name: v for v in values}
    # What re-running a node alone needs from the reference: the values of earlier nodes it reads.
    needs = {v.name: sorted(n for n in _names_read(proto.graph.node[v.node]) if n in produced and n != v.name
                     and by_name[n].node != v.node) for v in values}
    budget = float("inf") if memory_budget is None else float(memory_budget)
    chunks = list(_chunks(values, needs, sizes, budget))
    tag = f"{runner.name} per-node"
    say(f"{tag}: {len(values)} values in {len(chunks)} chunk(s)"
        + (f" of at most {budget / 2**20:g} MiB" if memory_budget is not None else "")
        + f", against {ref.name}")
    compute = _coarser(runner.compute, ref.compute)
    done = 0
    for c, (chunk, held, nbytes) in enumerate(chunks, 1):
        last = chunk[-1]
        say(f"{tag}: chunk {c}/{len(chunks)}: values {done + 1}-{done + len(chunk)} of {len(values)} "
            f"({nbytes / 2**20:.1f} MiB), up to node {last.label!r} ({last.op_type})")
        names = [v.name for v in chunk]
        extra = sorted(held - set(names))
        upto = last.node + 1
        feeds_model = _prefix_model(proto, upto, [v.info for v in chunk])
        feeds = {k: v for k, v in inputs.items() if k in {i.name for i in feeds_model.graph.input}}
        got = runner.run(feeds_model, feeds, names)
        ref_model = (_prefix_model(proto, upto, [by_name[n].info for n in names + extra]) if extra else feeds_model)
        want = _run_reference(ref, ref_model, feeds, names + extra)
        del feeds_model, ref_model
        failed = None
        for i, v in enumerate(chunk, done + 1):
            row = compare(v.name, runner.name, got[v.name], want[v.name], tolerance_of(rtol, v.name),
                          tolerance_of(atol, v.name), compute, ulp=False)
            if trace is not None:
                trace.append(ValueCheck(i, v.name, v.label, v.op_type, row.max_abs_err, row.max_rel_err, row.passed))
            if failed is None and not row.passed:
                failed = (i, v, row)
        del got
        if failed is not None:
            i, v, row = failed
            say(f"{tag}: node {v.label!r} ({v.op_type}) leaves tolerance; running it alone on {ref.name}'s inputs")
            node = proto.graph.node[v.node]
            iso = _isolated_node_error(proto, node, {**inputs, **want}, runner, ref,
                                       lambda name: (tolerance_of(rtol, name), tolerance_of(atol, name)), compute)
            local = iso is None or not iso[1]
            return NodeReport(v.label, v.op_type, v.name, row.max_abs_err, row.max_rel_err,
                              None if iso is None else iso[0], local, ref.name, i)
        del want
        done += len(chunk)
    return None


# -- validate --------------------------------------------------------------------------------------
def _check_tolerance_names(model: OnnxModel, tol: Tolerance, flag: str) -> None:
    """Refuse a per-output tolerance for a name that is no value of the model."""
    if not isinstance(tol, Mapping):
        return
    known = set(model.output_names) | {v.name for node in model.graph.all_nodes() for v in node.outputs if v.name}
    for name in tol:
        if name != "*" and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise InputError(f"{flag}: the model has no output or value {name!r}; its outputs: "
                             f"{', '.join(model.output_names)}" + (f" (did you mean {close[0]!r}?)" if close else ""))


def _check_saved_outputs(model: OnnxModel, saved: dict[str, np.ndarray], where: str) -> None:
    """The saved outputs are the model's, each of the declared dtype, rank and fixed dims."""
    names = list(model.output_names)
    extra = [n for n in saved if n not in names]
    missing = [n for n in names if n not in saved]
    if extra:
        raise InputError(f"{where}: holds {extra[0]!r}, not an output of the model; its outputs: {', '.join(names)}")
    if missing:
        raise InputError(f"{where}: no array for output {missing[0]!r}; it holds: {', '.join(saved) or 'nothing'}")
    for v in model.graph.outputs:
        arr = saved[v.name]
        if not isinstance(v.type, ir.TensorType) or v.dtype is None:
            continue
        want = np_dtype_of_onnx(int(v.dtype))
        if want.kind not in "OUS" and arr.dtype != want:
            raise InputError(f"{where}: output {v.name!r} is a {arr.dtype} array; the model's is {want}")
        if v.shape is None:
            continue
        if arr.ndim != len(v.shape) or any(isinstance(d, int) and d != s for d, s in zip(v.shape, arr.shape)):
            raise InputError(f"{where}: output {v.name!r} has shape {list(arr.shape)}; the model's is {_declared(v)}")


def _loaded_inputs(model: OnnxModel, path, given: dict) -> dict[str, np.ndarray]:
    """The arrays of ``path`` for the model's inputs: every input not in ``given`` must be there,
    and nothing else."""
    where = f"inputs file {path}"
    arrays = load_arrays(path, where)
    check_input_names(model, arrays, where)
    missing = [n for n in model_inputs(model) if n not in arrays and n not in given]
    if missing:
        raise InputError(f"{where}: no array for input {missing[0]!r}; it holds: {', '.join(arrays) or 'nothing'}")
    check_inputs(model, arrays, flags=(where, "shapes"))
    return arrays


@public_api(ValidationError, "validate")
def validate(model, backend, inputs: dict[str, Any] | None = None,
             shapes: dict[str, Any] | None = None, per_node: bool = False,
             rtol: Tolerance = None, atol: Tolerance = None, seed: int = 0,
             skip_unsupported: bool = False, progress: Callable[[str], None] | None = None, *,
             reference=None, load_inputs=None, save_inputs=None, load_outputs=None, save_outputs=None,
             memory_budget: float | None = DEFAULT_MEMORY_BUDGET) -> ValidationReport:
    """Run ``model`` on ``backend`` (a Backend or a :class:`~mithril.runners.Runner`, or a list of
    them) and on ``reference`` with the same inputs, and compare every output.

    ``reference``: None or ``"onnxruntime"``, a backend spec with options
    (``"torch:dtype=bfloat16"``, ``"ggml:quantize=q8_0"``), a Backend or a Runner.
    ``load_outputs``: the reference's outputs saved by an earlier run (``save_outputs``), compared
    with instead of running a reference. Saved arrays are one ``.npz`` file or a folder of
    ``NAME.npy`` files (:mod:`mithril.array_files`); ``load_inputs`` must hold every input not in
    ``inputs``, ``load_outputs`` exactly the model's outputs, each of its declared dtype and shape,
    else :class:`~mithril.errors.InputError` names it. ``save_inputs``/``save_outputs`` write the
    inputs used and the reference's outputs.

    Inputs not given default to random data of each input's dtype and shape (``shapes`` fixes
    symbolic dims, ``seed`` the data); a name in ``inputs`` or ``shapes`` that is not an input of
    the model, or a shape that contradicts the declared one, raises InputError.
    ``rtol``/``atol``: a figure for every output, or a mapping output name -> figure (``"*"``: the
    others); unset, the per-dtype tolerance (``TOLERANCES``). A backend whose dtype is float16,
    bfloat16 or float64 computes a float32 file in that dtype (the precision pass), its inputs
    and outputs kept float32 (``keep_io_types``), and is held to the tolerance of the coarser of
    the two dtypes (of the reference's too, when it computes in another).
    ``per_node``: find the first node whose output leaves tolerance (:func:`first_divergent_node`,
    comparing at most ``memory_budget`` bytes of values at once).
    ``skip_unsupported``: a backend that cannot run the model (an op, dtype or domain it lacks) is
    listed in ``report.skipped`` with the reason and one that raises while running in
    ``report.errors``, and the other backends still run; without it the first error is raised.
    ``progress`` receives a line per stage.

    >>> import mithril as ml                                                        # doctest: +SKIP
    >>> report = ml.validate("m.onnx", ml.NumpyBackend(), atol={"logits": 1e-3},   # doctest: +SKIP
    ...                      save_inputs="run/inputs.npz", save_outputs="run/outputs.npz")
    >>> ml.validate("m.onnx", ml.TorchBackend(), load_inputs="run/inputs.npz",    # doctest: +SKIP
    ...             load_outputs="run/outputs.npz").passed
    """
    say = progress or _quiet
    loaded = load_onnx(model)
    backends = backend if isinstance(backend, (list, tuple)) else [backend]
    if load_outputs is not None and reference is not None:
        raise ValidationError("give a reference to run or load_outputs to compare with, not both")
    if load_outputs is not None and per_node:
        raise ValidationError("per_node needs a reference that runs: load_outputs holds only the model's outputs")
    _check_tolerance_names(loaded, rtol, "rtol")
    _check_tolerance_names(loaded, atol, "atol")
    check_inputs(loaded, inputs, shapes)
    given = {k: np.asarray(v) for k, v in (inputs or {}).items()}
    if load_inputs is not None:
        given = {**_loaded_inputs(loaded, load_inputs, given), **given}
    inputs = {**given, **random_inputs(loaded, shapes, seed, given)}
    inputs = {name: inputs[name] for name in model_inputs(loaded)}
    if save_inputs is not None:
        save_arrays(save_inputs, inputs)
    ref_runner = None
    if load_outputs is not None:
        ref_by_name = load_arrays(load_outputs, f"outputs file {load_outputs}")
        _check_saved_outputs(loaded, ref_by_name, f"outputs file {load_outputs}")
        ref_label = f"outputs saved in {load_outputs}"
    else:
        ref_runner = parse_runner(reference)
        ref_label = ref_runner.name
        say(f"{ref_label}: running the model (the reference)")
        ref_by_name = _run_reference(ref_runner, loaded, inputs)
    if save_outputs is not None:
        save_arrays(save_outputs, {name: ref_by_name[name] for name in loaded.output_names})
    report = ValidationReport(loaded.source or loaded.graph.name or "model", inputs, reference=ref_label)
    for b in backends:
        runner = as_runner(b)
        label = runner.name
        compute = _coarser(runner.compute, ref_runner.compute if ref_runner is not None else None)
        try:
            say(f"{label}: compiling and running")
            got = runner.run(loaded, inputs)
            rows = [compare(name, label, got[name], ref_by_name[name], tolerance_of(rtol, name),
                            tolerance_of(atol, name), compute) for name in loaded.output_names]
            del got
            trace: list[ValueCheck] = []
            divergence = (first_divergent_node(loaded, runner, inputs, rtol, atol, progress, reference=ref_runner,
                                               memory_budget=memory_budget, trace=trace) if per_node else None)
        except CANNOT_RUN as exc:
            if not skip_unsupported:
                raise
            report.skipped[label] = str(exc).splitlines()[0]
            continue
        except MithrilError as exc:
            if not skip_unsupported:
                raise
            report.errors[label] = str(exc).splitlines()[0]
            continue
        report.outputs += rows
        if per_node:
            report.first_divergence[label] = divergence
            report.node_errors[label] = trace
    return report
