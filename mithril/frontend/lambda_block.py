"""Lambda: a block whose function is written with a backend's tensor API and Python operators.

The function is traced, as ``torch.fx`` traces a module: it is called with :class:`Traced`
values, and each operator (``+ - * / ** @``, comparisons) and each call of a backend's tensor
API on them (``backend.maximum(a, b)``, ``backend.exp(x)``...; the names are
:data:`~mithril.backends.backend.TRACEABLE_API`) emits ONNX nodes. So a model holding a Lambda
exports to ``.onnx``, runs on every backend and differentiates wherever the backend does.

>>> import mithril as ml, numpy as np
>>> backend = ml.NumpyBackend()
>>> def leaky(x):
...     return backend.maximum(0.01 * x, x)
>>> model = ml.Model()
>>> model |= ml.Lambda(leaky)(input=ml.IOKey("input", shape=["N", 3]), output="output")
>>> model.shape_of("output")
'[N, 3]'
>>> pm = ml.compile(model, backend)
>>> pm.evaluate({}, {"input": np.array([[-100.0, 0.0, 2.0]], np.float32)})["output"].tolist()
[[-1.0, 0.0, 2.0]]
"""

from __future__ import annotations

import copy
import inspect
import os
import re
import traceback

import numpy as np
import onnx
from onnx import helper

from .. import dtypes as _dtypes
from ..backends.backend import Backend
from ..backends.tensor_api import TRACEABLE_API
from ..backends.table import array_backend
from ..errors import LambdaTraceError, ModelError
from . import shapes as S
from .block import register
from .elementwise import broadcast_rule
from .model import In, Out, Primitive, ShapeView
from .onnx_export import FALLBACK_OPSET, Emitter

_MITHRIL = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- traced values ------------------------------------------------------------------------------
class Traced:
    """A value inside a Lambda's function while it is traced: an ONNX value name and its tracer.

    Operators and the backend tensor API emit nodes; anything asking for the data (a framework
    function, ``float(x)``, ``if x > 0:``) raises, naming what to write instead.
    """

    __slots__ = ("tracer", "name")
    __array_ufunc__ = None  # NumPy operators defer to ours; NumPy ufuncs refuse

    def __init__(self, tracer: Tracer, name: str):
        self.tracer, self.name = tracer, name

    def __repr__(self) -> str:
        return f"Traced({self.name!r}, {self.dtype})"

    @property
    def dtype(self) -> np.dtype:
        return self.tracer.g.dtype(self.name)

    # The backend tensor API forwards here when an argument is traced (mithril/backends/backend.py).
    def __mithril_function__(self, backend, name: str, args: tuple, kwargs: dict):
        return self.tracer.call(name, args, kwargs)

    def __add__(self, o): return self.tracer.binary("Add", self, o)
    def __radd__(self, o): return self.tracer.binary("Add", o, self)
    def __sub__(self, o): return self.tracer.binary("Sub", self, o)
    def __rsub__(self, o): return self.tracer.binary("Sub", o, self)
    def __mul__(self, o): return self.tracer.binary("Mul", self, o)
    def __rmul__(self, o): return self.tracer.binary("Mul", o, self)
    def __truediv__(self, o): return self.tracer.binary("Div", self, o)
    def __rtruediv__(self, o): return self.tracer.binary("Div", o, self)
    def __pow__(self, o): return self.tracer.binary("Pow", self, o)
    def __rpow__(self, o): return self.tracer.binary("Pow", o, self)
    def __matmul__(self, o): return self.tracer.binary("MatMul", self, o)
    def __rmatmul__(self, o): return self.tracer.binary("MatMul", o, self)
    def __neg__(self): return self.tracer.unary("Neg", self)
    def __pos__(self): return self
    def __abs__(self): return self.tracer.unary("Abs", self)
    def __gt__(self, o): return self.tracer.binary("Greater", self, o, bool)
    def __ge__(self, o): return self.tracer.binary("GreaterOrEqual", self, o, bool)
    def __lt__(self, o): return self.tracer.binary("Less", self, o, bool)
    def __le__(self, o): return self.tracer.binary("LessOrEqual", self, o, bool)
    def __eq__(self, o): return self.tracer.binary("Equal", self, o, bool)  # type: ignore[override]
    def __ne__(self, o):  # type: ignore[override]
        return self.tracer.unary("Not", self.tracer.binary("Equal", self, o, bool))

    __hash__ = object.__hash__

    @property
    def T(self):  # noqa: N802
        return self.tracer.call("transpose", (self,), {})

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]  # x.reshape((2, -1)) as well as x.reshape(2, -1)
        return self.tracer.call("reshape", (self, shape), {})

    def transpose(self, *axes):
        return self.tracer.call("transpose", (self, (axes[0] if len(axes) == 1 else axes) or None), {})

    def sum(self, axis=None, keepdims=False): return self.tracer.call("sum", (self, axis, keepdims), {})
    def mean(self, axis=None, keepdims=False): return self.tracer.call("mean", (self, axis, keepdims), {})
    def max(self, axis=None, keepdims=False): return self.tracer.call("max", (self, axis, keepdims), {})
    def min(self, axis=None, keepdims=False): return self.tracer.call("min", (self, axis, keepdims), {})

    # What asks for the data cannot be traced: say so, and what to write instead.
    def __bool__(self):
        raise LambdaTraceError("a traced value has no truth value: Python if/and/or/while on tensor values "
                               "cannot be traced; choose elementwise with backend.where(cond, a, b)")

    def _no_number(self, *_):
        raise LambdaTraceError("a traced value is not a Python number while tracing")

    __float__ = __int__ = __index__ = __complex__ = _no_number

    def __len__(self):
        raise LambdaTraceError("a traced value has no length while tracing (its shape is not known yet)")

    def __iter__(self):
        raise LambdaTraceError("a traced value cannot be iterated while tracing")

    def __array__(self, *_, **__):
        raise LambdaTraceError("a function asked for the traced value's data as an array")

    def __array_function__(self, func, types, args, kwargs):
        raise LambdaTraceError(f"numpy.{func.__name__} was called on a traced value")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise LambdaTraceError(f"torch function {getattr(func, '__name__', func)} was called on a traced value")



# -- the tracer ---------------------------------------------------------------------------------
class Tracer:
    """Emits the nodes of one trace into an :class:`~mithril.frontend.onnx_export.Emitter`."""

    def __init__(self, g: Emitter):
        self.g = g

    def value(self, name: str) -> Traced:
        return Traced(self, name)

    def operand(self, v, dtype: np.dtype | None) -> str:
        """The value name of ``v``: a traced value, or a constant (a Python scalar, a list, a
        NumPy or backend array) of ``dtype``, the dtype of the traced value it meets."""
        if isinstance(v, Traced):
            if v.tracer is not self:
                raise LambdaTraceError("a traced value of another Lambda was used here")
            return v.name
        if isinstance(v, (bool, int, float, list, tuple, np.ndarray, np.generic)):
            arr = np.asarray(v)
        else:
            arr = np.asarray(array_backend(v).to_numpy(v))
        if arr.dtype.kind not in "biuf":
            raise LambdaTraceError(f"{type(v).__name__} {v!r} is not a number or numeric array")
        if dtype is None:  # no traced operand beside it: floats take the model's float type
            dtype = self.g.float_dtype if arr.dtype.kind == "f" else np.dtype(np.int64) if arr.dtype.kind in "iu" \
                else arr.dtype
        cast = arr.astype(dtype)
        if dtype.kind in "biu" and not np.array_equal(cast, arr):
            raise LambdaTraceError(f"the constant {v!r} meets a value of dtype {dtype} and is not one; constants "
                                   f"take the dtype of the value they meet")
        return self.g.const(cast, dtype=dtype)

    def _dtype_of(self, *values) -> np.dtype | None:
        dtypes = {self.g.dtype(v.name) for v in values if isinstance(v, Traced)}
        if len(dtypes) > 1:
            raise LambdaTraceError(f"values of different dtypes ({', '.join(sorted(map(str, dtypes)))}) meet; "
                                   f"a Lambda does not convert them")
        return next(iter(dtypes), None)

    def op(self, op_type: str, *values, dtype=None, **attrs) -> Traced:
        like = self._dtype_of(*values)
        names = [self.operand(v, like) for v in values]
        out = dtype if dtype is not None else like if like is not None else self.g.dtype(names[0])
        return Traced(self, self.g.op(op_type, *names, dtype=out, **attrs))

    def unary(self, op_type: str, x, dtype=None) -> Traced:
        return self.op(op_type, x, dtype=dtype)

    def binary(self, op_type: str, a, b, dtype=None) -> Traced:
        return self.op(op_type, a, b, dtype=dtype)

    def reduce(self, op_type: str, x, axis, keepdim: bool) -> Traced:
        name = self.operand(x, None)
        return Traced(self, self.g.reduce(op_type, name, axis, bool(keepdim)))

    def call(self, name: str, args: tuple, kwargs: dict):
        rule = API.get(name)
        if rule is None:
            raise LambdaTraceError(f"backend.{name} has no tracing rule")
        try:
            return rule(self, *args, **kwargs)
        except TypeError as exc:
            raise LambdaTraceError(f"backend.{name}: {exc}") from None


# -- the traced tensor API: TRACEABLE_API's names, each a rule emitting nodes ----------------------
def _unary(op_type, dtype=None):
    return lambda t, x: t.unary(op_type, x, dtype)


def _binary(op_type):
    return lambda t, a, b: t.binary(op_type, a, b)


def _reduction(op_type):
    def rule(t, x, axis=None, keepdim=False, *, keepdims=None):
        return t.reduce(op_type, x, axis, keepdim if keepdims is None else keepdims)
    return rule


def _reshape(t, x, shape):
    return Traced(t, t.g.op("Reshape", t.operand(x, None), t.g.ints([-1 if d is None else int(d) for d in shape])))


def _transpose(t, x, axes=None):
    return t.op("Transpose", x, perm=None if axes is None else [int(a) for a in axes])


def _concat(t, arrays, axis=0):
    return t.op("Concat", *arrays, axis=int(axis))


def _where(t, cond, a, b):
    like = t._dtype_of(a, b)
    names = [t.operand(cond, np.dtype(bool)), t.operand(a, like), t.operand(b, like)]
    return Traced(t, t.g.op("Where", *names, dtype=t.g.dtype(names[1])))


API = {
    "add": _binary("Add"), "subtract": _binary("Sub"), "multiply": _binary("Mul"), "divide": _binary("Div"),
    "power": _binary("Pow"), "matmul": _binary("MatMul"), "maximum": _binary("Max"), "minimum": _binary("Min"),
    "negative": _unary("Neg"), "abs": _unary("Abs"), "relu": _unary("Relu"), "sigmoid": _unary("Sigmoid"),
    "tanh": _unary("Tanh"), "exp": _unary("Exp"), "log": _unary("Log"), "sqrt": _unary("Sqrt"),
    "sin": _unary("Sin"), "cos": _unary("Cos"), "isnan": _unary("IsNaN", np.dtype(bool)),
    "sum": _reduction("ReduceSum"), "mean": _reduction("ReduceMean"), "max": _reduction("ReduceMax"),
    "min": _reduction("ReduceMin"), "reshape": _reshape, "transpose": _transpose, "concat": _concat,
    "where": _where,
}

# Ops whose output has the broadcast shape of their inputs: a trace of only these (and scalar
# constants) keeps its input's shape, whatever its rank.
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp",
                "Log", "Sqrt", "Sin", "Cos", "IsNaN", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal",
                "Not", "Where", "Identity"}


# -- the block ----------------------------------------------------------------------------------
class _Trace:
    """One trace of the function with float inputs: its nodes, for shapes and port types."""

    def __init__(self, nodes, inputs: list[str], output: str, dtype: np.dtype, opset: int):
        self.nodes, self.inputs, self.output, self.dtype, self.opset = nodes, inputs, output, dtype, opset
        self.elementwise = all(
            n.op_type in _ELEMENTWISE or n.op_type == "Constant" and not n.attribute[0].t.dims for n in nodes)


@register
class Lambda(Primitive):
    """A block computing ``fn``, a function written with Python operators and a backend's tensor
    API (``backend.maximum``, ``backend.exp``, ``backend.sum``, ``backend.where``...; any backend
    object: the calls are traced, not run).

    A one-argument function reads terminal ``input``; a function of several arguments reads one
    terminal per argument, by its name. It writes ``output``. Constants in the function (``0.01``,
    a NumPy array) take the dtype of the value they meet. The function is traced when the block
    is made, so a call that cannot be traced (``mx.maximum`` on a traced value, ``if x > 0:``)
    fails on that line, with what to write instead.

    >>> import mithril as ml
    >>> backend = ml.NumpyBackend()
    >>> block = ml.Lambda(lambda x: backend.maximum(0.01 * x, x))
    >>> m = ml.Model()
    >>> m |= block(input="h", output="y")
    >>> m.shape_of("y")
    '[...v]'
    """

    block_name = "lambda"

    def __init__(self, fn, name: str | None = None):
        if not callable(fn):
            raise ModelError(f"Lambda takes a function, not {fn!r}")
        self.fn = fn
        self.input_names = _input_names(fn)
        self._inferred: dict[tuple, list | None] = {}
        g = Emitter(min(FALLBACK_OPSET, onnx.defs.onnx_opset_version()))
        g.scope = "lambda"
        for n in self.input_names:
            g.dtypes[n] = np.dtype(np.float32)
        output = self._trace(g, {n: n for n in self.input_names})
        self._probe = _Trace(g.nodes, self.input_names, output, g.dtype(output), g.opset)
        super().__init__(name)

    def __deepcopy__(self, memo):
        # Export deep-copies the model: the function (and the backend it may close over) is shared.
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = v if k in ("fn", "_probe", "_inferred") else copy.deepcopy(v, memo)
        return new

    def _label(self) -> str:
        fn = getattr(self.fn, "__qualname__", None) or type(self.fn).__name__
        return f"Lambda({fn})" + (f" {self.name!r}" if getattr(self, "name", None) else "")

    def port_specs(self):
        out_type = "T" if self._probe.dtype == np.float32 else _dtypes.as_dtype(self._probe.dtype)
        if self._probe.elementwise and len(self.input_names) == 1:
            return {"input": In(["..."]), "output": Out(["..."], out_type)}
        ports = {n: In(None) for n in self.input_names}
        ports["output"] = Out(None, out_type)
        return ports

    def attributes(self):
        return {"fn": getattr(self.fn, "__qualname__", repr(self.fn))}

    def infer(self, s: ShapeView) -> None:
        if self._probe.elementwise:
            if len(self.input_names) > 1:
                broadcast_rule(s, self.input_names)
            return
        dims = [s[n] for n in self.input_names]
        if any(d is None for d in dims) or (s.rank("output") is not None and None not in s.values("output")):
            return
        # ONNX shape inference on the trace, with the inputs' dims: known ones as ints, unknown
        # ones as symbols, so an output dim that is an input's dim is unified with it.
        roots: list[S.Dim] = []
        key = []
        for ds in dims:
            row = []
            for d in ds:
                d = d.root()
                if d.value is not None:
                    row.append(d.value)
                else:
                    if not any(d is r for r in roots):
                        roots.append(d)
                    row.append(f"d{next(i for i, r in enumerate(roots) if r is d)}")
            key.append(tuple(row))
        key = tuple(key)
        if key not in self._inferred:
            self._inferred[key] = _infer_output(self._probe, key)
        out = self._inferred[key]
        if out is not None:
            s.set("output", [roots[int(d[1:])] if isinstance(d, str) else d for d in out])

    def lower(self, g, **inputs):
        return self._trace(g, inputs)

    def _trace(self, g: Emitter, inputs: dict[str, str]) -> str:
        tracer = Tracer(g)
        args = [tracer.value(inputs[n]) for n in self.input_names]
        try:
            out = self.fn(*args)
        except Exception as exc:
            raise LambdaTraceError(_failure(self._label(), exc)) from exc
        if not isinstance(out, Traced) or out.tracer is not tracer:
            raise LambdaTraceError(f"{self._label()} returned {type(out).__name__}, not a value computed from its "
                                   f"input{'s' if len(args) > 1 else ''}; a Lambda has one output")
        return out.name


def _input_names(fn) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ["input"]  # a builtin without a signature: one input
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if any(p.kind is p.VAR_POSITIONAL for p in params) or not positional:
        raise ModelError(f"Lambda({getattr(fn, '__qualname__', fn)}): the function needs named positional "
                         f"arguments, one per input (def f(x): ... reads 'input'; def f(a, b): ... reads 'a', 'b')")
    if len(positional) == 1:
        return ["input"]
    if "output" in (p.name for p in positional):
        raise ModelError(f"Lambda({fn.__qualname__}): an argument named 'output' would clash with the output terminal")
    return [p.name for p in positional]


def _infer_output(trace: _Trace, shapes: tuple) -> list | None:
    """The output dims of ``trace`` for input ``shapes`` (ints and symbols), None when unknown."""
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(dims))
              for n, dims in zip(trace.inputs, shapes)]
    out = helper.make_tensor_value_info(trace.output, helper.np_dtype_to_tensor_dtype(trace.dtype), None)
    graph = helper.make_graph(trace.nodes, "lambda", inputs, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", trace.opset)])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception:  # a trace ONNX cannot infer: the output shape stays open
        return None
    t = inferred.graph.output[0].type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param if d.dim_param in _symbols(shapes) else None
            for d in t.shape.dim]


def _symbols(shapes) -> set[str]:
    return {d for dims in shapes for d in dims if isinstance(d, str)}


_FRAMEWORK_CALL = re.compile(r"\b(mx|np|numpy|jnp|jax\.numpy|torch|tf)\.(\w+)\s*\(")


def _failure(label: str, exc: Exception) -> str:
    """What failed in a Lambda's function, where, and what to write instead."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)[1:] if not _internal(f.filename)]
    where = frames[-1] if frames else None
    call = f"`{where.line}` ({os.path.basename(where.filename)}:{where.lineno})" if where and where.line else "its body"
    reason = (str(exc) if isinstance(exc, LambdaTraceError) else f"{type(exc).__name__}: {exc}").rstrip(".")
    hint = ""
    m = _FRAMEWORK_CALL.search(where.line or "") if where else None
    if m and m.group(2) in TRACEABLE_API:
        hint = f" Write backend.{m.group(2)}(...) instead of {m.group(1)}.{m.group(2)}(...)."
    elif m:
        hint = f" {m.group(1)}.{m.group(2)} is not part of the traced tensor API."
    api = ", ".join(sorted(n for n in TRACEABLE_API if hasattr(Backend, n)))
    return (f"{label}: cannot trace {call}: {reason}.{hint} A Lambda's function is traced into ONNX nodes so that "
            f"it runs on every backend: compute with Python operators (+ - * / ** @ < > ...) and a Mithril "
            f"backend's tensor API ({api}); framework functions (mx.*, np.*, jnp.*, torch.*) cannot take "
            f"traced values")


def _internal(filename: str) -> bool:
    """A frame of Mithril itself or of an installed package, not the user's function."""
    path = os.path.abspath(filename)
    return path.startswith(_MITHRIL + os.sep) or "site-packages" in path or "dist-packages" in path
