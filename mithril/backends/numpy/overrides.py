"""NumPy overrides: where SciPy has the function NumPy lacks, use it (speed, and ulp-level accuracy);
where NumPy's own loop is slow, a faster formulation (float32 Erf, Pow by 2, 3 or 4, 2-D Conv from
conv.py, MaxPool from pool.py)."""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ..registry import override


def _float_compute(x):
    # float16/bfloat16 compute in float32 and round back, as the shared kernels do.
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


# erf on float32 as x * P(x^2) / Q(x^2) over x clamped to [-4, 4] (beyond it erf rounds to +-1 in
# float32): Eigen's and XLA's float32 erf (Eigen's generic_fast_erf_float), lowest power first.
# At most 4.5e-7 from the exact erf (7 ulp near 1; onnxruntime's float32 Erf is also a polynomial).
_ERF32_P = np.array([-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
                     -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10], np.float32)
_ERF32_Q = np.array([-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
                     -1.45660718464996e-05], np.float32)
# Elements per block: a block's three temporaries stay in L2 across the twenty-odd passes.
_ERF32_BLOCK = 65536


def _erf_float32(x):
    out = np.empty(x.shape, np.float32)
    src, dst = x.reshape(-1), out.reshape(-1)
    size = src.size
    v, v2, p = (np.empty(min(size, _ERF32_BLOCK), np.float32) for _ in range(3))
    for start in range(0, size, _ERF32_BLOCK):
        stop = min(size, start + _ERF32_BLOCK)
        n = stop - start
        xc = np.clip(src[start:stop], -4.0, 4.0, out=v[:n])
        x2 = np.multiply(xc, xc, out=v2[:n])
        num = np.multiply(x2, _ERF32_P[-1], out=p[:n])  # Horner's rule, in place
        for c in _ERF32_P[-2:0:-1]:
            num += c
            num *= x2
        num += _ERF32_P[0]
        num *= xc
        den = np.multiply(x2, _ERF32_Q[-1], out=dst[start:stop])
        for c in _ERF32_Q[-2:0:-1]:
            den += c
            den *= x2
        den += _ERF32_Q[0]
        np.divide(num, den, out=den)
    # The rational function overshoots 1 by up to 4 ulp near |x| = 4.
    return np.clip(out, -1.0, 1.0, out=out)


@override("numpy", "Erf", since=9,
          reason="speed and accuracy: float32 as one rational function in cache-sized blocks (5x faster than "
                 "scipy, within 7 ulp); other types through scipy.special.erf (ulp-level), not the shared "
                 "polynomial's dozen passes")
def erf(x, *, xp):
    if x.dtype.kind in "iu":
        return special.erf(x.astype(np.float64)).astype(x.dtype)
    if x.dtype == np.float32:
        return _erf_float32(x)
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
          reason="speed: 2-D depthwise (group == channels) as multiply-adds of shifted contiguous views over "
                 "stride phases, 2-D dense (group == 1) as im2col + matmul over cache-sized blocks of output rows "
                 "(mithril/backends/numpy/conv.py); the shared im2col + matmul elsewhere")
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp):
    from ..kernels.geometry import window
    from ..kernels.nn import conv as shared_conv
    from .conv import dense_2d, depthwise_2d, is_dense_2d, is_depthwise_2d

    depthwise = is_depthwise_2d(x, w, b, group)
    if depthwise or is_dense_2d(x, w, b, group):
        win = window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
        if all(o > 0 for o in win.out):
            return (depthwise_2d if depthwise else dense_2d)(x, w, b, win)
    return shared_conv(x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                       pads=pads, strides=strides, xp=xp)


@override("numpy", "MaxPool", since=1,
          reason="speed: without the Indices output, separable (one spatial axis at a time, (kh-1)+(kw-1) passes "
                 "instead of kh*kw-1; mithril/backends/numpy/pool.py); the shared kernel with Indices")
def max_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0,
             num_outputs=1, xp):
    from ..kernels.geometry import window
    from ..kernels.nn import max_pool as shared_max_pool
    from .pool import max_pool_separable

    if num_outputs < 2:
        win = window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
        return max_pool_separable(x, win)
    return shared_max_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                           ceil_mode=ceil_mode, dilations=dilations, storage_order=storage_order,
                           num_outputs=num_outputs, xp=xp)


@override("numpy", "Pow", since=7,
          reason="speed: a float base to a scalar power 2, 3 or 4 (Gelu's x**3) as multiplications; NumPy's "
                 "float32 power is a scalar powf loop, ~100 ns an element; the shared kernel elsewhere")
def pow_(x, y, *, xp):
    from ..kernels.elementwise import pow_ as shared_pow

    if (x.dtype in (np.float32, np.float64) and y.size == 1 and y.ndim <= x.ndim and y.dtype.kind in "fiu"
            and float(y.reshape(())) in (2.0, 3.0, 4.0)):
        n = int(float(y.reshape(())))
        out = np.square(x)  # a fresh array, then in place: at most two roundings more than a correctly rounded pow
        if n == 3:
            np.multiply(out, x, out=out)
        elif n == 4:
            np.square(out, out=out)
        return out
    return shared_pow(x, y, xp=xp)
