"""Op schemas: attribute defaults and arity, parsed by attribute type.

Standard ops come from ``onnx.defs``. onnxruntime's own dialect (the ``com.microsoft`` contrib ops
and the few it registers in the ONNX domain, such as SimplifiedLayerNormalization) comes from the
schemas onnxruntime registers, read through its Python module, so defaults are never copied by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import onnx
import onnx.defs
import onnx_ir as ir
from onnx import AttributeProto

from ..dtypes import tensor_array

_MISSING = object()


def canonical_domain(domain: str) -> str:
    """``ai.onnx`` is the default domain's other name: both are ``""``."""
    return "" if domain == "ai.onnx" else domain


@dataclass(frozen=True)
class RuntimeSchema:
    """One of onnxruntime's registered schemas, reduced to what lowering reads."""

    name: str
    domain: str
    since_version: int
    max_output: int
    defaults: tuple[tuple[str, AttributeProto | None], ...]


@lru_cache(maxsize=1)
def _runtime_schemas() -> dict[tuple[str, str], list[RuntimeSchema]]:
    """(domain, op_type) -> onnxruntime's schemas for ops ``onnx.defs`` does not know, oldest first."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c
    except ImportError:
        return {}
    table: dict[tuple[str, str], list[RuntimeSchema]] = {}
    for sch in ort_c.get_all_operator_schema():
        defaults = []
        for name, attr in sch.attributes.items():
            default = None
            if attr._default_value:
                default = AttributeProto()
                default.ParseFromString(attr._default_value)
            defaults.append((name, default))
        entry = RuntimeSchema(sch.name, sch.domain, sch.since_version, sch.max_output, tuple(defaults))
        table.setdefault((sch.domain, sch.name), []).append(entry)
    for entries in table.values():
        entries.sort(key=lambda e: e.since_version)
    return table


def _runtime_schema(op_type: str, opset: int, domain: str) -> RuntimeSchema | None:
    best = None
    for entry in _runtime_schemas().get((domain, op_type), ()):
        if entry.since_version <= opset:
            best = entry
    return best


@lru_cache(maxsize=None)
def get_schema(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | RuntimeSchema | None:
    """The schema in force at ``opset``: ONNX's own, else onnxruntime's (contrib ops)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return _runtime_schema(op_type, opset, domain)


def _from_proto(attr: AttributeProto) -> Any:
    t = attr.type
    if t == AttributeProto.INT:
        return int(attr.i)
    if t == AttributeProto.FLOAT:
        return float(attr.f)
    if t == AttributeProto.STRING:
        return attr.s.decode("utf-8")
    if t == AttributeProto.INTS:
        return tuple(int(i) for i in attr.ints)
    if t == AttributeProto.FLOATS:
        return tuple(float(f) for f in attr.floats)
    if t == AttributeProto.STRINGS:
        return tuple(s.decode("utf-8") for s in attr.strings)
    if t == AttributeProto.TENSOR:
        return onnx.numpy_helper.to_array(attr.t)
    return _MISSING


@lru_cache(maxsize=None)
def attribute_defaults(op_type: str, opset: int, domain: str = "") -> dict[str, Any]:
    """Schema attribute -> default value (None where the schema gives no default)."""
    schema = get_schema(op_type, opset, domain)
    if schema is None:
        return {}
    out: dict[str, Any] = {}
    if isinstance(schema, RuntimeSchema):
        for name, default in schema.defaults:
            value = _from_proto(default) if default is not None else _MISSING
            out[name] = None if value is _MISSING else value
        return out
    for name, attr in schema.attributes.items():
        default = attr.default_value
        value = _from_proto(default) if default.type != AttributeProto.UNDEFINED else _MISSING
        out[name] = None if value is _MISSING else value
    return out


def convert_attribute(attr: ir.Attr) -> Any:
    """An onnx_ir attribute value as a kernel receives it (graphs are left to the lowering)."""
    t = attr.type
    v = attr.value
    if t in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return tuple(v)
    if t == ir.AttributeType.TENSOR:
        return tensor_array(v)
    if t == ir.AttributeType.SPARSE_TENSOR:
        return v
    if t == ir.AttributeType.TENSORS:
        return tuple(tensor_array(x) for x in v)
    return v


def is_graph_attribute(attr: ir.Attr) -> bool:
    return attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


# Mithril's own ops (domain ai.mithril, made by the passes) have no ONNX schema.
_INTERNAL_MAX_OUTPUTS = {"StopGradient": 1, "MatMulAdd": 1}


def max_outputs(op_type: str, opset: int, domain: str = "") -> int:
    if domain == "ai.mithril" and op_type in _INTERNAL_MAX_OUTPUTS:
        return _INTERNAL_MAX_OUTPUTS[op_type]
    schema = get_schema(op_type, opset, domain)
    return schema.max_output if schema is not None else 2**31
