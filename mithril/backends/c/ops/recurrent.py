"""C rules for the recurrent ops RNN, GRU and LSTM (kernels: ``lib/mt_recurrent.h``; NumPy reference
:mod:`mithril.backends.kernels.rnn`).

Every attribute is read here: the activations become numbers (their alpha and beta bound as the
reference binds them), the shapes of the weights, states and outputs are checked against X and
``hidden_size``. ``sequence_lens`` is data: the kernel checks each length lies in [0, steps] and
stops the segment otherwise.
"""

from __future__ import annotations

import numpy as np

from . import FLOATS, c_kernel, text

INT32 = np.dtype(np.int32)

# op -> (cell number in mt_recurrent.h, gates, default activations)
CELLS = {"RNN": (0, 1, ("Tanh",)), "GRU": (1, 3, ("Sigmoid", "Tanh")), "LSTM": (2, 4, ("Sigmoid", "Tanh", "Tanh"))}

# lower-case name -> (number in mt_recurrent.h, uses alpha, uses beta, default alpha, default beta),
# as the reference's _ACTIVATIONS.
ACTIVATIONS = {
    "relu": (0, False, False, 0.0, 0.0),
    "tanh": (1, False, False, 0.0, 0.0),
    "sigmoid": (2, False, False, 0.0, 0.0),
    "affine": (3, True, True, 1.0, 0.0),
    "leakyrelu": (4, True, False, 0.01, 0.0),
    "thresholdedrelu": (5, True, False, 1.0, 0.0),
    "scaledtanh": (6, True, True, 1.0, 1.0),
    "hardsigmoid": (7, True, True, 0.2, 0.5),
    "elu": (8, True, False, 1.0, 0.0),
    "softsign": (9, False, False, 0.0, 0.0),
    "softplus": (10, False, False, 0.0, 0.0),
}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _input(pn, i: int):
    return pn.inputs[i] if len(pn.inputs) > i and pn.inputs[i] is not None and pn.inputs[i].name else None


def _output(pn, i: int):
    return pn.outputs[i] if len(pn.outputs) > i and pn.outputs[i].name else None


def _dims(pn) -> tuple[int, int, int, int, int]:
    """(steps, batch, input size, hidden size, directions)."""
    x = pn.inputs[0].static_shape
    steps, batch = (x[1], x[0]) if int(pn.kwargs.get("layout") or 0) else (x[0], x[1])
    hidden = int(pn.kwargs.get("hidden_size") or pn.inputs[2].static_shape[-1])
    return steps, batch, x[2], hidden, DIRECTIONS[text(pn.kwargs.get("direction") or "forward")]


def _activations(pn) -> list[tuple[int, float, float]] | str:
    """(number, alpha, beta) per activation, direction after direction, as the reference binds them;
    a string saying why not when a name is unknown or too few are given."""
    per = len(CELLS[pn.op_type][2])
    D = _dims(pn)[4]
    names = [text(a) for a in (pn.kwargs.get("activations") or ())] or list(CELLS[pn.op_type][2]) * D
    if len(names) < per * D:
        names = names * D
    if len(names) < per * D:
        return f"{len(names)} activations for {D} direction(s) of {per}"
    alphas = [float(a) for a in (pn.kwargs.get("activation_alpha") or ())]
    betas = [float(b) for b in (pn.kwargs.get("activation_beta") or ())]
    bound = []
    for name in names[:per * D]:
        if name.lower() not in ACTIVATIONS:
            return f"activation {name!r} (C has {', '.join(ACTIVATIONS)})"
        number, uses_alpha, uses_beta, alpha, beta = ACTIVATIONS[name.lower()]
        if uses_alpha and alphas:
            alpha = alphas.pop(0)
        if uses_beta and betas:
            beta = betas.pop(0)
        bound.append((number, alpha, beta))
    return bound


def _check(pn) -> str | None:
    x = pn.inputs[0]
    if len(x.static_shape) != 3:
        return f"X of rank {len(x.static_shape)}"
    direction = text(pn.kwargs.get("direction") or "forward")
    if direction not in DIRECTIONS:
        return f"direction {direction!r}"
    layout = int(pn.kwargs.get("layout") or 0)
    if layout not in (0, 1):
        return f"layout {layout}"
    if len(pn.inputs[2].static_shape) != 3:
        return f"R of rank {len(pn.inputs[2].static_shape)}"
    steps, batch, size, H, D = _dims(pn)
    if min(steps, batch, size, H) == 0:
        return f"an empty dim (steps {steps}, batch {batch}, input {size}, hidden {H})"
    G = CELLS[pn.op_type][1]
    want = {0: x.static_shape, 1: (D, G * H, size), 2: (D, G * H, H), 3: (D, 2 * G * H),
            5: (batch, D, H) if layout else (D, batch, H), 4: (batch,)}
    want[6] = want[5]  # LSTM's initial_c
    want[7] = (D, 3 * H)  # LSTM's P
    for i, shape in want.items():
        v = _input(pn, i)
        if v is None:
            continue
        if tuple(v.static_shape) != tuple(shape):
            return f"input {i} {v.name!r} is {v.static_shape}, expected {shape}"
        if i != 4 and v.dtype != x.dtype:
            return f"input {v.name!r} is {v.dtype}, X {x.dtype}"
    lens = _input(pn, 4)
    if lens is not None and lens.dtype != INT32:
        return f"sequence_lens of dtype {lens.dtype} (C takes int32)"
    outs = [(steps, D, batch, H) if not layout else (batch, steps, D, H), want[5], want[5]]
    for i, shape in enumerate(outs):
        o = _output(pn, i)
        if o is not None and (tuple(o.static_shape) != shape or o.dtype != x.dtype):
            return f"output {i} {o.name!r} is {o.dtype} {o.static_shape}, the kernel writes {x.dtype} {shape}"
    clip = pn.kwargs.get("clip")
    if clip is not None and not float(clip) >= 0:
        return f"clip={clip} (the kernel takes clip >= 0)"
    acts = _activations(pn)
    return acts if isinstance(acts, str) else None


def _scratch(pn) -> int:
    steps, batch, _, H, _ = _dims(pn)
    G = CELLS[pn.op_type][1]
    return (steps * batch * G * H + batch * G * H + 4 * batch * H) * pn.inputs[0].dtype.itemsize


def recurrent(pn, c):
    x = pn.inputs[0]
    steps, batch, size, H, D = _dims(pn)
    cell = CELLS[pn.op_type][0]
    ctype, sfx = c.ctype(x), c.sfx(x)
    acts = _activations(pn)
    clip = pn.kwargs.get("clip")

    def opt_in(i, cast=""):
        v = _input(pn, i)
        return "0" if v is None else f"{cast}{c.buf(v)}"

    def opt_out(i):
        o = _output(pn, i)
        return "0" if o is None else c.buf(o)

    def floats(values):
        return f"(const {ctype}[]){{{', '.join(c.literal(v, x.dtype) for v in values)}}}"

    lstm = pn.op_type == "LSTM"
    args = [c.buf(x), c.buf(pn.inputs[1]), c.buf(pn.inputs[2]), opt_in(3), opt_in(4, "(const int32_t *)"),
            opt_in(5), opt_in(6) if lstm else "0", opt_in(7) if lstm else "0",
            opt_out(0), opt_out(1), opt_out(2) if lstm else "0",
            steps, batch, size, H, D, int(text(pn.kwargs.get("direction") or "forward") == "reverse"),
            int(pn.kwargs.get("layout") or 0), cell, int(bool(pn.kwargs.get("linear_before_reset") or 0)),
            int(bool(pn.kwargs.get("input_forget") or 0)), c.arr([a[0] for a in acts], "int"),
            floats(a[1] for a in acts), floats(a[2] for a in acts),
            c.literal(-1.0 if clip is None else float(clip), x.dtype), f"({ctype} *){c.scratch}"]
    c.checked(f"mt_recurrent_{sfx}({', '.join(map(str, args))})",
              "a sequence length is outside [0, the number of steps]")


c_kernel(*CELLS, since=7, dtypes=FLOATS, check=_check, scratch=_scratch)(recurrent)
