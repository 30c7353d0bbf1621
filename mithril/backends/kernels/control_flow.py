"""Control flow: If, Loop, Scan. Subgraphs arrive as callables (nested generated functions
that close over the outer-scope values they read) returning a tuple of outputs.

These are the eager (Python) forms; jit backends override them with their framework's own
constructs (lax.cond / lax.while_loop / lax.scan).
"""

from __future__ import annotations

import numpy as np

from ..registry import kernel


@kernel("If", since=1, graph_attributes=("then_branch", "else_branch"))
def if_(cond, *, then_branch, else_branch):
    return tuple(then_branch() if bool(np.asarray(cond).reshape(-1)[0]) else else_branch())


def _stack(values: list, xp):
    if values and isinstance(values[0], list):
        return values  # a sequence-typed scan output stays a list
    return xp.stack([xp.asarray(v) for v in values])


@kernel("Loop", since=1, graph_attributes=("body",))
def loop(max_trip_count, cond, *initial, body, num_outputs, node, xp):
    trips = None if max_trip_count is None else int(np.asarray(max_trip_count).reshape(-1)[0])
    keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    carried = list(initial)
    n_carried = len(carried)
    scans: list[list] = [[] for _ in range(num_outputs - n_carried)]
    i = 0
    while keep_going and (trips is None or i < trips):
        outs = body(np.array(i, dtype=np.int64), np.array(keep_going), *carried)
        keep_going = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = list(outs[1 : 1 + n_carried])
        for acc, v in zip(scans, outs[1 + n_carried :]):
            acc.append(v)
        i += 1
    results = []
    for k, acc in enumerate(scans):
        if acc:
            results.append(_stack(acc, xp))
        else:  # zero iterations: an empty scan output of the declared dtype
            dtype = node.output_dtypes[n_carried + k] if len(node.output_dtypes) > n_carried + k else None
            results.append(np.zeros((0,), dtype=dtype or np.float32))
    return tuple(carried + results)


def _scan(states, scan_inputs, body, num_outputs, in_axes, in_dirs, out_axes, out_dirs, xp):
    n_state = len(states)
    n_scan_in = len(scan_inputs)
    n_scan_out = num_outputs - n_state
    in_axes = list(in_axes or [0] * n_scan_in)
    in_dirs = list(in_dirs or [0] * n_scan_in)
    out_axes = list(out_axes or [0] * n_scan_out)
    out_dirs = list(out_dirs or [0] * n_scan_out)
    seqs = []
    for x, ax, d in zip(scan_inputs, in_axes, in_dirs):
        x = xp.moveaxis(x, ax % x.ndim, 0)
        seqs.append(x[::-1] if d else x)
    steps = seqs[0].shape[0] if seqs else 0
    states = list(states)
    acc: list[list] = [[] for _ in range(n_scan_out)]
    for t in range(steps):
        outs = body(*states, *[s[t] for s in seqs])
        states = list(outs[:n_state])
        for a, v in zip(acc, outs[n_state:]):
            a.append(v)
    results = []
    for a, ax, d in zip(acc, out_axes, out_dirs):
        y = xp.stack(a[::-1] if d else a)
        results.append(xp.moveaxis(y, 0, ax % y.ndim))
    return tuple(states + results)


@kernel("Scan", since=9, graph_attributes=("body",))
def scan(*inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, num_outputs, xp):
    n_state = len(inputs) - num_scan_inputs
    return _scan(inputs[:n_state], inputs[n_state:], body, num_outputs, scan_input_axes,
                 scan_input_directions, scan_output_axes, scan_output_directions, xp)


@kernel("Scan", since=8, graph_attributes=("body",))
def scan_8(sequence_lens, *inputs, body, num_scan_inputs, directions=None, num_outputs, xp):
    # Scan-8 has a leading batch axis on every input and output, and per-batch sequence lengths.
    n_state = len(inputs) - num_scan_inputs
    batch = inputs[0].shape[0]
    per_batch = []
    for b in range(batch):
        length = None if sequence_lens is None else int(sequence_lens[b])
        scans = [x[b][:length] if length is not None else x[b] for x in inputs[n_state:]]
        per_batch.append(_scan([x[b] for x in inputs[:n_state]], scans, body, num_outputs,
                               None, directions, None, None, xp))
    return tuple(xp.stack([r[i] for r in per_batch]) for i in range(num_outputs))
