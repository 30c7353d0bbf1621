"""C rules for the linear-attention family (kernels: ``lib/mt_linear_attention.h``): LinearAttention
(its four update rules, per-head or per-key decay, per-head or shared beta, grouped-query heads,
past state), CausalConvWithState (bias, past state, SiLU) and SwiGLU.

Each computes what :mod:`mithril.backends.kernels.attention` does, in the input's type; the state
of LinearAttention and CausalConvWithState must be of that type too (a float32 state beside
float16 activations is storage C cannot compute in). LinearAttention's ``chunk_size`` is a GPU
tuning hint with no effect on results, and is ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import FLOATS, c_kernel, text

UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")
ACTIVATIONS = {"none": 0, "silu": 1, "swish": 1}


def _input(pn, i: int):
    return pn.inputs[i] if len(pn.inputs) > i and pn.inputs[i] is not None and pn.inputs[i].name else None


def _output(pn, i: int):
    return pn.outputs[i] if len(pn.outputs) > i and pn.outputs[i].name else None


def _same_dtype(pn, positions, outputs=(0, 1)) -> str | None:
    """Why the given inputs and outputs do not all share the first input's element type (None when they do)."""
    dt = pn.inputs[0].dtype
    for i in positions:
        v = _input(pn, i)
        if v is not None and v.dtype != dt:
            return f"input {i} {v.name!r} is {v.dtype}, input 0 {dt}"
    for i in outputs:
        o = _output(pn, i)
        if o is not None and o.dtype != dt:
            return f"output {i} {o.name!r} is {o.dtype}, input 0 {dt}"
    return None


def _wrong_outputs(pn, shapes) -> str | None:
    for i, shape in enumerate(shapes):
        o = _output(pn, i)
        if o is not None and tuple(o.static_shape) != tuple(shape):
            return f"output {i} {o.name!r} is typed {o.static_shape}, the kernel writes {tuple(shape)}"
    return None


# ---------------------------------------------------------------------------------------------
# LinearAttention


@dataclass(frozen=True)
class _Linear:
    """A LinearAttention node's sizes."""

    B: int
    steps: int
    Hq: int
    Hkv: int
    dk: int
    dv: int
    gated: bool
    delta: bool
    decay_per_key: bool
    beta_heads: int


def _linear(pn) -> _Linear | str:
    """The node's sizes, or why C cannot run it."""
    rule = text(pn.kwargs.get("update_rule") or "gated_delta")
    if rule not in UPDATE_RULES:
        return f"update_rule {rule!r} (C has {', '.join(UPDATE_RULES)})"
    q, k, v = (tuple(pn.inputs[i].static_shape) for i in range(3))
    if not len(q) == len(k) == len(v) == 3:
        return f"query, key, value of ranks {len(q)}, {len(k)}, {len(v)} (LinearAttention takes 3-D)"
    Hq, Hkv = int(pn.kwargs.get("q_num_heads") or 0), int(pn.kwargs.get("kv_num_heads") or 0)
    if Hq <= 0 or Hkv <= 0 or Hq % Hkv:
        return f"q_num_heads {Hq} is not a positive multiple of kv_num_heads {Hkv}"
    if q[2] % Hq or v[2] % Hkv:
        return f"query {q} and value {v} do not split into {Hq} and {Hkv} heads"
    B, steps = q[:2]
    dk, dv = q[2] // Hq, v[2] // Hkv
    if k != (B, steps, Hkv * dk) or v[:2] != (B, steps):
        return f"key {k} and value {v} do not fit query {q} with {Hq} query and {Hkv} key heads"
    past = _input(pn, 3)
    if past is not None and tuple(past.static_shape) != (B, Hkv, dk, dv):
        return f"past_state is {past.static_shape}, not {(B, Hkv, dk, dv)}"
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    decay, beta = _input(pn, 4), _input(pn, 5)
    if gated != (decay is not None):
        return f"update_rule {rule!r} {'needs' if gated else 'takes no'} decay"
    if delta != (beta is not None):
        return f"update_rule {rule!r} {'needs' if delta else 'takes no'} beta"
    per_key = False
    if decay is not None:
        shape = tuple(decay.static_shape)
        if shape not in ((B, steps, Hkv), (B, steps, Hkv * dk)):
            return f"decay is {shape}, not {(B, steps, Hkv)} or {(B, steps, Hkv * dk)}"
        per_key = shape[2] != Hkv
    beta_heads = 0
    if beta is not None:
        shape = tuple(beta.static_shape)
        if shape not in ((B, steps, Hkv), (B, steps, 1)):
            return f"beta is {shape}, not {(B, steps, Hkv)} or {(B, steps, 1)}"
        beta_heads = shape[2]
    return _Linear(B, steps, Hq, Hkv, dk, dv, gated, delta, per_key, beta_heads)


def _check_linear(pn) -> str | None:
    s = _linear(pn)
    if isinstance(s, str):
        return s
    return _same_dtype(pn, (1, 2, 3, 4, 5)) or _wrong_outputs(
        pn, [(s.B, s.steps, s.Hq * s.dv), (s.B, s.Hkv, s.dk, s.dv)])


def _state_in_scratch(pn) -> bool:
    return _output(pn, 1) is None


def _linear_scratch(pn) -> int:
    s = _linear(pn)
    if isinstance(s, str):
        return 0
    elements = s.B * s.Hkv * s.dv + (s.B * s.Hkv * s.dk * s.dv if _state_in_scratch(pn) else 0)
    return elements * pn.inputs[0].dtype.itemsize


@c_kernel("LinearAttention", since=27, dtypes=FLOATS, check=_check_linear, scratch=_linear_scratch)
def linear_attention(pn, c):
    s = _linear(pn)
    y, T = pn.outputs[0], c.ctype(pn.outputs[0])
    scratch = f"({T} *){c.scratch}"
    # the delta rule's corrected values first, then the state when the node leaves it out
    state = f"{scratch} + {s.B * s.Hkv * s.dv}" if _state_in_scratch(pn) else c.buf(pn.outputs[1])
    scale = float(pn.kwargs.get("scale") or 0.0) or 1 / math.sqrt(s.dk)
    opt = [c.buf(v) if v is not None else "0" for v in (_input(pn, i) for i in (3, 4, 5))]
    c.line(f"mt_linear_attention_{c.sfx(y)}({', '.join(c.buf(pn.inputs[i]) for i in range(3))}, {', '.join(opt)}, "
           f"{c.buf(y)}, {state}, {scratch}, {s.B}, {s.steps}, {s.Hq}, {s.Hkv}, {s.dk}, {s.dv}, "
           f"{int(s.decay_per_key)}, {s.beta_heads}, {c.literal(scale, y.dtype)});")


# ---------------------------------------------------------------------------------------------
# CausalConvWithState


def _conv_dims(pn) -> tuple[int, int, int, int] | str:
    """(batch, channels, length, kernel width), or why C cannot run the node."""
    x, w = tuple(pn.inputs[0].static_shape), tuple(pn.inputs[1].static_shape)
    if len(x) != 3 or len(w) != 3:
        return f"input {x} and weight {w} (CausalConvWithState takes both 3-D)"
    B, C, L = x
    if w[:2] != (C, 1) or w[2] < 1:
        return f"weight {w} is not ({C}, 1, k >= 1)"
    K = w[2]
    bias, past = _input(pn, 2), _input(pn, 3)
    if bias is not None and tuple(bias.static_shape) != (C,):
        return f"bias is {bias.static_shape}, not ({C},)"
    if past is not None and tuple(past.static_shape) != (B, C, K - 1):
        return f"past_state is {past.static_shape}, not {(B, C, K - 1)}"
    return B, C, L, K


def _check_conv(pn) -> str | None:
    act = text(pn.kwargs.get("activation") or "none")
    if act not in ACTIVATIONS:
        return f"activation {act!r} (C has {', '.join(ACTIVATIONS)})"
    dims = _conv_dims(pn)
    if isinstance(dims, str):
        return dims
    B, C, L, K = dims
    return _same_dtype(pn, (1, 2, 3)) or _wrong_outputs(pn, [(B, C, L), (B, C, K - 1)])


@c_kernel("CausalConvWithState", since=27, dtypes=FLOATS, check=_check_conv)
def causal_conv_with_state(pn, c):
    B, C, L, K = _conv_dims(pn)
    y, present = pn.outputs[0], _output(pn, 1)
    bias, past = (_input(pn, i) for i in (2, 3))
    args = [c.buf(pn.inputs[0]), c.buf(pn.inputs[1]), *(c.buf(v) if v is not None else "0" for v in (bias, past)),
            c.buf(y), c.buf(present) if present is not None and K > 1 else "0", B, C, L, K,
            ACTIVATIONS[text(pn.kwargs.get("activation") or "none")]]
    c.line(f"mt_causal_conv_{c.sfx(y)}({', '.join(map(str, args))});")


# ---------------------------------------------------------------------------------------------
# SwiGLU


def _check_swiglu(pn) -> str | None:
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    if not tuple(a.static_shape) == tuple(b.static_shape) == tuple(y.static_shape):
        return f"A {a.static_shape}, B {b.static_shape} and Y {y.static_shape} differ (SwiGLU does not broadcast)"
    return _same_dtype(pn, (1,), outputs=(0,))


@c_kernel("SwiGLU", since=28, dtypes=FLOATS, check=_check_swiglu)
def swiglu(pn, c):
    a, b, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    alpha = pn.kwargs.get("alpha")
    alpha = 1.0 if alpha is None else float(alpha)
    c.line(f"mt_swiglu_{c.sfx(y)}({c.buf(a)}, {c.buf(b)}, {c.buf(y)}, {c.numel(y)}, {c.literal(alpha, y.dtype)});")
