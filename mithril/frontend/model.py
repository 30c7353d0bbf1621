"""Logical models: blocks with named terminals, wired into a graph.

A :class:`Block` declares terminals (inputs, trainable parameters, outputs) with symbolic shape
templates. A :class:`Model` holds child blocks and the connections (:class:`Wire`) between their
terminals; it is itself a block, so models nest. ``model |= block(...)`` adds a block with explicit
bindings; ``model += block`` also chains the model's last output into the block's first input.
Every connection unifies shapes and types at once, so a mismatch raises on the line that made it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import dtypes as _dtypes
from ..errors import (
    ConnectionKeyError,
    CycleError,
    DuplicateOutputError,
    ExportError,
    ModelError,
    ShapeMismatchError,
    TypeMismatchError,
)
from ..onnx_bridge.load import OnnxModel, OnnxModelCall
from . import shapes as S
from .shapes import Conflict, Dim, Namer, ShapeNode, TypeNode, Var

_UNBOUND = object()


# -- terminal declarations ----------------------------------------------------------------------
@dataclass(frozen=True)
class PortSpec:
    """How a block declares one terminal.

    ``shape`` is a template: ints are fixed dims, strings are symbols shared within the block
    (``"in"``), ``"..."`` (or ``"...name"``) is a run of any number of dims, None a free dim; a
    template of None means any shape. ``type`` is None (any), float/int/bool, an ml dtype, or a
    string naming a type variable shared within the block (``"T"``).
    """

    direction: str  # "in" or "out"
    shape: tuple | None = None
    type: Any = None
    param: bool = False
    optional: bool = False
    # How export fills a parameter without a given value: "normal", "zeros", "ones", or an array
    # (an imported model's weights, so they are the default rather than random ones).
    init: Any = "normal"


def In(shape=None, type="T", optional: bool = False) -> PortSpec:  # noqa: N802
    return PortSpec("in", tuple(shape) if shape is not None else None, type, optional=optional)


def Param(shape, init: Any = "normal", type="T") -> PortSpec:  # noqa: N802
    return PortSpec("in", tuple(shape), type, param=True, init=init)


def Out(shape=None, type="T") -> PortSpec:  # noqa: N802
    return PortSpec("out", tuple(shape) if shape is not None else None, type)


class Port:
    """A block's terminal: its declaration plus its own shape and type nodes."""

    __slots__ = ("name", "spec", "shape", "type")

    def __init__(self, name: str, spec: PortSpec, shape: ShapeNode, type: TypeNode):
        self.name, self.spec, self.shape, self.type = name, spec, shape, type

    @property
    def is_input(self) -> bool:
        return self.spec.direction == "in"

    @property
    def param(self) -> bool:
        return self.spec.param


def _shape_from_template(template, symbols: dict[str, Dim], vars_: dict[str, Var]) -> ShapeNode:
    if template is None:
        return ShapeNode.unknown()
    prefix: list[Dim] = []
    suffix: list[Dim] = []
    var = None
    for item in template:
        if isinstance(item, str) and item.startswith("..."):
            if var is not None:
                raise ModelError(f"shape template {template} has two variadics")
            var = vars_.setdefault(item, Var(item))
            continue
        if item is None:
            d = Dim()
        elif isinstance(item, str):
            d = symbols.setdefault(item, Dim(symbol=item))
        else:
            d = Dim(int(item))
        (suffix if var is not None else prefix).append(d)
    return ShapeNode(prefix, var, suffix)


def _type_from_spec(spec_type, type_vars: dict[str, TypeNode]) -> TypeNode:
    if isinstance(spec_type, str):
        return type_vars.setdefault(spec_type, TypeNode())
    return TypeNode(spec_type)


# -- keys, wires and handles --------------------------------------------------------------------
class IOKey:
    """Names an external terminal, optionally with a shape, type, value, or exposure.

    >>> from mithril.models import Model, Linear, IOKey
    >>> m = Model()
    >>> m |= Linear(dimension=4)(input=IOKey("h", shape=["N", 7]), weight=IOKey("w"), output="out")
    >>> m.shape_of("w")
    '[4, 7]'
    """

    def __init__(self, name: str | None = None, shape=None, type=None, value=None, expose: bool | None = None):
        self.name = name
        self.shape = shape
        self.type = type
        self.value = value
        self.expose = expose

    def __repr__(self) -> str:
        return f"IOKey({self.name!r})"


class Wire:
    """A connection inside one model: one value, one producer, any number of consumers."""

    def __init__(self, model: Model, name: str | None, origin: tuple[Block, str], param: bool = False,
                 value=None):
        self.model = model
        self.name = name
        self.origin = origin  # the (block, terminal) that created it: auto names derive from it
        self.param = param
        self.value = value
        self.shape = ShapeNode.unknown()
        self.type = TypeNode()
        self.producer: tuple[Block, str] | None = None
        self.consumers: list[tuple[Block, str]] = []
        self.expose = False
        self.init = "normal"

    @property
    def auto_name(self) -> str:
        block, port = self.origin
        return f"{block.name}.{port}"

    @property
    def key(self) -> str:
        return self.name if self.name is not None else self.auto_name

    def __repr__(self) -> str:
        return f"Wire({self.key!r})"


class _Operators:
    """Operators on connections build expressions; binding an expression adds its blocks."""

    def _expr(self, block_name: str, *operands, **attrs) -> Expr:
        return Expr(block_name, operands, attrs)

    def __add__(self, o): return self._expr("Add", self, o)
    def __radd__(self, o): return self._expr("Add", o, self)
    def __sub__(self, o): return self._expr("Subtract", self, o)
    def __rsub__(self, o): return self._expr("Subtract", o, self)
    def __mul__(self, o): return self._expr("Multiply", self, o)
    def __rmul__(self, o): return self._expr("Multiply", o, self)
    def __truediv__(self, o): return self._expr("Divide", self, o)
    def __rtruediv__(self, o): return self._expr("Divide", o, self)
    def __pow__(self, o): return self._expr("Power", self, o)
    def __rpow__(self, o): return self._expr("Power", o, self)
    def __matmul__(self, o): return self._expr("MatrixMultiply", self, o)
    def __rmatmul__(self, o): return self._expr("MatrixMultiply", o, self)
    def __neg__(self): return self._expr("Negate", self)
    def __abs__(self): return self._expr("Absolute", self)
    def __gt__(self, o): return self._expr("Greater", self, o)
    def __ge__(self, o): return self._expr("GreaterEqual", self, o)
    def __lt__(self, o): return self._expr("Less", self, o)
    def __le__(self, o): return self._expr("LessEqual", self, o)
    def __and__(self, o): return self._expr("LogicalAnd", self, o)
    def __or__(self, o): return self._expr("LogicalOr", self, o)
    def __xor__(self, o): return self._expr("LogicalXor", self, o)
    def __invert__(self): return self._expr("LogicalNot", self)
    def __getitem__(self, index): return self._expr("Indexer", self, index=index)

    __hash__ = object.__hash__

    def eq(self, o): return self._expr("Equal", self, o)
    def ne(self, o): return self._expr("NotEqual", self, o)

    @property
    def T(self):  # noqa: N802
        return self._expr("Transpose", self)

    def transpose(self, axes=None): return self._expr("Transpose", self, axes=axes)
    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]  # a.reshape((2, -1)) as well as a.reshape(2, -1)
        return self._expr("Reshape", self, shape=shape)
    def sum(self, axis=None, keepdim=False): return self._expr("Sum", self, axis=axis, keepdim=keepdim)
    def mean(self, axis=None, keepdim=False): return self._expr("Mean", self, axis=axis, keepdim=keepdim)
    def max(self, axis=None, keepdim=False): return self._expr("Max", self, axis=axis, keepdim=keepdim)
    def min(self, axis=None, keepdim=False): return self._expr("Min", self, axis=axis, keepdim=keepdim)
    def cast(self, dtype): return self._expr("Cast", self, dtype=dtype)
    def shape(self): return self._expr("Shape", self)  # noqa: A003


class Connection(_Operators):
    """A handle on a wire of a model (``model.input``, ``block.output``), usable in bindings and
    in operator expressions (``a + b``, ``a @ b``, ``a[..., 1:]``, ``a.T``)."""

    def __init__(self, model: Model, wire: Wire):
        self.model = model
        self.wire = wire

    def __repr__(self) -> str:
        return f"Connection({self.wire.key!r} in {self.model._label()})"


class Expr(_Operators):
    """An operator expression over connections, materialized as blocks when bound."""

    def __init__(self, block_name: str, operands: tuple, attrs: dict):
        self.block_name = block_name
        self.operands = operands
        self.attrs = attrs

    def make_block(self) -> tuple[Block, dict]:
        from .block import BLOCKS

        cls = BLOCKS[self.block_name]
        block = cls(**self.attrs)
        names = [n for n, p in block._ports.items() if p.is_input and not p.param]
        return block, dict(zip(names, self.operands))

    def __repr__(self) -> str:
        return f"Expr({self.block_name}, {self.operands!r})"


class Call:
    """A block with terminal bindings, ready for ``model |= ...`` or ``model += ...``."""

    def __init__(self, block: Block, bindings: dict):
        self.block = block
        self.bindings = bindings


# -- blocks -------------------------------------------------------------------------------------
class Block:
    """Base of primitives and models: named terminals, a canonical input and output."""

    block_name: ClassVar[str | None] = None  # base of auto names; default: the class name, lower case
    # A Model of child blocks, flattened on export; export reads this rather than importing Model.
    composite: ClassVar[bool] = False

    def __init__(self, name: str | None = None):
        self.name = name
        self.parent: Model | None = None

    def __call__(self, **bindings) -> Call:
        return Call(self, bindings)

    def connect(self, **bindings) -> Call:
        """Same as calling the block: ``block.connect(output="y")``."""
        return Call(self, bindings)

    @classmethod
    def base_name(cls) -> str:
        return cls.block_name or cls.__name__.lower()

    def _ports_for_parent(self) -> dict[str, Port]:
        raise NotImplementedError

    def _canonical(self) -> tuple[str | None, str | None]:
        ports = self._ports_for_parent()
        cin = next((n for n, p in ports.items() if p.is_input and not p.param), None)
        cout = next((n for n, p in ports.items() if not p.is_input), None)
        return cin, cout

    def _own_terminal(self, key: str) -> Connection | None:
        return None

    def _path(self) -> str:
        parts = []
        b = self
        while b is not None:
            parts.append(b.name or b.base_name())
            b = b.parent
        return ".".join(reversed(parts))

    def __getattr__(self, key: str) -> Connection:
        if key.startswith("_") or "parent" not in self.__dict__:
            raise AttributeError(key)
        parent = self.__dict__["parent"]
        if parent is not None:
            wire = parent._bindings.get((self, key))
            if wire is not None:
                return Connection(parent, wire)
        own = self._own_terminal(key)
        if own is not None:
            return own
        where = "" if parent is not None else " (add it to a model first to use its terminals)"
        raise AttributeError(f"{type(self).__name__} {self.name or ''} has no connected terminal {key!r}{where}")


class Primitive(Block):
    """A block that lowers to ONNX nodes directly.

    Subclasses declare ``ports`` (or ``port_specs()`` when they depend on arguments), may refine
    shapes in ``infer(s)`` beyond what templates say, and emit ONNX in ``lower(g, **inputs)``.
    """

    ports: ClassVar[dict[str, PortSpec]] = {}

    def __init__(self, name: str | None = None, dims: dict[str, int | None] | None = None):
        super().__init__(name)
        symbols: dict[str, Dim] = {}
        for sym, val in (dims or {}).items():
            symbols[sym] = Dim(int(val) if val is not None else None, symbol=sym)
        vars_: dict[str, Var] = {}
        type_vars: dict[str, TypeNode] = {}
        self._ports: dict[str, Port] = {
            n: Port(n, spec, _shape_from_template(spec.shape, symbols, vars_), _type_from_spec(spec.type, type_vars))
            for n, spec in self.port_specs().items()
        }

    def port_specs(self) -> dict[str, PortSpec]:
        return self.ports

    def export_for_compile(self, *, shapes=None, dtype=None):
        """``ml.compile``'s hook (:class:`mithril.compile.Exportable`): a bare block compiles as a
        one-block Model whose terminals keep their port names (``input``, ``weight``, ``output``)."""
        wrapper = Model(self.name)
        wrapper |= self(**{port: port for port in self.port_specs()})
        return wrapper.export_for_compile(shapes=shapes, dtype=dtype)

    def _ports_for_parent(self) -> dict[str, Port]:
        return self._ports

    def infer(self, s: ShapeView) -> None:
        """Shape rule beyond the templates (broadcasting, reductions, reshapes); may call s.set."""

    def lower(self, g, **inputs):
        raise ExportError(f"{type(self).__name__} has no ONNX lowering")

    def attributes(self) -> dict:
        """Shown by summary(); subclasses list their settings."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name or ''})"


class ShapeView:
    """What a shape rule sees of its block's terminals."""

    def __init__(self, block: Primitive):
        self.block = block

    def __getitem__(self, port: str) -> list[Dim] | None:
        return self.block._ports[port].shape.dims()

    def values(self, port: str) -> list[int | None] | None:
        return self.block._ports[port].shape.values()

    def rank(self, port: str) -> int | None:
        d = self[port]
        return None if d is None else len(d)

    def min_rank(self, port: str) -> int:
        prefix, _, suffix = self.block._ports[port].shape.normalized()
        return len(prefix) + len(suffix)

    def set(self, port: str, dims) -> None:
        """Unify ``port``'s shape with ``dims`` (ints, Dims, or None for "don't know")."""
        node = self.block._ports[port].shape
        cur = node.dims()
        if cur is not None:
            if len(cur) != len(dims):
                raise Conflict(f"{port} has rank {len(cur)} but the rule gives rank {len(dims)}")
            for have, want in zip(cur, dims):
                if isinstance(want, Dim):
                    S.unify_dims(have, want)
                elif want is not None:
                    S.fix_dim(have, int(want))
            return
        new = ShapeNode([d if isinstance(d, Dim) else Dim(d) for d in dims])
        if not S.unify_shapes(node, new):
            raise Conflict(f"{port}: cannot unify with {dims}")


def broadcast_dims(a: list[Dim], b: list[Dim]) -> list:
    """NumPy broadcasting of two known-rank shapes: a Dim, an int, or None (unknown) per axis."""
    n = max(len(a), len(b))
    a = [None] * (n - len(a)) + list(a)
    b = [None] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x is None or y is None:
            out.append(x if y is None else y)
            continue
        x, y = x.root(), y.root()
        if x is y:
            out.append(x)
        elif x.value == 1:
            out.append(y)
        elif y.value == 1:
            out.append(x)
        elif x.value is not None and y.value is not None:
            if x.value != y.value:
                raise Conflict(f"cannot broadcast {x.value} with {y.value}")
            out.append(x)
        elif x.value is not None or y.value is not None:
            out.append(x.value or y.value)  # the other is 1 or equal; only 1 would change it
        else:
            out.append(None)
    return out


# -- models -------------------------------------------------------------------------------------
class Model(Block):
    """A graph of blocks. Compose with ``|=`` (explicit terminals) and ``+=`` (chained).

    >>> from mithril.models import Model, Linear, Relu
    >>> m = Model()
    >>> m |= Linear(dimension=8)(input="input", output="hidden")
    >>> m += Relu()
    >>> m += Linear(dimension=2)(output="output")
    >>> m.shape_of("output")
    '[..., 2]'
    """

    composite = True

    def __init__(self, name: str | None = None):
        super().__init__(name)
        self._blocks: list[Block] = []
        self._wires: list[Wire] = []
        self._named: dict[str, Wire] = {}
        self._bindings: dict[tuple[Block, str], Wire] = {}
        self._child_ports: dict[Block, dict[str, Port]] = {}
        self._symbols: dict[str, Dim] = {}
        self._pending: list[tuple[ShapeNode, ShapeNode]] = []
        self._frozen_ports: dict[str, Port] | None = None
        self._frozen_wires: dict[str, Wire] | None = None

    # composition ------------------------------------------------------------------------------
    def __ior__(self, item) -> Model:
        self.extend(item)
        return self

    def __iadd__(self, item) -> Model:
        self.extend(item, chain=True)
        return self

    def extend(self, item, chain: bool = False, **bindings) -> Model:
        """Add a block; ``chain`` binds the model's last output to its first input."""
        if isinstance(item, Call):
            block, bindings = item.block, {**item.bindings, **bindings}
        elif isinstance(item, Block):
            block = item
        elif isinstance(item, (OnnxModel, OnnxModelCall)):
            # A loaded ONNX model, called with bindings or not, is added as an OnnxBlock.
            from .block import BLOCKS

            loaded, called = (item, {}) if isinstance(item, OnnxModel) else (item.model, item.bindings)
            block, bindings = BLOCKS["OnnxBlock"](loaded), {**called, **bindings}
        else:
            raise ModelError(f"{self._label()}: cannot add {type(item).__name__}; add a block or block(...)")
        if self.parent is not None or self._frozen_ports is not None:
            raise ModelError(f"{self._label()} is already part of another model and can no longer change")
        if block is self or block.parent is not None:
            owner = "itself" if block is self else block.parent._label()
            raise ModelError(f"{self._label()}: block {block.name or type(block).__name__} already belongs to {owner}; "
                             f"create a new block for each use")
        with S.transaction():
            self._insert(block, bindings, chain)
            self._solve()
        return self

    def _label(self) -> str:
        return f"model {self.name or type(self).__name__.lower()!r}"

    def _unique_name(self, block: Block) -> str:
        taken = {b.name for b in self._blocks}
        if block.name is not None:
            if block.name in taken:
                raise ModelError(f"{self._label()}: two blocks are named {block.name!r}")
            return block.name
        base = block.base_name()
        k = sum(1 for b in self._blocks if b.base_name() == base)
        while f"{base}_{k}" in taken:
            k += 1
        return f"{base}_{k}"

    def _insert(self, block: Block, bindings: dict, chain: bool) -> Wire | None:
        ports = block._ports_for_parent()
        unknown = [k for k in bindings if k not in ports]
        if unknown:
            raise ModelError(f"{self._label()}: {type(block).__name__} has no terminal(s) {unknown}; "
                             f"its terminals are {list(ports)}")
        S.tracked_setattr(block, "name", self._unique_name(block))
        S.tracked_setattr(block, "parent", self)
        self._blocks.append(block)
        S.log_undo(self._blocks.pop)
        self._child_ports[block] = ports
        S.log_undo(lambda: self._child_ports.pop(block, None))
        cin, cout = block._canonical()
        last = self._cout_wire()
        order = [n for n, p in ports.items() if p.is_input] + [n for n, p in ports.items() if not p.is_input]
        for pname in order:
            port = ports[pname]
            if pname in bindings:
                target = bindings[pname]
            elif chain and pname == cin and last is not None:
                target = Connection(self, last)
            else:
                target = _UNBOUND
            wire = self._resolve(target, block, port)
            if wire is not None:
                self._attach(block, port, wire)
        return self._bindings.get((block, cout)) if cout else None

    def _new_wire(self, name, origin, param=False, value=None) -> Wire:
        wire = Wire(self, name, origin, param=param, value=value)
        if origin[0] is not None and origin[1] in getattr(origin[0], "_ports", {}):
            wire.init = origin[0]._ports[origin[1]].spec.init
        self._wires.append(wire)
        S.log_undo(self._wires.pop)
        if name is not None:
            self._named[name] = wire
            S.log_undo(lambda: self._named.pop(name, None))
        return wire

    def _resolve(self, target, block: Block, port: Port) -> Wire | None:
        if target is _UNBOUND:
            return self._new_wire(None, (block, port.name), param=port.param)
        if target is None:
            if port.spec.optional:
                return None
            raise ModelError(f"{self._label()}: terminal {block.name}.{port.name} is required; it cannot be None")
        if isinstance(target, str):
            target = IOKey(target)
        if isinstance(target, IOKey):
            return self._wire_for_key(target, block, port)
        if isinstance(target, Connection):
            if target.model is not self:
                raise ModelError(f"{self._label()}: {block.name}.{port.name} is bound to {target!r}, "
                                 f"a connection of another model")
            return target.wire
        if isinstance(target, Expr):
            if not port.is_input:
                raise ModelError(f"{self._label()}: output terminal {block.name}.{port.name} cannot be bound "
                                 f"to an expression")
            return self._materialize(target)
        if isinstance(target, (Block, Call, OnnxModel, OnnxModelCall)):
            raise ModelError(f"{self._label()}: {block.name}.{port.name} is bound to a block; "
                             f"bind it to a name, an IOKey or a connection")
        if not port.is_input:
            raise ModelError(f"{self._label()}: output terminal {block.name}.{port.name} cannot be bound to a value")
        wire = self._new_wire(None, (block, port.name), value=target)
        self._apply_value(wire, target)
        return wire

    def _apply_value(self, wire: Wire, value) -> None:
        if isinstance(value, bool):
            kind = bool
        elif isinstance(value, float):
            kind = float
        elif isinstance(value, int):
            kind = None  # a Python int takes the type of what it meets (x + 2 stays float)
        else:
            arr = np.asarray(value)
            kind = _dtypes.as_dtype(arr.dtype) if arr.dtype != object else None
        self._unify_shape(wire.shape, ShapeNode.of(np.shape(value)), wire.key, "its value", wire.key, "")
        self._unify_type(wire.type, TypeNode(kind), wire.key, "its value")
        if wire.value is None:
            S.tracked_setattr(wire, "value", value)

    def _wire_for_key(self, key: IOKey, block: Block, port: Port) -> Wire:
        wire = self._named.get(key.name) if key.name is not None else None
        if wire is None:
            wire = self._new_wire(key.name, (block, port.name), param=port.param and key.value is None)
        if key.shape is not None:
            self._unify_shape(wire.shape, self._key_shape(key.shape), repr(wire.key), "the IOKey", wire.key, "")
        if key.type is not None:
            self._unify_type(wire.type, TypeNode(key.type), repr(wire.key), "the IOKey")
        if key.value is not None:
            self._apply_value(wire, key.value)
            S.tracked_setattr(wire, "param", False)
        if key.expose is not None:
            S.tracked_setattr(wire, "expose", key.expose)
        return wire

    def _key_shape(self, shape) -> ShapeNode:
        prefix, suffix, var = [], [], None
        for item in shape:
            if isinstance(item, str) and item.startswith("..."):
                var = Var(item)
                continue
            if item is None:
                d = Dim()
            elif isinstance(item, str):
                if item not in self._symbols:
                    self._symbols[item] = Dim(symbol=item, user=True)
                    S.log_undo(lambda item=item: self._symbols.pop(item, None))
                d = self._symbols[item]
            else:
                d = Dim(int(item))
            (suffix if var is not None else prefix).append(d)
        return ShapeNode(prefix, var, suffix)

    def _materialize(self, expr: Expr) -> Wire:
        block, bindings = expr.make_block()
        return self._insert(block, bindings, chain=False)

    def _attach(self, block: Block, port: Port, wire: Wire) -> None:
        where = f"{block.name}.{port.name}"
        if port.is_input:
            wire.consumers.append((block, port.name))
            S.log_undo(wire.consumers.pop)
        else:
            if wire.producer is not None:
                pb, pp = wire.producer
                raise DuplicateOutputError(f"{self._label()}: connection {wire.key!r} is already written by "
                                           f"{pb.name}.{pp}; {where} cannot write it too")
            if wire.value is not None:
                raise DuplicateOutputError(f"{self._label()}: connection {wire.key!r} holds a constant; "
                                           f"{where} cannot write it")
            inputs = [self._bindings[(block, n)] for n, p in self._child_ports[block].items()
                      if p.is_input and (block, n) in self._bindings]
            if self._depends_on(inputs, wire):
                raise CycleError(f"{self._label()}: binding {where} to {wire.key!r} makes a cycle: "
                                 f"{block.name} already reads {wire.key!r} through its inputs")
            S.tracked_setattr(wire, "producer", (block, port.name))
            S.tracked_setattr(wire, "param", False)
        self._bindings[(block, port.name)] = wire
        S.log_undo(lambda: self._bindings.pop((block, port.name), None))
        self._unify_shape(port.shape, wire.shape, where, "", repr(wire.key), "")
        self._unify_type(port.type, wire.type, where, repr(wire.key))

    def _depends_on(self, wires: list[Wire], target: Wire) -> bool:
        seen: set[int] = set()
        stack = list(wires)
        while stack:
            w = stack.pop()
            if w is target:
                return True
            if id(w) in seen or w.producer is None:
                continue
            seen.add(id(w))
            b = w.producer[0]
            stack.extend(self._bindings[(b, n)] for n, p in self._child_ports[b].items()
                         if p.is_input and (b, n) in self._bindings)
        return False

    def _unify_shape(self, a: ShapeNode, b: ShapeNode, a_name, _a, b_name, _b) -> None:
        namer = Namer()
        before = (namer.shape(a), namer.shape(b))
        try:
            if not S.unify_shapes(a, b):
                self._pending.append((a, b))
                S.log_undo(self._pending.pop)
        except Conflict as exc:
            raise ShapeMismatchError(f"{self._label()}: cannot connect {a_name} (shape {before[0]}) to "
                                     f"{b_name} (shape {before[1]}): {exc}") from None

    def _unify_type(self, a: TypeNode, b: TypeNode, a_name, b_name) -> None:
        try:
            S.unify_types(a, b)
        except Conflict as exc:
            raise TypeMismatchError(f"{self._label()}: cannot connect {a_name} (type "
                                    f"{S.type_name(a.root().value)}) to {b_name} (type "
                                    f"{S.type_name(b.root().value)}): {exc}") from None

    def _solve(self) -> None:
        prims = list(self.primitives())
        for _ in range(64):
            before = S.mutation_count
            for path, prim in prims:
                try:
                    prim.infer(ShapeView(prim))
                except Conflict as exc:
                    namer = Namer()
                    shown = ", ".join(f"{n} {namer.shape(p.shape)}" for n, p in prim._ports.items())
                    raise ShapeMismatchError(f"{self._label()}: the shape rule of {path} "
                                             f"({type(prim).__name__}) fails: {exc}; its terminals: {shown}") from None
            for a, b in list(self._pending):
                if S.unify_shapes(a, b):
                    self._pending.remove((a, b))
                    S.log_undo(lambda a=a, b=b: self._pending.append((a, b)))
            if S.mutation_count == before:
                return

    def set_outputs(self, *names: str, **targets) -> Model:
        """Expose connections as outputs: by name, or ``name=connection_or_expression``."""
        with S.transaction():
            for n in names:
                wire = self._named.get(n)
                if wire is None or wire.producer is None:
                    raise ModelError(f"{self._label()}: {n!r} is not a connection written by a block")
                S.tracked_setattr(wire, "expose", True)
            for n, target in targets.items():
                from .block import BLOCKS

                self._insert(BLOCKS["Buffer"](), {"input": target, "output": IOKey(n, expose=True)}, chain=False)
            self._solve()
        return self

    # views ------------------------------------------------------------------------------------
    def primitives(self, prefix: str = "") -> Iterator[tuple[str, Primitive]]:
        for b in self._blocks:
            if isinstance(b, Model):
                yield from b.primitives(prefix + b.name + ".")
            else:
                yield prefix + b.name, b

    def __getattr__(self, key: str):
        # Child blocks by name (model.linear_0), then terminals.
        if not key.startswith("_") and "_blocks" in self.__dict__:
            for b in self.__dict__["_blocks"]:
                if b.name == key:
                    return b
        return super().__getattr__(key)

    def _own_terminal(self, key: str) -> Connection | None:
        wire = self._named.get(key)
        return Connection(self, wire) if wire is not None else None

    def __getitem__(self, key: str) -> Connection:
        wire = self._named.get(key)
        if wire is None:
            raise ConnectionKeyError(f"{self._label()} has no connection {key!r}")
        return Connection(self, wire)

    def _cout_wire(self) -> Wire | None:
        for b in reversed(self._blocks):
            _, cout = b._canonical()
            if cout is not None and (b, cout) in self._bindings:
                return self._bindings[(b, cout)]
        return None

    def _cin_wire(self) -> Wire | None:
        for b in self._blocks:
            cin, _ = b._canonical()
            w = self._bindings.get((b, cin)) if cin else None
            if w is not None and w.producer is None and w.value is None:
                return w
            return None
        return None

    def external(self) -> tuple[list[Wire], list[Wire]]:
        """The model's terminals: (inputs, outputs) wires. Inputs are named connections no block
        writes (data and named parameters) plus the unnamed canonical input; outputs are named
        connections that no block here reads (or exposed ones), else the canonical output."""
        cin = self._cin_wire()
        inputs = [w for w in self._wires if w.producer is None and w.value is None and
                  (w.name is not None or w is cin)]
        outputs = [w for w in self._wires if w.producer is not None and w.name is not None and
                   (w.expose or not w.consumers)]
        cout = self._cout_wire()
        if cout is not None and cout.producer is not None and cout not in outputs and \
                (not outputs or cout.name is None and not cout.consumers):
            outputs.append(cout)
        return inputs, outputs

    def _ports_for_parent(self) -> dict[str, Port]:
        if self._frozen_ports is None:
            inputs, outputs = self.external()
            ports: dict[str, Port] = {}
            wires: dict[str, Wire] = {}
            for w in inputs:
                spec = PortSpec("in", param=w.param, init=w.init)
                ports[w.key], wires[w.key] = Port(w.key, spec, w.shape, w.type), w
            for w in outputs:
                ports[w.key], wires[w.key] = Port(w.key, PortSpec("out"), w.shape, w.type), w
            S.tracked_setattr(self, "_frozen_ports", ports)
            S.tracked_setattr(self, "_frozen_wires", wires)
        return self._frozen_ports

    def _canonical(self) -> tuple[str | None, str | None]:
        cin, cout = self._cin_wire(), self._cout_wire()
        ports = self._ports_for_parent()
        return (cin.key if cin is not None and cin.key in ports else None,
                cout.key if cout is not None and cout.key in ports else None)

    def shape_of(self, key: str) -> str:
        """The inferred (possibly symbolic) shape of a named connection, as text."""
        wire = self._named.get(key)
        if wire is None:
            raise ConnectionKeyError(f"{self._label()} has no connection {key!r}")
        return Namer().shape(wire.shape)

    def summary(self, file=None) -> str:
        """Print child blocks, their terminals and inferred shapes (symbolic where unknown)."""
        from .summary import render_summary

        return render_summary(self, file=file)

    def export_for_compile(self, *, shapes=None, dtype=None):
        """``ml.compile``'s hook (:class:`mithril.compile.Exportable`): this model as ONNX, with its
        buffers (BatchNorm running statistics), which compile keeps out of the trainable keys."""
        from ..compile import ExportedModel
        from .onnx_export import buffer_updates

        buffers = frozenset(buffer_updates(self))
        return ExportedModel(self.to_onnx_model(shapes=shapes, dtype=dtype), buffers=buffers)

    def to_onnx_model(self, shapes=None, params=None, opset: int | None = None, dynamic_axes=None, dtype=None):
        """Export to an :class:`~mithril.onnx_bridge.load.OnnxModel` (``ml.compile`` calls this with
        the backend's ``dtype``: the type of every float nobody fixed; float32 when None)."""
        from .onnx_export import build_onnx

        import onnx_ir as ir

        proto, _ = build_onnx(self, shapes=shapes, params=params, opset=opset, dynamic_axes=dynamic_axes,
                              dtype=dtype)
        return OnnxModel(ir.serde.deserialize_model(proto), source=self.name or "model")

    def __repr__(self) -> str:
        inputs, outputs = self.external()
        return (f"{type(self).__name__}({self.name or ''}, blocks={len(self._blocks)}, "
                f"inputs={[w.key for w in inputs]}, outputs={[w.key for w in outputs]})")
