"""Sequence and Optional ops. A sequence is a Python list of arrays; an empty Optional is None."""

from __future__ import annotations

import numpy as np

from ..registry import kernel


def _index(position, length: int) -> int:
    i = int(np.asarray(position).reshape(-1)[0])
    if not -length <= i < max(length, 1) + (1 if length == 0 else 0):
        raise IndexError(f"sequence position {i} out of range for a sequence of length {length}")
    return i + length if i < 0 else i


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype=None):
    return []


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    return list(inputs)


@kernel("SequenceLength", since=11)
def sequence_length(seq):
    return np.array(len(seq), dtype=np.int64)


@kernel("SequenceAt", since=11)
def sequence_at(seq, position):
    return seq[_index(position, len(seq))]


@kernel("SequenceInsert", since=11)
def sequence_insert(seq, tensor, position=None):
    out = list(seq)
    if position is None:
        out.append(tensor)
    else:
        i = int(np.asarray(position).reshape(-1)[0])
        if not -len(seq) <= i <= len(seq):
            raise IndexError(f"insert position {i} out of range for a sequence of length {len(seq)}")
        out.insert(i + len(seq) if i < 0 else i, tensor)
    return out


@kernel("SequenceErase", since=11)
def sequence_erase(seq, position=None):
    out = list(seq)
    del out[-1 if position is None else _index(position, len(seq))]
    return out


@kernel("SplitToSequence", since=11, static_inputs=(1,))
def split_to_sequence(x, split=None, *, axis=0, keepdims=1, xp):
    axis = axis % x.ndim
    n = x.shape[axis]
    if split is None:
        parts = [xp.take(x, xp.asarray([i]), axis=axis) for i in range(n)]
        return [xp.squeeze(p, axis=axis) for p in parts] if not keepdims else parts
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        bounds = list(range(size, n, size))
    else:
        bounds = list(np.cumsum(split)[:-1])
    return list(xp.split(x, bounds, axis=axis))


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(seq, *, axis, new_axis=0, xp):
    if new_axis:
        return xp.stack(seq, axis=axis)
    return xp.concatenate(seq, axis=axis)


@kernel("SequenceMap", since=17, graph_attributes=("body",))
def sequence_map(seq, *extra, body, num_outputs):
    n = len(seq)
    outs: list[list] = [[] for _ in range(num_outputs)]
    for i in range(n):
        args = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
        for acc, v in zip(outs, body(*args)):
            acc.append(v)
    return tuple(outs)


@kernel("Optional", since=15)
def optional(value=None, *, type=None):
    return value


@kernel("OptionalHasElement", since=15)
def optional_has_element(value=None):
    return np.array(value is not None)


@kernel("OptionalGetElement", since=15)
def optional_get_element(value):
    if value is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return value
