"""Reduce a model that fails on a backend to a few nodes that still fail the same way.

A model fails when an output leaves tolerance against the reference runner (onnxruntime unless
told otherwise), or when the backend raises while compiling or running it. :func:`reduce` shrinks
it in two bisections over the main graph in topological order, as Polygraphy's ``debug reduce``
does: from the outputs (the shortest prefix of nodes whose boundary values already fail: the
earliest failing value becomes the only output), then from the inputs (the longest cut whose
upstream values, computed by the reference and fed in as inputs, still leave a failing
remainder). A local kernel error ends as one node; drift as a short chain.

>>> import mithril as ml                                                    # doctest: +SKIP
>>> r = ml.reduce("model.onnx", "numpy", out="model.reduced.onnx")          # doctest: +SKIP
>>> print(r)                                                                # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .array_files import save_arrays
from .errors import NodeError, UnsupportedDomainError, UnsupportedOpsError, ValidationError, public_api
from .onnx_bridge.check import outer_reads
from .onnx_bridge.load import load_onnx
from .runners import Runner, parse_runner
from .validate import check_inputs, compare, model_inputs, random_inputs

# An integer or bool value cut from upstream with at most this many elements is written as an
# initializer, not an input: it is a shape or an index, and backends want shapes known at compile.
SMALL_INTEGER_VALUE = 64


@dataclass
class Failure:
    """How a model fails: ``kind`` is ``"error"`` (the backend raised ``error``, naming ``ops``)
    or ``"numeric"`` (value ``output`` is out of tolerance: ``max_abs_err`` against
    ``atol + rtol * |reference|``)."""

    kind: str
    message: str = ""
    error: str = ""
    ops: frozenset = frozenset()
    output: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0

    def describe(self) -> str:
        if self.kind == "error":
            text = " ".join(line.strip() for line in self.message.splitlines())
            return f"raises {self.error}: {text[:300]}{'...' if len(text) > 300 else ''}"
        note = f" ({self.message})" if self.message else ""
        return (f"output {self.output!r} out of tolerance: max abs err {self.max_abs_err:.3g}, max rel err "
                f"{self.max_rel_err:.3g} (rtol {self.rtol:g}, atol {self.atol:g}){note}")

    def same_as(self, other: Failure) -> bool:
        """``other`` fails the way this one does: out of tolerance both, or the same error class
        naming ops this one named (any, when this one named none)."""
        if self.kind != other.kind:
            return False
        if self.kind == "numeric":
            return True
        return self.error == other.error and (not self.ops or bool(other.ops) and other.ops <= self.ops)


@dataclass
class ReduceResult:
    """What :func:`reduce` found. ``failed`` is False when the model does not fail at all (then
    there is no ``model``). ``failure`` is how the whole model failed, ``reduced_failure`` how the
    reduced one does on its own; ``model`` the reduced ModelProto and ``inputs`` its inputs by name;
    ``kept`` the (node, op type) pairs it keeps, ``removed`` the op types it dropped with counts;
    ``path`` and ``inputs_path`` the files written (None when no ``out`` was given)."""

    backend: str
    reference: str
    failed: bool
    failure: Failure | None = None
    reduced_failure: Failure | None = None
    model: onnx.ModelProto | None = None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    kept: list[tuple[str, str]] = field(default_factory=list)
    original_nodes: int = 0
    removed: Counter = field(default_factory=Counter)
    path: str | None = None
    inputs_path: str | None = None

    def __str__(self) -> str:
        if not self.failed:
            return f"{self.backend} against {self.reference}: the model does not fail (every output within tolerance)"
        lines = [f"{self.backend} against {self.reference}: the model {self.failure.describe()}",
                 f"reduced {self.original_nodes} nodes to {len(self.kept)}: "
                 + ", ".join(f"{label} ({op})" for label, op in self.kept)]
        if self.removed:
            lines.append(f"removed {sum(self.removed.values())} nodes: "
                         + ", ".join(f"{op} x{n}" for op, n in self.removed.most_common()))
        lines.append("the reduced model " + (self.reduced_failure.describe() if self.reduced_failure
                                             else "does NOT fail on its own"))
        if self.path:
            lines.append(f"wrote {self.path} and its inputs {self.inputs_path}")
        return "\n".join(lines)


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        yield from attr.graphs


def _error_ops(exc: BaseException) -> frozenset:
    """The op types an error names (a node error's op; every op an unsupported-ops error lists)."""
    if isinstance(exc, NodeError) and exc.op_type:
        return frozenset([exc.op_type])
    if isinstance(exc, UnsupportedOpsError):
        return frozenset(op for _, op, _ in exc.missing)
    if isinstance(exc, UnsupportedDomainError):
        return frozenset(op for _, _, op in exc.nodes)
    return frozenset()


def _value_info(name: str, arr) -> onnx.ValueInfoProto:
    arr = np.asarray(arr)
    elem = onnx.TensorProto.STRING if arr.dtype.kind in "OUS" else helper.np_dtype_to_tensor_dtype(arr.dtype)
    return helper.make_tensor_value_info(name, elem, arr.shape)


class _Graph:
    """The main graph in topological order: what each node reads (its subgraphs' outer-scope reads
    included, so If/Loop/Scan are one node each), who produces each value, which nodes compute
    only from constants."""

    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        g = proto.graph
        self.nodes = list(g.node)
        self.labels = [n.name or f"{n.op_type}#{i}" for i, n in enumerate(self.nodes)]
        self.inits = {t.name: t for t in g.initializer}
        self.outputs = [v.name for v in g.output]
        self.reads = []
        for n in self.nodes:
            r = {x for x in n.input if x}
            for sub in _subgraphs(n):
                r |= outer_reads(sub)
            self.reads.append(r)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        # Last reader of each value (len(nodes) for a graph output): a prefix's boundary values.
        self.last_use: dict[str, int] = {}
        for i, r in enumerate(self.reads):
            for x in r:
                self.last_use[x] = i
        for o in self.outputs:
            self.last_use[o] = len(self.nodes)
        constant: set[str] = set(self.inits)
        self.constant_nodes = set()
        for i, n in enumerate(self.nodes):
            if self.reads[i] <= constant and not _nondeterministic(n):
                self.constant_nodes.add(i)
                constant.update(o for o in n.output if o)

    def needed(self, targets: Iterable[str], among: Iterable[int]) -> list[int]:
        """The nodes of ``among`` that ``targets`` depend on, walking back through ``among`` only."""
        want = set(targets)
        keep = []
        for i in sorted(among, reverse=True):
            if any(o in want for o in self.nodes[i].output):
                keep.append(i)
                want |= self.reads[i]
        return sorted(keep)

    def boundary(self, k: int) -> list[str]:
        """Values the first ``k`` nodes make that later nodes read or the graph outputs, in order."""
        return [o for i in range(k) for o in self.nodes[i].output if o and self.last_use.get(o, -1) >= k]

    def free_reads(self, idx: list[int]) -> list[str]:
        """Values the nodes ``idx`` read but neither make nor hold as initializers, first read first."""
        made = {o for i in idx for o in self.nodes[i].output}
        seen = []
        for i in idx:
            for x in sorted(self.reads[i]):
                if x not in made and x not in self.inits and x not in seen:
                    seen.append(x)
        return seen

    def model(self, idx: list[int], inputs: dict[str, np.ndarray], outputs: list[str],
              constants: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
        """The nodes ``idx`` as a model fed ``inputs`` (typed from the arrays), with ``constants``
        as initializers beside the original ones they read, and ``outputs`` (untyped). Opset
        imports, IR version and model-local functions are the original's."""
        constants = constants or {}
        reads = set().union(*(self.reads[i] for i in idx)) if idx else set()
        inits = [self.inits[n] for n in self.inits if n in reads and n not in constants]
        inits += [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()]
        outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
        graph = helper.make_graph([self.nodes[i] for i in idx], f"{self.proto.graph.name or 'graph'}_reduced",
                                  [_value_info(k, v) for k, v in inputs.items()], outs, initializer=inits)
        return helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                                 ir_version=self.proto.ir_version, functions=list(self.proto.functions),
                                 producer_name="mithril reduce")


def _type_outputs(model: onnx.ModelProto, reference: Runner, feeds: dict) -> None:
    """Declare the outputs' types: from the reference's values, else from ONNX shape inference,
    else (an op nothing knows, the reference cannot run it) its first input's type, a guess."""
    outputs = [o.name for o in model.graph.output]
    try:
        values = reference.run(model, feeds, outputs)
    except Exception:  # noqa: BLE001
        values = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        known = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)
                 if v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape")}
    except Exception:  # noqa: BLE001
        known = {}
    types = {v.name: v.type for v in model.graph.input}
    types.update({t.name: helper.make_tensor_type_proto(t.data_type, t.dims) for t in model.graph.initializer})
    types.update(known)
    for node in model.graph.node:
        first = types.get(next((x for x in node.input if x), ""))
        types.update({o: first for o in node.output if o not in types and first is not None})
    for i, name in enumerate(outputs):
        if isinstance(values.get(name), np.ndarray):
            model.graph.output[i].CopyFrom(_value_info(name, values[name]))
        elif name in types:
            model.graph.output[i].CopyFrom(helper.make_value_info(name, types[name]))


def _nondeterministic(node: onnx.NodeProto) -> bool:
    return node.op_type.startswith("Random") or node.op_type in ("Bernoulli", "Multinomial")


class _Reducer:
    def __init__(self, graph: _Graph, backend: Runner, reference: Runner, inputs: dict[str, np.ndarray],
                 rtol, atol, say: Callable[[str], None]):
        self.g = graph
        self.backend = backend
        self.reference = reference
        self.inputs = inputs
        self.rtol = rtol
        self.atol = atol
        self.say = say
        self.failure: Failure | None = None

    def outcome(self, model: onnx.ModelProto, feeds: dict, outputs: list[str], strict: bool = False) -> Failure | None:
        """How ``model`` fails on ``feeds`` (None: it does not): the backend's error, else the first
        of ``outputs`` out of tolerance (not looked at when reducing an error). The reference
        failing is no failure of the backend's, or with ``strict`` a ValidationError."""
        try:
            got = self.backend.run(model, feeds, outputs)
        except Exception as exc:  # noqa: BLE001  (any error of the backend is what is reduced)
            return Failure("error", str(exc), type(exc).__name__, _error_ops(exc))
        if self.failure is not None and self.failure.kind == "error":
            return None
        try:
            ref = self.reference.run(model, feeds, outputs)
        except Exception as exc:  # noqa: BLE001
            if strict:
                raise ValidationError(f"the reference {self.reference.name} cannot run the model: {exc}") from exc
            return None
        for name in outputs:
            try:
                rep = compare(name, self.backend.name, got[name], ref[name], self.rtol, self.atol, self.backend.compute)
            except (ValueError, TypeError):  # a sequence or map value: not compared here
                continue
            if not rep.passed:
                return Failure("numeric", rep.note, output=name, max_abs_err=rep.max_abs_err,
                               max_rel_err=rep.max_rel_err, rtol=rep.rtol, atol=rep.atol)
        return None

    def fails(self, model, feeds, outputs) -> Failure | None:
        f = self.outcome(model, feeds, outputs)
        return f if f is not None and self.failure.same_as(f) else None

    def _feeds(self, idx: list[int]) -> dict[str, np.ndarray]:
        free = set(self.g.free_reads(idx))
        return {k: v for k, v in self.inputs.items() if k in free}

    def prefix(self, k: int) -> Failure | None:
        """Whether the first ``k`` nodes fail, their boundary values marked as outputs."""
        outs = self.g.boundary(k)
        idx = self.g.needed(outs, range(k))
        return self.fails(self.g.model(idx, self._feeds(idx), outs), self._feeds(idx), outs)

    def from_outputs(self) -> tuple[int, list[str]]:
        """Bisect for the shortest failing prefix; returns its length and the values to keep."""
        lo, hi = 0, len(self.g.nodes)
        hi_failure = self.failure
        while hi - lo > 1:
            mid = (lo + hi) // 2
            f = self.prefix(mid)
            self.say(f"from the outputs: the first {mid} nodes {'fail' if f else 'pass'}")
            if f:
                hi, hi_failure = mid, f
            else:
                lo = mid
        node = self.g.nodes[hi - 1]
        if self.failure.kind == "numeric" and hi_failure.output:
            return hi, [hi_failure.output]
        return hi, [o for o in node.output if o]

    def cut(self, order: list[int], j: int, targets: list[str], typed: bool = False):
        """The nodes of ``order`` from position ``j`` that ``targets`` need, fed the reference's
        values of what they read from before ``j``: (model, its feeds, the nodes kept), or None
        when the reference cannot compute those values."""
        keep = self.g.needed(targets, order[j:])
        free = self.g.free_reads(keep)
        upstream = [v for v in free if v in self.g.producer]
        values: dict[str, Any] = {}
        if upstream:
            before = self.g.needed(upstream, order[:j])
            try:
                values = self.reference.run(self.g.model(before, self._feeds(before), upstream),
                                            self._feeds(before), upstream)
            except Exception:  # noqa: BLE001  (a cut the reference cannot compute is not taken)
                return None
        feeds, constants = {}, {}
        for v in free:
            if v not in self.g.producer:
                feeds[v] = self.inputs[v]
                continue
            arr = values[v]
            if not isinstance(arr, np.ndarray):
                return None
            small = arr.dtype.kind in "biu" and arr.size <= SMALL_INTEGER_VALUE
            (constants if self.g.producer[v] in self.g.constant_nodes or small else feeds)[v] = arr
        model = self.g.model(keep, feeds, targets, constants)
        if typed:  # the written file declares its outputs' types (onnx.checker's full check wants them)
            _type_outputs(model, self.reference, feeds)
        return model, feeds, keep

    def from_inputs(self, hi: int, targets: list[str]) -> tuple[list[int], int]:
        """Bisect for the latest cut whose remainder still fails: the order of the nodes the
        targets need and the cut's position in it."""
        needed = self.g.needed(targets, range(hi))
        makers = {self.g.producer[t] for t in targets if t in self.g.producer}
        # Constant computations first, so a cut past them turns them into initializers.
        order = ([i for i in needed if i in self.g.constant_nodes and i not in makers]
                 + [i for i in needed if i not in self.g.constant_nodes or i in makers])

        def fails_at(j: int) -> bool:
            built = self.cut(order, j, targets)
            f = built is not None and self.fails(built[0], built[1], targets)
            kept = f"{len(built[2])} nodes" if built else "a cut the reference cannot compute"
            self.say(f"from the inputs: cut before node {j + 1} of {len(order)}, {kept}: {'fail' if f else 'pass'}")
            return bool(f)

        lo, hi = 0, len(order) - 1
        if fails_at(hi):
            return order, hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails_at(mid):
                lo = mid
            else:
                hi = mid
        return order, lo


@public_api(ValidationError, "reduce")
def reduce(model, backend, reference=None, inputs: dict[str, Any] | None = None,
           shapes: dict[str, Any] | None = None, rtol: float | None = None, atol: float | None = None,
           out: str | Path | None = None, seed: int = 0,
           progress: Callable[[str], None] | None = None) -> ReduceResult:
    """Shrink ``model``, which fails on ``backend`` against ``reference``, to a few nodes that fail
    the same way on their own.

    ``backend`` and ``reference`` are runners as :func:`mithril.runners.parse_runner` takes them:
    a spec (``"numpy"``, ``"torch:dtype=bfloat16"``, ``"onnxruntime"``), a Backend or a Runner;
    ``reference`` defaults to onnxruntime. Inputs not given are random (``shapes`` fixes symbolic
    dims), as in :func:`mithril.validate`; ``rtol``/``atol`` override the per-dtype tolerance.
    The model fails when an output is out of tolerance or when the backend raises; the reduced
    model then has one output out of tolerance, or raises the same error class naming the same op.

    Returns a :class:`ReduceResult` (``failed`` False when the model does not fail). With ``out``
    it writes the reduced model there (checked by ``onnx.checker`` with ``full_check``) and its
    inputs beside it, ``out`` with the suffix ``.npz``, as ``validate --save-inputs`` writes them
    (:func:`mithril.array_files.load_arrays` reads them; so does ``validate --load-inputs``).
    ``progress`` receives a line per step of the two bisections.
    """
    say = progress or (lambda message: None)
    loaded = load_onnx(model)
    check_inputs(loaded, inputs, shapes)
    given = {k: np.asarray(v) for k, v in (inputs or {}).items()}
    feeds = {**given, **random_inputs(loaded, shapes, seed, given)}
    feeds = {name: feeds[name] for name in model_inputs(loaded)}
    b, r = parse_runner(backend), parse_runner(reference)
    g = _Graph(loaded.to_proto())
    result = ReduceResult(b.name, r.name, False, original_nodes=len(g.nodes))
    red = _Reducer(g, b, r, feeds, rtol, atol, say)
    say(f"{b.name} and {r.name}: running the whole model ({len(g.nodes)} nodes)")
    red.failure = red.outcome(g.proto, feeds, g.outputs, strict=True)
    if red.failure is None:
        return result
    result.failed, result.failure = True, red.failure
    say(f"the model {red.failure.describe()}")
    if not g.nodes:
        raise ValidationError("the model fails with no node in its graph: nothing to reduce")

    hi, targets = red.from_outputs()
    say(f"from the outputs: the failure shows at node {g.labels[hi - 1]!r} ({g.nodes[hi - 1].op_type}); "
        f"keeping {', '.join(targets)}")
    order, j = red.from_inputs(hi, targets)
    built = red.cut(order, j, targets, typed=True)
    if built is None:  # the reference could not compute the cut it accepted a moment ago
        raise ValidationError("the reference failed on the reduced model's upstream values")
    reduced, reduced_feeds, keep = built
    onnx.checker.check_model(reduced, full_check=True)
    result.model, result.inputs = reduced, reduced_feeds
    result.kept = [(g.labels[i], g.nodes[i].op_type) for i in keep]
    result.removed = Counter(n.op_type for n in g.nodes) - Counter(op for _, op in result.kept)
    result.reduced_failure = red.fails(reduced, reduced_feeds, targets)
    if out is not None:
        path = Path(out)
        onnx.save(reduced, str(path))
        npz = path.with_suffix(".npz")
        save_arrays(npz, reduced_feeds)
        result.path, result.inputs_path = str(path), str(npz)
    return result
