"""Export a logical Model to ONNX: flatten the block tree, then let each primitive emit nodes.

Names are stable: a value named by the user keeps its name (prefixed by the path of the submodel
it lives in); an unnamed one is ``<block path>.<terminal>`` of the terminal that created it, e.g.
``mlp.linear_1.weight``. The same names appear in ``ml.compile``'s parameters and in the export.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes as _dtypes
from ..backends.table import array_backend
from ..errors import MissingShapeError, ModelError, ShapeMismatchError, UnconnectedInputError, CycleError
from . import shapes as S
from .shapes import Conflict, Dim, ShapeNode

if TYPE_CHECKING:  # model.py imports this module to export (Model.to_onnx_model)
    from .model import Model, Primitive, Wire

MIN_OPSET = 17
FALLBACK_OPSET = 21


class RandomParamsWarning(UserWarning):
    """export_onnx was given no value for some parameters and wrote random ones."""


@functools.lru_cache(maxsize=None)
def default_opset() -> int:
    """The newest ai.onnx opset the installed onnxruntime loads (21 without onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return min(FALLBACK_OPSET, onnx.defs.onnx_opset_version())
    for opset in range(onnx.defs.onnx_opset_version(), MIN_OPSET - 1, -1):
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        proto = _make_model(graph, opset)
        try:
            ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            return opset
        except Exception:
            continue
    return MIN_OPSET


def _make_model(graph, opset: int, domains: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """The model of ``graph``, importing ai.onnx at ``opset`` and each custom domain at its version."""
    opsets = [helper.make_opsetid("", opset)]
    ir_version = helper.find_min_ir_version_for(opsets)  # custom domains need none newer
    opsets += [helper.make_opsetid(d, v) for d, v in sorted((domains or {}).items())]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version,
                             producer_name="mithril")


def np_dtype_of(wire: Wire, float_dtype=np.float32) -> np.dtype:
    """The NumPy dtype a wire exports with; ``float_dtype`` for a float nobody fixed."""
    t = wire.type.root().value
    if isinstance(t, _dtypes.DType):
        return t.numpy
    if t is bool:
        return np.dtype(bool)
    if t is int or (t is None and wire.value is not None and np.asarray(wire.value).dtype.kind in "iu"):
        return np.dtype(np.int64)
    return np.dtype(float_dtype)


# -- the emitter handed to Primitive.lower ------------------------------------------------------
class Emitter:
    """Builds ONNX nodes for one graph; ``op`` returns output value names."""

    def __init__(self, opset: int, float_dtype=np.float32):
        self.opset = opset
        self.float_dtype = np.dtype(float_dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.dtypes: dict[str, np.dtype] = {}
        # Custom domains the nodes use (ml.CustomOp) -> the version the model imports.
        self.domains: dict[str, int] = {}
        self._count = 0
        self.scope = ""

    def _fresh(self, base: str) -> str:
        self._count += 1
        return f"{self.scope}/{base}_{self._count}"

    def dtype(self, name: str) -> np.dtype:
        return self.dtypes[name]

    def op(self, op_type: str, *inputs, outputs: int = 1, dtype=None, domain: str = "", domain_version: int = 1,
           **attrs):
        """Emit one node; attributes with value None are left out (the schema default applies).
        A node of another ``domain`` than ai.onnx imports it at ``domain_version``."""
        names = [self._fresh(op_type) for _ in range(outputs)]
        if domain:
            self.domains[domain] = max(self.domains.get(domain, 1), int(domain_version))
        attrs = {k: v for k, v in attrs.items() if v is not None}
        inputs = list(inputs)
        while inputs and inputs[-1] is None:  # trailing missing optionals are left out (onnxruntime
            inputs.pop()                      # crashes on LayerNormalization(x, scale, ""))
        ins = ["" if i is None else i for i in inputs]
        self.nodes.append(helper.make_node(op_type, ins, names, name=self._fresh(op_type + "_node"),
                                           domain=domain or None, **attrs))
        out_dtype = np.dtype(dtype) if dtype is not None else next(
            (self.dtypes[i] for i in ins if i in self.dtypes), self.float_dtype)
        for n in names:
            self.dtypes[n] = out_dtype
        return names[0] if outputs == 1 else tuple(names)

    def const(self, value, dtype=None, like: str | None = None) -> str:
        if dtype is None and like is not None:
            dtype = self.dtypes[like]
        arr = np.asarray(value, dtype=dtype)
        name = self._fresh("const")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name + "_node",
                                           value=numpy_helper.from_array(arr, name)))
        self.dtypes[name] = arr.dtype
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def reduce(self, op_type: str, x: str, axes, keepdims: bool) -> str:
        """Reduce* with axes as an attribute before opset 18 (ReduceSum: 13) and an input after."""
        as_input = self.opset >= (13 if op_type == "ReduceSum" else 18)
        if axes is None:
            return self.op(op_type, x, keepdims=int(keepdims))
        axes = [int(a) for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
        if as_input:
            return self.op(op_type, x, self.ints(axes), keepdims=int(keepdims))
        return self.op(op_type, x, axes=axes, keepdims=int(keepdims))


# -- flattening ---------------------------------------------------------------------------------
class Flat:
    """A model's block tree flattened: primitives in order, each terminal mapped to a root value."""

    def __init__(self, model: Model):
        self.model = model
        self.names: dict[int, str] = {}  # id(outer wire) -> value name
        self.wires: dict[int, Wire] = {}
        self.prims: list[tuple[str, Primitive, dict[str, Wire]]] = []
        self.producer: dict[int, tuple[str, Primitive, str]] = {}
        self._walk(model, "", {})
        seen: dict[str, Wire] = {}
        for key, name in self.names.items():
            if name in seen:
                raise ModelError(f"model {model.name or 'model'!r}: two values are named {name!r}; rename one")
            seen[name] = self.wires[key]
        for path, prim, wires in self.prims:
            for port, w in wires.items():
                if not prim._ports[port].is_input:
                    self.producer[id(w)] = (path, prim, port)

    def _walk(self, m: Model, prefix: str, env: dict[int, Wire]) -> None:
        alias: dict[int, Wire] = {}
        for w in m._wires:
            if id(w) in env:
                alias[id(w)] = env[id(w)]
            else:
                alias[id(w)] = w
                self.names[id(w)] = prefix + w.key
                self.wires[id(w)] = w
        for b in m._blocks:
            bound = {p: alias[id(m._bindings[(b, p)])] for p in m._child_ports[b]
                     if (b, p) in m._bindings}
            if b.composite:
                inner = b._frozen_wires or {}
                self._walk(b, prefix + b.name + ".", {id(inner[p]): w for p, w in bound.items()})
            else:
                self.prims.append((prefix + b.name, b, bound))

    def name(self, wire: Wire) -> str:
        return self.names[id(wire)]

    def ordered(self) -> list[tuple[str, Primitive, dict[str, Wire]]]:
        """Primitives in dependency order (insertion order where free)."""
        done: set[int] = set()
        out = []
        pending = list(self.prims)
        while pending:
            rest = []
            for item in pending:
                _, prim, wires = item
                ready = all(id(w) in done or id(w) not in self.producer
                            for p, w in wires.items() if prim._ports[p].is_input)
                if ready:
                    out.append(item)
                    done.update(id(w) for p, w in wires.items() if not prim._ports[p].is_input)
                else:
                    rest.append(item)
            if len(rest) == len(pending):
                raise CycleError(f"model {self.model.name or 'model'!r}: blocks "
                                 f"{[p for p, _, _ in rest]} depend on each other's outputs")
            pending = rest
        return out


# -- specialization on a copy -------------------------------------------------------------------
def buffer_updates(model: Model) -> dict[str, str]:
    """Buffers of ``model`` (values a training step overwrites rather than trains, e.g. BatchNorm2D's
    running statistics) by their value name, each mapped to the value name of its update (the
    output a training-mode block computes for it), or to None where the block is in inference mode.

    Exclude the keys from ``trainable_keys``; after each step, copy each update into its buffer.
    """
    flat = Flat(model)
    out = {}
    for _, prim, wires in flat.prims:
        for buf, update in getattr(prim, "buffers", {}).items():
            if buf in wires:
                out[flat.name(wires[buf])] = flat.name(wires[update]) if update in wires else None
    return out


def _specialized(model: Model, shapes: Mapping | None, dynamic: Mapping[str, Mapping[int, str]] | None) -> Model:
    """A deep copy of ``model`` with input shapes applied (dynamic axes kept symbolic)."""
    work = copy.deepcopy(model)
    label = work._label()
    roots = {w.name: w for w in work.external()[0] if w.name is not None}
    for name in dynamic or {}:
        if name not in work._named:
            raise ModelError(f"{label}: dynamic_axes names {name!r}, which is not a connection of the model")
    with S.transaction():
        for name, dims in (shapes or {}).items():
            if name not in roots:
                raise ShapeMismatchError(f"{label}: shapes names {name!r}, which is not an input of the model "
                                         f"(inputs: {sorted(roots)})")
            dims = list(dims)
            axes = dict((dynamic or {}).get(name, {}))
            node = ShapeNode([Dim(symbol=axes[i], user=True) if i in axes or i - len(dims) in axes
                              else Dim(int(d)) for i, d in enumerate(dims)])
            work._unify_shape(roots[name].shape, node, repr(name), "", "the given shape", "")
        for name, axes in (dynamic or {}).items():
            wire = work._named[name]
            dims = wire.shape.dims()
            if dims is None:
                continue
            for axis, sym in axes.items():
                d = dims[axis].root()
                if d.value is not None and name not in (shapes or {}):
                    raise ShapeMismatchError(f"{label}: dynamic axis {axis} of {name!r} is fixed to {d.value}")
                if d.symbol is None or not d.user:
                    S.tracked_setattr(d, "symbol", sym)
                    S.tracked_setattr(d, "user", True)
        work._solve()
    return work


def _normalize_dynamic(dynamic_axes) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for name, axes in (dynamic_axes or {}).items():
        if isinstance(axes, Mapping):
            out[name] = {int(a): str(s) for a, s in axes.items()}
        else:
            out[name] = {int(a): f"{name}_dim{int(a)}" for a in axes}
    return out


def to_numpy(value) -> np.ndarray:
    """Any backend's array as a NumPy array."""
    return np.asarray(array_backend(value).to_numpy(value))


def _init_param(wire: Wire, shape: tuple[int, ...], dtype: np.dtype, rng) -> np.ndarray:
    if isinstance(wire.init, np.ndarray):
        return wire.init.astype(dtype, copy=False)
    if wire.init == "zeros":
        return np.zeros(shape, dtype)
    if wire.init == "ones":
        return np.ones(shape, dtype)
    fan_in = int(np.prod(shape[1:])) if len(shape) >= 2 else max(int(np.prod(shape)), 1)
    return (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(dtype)


def _value_info(name: str, wire: Wire, dtype: np.dtype, dim_names: dict[int, str]):
    dims = wire.shape.dims()
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    if dims is None:
        return helper.make_tensor_value_info(name, elem, None)
    shape = []
    for axis, d in enumerate(dims):
        d = d.root()
        if d.value is not None:
            shape.append(d.value)
        else:
            if id(d) not in dim_names:
                base = d.symbol if d.user and d.symbol else f"{name}_dim{axis}"
                while base in dim_names.values():
                    base += "_"
                dim_names[id(d)] = base
            shape.append(dim_names[id(d)])
    return helper.make_tensor_value_info(name, elem, shape)


def build_onnx(model: Model, shapes=None, params=None, opset: int | None = None, dynamic_axes=None,
               warn_random: bool = False, dtype=None) -> tuple[onnx.ModelProto, list[str]]:
    """The ONNX ModelProto of ``model`` and the names of parameters given random values.

    ``dtype`` (an ml dtype, default float32) is the type of every float nobody fixed: ``ml.compile``
    passes the backend's, so ``NumpyBackend(dtype=ml.float64)`` runs the model in float64."""
    fdt = np.dtype(np.float32) if dtype is None else _dtypes.as_dtype(dtype).numpy
    opset = default_opset() if opset is None else int(opset)
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ModelError(f"opset {opset} is outside what the frontend exports ({MIN_OPSET}..{newest})")
    label = model._label()
    dynamic = _normalize_dynamic(dynamic_axes)
    decl = _specialized(model, shapes, dynamic)
    full = _specialized(model, shapes, None) if dynamic else decl
    flat, flat_full = Flat(decl), Flat(full)
    full_by_name = {flat_full.names[k]: w for k, w in flat_full.wires.items()}

    inputs_decl, outputs_decl = decl.external()
    root_outputs = outputs_decl
    if not root_outputs:
        raise ModelError(f"{label} has no outputs: name one (output='output') or call set_outputs")
    consumers: dict[int, tuple[str, str]] = {}
    for path, prim, wires in flat.prims:
        for port, w in wires.items():
            if prim._ports[port].is_input:
                consumers.setdefault(id(w), (path, port))

    g = Emitter(opset, fdt)
    graph_inputs, initializers = [], []
    dim_names: dict[int, str] = {}
    rng = np.random.default_rng(0)
    params = dict(params or {})
    random_names: list[str] = []
    used_params: set[str] = set()
    for key, wire in flat.wires.items():
        if key in flat.producer:
            continue
        name = flat.names[key]
        dtype = np_dtype_of(wire, fdt)
        g.dtypes[name] = dtype
        if wire.value is not None:
            arr = np.asarray(wire.value, dtype=dtype)
            g.nodes.append(helper.make_node("Constant", [], [name], name=name + "/const",
                                            value=numpy_helper.from_array(arr, name)))
        elif wire.param:
            shape = full_by_name[name].shape.static()
            if shape is None:
                where = consumers.get(key, ("?", "?"))
                unknown = [w.key for w in inputs_decl if not w.param and w.shape.static() is None]
                raise MissingShapeError(
                    f"{label}: parameter {name!r} (terminal {where[0]}.{where[1]}) has shape "
                    f"{S.Namer().shape(full_by_name[name].shape)}, which is not fully known; give the shapes of "
                    f"the inputs it depends on, e.g. shapes={{{', '.join(repr(u) + ': [...]' for u in unknown)}}}")
            if name in params:
                arr = to_numpy(params[name])
                used_params.add(name)
                if tuple(arr.shape) != shape:
                    raise ShapeMismatchError(f"{label}: parameter {name!r} should have shape {list(shape)} "
                                             f"but the value given has {list(arr.shape)}")
                arr = arr.astype(dtype, copy=False)
            else:
                arr = _init_param(wire, shape, dtype, rng)
                if not isinstance(wire.init, np.ndarray):
                    random_names.append(name)
            initializers.append(numpy_helper.from_array(arr, name))
        elif wire.model is decl and wire.name is not None:
            graph_inputs.append(_value_info(name, wire, dtype, dim_names))
        else:
            where = consumers.get(key, (wire.origin[0].name, wire.origin[1]))
            raise UnconnectedInputError(
                f"{label}: input terminal {where[0]}.{where[1]} is not connected; bind it to a name "
                f"(e.g. {where[1]}='input') or to another block's output")
    unknown = sorted(set(params) - used_params)
    if unknown:
        raise ModelError(f"{label}: params names {unknown}, which are not parameters of the model")
    if warn_random and random_names:
        warnings.warn(f"export_onnx: no values given for {len(random_names)} parameter(s) "
                      f"({', '.join(random_names[:5])}{'...' if len(random_names) > 5 else ''}); "
                      f"wrote freshly randomized ones (seed 0)", RandomParamsWarning, stacklevel=4)

    value_infos: list[onnx.ValueInfoProto] = []
    output_ids = {id(w) for w in root_outputs}
    for path, prim, wires in flat.ordered():
        g.scope = path
        ins = {p: flat.name(w) for p, w in wires.items() if prim._ports[p].is_input}
        for p, port in prim._ports.items():
            if port.is_input and p not in ins:
                ins[p] = None
        start = len(g.nodes)
        try:
            result = prim.lower(g, **ins)
        except Conflict as exc:
            raise ModelError(f"{label}: cannot export {path} ({type(prim).__name__}): {exc}") from None
        outs = [p for p, port in prim._ports.items() if not port.is_input]
        result = (result,) if isinstance(result, str) else tuple(result)
        rename: dict[str, str] = {}
        for p, tmp in zip(outs, result):
            if p not in wires:
                continue
            want = flat.name(wires[p])
            produced_here = any(tmp in n.output for n in g.nodes[start:])
            if produced_here and tmp not in rename:
                rename[tmp] = want
            else:
                g.op("Identity", tmp)
                rename[g.nodes[-1].output[0]] = want
                start = min(start, len(g.nodes) - 1)
            g.dtypes[want] = np_dtype_of(wires[p], fdt)
        for node in g.nodes[start:]:
            node.output[:] = [rename.get(o, o) for o in node.output]
            node.input[:] = [rename.get(i, i) for i in node.input]
        if any(n.domain for n in g.nodes[start:]):
            # ONNX cannot infer a custom op's outputs: declare what the block's shape rule knows.
            value_infos.extend(_value_info(flat.name(wires[p]), wires[p], np_dtype_of(wires[p], fdt), dim_names)
                               for p in outs if p in wires and id(wires[p]) not in output_ids)

    outputs = [_value_info(flat.name(w), w, np_dtype_of(w, fdt), dim_names) for w in root_outputs]
    graph = helper.make_graph(g.nodes, model.name or "model", graph_inputs, outputs, initializer=initializers,
                              value_info=value_infos)
    return _make_model(graph, opset, g.domains), random_names
