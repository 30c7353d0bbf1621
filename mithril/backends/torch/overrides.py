"""PyTorch kernels: hot ops calling ``torch.nn.functional`` directly (speed), and the ops whose
shared kernels mutate NumPy arrays in place (scatters, the ConvTranspose overlap-add).

Inputs arrive as :class:`~mithril.backends.torch.xp.TorchArray` (or NumPy arrays for values
folded on the host); every kernel returns TorchArrays. Cases torch cannot run natively
(integer convolutions, more than three spatial axes, MaxPool's indices) go to the shared kernel.
"""

from __future__ import annotations

import functools
import math
import weakref

import numpy as np
import torch
import torch.nn.functional as F

from ..cpu import cpu_flags
from ..kernels import elementwise as _ew
from ..kernels import nn as _nn
from ..kernels import normalization as _norm
from ..kernels import shape as _shape
from ..kernels.geometry import transposed_window, window
from ..registry import override
from . import xp as txp
from .xp import TorchArray

_FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# Whether torch.jit.trace is recording this call (torch/graph.py's oneDNN graph): kernels then take
# torch's plain ops, which oneDNN's graph fuser knows, with no packed weights, caches or in-place writes.
is_tracing = torch._C._is_tracing
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _t(x):
    return txp.native_tensor(x)


def _symmetric_padding(win, size, pairs, pool: bool = False):
    """The per-axis padding to hand torch (which pads both ends alike), or None when the input
    needs explicit padding. Symmetric padding serves when the end padding the windows read is no
    more than the begin padding and yields the same windows: stride-2 convs and pools of even
    inputs read one pixel less at the end than at the start. torch's pools also take at most
    half the window as padding."""
    padding = tuple(b for b, _ in pairs)
    for n, (b, e), k, d, s, o in zip(size, pairs, win.kernel, win.dilations, win.strides, win.out):
        span = (k - 1) * d + 1
        if e > b or (n + 2 * b - span) // s + 1 != o or (pool and 2 * b > span):
            return None
    return padding


def pad_input(x: torch.Tensor, pairs, value) -> torch.Tensor:
    """``x`` padded by ``(begin, end)`` per spatial axis with ``value`` (``F.pad``'s order reversed)."""
    flat = []
    for b, e in reversed(pairs):
        flat += [b, e]
    return F.pad(x, flat, value=value) if any(flat) else x


# ---------------------------------------------------------------- convolution


@override("torch", "Conv", since=1,
          reason="speed: torch's convolution; the shared kernel is im2col over the facade")
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp):
    xt, wt = _t(x), _t(w)
    nd = xt.dim() - 2
    if nd not in _CONV or xt.dtype not in _FLOATS or wt.dtype != xt.dtype:
        return _nn.conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,
                        kernel_shape=kernel_shape, pads=pads, strides=strides, xp=xp)
    bt = _t(b) if b is not None else None
    if bt is not None and bt.dtype != xt.dtype:
        bt = bt.to(xt.dtype)
    packed = None if nd != 2 else packed_conv_arguments(xt, wt, bt, auto_pad=auto_pad, dilations=dilations,
                                                        group=group, pads=pads, strides=strides)
    if packed is not None:
        xp_, wp, bp, padding, strides_, dilations_, _ = packed
        y = packed_call("none", xp_, wp, padding, strides_, dilations_, group,
                        lambda: POINTWISE(xp_, wp, bp, padding, strides_, dilations_, group, "none", [], None))
        if y is not None:
            return TorchArray(y)
    xt, padding, win = _conv_window(xt, wt, auto_pad, dilations, pads, strides)
    if nd == 2 and type(xt) is type(wt) is torch.Tensor and xt.device.type == "cpu" and \
            xt.dtype in _CHANNELS_LAST_DTYPES and not torch.is_grad_enabled() and \
            not is_tracing():  # DTensors keep their layout
        # oneDNN's NHWC convolutions are 1.3-2x its NCHW ones on the CPU; a channels_last weight
        # makes torch run the conv in NHWC and return an NHWC result, and the pointwise ops,
        # pools and normalizations after it keep that layout up to the next conv. The input is
        # made NHWC too: a depthwise or 1x1 weight has both layouts, and alone picks NCHW.
        # Forward only: with autograd recording, NHWC made ResNet-18's training step slower
        # (1 thread: 183 ms with NHWC weights, 201 with per-call copies, 160 in NCHW).
        xt, wt = xt.contiguous(memory_format=torch.channels_last), channels_last_weight(wt)
    return TorchArray(_CONV[nd](xt, wt, bt, win.strides, padding, win.dilations, group))


def _conv_window(xt, wt, auto_pad, dilations, pads, strides):
    """(input, padding for torch, window): the input padded explicitly (padding 0) where torch's
    symmetric padding cannot give the ONNX windows."""
    win, pairs, padding = conv_geometry(xt, wt, auto_pad, dilations, pads, strides)
    return (xt if pairs is None else pad_input(xt, pairs, 0.0)), padding, win


def conv_geometry(xt, wt, auto_pad, dilations, pads, strides):
    """(window, the (begin, end) pads per spatial axis the input itself takes or None, torch's
    symmetric padding): the input is padded explicitly (torch's padding then 0) only where torch's
    symmetric padding cannot give the ONNX windows."""
    size = tuple(xt.shape[2:])
    win = window(size, tuple(wt.shape[2:]), strides, dilations, pads, auto_pad)
    pairs, padding = _conv_padding(win, size)
    return (win, pairs, (0,) * len(size)) if padding is None else (win, None, padding)


@functools.lru_cache(maxsize=4096)
def _conv_padding(win, size):
    """(pads the windows read, torch's symmetric padding or None): the same for every call of a
    node (``window`` is cached too), computed once."""
    pairs = win.read_pads(size)
    return pairs, _symmetric_padding(win, size, pairs)


def packed_conv_arguments(xt, wt, bt, *, auto_pad, dilations, group, pads, strides):
    """For a forward-only float32 2-D convolution on the CPU whose weight :func:`packed_weight`
    packs: ``(input NHWC, packed weight, bias, padding, strides, dilations, output shape)``, the
    arguments of ``torch.ops.mkldnn._convolution_pointwise``; None for any other convolution."""
    if not _PACKED or is_tracing() or type(wt) is not torch.Tensor or type(xt) is not torch.Tensor or xt.dim() != 4 or \
            xt.dtype != torch.float32 or wt.dtype != torch.float32 or torch.is_grad_enabled() or \
            xt.device.type != "cpu" or wt.device.type != "cpu" or \
            (bt is not None and (type(bt) is not torch.Tensor or bt.dtype != torch.float32)):
        return None
    xt, padding, win = _conv_window(xt, wt, auto_pad, dilations, pads, strides)
    xt = xt.contiguous(memory_format=torch.channels_last)
    geometry = (list(padding), list(win.strides), list(win.dilations))
    packed = packed_weight(wt, *geometry, group, tuple(xt.shape))
    if packed is None:
        return None
    return (xt, packed, bt, *geometry, (xt.shape[0], wt.shape[0], *win.out))


# Dtypes whose CPU convolutions oneDNN runs (float64 takes torch's own slower kernels either way).
# 2-D only: 1-D convs gained little (64x1000 k3: 0.23 vs 0.18 ms as NHWC 2-D); 3-D depthwise was
# 1.31 -> 0.27 ms in channels_last_3d, but torch's dense conv3d returns NCDHW whatever its inputs'
# layout (same speed), so each next conv would copy its input back.
_CHANNELS_LAST_DTYPES = (torch.float32, torch.bfloat16)
# (id(weight), what) -> (weakref to it, its version when copied, the copy's key, the copy). A
# model's weights are the same tensors call after call: each is rearranged once, not per call.
kept_copies: dict = {}
# oneDNN's own convolution with a weight reordered once into its blocked layout (what
# torch.compile's freezing calls), where torch's public one reorders the weight at every call.
_PACKED = getattr(getattr(torch.ops, "mkldnn", None), "_convolution_pointwise", None) is not None and \
    torch.backends.mkldnn.is_available()
POINTWISE = torch.ops.mkldnn._convolution_pointwise if _PACKED else None
POINTWISE_BINARY = torch.ops.mkldnn._convolution_pointwise.binary if _PACKED else None
# Geometries (post-op, input and packed weight shapes, padding, strides, dilations, group) whose
# oneDNN call raised. These are torch's private ops, and oneDNN chooses its implementation by the
# processor: on one (torch 2.11, the device machine's CPU) the binary call refused a 3x3 conv of a
# 1x1 input ("could not create a memory") that runs here. Such a geometry takes torch's public
# convolution from then on: the same result, at the unpacked speed.
_REFUSED: set = set()


def packed_call(post: str, xt, packed, padding, strides, dilations, group: int, call):
    """``call()``, a private oneDNN convolution of this geometry; None where it raises a
    RuntimeError, now or before (the caller then runs torch's public ops). The geometry's key is
    built only once something was refused: none, in the common case."""
    def key():
        return post, tuple(xt.shape), tuple(packed.shape), tuple(padding), tuple(strides), tuple(dilations), group

    if _REFUSED and key() in _REFUSED:
        return None
    try:
        return call()
    except RuntimeError:
        _REFUSED.add(key())
        return None


def _kept(w: torch.Tensor, what, key, make, *, when_back: bool = False):
    """``make()``, a rearranged copy of ``w``, kept while ``w`` lives unchanged in place (its
    version counter) and asked for with the same ``key``; None where it cannot be kept: a weight
    autograd differentiates, an inference tensor (no version counter), under torch.compile
    (which sees no cache). With ``when_back``, the copy is made only when ``w`` comes back
    unchanged at a later call (None until then): a tensor made afresh at every call, an
    activation, is never copied."""
    if (w.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling() or w.is_inference() or \
            is_tracing():
        return None
    ident, version = (id(w), what), w._version
    held = kept_copies.get(ident)
    seen = held is not None and held[0]() is w and held[1] == version and held[2] == key
    if seen and held[3] is not None:
        return held[3]
    copy = make() if seen or not when_back else None
    kept_copies[ident] = (weakref.ref(w, lambda _, ident=ident: kept_copies.pop(ident, None)), version, key, copy)
    return copy


def channels_last_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` (a 4-D conv weight, OIHW) with channels_last strides: the same values. The copy is
    kept while ``w`` lives and is unchanged in place (its version counter); for a weight autograd
    differentiates, or under torch.compile (which sees no cache), it is a copy per call."""
    if w.is_contiguous(memory_format=torch.channels_last):
        return w
    kept = _kept(w, "nhwc", None, lambda: w.contiguous(memory_format=torch.channels_last))
    return kept if kept is not None else w.contiguous(memory_format=torch.channels_last)


def packed_weight(w: torch.Tensor, padding, strides, dilations, group: int, size) -> torch.Tensor | None:
    """``w`` (float32 OIHW) reordered by oneDNN for a convolution of an input of ``size``, kept
    like :func:`channels_last_weight`'s copy; None for other dtypes or without oneDNN. Every
    kernel shape is packed, 1x1 and depthwise ones too, though their own layout serves torch's
    public convolution: ResNet-18's 3x3 layers ran 1.2-1.25x faster packed, and MobileNetV2
    (mostly 1x1 and depthwise layers) 28 -> 23 ms at 2 threads, for a copy of its weights."""
    if not _PACKED or w.dtype != torch.float32:
        return None
    key = (tuple(padding), tuple(strides), tuple(dilations), group, size)
    return _kept(w, "mkldnn", key, lambda: torch.ops.mkldnn._reorder_convolution_weight(
        w, padding, strides, dilations, group, list(size)))


def _transpose_crop(y: torch.Tensor, begin, out) -> torch.Tensor:
    """Window [begin, begin + out) of each spatial axis; outside y is zeros (negative padding)."""
    nd = len(begin)
    pairs = [(max(0, -bg), max(0, bg + o - n)) for bg, o, n in zip(begin, out, y.shape[2:])]
    y = pad_input(y, pairs, 0.0)
    index = tuple(slice(bg + p[0], bg + p[0] + o) for bg, o, p in zip(begin, out, pairs))
    return y[(Ellipsis, *index)] if nd else y


@override("torch", "ConvTranspose", since=1,
          reason="speed and a semantic gap: torch's transposed convolution; the shared overlap-add mutates a NumPy canvas")
def conv_transpose(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, output_padding, output_shape,
                   pads, strides):
    xt, wt = _t(x), _t(w)
    size = tuple(xt.shape[2:])
    nd = len(size)
    if nd not in _CONV_T or xt.dtype not in _FLOATS:
        return _nn.conv_transpose(np.asarray(x), np.asarray(w), None if b is None else np.asarray(b),
                                  auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                                  output_padding=output_padding, output_shape=output_shape, pads=pads,
                                  strides=strides)
    geo = transposed_window(size, tuple(wt.shape[2:]), strides, dilations, pads, auto_pad, output_padding,
                            output_shape)
    y = _CONV_T[nd](xt, wt, None, geo.strides, 0, 0, group, geo.dilations)
    y = _transpose_crop(y, geo.begin, geo.out)
    if b is not None:
        y = y + _t(b).to(y.dtype).reshape((-1,) + (1,) * nd)
    return TorchArray(y)


@override("torch", "Col2Im", since=18, static_inputs=(1, 2),
          reason="semantic gap: the shared overlap-add mutates a NumPy canvas; here a transposed conv with one-hot kernels")
def col2im(x, image_shape, block_shape, *, dilations, pads, strides):
    xt = _t(x)
    image = tuple(int(i) for i in np.asarray(image_shape))
    block = tuple(int(k) for k in np.asarray(block_shape))
    nd, taps = len(image), math.prod(block)
    if nd not in _CONV_T:
        return _nn.col2im(np.asarray(x), image_shape, block_shape, dilations=dilations, pads=pads, strides=strides)
    win = window(image, block, strides, dilations, pads, "NOTSET")
    n, c = xt.shape[0], xt.shape[1] // taps
    # Overlap-add is a transposed convolution with one-hot kernels: tap k of channel ch lands at offset k.
    onehot = torch.eye(taps, dtype=xt.dtype, device=xt.device).reshape((taps, 1) + block).repeat(c, 1, *([1] * nd))
    cols = xt.reshape((n, c * taps) + win.out)
    y = _CONV_T[nd](cols, onehot, None, win.strides, 0, 0, c, win.dilations)
    return TorchArray(_transpose_crop(y, list(win.begin), list(image)))


# ---------------------------------------------------------------- pooling


@override("torch", "MaxPool", since=1,
          reason="speed: torch's max pool; the shared kernel is one facade op per kernel offset")
def max_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0,
             num_outputs=1, xp):
    xt = _t(x)
    nd = xt.dim() - 2
    if num_outputs > 1 or nd not in _MAX_POOL or xt.dtype not in _FLOATS:
        return _nn.max_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                            ceil_mode=ceil_mode, dilations=dilations, storage_order=storage_order,
                            num_outputs=num_outputs, xp=xp)
    size = tuple(xt.shape[2:])
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    pairs = win.read_pads(size)
    padding = _symmetric_padding(win, size, pairs, pool=True)
    if padding is None:
        xt, padding = pad_input(xt, pairs, -math.inf), 0
    return TorchArray(_MAX_POOL[nd](xt, win.kernel, win.strides, padding, win.dilations))


@override("torch", "AveragePool", since=1,
          reason="speed: torch's average pool; the shared kernel is one facade op per kernel offset")
def average_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, count_include_pad=0, dilations=None,
                 xp):
    xt = _t(x)
    nd = xt.dim() - 2
    if nd not in _AVG_POOL or xt.dtype not in _FLOATS or any(d != 1 for d in (dilations or ())):
        return _nn.average_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                                ceil_mode=ceil_mode, count_include_pad=count_include_pad, dilations=dilations,
                                xp=xp)
    size = tuple(map(int, xt.shape[2:]))  # ints while torch.jit.trace records too (it gives tensors)
    win = window(size, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    # float16/bfloat16 windows are summed in float32, as onnxruntime does (the sum overflows first).
    out_dtype = xt.dtype
    if out_dtype in (torch.float16, torch.bfloat16):
        xt = xt.float()
    padded = pad_input(xt, win.read_pads(size), 0.0)
    # Sum over each window, divided by how many of its taps are counted.
    total = _AVG_POOL[nd](padded, win.kernel, win.strides, 0) * math.prod(win.kernel)
    counts = _nn.window_counts(size, win, count_include_pad)
    if np.all(counts == math.prod(win.kernel)):
        return TorchArray((total / math.prod(win.kernel)).to(out_dtype))
    return TorchArray((total / txp.tensor_from_numpy(counts.astype(np.float64), xt.device).to(xt.dtype)).to(out_dtype))


@override("torch", "GlobalAveragePool", since=1,
          reason="speed: one torch.mean without the facade's promotion layer")
def global_average_pool(x):
    xt = _t(x)
    return TorchArray(xt.mean(dim=tuple(range(2, xt.dim())), keepdim=True))


# ---------------------------------------------------------------- the most frequent small ops
# Transformer exports are hundreds of Add/Mul/Reshape/Transpose nodes on small tensors, where the
# facade's NumPy-semantics layer (promotion, wrapping, host fallbacks) costs as much as the op.
# Operands of one floating dtype (the common case) go straight to torch; anything else (mixed
# dtypes, integer division, strings, scalars) takes the shared kernel.


def _binary_fast(torch_fn, shared):
    def kernel(a, b, *, xp):
        if type(a) is TorchArray and type(b) is TorchArray:
            at, bt = a.native, b.native
            if at.dtype is bt.dtype and at.dtype.is_floating_point:
                return TorchArray(torch_fn(at, bt))
        return shared(a, b, xp=xp)

    kernel.__name__ = shared.__name__
    return kernel


_SMALL_OPS = "speed: the facade's NumPy-semantics layer costs as much as the op on small tensors"
# op type -> its kernel here (fusion.py recognises the Add after a Conv by it)
BINARY = {}
for _op, _fn, _shared in (("Add", torch.add, _ew.add), ("Sub", torch.sub, _ew.sub),
                          ("Mul", torch.mul, _ew.mul), ("Div", torch.div, _ew.div)):
    BINARY[_op] = override("torch", _op, since=7, reason=_SMALL_OPS)(_binary_fast(_fn, _shared))


@override("torch", "Clip", since=11,
          reason="speed: one torch.clamp instead of the facade's maximum, minimum and casts")
def clip(x, low=None, high=None, *, xp):
    # One torch.clamp (ReLU6 in MobileNets) instead of the facade's maximum, minimum and casts;
    # min > max gives max everywhere in both, as ONNX specifies.
    if type(x) is TorchArray and x.native.dtype.is_floating_point and (low is not None or high is not None) and \
            all(v is None or type(v) is TorchArray for v in (low, high)):
        t = x.native
        bounds = [None if v is None else v.native for v in (low, high)]
        if t.device.type == "cpu" and not torch.compiler.is_compiling() and \
                all(v is None or (v.numel() == 1 and not v.requires_grad) for v in bounds):
            # Scalar bounds take clamp's fast kernel (tensor bounds are 5x slower); on the CPU,
            # reading them costs no device sync. Rounded to x's dtype first, as ONNX casts them.
            # A bound autograd differentiates stays a tensor (a Python float has no gradient), and
            # so does one torch.compile traces (.item() would break its graph).
            bounds = [None if v is None else v.to(t.dtype).item() for v in bounds]
        else:
            bounds = [None if v is None else v.to(t.dtype) for v in bounds]
        return TorchArray(torch.clamp(t, *bounds))
    return _ew.clip(x, low, high, xp=xp)


@override("torch", "Reshape", since=5, static_inputs=(1,),
          reason=_SMALL_OPS)
def reshape(data, shape, *, allowzero=0, xp):
    if type(data) is not TorchArray:
        return _shape.reshape(data, shape, allowzero=allowzero, xp=xp)
    t = data.native
    dims = shape.tolist() if isinstance(shape, np.ndarray) else list(_shape.static_ints(shape))
    if not allowzero and 0 in dims:
        dims = [t.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return TorchArray(t.reshape(dims))


@override("torch", "Transpose", since=1,
          reason=_SMALL_OPS)
def transpose(data, *, perm, xp):
    if type(data) is not TorchArray:
        return _shape.transpose(data, perm=perm, xp=xp)
    t = data.native
    return TorchArray(t.permute(*(perm if perm is not None else reversed(range(t.dim())))))


# ---------------------------------------------------------------- matmul family


# oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``, what torch.compile's freezing calls)
# instead of torch's BLAS where that is MKL on a CPU that is not Intel's, whose AVX-512 MKL leaves
# unused. On an AMD EPYC (Zen 4), forward-only float32, medians of 30 calls, addmm -> oneDNN: GPT-2's
# LM head (128x256 by 256x50257) 65.3 -> 35.7 ms at 1 thread and 35.8 -> 18.3 at 2; BERT's 128x256 by
# 256x1024 0.70 -> 0.64 and 0.46 -> 0.36 ms; 128x256 by 256x256 even; smaller products slower
# (128x64 by 64x128: 24 -> 36 us), hence the floor in multiply-adds. On the same host in a later
# session (Zen 5, its AVX-512 twice as fast as before against MKL's AVX2 kernels), 1 / 2 threads:
# 128x256 by 256x256 175 -> 94 / 95 -> 55 us, 128x256 by 256x128 91 -> 55 / 49 -> 35, 128x128 by
# 128x128 47 -> 33 / 38 -> 29, 128x64 by 64x128 25 -> 24 / 17 -> 24; the floor at 2^22 (it was
# 2^24) takes BERT's 256x256 projections: the model 8.74 -> 6.98 ms at 1 thread, 5.85 -> 4.71 at 2
# (onnxruntime 6.58 and 3.80; one process, alternating blocks). On Intel CPUs, MKL's own were as
# fast on BERT's shapes (docs/performance.md).
_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None) is not None and \
    torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available() and \
    cpu_flags()[0] not in ("GenuineIntel", "")
_ONEDNN_LINEAR_MIN_MACS = 1 << 22


def onednn_linear(xt, wt, bt=None):
    """``xt @ wt.T + bt`` (``wt`` as (N, K), ``bt`` as (N,) or None) by oneDNN where
    ``_ONEDNN_LINEAR`` holds, for a large forward-only float32 product of plain CPU tensors;
    None elsewhere (the caller runs torch's own): oneDNN's op has no autograd formula."""
    if not _ONEDNN_LINEAR or torch.is_grad_enabled() or torch.compiler.is_compiling() or is_tracing() or \
            type(xt) is not torch.Tensor or type(wt) is not torch.Tensor or xt.dtype != torch.float32 or \
            wt.dtype != torch.float32 or xt.dim() < 2 or wt.dim() != 2 or xt.shape[-1] != wt.shape[1] or \
            xt.device.type != "cpu" or wt.device.type != "cpu" or (bt is not None and (
                type(bt) is not torch.Tensor or bt.dtype != torch.float32 or tuple(bt.shape) != (wt.shape[0],))):
        return None
    if xt.numel() * wt.shape[0] < _ONEDNN_LINEAR_MIN_MACS:  # M*K*N
        return None
    packed = _packed_linear_weight(wt, xt.numel() // xt.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(xt, wt if packed is None else packed, bt, "none", [], "")


# oneDNN's matmul reads a weight in its own blocked layout faster than a plain one, which it
# rearranges again at every call. On an AMD EPYC (Zen 4), medians of 30 calls, plain -> packed:
# GPT-2's LM head (128x256 by 256x50257) 20.4 -> 18.2 ms at 2 threads and 39.8 -> 34.7 at 1;
# 128x256 by 256x1024 0.40 -> 0.37 ms; 256x768, 1024x256 and 256x256 weights even. The whole
# GPT-2 (one process, shuffled blocks) 34.7 -> 32.5 and 38.2 -> 34.7 ms at 2 threads, 63.2 -> 57.5
# at 1; its peak memory 157 -> 206 MiB (onnxruntime's 170): a packed weight is a second copy, as a
# packed convolution weight is, so only weights from this many elements are packed.
_ONEDNN_PACK_MIN_ELEMENTS = 1 << 20


def _packed_linear_weight(wt: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``wt`` (N, K) reordered by oneDNN for products of ``rows`` input rows (a layout choice:
    other row counts read it correctly), kept like :func:`packed_weight`'s, keyed on the tensor
    ``wt`` views (a MatMul's weight arrives transposed, a view made at every call); made at the
    second call that brings it unchanged. None for smaller weights."""
    if wt.numel() < _ONEDNN_PACK_MIN_ELEMENTS:
        return None
    base = wt if wt._base is None else wt._base
    what = ("linear", wt.data_ptr() - base.data_ptr(), tuple(wt.shape), wt.stride())
    return _kept(base, what, None, lambda: torch.ops.mkldnn._reorder_linear_weight(wt, rows), when_back=True)


@override("torch", "MatMul", since=1,
          reason="speed: torch.matmul without the facade's promotion layer")
def matmul(a, b):
    at, bt = _t(a), _t(b)
    if at.dtype != bt.dtype:
        return txp.matmul(a, b)
    if bt.dim() == 2 and _ONEDNN_LINEAR:
        y = onednn_linear(at, bt.t())
        if y is not None:
            return TorchArray(y)
    return TorchArray(torch.matmul(at, bt))


@override("torch", "Gemm", since=1,
          reason="speed: one torch.addmm where C is at most 2-D")
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=0):
    at, bt = _t(a), _t(b)
    if transA:
        at = at.t()
    if transB:
        bt = bt.t()
    if c is not None and beta != 0 and at.dtype in _FLOATS:
        ct = _t(c).to(at.dtype)
        if is_tracing():
            # For oneDNN's graph (torch/graph.py), whose fuser takes linear, and fails on addmm and on a
            # matmul followed by the add of a constant: a bias of one row as linear's.
            n = bt.shape[1]
            if alpha == 1 and beta == 1 and at.dim() == 2 and ct.dim() <= 2 and ct.numel() in (1, n) and \
                    (ct.dim() < 2 or ct.shape[0] == 1):
                return TorchArray(F.linear(at, bt.t(), ct.reshape(-1).expand(n)))
            y = torch.matmul(at, bt)
            return TorchArray((y * alpha if alpha != 1 else y) + (ct * beta if beta != 1 else ct))
        if _ONEDNN_LINEAR and alpha == 1 and beta == 1 and at.dim() == 2:
            y = onednn_linear(at, bt.t(), ct)
            if y is not None:
                return TorchArray(y)
        return TorchArray(torch.addmm(ct, at, bt, beta=beta, alpha=alpha) if ct.dim() <= 2 else
                          torch.matmul(at, bt) * alpha + ct * beta)
    y = onednn_linear(at, bt.t()) if _ONEDNN_LINEAR and alpha == 1 and at.dim() == 2 else None
    y = torch.matmul(at, bt) if y is None else y
    return TorchArray(y * alpha if alpha != 1 else y)


@override("torch", "MatMulAdd", since=1, domain="ai.mithril",
          reason="speed: one F.linear (addmm over the folded leading dims)")
def matmul_add(x, w, b, *, xp):
    xt, wt, bt = _t(x), _t(w), _t(b)
    if not (xt.dtype is wt.dtype is bt.dtype and xt.dtype in _FLOATS):
        return _nn.matmul_add(x, w, b, xp=xp)
    y = onednn_linear(xt, wt.t(), bt) if _ONEDNN_LINEAR else None
    return TorchArray(F.linear(xt, wt.t(), bt) if y is None else y)  # one addmm over the folded leading dims


# ---------------------------------------------------------------- activations and normalization


@override("torch", "Relu", since=6,
          reason="speed: torch.relu without the facade's promotion layer")
def relu(x):
    return TorchArray(torch.relu(_t(x)))


@override("torch", "LeakyRelu", since=6,
          reason="speed: one F.leaky_relu instead of the facade's where; and traced for oneDNN's graph "
                 "(torch/graph.py), where the facade's 0-dim alpha computed in float64")
def leaky_relu(x, *, alpha, xp):
    t = _t(x) if type(x) is TorchArray else None
    if t is None or t.dtype not in (torch.float32, torch.float64):  # half types: the shared kernel's float32
        return _ew.leaky_relu(x, alpha=alpha, xp=xp)
    return TorchArray(F.leaky_relu(t, float(alpha)))


def host_scalar(v, dtype):
    """A one-element operand as the Python number torch's scalar kernels take (clamp_'s bounds,
    pow's exponent), rounded to ``dtype`` as ONNX casts it; None when absent; False where it is
    not one host scalar."""
    if v is None:
        return None
    t = v.native if type(v) is TorchArray else None
    if t is None or t.numel() != 1 or t.device.type != "cpu":
        return False
    return (t if t.dtype == dtype else t.to(dtype)).item()


@override("torch", "Pow", since=7,
          reason="speed: a one-element exponent as a Python number takes torch's scalar-exponent kernel (x * x * x "
                 "for Gelu's x ** 3: 0.03 against 0.39 ms on 128x1024)")
def pow_(x, y, *, xp):
    if type(x) is TorchArray and type(y) is TorchArray:
        xt, yt = x.native, y.native
        # Same dtype (the shared kernel's plain power), an exponent autograd does not need and
        # torch.compile does not trace (.item() would break its graph), no broadcast beyond x.
        if xt.dtype in (torch.float32, torch.float64) and yt.dtype == xt.dtype and yt.dim() <= xt.dim() and \
                not (yt.requires_grad and torch.is_grad_enabled()) and not torch.compiler.is_compiling():
            e = host_scalar(y, xt.dtype)
            if e is not False:
                return TorchArray(torch.pow(xt, e))
    return _ew.pow_(x, y, xp=xp)


@override("torch", "Erf", since=9,
          reason="speed: torch.erf is one fused kernel; the shared polynomial is a dozen facade ops")
def erf(x, *, xp):
    xt = _t(x)
    if xt.dtype not in _FLOATS:
        return _ew.erf(x, xp=xp)
    return TorchArray(torch.erf(xt))


@override("torch", "Gelu", since=20,
          reason="speed: F.gelu is one fused kernel (both approximations)")
def gelu(x, *, approximate, xp):
    xt = _t(x)
    if approximate not in ("none", "tanh") or xt.dtype not in _FLOATS:
        return _ew.gelu(x, approximate=approximate, xp=xp)
    return TorchArray(F.gelu(xt, approximate=approximate))


@override("torch", "Softmax", since=13,
          reason="speed: torch.softmax, one fused kernel (float32/float64)")
def softmax(x, *, axis):
    xt = _t(x)
    if not xt.dim():
        return TorchArray(torch.ones_like(xt))
    if xt.dtype in (torch.float16, torch.bfloat16) and xt.numel():
        # torch.softmax computes a half input in float32 and rounds once; the ONNX graph (and
        # NumPy) round the shift, the exponentials and the quotient to the input type each.
        e = torch.exp(xt - xt.amax(dim=axis, keepdim=True))
        return TorchArray(e / e.sum(dim=axis, keepdim=True))
    return TorchArray(torch.softmax(xt, dim=axis))


@override("torch", "LogSoftmax", since=13,
          reason="speed: torch.log_softmax, one fused kernel")
def log_softmax(x, *, axis):
    xt = _t(x)
    return TorchArray(torch.log_softmax(xt, dim=axis) if xt.dim() else torch.zeros_like(xt))


@override("torch", "BatchNormalization", since=14,
          reason="speed: F.batch_norm, one fused kernel")
def batch_normalization(X, scale, B, input_mean, input_var, *, epsilon, momentum, training_mode, xp):
    xt = _t(X)
    params = [_t(p) for p in (scale, B, input_mean, input_var)]
    if training_mode or xt.dtype not in (torch.float32, torch.float64) or any(p.dtype != xt.dtype for p in params):
        return _norm.batch_normalization(X, scale, B, input_mean, input_var, epsilon=epsilon, momentum=momentum,
                                         training_mode=training_mode, xp=xp)
    s, b, m, v = params
    return TorchArray(F.batch_norm(xt, m, v, s, b, False, 0.0, epsilon))


@override("torch", "LayerNormalization", since=17,
          reason="speed: F.layer_norm, one fused kernel")
def layer_normalization(X, Scale, B=None, *, axis, epsilon, stash_type, num_outputs, xp):
    xt = _t(X)
    axis = axis + xt.dim() if axis < 0 else axis
    st = _t(Scale)
    if num_outputs > 1 or xt.dtype != torch.float32 or stash_type != 1 or st.dtype != xt.dtype:
        return _norm.layer_normalization(X, Scale, B, axis=axis, epsilon=epsilon, stash_type=stash_type, xp=xp)
    shape = tuple(xt.shape[axis:])
    bt = _t(B).to(xt.dtype) if B is not None else None
    if tuple(st.shape) != shape or (bt is not None and tuple(bt.shape) != shape):
        y = F.layer_norm(xt, shape, None, None, epsilon) * st
        return TorchArray(y + bt if bt is not None else y)
    return TorchArray(F.layer_norm(xt, shape, st, bt, epsilon))


# ---------------------------------------------------------------- scatters


_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _scatter_elements(data, indices, updates, axis, reduction):
    dt = _t(data)
    axis = axis % dt.dim()
    idx = _t(indices).long()
    idx = torch.where(idx < 0, idx + dt.shape[axis], idx)
    up = _t(updates).to(dt.dtype)
    if reduction == "none":
        return TorchArray(dt.scatter(axis, idx, up))
    return TorchArray(dt.scatter_reduce(axis, idx, up, _REDUCE[reduction], include_self=True))


@override("torch", "ScatterElements", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here torch's scatter")
def scatter_elements(data, indices, updates, *, axis, reduction="none"):
    return _scatter_elements(data, indices, updates, axis, reduction)


@override("torch", "Scatter", since=9,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here torch's scatter")
def scatter(data, indices, updates, *, axis):
    return _scatter_elements(data, indices, updates, axis, "none")


@override("torch", "ScatterND", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here torch's index_put")
def scatter_nd(data, indices, updates, *, reduction="none"):
    dt, idx = _t(data), _t(indices).long()
    k = idx.shape[-1]
    lead = dt.shape[:k]
    idx = torch.where(idx < 0, idx + torch.tensor(lead, device=idx.device), idx)
    strides = torch.tensor([math.prod(lead[i + 1:]) for i in range(k)], device=idx.device)
    flat_index = (idx * strides).sum(-1).reshape(-1)
    rest = tuple(dt.shape[k:])
    flat = dt.reshape((-1,) + rest)
    up = _t(updates).to(dt.dtype).reshape((-1,) + rest)
    if reduction == "none":
        out = flat.index_copy(0, flat_index, up)
    else:
        where = flat_index.reshape((-1,) + (1,) * len(rest)).expand_as(up)
        out = flat.scatter_reduce(0, where, up, _REDUCE[reduction], include_self=True)
    return TorchArray(out.reshape(dt.shape))



# ---------------------------------------------------------------- autodiff


@override("torch", "StopGradient", since=1, domain="ai.mithril",
          reason="gradient: Tensor.detach on tensors")
def stop_gradient(x):
    # Host values (static shapes, strings) carry no gradient.
    return TorchArray(_t(x).detach()) if isinstance(x, (TorchArray, torch.Tensor)) else x
