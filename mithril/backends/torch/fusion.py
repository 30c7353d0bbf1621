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
from collections import Counter

import torch

from ..plan import Plan, PlanNode, reads_of
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
            not torch.compiler.is_compiling() and not _ov._tracing() and \
            not any(t is not None and t.is_inference() for t in operands):
        key = (xt.shape, xt.dtype, xt.device, *map(_version, operands), low is None, high is None)
        arguments = memo.get(key, operands)
    if arguments is not None:
        pairs = arguments[0]
        xt = (xt if pairs is None else _ov._pad_input(xt, pairs, 0.0)).contiguous(memory_format=torch.channels_last)
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
        return _ov.packed_call(attr, xt, packed, padding, strides, dilations, group, lambda: _ov._POINTWISE(
            xt, packed, bt, padding, strides, dilations, group, attr, scalars, None))
    return _ov.packed_call(f"add+{attr}", xt, packed, padding, strides, dilations, group, lambda: _ov._POINTWISE_BINARY(
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


def fuse_conv_activations(plan: Plan) -> Plan:
    """``plan`` with each ``Conv [-> Add] -> Relu/Clip`` and ``Conv -> Add`` chain whose
    intermediate results nothing else reads (no other node, subgraph or graph output) as one
    :func:`conv_activation` node, and each other 2-D Conv as one alone; the same plan object when
    there is none. Only nodes that resolved to this backend's own kernels are fused (a user's
    register_op over one of them keeps its node). Nodes are replaced, never changed."""
    made = {o: pn for pn in plan.nodes for o in pn.outputs}
    readers = Counter(v for pn in plan.nodes for v in reads_of(pn))
    outputs = set(plan.outputs)

    def alone(v) -> bool:
        return v is not None and readers[v] == 1 and v not in outputs

    def conv_of(v):
        pn = made.get(v)
        if pn is not None and _ours(pn, (_ov.conv,)) and len(pn.outputs) == 1 and alone(v) and \
                pn.outputs[0].shape is not None and len(pn.outputs[0].shape) == 4:
            return pn
        return None

    def conv_and_other(add):
        """(the Conv whose result ``add`` adds, the other operand) or (None, None)."""
        if not _ours(add, (_ov.BINARY["Add"],)) or len(add.inputs) != 2:
            return None, None
        for mine, theirs in (add.inputs, add.inputs[::-1]):
            conv = conv_of(mine)
            if conv is not None and theirs is not None and theirs.shape == mine.shape and \
                    theirs.dtype == mine.dtype and all(isinstance(d, int) for d in mine.shape):
                return conv, theirs
        return None, None

    fused: dict[int, PlanNode] = {}  # id of the chain's last node -> its fused node
    gone: set[int] = set()  # ids of the Conv and Add nodes folded into one

    index = {id(pn): i for i, pn in enumerate(plan.nodes)}

    def fuse(conv, add, other, act, kind):
        last = act if act is not None else add
        chain = [pn for pn in (conv, add, act) if pn is not None]
        between = {pn.outputs[0] for pn in chain[:-1]}
        conv_inputs = tuple(conv.inputs) + (None,) * (3 - len(conv.inputs))
        clip_inputs = tuple(act.inputs[1:3]) + (None,) * (2 - len(act.inputs[1:3])) if kind == "Clip" else (None, None)
        # The fused node runs where the chain's last node ran: a node between frees none of its inputs.
        reads = {v for v in conv_inputs + (other,) + clip_inputs if v is not None}
        if any(reads.intersection(pn.frees) for pn in plan.nodes[index[id(conv)] + 1:index[id(last)]]
               if pn is not add):
            return
        fused[id(last)] = dataclasses.replace(
            conv, spec=dataclasses.replace(conv.spec, fn=conv_activation),
            inputs=conv_inputs + (other,) + clip_inputs, outputs=last.outputs,
            kwargs={**conv.kwargs, "activation": kind, "memo": CallMemo()},
            frees=tuple(dict.fromkeys(v for pn in chain for v in pn.frees if v not in between)))
        gone.update(id(pn) for pn in chain[:-1])

    for act in plan.nodes:
        kind = _ACTIVATIONS.get((act.domain, act.op_type))
        if kind is None or not act.inputs or not _ours(act, (_ov.relu,) if kind == "Relu" else (_ov.clip,)):
            continue
        x = act.inputs[0]
        conv, add, other = conv_of(x), None, None
        if conv is None and kind == "Relu" and alone(x) and made.get(x) is not None:
            conv, other = conv_and_other(made[x])
            add = made[x] if conv is not None else None
        if conv is not None and id(conv) not in gone:
            fuse(conv, add, other, act, kind)
    for add in plan.nodes:  # the Adds no activation follows
        if id(add) not in gone and id(add) not in fused:
            conv, other = conv_and_other(add)
            if conv is not None and id(conv) not in gone:
                fuse(conv, add, other, None, None)
    for conv in plan.nodes:  # the Convs nothing follows: the same call, with its arguments kept
        if id(conv) not in gone and id(conv) not in fused and _ours(conv, (_ov.conv,)) and \
                len(conv.outputs) == 1 and conv.outputs[0].shape is not None and len(conv.outputs[0].shape) == 4:
            fused[id(conv)] = dataclasses.replace(
                conv, spec=dataclasses.replace(conv.spec, fn=conv_activation),
                kwargs={**conv.kwargs, "activation": None, "memo": CallMemo()})
    if not fused:
        return plan
    nodes = [fused.get(id(pn), pn) for pn in plan.nodes if id(pn) not in gone]
    return dataclasses.replace(plan, nodes=nodes)


__all__ = ["conv_activation", "fuse_conv_activations"]
