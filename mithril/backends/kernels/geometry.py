"""Window geometry of convolutions and pools, in plain Python over ints, once for every backend.

Conv, ConvTranspose, the pools, Col2Im and MaxUnpool all slide a window over the spatial axes;
the shared kernels and the JAX, Torch and MLX overrides take their padding and output sizes from
here, so that ``auto_pad``, ``ceil_mode``, ``output_padding`` and ``output_shape`` mean the same
thing on every backend (the ONNX operator specs' formulas, onnxruntime's reading where they
leave room).

>>> w = window((5, 5), (3, 3), strides=(2, 2), auto_pad="SAME_UPPER")
>>> w.out, w.begin, w.end
((3, 3), (1, 1), (1, 1))
>>> t = transposed_window((3,), (3,), strides=(2,), output_padding=(1,))
>>> t.full, t.begin, t.out
((8,), (0,), (8,))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    """A window sliding over the padded spatial axes: ``out[i]`` positions ``strides[i]`` apart,
    each reading ``kernel[i]`` taps ``dilations[i]`` apart, after ``begin[i]`` pixels of padding
    (and up to ``end[i]`` after the input)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]  # padding before each spatial axis
    end: tuple[int, ...]  # padding after each spatial axis, as declared
    out: tuple[int, ...]  # output size of each spatial axis

    @property
    def extent(self) -> tuple[int, ...]:
        """How far into the padded axis the last window reaches."""
        spans = ((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))
        return tuple((n - 1) * s + span for n, s, span in zip(self.out, self.strides, spans))

    def read_pads(self, size) -> tuple[tuple[int, int], ...]:
        """(begin, end) padding per spatial axis that the windows actually read from an input of
        spatial ``size``: ceil_mode windows may overhang the declared end padding, and end
        padding no window reaches is dropped."""
        return tuple((b, max(ext - b - n, 0)) for b, ext, n in zip(self.begin, self.extent, size))


def window(size, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET", ceil_mode=0) -> Window:
    """The window of a Conv or pool over an input of spatial ``size``, with the ONNX attributes
    (None for an unset one: strides and dilations 1, pads 0)."""
    # Every call of a node computes the same geometry: cached (arguments as tuples to hash).
    return _window(tuple(size), tuple(kernel), strides and tuple(strides), dilations and tuple(dilations),
                   pads and tuple(pads), auto_pad, ceil_mode)


@functools.lru_cache(maxsize=4096)
def _window(size, kernel, strides, dilations, pads, auto_pad, ceil_mode) -> Window:
    nd = len(kernel)
    strides = tuple(strides or (1,) * nd)
    dilations = tuple(dilations or (1,) * nd)
    pads = tuple(pads or (0,) * (2 * nd))
    begin, end, out = [], [], []
    for i in range(nd):
        n, k, s, d = size[i], kernel[i], strides[i], dilations[i]
        span = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-n // s)
            total = max((o - 1) * s + span - n, 0)
            # The odd pixel goes at the end for SAME_UPPER, at the beginning for SAME_LOWER.
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + nd])
            room = n + b + e - span
            if ceil_mode:
                o = -(-room // s) + 1
                # A window may overhang the end but must start inside the input or the begin padding.
                if (o - 1) * s >= n + b:
                    o -= 1
            else:
                o = room // s + 1
        begin.append(b)
        end.append(e)
        out.append(o)
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(out))


def grid_window(kernel, strides, dilations, out) -> Window:
    """A window without padding whose ``out`` positions are given: the blocks of Col2Im and
    the input pixels a transposed convolution spreads over its canvas."""
    nd = len(kernel)
    return Window(tuple(kernel), tuple(strides), tuple(dilations), (0,) * nd, (0,) * nd, tuple(out))


@dataclass(frozen=True)
class TransposedWindow:
    """ConvTranspose's geometry: the input spread over a canvas ``full`` long on each axis (what
    the kernel touches, plus ``output_padding``), of which the output is the ``out`` pixels
    starting at ``begin`` (negative where the output starts before the canvas: zeros there)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    full: tuple[int, ...]
    begin: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def shift(self) -> int:
        """How far to grow a canvas at the start so that every ``begin`` lies inside it."""
        return max(0, -min(self.begin, default=0))

    @property
    def canvas(self) -> tuple[int, ...]:
        """A canvas that holds the full result and the output, ``shift`` pixels in."""
        return tuple(self.shift + max(f, b + o) for f, b, o in zip(self.full, self.begin, self.out))


def transposed_window(size, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET",
                      output_padding=None, output_shape=None) -> TransposedWindow:
    """ConvTranspose's geometry over an input of spatial ``size`` (the spec's formulas):
    ``output_shape`` or SAME_* fix the output size and crop the difference from the full result
    (the odd pixel from the end for SAME_UPPER, from the start otherwise), else ``pads`` crop it."""
    nd = len(size)
    strides = tuple(strides or (1,) * nd)
    dilations = tuple(dilations or (1,) * nd)
    output_padding = tuple(output_padding or (0,) * nd)
    full = tuple(s * (i - 1) + (k - 1) * d + 1 + p
                 for s, i, k, d, p in zip(strides, size, kernel, dilations, output_padding))
    if output_shape or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(output_shape[-nd:]) if output_shape else tuple(i * s for i, s in zip(size, strides))
        # A negative total (output larger than what the kernel touches) pads with zeros, as the
        # spec's formula says; onnxruntime clamps it to 0 for SAME and appends at the end.
        total = [f - o for f, o in zip(full, out)]
        begin = tuple(t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total)
    else:
        pads = tuple(pads or (0,) * (2 * nd)) if auto_pad != "VALID" else (0,) * (2 * nd)
        begin = tuple(pads[:nd])
        out = tuple(f - pads[i] - pads[i + nd] for i, f in enumerate(full))
    return TransposedWindow(tuple(kernel), strides, dilations, full, begin, tuple(int(o) for o in out))
