"""C rules for ops that work along one axis of their input (kernels: ``lib/mt_rowwise.h``)."""

from __future__ import annotations
