"""Layers: MatrixMultiply, Linear, MLP, Convolution2D, MaxPool2D, LayerNorm."""

from __future__ import annotations

import math

from . import shapes as S
from .block import register
from .model import In, Model, Out, Param, Primitive, ShapeView, broadcast_dims
from .shapes import Conflict, ShapeNode, Var


@register
class MatrixMultiply(Primitive):
    """``left @ right`` with NumPy matmul semantics (1-D operands, broadcast batch dims)."""

    ports = {"left": In(None), "right": In(None), "output": Out(None)}

    def __init__(self, name: str | None = None):
        self._linked = False
        super().__init__(name)

    def infer(self, s: ShapeView) -> None:
        l, r = s["left"], s["right"]
        if l is not None and r is not None:
            if not l or not r:
                raise Conflict("matmul of a scalar")
            S.unify_dims(l[-1], r[-2] if len(r) >= 2 else r[0])
            if len(l) == 1:
                out = list(r[:-2]) + [r[-1]]
            elif len(r) == 1:
                out = list(l[:-1])
            else:
                out = broadcast_dims(l[:-2], r[:-2]) + [l[-2], r[-1]]
            s.set("output", out)
        elif r is not None and len(r) == 2 and not self._linked:
            # [..., k] @ [k, n] -> [..., n] while the left rank is open.
            S._set(self, "_linked", True)
            var = Var()
            S.unify_shapes(self._ports["left"].shape, ShapeNode((), var, (r[0],)))
            S.unify_shapes(self._ports["output"].shape, ShapeNode((), var, (r[1],)))

    def lower(self, g, left, right):
        return g.op("MatMul", left, right)


@register
class Linear(Primitive):
    """``input @ weight.T + bias``: input [..., in], weight [out, in], bias [out], output [..., out].

    >>> from mithril.models import Model, Linear
    >>> m = Model()
    >>> m |= Linear(dimension=3)(input="x", output="y")
    >>> m.shape_of("y")
    '[..., 3]'
    """

    def __init__(self, dimension: int | None = None, use_bias: bool = True, name: str | None = None):
        self.dimension, self.use_bias = dimension, use_bias
        super().__init__(name, dims={"out": dimension})

    def port_specs(self):
        ports = {"input": In(["...", "in"]), "weight": Param(["out", "in"])}
        if self.use_bias:
            ports["bias"] = Param(["out"])
        ports["output"] = Out(["...", "out"])
        return ports

    def attributes(self):
        return {"dimension": self.dimension, "use_bias": self.use_bias}

    def lower(self, g, input, weight, bias=None):
        y = g.op("MatMul", input, g.op("Transpose", weight, perm=[1, 0]))
        return g.op("Add", y, bias) if bias is not None else y


@register
class MLP(Model):
    """Linear layers of ``dimensions``, each followed by its activation (a block class, a block,
    or None): terminals ``input`` and ``output``.

    >>> from mithril.models import MLP, Relu
    >>> m = MLP(activations=[Relu, None], dimensions=[16, 4])
    >>> m.shape_of("output")
    '[..., 4]'
    """

    def __init__(self, activations, dimensions, use_bias: bool = True, name: str | None = None):
        super().__init__(name)
        activations, dimensions = list(activations), list(dimensions)
        if len(activations) != len(dimensions):
            raise ValueError(f"MLP: {len(activations)} activations for {len(dimensions)} dimensions")
        blocks = []
        for act, dim in zip(activations, dimensions):
            blocks.append(Linear(dim, use_bias=use_bias))
            if act is not None:
                blocks.append(act() if isinstance(act, type) else act)
        for i, block in enumerate(blocks):
            bind = {}
            if i == 0:
                bind["input"] = "input"
            if i == len(blocks) - 1:
                bind["output"] = "output"
            self.extend(block(**bind), chain=i > 0)


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ValueError(f"{what} takes an int or two ints, got {v}")
    return v


def _pads(padding, kernel, dilation, stride) -> tuple[list[int] | None, str | None]:
    """ONNX (pads, auto_pad) for a 2-D window: "same", "valid", an int, a pair, or two pairs."""
    if padding == "valid":
        return [0, 0, 0, 0], None
    if padding == "same":
        if stride != (1, 1):
            return None, "SAME_UPPER"
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [t // 2 for t in totals] + [t - t // 2 for t in totals], None
    if isinstance(padding, int):
        return [padding] * 4, None
    padding = tuple(padding)
    if all(isinstance(p, int) for p in padding) and len(padding) == 2:
        return [padding[0], padding[1], padding[0], padding[1]], None
    (t, b), (left, right) = padding
    return [t, left, b, right], None


def _window_out(size, k, d, s, pads, auto, axis) -> int | None:
    if size is None:
        return None
    if auto is not None:
        return math.ceil(size / s)
    return (size + pads[axis] + pads[axis + 2] - d * (k - 1) - 1) // s + 1


class Window2D(Primitive):
    """Shared by 2-D convolution and pooling: NCHW input, a kernel, stride, padding, dilation."""

    def _window(self, kernel_size, stride, padding, dilation):
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        self.padding = padding
        self.pads, self.auto_pad = _pads(padding, self.kernel_size, self.dilation, self.stride)

    def _spatial(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        out = s["output"]
        for axis in range(2):
            size = dims[2 + axis].root().value
            v = _window_out(size, self.kernel_size[axis], self.dilation[axis], self.stride[axis],
                            self.pads or [0] * 4, self.auto_pad, axis)
            if v is not None:
                if v <= 0:
                    raise Conflict(f"spatial dim {size} is too small for kernel {self.kernel_size}")
                S.fix_dim(out[2 + axis], v)

    def _window_attrs(self) -> dict:
        return {"kernel_shape": list(self.kernel_size), "strides": list(self.stride),
                "dilations": list(self.dilation), "pads": self.pads, "auto_pad": self.auto_pad}

    def attributes(self):
        return {"kernel_size": self.kernel_size, "stride": self.stride, "padding": self.padding,
                "dilation": self.dilation}


@register
class Convolution2D(Window2D):
    """2-D convolution: input [N, C, H, W], weight [out, C/groups, kh, kw], bias [out].

    ``padding`` is "same", "valid", an int, a pair (h, w) or two pairs ((top, bottom), (left, right)).
    """

    def __init__(self, kernel_size, out_channels: int | None = None, stride=1, padding=0, dilation=1,
                 groups: int = 1, use_bias: bool = True, name: str | None = None):
        self._window(kernel_size, stride, padding, dilation)
        self.out_channels, self.groups, self.use_bias = out_channels, int(groups), use_bias
        super().__init__(name, dims={"out": out_channels})

    def port_specs(self):
        kh, kw = self.kernel_size
        ports = {"input": In(["N", "C", "H", "W"]), "weight": Param(["out", "Cg", kh, kw])}
        if self.use_bias:
            ports["bias"] = Param(["out"])
        ports["output"] = Out(["N", "out", None, None])
        return ports

    def attributes(self):
        return {**super().attributes(), "out_channels": self.out_channels, "groups": self.groups}

    def infer(self, s: ShapeView) -> None:
        c, cg = s["input"][1], s["weight"][1]
        if self.groups == 1:
            S.unify_dims(c, cg)
        elif c.root().value is not None:
            if c.root().value % self.groups:
                raise Conflict(f"{c.root().value} input channels do not divide into {self.groups} groups")
            S.fix_dim(cg, c.root().value // self.groups)
        out = s["weight"][0].root().value
        if out is not None and out % self.groups:
            raise Conflict(f"{out} output channels do not divide into {self.groups} groups")
        self._spatial(s)

    def lower(self, g, input, weight, bias=None):
        return g.op("Conv", input, weight, bias, group=self.groups, **self._window_attrs())


@register
class MaxPool2D(Window2D):
    """2-D max pooling over [N, C, H, W]; ``stride`` defaults to the kernel size."""

    ports = {"input": In(["N", "C", "H", "W"]), "output": Out(["N", "C", None, None])}

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, name: str | None = None):
        self._window(kernel_size, kernel_size if stride is None else stride, padding, dilation)
        super().__init__(name)

    def infer(self, s: ShapeView) -> None:
        self._spatial(s)

    def lower(self, g, input):
        return g.op("MaxPool", input, **self._window_attrs())


@register
class LayerNorm(Primitive):
    """Normalizes the last dim: input [..., d], weight [d] (ones), bias [d] (zeros)."""

    def __init__(self, use_scale: bool = True, use_bias: bool = True, eps: float = 1e-5,
                 name: str | None = None):
        self.use_scale, self.use_bias, self.eps = use_scale, use_bias, float(eps)
        super().__init__(name)

    def port_specs(self):
        ports = {"input": In(["...", "d"])}
        if self.use_scale:
            ports["weight"] = Param(["d"], init="ones")
        if self.use_bias:
            ports["bias"] = Param(["d"], init="zeros")
        ports["output"] = Out(["...", "d"])
        return ports

    def attributes(self):
        return {"use_scale": self.use_scale, "use_bias": self.use_bias, "eps": self.eps}

    def lower(self, g, input, weight=None, bias=None):
        if weight is None:  # LayerNormalization needs a scale: ones of the last dim, built at run time
            import numpy as np
            from onnx import numpy_helper

            last = g.op("Shape", input, start=-1, dtype=np.int64)
            one = numpy_helper.from_array(np.ones(1, dtype=g.dtype(input)))
            weight = g.op("ConstantOfShape", last, value=one, dtype=g.dtype(input))
        return g.op("LayerNormalization", input, weight, bias, axis=-1, epsilon=self.eps)

