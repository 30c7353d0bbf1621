"""Blocks that make tensors: Arange, Randn."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .. import dtypes as _dtypes
from .block import register
from .model import In, Out, Primitive
from ..errors import ModelError


@register
class Arange(Primitive):
    """``numpy.arange(start, stop, step)`` as a 1-D ``output`` (``Arange(5)`` is 0..4); int64 when
    all three are ints, else float32. Lowers to ONNX Range."""

    def __init__(self, start=0, stop=None, step=1, name: str | None = None):
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ModelError("Arange step must not be 0")
        self.start, self.stop, self.step = start, stop, step
        self.integer = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        self.length = max(math.ceil((stop - start) / step), 0)
        super().__init__(name)

    def port_specs(self):
        return {"output": Out([self.length], _dtypes.int64 if self.integer else _dtypes.float32)}

    def attributes(self):
        return {"start": self.start, "stop": self.stop, "step": self.step}

    def lower(self, g):
        dtype = np.int64 if self.integer else np.float32
        return g.op("Range", *(g.const(v, dtype=dtype) for v in (self.start, self.stop, self.step)))


@register
class Randn(Primitive):
    """Normal samples of ``mean`` and ``std``: of a fixed ``shape`` (ONNX RandomNormal, no inputs),
    or, with ``shape=None``, of the shape of ``input`` (RandomNormalLike). ``seed`` fixes the op's seed;
    each evaluation draws anew otherwise.

    onnxruntime 1.31 has kernels for the random ops up to their opset-21 versions only: export a
    model holding Randn with ``opset=21`` to run it there (Mithril's backends run any opset).
    """

    def __init__(self, shape=None, mean: float = 0.0, std: float = 1.0, seed: int | None = None,
                 dtype=None, name: str | None = None):
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.mean, self.std, self.seed = float(mean), float(std), seed
        self.dtype = _dtypes.as_dtype(dtype if dtype is not None else "float32")
        super().__init__(name)

    def port_specs(self):
        if self.shape is not None:
            return {"output": Out(list(self.shape), self.dtype)}
        return {"input": In(["..."], None), "output": Out(["..."], self.dtype)}

    def attributes(self):
        return {"shape": self.shape, "mean": self.mean, "std": self.std}

    def lower(self, g, input=None):
        attrs = dict(mean=self.mean, scale=self.std,
                     seed=None if self.seed is None else float(self.seed))
        if self.shape is not None:
            out = g.op("RandomNormal", shape=list(self.shape), dtype=self.dtype.numpy, **attrs)
        else:
            out = g.op("RandomNormalLike", input, dtype=self.dtype.numpy, **attrs)
        # the ONNX attribute is named like the emitter's own dtype argument: set it on the node
        g.nodes[-1].attribute.append(helper.make_attribute("dtype", int(self.dtype.onnx)))
        return out
