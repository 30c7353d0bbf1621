"""Chains of 1x1 and depthwise convolutions in a channel-blocked layout (NCHWc), as onnxruntime
runs MobileNet-like models on x86 (its NchwcTransformer).

In NCHW a 1x1 convolution is a GEMM whose vectors run along the positions of a plane, ragged at
14x14 or 7x7 (196 and 49 positions), and a depthwise convolution works plane by plane. Stored as
``[N][C / B][H][W][B]`` (``B`` channels of one position side by side: one cache line, one AVX-512
vector of float32; the last block padded) a 1x1 convolution broadcasts an input value to ``B``
output channels and a depthwise convolution adds whole vectors (``lib/mt_nchwc_t.h``). MobileNetV2's
1x1 convolutions ran at 105-122 GFLOP/s as GEMMs and 140-157 blocked on one core; its depthwise
ones 1.2-4x faster.

:class:`BlockNCHWc` rewrites one C segment (after :func:`~.render.fuse`): each Conv it can take
(constant weights, four dimensions, float; 1x1 with stride 1 and no padding, or one filter per
channel) becomes a ``mithril.c::ConvNCHWc`` node reading weights packed once, here, as constants
of the program (``Wp[C_out / B][C_in][B]``, ``Wp[C / B][KH * KW][B]``). A depthwise convolution
reads and writes blocks; a 1x1 one writes blocks when it reads them, or when a convolution taken
here reads its result (it then reads its input in NCHW, where that is about as fast as the GEMM);
any other 1x1 convolution stays a GEMM. Inputs come blocked through ``ToNCHWc`` where needed (a
depthwise convolution's, a residual fused into a 1x1 one); every other reader, and anything the
segment hands back to Python, gets the NCHW value through ``FromNCHWc`` before the first of them.
Weights given at run time (parameters) may change between calls and keep the NCHW kernels, but
for an export (``ml.export_c``), whose weights are written once: :class:`PackedValue` says how.
Gradient programs are never rewritten. ``MITHRIL_C_NCHWC=0`` turns it off.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from math import prod

import numpy as np

from ..passes import PassManager, PlanPass
from ..plan import Plan, PlanIndex, PlanNode, PlanValue, reads_of
from .ops import CLAMP, FLOATS, RESIDUAL, c_kernel
from .ops.nn import conv_kind, window_geometry

DOMAIN = "mithril.c"
_ids = itertools.count(-1, -1)  # ids of the values made here, apart from the plan's own


def enabled() -> bool:
    return os.environ.get("MITHRIL_C_NCHWC", "").strip().lower() not in ("0", "off", "false", "no")


def block(dtype) -> int:
    """Channels per block: one 64-byte cache line (16 float32, 8 float64), as lib/mt_nchwc.h."""
    return 64 // np.dtype(dtype).itemsize


def _padded(channels: int, b: int) -> int:
    return -(-channels // b) * b


def blocked_kind(pn: PlanNode, pack_params: bool = False) -> str | None:
    """"pointwise" or "depthwise" when this Conv (after render.fuse) can run blocked; else None.
    Its weights and bias must be constants, or with ``pack_params`` parameters too (an export,
    whose weights are fixed when it is written)."""
    if pn.domain != "" or pn.op_type != "Conv" or len(pn.inputs) < 2 or pn.inputs[1] is None:
        return None
    x, w = pn.inputs[0], pn.inputs[1]
    bias = pn.inputs[2] if len(pn.inputs) > 2 else None
    fixed = ("constant", "param") if pack_params else ("constant",)
    if (x.dtype not in FLOATS or w.kind not in fixed or (bias is not None and bias.kind not in fixed)
            or x.static_shape is None or len(x.static_shape) != 4 or pn.outputs[0].static_shape is None):
        return None
    kind, _ = conv_kind(pn)
    group = int(pn.kwargs.get("group") or 1)
    if kind == "pointwise" and group == 1:
        return kind
    if kind == "depthwise" and w.static_shape[0] == x.static_shape[1] and not pn.kwargs.get(RESIDUAL):
        return kind
    return None


@dataclass(eq=False, repr=False)
class PackedValue(PlanValue):
    """A constant the renderer derives from a weight: ``pack(source's array)``. From a constant
    it is computed here; from a parameter (an export) when the export writes its weights."""

    source: PlanValue | None = None
    pack: Callable[[np.ndarray | None], np.ndarray] | None = None


def _pack_weights(w: np.ndarray, b: int) -> np.ndarray:
    """[C_out][rest] -> [C_out / B][rest][B] (rows past C_out zero): the 1x1 kernel's
    [C_out/B][C_in][B] and the depthwise kernel's [C/B][taps][B]."""
    w = np.asarray(w)
    rows = np.zeros((_padded(w.shape[0], b), prod(w.shape[1:])), dtype=w.dtype)
    rows[:w.shape[0]] = w.reshape(w.shape[0], -1)
    return np.ascontiguousarray(rows.reshape(-1, b, rows.shape[1]).transpose(0, 2, 1))


def _pack_bias(bias: np.ndarray | None, channels: int, b: int, dtype) -> np.ndarray:
    out = np.zeros(_padded(channels, b), dtype=dtype)
    if bias is not None:
        out[:channels] = np.asarray(bias).reshape(-1)
    return out


def _packed_value(name: str, source: PlanValue | None, pack, dtype) -> PackedValue:
    """``pack`` of ``source``'s array (None: of nothing), computed now unless it is a parameter."""
    now = source is None or source.kind == "constant"
    array = pack(None if source is None else source.value) if now else None
    shape = array.shape if now else pack(np.zeros(source.static_shape, dtype)).shape
    return PackedValue(next(_ids), name, tuple(shape), np.dtype(dtype), "constant", None, array, source, pack)


def _packed(pn: PlanNode) -> tuple[PackedValue, PackedValue]:
    """The node's weights and bias as the blocked kernels read them (see the module docstring)."""
    w, y = pn.inputs[1], pn.outputs[0]
    b, cout, dt = block(y.dtype), w.static_shape[0], y.dtype
    bias = pn.inputs[2] if len(pn.inputs) > 2 else None
    wp = _packed_value(f"{w.name}@nchwc", w, lambda a: _pack_weights(np.asarray(a, dtype=dt), b), dt)
    bp = _packed_value(f"{(bias or w).name}@nchwc.bias", bias, lambda a: _pack_bias(a, cout, b, dt), dt)
    return wp, bp


def _blocked_value(v: PlanValue) -> PlanValue:
    """A new value holding ``v`` blocked: its shape has the channels padded to whole blocks."""
    n, c, *rest = v.static_shape
    return PlanValue(next(_ids), f"{v.name}@nchwc", (n, _padded(c, block(v.dtype)), *rest), v.dtype, "node")


def _reads_plain_well(x: PlanValue) -> bool:
    """Whether the 1x1 kernel reads ``x`` in NCHW about as fast as the GEMM: a register tile of 12
    positions reads 12 values of every input channel, one stream per channel (256 channels of a
    56x56 plane: 0.75x the GEMM's speed; 144 of 56x56: 0.98x; 384 of 14x14: 1.34x)."""
    _, c, *spatial = x.static_shape
    return c <= 64 or prod(spatial) <= 1024


class BlockNCHWc(PlanPass):
    """The convolutions of one C segment it can take, blocked (see the module docstring), with the
    reorders their inputs and results need: a layout change on the plan of one segment, whose
    ``keep(v)`` says ``v`` is read after the segment (or is a graph output); ``pack_params`` as in
    :func:`blocked_kind`. Each node made here stands for the node it runs for (profile slots)."""

    name = "c-nchwc"

    def __init__(self, keep: Callable[[PlanValue], bool], pack_params: bool = False):
        self.keep = keep
        self.pack_params = pack_params

    def run(self, index: PlanIndex) -> bool:
        nodes = list(index.plan.nodes)
        kinds = {id(pn): blocked_kind(pn, self.pack_params) for pn in nodes}
        if not any(kinds.values()):
            return False
        takes_blocked = {pn.inputs[0] for pn in nodes if kinds[id(pn)]}  # values a convolution here would read blocked
        blocked: dict[PlanValue, PlanValue] = {}  # value -> its blocked copy
        only_blocked: set[PlanValue] = set()  # values not (yet) written in NCHW
        changed = False

        def reorder(pn: PlanNode, op: str, src: PlanValue, dst: PlanValue, logical: PlanValue,
                    before: PlanNode | None) -> None:
            nonlocal changed
            n, c, *spatial = logical.static_shape
            node = replace(pn, label=f"{logical.name} {'to' if op == 'ToNCHWc' else 'from'} NCHWc", op_type=op,
                           domain=DOMAIN, inputs=(src,), outputs=(dst,), attributes={}, defaults={}, subgraphs={},
                           kwargs={"n": n, "channels": c, "positions": prod(spatial)}, frees=())
            index.insert(node, before=before, origin=pn)
            changed = True

        def plain(v: PlanValue, pn: PlanNode, before: PlanNode | None) -> None:
            if v in only_blocked:
                only_blocked.discard(v)
                reorder(pn, "FromNCHWc", blocked[v], v, v, before)

        def as_blocked(v: PlanValue, pn: PlanNode) -> PlanValue:
            if v not in blocked:
                blocked[v] = _blocked_value(v)
                reorder(pn, "ToNCHWc", v, blocked[v], v, pn)
            return blocked[v]

        for pn in nodes:
            kind = kinds[id(pn)]
            x = pn.inputs[0] if kind else None
            if kind is None or (kind == "pointwise" and x not in blocked
                                and not (pn.outputs[0] in takes_blocked and _reads_plain_well(x))):
                for v in reads_of(pn):  # not blocked (for a 1x1 convolution, neither side: the GEMM)
                    plain(v, pn, pn)
                continue
            # Results are written blocked, a whole vector per store (stored in NCHW from the register
            # tiles, 24 output channels of a 56x56 plane took 2.4x the GEMM's time).
            y = pn.outputs[0]
            xin = as_blocked(x, pn) if kind == "depthwise" else blocked.get(x, x)
            res = pn.inputs[3] if pn.kwargs.get(RESIDUAL) else None
            if res is not None:
                res = as_blocked(res, pn)
            wp, bp = _packed(pn)
            yout = _blocked_value(y)
            n, c = x.static_shape[:2]
            kw = {"kind": kind, "x_blocked": xin is not x, "n": n, "in_channels": c,
                  "out_channels": y.static_shape[1], "positions": prod(y.static_shape[2:]),
                  CLAMP: pn.kwargs.get(CLAMP, (-np.inf, np.inf))}
            if kind == "depthwise":
                _, win = conv_kind(pn)
                kw["geometry"] = window_geometry(x.static_shape[2:], win.out, win.kernel, win.strides, win.begin,
                                                 win.dilations)
            index.replace(pn, replace(pn, op_type="ConvNCHWc", domain=DOMAIN, inputs=(xin, wp, bp, res),
                                      outputs=(yout,), kwargs=kw, frees=()))
            changed = True
            blocked[y] = yout
            only_blocked.add(y)
        for v in [v for v in blocked if v in only_blocked and self.keep(v)]:
            plain(v, index.plan.nodes[-1], None)
        return changed


def block_segment(nodes: list[PlanNode], keep: Callable[[PlanValue], bool],
                  pack_params: bool = False) -> tuple[list[PlanNode], dict[int, PlanNode]]:
    """The segment's nodes after :class:`BlockNCHWc`, and by id of each node made here the node
    it runs for (profile slots)."""
    segment = Plan("c", {}, [], [], [], list(nodes), [])
    result = PassManager([BlockNCHWc(keep, pack_params)])(segment)
    return (list(result.plan.nodes), result.origins) if result.changed else (nodes, {})


@c_kernel("ToNCHWc", "FromNCHWc", domain=DOMAIN, dtypes=FLOATS)
def reorder(pn, c):
    k, x, y = pn.kwargs, pn.inputs[0], pn.outputs[0]
    fn = "mt_nchwc_to" if pn.op_type == "ToNCHWc" else "mt_nchwc_from"
    c.line(f"{fn}_{c.sfx(y)}({c.buf(x)}, {c.buf(y)}, {k['n']}, {k['channels']}, {k['positions']});")


@c_kernel("ConvNCHWc", domain=DOMAIN, dtypes=FLOATS)
def conv_nchwc(pn, c):
    k, (x, wp, bp, res), y = pn.kwargs, pn.inputs, pn.outputs[0]
    lo, hi = (c.literal(b, y.dtype) for b in k[CLAMP])
    sfx = c.sfx(y)
    if k["kind"] == "depthwise":
        c.line(f"mt_dw_nchwc_{sfx}({c.buf(x)}, {c.buf(wp)}, {c.buf(bp)}, {c.buf(y)}, {k['n']}, {k['in_channels']}, "
               f"{c.arr(k['geometry'])}, {lo}, {hi});")
        return
    r = c.buf(res) if res is not None else "0"
    c.line(f"mt_conv1x1_nchwc_{sfx}({c.buf(x)}, {int(k['x_blocked'])}, {c.buf(wp)}, {c.buf(bp)}, {r}, {c.buf(y)}, "
           f"{k['n']}, {k['in_channels']}, {k['out_channels']}, {k['positions']}, {lo}, {hi});")


__all__ = ["DOMAIN", "BlockNCHWc", "PackedValue", "block", "block_segment", "blocked_kind", "enabled"]
