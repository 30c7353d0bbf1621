"""C rules for the attention ops (kernels: ``lib/mt_attention.h``)."""

from __future__ import annotations
