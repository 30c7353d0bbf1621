"""PyTorch kernels: hot ops calling torch.nn.functional directly, and semantic gaps of the facade."""

from __future__ import annotations
