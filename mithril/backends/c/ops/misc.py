"""C rules for ops of no larger family (kernels: ``lib/mt_misc.h``): the training optimizers Adagrad,
Adam and Momentum (domain ai.onnx.preview.training), the cosine windows HannWindow, HammingWindow
and BlackmanWindow, Det and TensorScatter.

Each computes what :mod:`mithril.backends.kernels` does: the optimizers in the tensors' type with
the scalar learning rate in double (NumPy's promotion of R and T), a window in double rounded once,
Det by LU with partial pivoting in double (NumPy's LAPACK is within rounding of it). A window's
size may come at run time: it is read in C, and one other than the length the output was compiled
for stops the segment with a NodeError. TensorScatter only moves bytes, so it takes every C type.
"""

from __future__ import annotations

import math
from math import prod

import numpy as np

from . import FLOATS, c_kernel, text

INT64 = np.dtype(np.int64)
SIZES = frozenset({np.dtype(np.int32), INT64})
TRAINING = "ai.onnx.preview.training"


def _doubles(values) -> str:
    """A C array literal of doubles (exact: repr round-trips)."""
    return f"(const double[]){{{', '.join(repr(float(v)) for v in values)}}}"


def _scalar(v, dtypes) -> bool:
    return v is not None and v.dtype in dtypes and prod(v.static_shape) == 1


# ---------------------------------------------------------------------------------------------
# Adagrad / Adam / Momentum: R, T, then X1..Xn, G1..Gn and each state S1..Sn; outputs X1_new..Xn_new
# and the new states, grouped the same way.

TENSORS_PER_VARIABLE = {"Adagrad": 3, "Adam": 4, "Momentum": 3}  # X, G and the states
ATTRIBUTES = {"Adagrad": ("decay_factor", "epsilon", "norm_coefficient"),
              "Adam": ("alpha", "beta", "epsilon", "norm_coefficient", "norm_coefficient_post"),
              "Momentum": ("alpha", "beta", "norm_coefficient")}


def _groups(pn):
    """(inputs by kind, outputs by kind), each a list of n values; or why not."""
    kinds, tensors = TENSORS_PER_VARIABLE[pn.op_type], pn.inputs[2:]
    if not tensors or len(tensors) % kinds:
        return f"{len(tensors)} tensors after R and T ({pn.op_type} takes {kinds} per optimized tensor)"
    n = len(tensors) // kinds
    if len(pn.outputs) != (kinds - 1) * n:
        return f"{len(pn.outputs)} outputs for {n} optimized tensors (want {(kinds - 1) * n})"
    ins = [list(tensors[k * n:(k + 1) * n]) for k in range(kinds)]
    outs = [list(pn.outputs[k * n:(k + 1) * n]) for k in range(kinds - 1)]
    return ins, outs


def _check_optimizer(pn):
    r, t = pn.inputs[0], pn.inputs[1]
    if not _scalar(r, FLOATS):
        return f"R is {r.dtype} {list(r.static_shape)} (the C kernel reads one float32 or float64)"
    if not _scalar(t, {INT64}):
        return f"T is {t.dtype} {list(t.static_shape)} (the C kernel reads one int64)"
    groups = _groups(pn)
    if isinstance(groups, str):
        return groups
    ins, outs = groups
    for i, x in enumerate(ins[0]):
        if x.dtype not in FLOATS:
            return f"X {x.name!r} of dtype {x.dtype} (the C kernel updates float32, float64)"
        for v in [g[i] for g in ins[1:]] + [o[i] for o in outs]:
            if not v.name:
                return f"an output for {x.name!r} is omitted"
            if v.dtype != x.dtype or tuple(v.static_shape) != tuple(x.static_shape):
                return f"{v.name!r} is {v.dtype} {v.static_shape}, its X {x.name!r} {x.dtype} {x.static_shape}"
    missing = [a for a in ATTRIBUTES[pn.op_type] if pn.kwargs.get(a) is None]
    if missing:
        return f"attribute(s) {', '.join(missing)} not set"
    if pn.op_type == "Momentum" and text(pn.kwargs["mode"]) not in ("standard", "nesterov"):
        return f"mode {text(pn.kwargs['mode'])!r} (standard or nesterov)"
    return None


@c_kernel("Adagrad", "Adam", "Momentum", domain=TRAINING, dtypes=FLOATS, check=_check_optimizer)
def optimizer(pn, c):
    r, t = f"(double){c.buf(pn.inputs[0])}[0]", f"{c.buf(pn.inputs[1])}[0]"
    (ins, outs), op = _groups(pn), pn.op_type.lower()
    attrs = ", ".join(repr(float(pn.kwargs[a])) for a in ATTRIBUTES[pn.op_type])
    if pn.op_type == "Momentum":
        attrs += f", {int(text(pn.kwargs['mode']) == 'nesterov')}"
    for i, x in enumerate(ins[0]):
        if c.numel(x) == 0:
            continue
        bufs = ", ".join(c.buf(v[i]) for v in (*ins, *outs))
        c.line(f"mt_{op}_{c.sfx(x)}({bufs}, {c.numel(x)}, {r}, {t}, {attrs});")


# ---------------------------------------------------------------------------------------------
# HannWindow / HammingWindow / BlackmanWindow: sum_k (-1)^k a_k cos(2 pi k n / N)

WINDOWS = {"HannWindow": (0.5, 0.5), "HammingWindow": (25 / 46, 21 / 46), "BlackmanWindow": (0.42, 0.5, 0.08)}


def _check_window(pn):
    size, y = pn.inputs[0], pn.outputs[0]
    if not _scalar(size, SIZES):
        return f"size is {size.dtype} {list(size.static_shape)} (the C kernel reads one int32 or int64)"
    if y.dtype not in FLOATS:
        return f"output_datatype {y.dtype} (the C kernel writes {', '.join(sorted(map(str, FLOATS)))})"
    if len(y.static_shape) != 1:
        return f"output is typed {y.static_shape}, not 1-D"
    if size.kind == "constant":
        given = int(np.asarray(size.value).reshape(-1)[0])
        if given != y.static_shape[0]:
            return f"size {given} for an output typed {y.static_shape}"
    return None


@c_kernel("HannWindow", "HammingWindow", "BlackmanWindow", since=17, check=_check_window)
def cosine_window(pn, c):
    size, y = pn.inputs[0], pn.outputs[0]
    n = c.numel(y)
    if size.kind != "constant":
        c.checked(f"{c.buf(size)}[0] != {n}", f"size is not {n}, the length the model was compiled for")
    if n == 0:
        return
    periodic = int(pn.kwargs.get("periodic", 1))
    coefficients = WINDOWS[pn.op_type]
    terms = _doubles((-1) ** k * a for k, a in enumerate(coefficients))
    angles = _doubles(2 * math.pi * k for k in range(len(coefficients)))  # as NumPy's kernel forms them
    denom = n if periodic else n - 1
    c.line(f"mt_cosine_window_{c.sfx(y)}({c.buf(y)}, {n}, {denom}, {terms}, {angles}, {len(coefficients)});")


# ---------------------------------------------------------------------------------------------
# Det


def _det_dims(pn) -> tuple[int, int]:
    shape = pn.inputs[0].static_shape
    return prod(shape[:-2]), shape[-1]


def _check_det(pn):
    x, y = pn.inputs[0], pn.outputs[0]
    shape = tuple(x.static_shape)
    if len(shape) < 2 or shape[-1] != shape[-2]:
        return f"input {shape} is not [*, M, M]"
    if y.dtype != x.dtype or tuple(y.static_shape) != shape[:-2]:
        return f"output is {y.dtype} {y.static_shape}, the kernel writes {x.dtype} {shape[:-2]}"
    return None


@c_kernel("Det", since=11, dtypes=FLOATS, check=_check_det,
          scratch=lambda pn: _det_dims(pn)[1] ** 2 * np.dtype(np.float64).itemsize)
def det(pn, c):
    x, y = pn.inputs[0], pn.outputs[0]
    batch, m = _det_dims(pn)
    if batch:
        c.line(f"mt_det_{c.sfx(x)}({c.buf(x)}, {c.buf(y)}, {batch}, {m}, (double *){c.scratch or '0'});")


# ---------------------------------------------------------------------------------------------
# TensorScatter: past_cache [batch, ..., L (axis), ...] with update [batch, ..., U, ...] written from
# each batch's write index on (modulo L when circular; past the end dropped, as NumPy's kernel).


def _scatter_axis(pn) -> int:
    rank = len(pn.inputs[0].static_shape)
    axis = int(pn.kwargs.get("axis", -2))
    return axis % rank if -rank <= axis < rank else -1


def _check_tensor_scatter(pn):
    past, update, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    idx = pn.inputs[2] if len(pn.inputs) > 2 else None
    ps, us = tuple(past.static_shape), tuple(update.static_shape)
    axis = _scatter_axis(pn)
    if axis < 1:
        return f"axis {pn.kwargs.get('axis')} of rank {len(ps)} (the sequence axis must follow the batch axis)"
    if text(pn.kwargs.get("mode", "linear")) not in ("linear", "circular"):
        return f"mode {text(pn.kwargs.get('mode'))!r} (linear or circular)"
    if len(us) != len(ps) or us[:axis] + us[axis + 1:] != ps[:axis] + ps[axis + 1:] or us[axis] > ps[axis]:
        return f"update {us} does not fit past_cache {ps} along axis {axis}"
    if update.dtype != past.dtype or y.dtype != past.dtype or tuple(y.static_shape) != ps:
        return f"update {update.dtype} and output {y.dtype} {y.static_shape} differ from past_cache {past.dtype} {ps}"
    if idx is not None and (idx.dtype != INT64 or tuple(idx.static_shape) != ps[:1]):
        return f"write_indices is {idx.dtype} {idx.static_shape} (one int64 per batch, {ps[:1]})"
    return None


@c_kernel("TensorScatter", since=24, check=_check_tensor_scatter, storage=True)
def tensor_scatter(pn, c):
    past, update, y = pn.inputs[0], pn.inputs[1], pn.outputs[0]
    idx = pn.inputs[2] if len(pn.inputs) > 2 else None
    ps, axis = c.shape(past), _scatter_axis(pn)
    if prod(ps) == 0:
        return
    row = prod(ps[axis + 1:]) * past.dtype.itemsize
    circular = int(text(pn.kwargs.get("mode", "linear")) == "circular")
    c.line(f"mt_tensor_scatter({c.buf(past)}, {c.buf(update)}, {c.buf(idx) if idx is not None else '0'}, "
           f"{c.buf(y)}, {ps[0]}, {prod(ps[1:axis])}, {ps[axis]}, {c.shape(update)[axis]}, {row}, {circular});")

