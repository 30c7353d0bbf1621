"""An imported ONNX model as a block of a logical Model.

The block's terminals are the graph's inputs and outputs (declared shapes, symbolic dims kept as
symbols shared inside the block, so a batch dim flows from input to output) and its floating-point
initializers, which become trainable parameters named ``<block path>.<initializer name>``. Export
copies the graph's nodes (subgraphs too) with every value name prefixed by the block's path.

>>> import mithril as ml, numpy as np
>>> from onnx import helper, numpy_helper, TensorProto
>>> from mithril.models import Model, Linear
>>> g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
...     [numpy_helper.from_array(np.ones((3, 5), np.float32), "W")])
>>> backbone = ml.load_onnx(helper.make_model(g))
>>> m = Model()
>>> m |= OnnxBlock(backbone, name="backbone")(x="input", y="features")
>>> m += Linear(dimension=2)(output="output")
>>> m.shape_of("output")
'[N, 2]'
>>> sorted(m.backbone.pretrained_params())
['backbone.W']
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes as _dtypes
from ..dtypes import is_floating_np, np_dtype_of_onnx
from ..errors import ModelError
from ..onnx_bridge.load import OnnxModel, load_onnx
from .block import register
from .model import In, Out, Param, Primitive, ShapeView


def _template(value_info: onnx.ValueInfoProto):
    """A port shape template from a declared type: ints fixed, dim_params shared symbols."""
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            # A symbol shared by the block's terminals; "..." would read as a variadic in templates.
            dims.append(d.dim_param if not d.dim_param.startswith("...") else "_" + d.dim_param)
        else:
            dims.append(None)
    return dims


def _port_type(value_info: onnx.ValueInfoProto):
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.elem_type:
        return None
    return _dtypes.as_dtype(np_dtype_of_onnx(t.tensor_type.elem_type))


def _rename_graph(graph: onnx.GraphProto, rename) -> None:
    """Rename every value (and node) of ``graph`` and its subgraphs in place."""
    for vi in (*graph.input, *graph.output, *graph.value_info):
        vi.name = rename(vi.name)
    for init in graph.initializer:
        init.name = rename(init.name)
    for node in graph.node:
        node.input[:] = [rename(i) for i in node.input]
        node.output[:] = [rename(o) for o in node.output]
        if node.name:
            node.name = rename(node.name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_graph(attr.g, rename)
            for sub in attr.graphs:
                _rename_graph(sub, rename)


@register
class OnnxBlock(Primitive):
    """A loaded ONNX model (``ml.load_onnx``) used as a block.

    Terminals: one per graph input and output, by its ONNX name, and one trainable parameter per
    floating-point initializer (integer/bool initializers, shapes and indices, stay constants).
    ``pretrained_params()`` gives the imported weights under the names ``ml.compile`` and
    ``ml.export_onnx`` use for them in the enclosing model; pass them as ``params``.
    """

    block_name = "onnx_model"

    def __init__(self, model, name: str | None = None):
        self.onnx: OnnxModel = model if isinstance(model, OnnxModel) else load_onnx(model)
        proto = self.onnx.to_proto()
        if proto.functions:
            proto = onnx.inliner.inline_local_functions(proto)
        foreign = sorted({n.domain for n in _all_nodes(proto.graph)} - {"", "ai.onnx"})
        if foreign:
            raise ModelError(f"ONNX model {self.onnx.source or proto.graph.name!r} uses op domains {foreign}; "
                             f"an OnnxBlock exports standard ai.onnx ops only")
        self._proto = proto
        inits = {t.name: t for t in proto.graph.initializer}
        self._weights = {k: numpy_helper.to_array(t) for k, t in inits.items()}
        self._param_names = [k for k, v in self._weights.items() if is_floating_np(v.dtype)]
        self._input_infos = [vi for vi in proto.graph.input if vi.name not in inits]
        self._output_infos = list(proto.graph.output)
        self._converted: dict[int, onnx.GraphProto] = {}
        self._inferred: dict[tuple, list | None] = {}
        super().__init__(name)

    def __deepcopy__(self, memo):
        # Export deep-copies the model; the imported graph and weights are read-only, so share them.
        new = object.__new__(type(self))
        memo[id(self)] = new
        shared = ("onnx", "_proto", "_weights", "_converted", "_inferred", "_input_infos", "_output_infos")
        for k, v in self.__dict__.items():
            new.__dict__[k] = v if k in shared else copy.deepcopy(v, memo)
        return new

    def port_specs(self):
        ports = {}
        for vi in self._input_infos:
            ports[vi.name] = In(_template(vi), type=_port_type(vi))
        for k in self._param_names:
            w = self._weights[k]
            # The imported weights are the parameter's initial value: compile/export use them by default.
            ports[k] = Param(list(w.shape), init=w, type=_dtypes.as_dtype(w.dtype))
        for vi in self._output_infos:
            ports[vi.name] = Out(_template(vi), type=_port_type(vi))
        return ports

    def attributes(self):
        return {"source": self.onnx.source or self._proto.graph.name, "nodes": len(self._proto.graph.node),
                "opset": self.onnx.opset}

    # -- shapes --------------------------------------------------------------------------------
    def infer(self, s: ShapeView) -> None:
        # Declared output dims may be symbolic where the inputs' are known: ONNX shape inference
        # with the concrete input shapes fills them in (cached per input shape).
        shapes = tuple(tuple(s.values(vi.name) or ()) if s.rank(vi.name) is not None else None
                       for vi in self._input_infos)
        if any(sh is None or None in sh for sh in shapes):
            return
        if all(None not in (s.values(vi.name) or [None]) for vi in self._output_infos):
            return
        if shapes not in self._inferred:
            self._inferred[shapes] = self._infer_outputs(shapes)
        for vi, dims in zip(self._output_infos, self._inferred[shapes] or ()):
            if dims is not None:
                s.set(vi.name, dims)

    def _infer_outputs(self, shapes) -> list | None:
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        for vi, dims in zip(self._input_infos, shapes):
            target = next(x for x in proto.graph.input if x.name == vi.name)
            shape = target.type.tensor_type.shape
            del shape.dim[:]
            for d in dims:
                shape.dim.add().dim_value = int(d)
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        except Exception:  # a graph ONNX cannot infer: keep what is declared
            return None
        out = []
        for vi in inferred.graph.output:
            dims = _template(vi)
            out.append([d if isinstance(d, int) else None for d in dims] if dims is not None else None)
        return out

    # -- weights -------------------------------------------------------------------------------
    def pretrained_params(self) -> dict[str, np.ndarray]:
        """The imported weights keyed by their parameter names in the enclosing (root) model."""
        if self.parent is None:
            return {k: v for k, v in self._weights.items() if k in self._param_names}
        return {_root_name(self, k): self._weights[k] for k in self._param_names}

    # -- export --------------------------------------------------------------------------------
    def _graph_at(self, opset: int) -> onnx.GraphProto:
        if opset not in self._converted:
            self._converted[opset] = _convert_graph(self._proto, opset, self.name)
        return self._converted[opset]

    def lower(self, g, **inputs):
        src = self._graph_at(g.opset)
        prefix = f"{g.scope}/"
        bound = {k: v for k, v in inputs.items() if v is not None}
        graph = onnx.GraphProto()
        graph.node.extend(src.node)
        _rename_graph(graph, lambda n: "" if n == "" else bound.get(n, prefix + n))
        # Integer/bool initializers, and any the opset conversion added, become Constant nodes.
        constants = {k: v for k, v in self._weights.items() if k not in self._param_names}
        constants.update((t.name, numpy_helper.to_array(t)) for t in src.initializer if t.name not in self._weights)
        for k, arr in constants.items():
            name = prefix + k
            g.nodes.append(helper.make_node("Constant", [], [name], name=name + "/const",
                                            value=numpy_helper.from_array(arr, name)))
        g.nodes.extend(graph.node)
        return tuple(bound.get(vi.name, prefix + vi.name) for vi in self._output_infos)


def _same_semantics(graph: onnx.GraphProto, src: int, dst: int) -> bool:
    """Whether every op of ``graph`` has the same schema version at opsets ``src`` and ``dst``."""
    for op in {n.op_type for n in _all_nodes(graph)}:
        try:
            a = onnx.defs.get_schema(op, max_inclusive_version=src).since_version
            b = onnx.defs.get_schema(op, max_inclusive_version=dst).since_version
        except onnx.defs.SchemaError:
            return False
        if a != b:
            return False
    return True


def _convert_graph(proto: onnx.ModelProto, opset: int, label: str) -> onnx.GraphProto:
    """The graph's nodes at ``opset``, through onnx's version converter where an op changed."""
    src = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
    if src == opset or _same_semantics(proto.graph, src, opset):
        return proto.graph
    # The converter copies the whole model: convert a weightless copy (initializers become typed
    # inputs), and only where an adapter needs a weight's value, the full model.
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    del light.graph.initializer[:]
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in proto.graph.initializer)
    for attempt in (light, proto):
        try:
            return onnx.version_converter.convert_version(attempt, opset).graph
        except Exception as exc:
            error = exc
    raise ModelError(f"{label}: cannot convert the imported graph from opset {src} to {opset}: {error}; "
                     f"export with opset={src}")


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            for sub in attr.graphs:
                yield from _all_nodes(sub)


def _root_name(block: OnnxBlock, port: str) -> str:
    """The value name a block terminal gets in the root model's export (and compile)."""
    model = block.parent
    wire = model._bindings[(block, port)]
    name = wire.key
    while model.parent is not None:
        outer = model.parent
        frozen = model._frozen_wires or {}
        key = next((k for k, w in frozen.items() if w is wire), None)
        if key is not None and (model, key) in outer._bindings:
            wire = outer._bindings[(model, key)]
            name = wire.key
        else:
            name = f"{model.name}.{name}"
        model = outer
    return name
