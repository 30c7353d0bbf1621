"""Validate a backend's numerics against onnxruntime, down to the first node that diverges.

>>> import mithril as ml                                           # doctest: +SKIP
>>> report = ml.validate("resnet18.onnx", ml.NumpyBackend())       # doctest: +SKIP
>>> report.passed, report.outputs[0].max_abs_err                   # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from .backends.backend import Backend
from .dtypes import np_dtype_of_onnx
from .errors import (BackendUnavailableError, InputError, MithrilError, UnsupportedAttributeError,
                     UnsupportedDomainError, UnsupportedDTypeError, UnsupportedOpError, UnsupportedOpsError,
                     ValidationError, public_api)
from .onnx_bridge.load import OnnxModel, load_onnx

# Per-dtype tolerance: |mithril - ort| <= atol + rtol * |ort| elementwise. float32 allows for the
# reassociation that different BLAS/conv algorithms do over deep networks.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-3, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
EXACT = (0.0, 0.0)
# What a backend raises when it cannot run a model at all (not a wrong answer): with
# ``skip_unsupported`` the backend is listed with the reason and the others still run.
CANNOT_RUN = (UnsupportedOpsError, UnsupportedOpError, UnsupportedDomainError, UnsupportedAttributeError,
              UnsupportedDTypeError, BackendUnavailableError)


def tolerance_for(dtype, compute=None) -> tuple[float, float]:
    """The tolerance for values of ``dtype``; ``compute``, the dtype the backend computed them in
    (a float16 backend runs a float32 file in float16, its outputs cast back), loosens it to that
    dtype's when it is the coarser."""
    rtol, atol = TOLERANCES.get(np.dtype(dtype).name, EXACT)
    if compute is not None and np.dtype(dtype).kind == "f" and np.dtype(compute).name in TOLERANCES:
        c_rtol, c_atol = TOLERANCES.get(np.dtype(compute).name, EXACT)
        rtol, atol = max(rtol, c_rtol), max(atol, c_atol)
    return rtol, atol


@dataclass
class OutputReport:
    """One output of one backend against the reference. ``max_rel_err`` is the largest error
    relative to the output's scale: ``max_abs_err`` over the largest finite magnitude of the
    reference's output (0 where both are 0; inf where the reference is all zeros and the output is
    not), so an output with zeros in it still gets a relative figure that means something."""

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


@dataclass
class NodeReport:
    """The first node, in topological order, whose output leaves tolerance."""

    node: str
    op_type: str
    output: str
    max_abs_err: float
    max_rel_err: float
    isolated_max_abs_err: float | None
    local_error: bool  # True: the node alone on onnxruntime's inputs diverges (a kernel error)

    def describe(self) -> str:
        kind = ("a local kernel error: the node alone, on onnxruntime's inputs, diverges"
                if self.local_error else
                "accumulated drift: the node alone, on onnxruntime's inputs, agrees")
        return (f"first divergent node {self.node!r} ({self.op_type}), output {self.output!r}: "
                f"max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}; {kind}"
                + (f" (isolated max abs err {self.isolated_max_abs_err:.3g})"
                   if self.isolated_max_abs_err is not None else ""))


@dataclass
class ValidationReport:
    """``outputs``: one row per backend and output. ``skipped``: backend -> why it could not run the
    model (``skip_unsupported``); ``errors``: backend -> the error it raised while running (a
    failure). ``passed``: every output of every backend that ran is within tolerance, and none
    raised."""

    model: str
    inputs: dict[str, np.ndarray]
    outputs: list[OutputReport] = field(default_factory=list)
    first_divergence: dict[str, NodeReport | None] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and not self.errors

    def table(self):
        """A rich table; on a narrow terminal a cell folds onto the next line (``overflow="fold"``)
        instead of losing digits to an ellipsis."""
        from rich.table import Table

        t = Table(title=f"Validation against onnxruntime: {self.model}")
        for col in ("backend", "output", "shape", "dtype", "max abs err", "max rel err", "tolerance (rtol/atol)", "result"):
            t.add_column(col, justify="right" if "err" in col else "left", overflow="fold")
        for o in self.outputs:
            t.add_row(o.backend, o.name, str(list(o.shape)), o.dtype, f"{o.max_abs_err:.3g}", f"{o.max_rel_err:.3g}",
                      f"{o.rtol:g} / {o.atol:g}", "[green]pass[/green]" if o.passed else f"[red]FAIL[/red] {o.note}")
        return t

    def __str__(self) -> str:
        lines = [f"{'backend':8s} {'output':24s} {'shape':18s} {'dtype':9s} {'max abs':>10s} {'max rel':>10s}  result"]
        for o in self.outputs:
            lines.append(f"{o.backend:8s} {o.name:24s} {str(list(o.shape)):18s} {o.dtype:9s} {o.max_abs_err:10.3g} "
                         f"{o.max_rel_err:10.3g}  {'pass' if o.passed else 'FAIL ' + o.note}")
        for b, d in self.first_divergence.items():
            lines.append(f"{b}: " + (d.describe() if d else "no node leaves tolerance"))
        for b, reason in self.errors.items():
            lines.append(f"{b}: FAILED: {reason}")
        for b, reason in self.skipped.items():
            lines.append(f"{b}: not run: {reason}")
        return "\n".join(lines)


def _as_maps(value) -> list[dict] | None:
    """A sequence of maps (ai.onnx.ml ZipMap's output) as a list of dicts; None for a tensor."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        value = [v.item() if isinstance(v, np.ndarray) else v for v in value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
        return list(value)
    return None


def compare(name: str, backend: str, got, ref, rtol: float | None = None, atol: float | None = None,
            compute=None) -> OutputReport:
    """One output against onnxruntime's, within ``rtol``/``atol`` or the tolerance of its dtype
    (and of ``compute``, the dtype the backend computed in: :func:`tolerance_for`)."""
    ref_maps = _as_maps(ref)
    if ref_maps is not None:  # the same keys row by row, then the values as a float32 matrix
        got_maps = _as_maps(got)
        if got_maps is None or [list(m) for m in got_maps] != [list(m) for m in ref_maps]:
            return OutputReport(name, backend, np.shape(got), "seq(map)", float("inf"), float("inf"), 0.0, 0.0,
                                False, "map keys differ from onnxruntime's")
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
    if ref.dtype.kind in "biuOUS":
        same = bool(np.array_equal(got, ref))
        err = 0.0 if same else float("inf")
        return OutputReport(name, backend, got.shape, str(got.dtype), err, err, 0.0, 0.0, same)
    g = got.astype(np.float64)
    r = ref.astype(np.float64)
    if compute is not None and np.dtype(compute).name in TOLERANCES:
        # A value beyond the computing dtype's range is held to its largest finite value (the
        # precision pass clamps a float32 -3.4e38 mask to float16's -65504, not -inf).
        top = float(ml_dtypes.finfo(compute).max)
        if top < float(np.finfo(ref.dtype).max):
            r = np.where(np.isfinite(r), np.clip(r, -top, top), r)
    with np.errstate(all="ignore"):
        nan_ok = np.array_equal(np.isnan(g), np.isnan(r))
        diff = np.where(np.isnan(g) & np.isnan(r), 0.0, np.abs(g - r))
        diff = np.where(np.isinf(g) & (g == r), 0.0, diff)
        abs_err = float(np.max(diff)) if diff.size else 0.0
        finite = np.abs(r[np.isfinite(r)])
        scale = float(finite.max()) if finite.size else 0.0
        rel_err = abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else float("inf"))
        ok = nan_ok and bool(np.all(diff <= atol + rtol * np.abs(np.nan_to_num(r))))
    return OutputReport(name, backend, got.shape, str(got.dtype), abs_err, rel_err, rtol, atol, ok,
                        "" if nan_ok else "NaN positions differ")


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


def _drop_trailing_empty_inputs(graph: onnx.GraphProto) -> None:
    # onnxruntime 1.31 aborts the process on e.g. LayerNormalization(x, scale, ""); "" at the end
    # of a node's inputs means the same as leaving the input out.
    for node in graph.node:
        while node.input and node.input[-1] == "":
            node.input.pop()
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _drop_trailing_empty_inputs(attr.g)
            for g in attr.graphs:
                _drop_trailing_empty_inputs(g)


def _ort_session(proto: onnx.ModelProto):
    import onnxruntime as ort

    if any(n.input and n.input[-1] == "" for n in proto.graph.node):
        cleaned = onnx.ModelProto()
        cleaned.CopyFrom(proto)
        _drop_trailing_empty_inputs(cleaned.graph)
        proto = cleaned

    opts = ort.SessionOptions()
    # The reference runs the graph as written: no fusions that change rounding.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        # onnx can write a newer IR version than onnxruntime reads; the IR version only gates
        # proto features, so the reference runs the same graph at the newest version it knows.
        m = re.search(r"max supported IR version: (\d+)", str(exc))
        if not m or proto.ir_version <= int(m.group(1)):
            raise
        older = onnx.ModelProto()
        older.CopyFrom(proto)
        older.ir_version = int(m.group(1))
        return ort.InferenceSession(older.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _with_all_outputs(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[str, str, str]]]:
    """The model with every node output of the main graph also a graph output (typed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    model = onnx.ModelProto()
    model.CopyFrom(inferred)
    existing = {o.name for o in model.graph.output}
    order = []
    for i, node in enumerate(model.graph.node):
        for out in node.output:
            if not out:
                continue
            order.append((out, node.name or f"{node.op_type}#{i}", node.op_type))
            if out not in existing and out in types and types[out].type.HasField("tensor_type"):
                model.graph.output.append(types[out])
                existing.add(out)
    return model, order


def _compile_outputs(model: OnnxModel, backend: Backend, shapes):
    """The model compiled as the user would for inference (no gradient program), its inputs and
    outputs kept in the file's dtypes (a float16 backend computes a float32 file in float16 and
    casts at the boundary), so they meet onnxruntime's."""
    from .compile import compile as ml_compile

    return ml_compile(model, backend, shapes=shapes, keep_io_types=True, inference=True)


def _compute_dtype(backend) -> np.dtype | None:
    """The float dtype ``backend`` computes in when it is not float32 (the tolerance follows it)."""
    dtype = getattr(backend, "dtype", None)
    numpy = getattr(dtype, "numpy", None)
    return np.dtype(numpy) if numpy is not None and np.dtype(numpy).name in TOLERANCES else None


def _isolated_node_error(proto: onnx.ModelProto, node: onnx.NodeProto, ref_values: dict, backend: Backend) -> float | None:
    """Run one node alone on onnxruntime and on the backend, fed onnxruntime's inputs."""
    from .compile import compile as ml_compile

    inputs = [n for n in node.input if n]
    if any(n not in ref_values for n in inputs):
        inits = {t.name for t in proto.graph.initializer}
        if any(n not in ref_values and n not in inits for n in inputs):
            return None
    feeds = {}
    graph_inputs = []
    initializers = []
    init_map = {t.name: t for t in proto.graph.initializer}
    for n in inputs:
        if n in ref_values:
            arr = np.asarray(ref_values[n])
            feeds[n] = arr
            graph_inputs.append(onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        else:
            initializers.append(init_map[n])
    outs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
    single = onnx.helper.make_model(
        onnx.helper.make_graph([node], "isolated", graph_inputs, outs, initializer=initializers),
        opset_imports=list(proto.opset_import), ir_version=proto.ir_version,
    )
    try:
        ref = _ort_session(single).run(None, feeds)
        pm = ml_compile(load_onnx(single), backend, keep_io_types=True, inference=True)
        got = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in feeds.items()})
    except Exception:
        return None
    errs = []
    for name, r in zip([o for o in node.output if o], ref):
        errs.append(compare(name, backend.name, backend.to_numpy(got[name]), r).max_abs_err)
    return max(errs) if errs else None


def _quiet(message: str) -> None:
    pass


def first_divergent_node(model: OnnxModel, backend: Backend, inputs: dict[str, np.ndarray],
                         rtol: float | None = None, atol: float | None = None,
                         progress: Callable[[str], None] | None = None) -> NodeReport | None:
    """Compare every intermediate value in topological order; return the first out of tolerance.
    ``progress`` receives a line per stage and per tenth of the nodes compared."""
    say = progress or _quiet
    proto = model.to_proto()
    full, order = _with_all_outputs(proto)
    say(f"{backend.name} per-node: onnxruntime computes all {len(order)} intermediate values")
    sess = _ort_session(full)
    names = [o.name for o in sess.get_outputs()]
    ref_values = dict(zip(names, sess.run(None, inputs)))
    ref_values.update(inputs)
    say(f"{backend.name} per-node: compiling {len(full.graph.node)} nodes with every value as an output")
    pm = _compile_outputs(load_onnx(full), backend, {k: v.shape for k, v in inputs.items()})
    say(f"{backend.name} per-node: running")
    got_values = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in inputs.items()})
    node_by_output = {o: n for n in full.graph.node for o in n.output}
    every = max(len(order) // 10, 1)
    for i, (out, label, op_type) in enumerate(order, 1):
        if i % every == 0:
            say(f"{backend.name} per-node: comparing value {i}/{len(order)}, node {label!r} ({op_type})")
        if out not in ref_values or out not in got_values:
            continue
        rep = compare(out, backend.name, backend.to_numpy(got_values[out]), ref_values[out], rtol, atol,
                      _compute_dtype(backend))
        if not rep.passed:
            say(f"{backend.name} per-node: node {label!r} ({op_type}) leaves tolerance; running it alone "
                "on onnxruntime's inputs")
            iso = _isolated_node_error(full, node_by_output[out], ref_values, backend)
            iso_rtol, iso_atol = tolerance_for(np.asarray(ref_values[out]).dtype, _compute_dtype(backend))
            scale = float(np.max(np.abs(ref_values[out]))) if np.asarray(ref_values[out]).size else 0.0
            local = iso is None or iso > (atol if atol is not None else iso_atol) + (rtol if rtol is not None else iso_rtol) * scale
            return NodeReport(label, op_type, out, rep.max_abs_err, rep.max_rel_err, iso, local)
    return None


@public_api(ValidationError, "validate")
def validate(model, backend: Backend | list[Backend], inputs: dict[str, Any] | None = None,
             shapes: dict[str, Any] | None = None, per_node: bool = False,
             rtol: float | None = None, atol: float | None = None, seed: int = 0,
             skip_unsupported: bool = False, progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Run ``model`` on ``backend`` (or several) and on onnxruntime with the same inputs.

    Inputs not given default to random data of each input's dtype and shape (``shapes`` fixes
    symbolic dims); a name in ``inputs`` or ``shapes`` that is not an input of the model, or a
    shape that contradicts the declared one, raises :class:`~mithril.errors.InputError`.
    Returns a :class:`ValidationReport`; ``report.passed`` is True when every output is within the
    per-dtype tolerance (``TOLERANCES``), or within ``rtol``/``atol`` when given. A backend whose
    dtype is float16, bfloat16 or float64 computes a float32 file in that dtype (the precision
    pass), its inputs and outputs kept float32 (``keep_io_types``), and is held to the tolerance
    of the coarser of the two dtypes.
    ``skip_unsupported``: a backend that cannot run the model (an op, dtype or domain it lacks) is
    listed in ``report.skipped`` with the reason and one that raises while running in
    ``report.errors``, and the other backends still run; without it the first error is raised.
    ``progress`` receives a line per stage (for a command line: per-node validation of a large
    model takes a while).
    """
    say = progress or _quiet
    loaded = load_onnx(model)
    backends = backend if isinstance(backend, (list, tuple)) else [backend]
    check_inputs(loaded, inputs, shapes)
    given = {k: np.asarray(v) for k, v in (inputs or {}).items()}
    inputs = {**given, **random_inputs(loaded, shapes, seed, given)}
    inputs = {name: inputs[name] for name in model_inputs(loaded)}
    proto = loaded.to_proto()
    say("onnxruntime: running the model")
    try:
        ref = _ort_session(proto).run(None, inputs)
    except Exception as exc:
        raise ValidationError(f"onnxruntime could not run the model: {exc}") from exc
    ref_by_name = dict(zip(loaded.output_names, ref))
    report = ValidationReport(loaded.source or loaded.graph.name or "model", inputs)
    for b in backends:
        label = b.name if isinstance(b, Backend) else repr(b)  # compile refuses a non-backend clearly
        try:
            say(f"{label}: compiling and running")
            pm = _compile_outputs(loaded, b, {k: v.shape for k, v in inputs.items()})
            got = pm.evaluate(None, {k: b.from_numpy(v) for k, v in inputs.items()})
            rows = [compare(name, b.name, b.to_numpy(got[name]), ref_by_name[name], rtol, atol, _compute_dtype(b))
                    for name in loaded.output_names]
            divergence = first_divergent_node(loaded, b, inputs, rtol, atol, progress) if per_node else None
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
            report.first_divergence[b.name] = divergence
    return report
