"""Layers: MatrixMultiply, Linear, MLP, Convolution1D/2D (and Conv2d), MaxPool1D/2D (and MaxPool2d),
AvgPool2D, LayerNorm, GroupNorm, BatchNorm2D, Embedding."""

from __future__ import annotations

import copy
import math

import numpy as np
import onnx

from . import shapes as S
from .block import BLOCKS, register
from .model import In, IOKey, Model, Out, Param, Primitive, ShapeView, broadcast_dims
from .onnx_export import buffer_updates  # noqa: F401  (ml.models.buffer_updates; the exporter knows the buffers)
from .shapes import Conflict, ShapeNode, Var
from ..errors import ModelError


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
            S.tracked_setattr(self, "_linked", True)
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
    '[...v, 3]'
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
    """Linear layers, each followed by its activation: terminals ``input`` and ``output``.

    Two ways to say which layers:

    - ``MLP(activations, dimensions)``: one output size per layer in ``dimensions`` and its
      activation (a block class, a block, or None) in ``activations``.
    - ``MLP(input_size=..., hidden_sizes=[...], output_size=...)``: hidden layers followed by
      ``activation`` (Relu unless given) and a linear output layer; the input is fixed to
      ``[..., input_size]``, so every weight's shape is known without ``shapes``.

    >>> from mithril.models import MLP, Relu
    >>> MLP(activations=[Relu, None], dimensions=[16, 4]).shape_of("output")
    '[...v, 4]'
    >>> m = MLP(input_size=8, hidden_sizes=[16, 16], output_size=4)
    >>> m.shape_of("input"), m.shape_of("output")
    ('[...v, 8]', '[...v, 4]')
    """

    def __init__(self, activations=None, dimensions=None, use_bias: bool = True, name: str | None = None, *,
                 input_size: int | None = None, hidden_sizes=None, output_size: int | None = None,
                 activation=None):
        super().__init__(name)
        sized = input_size is not None or hidden_sizes is not None or output_size is not None
        if sized:
            if activations is not None or dimensions is not None:
                raise ModelError("MLP takes either activations and dimensions, or input_size, hidden_sizes and "
                                 "output_size, not both")
            if output_size is None:
                raise ModelError("MLP(input_size=..., hidden_sizes=...) needs output_size, the last layer's size")
            hidden = [int(h) for h in (hidden_sizes or ())]
            act = activation if activation is not None else BLOCKS["Relu"]
            activations, dimensions = [act] * len(hidden) + [None], hidden + [int(output_size)]
        elif activations is None or dimensions is None:
            raise ModelError("MLP needs activations and dimensions (MLP([Relu, None], [64, 10])), or "
                             "input_size, hidden_sizes and output_size")
        elif activation is not None:
            raise ModelError("MLP: activation= goes with hidden_sizes; with dimensions, give one activation per "
                             "layer in activations")
        activations, dimensions = list(activations), list(dimensions)
        if len(activations) != len(dimensions):
            raise ModelError(f"MLP: {len(activations)} activations for {len(dimensions)} dimensions")
        blocks, seen = [], set()
        for act, dim in zip(activations, dimensions):
            blocks.append(Linear(dim, use_bias=use_bias))
            if act is not None:
                # a block given once per layer (activation=LeakyRelu(0.1)) is copied for each further layer
                blocks.append(act() if isinstance(act, type) else copy.deepcopy(act) if id(act) in seen else act)
                seen.add(id(act))
        source = IOKey("input", shape=["...", int(input_size)]) if input_size is not None else "input"
        for i, block in enumerate(blocks):
            bind = {}
            if i == 0:
                bind["input"] = source
            if i == len(blocks) - 1:
                bind["output"] = "output"
            self.extend(block(**bind), chain=i > 0)


def _tuple(v, rank: int, what: str) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * rank
    v = tuple(int(x) for x in v)
    if len(v) != rank:
        raise ModelError(f"{what} takes an int or {rank} ints, got {v}")
    return v


def _pads(padding, kernel, dilation, stride) -> tuple[list[int] | None, str | None]:
    """ONNX (pads, auto_pad) for an n-D window: "same", "valid", an int, one int per axis (2-D) or
    (begin, end) (1-D), or one (begin, end) pair per axis."""
    rank = len(kernel)
    if padding == "valid":
        return [0] * 2 * rank, None
    if padding == "same":
        if any(s != 1 for s in stride):
            return None, "SAME_UPPER"
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return [t // 2 for t in totals] + [t - t // 2 for t in totals], None
    if isinstance(padding, int):
        return [padding] * 2 * rank, None
    padding = tuple(padding)
    if all(isinstance(p, int) for p in padding):
        if rank == 1 and len(padding) == 2:
            return list(padding), None
        if len(padding) == rank:
            return list(padding) * 2, None
        raise ModelError(f"padding {padding} does not fit a {rank}-D window")
    if len(padding) != rank:
        raise ModelError(f"padding {padding} does not fit a {rank}-D window")
    return [int(p[0]) for p in padding] + [int(p[1]) for p in padding], None


def _window_out(size, k, d, s, pads, auto, axis, rank) -> int | None:
    if size is None:
        return None
    if auto is not None:
        return math.ceil(size / s)
    return (size + pads[axis] + pads[axis + rank] - d * (k - 1) - 1) // s + 1


class Window(Primitive):
    """Shared by convolution and pooling: [N, C, *spatial] input, a kernel, stride, padding, dilation."""

    rank: int = 2

    def _window(self, kernel_size, stride, padding, dilation):
        self.kernel_size = _tuple(kernel_size, self.rank, "kernel_size")
        self.stride = _tuple(stride, self.rank, "stride")
        self.dilation = _tuple(dilation, self.rank, "dilation")
        self.padding = padding
        self.pads, self.auto_pad = _pads(padding, self.kernel_size, self.dilation, self.stride)

    def _spatial(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        out = s["output"]
        for axis in range(self.rank):
            size = dims[2 + axis].root().value
            v = _window_out(size, self.kernel_size[axis], self.dilation[axis], self.stride[axis],
                            self.pads or [0] * 2 * self.rank, self.auto_pad, axis, self.rank)
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



class _Convolution(Window):
    """N-D convolution: input [N, C, *spatial], weight [out, C/groups, *kernel], bias [out]."""

    def __init__(self, kernel_size, out_channels: int | None = None, stride=1, padding=0, dilation=1,
                 groups: int = 1, use_bias: bool = True, name: str | None = None):
        self._window(kernel_size, stride, padding, dilation)
        self.out_channels, self.groups, self.use_bias = out_channels, int(groups), use_bias
        super().__init__(name, dims={"out": out_channels})

    def port_specs(self):
        spatial = ["H", "W"][-self.rank:] if self.rank <= 2 else [None] * self.rank
        ports = {"input": In(["N", "C", *spatial]), "weight": Param(["out", "Cg", *self.kernel_size])}
        if self.use_bias:
            ports["bias"] = Param(["out"])
        ports["output"] = Out(["N", "out", *[None] * self.rank])
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
class Convolution2D(_Convolution):
    """2-D convolution: input [N, C, H, W], weight [out, C/groups, kh, kw], bias [out].

    ``padding`` is "same", "valid", an int, a pair (h, w) or two pairs ((top, bottom), (left, right)).
    """

    rank = 2


@register
class Conv2d(Convolution2D):
    """2-D convolution named as in Keras and torch: ``Conv2d(filters, kernel_size, stride=1,
    padding=0)``, where ``filters`` is the number of output channels. Same block as
    :class:`Convolution2D`; ``padding="same"`` keeps H and W at stride 1 (an even kernel pads one
    more at the bottom and right, as torch), ``"valid"`` pads nothing.

    >>> from mithril.models import Conv2d, IOKey, Model
    >>> m = Model()
    >>> m |= Conv2d(filters=16, kernel_size=3, padding="same")(input=IOKey("x", shape=["N", 3, 32, 32]), output="y")
    >>> m.shape_of("y")
    '[N, 16, 32, 32]'
    """

    def __init__(self, filters: int, kernel_size, stride=1, padding=0, dilation=1, groups: int = 1,
                 use_bias: bool = True, name: str | None = None):
        super().__init__(kernel_size, filters, stride=stride, padding=padding, dilation=dilation, groups=groups,
                         use_bias=use_bias, name=name)

    def attributes(self):
        return {"filters": self.out_channels, **{k: v for k, v in super().attributes().items() if k != "out_channels"}}


@register
class Convolution1D(_Convolution):
    """1-D convolution: input [N, C, L], weight [out, C/groups, k], bias [out].

    ``padding`` is "same", "valid", an int, or (begin, end).

    >>> from mithril.models import Model, Convolution1D
    >>> m = Model()
    >>> m |= Convolution1D(kernel_size=3, out_channels=8, padding="same")(input="x", output="y")
    >>> m.shape_of("y")
    '[N, 8, d]'
    """

    rank = 1


class _Pool(Window):
    """Pooling over [N, C, *spatial]; ``stride`` defaults to the kernel size."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, name: str | None = None):
        self._window(kernel_size, kernel_size if stride is None else stride, padding, dilation)
        super().__init__(name)

    def port_specs(self):
        return {"input": In(["N", "C", *[None] * self.rank]), "output": Out(["N", "C", *[None] * self.rank])}

    def infer(self, s: ShapeView) -> None:
        self._spatial(s)

    def lower(self, g, input):
        return g.op("MaxPool", input, **self._window_attrs())


@register
class MaxPool2D(_Pool):
    """2-D max pooling over [N, C, H, W]; ``stride`` defaults to the kernel size."""

    rank = 2


@register
class MaxPool2d(MaxPool2D):
    """2-D max pooling named as in torch: ``MaxPool2d(kernel_size, stride=None, padding=0)``; the
    stride defaults to the kernel size. Same block as :class:`MaxPool2D`."""


@register
class MaxPool1D(_Pool):
    """1-D max pooling over [N, C, L]; ``stride`` defaults to the kernel size."""

    rank = 1


@register
class AvgPool2D(_Pool):
    """2-D average pooling over [N, C, H, W]; ``stride`` defaults to the kernel size.

    ``count_include_pad`` (default True, as PyTorch) divides by the full window, padding included.
    """

    rank = 2

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad: bool = True,
                 name: str | None = None):
        self.count_include_pad = bool(count_include_pad)
        super().__init__(kernel_size, stride, padding, 1, name)

    def attributes(self):
        return {**super().attributes(), "count_include_pad": self.count_include_pad}

    def lower(self, g, input):
        attrs = self._window_attrs()
        if g.opset < 19:  # AveragePool has a dilations attribute from opset 19
            attrs.pop("dilations")
        return g.op("AveragePool", input, count_include_pad=int(self.count_include_pad), **attrs)


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
            from onnx import numpy_helper

            last = g.op("Shape", input, start=-1, dtype=np.int64)
            one = numpy_helper.from_array(np.ones(1, dtype=g.dtype(input)))
            weight = g.op("ConstantOfShape", last, value=one, dtype=g.dtype(input))
        return g.op("LayerNormalization", input, weight, bias, axis=-1, epsilon=self.eps)



def _per_channel(g, value: str, rank: int) -> str:
    """A [C] vector shaped [C, 1, ..., 1] to broadcast over [N, C, *spatial] of ``rank`` dims."""
    if rank <= 2:
        return value
    return g.op("Unsqueeze", value, g.ints(range(1, rank - 1)))


def _rank(block: Primitive, port: str = "input") -> int:
    dims = block._ports[port].shape.dims()
    if dims is None:
        raise Conflict(f"the rank of {port} is unknown; give the input's shape")
    return len(dims)


@register
class GroupNorm(Primitive):
    """Group normalization over [N, C, ...]: channels split into ``num_groups`` groups, each
    normalized over its channels and spatial dims; weight [C] (ones), bias [C] (zeros)."""

    def __init__(self, num_groups: int, use_scale: bool = True, use_bias: bool = True, eps: float = 1e-5,
                 name: str | None = None):
        self.num_groups, self.use_scale, self.use_bias, self.eps = int(num_groups), use_scale, use_bias, float(eps)
        super().__init__(name)

    def port_specs(self):
        ports = {"input": In(["N", "C", "..."])}
        if self.use_scale:
            ports["weight"] = Param(["C"], init="ones")
        if self.use_bias:
            ports["bias"] = Param(["C"], init="zeros")
        ports["output"] = Out(["N", "C", "..."])
        return ports

    def attributes(self):
        return {"num_groups": self.num_groups, "use_scale": self.use_scale, "use_bias": self.use_bias,
                "eps": self.eps}

    def infer(self, s: ShapeView) -> None:
        c = s["input"][1].root().value if s["input"] is not None else None
        if c is not None and c % self.num_groups:
            raise Conflict(f"{c} channels do not divide into {self.num_groups} groups")

    def lower(self, g, input, weight=None, bias=None):
        # GroupNormalization changed its scale layout at opset 21; the formula is the same everywhere.
        rank = _rank(self)
        x = g.op("Reshape", input, g.ints([0, self.num_groups, -1]))
        mean = g.reduce("ReduceMean", x, [2], True)
        d = g.op("Sub", x, mean)
        var = g.reduce("ReduceMean", g.op("Mul", d, d), [2], True)
        y = g.op("Div", d, g.op("Sqrt", g.op("Add", var, g.const(self.eps, like=input))))
        y = g.op("Reshape", y, g.op("Shape", input, dtype=np.int64))
        if weight is not None:
            y = g.op("Mul", y, _per_channel(g, weight, rank))
        if bias is not None:
            y = g.op("Add", y, _per_channel(g, bias, rank))
        return y


@register
class BatchNorm2D(Primitive):
    """Batch normalization over [N, C, H, W]: weight [C] (ones), bias [C] (zeros) are trained;
    ``running_mean`` [C] (zeros) and ``running_var`` [C] (ones) are buffers (see ``buffers``).

    Inference (``training=False``) normalizes with the running statistics. Training mode normalizes
    with the batch's mean and biased variance and has two more outputs, ``running_mean_out`` and
    ``running_var_out``: the updated buffers ``(1 - momentum) * running + momentum * batch``
    (PyTorch's convention; the running variance takes the unbiased batch variance). A training loop
    writes them back into ``running_mean`` / ``running_var`` after each step; bind them to exposed
    names (``running_mean_out=IOKey("bn_mean", expose=True)``) to make them model outputs.
    """

    buffers = {"running_mean": "running_mean_out", "running_var": "running_var_out"}

    def __init__(self, eps: float = 1e-5, momentum: float = 0.1, training: bool = False,
                 name: str | None = None):
        self.eps, self.momentum, self.training = float(eps), float(momentum), bool(training)
        super().__init__(name)

    def port_specs(self):
        ports = {"input": In(["N", "C", "H", "W"]), "weight": Param(["C"], init="ones"),
                 "bias": Param(["C"], init="zeros"), "running_mean": Param(["C"], init="zeros"),
                 "running_var": Param(["C"], init="ones"), "output": Out(["N", "C", "H", "W"])}
        if self.training:
            ports["running_mean_out"] = Out(["C"])
            ports["running_var_out"] = Out(["C"])
        return ports

    def attributes(self):
        return {"eps": self.eps, "momentum": self.momentum, "training": self.training}

    def lower(self, g, input, weight, bias, running_mean, running_var):
        if not self.training:
            return g.op("BatchNormalization", input, weight, bias, running_mean, running_var, epsilon=self.eps)
        # Spelled out: onnxruntime's inference build has no training-mode BatchNormalization.
        axes = [0, 2, 3]
        mean = g.reduce("ReduceMean", input, axes, True)
        d = g.op("Sub", input, mean)
        var = g.reduce("ReduceMean", g.op("Mul", d, d), axes, True)
        y = g.op("Div", d, g.op("Sqrt", g.op("Add", var, g.const(self.eps, like=input))))
        y = g.op("Add", g.op("Mul", y, _per_channel(g, weight, 4)), _per_channel(g, bias, 4))
        flat = g.ints([-1])
        n = g.op("Cast", g.op("Div", g.op("Size", input, dtype=np.int64),
                              g.op("Shape", input, start=1, end=2, dtype=np.int64)),
                 to=int(onnx.helper.np_dtype_to_tensor_dtype(g.dtype(input))), dtype=g.dtype(input))
        unbiased = g.op("Div", g.op("Mul", g.op("Reshape", var, flat), n), g.op("Sub", n, g.const(1, like=input)))
        m, keep = g.const(self.momentum, like=input), g.const(1 - self.momentum, like=input)
        new_mean = g.op("Add", g.op("Mul", keep, running_mean), g.op("Mul", m, g.op("Reshape", mean, flat)))
        new_var = g.op("Add", g.op("Mul", keep, running_var), g.op("Mul", m, unbiased))
        return y, new_mean, new_var


@register
class Embedding(Primitive):
    """Looks rows up: input integer indices [...], weight [num_embeddings, dim], output [..., dim]."""

    def __init__(self, num_embeddings: int | None = None, dim: int | None = None, name: str | None = None):
        self.num_embeddings, self.dim = num_embeddings, dim
        super().__init__(name, dims={"V": num_embeddings, "D": dim})

    ports = {"input": In(["..."], int), "weight": Param(["V", "D"]), "output": Out(["...", "D"])}

    def attributes(self):
        return {"num_embeddings": self.num_embeddings, "dim": self.dim}

    def lower(self, g, input, weight):
        return g.op("Gather", weight, input, axis=0)
