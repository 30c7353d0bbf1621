"""Gradients of elementwise ops: broadcasting arithmetic, activations, Where, Cast, Clip."""

from __future__ import annotations

import math

import numpy

from ..kernels.elementwise import erfc
from .rules import vjp_rule


def unbroadcast(g, shape):
    """Sums ``g`` over the axes that broadcasting stretched, back to ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    return numpy.sum(g, axis=axes).reshape(shape)


def _like(g, x):
    # Gradients keep the dtype of the value they belong to.
    return g if g.dtype == x.dtype else g.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Broadcasting arithmetic


@vjp_rule("Add", since=7)
def add_vjp(g, a, b, *, needs):
    return (unbroadcast(g, a.shape) if needs[0] else None, unbroadcast(g, b.shape) if needs[1] else None)


@vjp_rule("Sub", since=7)
def sub_vjp(g, a, b, *, needs):
    return (unbroadcast(g, a.shape) if needs[0] else None, unbroadcast(-g, b.shape) if needs[1] else None)


@vjp_rule("Mul", since=7)
def mul_vjp(g, a, b, *, needs):
    return (unbroadcast(g * b, a.shape) if needs[0] else None, unbroadcast(g * a, b.shape) if needs[1] else None)


@vjp_rule("Div", since=7)
def div_vjp(g, a, b, *, needs):
    ga = g / b
    return (unbroadcast(ga, a.shape) if needs[0] else None,
            unbroadcast(-ga * a / b, b.shape) if needs[1] else None)


@vjp_rule("Pow", since=7)
def pow_vjp(g, x, p, *, y, needs):
    gx = gp = None
    if needs[0]:
        # p * x**(p-1), written so that x == 0 with p >= 1 stays finite.
        gx = _like(unbroadcast(g * p * numpy.power(x, p - 1).astype(y.dtype), x.shape), x)
    if needs[1]:
        # d/dp x**p = x**p log x; taken as 0 where x == 0 (the limit for p > 0).
        with numpy.errstate(divide="ignore", invalid="ignore"):
            logx = numpy.where(x > 0, numpy.log(numpy.where(x > 0, x, 1)), 0).astype(y.dtype)
        gp = _like(unbroadcast(g * y * logx, p.shape), p)
    return gx, gp


@vjp_rule("Sum", since=6)
def sum_vjp(g, *inputs):
    return tuple(unbroadcast(g, x.shape) for x in inputs)


@vjp_rule("Mean", since=6)
def mean_vjp(g, *inputs):
    return tuple(unbroadcast(g / len(inputs), x.shape) for x in inputs)


def _extremum(g, inputs, y):
    # Ties share the gradient equally, as in JAX's max.
    hits = [numpy.broadcast_to(x == y, y.shape) for x in inputs]
    count = numpy.sum(hits, axis=0)
    return tuple(unbroadcast(numpy.where(h, g / numpy.maximum(count, 1), 0).astype(g.dtype), x.shape)
                 for h, x in zip(hits, inputs))


@vjp_rule("Max", since=6)
def max_vjp(g, *inputs, y):
    return _extremum(g, inputs, y)


@vjp_rule("Min", since=6)
def min_vjp(g, *inputs, y):
    return _extremum(g, inputs, y)


@vjp_rule("Where", since=9)
def where_vjp(g, condition, x, y, *, needs):
    zero = numpy.zeros((), g.dtype)
    return (None,
            unbroadcast(numpy.where(condition, g, zero), x.shape) if needs[1] else None,
            unbroadcast(numpy.where(condition, zero, g), y.shape) if needs[2] else None)


@vjp_rule("Clip", since=6)
def clip_attrs_vjp(g, x, *, min, max):  # noqa: A002 - ONNX attribute names
    return (numpy.where((x >= min) & (x <= max), g, 0).astype(g.dtype),)


@vjp_rule("Clip", since=11)
def clip_vjp(g, x, low=None, high=None, *, y, needs):
    # min(max(x, low), high): the gradient goes to whichever value y is (high wins a tie, as it is applied last).
    from_high = (y == high) if high is not None else numpy.zeros(y.shape, bool)
    from_low = ((y == low) & ~from_high) if low is not None else numpy.zeros(y.shape, bool)
    zero = numpy.zeros((), g.dtype)
    gx = numpy.where(from_low | from_high, zero, g) if needs[0] else None
    glow = unbroadcast(numpy.where(from_low, g, zero), low.shape) if low is not None and needs[1] else None
    ghigh = unbroadcast(numpy.where(from_high, g, zero), high.shape) if high is not None and needs[2] else None
    return gx, glow, ghigh


@vjp_rule("Cast", since=6)
def cast_vjp(g, x, **_):
    # Casting between floating types passes the gradient back in the input's dtype.
    return (g.astype(x.dtype),)


@vjp_rule("CastLike", since=15)
def cast_like_vjp(g, x, target_type, **_):
    return g.astype(x.dtype), None


# ---------------------------------------------------------------------------------------------
# Unary ops


@vjp_rule("Neg", since=6)
def neg_vjp(g, x):
    return (-g,)


@vjp_rule("Abs", since=6)
def abs_vjp(g, x):
    return (g * numpy.sign(x).astype(g.dtype),)


@vjp_rule("Exp", since=6)
def exp_vjp(g, x, *, y):
    return (g * y,)


@vjp_rule("Log", since=6)
def log_vjp(g, x):
    return (g / x,)


@vjp_rule("Sqrt", since=6)
def sqrt_vjp(g, x, *, y):
    return (g / (2 * y),)


@vjp_rule("Reciprocal", since=6)
def reciprocal_vjp(g, x, *, y):
    return (-g * y * y,)


@vjp_rule("Sin", since=7)
def sin_vjp(g, x):
    return (g * numpy.cos(x),)


@vjp_rule("Cos", since=7)
def cos_vjp(g, x):
    return (-g * numpy.sin(x),)


@vjp_rule("Erf", since=9)
def erf_vjp(g, x):
    return (_like(g * (2 / math.sqrt(math.pi)) * numpy.exp(-x * x), x),)


@vjp_rule("Relu", since=6)
def relu_vjp(g, x):
    return (numpy.where(x > 0, g, numpy.zeros((), g.dtype)),)


@vjp_rule("LeakyRelu", since=6)
def leaky_relu_vjp(g, x, *, alpha):
    return (numpy.where(x > 0, g, g * numpy.asarray(alpha, g.dtype)),)


@vjp_rule("Elu", since=6)
def elu_vjp(g, x, *, y, alpha):
    return (numpy.where(x > 0, g, g * (y + numpy.asarray(alpha, g.dtype))),)


@vjp_rule("PRelu", since=7)
def prelu_vjp(g, x, slope, *, needs):
    zero = numpy.zeros((), g.dtype)
    gx = numpy.where(x > 0, g, g * slope) if needs[0] else None
    gs = unbroadcast(numpy.where(x > 0, zero, g * x), slope.shape) if needs[1] else None
    return gx, gs


@vjp_rule("Sigmoid", since=6)
def sigmoid_vjp(g, x, *, y):
    return (g * y * (1 - y),)


@vjp_rule("Tanh", since=6)
def tanh_vjp(g, x, *, y):
    return (g * (1 - y * y),)


@vjp_rule("Softplus", since=1)
def softplus_vjp(g, x):
    return (g / (1 + numpy.exp(-x)),)


@vjp_rule("HardSigmoid", since=6)
def hard_sigmoid_vjp(g, x, *, alpha, beta):
    inside = (alpha * x + beta > 0) & (alpha * x + beta < 1)
    return (numpy.where(inside, g * numpy.asarray(alpha, g.dtype), 0).astype(g.dtype),)


@vjp_rule("HardSwish", since=14)
def hard_swish_vjp(g, x):
    # x * clip(x / 6 + 1 / 2, 0, 1)
    d = numpy.where(x < -3, 0, numpy.where(x > 3, 1, x / 3 + 0.5))
    return ((g * d).astype(g.dtype),)


@vjp_rule("Gelu", since=20)
def gelu_vjp(g, x, *, approximate):
    xf = x if x.dtype in (numpy.float32, numpy.float64) else x.astype(numpy.float32)
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        u = c * (xf + 0.044715 * xf**3)
        t = numpy.tanh(u)
        d = 0.5 * (1 + t) + 0.5 * xf * (1 - t * t) * c * (1 + 3 * 0.044715 * xf * xf)
    else:
        cdf = 0.5 * erfc(-xf / math.sqrt(2), numpy)
        d = cdf + xf * numpy.exp(-0.5 * xf * xf) / math.sqrt(2 * math.pi)
    return ((g * d).astype(g.dtype),)


# ---------------------------------------------------------------------------------------------
# Dropout: the identity in inference; in training y = x * keep / (1 - ratio), and keep is read
# back from y (an element is kept where y != 0, up to inputs that are exactly 0, whose gradient
# is taken as 0).


@vjp_rule("Dropout", since=7)
def dropout_7_vjp(g, data, *, ratio):
    return (g[0],)


@vjp_rule("Dropout", since=12)
def dropout_vjp(g, data, ratio=None, training_mode=None, *, seed, y, needs):
    gy = g[0]
    # The ratio is a hyperparameter (an initializer is trainable by default): it gets zeros.
    gratio = numpy.zeros_like(ratio) if ratio is not None and needs[1] else None
    if training_mode is None or not bool(training_mode):
        return gy, gratio, None
    scale = 1 / (1 - (0.5 if ratio is None else float(ratio)))
    return numpy.where(y != 0, gy * numpy.asarray(scale, gy.dtype), numpy.zeros((), gy.dtype)), gratio, None
