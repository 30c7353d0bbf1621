"""C kernels of the ops that exist for training: ``ai.mithril::StopGradient`` (the identity on
values; its backward, in :mod:`mithril.backends.c.grad`, is zero)."""

from __future__ import annotations

from . import c_kernel, same_types


@c_kernel("StopGradient", domain="ai.mithril", check=same_types, alias=True)
def stop_gradient(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    if c.buf(x) != c.buf(y):
        c.line(f"mt_copy_bytes({c.buf(x)}, {c.buf(y)}, {c.numel(y) * y.dtype.itemsize});")
