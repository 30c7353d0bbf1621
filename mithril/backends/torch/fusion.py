"""Torch's fused convolutions: ``Conv -> Relu``, ``Conv -> Clip``, ``Conv -> Add -> Relu`` (a
residual block's end) and ``Conv -> Add`` (an inverted residual's end) as one oneDNN call on the CPU.

In the forward program (``TorchBackend.forward_plan``), a Conv whose result only the activation
reads (directly, or through an Add of a second operand of the result's own shape and dtype), or only
such an Add, becomes one node calling :func:`conv_activation`. At run time it takes the path
:func:`~mithril.backends.torch.overrides.conv` takes for a packed weight (a float32 2-D convolution
on the CPU, forward only: see :func:`~mithril.backends.torch.overrides.packed_weight`), with the Add
and the activation applied by oneDNN to each output tile while it is in cache, as torch.compile's
freezing does. Anything else (a gradient call, other dtypes or devices, a weight that is not
packed, Clip bounds that are not scalars or that cross, a geometry oneDNN refused on this processor:
see :func:`~mithril.backends.torch.overrides.packed_call`) runs the three kernels one after the
other, the activation written into the convolution's fresh result where autograd allows.

A Conv none of these follow becomes such a node too (``activation=None``): one oneDNN call as
before, but each node keeps its call's arguments (:class:`CallMemo`) instead of working them out
from the weight and the geometry at every call.

One difference from the unfused ops: oneDNN's Relu and clip give their lower bound for a NaN
(torch.relu keeps the NaN), as onnxruntime's own fused Conv+Relu (MLAS) does.
ResNet-18 (2 threads): its 8 Conv -> Add -> Relu and 9 Conv -> Relu pairs took 1.3 ms of ~23 ms
as separate Add and Relu kernels; MobileNetV2's 10 Conv -> Add pairs 0.5-0.7 ms of ~24 ms.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import torch

from ..passes import FuseConvChains, run_passes
from ..passes.match import reads_stay_alive
from ..plan import Plan, PlanNode
from . import overrides as _ov
from .inplace import clip_into, relu_into
from .xp import TorchArray

_ACTIVATIONS = {("", "Relu"): "Relu", ("", "Clip"): "Clip"}


def _ours(pn: PlanNode, fns) -> bool:
    return pn.spec is not None and pn.domain == "" and pn.spec.fn in fns and not pn.subgraphs


def conv_activation(x, w, b=None, other=None, low=None, high=None, *, activation, auto_pad, dilations, group,
                    kernel_shape, pads, strides, xp, memo=None):
    """``activation(Conv(x, w, b) [+ other])``: ONNX Conv, then Add of ``other`` (same shape and
    dtype, checked when the plan was fused) when given, then Relu, Clip(low, high) or nothing
    (``activation=None``, after an Add or alone). ``memo`` (the node's :class:`CallMemo`) keeps
    the oneDNN call's arguments from one call to the next."""
    conv = dict(auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides)
    fast = _fused(x, w, b, other, low, high, activation, conv, memo)
    if fast is not None:
        return TorchArray(fast)
    y = _ov.conv(x, w, b, kernel_shape=kernel_shape, xp=xp, **conv)
    if other is not None:
        y = _ov.BINARY["Add"](y, other, xp=xp)
    if activation is None:
        return y
    # The convolution's (or the Add's) result is this node's alone: the activation may overwrite it.
    return relu_into(y) if activation == "Relu" else clip_into(y, low, high, xp=xp)


class CallMemo:
    """One fused node's oneDNN arguments (the input's own padding, packed weight, geometry, output
    shape, Clip bounds) from its last call, reused while the next call's operands are the same
    tensors, unchanged in place (their version counters), and its input has the same shape, dtype
    and device: a model's weights are the same tensors call after call. Working them out again
    took ~20 us of Python a node (MobileNetV2: 52 nodes, ~1 ms of a 10-12 ms run); the check takes
    a few. What it holds is dropped with the weight (a weak reference's callback), and a copy of a
    plan starts empty."""

    __slots__ = ("state", "__weakref__")

    def __init__(self):
        self.state = None  # (key, weak references to the operands, arguments): set in one assignment

    def __reduce__(self):
        return CallMemo, ()

    def __deepcopy__(self, memo):
        return CallMemo()

    def __repr__(self):
        return "CallMemo()"

    def _drop(self, _ref=None):
        self.state = None

    def get(self, key, operands):
        state = self.state
        if state is None or state[0] != key:
            return None
        for ref, t in zip(state[1], operands):
            if (ref is None) != (t is None) or (ref is not None and ref() is not t):
                return None
        return state[2]

    def keep(self, key, operands, arguments):
        refs = tuple(None if t is None else weakref.ref(t, self._drop) for t in operands)
        self.state = (key, refs, arguments)


def _version(t):
    return None if t is None else t._version


def _fused(x, w, b, other, low, high, activation, conv, memo=None):
    """The fused oneDNN call's result, or None where it does not apply."""
    if type(x) is not TorchArray or type(w) is not TorchArray or (b is not None and type(b) is not TorchArray):
        return None
    ot = None
    if other is not None:
        ot = other.native if type(other) is TorchArray else None
        if type(ot) is not torch.Tensor or ot.dtype != torch.float32 or ot.device.type != "cpu":
            return None
    xt, wt, bt = x.native, w.native, None if b is None else b.native
    lt, ht = (v.native if type(v) is TorchArray else None for v in (low, high))
    arguments = key = None
    operands = (wt, bt, lt, ht)
    # Not under torch.compile: what a trace reads from the memo would be baked into its graph.
    # Nor for an inference tensor (torch.inference_mode), which has no version counter to tell an in-place change.
    if memo is not None and type(xt) is torch.Tensor and not torch.is_grad_enabled() and \
            not torch.compiler.is_compiling() and not _ov.is_tracing() and \
            not any(t is not None and t.is_inference() for t in operands):
        key = (xt.shape, xt.dtype, xt.device, *map(_version, operands), low is None, high is None)
        arguments = memo.get(key, operands)
    if arguments is not None:
        pairs = arguments[0]
        xt = (xt if pairs is None else _ov.pad_input(xt, pairs, 0.0)).contiguous(memory_format=torch.channels_last)
    else:
        arguments = _arguments(xt, wt, bt, low, high, activation, conv)
        if arguments is None:
            return None
        xt, arguments = arguments
        if key is not None and all(t is None or type(t) is torch.Tensor for t in operands):
            memo.keep(key, operands, arguments)
    _, packed, padding, strides, dilations, out_shape, scalars = arguments
    group = conv["group"]
    if ot is not None and ot.shape != out_shape:
        return None
    # The binary call takes no activation as None ("none" is refused there).
    attr = {"Relu": "relu", "Clip": "hardtanh", None: "none" if other is None else None}[activation]
    if other is None:
        return _ov.packed_call(attr, xt, packed, padding, strides, dilations, group, lambda: _ov.POINTWISE(
            xt, packed, bt, padding, strides, dilations, group, attr, scalars, None))
    return _ov.packed_call(f"add+{attr}", xt, packed, padding, strides, dilations, group, lambda: _ov.POINTWISE_BINARY(
        xt, ot, packed, bt, padding, strides, dilations, group, "add", None, attr, scalars, None))


def _arguments(xt, wt, bt, low, high, activation, conv):
    """(the input as oneDNN's call takes it, (the pads the input itself takes or None, packed
    weight, padding, strides, dilations, output shape, Clip bounds)); None where that call does
    not apply."""
    prepared = _ov.packed_conv_arguments(xt, wt, bt, **conv)
    if prepared is None:
        return None
    ready, packed, _, padding, strides, dilations, out_shape = prepared
    scalars = []
    if activation == "Clip":
        # Under no_grad (packed_conv_arguments refuses otherwise): the bounds as host floats.
        lo, hi = _ov.host_scalar(low, torch.float32), _ov.host_scalar(high, torch.float32)
        if lo is False or hi is False or (lo is None and hi is None):
            return None
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
        if not lo <= hi:  # ONNX gives max everywhere there; oneDNN refuses such a clip
            return None
        scalars = [lo, hi]
    _, pairs, _ = _ov.conv_geometry(xt, wt, conv["auto_pad"], conv["dilations"], conv["pads"], conv["strides"])
    return ready, (pairs, packed, padding, strides, dilations, torch.Size(out_shape), scalars)


def _conv_2d(pn: PlanNode) -> bool:
    return _ours(pn, (_ov.conv,)) and len(pn.outputs) == 1 and pn.outputs[0].shape is not None and \
        len(pn.outputs[0].shape) == 4


class FuseConvActivations(FuseConvChains):
    """Each ``Conv [-> Add] -> Relu/Clip`` and ``Conv -> Add`` chain (the shared matcher of
    :mod:`mithril.backends.passes.conv`; an Add only before a Relu or nothing) as one
    :func:`conv_activation` node, where the chain's last node ran, and each other 2-D Conv as one
    alone. Only nodes that resolved to this backend's own kernels are fused (a user's register_op
    over one of them keeps its node)."""

    name = "torch-fuse-conv-activations"

    def takes_conv(self, index, conv):
        return _conv_2d(conv)

    def takes_residual(self, index, conv, add, residual):
        return _ours(add, (_ov.BINARY["Add"],))

    def takes_activation(self, index, act, chain):
        kind = _ACTIVATIONS.get((act.domain, act.op_type))
        return kind is not None and _ours(act, (_ov.relu,) if kind == "Relu" else (_ov.clip,)) and \
            (chain.add is None or kind == "Relu")

    def make(self, index, chain):
        conv, act = chain.conv, chain.act
        kind = _ACTIVATIONS[(act.domain, act.op_type)] if act is not None else None
        conv_inputs = tuple(conv.inputs) + (None,) * (3 - len(conv.inputs))
        clip_inputs = tuple(act.inputs[1:3]) + (None,) * (2 - len(act.inputs[1:3])) if kind == "Clip" else (None, None)
        inputs = conv_inputs + (chain.residual,) + clip_inputs
        # The fused node runs where the chain's last node ran: a node between frees none of its inputs.
        if not reads_stay_alive(index, inputs, chain.nodes, chain.last):
            return None
        return dataclasses.replace(
            conv, spec=dataclasses.replace(conv.spec, fn=conv_activation), inputs=inputs, outputs=chain.last.outputs,
            kwargs={**conv.kwargs, "activation": kind, "memo": CallMemo()}, frees=chain.frees)

    def run(self, index):
        changed = super().run(index)
        for conv in list(index.plan.nodes):  # the Convs nothing follows: the same call, with its arguments kept
            if _conv_2d(conv):
                index.replace(conv, dataclasses.replace(
                    conv, spec=dataclasses.replace(conv.spec, fn=conv_activation),
                    kwargs={**conv.kwargs, "activation": None, "memo": CallMemo()}))
                changed = True
        return changed


def fuse_conv_activations(plan: Plan) -> Plan:
    """``plan`` after :class:`FuseConvActivations`; the same plan object when nothing is fused."""
    return run_passes(plan, [FuseConvActivations()])


__all__ = ["FuseConvActivations", "conv_activation", "fuse_conv_activations"]
