"""Gradients of shape and indexing ops: each puts the gradient back where the forward took it."""

from __future__ import annotations

import numpy

from ..kernels.shape import normalize_axis, even_sizes, static_ints, slice_array, split_array
from .rules import vjp_rule
from .elementwise import unbroadcast


def _reshaped(g, x):
    return (numpy.reshape(g, x.shape),)


# Reshape, Flatten, Squeeze, Unsqueeze, Identity and StopGradient's identity kernel move no
# element: the gradient takes the input's shape (StopGradient's rule stops it instead).
@vjp_rule("Reshape", since=5)
def reshape_vjp(g, data, shape, **_):
    return numpy.reshape(g, data.shape), None


@vjp_rule("Reshape", since=1)
def reshape_attr_vjp(g, data, **_):
    return _reshaped(g, data)


@vjp_rule("Flatten", since=1)
def flatten_vjp(g, x, *, axis):
    return _reshaped(g, x)


@vjp_rule("Squeeze", since=1)
@vjp_rule("Unsqueeze", since=1)
def squeeze_attr_vjp(g, data, *, axes):
    return _reshaped(g, data)


@vjp_rule("Squeeze", since=13)
@vjp_rule("Unsqueeze", since=13)
def squeeze_vjp(g, data, axes=None):
    return numpy.reshape(g, data.shape), None


@vjp_rule("Identity", since=1)
def identity_vjp(g, x):
    return (g,)


@vjp_rule("StopGradient", since=1, domain="ai.mithril")
def stop_gradient_vjp(g, x):
    return (numpy.zeros_like(x),)


@vjp_rule("Transpose", since=1)
def transpose_vjp(g, data, *, perm):
    perm = tuple(perm) if perm else tuple(range(data.ndim - 1, -1, -1))
    return (numpy.transpose(g, numpy.argsort(perm)),)


@vjp_rule("Expand", since=8)
def expand_vjp(g, x, shape):
    return unbroadcast(g, x.shape), None


@vjp_rule("Tile", since=6)
def tile_vjp(g, x, repeats):
    reps = static_ints(repeats)
    split = tuple(d for r, n in zip(reps, x.shape) for d in (r, n))
    return numpy.sum(g.reshape(split), axis=tuple(range(0, 2 * x.ndim, 2))), None


@vjp_rule("Concat", since=1)
def concat_vjp(g, *inputs, axis):
    axis = normalize_axis(axis, g.ndim)
    return split_array(g, [x.shape[axis] for x in inputs], axis)


def _unsplit(g, x, sizes, axis):
    # numpy-only: each part's gradient is written into its slice of one zero array.
    gx = numpy.zeros(x.shape, dtype=x.dtype)
    for part, gp in zip(split_array(gx, sizes, axis), g):
        if gp is not None:
            part[...] = gp
    return gx


@vjp_rule("Split", since=2)
def split_attr_vjp(g, x, *, axis, split, num_outputs):
    dim = x.shape[normalize_axis(axis, x.ndim)]
    return (_unsplit(g, x, split if split else even_sizes(dim, num_outputs), axis),)


@vjp_rule("Split", since=13)
def split_vjp(g, x, split=None, *, axis, num_outputs):
    dim = x.shape[normalize_axis(axis, x.ndim)]
    sizes = static_ints(split) if split is not None else even_sizes(dim, num_outputs)
    return _unsplit(g, x, sizes, axis), None


@vjp_rule("Slice", since=1)
def slice_attr_vjp(g, data, *, starts, ends, axes):
    # numpy-only: the forward's basic-slicing view of a zero array takes the gradient.
    gx = numpy.zeros(data.shape, dtype=g.dtype)
    slice_array(gx, starts, ends, axes, None)[...] = g
    return (gx,)


@vjp_rule("Slice", since=10)
def slice_vjp(g, data, starts, ends, axes=None, steps=None):
    gx = numpy.zeros(data.shape, dtype=g.dtype)
    slice_array(gx, static_ints(starts), static_ints(ends), None if axes is None else static_ints(axes),
                None if steps is None else static_ints(steps))[...] = g
    return gx, None, None, None, None


@vjp_rule("Gather", since=1)
def gather_vjp(g, data, indices, *, axis):
    # numpy-only: repeated indices add up (np.add.at).
    axis = normalize_axis(axis, data.ndim)
    idx = numpy.asarray(indices).reshape(-1)
    idx = numpy.where(idx < 0, idx + data.shape[axis], idx)
    gm = numpy.moveaxis(g.reshape(data.shape[:axis] + (idx.size,) + data.shape[axis + 1:]), axis, 0)
    gx = numpy.zeros(data.shape, dtype=g.dtype)
    numpy.add.at(numpy.moveaxis(gx, axis, 0), idx, gm)
    return gx, None


@vjp_rule("GatherElements", since=11)
def gather_elements_vjp(g, data, indices, *, axis):
    axis = normalize_axis(axis, data.ndim)
    idx = numpy.where(indices < 0, indices + data.shape[axis], indices)
    where = list(numpy.indices(indices.shape, sparse=True))
    where[axis] = idx
    gx = numpy.zeros(data.shape, dtype=g.dtype)
    numpy.add.at(gx, tuple(where), g)
    return gx, None


@vjp_rule("Pad", since=11)
def pad_vjp(g, data, pads, constant_value=None, axes=None, *, mode, needs):
    if mode != "constant":
        raise NotImplementedError(f"the gradient of Pad mode={mode!r} is not implemented (only 'constant')")
    rank = data.ndim
    pads = static_ints(pads)
    axes = range(rank) if axes is None else [normalize_axis(a, rank) for a in static_ints(axes)]
    index = [slice(None)] * rank
    gx = numpy.zeros(data.shape, dtype=g.dtype)
    src = [slice(None)] * rank
    for i, axis in enumerate(axes):
        begin, end = pads[i], pads[i + len(axes)]
        # Negative pads cropped the input: those input elements get no gradient.
        index[axis] = slice(max(-begin, 0), data.shape[axis] - max(-end, 0))
        src[axis] = slice(max(begin, 0), g.shape[axis] - max(end, 0))
    gx[tuple(index)] = g[tuple(src)]
    gc = None
    if constant_value is not None and needs[2]:
        # The pad value fills every output element that no input element lands on.
        gc = numpy.asarray(numpy.sum(g) - numpy.sum(g[tuple(src)]), dtype=constant_value.dtype).reshape(
            constant_value.shape)
    return gx, None, gc, None
