"""Shape, indexing and tensor-construction kernels: Reshape, Slice, Gather, Pad, Scatter...

Inputs that fix an output shape (Reshape's shape, Slice's starts/ends, Pad's pads...) are
declared ``static_inputs`` and read on the host with ``static_ints``; everything else stays in ``xp``.
Negative ONNX indices are left to take, take_along_axis and integer-array indexing, which wrap
them in numpy and jax.numpy without an extra pass over the indices.
"""

from __future__ import annotations

import math

import numpy

from ...dtypes import np_dtype_of_onnx
from ..registry import kernel


def static_ints(values) -> tuple[int, ...]:
    """A static shape-like input (1-D or scalar tensor) as Python ints."""
    return tuple(int(v) for v in numpy.asarray(values).reshape(-1).tolist())


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` made non-negative for a tensor of rank ``rank``."""
    return axis + rank if axis < 0 else axis


# ---------------------------------------------------------------- reshaping


@kernel("Reshape", since=5, static_inputs=(1,))
def reshape(data, shape, *, allowzero=0, xp):
    dims = list(static_ints(shape))
    if not allowzero:
        # 0 copies the input's dim (allowzero=1, opset 14+, makes it a real zero).
        dims = [data.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return xp.reshape(data, tuple(dims))


@kernel("Flatten", since=1)
def flatten(input, *, axis, xp):
    axis = normalize_axis(axis, input.ndim)
    shape = input.shape
    return xp.reshape(input, (math.prod(shape[:axis]), math.prod(shape[axis:])))


@kernel("Transpose", since=1)
def transpose(data, *, perm, xp):
    return xp.transpose(data, tuple(perm) if perm is not None else None)


def _squeeze(data, axes, xp):
    if axes is None:
        axes = tuple(i for i, d in enumerate(data.shape) if d == 1)
    axes = {normalize_axis(a, data.ndim) for a in axes}
    return xp.reshape(data, tuple(d for i, d in enumerate(data.shape) if i not in axes))


@kernel("Squeeze", since=1)
def squeeze_attr(data, *, axes, xp):
    return _squeeze(data, axes, xp)


@kernel("Squeeze", since=13, static_inputs=(1,))
def squeeze(data, axes=None, *, xp):
    # An empty axes tensor means no axes given, as onnxruntime reads it: every dim of 1 goes.
    axes = None if axes is None else static_ints(axes)
    return _squeeze(data, axes or None, xp)


def _unsqueeze(data, axes, xp):
    rank = data.ndim + len(axes)
    axes = {normalize_axis(a, rank) for a in axes}
    dims = iter(data.shape)
    return xp.reshape(data, tuple(1 if i in axes else next(dims) for i in range(rank)))


@kernel("Unsqueeze", since=1)
def unsqueeze_attr(data, *, axes, xp):
    return _unsqueeze(data, axes, xp)


@kernel("Unsqueeze", since=13, static_inputs=(1,))
def unsqueeze(data, axes, *, xp):
    return _unsqueeze(data, static_ints(axes), xp)


@kernel("Identity", since=1)
def identity(input):
    # Sequences (lists) get a fresh list so sequence ops on one name never alias the other.
    return list(input) if isinstance(input, list) else input


# ---------------------------------------------------------------- joining and splitting


@kernel("Concat", since=1)
def concat(*inputs, axis, xp):
    return xp.concatenate(inputs, axis=axis)


def split_array(input, sizes, axis, num_outputs=None):
    """``input`` cut along ``axis`` into parts of ``sizes``, which must sum to its length."""
    axis = normalize_axis(axis, input.ndim)
    dim = input.shape[axis]
    # As onnxruntime: one non-negative size per output, summing to the split axis.
    if (num_outputs is not None and len(sizes) != num_outputs) or sum(sizes) != dim or min(sizes, default=0) < 0:
        parts = f" into {num_outputs} outputs" if num_outputs is not None else ""
        raise ValueError(f"split sizes {list(sizes)} do not cut axis {axis} (length {dim}){parts}")
    head = (slice(None),) * axis
    bounds = numpy.cumsum((0, *sizes))
    return tuple(input[(*head, slice(int(a), int(b)))] for a, b in zip(bounds[:-1], bounds[1:]))


def even_sizes(dim: int, parts: int) -> tuple[int, ...]:
    """The sizes Split gives ``parts`` outputs without a ``split`` input; opset 18: the last chunk is
    smaller when ``dim`` does not divide evenly."""
    chunk = -(-dim // parts)
    return (chunk,) * (parts - 1) + (max(dim - chunk * (parts - 1), 0),)


@kernel("Split", since=2)
def split_attr(input, *, axis, split, num_outputs):
    dim = input.shape[normalize_axis(axis, input.ndim)]
    return split_array(input, split if split else even_sizes(dim, num_outputs), axis, num_outputs)


# Also Split-18: its num_outputs attribute equals the node's output count, and uneven
# chunks are already what even_sizes gives.
@kernel("Split", since=13, static_inputs=(1,))
def split(input, split=None, *, axis, num_outputs, node=None):
    # Split-18's num_outputs attribute, None when the node leaves it out, stands where the
    # lowering would pass the node's output count; the node's declared outputs give it back.
    if num_outputs is None and node is not None and node.output_dtypes:
        num_outputs = len(node.output_dtypes)
    dim = input.shape[normalize_axis(axis, input.ndim)]
    sizes = static_ints(split) if split is not None else even_sizes(dim, num_outputs)
    return split_array(input, sizes, axis, num_outputs)


# ---------------------------------------------------------------- slicing


def slice_array(data, starts, ends, axes, steps):
    """The view of ``data`` that Slice takes (starts/ends clamped as ONNX says); assignable."""
    rank = data.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = (1,) * len(starts) if steps is None else steps
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = normalize_axis(axis, rank)
        dim = data.shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            # Negative steps clamp to [0, dim-1] for starts and [-1, dim-1] for ends; -1 means
            # "past element 0", which Python slices spell as None.
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            end = None if end < 0 else end
        index[axis] = slice(start, end, step)
    return data[tuple(index)]


@kernel("Slice", since=1)
def slice_attr(data, *, starts, ends, axes):
    return slice_array(data, starts, ends, axes, None)


@kernel("Slice", since=10, static_inputs=(1, 2, 3, 4))
def slice_(data, starts, ends, axes=None, steps=None):
    return slice_array(
        data,
        static_ints(starts),
        static_ints(ends),
        None if axes is None else static_ints(axes),
        None if steps is None else static_ints(steps),
    )


# ---------------------------------------------------------------- broadcasting and padding


@kernel("Expand", since=8, static_inputs=(1,))
def expand(input, shape, *, xp):
    # Bidirectional: a 1 in `shape` keeps the input's dim.
    return xp.broadcast_to(input, numpy.broadcast_shapes(input.shape, static_ints(shape)))


@kernel("Tile", since=6, static_inputs=(1,))
def tile(input, repeats, *, xp):
    return xp.tile(input, static_ints(repeats))


def _pad(data, pads, mode, value, axes, xp):
    rank = data.ndim
    axes = range(rank) if axes is None else [normalize_axis(a, rank) for a in axes]
    widths = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(axes):
        widths[axis] = [pads[i], pads[i + len(axes)]]
    if mode == "constant" and value is None:
        value = "" if data.dtype == object else 0
    # Negative pads crop; numpy/jax pad only grows. A constant pad grows first and then crops,
    # so a crop may reach into the padding (pads [5, -3] on 2 elements keep 4 of the 5 pad
    # values, as onnxruntime does); the other modes read the data they pad, so crop first.
    if any(w < 0 for pair in widths for w in pair):
        grown = [[max(b, 0), max(a, 0)] for b, a in widths]
        if mode == "constant":
            if any(w for pair in grown for w in pair):
                data = xp.pad(data, grown, mode="constant", constant_values=value)
            return data[_crop_slices(widths, data.shape)]
        data = data[_crop_slices(widths, data.shape)]
        widths = grown
    if not any(w for pair in widths for w in pair):
        return data
    if mode == "constant":
        return xp.pad(data, widths, mode="constant", constant_values=value)
    return xp.pad(data, widths, mode=mode)


def _crop_slices(widths, shape) -> tuple:
    """Slices removing -b before and -a after each axis (b, a < 0), never wrapping around."""
    slices = []
    for (b, a), d in zip(widths, shape):
        start = min(max(-b, 0), d)
        slices.append(slice(start, max(d - max(-a, 0), start)))
    return tuple(slices)


@kernel("Pad", since=2)
def pad_attr(data, *, mode, pads, value, xp):
    return _pad(data, pads, mode, value, None, xp)


@kernel("Pad", since=11, static_inputs=(1, 3))
def pad(data, pads, constant_value=None, axes=None, *, mode, xp):
    value = None if constant_value is None else xp.reshape(constant_value, (-1,))[0]
    return _pad(data, static_ints(pads), mode, value, None if axes is None else static_ints(axes), xp)


@kernel("CenterCropPad", since=18, static_inputs=(1,))
def center_crop_pad(input_data, shape, *, axes, xp):
    rank = input_data.ndim
    axes = range(rank) if axes is None else [normalize_axis(a, rank) for a in axes]
    crop = [slice(None)] * rank
    widths = [(0, 0)] * rank
    for axis, size in zip(axes, static_ints(shape)):
        dim = input_data.shape[axis]
        if dim > size:
            # The window starts rounded down: an odd excess shifts it half a pixel left.
            start = (dim - size) // 2
            crop[axis] = slice(start, start + size)
        elif dim < size:
            # An odd total pad puts the extra pixel on the right.
            before = (size - dim) // 2
            widths[axis] = (before, size - dim - before)
    return xp.pad(input_data[tuple(crop)], widths, mode="constant")


# ---------------------------------------------------------------- tensor construction


def _densify_sparse(sparse):
    from onnx import numpy_helper

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dense = numpy.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        # Linearized indices into the flattened tensor.
        dense.reshape(-1)[indices] = values  # numpy-only: a constant, built once on the host
    else:
        dense[tuple(indices.T)] = values  # numpy-only: a constant, built once on the host
    return dense


@kernel("Constant", since=1)
def constant(
    *,
    value=None,
    sparse_value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
):
    if value is not None:
        return value
    if sparse_value is not None:
        return sparse_value if isinstance(sparse_value, numpy.ndarray) else _densify_sparse(sparse_value)
    if value_float is not None:
        return numpy.array(value_float, dtype=numpy.float32)
    if value_floats is not None:
        return numpy.array(value_floats, dtype=numpy.float32)
    if value_int is not None:
        return numpy.array(value_int, dtype=numpy.int64)
    if value_ints is not None:
        return numpy.array(value_ints, dtype=numpy.int64)
    if value_string is not None:
        return numpy.array(value_string, dtype=object)
    if value_strings is not None:
        return numpy.array(value_strings, dtype=object)
    raise ValueError("Constant sets none of its value attributes")


@kernel("ConstantOfShape", since=9, static_inputs=(0,))
def constant_of_shape(input, *, value, xp):
    fill = numpy.zeros((1,), dtype=numpy.float32) if value is None else value
    return xp.full(static_ints(input), xp.reshape(fill, (-1,))[0], dtype=fill.dtype)


@kernel("Shape", since=1)
def shape(data, *, start=0, end=None):
    # Host numpy, not xp: shapes stay concrete so they can feed static inputs under jit.
    return numpy.array(data.shape[start:end], dtype=numpy.int64)


@kernel("Size", since=1)
def size(data):
    return numpy.array(math.prod(data.shape), dtype=numpy.int64)


@kernel("Range", since=11, static_inputs=(0, 1, 2))
def range_(start, limit, delta, *, stash_type=0, xp):
    dtype = start.dtype
    start, limit, delta = (numpy.asarray(v).reshape(()) for v in (start, limit, delta))
    if stash_type == 1 and dtype.itemsize == 2 and dtype.kind not in "iub":
        # Opset 27: float16/bfloat16 ranges are computed in float32, then cast back.
        start, limit, delta = (v.astype(numpy.float32) for v in (start, limit, delta))
    if dtype.kind in "iu":
        count = -((int(start) - int(limit)) // int(delta))
    else:
        count = int(numpy.ceil((limit - start) / delta))
    count = max(count, 0)
    steps = xp.arange(count, dtype=start.dtype)
    return xp.astype(steps * delta + start, dtype)


@kernel("EyeLike", since=9)
def eye_like(input, *, dtype, k, xp):
    out_dtype = input.dtype if dtype is None else np_dtype_of_onnx(dtype)
    return xp.eye(input.shape[0], input.shape[1], k=k, dtype=out_dtype)


# OneHot-9's text leaves negative indices off, but onnxruntime and the reference wrap them at
# every version (as OneHot-11 specifies), so one kernel serves all.
@kernel("OneHot", since=9, static_inputs=(1,))
def one_hot(indices, depth, values, *, axis, xp):
    depth = int(numpy.asarray(depth).reshape(-1)[0])
    rank = indices.ndim + 1
    axis = normalize_axis(axis, rank)
    indices = xp.where(indices < 0, indices + depth, indices)
    # Compared in the indices' own dtype: a fractional float index matches no class.
    classes = xp.reshape(xp.arange(depth), (depth,) + (1,) * (rank - 1 - axis))
    hot = xp.expand_dims(indices, axis) == classes
    return xp.where(hot, values[1], values[0])


@kernel("Trilu", since=14)
def trilu(input, k=None, *, upper, xp):
    k = 0 if k is None else xp.reshape(k, ())
    rows, cols = input.shape[-2:]
    offset = xp.arange(cols)[None, :] - xp.arange(rows)[:, None]
    keep = offset >= k if upper else offset <= k
    return xp.where(keep, input, xp.zeros((), dtype=input.dtype))


# ---------------------------------------------------------------- gathering


@kernel("Gather", since=1)
def gather(data, indices, *, axis, xp):
    axis = normalize_axis(axis, data.ndim)
    return xp.take(data, indices, axis=axis)


@kernel("GatherElements", since=11)
def gather_elements(data, indices, *, axis, xp):
    axis = normalize_axis(axis, data.ndim)
    # Output takes the indices' shape; take_along_axis would broadcast smaller non-axis dims.
    window = tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(indices.shape))
    return xp.take_along_axis(data[window], indices, axis=axis)


@kernel("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0, xp):
    b = batch_dims
    depth = indices.shape[-1]
    batch = math.prod(data.shape[:b])
    tuples = indices.shape[b:-1]
    flat_data = xp.reshape(data, (batch,) + data.shape[b:])
    flat_idx = xp.reshape(indices, (batch, math.prod(tuples), depth))
    picks = tuple(flat_idx[..., j] for j in range(depth))
    out = flat_data[(xp.arange(batch)[:, None], *picks)]
    return xp.reshape(out, data.shape[:b] + tuples + data.shape[b + depth :])


@kernel("Compress", since=9, data_dependent_shape=True)
def compress(input, condition, *, axis, xp):
    chosen = xp.nonzero(condition)[0]
    if axis is None:
        return xp.take(xp.reshape(input, (-1,)), chosen)
    return xp.take(input, chosen, axis=normalize_axis(axis, input.ndim))


@kernel("NonZero", since=9, data_dependent_shape=True)
def non_zero(X, *, xp):
    if X.ndim == 0:
        # numpy refuses 0-d nonzero; a scalar has no coordinates, only a count.
        return xp.zeros((0, int(bool(X))), dtype=numpy.int64)
    return xp.astype(xp.stack(xp.nonzero(X)), numpy.int64)


@kernel("Unique", since=11, data_dependent_shape=True, host_only=True)
def unique(X, *, axis, sorted):
    # numpy-only: jax.numpy.unique needs a static size; the output shape depends on values.
    flat = X.reshape(-1) if axis is None else X
    y, first, inverse, counts = numpy.unique(
        flat, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    inverse = inverse.reshape(-1)
    if not sorted:
        # Reorder by first occurrence, remapping inverse through the permutation.
        order = numpy.argsort(first, kind="stable")
        rank = numpy.empty_like(order)
        rank[order] = numpy.arange(order.size)
        y = numpy.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    i64 = numpy.int64
    return y, first.astype(i64), inverse.astype(i64), counts.astype(i64)


@kernel("ReverseSequence", since=10)
def reverse_sequence(input, sequence_lens, *, batch_axis, time_axis, xp):
    x = xp.moveaxis(input, (time_axis, batch_axis), (0, 1))
    t = xp.arange(x.shape[0])[:, None]
    lens = xp.astype(sequence_lens, t.dtype)[None, :]
    source = xp.where(t < lens, lens - 1 - t, t)
    source = xp.reshape(source, source.shape + (1,) * (x.ndim - 2))
    return xp.moveaxis(xp.take_along_axis(x, source, axis=0), (0, 1), (time_axis, batch_axis))


# ---------------------------------------------------------------- depth <-> space


@kernel("DepthToSpace", since=1)
def depth_to_space(input, *, blocksize, mode="DCR", xp):
    b, c, h, w = input.shape
    s = blocksize
    if mode == "DCR":
        tmp = xp.transpose(xp.reshape(input, (b, s, s, c // (s * s), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        tmp = xp.transpose(xp.reshape(input, (b, c // (s * s), s, s, h, w)), (0, 1, 4, 2, 5, 3))
    return xp.reshape(tmp, (b, c // (s * s), h * s, w * s))


@kernel("SpaceToDepth", since=1)
def space_to_depth(input, *, blocksize, mode="DCR", xp):
    b, c, h, w = input.shape
    s = blocksize
    tmp = xp.reshape(input, (b, c, h // s, s, w // s, s))
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return xp.reshape(xp.transpose(tmp, perm), (b, c * s * s, h // s, w // s))


# ---------------------------------------------------------------- scattering


_SCATTER_UFUNCS = {
    "add": numpy.add,
    "mul": numpy.multiply,
    "max": numpy.maximum,
    "min": numpy.minimum,
}


def _scatter_into(data, index, updates, reduction):
    # numpy-only: scatter is a mutation of a fresh copy; ufunc.at accumulates duplicate indices.
    out = numpy.array(data, copy=True)
    if reduction == "none":
        out[index] = updates
    else:
        _SCATTER_UFUNCS[reduction].at(out, index, updates)
    return out


def element_index(data, indices, axis):
    """The index tuple that reads ``data`` at ``indices`` along ``axis`` (GatherElements, ScatterElements)."""
    axis = normalize_axis(axis, data.ndim)
    index = list(numpy.indices(indices.shape, sparse=True))
    index[axis] = indices
    return tuple(index)


@kernel("ScatterElements", since=11, host_only=True, emit_required=True)
def scatter_elements(data, indices, updates, *, axis, reduction="none"):
    return _scatter_into(data, element_index(data, indices, axis), updates, reduction)


@kernel("Scatter", since=9, host_only=True, emit_required=True)
def scatter(data, indices, updates, *, axis):
    return _scatter_into(data, element_index(data, indices, axis), updates, "none")


@kernel("ScatterND", since=11, host_only=True, emit_required=True)
def scatter_nd(data, indices, updates, *, reduction="none"):
    index = tuple(indices[..., j] for j in range(indices.shape[-1]))
    return _scatter_into(data, index, updates, reduction)


@kernel("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis, mode, xp):
    # Written as a gather: each cache slot finds the update step (if any) that lands on it.
    axis = normalize_axis(axis, past_cache.ndim)
    cache_len, update_len = past_cache.shape[axis], update.shape[axis]
    batch = past_cache.shape[0]
    if write_indices is None:
        write_indices = xp.zeros((batch,), dtype=numpy.int64)
    slot = xp.reshape(xp.arange(cache_len), [1] * axis + [cache_len] + [1] * (past_cache.ndim - axis - 1))
    step = slot - xp.reshape(xp.astype(write_indices, numpy.int64), [batch] + [1] * (past_cache.ndim - 1))
    if mode == "circular":
        step = step % cache_len
    hit = (step >= 0) & (step < update_len)
    source = xp.where(hit, step, 0)
    source = xp.broadcast_to(source, update.shape[:axis] + (cache_len,) + update.shape[axis + 1 :])
    return xp.where(hit, xp.take_along_axis(update, source, axis=axis), past_cache)
