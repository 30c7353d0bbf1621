"""Op schemas from ``onnx.defs``: attribute defaults and arity, parsed by attribute type."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import onnx
import onnx.defs
import onnx_ir as ir
from onnx import AttributeProto

_MISSING = object()


@lru_cache(maxsize=None)
def get_schema(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


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
        return v.numpy()
    if t == ir.AttributeType.SPARSE_TENSOR:
        return v
    if t == ir.AttributeType.TENSORS:
        return tuple(x.numpy() for x in v)
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
