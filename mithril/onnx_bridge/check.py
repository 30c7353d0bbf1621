"""Structural checks of an ONNX ModelProto, run by ``load_onnx`` before anything is deserialized.

A hostile or broken file is refused here, cheaply (one walk over the protobuf, no tensor data
copied or allocated) and with an :class:`~mithril.errors.OnnxLoadError` naming the node, tensor,
op or opset at fault. onnxruntime is the reference: what it accepts, these checks accept
(unsorted nodes, duplicate opset entries, unused custom domains at any version); the limits are on
inconsistency (raw_data of the wrong length for its dims), absurdity (a negative opset, a tensor
larger than the machine's memory) and safety (external data outside the model's folder), never on
honest size.

>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["x"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])
>>> check_graph_structure(helper.make_model(g).graph)
Traceback (most recent call last):
  ...
mithril.errors.OnnxLoadError: value 'x' is defined twice: graph input 'x' and node 'Relu#0' (op Relu)
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto

from ..errors import OnnxLoadError, TensorTooLargeError, UnsafeExternalDataError
from .schema import canonical_domain as _canonical_domain

# Environment override of the per-tensor (and whole-model) size cap, in bytes.
MAX_TENSOR_BYTES_ENV = "MITHRIL_MAX_TENSOR_BYTES"


def default_max_tensor_bytes() -> int:
    """The machine's physical memory (a tensor larger than it can never be allocated), or
    ``$MITHRIL_MAX_TENSOR_BYTES`` when set."""
    env = os.environ.get(MAX_TENSOR_BYTES_ENV)
    if env:
        return int(env)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: 64 GiB
        return 64 << 30


# Highest opset per domain that the installed onnx knows (onnxruntime refuses higher ones with
# "opset N is under development"); com.microsoft is onnxruntime's own contrib domain, version 1.
def _max_opsets() -> dict[str, int]:
    known = {"com.microsoft": 1}
    try:
        for domain, (_, high) in onnx.defs.C.schema_version_map().items():
            known[_canonical_domain(domain)] = high
    except AttributeError:  # an onnx without the map: the default domain at least
        known[""] = onnx.defs.onnx_opset_version()
    return known


def check_opsets(proto: onnx.ModelProto) -> None:
    """Every opset import is a positive version, at most the newest its domain has; a model of IR
    version 3 or later must import at least one opset (older ones imply opset 1)."""
    if not proto.opset_import and proto.ir_version >= 3:
        raise OnnxLoadError(
            f"the model (IR version {proto.ir_version}) imports no opset: every ONNX model from IR "
            f"version 3 on must name the opset of its ops"
        )
    highest = _max_opsets()
    for entry in proto.opset_import:
        domain = _canonical_domain(entry.domain)
        shown = entry.domain or "ai.onnx"
        if entry.version < 1:
            raise OnnxLoadError(f"opset import {shown!r} has version {entry.version}: versions start at 1")
        if domain in highest and entry.version > highest[domain]:
            raise OnnxLoadError(
                f"opset import {shown!r} has version {entry.version}, newer than any released "
                f"(the newest is {highest[domain]})"
            )
    for fn in proto.functions:
        for entry in fn.opset_import:
            if entry.version < 1:
                raise OnnxLoadError(
                    f"function {fn.domain}::{fn.name}: opset import {entry.domain or 'ai.onnx'!r} has "
                    f"version {entry.version}: versions start at 1"
                )


# -- graph structure ------------------------------------------------------------------------------
def _label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def check_graph_structure(graph: onnx.GraphProto, outer: frozenset[str] = frozenset(),
                          where: str = "") -> None:
    """Each value has one definition (graph input, initializer or node output), every value read
    is defined (here or, in a subgraph, in an enclosing graph), graph outputs exist, and the nodes
    form no cycle. Node order is free: onnxruntime sorts an unsorted graph, and so do the passes."""
    prefix = f"{where}: " if where else ""
    _check_text(graph, prefix)
    defined: dict[str, str] = {}  # value -> what defines it, for the message

    def define(name: str, by: str) -> None:
        if not name:
            return
        if name in defined:
            raise OnnxLoadError(f"{prefix}value {name!r} is defined twice: {defined[name]} and {by}")
        defined[name] = by

    for v in graph.input:
        define(v.name, f"graph input {v.name!r}")
    inputs = set(defined)
    # An initializer that is also an input is its default value; a repeated initializer is taken
    # once (onnxruntime keeps the last, with a warning).
    for name in dict.fromkeys(t.name for t in list(graph.initializer) + [s.values for s in graph.sparse_initializer]):
        if name not in inputs:
            define(name, f"initializer {name!r}")
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            define(out, f"node {_label(node, i)!r} (op {node.op_type})")
            if out:
                producer[out] = i
    visible = outer | frozenset(defined)
    # Reads: undefined values are refused; local edges feed the cycle check below.
    consumers: list[list[int]] = [[] for _ in graph.node]
    pending = [0] * len(graph.node)
    for i, node in enumerate(graph.node):
        reads = set(node.input)
        for sub in _subgraphs(node):
            reads |= outer_reads(sub)
        for name in node.input:
            if name and name not in visible:
                raise OnnxLoadError(
                    f"{prefix}node {_label(node, i)!r} (op {node.op_type}) reads {name!r}, which no graph "
                    f"input, initializer or node output defines"
                )
        for name in reads:
            if name in producer:
                consumers[producer[name]].append(i)
                pending[i] += 1
    for v in graph.output:
        if v.name not in visible:
            raise OnnxLoadError(f"{prefix}graph output {v.name!r} is not defined by any node, input or initializer")
    # Kahn's algorithm: nodes never released lie on (or behind) a cycle.
    ready = [i for i, n in enumerate(pending) if n == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for j in consumers[i]:
            pending[j] -= 1
            if pending[j] == 0:
                ready.append(j)
    if done != len(graph.node):
        stuck = [_label(graph.node[i], i) for i, n in enumerate(pending) if n > 0]
        shown = ", ".join(repr(s) for s in stuck[:8]) + (", ..." if len(stuck) > 8 else "")
        raise OnnxLoadError(f"{prefix}the graph has a cycle: nodes {shown} depend on their own outputs")
    for i, node in enumerate(graph.node):
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                check_graph_structure(sub, visible, f"{prefix}subgraph {attr.name!r} of node {_label(node, i)!r}")


def _check_text(graph: onnx.GraphProto, prefix: str) -> None:
    """Names, op types and domains are UTF-8 text: protobuf hands an invalid string field back
    as bytes, which no name lookup or message expects."""
    def bad(value) -> bool:
        return not isinstance(value, str)

    for i, node in enumerate(graph.node):
        fields = [node.name, node.op_type, node.domain, *node.input, *node.output]
        fields += [a.name for a in node.attribute]
        if any(bad(f) for f in fields):
            shown = next(f for f in fields if bad(f))
            raise OnnxLoadError(f"{prefix}node #{i} holds a name that is not valid UTF-8 text: {shown!r}")
    for v in list(graph.input) + list(graph.output) + list(graph.value_info) + list(graph.initializer):
        if bad(v.name):
            raise OnnxLoadError(f"{prefix}value name {v.name!r} is not valid UTF-8 text")


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads without defining them (its dependencies on the enclosing graph)."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {s.values.name for s in graph.sparse_initializer}
    local |= {o for n in graph.node for o in n.output}
    reads: set[str] = set()
    for node in graph.node:
        reads.update(node.input)
        for sub in _subgraphs(node):
            reads |= outer_reads(sub)
    reads.update(v.name for v in graph.output)
    return {r for r in reads if r and r not in local}


def check_value_types(graph: onnx.GraphProto) -> None:
    """The main graph's inputs and outputs declare a valid element type where they declare a
    tensor type (onnxruntime refuses UNDEFINED or an unknown number: "Invalid tensor data type")."""
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for v in values:
            if v.type.HasField("tensor_type") and _element_bits(v.type.tensor_type.elem_type) is None:
                raise OnnxLoadError(
                    f"graph {kind} {v.name!r} declares an invalid element type "
                    f"{_dtype_name(v.type.tensor_type.elem_type)}"
                )


_SCHEMA_DOMAINS = ("", "ai.onnx.ml")
_NO_SCHEMA = object()
_schemas: dict[tuple[str, str, int], object] = {}


def _schema(op_type: str, domain: str, opset: int):
    key = (op_type, domain, opset)
    if key not in _schemas:
        try:
            _schemas[key] = onnx.defs.get_schema(op_type, opset, domain)
        except onnx.defs.SchemaError:
            _schemas[key] = _NO_SCHEMA
    found = _schemas[key]
    return None if found is _NO_SCHEMA else found


def check_node_schemas(proto: onnx.ModelProto) -> None:
    """Nodes of the ONNX domains with a schema at the model's opset have as many inputs and
    outputs as the schema allows, their required attributes, and attributes of the schema's
    type (onnxruntime refuses all three when it resolves the graph; downstream they became
    IndexErrors and conversion errors). Ops without a schema are left to compile, which names
    them (UnsupportedOpsError) with every other op no backend has."""
    opsets = {_canonical_domain(e.domain): e.version for e in proto.opset_import}
    local = {(f.domain, f.name) for f in proto.functions}

    def walk(graph: onnx.GraphProto, where: str) -> None:
        for i, node in enumerate(graph.node):
            domain = _canonical_domain(node.domain)
            label = f"{where}node {_label(node, i)!r} (op {node.op_type}"
            if domain in _SCHEMA_DOMAINS and domain in opsets and (node.domain, node.op_type) not in local:
                schema = _schema(node.op_type, domain, opsets[domain])
                if schema is not None:
                    _check_node(node, schema, f"{label}, opset {opsets[domain]})")
                if node.op_type == "Einsum" and domain == "":
                    _check_einsum(node, f"{label}, opset {opsets[domain]})")
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub, f"{label}) subgraph {attr.name!r}: ")

    walk(proto.graph, "")


def _check_node(node: onnx.NodeProto, schema, label: str) -> None:
    n_in, n_out = len(node.input), len(node.output)
    if not schema.min_input <= n_in <= schema.max_input:
        want = (f"{schema.min_input}" if schema.min_input == schema.max_input
                else f"{schema.min_input} to {schema.max_input}" if schema.max_input < 2**31 - 1
                else f"at least {schema.min_input}")
        raise OnnxLoadError(f"{label} has {n_in} input(s); the schema takes {want}")
    if not schema.min_output <= n_out <= schema.max_output:
        want = (f"{schema.min_output}" if schema.min_output == schema.max_output
                else f"{schema.min_output} to {schema.max_output}" if schema.max_output < 2**31 - 1
                else f"at least {schema.min_output}")
        raise OnnxLoadError(f"{label} has {n_out} output(s); the schema gives {want}")
    given = {a.name: a for a in node.attribute}
    for name, spec in schema.attributes.items():
        attr = given.get(name)
        if attr is None:
            if spec.required:
                raise OnnxLoadError(f"{label} lacks its required attribute {name!r}")
            continue
        want = int(spec.type.value) if hasattr(spec.type, "value") else int(spec.type)
        # A reference in a function body is typed where it is bound; IR version 1 wrote no type.
        if attr.ref_attr_name or attr.type == AttributeProto.UNDEFINED:
            continue
        if attr.type != want:
            raise OnnxLoadError(
                f"{label} attribute {name!r} is of type {_attr_type_name(attr.type)} but the schema wants "
                f"{_attr_type_name(want)}"
            )


# Einsum's grammar: terms of letters and '...' separated by ',', then optionally '->' and the output
# term. onnx's Einsum shape inference (which onnxruntime runs too) never returns on an equation
# with a '-' that does not start '->' ('j-.i'): such a node must not reach it.
_EINSUM_TERM = r"\s*(?:[A-Za-z]|\.\.\.)*\s*"
_EINSUM = re.compile(rf"{_EINSUM_TERM}(?:,{_EINSUM_TERM})*(?:->{_EINSUM_TERM})?")


def _check_einsum(node: onnx.NodeProto, label: str) -> None:
    for attr in node.attribute:
        if attr.name == "equation":
            try:
                equation = attr.s.decode("ascii")
            except UnicodeDecodeError:
                equation = None
            if equation is None or not _EINSUM.fullmatch(equation):
                raise OnnxLoadError(f"{label} has an invalid equation {attr.s!r}: Einsum takes terms of letters "
                                    f"and '...' separated by ',', then optionally '->' and the output term")


def _attr_type_name(code: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(code)
    except ValueError:
        return str(code)


def check_functions(proto: onnx.ModelProto) -> None:
    """Model-local function bodies are well formed, and no function calls itself (directly or
    through others): inlining one would never end."""
    functions = {(f.domain, f.name, f.overload): f for f in proto.functions}
    if len(functions) != len(proto.functions):
        raise OnnxLoadError("two model-local functions share a domain, name and overload")
    for f in proto.functions:
        body = onnx.GraphProto(node=f.node, input=[onnx.ValueInfoProto(name=n) for n in f.input],
                               output=[onnx.ValueInfoProto(name=n) for n in f.output])
        check_graph_structure(body, where=f"function {f.domain}::{f.name}")
    calls = {key: {(n.domain, n.op_type, n.overload) for n in f.node} & functions.keys()
             for key, f in functions.items()}
    state: dict[tuple, int] = {}  # 1: on the current path, 2: finished

    for root in calls:
        stack = [(root, iter(calls[root]))]
        state[root] = state.get(root, 0) or 1
        if state[root] == 2:
            continue
        while stack:
            key, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[key] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise OnnxLoadError(f"model-local function {nxt[0]}::{nxt[1]} calls itself (recursion cannot be inlined)")
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(calls[nxt])))


# -- tensors --------------------------------------------------------------------------------------
_SUB_BYTE_BITS = {TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4}
for _name, _bits in (("INT2", 2), ("UINT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    if hasattr(TensorProto, _name):
        _SUB_BYTE_BITS[getattr(TensorProto, _name)] = _bits
_COMPLEX = (TensorProto.COMPLEX64, TensorProto.COMPLEX128)


def _element_bits(data_type: int) -> int | None:
    if data_type in _SUB_BYTE_BITS:
        return _SUB_BYTE_BITS[data_type]
    if data_type == TensorProto.UNDEFINED or data_type not in TensorProto.DataType.values():
        return None
    if data_type == TensorProto.STRING:
        return 0
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize * 8


def _dtype_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def _element_count(tensor_dims, what: str) -> int:
    count = 1
    for d in tensor_dims:
        if d < 0:
            raise OnnxLoadError(f"{what} has a negative dim {d} (dims {list(tensor_dims)})")
        count *= d
    return count


def _external_info(tensor: TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _tensor_bytes(tensor: TensorProto, what: str, limit: int) -> int:
    """The tensor's size in bytes from its dims and dtype, refused when larger than ``limit``."""
    bits = _element_bits(tensor.data_type)
    if bits is None:
        raise OnnxLoadError(f"{what} has an invalid element type {_dtype_name(tensor.data_type)}")
    count = _element_count(tensor.dims, what)
    size = (count * bits + 7) // 8
    if size > limit:
        raise TensorTooLargeError(
            f"{what} ({_dtype_name(tensor.data_type)}, dims {list(tensor.dims)}) would take {size} bytes, more "
            f"than the limit of {limit} bytes (the machine's memory, or ${MAX_TENSOR_BYTES_ENV})"
        )
    return size


def check_tensor(tensor: TensorProto, what: str, limit: int, base_dir: Path | None) -> int:
    """One tensor: a known dtype, non-negative dims, a size under ``limit``, and data that matches
    its dims (raw_data length, typed-field count, or an external file region that exists inside
    ``base_dir``). Returns its size in bytes."""
    size = _tensor_bytes(tensor, what, limit)
    count = _element_count(tensor.dims, what)
    if tensor.HasField("segment"):
        raise OnnxLoadError(f"{what} is split into segments, which no runtime supports")
    if tensor.data_location == TensorProto.EXTERNAL:
        _check_external(tensor, what, size, base_dir)
        return size
    if tensor.data_type == TensorProto.STRING:
        if tensor.HasField("raw_data") or len(tensor.string_data) != count:
            raise OnnxLoadError(
                f"{what} holds {len(tensor.string_data)} strings but its dims {list(tensor.dims)} need {count}"
            )
        return sum(len(s) for s in tensor.string_data)
    if tensor.HasField("raw_data"):
        if len(tensor.raw_data) != size:
            raise OnnxLoadError(
                f"{what} has {len(tensor.raw_data)} bytes of raw_data but its dims {list(tensor.dims)} and "
                f"type {_dtype_name(tensor.data_type)} need {size} bytes"
            )
        return size
    held = (len(tensor.float_data) + len(tensor.int32_data) + len(tensor.int64_data) + len(tensor.double_data)
            + len(tensor.uint64_data) + len(tensor.string_data))
    if tensor.data_type in _COMPLEX:
        allowed = {2 * count}
    elif tensor.data_type in _SUB_BYTE_BITS:  # packed into int32_data, or one per entry
        allowed = {count, (count * _SUB_BYTE_BITS[tensor.data_type] + 7) // 8,
                   (count * _SUB_BYTE_BITS[tensor.data_type] + 31) // 32}
    else:
        allowed = {count}
    if held not in allowed:
        raise OnnxLoadError(
            f"{what} holds {held} values but its dims {list(tensor.dims)} need {count} "
            f"(type {_dtype_name(tensor.data_type)})"
        )
    return size


def _check_external(tensor: TensorProto, what: str, size: int, base_dir: Path | None) -> None:
    info = _external_info(tensor)
    location = info.get("location", "")
    if base_dir is None:
        raise OnnxLoadError(
            f"{what} keeps its data in the external file {location!r}, which can only be read when the "
            f"model is loaded from a path (its folder is where the data must be)"
        )
    if not location:
        raise OnnxLoadError(f"{what} uses external data but names no location")
    base = base_dir.resolve()
    if os.path.isabs(location) or location.startswith(("/", "\\")) or "\0" in location:
        raise UnsafeExternalDataError(
            f"{what}: external data path {location!r} is absolute; it must stay inside the model folder {str(base)!r}"
        )
    target = (base / location).resolve()  # resolves symlinks: one leaving the folder is caught
    if not target.is_relative_to(base):
        raise UnsafeExternalDataError(
            f"{what}: external data path {location!r} escapes the model folder {str(base)!r}"
        )
    if not target.is_file():  # a directory, FIFO or device is never tensor data
        raise OnnxLoadError(f"{what}: external data file {str(target)!r} not found (or not a regular file)")
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise OnnxLoadError(
            f"{what}: external data offset/length {info.get('offset')!r}/{info.get('length')!r} are not integers"
        ) from None
    file_size = target.stat().st_size
    if offset < 0 or (length is not None and length < 0):
        raise OnnxLoadError(f"{what}: external data offset {offset} / length {length} is negative")
    end = offset + (length if length is not None else max(file_size - offset, 0))
    if offset > file_size or end > file_size:
        raise OnnxLoadError(
            f"{what}: external data region [{offset}, {end}) runs past the end of {location!r} ({file_size} bytes)"
        )
    read = end - offset
    if tensor.data_type != TensorProto.STRING and read != size:
        raise OnnxLoadError(
            f"{what}: external data holds {read} bytes but its dims {list(tensor.dims)} and type "
            f"{_dtype_name(tensor.data_type)} need {size} bytes"
        )


def _graph_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[TensorProto, str]]:
    """(tensor, description) for every tensor of ``graph`` and its subgraphs."""
    for t in graph.initializer:
        yield t, f"{where}initializer {t.name!r}"
    for sp in graph.sparse_initializer:
        yield sp.values, f"{where}sparse initializer {sp.values.name!r} (values)"
        yield sp.indices, f"{where}sparse initializer {sp.values.name!r} (indices)"
    for i, node in enumerate(graph.node):
        label = f"{where}node {_label(node, i)!r} (op {node.op_type})"
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t, f"{label} attribute {attr.name!r}"
            for t in attr.tensors:
                yield t, f"{label} attribute {attr.name!r}"
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values, f"{label} attribute {attr.name!r} (values)"
                yield attr.sparse_tensor.indices, f"{label} attribute {attr.name!r} (indices)"
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _graph_tensors(sub, f"{label} subgraph {attr.name!r}: ")


def _sparse_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[onnx.SparseTensorProto, str]]:
    for sp in graph.sparse_initializer:
        yield sp, f"{where}sparse initializer {sp.values.name!r}"
    for i, node in enumerate(graph.node):
        label = f"{where}node {_label(node, i)!r} (op {node.op_type})"
        for attr in node.attribute:
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor, f"{label} attribute {attr.name!r}"
            for sp in attr.sparse_tensors:
                yield sp, f"{label} attribute {attr.name!r}"
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _sparse_tensors(sub, f"{label} subgraph {attr.name!r}: ")


def check_tensors(proto: onnx.ModelProto, base_dir: Path | None = None, max_tensor_bytes: int | None = None) -> None:
    """Every tensor of the model (initializers, attribute tensors, sparse tensors, in subgraphs and
    functions) is consistent and allocatable: see :func:`check_tensor`. Sparse tensors are checked
    for the dense size they expand to and for indices inside it; the model's tensors together must
    also fit under the limit."""
    limit = default_max_tensor_bytes() if max_tensor_bytes is None else max_tensor_bytes
    total = 0
    graphs = [(proto.graph, "")]
    for f in proto.functions:
        graphs.append((onnx.GraphProto(node=f.node), f"function {f.domain}::{f.name}: "))
    for graph, where in graphs:
        for tensor, what in _graph_tensors(graph, where):
            total += check_tensor(tensor, what, limit, base_dir)
        for sp, what in _sparse_tensors(graph, where):
            total += _check_sparse(sp, what, limit)
    if total > limit:
        raise TensorTooLargeError(
            f"the model's tensors take {total} bytes together, more than the limit of {limit} bytes "
            f"(the machine's memory, or ${MAX_TENSOR_BYTES_ENV})"
        )


def _check_sparse(sp: onnx.SparseTensorProto, what: str, limit: int) -> int:
    dense = TensorProto(data_type=sp.values.data_type, dims=sp.dims)
    size = _tensor_bytes(dense, f"{what} (dense)", limit)
    count = _element_count(sp.dims, what)
    nnz = _element_count(sp.values.dims, what)
    if len(sp.values.dims) != 1:
        raise OnnxLoadError(f"{what}: sparse values must be 1-D, got dims {list(sp.values.dims)}")
    idims = list(sp.indices.dims)
    if sp.indices.data_type != TensorProto.INT64:
        raise OnnxLoadError(f"{what}: sparse indices must be int64, got {_dtype_name(sp.indices.data_type)}")
    if not (idims == [nnz] or idims == [nnz, len(sp.dims)]):
        raise OnnxLoadError(
            f"{what}: sparse indices have dims {idims}; with {nnz} values and rank {len(sp.dims)} they must be "
            f"[{nnz}] or [{nnz}, {len(sp.dims)}]"
        )
    if sp.indices.data_location != TensorProto.EXTERNAL:
        import numpy as np

        indices = onnx.numpy_helper.to_array(sp.indices)  # already checked: small and consistent
        bound = np.asarray(sp.dims if indices.ndim == 2 else [count], dtype=np.int64)
        if indices.size and (indices.min() < 0 or bool(np.any(indices >= bound))):
            raise OnnxLoadError(f"{what}: a sparse index lies outside the dims {list(sp.dims)}")
    return size


def check_model(proto: onnx.ModelProto, base_dir: Path | None = None, max_tensor_bytes: int | None = None) -> None:
    """All structural checks, cheapest first. ``base_dir``: the model's folder (None for bytes or
    a ModelProto, where external data cannot be located and is refused)."""
    check_opsets(proto)
    check_graph_structure(proto.graph)
    check_value_types(proto.graph)
    check_node_schemas(proto)
    check_functions(proto)
    check_tensors(proto, base_dir, max_tensor_bytes)
