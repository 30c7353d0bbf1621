"""Reductions over ``axis`` (an int, a tuple, or None for all axes) with ``keepdim``."""

from __future__ import annotations

import numpy as np

from .block import register
from .model import In, Out, Primitive, ShapeView


def _axes(axis, rank: int | None):
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if rank is None:
        return None if any(a < 0 for a in axes) else axes
    return tuple(sorted(a % rank for a in axes))


class Reduction(Primitive):
    ports = {"input": In(None), "output": Out(None)}
    op_type = ""

    def __init__(self, axis=None, keepdim: bool = False, name: str | None = None):
        self.axis = axis if axis is None or isinstance(axis, int) else tuple(int(a) for a in axis)
        self.keepdim = bool(keepdim)
        super().__init__(name)

    def attributes(self):
        return {"axis": self.axis, "keepdim": self.keepdim}

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if self.axis is None and not self.keepdim:
            s.set("output", [])
            return
        if dims is None:
            return
        axes = _axes(self.axis, len(dims)) if self.axis is not None else tuple(range(len(dims)))
        s.set("output", [1 if i in axes else d for i, d in enumerate(dims)] if self.keepdim
              else [d for i, d in enumerate(dims) if i not in axes])

    def lower(self, g, input):
        return g.reduce(self.op_type, input, self.axis, self.keepdim)


def _table(rows):
    for name, op_type, doc in rows:
        register(type(name, (Reduction,), {"op_type": op_type, "__doc__": doc, "__module__": __name__,
                                           "__qualname__": name}))


_table([
    ("Sum", "ReduceSum", "Sum over ``axis``."),
    ("Mean", "ReduceMean", "Mean over ``axis``."),
    ("Max", "ReduceMax", "Maximum over ``axis``."),
    ("Min", "ReduceMin", "Minimum over ``axis``."),
    ("Prod", "ReduceProd", "Product over ``axis``."),
])


@register
class Variance(Reduction):
    """Variance over ``axis``; ``correction=1`` gives the unbiased estimate."""

    def __init__(self, axis=None, keepdim: bool = False, correction: float = 0.0, name: str | None = None):
        self.correction = float(correction)
        super().__init__(axis, keepdim, name)

    def attributes(self):
        return {**super().attributes(), "correction": self.correction}

    def lower(self, g, input):
        mean = g.reduce("ReduceMean", input, self.axis, True)
        d = g.op("Sub", input, mean)
        total = g.reduce("ReduceSum", g.op("Mul", d, d), self.axis, self.keepdim)
        # The count reduced over is size(x) / size(mean), whatever dims are dynamic.
        n = g.op("Cast", g.op("Div", g.op("Size", input, dtype=np.int64), g.op("Size", mean, dtype=np.int64)),
                 to=_onnx_type(g.dtype(input)), dtype=g.dtype(input))
        if self.correction:
            n = g.op("Sub", n, g.const(self.correction, like=input))
        return g.op("Div", total, n)


def _onnx_type(dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


class ArgReduction(Primitive):
    ports = {"input": In(None), "output": Out(None, int)}
    op_type = ""

    def __init__(self, axis: int | None = None, keepdim: bool = False, name: str | None = None):
        self.axis = None if axis is None else int(axis)
        self.keepdim = bool(keepdim)
        super().__init__(name)

    def attributes(self):
        return {"axis": self.axis, "keepdim": self.keepdim}

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if self.axis is None and not self.keepdim:
            s.set("output", [])
        elif dims is not None:
            axes = _axes(self.axis, len(dims)) if self.axis is not None else tuple(range(len(dims)))
            s.set("output", [1 if i in axes else d for i, d in enumerate(dims)] if self.keepdim
                  else [d for i, d in enumerate(dims) if i not in axes])

    def lower(self, g, input):
        if self.axis is not None:
            return g.op(self.op_type, input, axis=self.axis, keepdims=int(self.keepdim), dtype=np.int64)
        flat = g.op("Reshape", input, g.ints([-1]))
        out = g.op(self.op_type, flat, axis=0, keepdims=0, dtype=np.int64)
        if self.keepdim:
            rank = len(self._ports["input"].shape.dims())
            out = g.op("Reshape", out, g.ints([1] * rank))
        return out


for _name, _op in (("ArgMax", "ArgMax"), ("ArgMin", "ArgMin")):
    register(type(_name, (ArgReduction,), {"op_type": _op, "__doc__": f"Index of the {_op[3:].lower()}imum "
                                           "along ``axis`` (of the flattened input when None).",
                                           "__module__": __name__, "__qualname__": _name}))
