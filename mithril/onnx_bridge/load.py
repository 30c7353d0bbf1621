"""Loading ONNX models (files, bytes, protos) into Mithril's in-memory IR (onnx_ir)."""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from ..errors import OnnxLoadError, public_api
from .check import check_model, outer_reads
from .passes import RelaxUnknownDims
from .schema import canonical_domain as _canonical_domain

# protobuf cannot parse a message larger than this; bigger models keep their weights as external data.
_PROTOBUF_LIMIT = 2**31 - 1


class OnnxModel:
    """An ONNX model held in onnx_ir, the IR every Mithril backend lowers from.

    >>> import mithril as ml
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    >>> m = ml.load_onnx(helper.make_model(g))
    >>> m.input_names, m.output_names
    (['x'], ['y'])
    """

    def __init__(self, model: ir.Model, source: str | None = None):
        self.ir = model
        self.source = source

    @property
    def graph(self) -> ir.Graph:
        return self.ir.graph

    @property
    def opset_imports(self) -> dict[str, int]:
        return {_canonical_domain(d): v for d, v in self.ir.opset_imports.items()}

    @property
    def opset(self) -> int:
        return self.opset_imports.get("", 1)

    @property
    def initializer_names(self) -> list[str]:
        return list(self.graph.initializers)

    @property
    def input_names(self) -> list[str]:
        inits = self.graph.initializers
        return [v.name for v in self.graph.inputs if v.name not in inits]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.graph.outputs]

    def to_proto(self) -> onnx.ModelProto:
        """The model as one self-contained ModelProto (memory-mapped external data read in)."""
        proto = ir.serde.serialize_model(self.ir)
        folders = {t.base_dir for t in _external_tensors(self.ir)}
        if folders:
            if len(folders) > 1:
                raise OnnxLoadError(f"the model's external data lies in {len(folders)} folders "
                                    f"({sorted(map(str, folders))}); one ModelProto can name one")
            onnx.external_data_helper.load_external_data_for_model(proto, str(folders.pop()))
        return proto

    def __call__(self, **bindings) -> OnnxModelCall:
        """This model with terminal bindings, for a logical Model: ``model |= onnx_model(x="input")``.
        The frontend makes it a block (``OnnxBlock``) when it is added; loading knows no frontend."""
        return OnnxModelCall(self, bindings)

    connect = __call__

    def op_counts(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for node in self.graph.all_nodes():
            key = (_canonical_domain(node.domain), node.op_type)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def __repr__(self) -> str:
        return (
            f"OnnxModel({self.source or self.graph.name!r}, inputs={self.input_names}, "
            f"outputs={self.output_names}, opset={self.opset})"
        )


@dataclass(frozen=True)
class OnnxModelCall:
    """A loaded model and the terminal bindings it was called with (``onnx_model(x="input")``):
    ``Model.extend`` turns it into an ``OnnxBlock`` bound the same way."""

    model: OnnxModel
    bindings: dict[str, Any]


def _densify_sparse_constants(graph: onnx.GraphProto) -> None:
    """onnx_ir holds no sparse tensors: a Constant's sparse_value becomes a dense value."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _densify_sparse_constants(attr.g)
            for g in attr.graphs:
                _densify_sparse_constants(g)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for i, attr in enumerate(node.attribute):
                if attr.name == "sparse_value":
                    dense = _sparse_to_dense(attr.sparse_tensor)
                    del node.attribute[i]
                    node.attribute.append(onnx.helper.make_attribute("value", dense))
                    break
    if graph.sparse_initializer:
        for sp in graph.sparse_initializer:
            graph.initializer.append(_sparse_to_dense(sp))
        del graph.sparse_initializer[:]


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> onnx.TensorProto:
    import numpy as np

    values = onnx.numpy_helper.to_array(sp.values)
    indices = onnx.numpy_helper.to_array(sp.indices)
    dims = tuple(sp.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:  # linearized indices
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return onnx.numpy_helper.from_array(dense, sp.values.name)


def _subgraphs(graph: onnx.GraphProto):
    """Every subgraph (If branches, Loop/Scan bodies) under ``graph``, nested ones included."""
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield sub
                yield from _subgraphs(sub)


def _outer_scope_outputs(graph: onnx.GraphProto) -> list[int]:
    """Positions of ``graph``'s outputs that it does not define: values of an enclosing scope."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for node in graph.node for o in node.output}
    return [i for i, out in enumerate(graph.output) if out.name not in defined]


def _expose_outer_scope_outputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A subgraph may return a value of an enclosing scope by name (``then_branch`` outputs the
    outer ``h``). The IR ties a value to one graph, so such an output becomes an Identity of the
    outer value inside the subgraph: the same semantics, in the form every pass handles.
    The caller's proto is left untouched (copied first when a rewrite is needed)."""
    if not any(_outer_scope_outputs(sub) for sub in _subgraphs(proto.graph)):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for n, sub in enumerate(_subgraphs(copy.graph)):
        for i in _outer_scope_outputs(sub):
            outer = sub.output[i].name
            inner = f"{outer}__scope{n}_out{i}"
            sub.node.append(onnx.helper.make_node("Identity", [outer], [inner]))
            sub.output[i].name = inner
    return copy


def _holds_map(t: onnx.TypeProto) -> bool:
    kind = t.WhichOneof("value")
    if kind == "map_type":
        return True
    if kind == "sequence_type":
        return _holds_map(t.sequence_type.elem_type)
    if kind == "optional_type":
        return _holds_map(t.optional_type.elem_type)
    return False


def _drop_map_types(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnx_ir reads no map types (ai.onnx.ml: ZipMap's sequence of maps, DictVectorizer's and
    CastMap's map inputs). Such values keep their names and lose their declared type, which no
    pass needs: their kernels take and return Python dicts. The caller's proto is left untouched."""
    def infos(graph):
        return [*graph.input, *graph.output, *graph.value_info]

    graphs = [proto.graph, *_subgraphs(proto.graph)]
    if not any(_holds_map(v.type) for g in graphs for v in infos(g)):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for g in [copy.graph, *_subgraphs(copy.graph)]:
        for v in infos(g):
            if _holds_map(v.type):
                v.ClearField("type")
    return copy


def _node_reads(node: onnx.NodeProto) -> set[str]:
    reads = {n for n in node.input if n}
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            reads |= outer_reads(sub)
    return reads


def _sort_graph(graph: onnx.GraphProto) -> None:
    """Order ``graph``'s nodes (and its subgraphs') so each comes after the producers of what it
    reads, keeping the written order where it already holds. The graph is known to be acyclic."""
    import heapq

    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    deps = [{producer[r] for r in _node_reads(n) if r in producer} for n in graph.node]
    if any(j >= i for i, d in enumerate(deps) for j in d):
        users: list[list[int]] = [[] for _ in graph.node]
        for i, d in enumerate(deps):
            for j in d:
                users[j].append(i)
        pending = [len(d) for d in deps]
        ready = [i for i, p in enumerate(pending) if p == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for k in users[i]:
                pending[k] -= 1
                if pending[k] == 0:
                    heapq.heappush(ready, k)
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _sort_graph(sub)


def _is_sorted(graph: onnx.GraphProto) -> bool:
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    for i, node in enumerate(graph.node):
        if any(producer[r] >= i for r in _node_reads(node) if r in producer):
            return False
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                if not _is_sorted(sub):
                    return False
    return True


def _toposorted(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime runs nodes written in any order; the IR reads them in order, so an unsorted
    graph (checked acyclic) is sorted first, in a copy: the caller's proto is left untouched."""
    if _is_sorted(proto.graph):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    _sort_graph(copy.graph)
    return copy


def _holds_sparse(graph: onnx.GraphProto) -> bool:
    for g in [graph, *_subgraphs(graph)]:
        if g.sparse_initializer or any(a.HasField("sparse_tensor") for n in g.node for a in n.attribute):
            return True
    return False


def _copied(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def _own_tensors(model: ir.Model, base_dir: Path | None) -> int:
    """Give every tensor of the model its own memory, so that the protobuf can be freed; external
    data stays in its files, memory-mapped (read-only) here, its pages read when used.

    onnx_ir reads tensors in place from the ModelProto, and a protobuf message lives in one arena
    that any sub-message keeps alive: one small tensor still read from the proto would keep every
    weight held twice (BERT-small: 42 MiB of protobuf beside 42 MiB of arrays). Numeric tensors
    become NumPy-backed (one copy, read-only: kernels never write into weights); the others
    (strings, sub-byte types) become standalone TensorProtos. Returns the bytes copied.
    """
    copied = 0
    graphs = [model.graph, *(f for f in model.functions.values())]
    for graph in graphs:
        for node in graph.all_nodes() if isinstance(graph, ir.Graph) else _function_nodes(graph):
            for name, attr in list(node.attributes.items()):
                tensors = [attr.value] if attr.type == ir.AttributeType.TENSOR else (
                    attr.value if attr.type == ir.AttributeType.TENSORS else ())
                for t in tensors:
                    if isinstance(t, ir.ExternalTensor):
                        _map(t, base_dir)
                if not any(isinstance(t, ir.serde.TensorProtoTensor) for t in tensors):
                    continue
                owned = [_owned(t) if isinstance(t, ir.serde.TensorProtoTensor) else t for t in tensors]
                copied += sum(t.nbytes for t in owned)
                node.attributes[name] = (ir.AttrTensor(name, owned[0], doc_string=attr.doc_string)
                                         if attr.type == ir.AttributeType.TENSOR else
                                         ir.AttrTensors(name, owned, doc_string=attr.doc_string))
    for graph in _all_graphs(model.graph):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.serde.TensorProtoTensor):
                value.const_value = _owned(value.const_value)
                copied += value.const_value.nbytes
            elif isinstance(value.const_value, ir.ExternalTensor):
                _map(value.const_value, base_dir)
    return copied


# glibc keeps the pages of freed heap blocks (the protobuf's arena, the file's bytes) in the process
# unless asked: BERT-small's 42 MiB of weights left 54 MiB resident after loading, 42 once trimmed.
_TRIM_FROM = 4 << 20


def release_freed_heap() -> None:
    """Hand the pages of freed heap blocks back to the system (glibc's ``malloc_trim(0)``), which
    keeps them in the process unless asked; nothing on another C library or system."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return
    trim(0)


def _map(tensor: ir.ExternalTensor, base_dir: Path | None) -> None:
    """Map an external tensor's file now (pages are read when used), so that a file that went
    missing or shrank since check_model is an OnnxLoadError at load, not an error at compile."""
    tensor.base_dir = str(base_dir)  # the proto's locations are relative to the model's folder
    try:
        tensor.numpy()
    except Exception as exc:  # OSError, ValueError (a region past the end), onnx_ir's own
        raise OnnxLoadError(f"reading the external data of tensor {tensor.name!r} from {tensor.path!r} "
                            f"failed: {type(exc).__name__}: {exc}") from exc


def _external_tensors(model: ir.Model):
    for graph in _all_graphs(model.graph):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.const_value
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    yield attr.value
                elif attr.type == ir.AttributeType.TENSORS:
                    yield from (t for t in attr.value if isinstance(t, ir.ExternalTensor))


def _function_nodes(function: ir.Function):
    for node in function:
        yield node
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield from attr.value.all_nodes()
            elif attr.type == ir.AttributeType.GRAPHS:
                for g in attr.value:
                    yield from g.all_nodes()


def _all_graphs(graph: ir.Graph):
    yield graph
    for node in graph.all_nodes():
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                yield attr.value
            elif attr.type == ir.AttributeType.GRAPHS:
                yield from attr.value


def _owned(tensor: ir.serde.TensorProtoTensor):
    dtype = tensor.dtype
    if dtype != ir.DataType.STRING and dtype.bitwidth >= 8:
        array = tensor.numpy()
        array.flags.writeable = False
        return ir.Tensor(array, dtype=dtype, name=tensor.name, doc_string=tensor.doc_string,
                         metadata_props=dict(tensor.metadata_props) or None)
    proto = onnx.TensorProto()
    proto.CopyFrom(tensor.raw)
    return ir.serde.TensorProtoTensor(proto)


def _parse_file(path: Path, size: int) -> onnx.ModelProto:
    """The file parsed from a read-only map of it: half the time of reading it into bytes first
    (ResNet-50: 56 against 110 ms), and its bytes never sit on the heap beside the protobuf's."""
    what = f"file {str(path)!r}"
    if size == 0:  # nothing to map
        return _parse(b"", what)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return _parse(view, what)  # the protobuf copies what it keeps
        finally:
            view.release()


def _parse(data, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as exc:
        raise OnnxLoadError(f"{what} is not a valid ONNX protobuf (malformed or truncated): {exc}") from None
    if not proto.HasField("graph"):
        raise OnnxLoadError(f"{what} holds no graph: not an ONNX model, or truncated")
    return proto


@public_api(OnnxLoadError, "load_onnx")
def load_onnx(src, *, max_tensor_bytes: int | None = None) -> OnnxModel:
    """Load an ONNX model from a path, bytes, or an ``onnx.ModelProto``.

    The protobuf is checked before anything is deserialized (:mod:`mithril.onnx_bridge.check`):
    opsets, one definition per value, no cycles, tensors whose data matches their dims. A tensor
    larger than ``max_tensor_bytes`` (default: the machine's memory, or
    ``$MITHRIL_MAX_TENSOR_BYTES``) is refused with :class:`TensorTooLargeError` before any
    allocation. External data is read from paths relative to the model file; a path escaping that
    folder (``..``, absolute, a symlink leading out) is refused with
    :class:`UnsafeExternalDataError`, and a region past the end of its file with
    :class:`OnnxLoadError`. Bytes or a ModelProto cannot name external data (there is no folder).
    """
    source = None
    base_dir = None
    if isinstance(src, OnnxModel):
        return src
    if isinstance(src, onnx.ModelProto):
        proto = src
    elif isinstance(src, (bytes, bytearray, memoryview)):
        proto = _parse(bytes(src), "the bytes given")
    elif isinstance(src, (str, os.PathLike)):
        path = Path(src)
        source = str(path)
        if not path.is_file():
            raise OnnxLoadError(f"no such file: {str(path)!r}")
        size = path.stat().st_size
        if size > _PROTOBUF_LIMIT:
            raise OnnxLoadError(
                f"file {str(path)!r} is {size} bytes: an ONNX protobuf holds at most 2 GiB "
                f"(larger models keep their weights as external data)"
            )
        proto = _parse_file(path, size)
        base_dir = path.parent
    else:
        raise OnnxLoadError(f"cannot load an ONNX model from {type(src).__name__}; give a path, bytes or ModelProto")
    check_model(proto, base_dir, max_tensor_bytes)  # external data: inside base_dir, regions in bounds
    proto = _toposorted(_expose_outer_scope_outputs(_drop_map_types(proto)))
    if proto is src and (not proto.opset_import or _holds_sparse(proto.graph)):
        proto = _copied(proto)  # the rewrites below must not change the caller's ModelProto
    _densify_sparse_constants(proto.graph)
    if not proto.opset_import:
        # IR version 1/2 models without opset_import imply opset 1.
        proto.opset_import.add(domain="", version=1)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:  # onnx_ir raises several types for inconsistent protos
        raise OnnxLoadError(f"the ONNX model is inconsistent and cannot be read: {exc}") from exc
    del proto
    if _own_tensors(model, base_dir) >= _TRIM_FROM:
        release_freed_heap()
    RelaxUnknownDims()(model)
    return OnnxModel(model, source)
