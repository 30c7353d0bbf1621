"""Blocks that move data between shapes: Reshape, Transpose, Flatten, Concat, Split, Indexer,
Squeeze, Shape, Size."""

from __future__ import annotations

import numpy as np

from .block import register
from .model import In, Out, Primitive, ShapeView
from .shapes import Conflict, Dim
from ..errors import ModelError

INT64_MAX = np.iinfo(np.int64).max


@register
class Reshape(Primitive):
    """Reshape to ``shape`` (ints; one -1 is inferred; 0 copies the input dim, as in ONNX)."""

    ports = {"input": In(None), "output": Out(None)}

    def __init__(self, shape, name: str | None = None):
        self.shape = tuple(-1 if d is None else int(d) for d in shape)
        super().__init__(name)

    def attributes(self):
        return {"shape": self.shape}

    def infer(self, s: ShapeView) -> None:
        vals = s.values("input")
        dims = s["input"]
        out = []
        for i, d in enumerate(self.shape):
            if d == 0:
                out.append(dims[i] if dims is not None else None)
            else:
                out.append(None if d == -1 else d)
        if -1 in self.shape and vals is not None and None not in vals:
            known = int(np.prod([v for v in out if v is not None and not isinstance(v, Dim)] or [1]))
            total = int(np.prod(vals))
            if any(isinstance(v, Dim) and v.root().value is None for v in out):
                pass
            elif total % known:
                raise Conflict(f"cannot reshape {vals} into {list(self.shape)}")
            else:
                out[self.shape.index(-1)] = total // known
        s.set("output", out)

    def lower(self, g, input):
        return g.op("Reshape", input, g.ints(self.shape))


@register
class Transpose(Primitive):
    """Permute axes (reverse them when ``axes`` is None)."""

    ports = {"input": In(None), "output": Out(None)}

    def __init__(self, axes=None, name: str | None = None):
        self.axes = None if axes is None else tuple(int(a) for a in axes)
        super().__init__(name)

    def attributes(self):
        return {"axes": self.axes}

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None and self.axes is not None:
            s.set("input", [None] * len(self.axes))
            dims = s["input"]
        if dims is None:
            return
        perm = self.axes if self.axes is not None else tuple(reversed(range(len(dims))))
        if sorted(a % len(dims) for a in perm) != list(range(len(dims))):
            raise Conflict(f"axes {list(perm)} do not permute rank {len(dims)}")
        s.set("output", [dims[a] for a in perm])

    def lower(self, g, input):
        perm = None if self.axes is None else [a % len(self.axes) for a in self.axes]
        return g.op("Transpose", input, perm=perm)


@register
class Flatten(Primitive):
    """Merge dims ``start_dim..end_dim`` into one. The default ``start_dim=1`` keeps the batch
    dim and flattens each sample, as ``torch.nn.Flatten``; ``start_dim=0`` flattens everything
    (``torch.flatten``).

    >>> from mithril.models import Flatten, IOKey, Model
    >>> m = Model()
    >>> m |= Flatten()(input=IOKey("x", shape=["N", 3, 4, 5]), output="y")
    >>> m.shape_of("y")
    '[N, 60]'
    """

    ports = {"input": In(None), "output": Out(None)}

    def __init__(self, start_dim: int = 1, end_dim: int = -1, name: str | None = None):
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)
        super().__init__(name)

    def attributes(self):
        return {"start_dim": self.start_dim, "end_dim": self.end_dim}

    def _range(self, rank):
        size = max(rank, 1)  # a scalar flattens as a vector of one element, as in torch
        for d in (self.start_dim, self.end_dim):
            if not -size <= d < size:
                raise Conflict(f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim}) does not fit an "
                               f"input of rank {rank} (dims -{size}..{size - 1})")
        a, b = self.start_dim % size, self.end_dim % size
        if a > b:
            raise Conflict(f"Flatten: start_dim {self.start_dim} comes after end_dim {self.end_dim} at rank {rank}")
        return a, b

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        a, b = self._range(len(dims))
        if not dims:
            s.set("output", [1])
            return
        merged = [d.root().value for d in dims[a:b + 1]]
        size = int(np.prod(merged)) if None not in merged else None
        s.set("output", list(dims[:a]) + [size] + list(dims[b + 1:]))

    def lower(self, g, input):
        dims = self._ports["input"].shape.dims()
        if dims is None:
            raise Conflict("Flatten needs the input rank")
        a, b = self._range(len(dims))
        tail = [d.root().value for d in dims[b + 1:]]
        if None not in tail:
            return g.op("Reshape", input, g.ints([0] * a + [-1] + tail))
        # Dynamic trailing dims: build the target shape from Shape(input) at run time.
        parts = [g.op("Shape", input, end=a, dtype=np.int64)] if a else []
        parts.append(g.ints([-1]))
        parts.append(g.op("Shape", input, start=b + 1, dtype=np.int64))
        return g.op("Reshape", input, g.op("Concat", *parts, axis=0))


@register
class Concat(Primitive):
    """Join ``n`` inputs (``input1``..``inputN``) along ``axis``."""

    def __init__(self, n: int = 2, axis: int = 0, name: str | None = None):
        self.n, self.axis = int(n), int(axis)
        super().__init__(name)

    def port_specs(self):
        ports = {f"input{i + 1}": In(None) for i in range(self.n)}
        ports["output"] = Out(None)
        return ports

    def attributes(self):
        return {"n": self.n, "axis": self.axis}

    def infer(self, s: ShapeView) -> None:
        names = [f"input{i + 1}" for i in range(self.n)]
        all_dims = [s[n] for n in names]
        rank = next((len(d) for d in all_dims if d is not None), s.rank("output"))
        if rank is None:
            return
        ax = self.axis % rank
        for n in names:
            if s[n] is None:
                s.set(n, [None] * rank)
        all_dims = [s[n] for n in names]
        out = list(all_dims[0])
        for dims in all_dims[1:]:
            if len(dims) != rank:
                raise Conflict(f"concatenating ranks {rank} and {len(dims)}")
            for i, d in enumerate(dims):
                if i != ax:
                    out[i] = _unified(out[i], d)
        sizes = [d[ax].root().value for d in all_dims]
        out[ax] = sum(sizes) if None not in sizes else None
        s.set("output", out)

    def lower(self, g, **inputs):
        return g.op("Concat", *[inputs[f"input{i + 1}"] for i in range(self.n)], axis=self.axis)


def _unified(a: Dim, b: Dim) -> Dim:
    from .shapes import unify_dims

    unify_dims(a, b)
    return a


@register
class Split(Primitive):
    """Split along ``axis`` into ``n`` equal parts, or parts of ``sizes``: ``output1``..``outputN``."""

    def __init__(self, n: int | None = None, axis: int = 0, sizes=None, name: str | None = None):
        self.sizes = None if sizes is None else tuple(int(v) for v in sizes)
        self.n = len(self.sizes) if self.sizes is not None else int(n or 2)
        self.axis = int(axis)
        super().__init__(name)

    def port_specs(self):
        ports = {"input": In(None)}
        ports.update({f"output{i + 1}": Out(None) for i in range(self.n)})
        return ports

    def attributes(self):
        return {"n": self.n, "axis": self.axis, "sizes": self.sizes}

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        ax = self.axis % len(dims)
        total = dims[ax].root().value
        for i in range(self.n):
            if self.sizes is not None:
                part = self.sizes[i]
            elif total is not None:
                if total % self.n:
                    raise Conflict(f"cannot split {total} into {self.n} equal parts")
                part = total // self.n
            else:
                part = None
            s.set(f"output{i + 1}", [part if j == ax else d for j, d in enumerate(dims)])
        if self.sizes is not None and total is None:
            from .shapes import fix_dim

            fix_dim(dims[ax], sum(self.sizes))

    def lower(self, g, input):
        dims = self._ports["input"].shape.dims()
        total = dims[self.axis % len(dims)].root().value if dims is not None else None
        sizes = self.sizes or ((total // self.n,) * self.n if total is not None else None)
        if sizes is not None:
            return g.op("Split", input, g.ints(sizes), outputs=self.n, axis=self.axis)
        if g.opset >= 18:
            return g.op("Split", input, outputs=self.n, axis=self.axis, num_outputs=self.n)
        return g.op("Split", input, outputs=self.n, axis=self.axis)


@register
class Indexer(Primitive):
    """NumPy basic indexing: ints, slices, ``...`` and None (``a[..., 1:]``, ``a[0, :, None]``)."""

    ports = {"input": In(None), "output": Out(None)}

    def __init__(self, index, name: str | None = None):
        self.index = index if isinstance(index, tuple) else (index,)
        for item in self.index:
            if not (item is None or item is Ellipsis or isinstance(item, (int, slice))):
                raise ModelError(f"Indexer takes ints, slices, ... and None; got {item!r}")
        if sum(item is Ellipsis for item in self.index) > 1:
            raise ModelError("an index can hold one ... only")
        super().__init__(name)

    def attributes(self):
        return {"index": self.index}

    def _expanded(self, rank: int):
        """The index with ``...`` replaced by full slices for a known rank."""
        used = sum(1 for it in self.index if it is not None and it is not Ellipsis)
        if used > rank:
            raise Conflict(f"{used} indices for rank {rank}")
        out = []
        for it in self.index:
            if it is Ellipsis:
                out += [slice(None)] * (rank - used)
            else:
                out.append(it)
        if Ellipsis not in self.index:
            out += [slice(None)] * (rank - used)
        return out

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        out = []
        axis = 0
        for it in self._expanded(len(dims)):
            if it is None:
                out.append(1)
                continue
            d = dims[axis]
            axis += 1
            if isinstance(it, int):
                if d.root().value is not None and not -d.root().value <= it < d.root().value:
                    raise Conflict(f"index {it} out of range for a dim of {d.root().value}")
                continue
            if it == slice(None):
                out.append(d)
            elif d.root().value is not None:
                out.append(len(range(*it.indices(d.root().value))))
            else:
                out.append(None)
        s.set("output", out)

    def lower(self, g, input):
        dims = self._ports["input"].shape.dims()
        if dims is None:
            raise Conflict("Indexer needs the input rank")
        items = self._expanded(len(dims))
        starts, ends, axes, steps = [], [], [], []
        squeeze, unsqueeze = [], []
        axis = out_pos = 0  # input axis; output position among non-int items (where None lands)
        for it in items:
            if it is None:
                unsqueeze.append(out_pos)
                out_pos += 1
                continue
            if not isinstance(it, int):
                out_pos += 1
            if isinstance(it, int):
                starts.append(it)
                ends.append(it + 1 if it != -1 else INT64_MAX)
                axes.append(axis)
                steps.append(1)
                squeeze.append(axis)
            elif it != slice(None):
                step = 1 if it.step is None else it.step
                big = INT64_MAX if step > 0 else -INT64_MAX
                starts.append(it.start if it.start is not None else (0 if step > 0 else -1))
                ends.append(it.stop if it.stop is not None else big)
                axes.append(axis)
                steps.append(step)
            axis += 1
        x = input
        if axes:
            x = g.op("Slice", x, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps))
        if squeeze:
            x = g.op("Squeeze", x, g.ints(squeeze))
        if unsqueeze:
            x = g.op("Unsqueeze", x, g.ints(unsqueeze))
        return x if x is not input else g.op("Identity", x)


@register
class Squeeze(Primitive):
    """Drop size-1 dims (those at ``axis`` when given)."""

    ports = {"input": In(None), "output": Out(None)}

    def __init__(self, axis=None, name: str | None = None):
        self.axis = None if axis is None else ((int(axis),) if isinstance(axis, int) else tuple(axis))
        super().__init__(name)

    def attributes(self):
        return {"axis": self.axis}

    def _axes(self, dims):
        if self.axis is not None:
            return tuple(a % len(dims) for a in self.axis)
        vals = [d.root().value for d in dims]
        return None if None in vals else tuple(i for i, v in enumerate(vals) if v == 1)

    def infer(self, s: ShapeView) -> None:
        dims = s["input"]
        if dims is None:
            return
        axes = self._axes(dims)
        if axes is None:
            return
        for a in axes:
            from .shapes import fix_dim

            fix_dim(dims[a], 1)
        s.set("output", [d for i, d in enumerate(dims) if i not in axes])

    def lower(self, g, input):
        dims = self._ports["input"].shape.dims()
        axes = self._axes(dims) if dims is not None else None
        return g.op("Squeeze", input, g.ints(axes)) if axes is not None else g.op("Squeeze", input)


@register
class Shape(Primitive):
    """The input's shape as a 1-D int64 tensor."""

    ports = {"input": In(None, None), "output": Out([None], int)}

    def infer(self, s: ShapeView) -> None:
        rank = s.rank("input")
        if rank is not None:
            s.set("output", [rank])

    def lower(self, g, input):
        return g.op("Shape", input, dtype=np.int64)


@register
class Size(Primitive):
    """The input's element count as an int64 scalar."""

    ports = {"input": In(None, None), "output": Out([], int)}

    def lower(self, g, input):
        return g.op("Size", input, dtype=np.int64)
