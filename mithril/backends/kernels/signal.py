"""Signal kernels: DFT, STFT, window functions, MelWeightMatrix.

ONNX carries complex values as a trailing dimension of 2 (real, imaginary); a real signal has a
trailing dimension of 1. Transforms run through ``xp.fft`` on native complex arrays.
"""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import np_dtype_of_onnx
from ..registry import kernel


def _to_complex(x, xp):
    """[..., 1|2] ONNX layout -> (array without the trailing dim, whether it is complex)."""
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)  # float16/bfloat16: no native FFT
    if x.shape[-1] == 1:
        return x[..., 0], False
    return x[..., 0] + 1j * x[..., 1], True


def _from_complex(y, dtype, xp):
    return xp.stack([xp.real(y), xp.imag(y)], axis=-1).astype(dtype)


def _dft(x, dft_length, axis, inverse, onesided, xp):
    rank = x.ndim
    axis = int(axis)
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ValueError(f"DFT axis {axis} out of range for input rank {rank}")
    axis = axis + rank if axis < 0 else axis
    n = None if dft_length is None else int(dft_length)
    signal, is_complex = _to_complex(x, xp)
    if inverse and onesided:
        # IRFFT: one-sided complex spectrum in, real signal out; default length 2 * (m - 1).
        if n is None:
            n = 2 * (signal.shape[axis] - 1)
        return xp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        y = xp.fft.ifft(signal, n=n, axis=axis)
    elif onesided and not is_complex:
        y = xp.fft.rfft(signal, n=n, axis=axis)
    else:
        y = xp.fft.fft(signal, n=n, axis=axis)
        if onesided:
            y = xp.take(y, xp.arange(y.shape[axis] // 2 + 1), axis=axis)
    return _from_complex(y, x.dtype, xp)


@kernel("DFT", since=17, static_inputs=(1,))
def dft_17(input, dft_length=None, *, axis, inverse, onesided, xp):
    return _dft(input, dft_length, axis, inverse, onesided, xp)


@kernel("DFT", since=20, static_inputs=(1, 2))
def dft_20(input, dft_length=None, axis=None, *, inverse, onesided, xp):
    return _dft(input, dft_length, -2 if axis is None else axis, inverse, onesided, xp)


@kernel("STFT", since=17, static_inputs=(1, 3))
def stft(signal, frame_step, window=None, frame_length=None, *, onesided, xp):
    x, is_complex = _to_complex(signal, xp)  # [batch, length]
    length = x.shape[1]
    if frame_length is not None:
        size = int(frame_length)
    elif window is not None:
        size = window.shape[0]
    else:
        size = length
    step = int(frame_step)
    frames = (length - size) // step + 1
    index = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    framed = xp.take(x, xp.asarray(index.reshape(-1)), axis=1).reshape(x.shape[0], frames, size)
    if window is not None:
        w, window_complex = _to_complex(window[:, None], xp)
        is_complex = is_complex or window_complex
        framed = framed * w
    if onesided and not is_complex:
        y = xp.fft.rfft(framed, axis=-1)
    else:
        y = xp.fft.fft(framed, axis=-1)
        if onesided:  # complex input: the spec leaves it open; keep the first half like ORT
            y = y[..., : size // 2 + 1]
    return _from_complex(y, signal.dtype, xp)


def _cosine_window(size, periodic, output_datatype, coefficients, xp):
    """sum_k (-1)^k a_k cos(2 pi k n / N), N = size (periodic) or size - 1 (symmetric)."""
    size = int(size)
    if size == 1 and not periodic:
        # N - 1 = 0: a symmetric window of one point is [1] (numpy, scipy and torch agree).
        return xp.ones(1, dtype=np_dtype_of_onnx(output_datatype))
    denom = size if periodic else size - 1
    n = xp.arange(size, dtype=np.float64)
    w = xp.zeros(size, dtype=np.float64)
    for k, a in enumerate(coefficients):
        w = w + (-1) ** k * a * xp.cos(2 * math.pi * k * n / denom)
    return w.astype(np_dtype_of_onnx(output_datatype))


@kernel("HannWindow", since=17, static_inputs=(0,))
def hann_window(size, *, output_datatype, periodic, xp):
    return _cosine_window(size, periodic, output_datatype, (0.5, 0.5), xp)


@kernel("HammingWindow", since=17, static_inputs=(0,))
def hamming_window(size, *, output_datatype, periodic, xp):
    return _cosine_window(size, periodic, output_datatype, (25 / 46, 21 / 46), xp)


@kernel("BlackmanWindow", since=17, static_inputs=(0,))
def blackman_window(size, *, output_datatype, periodic, xp):
    return _cosine_window(size, periodic, output_datatype, (0.42, 0.5, 0.08), xp)


@kernel("MelWeightMatrix", since=17, static_inputs=(0, 1))
def mel_weight_matrix(
    num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, output_datatype, xp
):
    num_mel_bins, dft_length = int(num_mel_bins), int(dft_length)
    num_bins = dft_length // 2 + 1
    low_mel = 2595.0 * xp.log10(1.0 + lower_edge_hertz / 700.0)
    high_mel = 2595.0 * xp.log10(1.0 + upper_edge_hertz / 700.0)
    # The ONNX definition spaces num_mel_bins + 2 edges by (high - low) / (num_mel_bins + 2), so
    # the last edge stops one step short of upper_edge_hertz; ORT and the reference agree.
    mel_step = (high_mel - low_mel) / (num_mel_bins + 2)
    mels = low_mel + xp.arange(num_mel_bins + 2) * mel_step
    hertz = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    # Triangle edges as spectrogram bin indices.
    edges = xp.floor((dft_length + 1) * hertz / sample_rate).astype(np.int64)
    lower, center, upper = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    j = xp.arange(num_bins)[:, None]
    rise = (j - lower) / xp.maximum(center - lower, 1)
    rise = xp.where(center == lower, 1.0, rise)  # degenerate rising edge: peak only
    fall = (upper - j) / xp.maximum(upper - center, 1)
    weights = xp.where(
        (j >= lower) & (j <= center), rise, xp.where((j > center) & (j < upper), fall, 0.0)
    )
    return weights.astype(np_dtype_of_onnx(output_datatype))
