"""Recurrent blocks: RNNCell, LSTMCell and a many-to-one LSTM.

Weights use PyTorch's layout and names (``weight_ih`` [gates * H, I], ``weight_hh`` [gates * H, H],
``bias_ih``, ``bias_hh``; LSTM gates in the order input, forget, cell, output), so the cells, the LSTM
and ``torch.nn.LSTM`` share parameters by key.

The LSTM lowers to the ONNX LSTM op rather than an unrolled chain of cells: one node for any sequence
length (the time axis stays dynamic on export), onnxruntime runs it natively, and the shared kernel is
written over ``xp``, so autodiff backends differentiate through it. The gates are reordered to ONNX's
(input, output, forget, cell) at run time by a Split and a Concat per weight.
"""

from __future__ import annotations

from . import shapes as S
from .block import register
from .model import In, Out, Param, Primitive, ShapeView
from .shapes import Conflict


def _affine(g, x, weight, bias):
    y = g.op("MatMul", x, g.op("Transpose", weight, perm=[1, 0]))
    return g.op("Add", y, bias) if bias is not None else y


def _hidden(block: Primitive) -> int:
    h = block._ports["weight_hh"].shape.dims()[1].root().value
    if h is None:
        raise Conflict("the hidden size is unknown")
    return h


class _Recurrent(Primitive):
    gates = 1

    def __init__(self, hidden_size: int | None = None, use_bias: bool = True, name: str | None = None):
        self.hidden_size, self.use_bias = hidden_size, bool(use_bias)
        dims = {"H": hidden_size}
        if hidden_size is not None:
            dims["G"] = self.gates * hidden_size
        super().__init__(name, dims=dims)

    def _params(self) -> dict:
        ports = {"weight_ih": Param(["G", "I"]), "weight_hh": Param(["G", "H"])}
        if self.use_bias:
            ports["bias_ih"] = Param(["G"])
            ports["bias_hh"] = Param(["G"])
        return ports

    def attributes(self):
        return {"hidden_size": self.hidden_size, "use_bias": self.use_bias}

    def infer(self, s: ShapeView) -> None:
        g, h = s["weight_ih"][0].root(), s["weight_hh"][1].root()
        if h.value is not None:
            S.fix_dim(g, self.gates * h.value)
        elif g.value is not None:
            if g.value % self.gates:
                raise Conflict(f"{g.value} gate rows are not {self.gates} * hidden size")
            S.fix_dim(h, g.value // self.gates)


@register
class RNNCell(_Recurrent):
    """One Elman step: ``output = tanh(input @ weight_ih.T + bias_ih + prev_hidden @ weight_hh.T + bias_hh)``;
    input [N, I], prev_hidden and output [N, H]."""

    def port_specs(self):
        return {"input": In(["N", "I"]), "prev_hidden": In(["N", "H"]), **self._params(), "output": Out(["N", "H"])}

    def lower(self, g, input, prev_hidden, weight_ih, weight_hh, bias_ih=None, bias_hh=None):
        z = g.op("Add", _affine(g, input, weight_ih, bias_ih), _affine(g, prev_hidden, weight_hh, bias_hh))
        return g.op("Tanh", z)


@register
class LSTMCell(_Recurrent):
    """One LSTM step: input [N, I], prev_hidden and prev_cell [N, H]; outputs ``output`` (the new
    hidden state) and ``cell``, both [N, H]. Gates i, f, g, o as in ``torch.nn.LSTMCell``."""

    gates = 4

    def port_specs(self):
        return {"input": In(["N", "I"]), "prev_hidden": In(["N", "H"]), "prev_cell": In(["N", "H"]),
                **self._params(), "output": Out(["N", "H"]), "cell": Out(["N", "H"])}

    def lower(self, g, input, prev_hidden, prev_cell, weight_ih, weight_hh, bias_ih=None, bias_hh=None):
        h = _hidden(self)
        z = g.op("Add", _affine(g, input, weight_ih, bias_ih), _affine(g, prev_hidden, weight_hh, bias_hh))
        i, f, c, o = g.op("Split", z, g.ints([h] * 4), axis=1, outputs=4)
        cell = g.op("Add", g.op("Mul", g.op("Sigmoid", f), prev_cell), g.op("Mul", g.op("Sigmoid", i), g.op("Tanh", c)))
        return g.op("Mul", g.op("Sigmoid", o), g.op("Tanh", cell)), cell


@register
class LSTM(_Recurrent):
    """A single-layer many-to-one LSTM over input [N, T, I] from zero states: ``output`` is the last
    hidden state [N, H]; ``hidden_states`` [N, T, H] holds every step's. Same parameters as
    :class:`LSTMCell` (``torch.nn.LSTM(batch_first=True)``'s ``*_l0``)."""

    gates = 4

    def port_specs(self):
        return {"input": In(["N", "T", "I"]), **self._params(), "output": Out(["N", "H"]),
                "hidden_states": Out(["N", "T", "H"])}

    def lower(self, g, input, weight_ih, weight_hh, bias_ih=None, bias_hh=None):
        h = _hidden(self)

        def onnx_gates(w):  # i, f, c, o (PyTorch) -> i, o, f, c (ONNX), with a leading direction axis
            i, f, c, o = g.op("Split", w, g.ints([h] * 4), axis=0, outputs=4)
            return g.op("Concat", i, o, f, c, axis=0)

        first = g.ints([0])
        w = g.op("Unsqueeze", onnx_gates(weight_ih), first)
        r = g.op("Unsqueeze", onnx_gates(weight_hh), first)
        b = None
        if bias_ih is not None:
            b = g.op("Unsqueeze", g.op("Concat", onnx_gates(bias_ih), onnx_gates(bias_hh), axis=0), first)
        x = g.op("Transpose", input, perm=[1, 0, 2])  # time-major: layout=1 is not in every runtime
        y, y_h, _ = g.op("LSTM", x, w, r, b, hidden_size=h, outputs=3)
        last = g.op("Squeeze", y_h, first)
        states = g.op("Transpose", g.op("Squeeze", y, g.ints([1])), perm=[1, 0, 2])
        return last, states
