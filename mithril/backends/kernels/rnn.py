"""Recurrent kernels: RNN, GRU and LSTM.

The input projection X @ W^T is computed for all time steps at once; the recurrence loops over
time in Python, vectorized over batch and gates. Reverse directions and ``sequence_lens`` are
handled by reversing each sequence within its own length and masking steps past the end, so
every direction runs the same forward loop.
"""

from __future__ import annotations

import ml_dtypes
import numpy

from ..registry import kernel

_HALF = (numpy.dtype(numpy.float16), numpy.dtype(ml_dtypes.bfloat16))


def _sigmoid(x, xp):
    # tanh form: no overflow in exp for large |x|.
    return 0.5 * (xp.tanh(0.5 * x) + 1)


# name -> (function, uses alpha, uses beta, default alpha, default beta)
_ACTIVATIONS = {
    "relu": (lambda x, a, b, xp: xp.maximum(x, 0), False, False, 0.0, 0.0),
    "tanh": (lambda x, a, b, xp: xp.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": (lambda x, a, b, xp: _sigmoid(x, xp), False, False, 0.0, 0.0),
    "affine": (lambda x, a, b, xp: a * x + b, True, True, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b, xp: xp.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b, xp: xp.where(x > a, x, 0), True, False, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b, xp: a * xp.tanh(b * x), True, True, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b, xp: xp.clip(a * x + b, 0, 1), True, True, 0.2, 0.5),
    "elu": (lambda x, a, b, xp: xp.where(x >= 0, x, a * (xp.exp(xp.minimum(x, 0)) - 1)), True, False, 1.0, 0.0),
    "softsign": (lambda x, a, b, xp: x / (1 + xp.abs(x)), False, False, 0.0, 0.0),
    "softplus": (lambda x, a, b, xp: xp.logaddexp(x, 0), False, False, 0.0, 0.0),
}


def _activation_functions(names, alphas, betas, clips, xp):
    """Bind each named activation to its alpha/beta and input clip. The alpha and beta lists are
    consumed in order, one value per activation that takes that parameter (as onnxruntime does)."""
    alphas, betas = list(alphas or ()), list(betas or ())
    bound = []
    for name, clip in zip(names, clips):
        fn, uses_alpha, uses_beta, alpha, beta = _ACTIVATIONS[name.lower()]
        if uses_alpha and alphas:
            alpha = alphas.pop(0)
        if uses_beta and betas:
            beta = betas.pop(0)
        bound.append(_bind(fn, alpha, beta, clip, xp))
    return bound


def _bind(fn, alpha, beta, clip, xp):
    if clip is None:
        return lambda x: fn(x, alpha, beta, xp)
    return lambda x: fn(xp.clip(x, -clip, clip), alpha, beta, xp)


def _reverse_within_lengths(x, sequence_lens, xp):
    """Reverse axis 0 of a (time, batch, ...) array inside each batch entry's length; padding
    steps stay in place. The permutation is its own inverse."""
    steps = x.shape[0]
    if sequence_lens is None:
        return x[::-1]
    t = xp.arange(steps).reshape(-1, 1)
    lengths = sequence_lens.astype(t.dtype).reshape(1, -1)
    index = xp.where(t < lengths, lengths - 1 - t, t)
    return xp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=0)


def _run_direction(step, projected, states, mask, xp):
    """Loop step over time. Returns (outputs (T, B, H), final states); masked steps keep state
    and output zeros."""
    outputs = []
    for t in range(projected.shape[0]):
        new = step(projected[t], states)
        if mask is None:
            states = new
            outputs.append(new[0])
        else:
            states = tuple(xp.where(mask[t], n, s) for n, s in zip(new, states))
            outputs.append(xp.where(mask[t], new[0], xp.zeros_like(new[0])))
    return xp.stack(outputs), states


def _recurrent(
    X, W, R, B, sequence_lens, initial_states, *, make_cell, num_gates, default_activations, attrs, xp,
    unclipped=(),
):
    """Shared driver: layout, directions, biases, initial states, sequence lengths, outputs.
    ``clip`` bounds the inputs of every activation except those at positions in ``unclipped``.
    float16/bfloat16 recur in float32 (the error of every step would carry into the next; and
    NumPy's bfloat16 turns to float32 at the first Python float) and return in their dtype."""
    if numpy.dtype(X.dtype) in _HALF:
        half = X.dtype
        wide = [None if v is None else v.astype(xp.float32) for v in (X, W, R, B)]
        states = [None if s is None else s.astype(xp.float32) for s in initial_states]
        outputs = _recurrent(*wide[:3], wide[3], sequence_lens, states, make_cell=make_cell, num_gates=num_gates,
                             default_activations=default_activations, attrs=attrs, xp=xp, unclipped=unclipped)
        return tuple(o.astype(half) for o in outputs)
    hidden_size, direction, layout = attrs["hidden_size"], attrs["direction"], attrs["layout"]
    num_directions = 2 if direction == "bidirectional" else 1
    if layout == 1:
        X = xp.swapaxes(X, 0, 1)
        initial_states = [None if s is None else xp.swapaxes(s, 0, 1) for s in initial_states]
    steps, batch = X.shape[0], X.shape[1]
    hidden_size = hidden_size or R.shape[-1]
    dtype = X.dtype
    if B is None:
        B = xp.zeros((num_directions, 2 * num_gates * hidden_size), dtype=dtype)
    initial_states = [
        xp.zeros((num_directions, batch, hidden_size), dtype=dtype) if s is None else s for s in initial_states
    ]
    activations = attrs["activations"] or default_activations * num_directions
    per_direction = len(default_activations)
    if len(activations) < per_direction * num_directions:
        activations = tuple(activations) * num_directions
    clips = [None if i % per_direction in unclipped else attrs["clip"] for i in range(len(activations))]
    functions = _activation_functions(activations, attrs["activation_alpha"], attrs["activation_beta"], clips, xp)
    mask = None
    if sequence_lens is not None:
        mask = (xp.arange(steps).reshape(-1, 1) < sequence_lens.reshape(1, -1)).reshape(steps, batch, 1)

    ys, finals = [], []
    for d in range(num_directions):
        reverse = direction == "reverse" or d == 1
        x = _reverse_within_lengths(X, sequence_lens, xp) if reverse else X
        w_bias, r_bias = B[d, : num_gates * hidden_size], B[d, num_gates * hidden_size :]
        project, step = make_cell(d, W[d], R[d], w_bias, r_bias, functions[d * per_direction : (d + 1) * per_direction])
        y, states = _run_direction(step, project(x), tuple(s[d] for s in initial_states), mask, xp)
        ys.append(_reverse_within_lengths(y, sequence_lens, xp) if reverse else y)
        finals.append(states)

    Y = xp.stack(ys, axis=1)  # (T, D, B, H)
    final = [xp.stack([f[i] for f in finals]) for i in range(len(initial_states))]  # (D, B, H) each
    if layout == 1:
        Y = xp.transpose(Y, (2, 0, 1, 3))
        final = [xp.swapaxes(f, 0, 1) for f in final]
    return (Y, *final)


@kernel("RNN", since=7)
def rnn(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha,
    activation_beta,
    activations,
    clip,
    direction,
    hidden_size,
    layout=0,
    xp,
):
    def make_cell(d, w, r, w_bias, r_bias, functions):
        (f,) = functions
        bias = w_bias + r_bias

        def project(x):
            return xp.matmul(x, xp.transpose(w)) + bias

        def step(xw, states):
            (h,) = states
            return (f(xw + xp.matmul(h, xp.transpose(r))),)

        return project, step

    attrs = dict(
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        activations=activations,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        clip=clip,
    )
    return _recurrent(
        X, W, R, B, sequence_lens, [initial_h], make_cell=make_cell, num_gates=1,
        default_activations=("Tanh",), attrs=attrs, xp=xp,
    )  # fmt: skip


@kernel("GRU", since=7)
def gru(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    *,
    activation_alpha,
    activation_beta,
    activations,
    clip,
    direction,
    hidden_size,
    linear_before_reset,
    layout=0,
    xp,
):
    def make_cell(d, w, r, w_bias, r_bias, functions):
        f, g = functions
        hidden = r.shape[-1]
        r_zr, r_h = xp.transpose(r[: 2 * hidden]), xp.transpose(r[2 * hidden :])
        # The recurrent bias of the update and reset gates folds into the input projection;
        # the hidden gate's recurrent bias sits inside the reset product.
        bias = w_bias + xp.concatenate([r_bias[: 2 * hidden], xp.zeros_like(r_bias[2 * hidden :])])
        rb_h = r_bias[2 * hidden :]

        def project(x):
            return xp.matmul(x, xp.transpose(w)) + bias

        def step(xw, states):
            (h,) = states
            zr = f(xw[..., : 2 * hidden] + xp.matmul(h, r_zr))
            z, reset = zr[..., :hidden], zr[..., hidden:]
            if linear_before_reset:
                candidate = g(xw[..., 2 * hidden :] + reset * (xp.matmul(h, r_h) + rb_h))
            else:
                candidate = g(xw[..., 2 * hidden :] + xp.matmul(reset * h, r_h) + rb_h)
            return ((1 - z) * candidate + z * h,)

        return project, step

    attrs = dict(
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        activations=activations,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        clip=clip,
    )
    return _recurrent(
        X, W, R, B, sequence_lens, [initial_h], make_cell=make_cell, num_gates=3,
        default_activations=("Sigmoid", "Tanh"), attrs=attrs, xp=xp,
    )  # fmt: skip


@kernel("LSTM", since=7)
def lstm(
    X,
    W,
    R,
    B=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    P=None,
    *,
    activation_alpha,
    activation_beta,
    activations,
    clip,
    direction,
    hidden_size,
    input_forget,
    layout=0,
    xp,
):
    attrs = dict(
        hidden_size=hidden_size,
        direction=direction,
        layout=layout,
        activations=activations,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        clip=clip,
    )
    return lstm_with_matmul(X, W, R, B, sequence_lens, initial_h, initial_c, P, input_forget=input_forget,
                            attrs=attrs, xp=xp)


def lstm_with_matmul(
    X, W, R, B, sequence_lens, initial_h, initial_c, P, *, input_forget, attrs, xp, input_matmul=None,
    recurrent_matmul=None,
):  # fmt: skip
    """The LSTM recurrence with its weight products replaceable: ``input_matmul(x, d)`` is
    ``x @ W[d].T`` and ``recurrent_matmul(h, d)`` is ``h @ R[d].T`` (com.microsoft's
    DynamicQuantizeLSTM multiplies by quantized weights instead)."""

    def make_cell(d, w, r, w_bias, r_bias, functions):
        f, g, h_act = functions
        hidden = r.shape[-1]
        bias = w_bias + r_bias
        # Peephole weights [P_i, P_o, P_f] per direction.
        peep = None if P is None else (P[d, :hidden], P[d, hidden : 2 * hidden], P[d, 2 * hidden :])
        r_t = None if recurrent_matmul else xp.transpose(r)

        def project(x):
            return input_matmul(x, d) + bias if input_matmul else xp.matmul(x, xp.transpose(w)) + bias

        def step(xw, states):
            h, c = states
            gates = xw + (recurrent_matmul(h, d) if recurrent_matmul else xp.matmul(h, r_t))
            gi, go = gates[..., :hidden], gates[..., hidden : 2 * hidden]
            gf, gc = gates[..., 2 * hidden : 3 * hidden], gates[..., 3 * hidden :]
            if peep is not None:
                gi = gi + peep[0] * c
                gf = gf + peep[2] * c
            i = f(gi)
            forget = 1 - i if input_forget else f(gf)
            c_new = forget * c + i * g(gc)
            if peep is not None:
                go = go + peep[1] * c_new
            return f(go) * h_act(c_new), c_new

        return project, step

    return _recurrent(
        X, W, R, B, sequence_lens, [initial_h, initial_c], make_cell=make_cell, num_gates=4,
        default_activations=("Sigmoid", "Tanh", "Tanh"), attrs=attrs, xp=xp,
        unclipped=(2,),  # the cell clip bounds the gates, not the cell state fed to h (as onnxruntime)
    )  # fmt: skip
