"""C rules for the quantization ops (kernels: ``lib/mt_quantize.h``)."""

from __future__ import annotations
