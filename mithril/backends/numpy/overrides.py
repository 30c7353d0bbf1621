"""NumPy overrides: where SciPy has the function NumPy lacks, use it (speed, and ulp-level accuracy)."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ..registry import override


def _float_compute(x):
    # float16/bfloat16 compute in float32 and round back, as the shared kernels do.
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


@override("numpy", "Erf", since=9,
          reason="ulp-level accuracy and speed: scipy.special.erf in C, not the shared polynomial's dozen passes")
def erf(x, *, xp):
    if x.dtype.kind in "iu":
        return special.erf(x.astype(np.float64)).astype(x.dtype)
    return special.erf(_float_compute(x)).astype(x.dtype)


@override("numpy", "Gelu", since=20,
          reason="ulp-level accuracy and speed: scipy.special.erfc and expit, as for Erf")
def gelu(x, *, approximate, xp):
    v = _float_compute(x)
    if approximate == "none":
        # 0.5 * v * erfc(-v / sqrt2) keeps its relative precision for large negative v.
        y = 0.5 * v * special.erfc(-v * np.asarray(1 / math.sqrt(2), v.dtype))
    elif approximate == "tanh":
        k = np.asarray(2 * math.sqrt(2 / math.pi), v.dtype)
        y = v * special.expit(k * (v + np.asarray(0.044715, v.dtype) * v * v * v))
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return y.astype(x.dtype)


@override("numpy", "Conv", since=1,
          reason="speed: depthwise (group == channels, 2-D) as multiply-adds of shifted contiguous views over "
                 "stride phases (mithril/backends/numpy/conv.py); the shared im2col + matmul elsewhere")
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp):
    from ..kernels.geometry import window
    from ..kernels.nn import conv as shared_conv
    from .conv import depthwise_2d, is_depthwise_2d

    if is_depthwise_2d(x, w, b, group):
        win = window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
        if all(o > 0 for o in win.out):
            return depthwise_2d(x, w, b, win)
    return shared_conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                       pads=pads, strides=strides, xp=xp)
