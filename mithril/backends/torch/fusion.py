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

One difference from the unfused ops: oneDNN's Relu and clip give their lower bound for a NaN
(torch.relu keeps the NaN), as onnxruntime's own fused Conv+Relu (MLAS) does.
ResNet-18 (2 threads): its 8 Conv -> Add -> Relu and 9 Conv -> Relu pairs took 1.3 ms of ~23 ms
as separate Add and Relu kernels; MobileNetV2's 10 Conv -> Add pairs 0.5-0.7 ms of ~24 ms.
"""

from __future__ import annotations

import dataclasses
import math
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
                    kernel_shape, pads, strides, xp):
    """``activation(Conv(x, w, b) [+ other])``: ONNX Conv, then Add of ``other`` (same shape and
    dtype, checked when the plan was fused) when given, then Relu, Clip(low, high) or nothing
    (``activation=None``, after an Add)."""
    conv = dict(auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides)
    fast = _fused(x, w, b, other, low, high, activation, conv)
    if fast is not None:
        return TorchArray(fast)
    y = _ov.conv(x, w, b, kernel_shape=kernel_shape, xp=xp, **conv)
    if other is not None:
        y = _ov.BINARY["Add"](y, other, xp=xp)
    if activation is None:
        return y
    # The convolution's (or the Add's) result is this node's alone: the activation may overwrite it.
    return relu_into(y) if activation == "Relu" else clip_into(y, low, high, xp=xp)


def _fused(x, w, b, other, low, high, activation, conv):
    """The fused oneDNN call's result, or None where it does not apply."""
    if type(x) is not TorchArray or type(w) is not TorchArray or (b is not None and type(b) is not TorchArray):
        return None
    if other is not None:
        ot = other.native if type(other) is TorchArray else None
        if type(ot) is not torch.Tensor or ot.dtype != torch.float32 or ot.device.type != "cpu":
            return None
    prepared = _ov.packed_conv_arguments(x.native, w.native, None if b is None else b.native, **conv)
    if prepared is None:
        return None
    xt, packed, bt, padding, strides, dilations, out_shape = prepared
    group = conv["group"]
    if other is not None and tuple(ot.shape) != tuple(out_shape):
        return None
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
    # The binary call takes no activation as None ("none" is refused there).
    attr = {"Relu": "relu", "Clip": "hardtanh", None: "none" if other is None else None}[activation]
    if other is None:
        return _ov.packed_call(attr, xt, packed, padding, strides, dilations, group, lambda: _ov._POINTWISE(
            xt, packed, bt, padding, strides, dilations, group, attr, scalars, None))
    return _ov.packed_call(f"add+{attr}", xt, packed, padding, strides, dilations, group, lambda: _ov._POINTWISE_BINARY(
        xt, ot, packed, bt, padding, strides, dilations, group, "add", None, attr, scalars, None))


def fuse_conv_activations(plan: Plan) -> Plan:
    """``plan`` with each ``Conv [-> Add] -> Relu/Clip`` and ``Conv -> Add`` chain whose
    intermediate results nothing else reads (no other node, subgraph or graph output) as one
    :func:`conv_activation` node; the same plan object when there is none. Only nodes that
    resolved to this backend's own kernels are fused (a user's register_op over one of them keeps
    its node). Nodes are replaced, never changed."""
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
            kwargs={**conv.kwargs, "activation": kind},
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
    if not fused:
        return plan
    nodes = [fused.get(id(pn), pn) for pn in plan.nodes if id(pn) not in gone]
    return dataclasses.replace(plan, nodes=nodes)


__all__ = ["conv_activation", "fuse_conv_activations"]
