"""Parameter-only work, hoisted out of the per-call JAX program.

A lowered ONNX graph computes some values from its parameters alone: weights transposed or
packed into the layout a kernel wants (the CPU convolutions read theirs as ``(taps*C, M)`` or
per-tap channel vectors), casts of half-precision weights. Inside one jitted program XLA redoes
that work on every call: MobileNetV2's pointwise weights transposed and depthwise ones sliced
into per-tap vectors cost it 1.8 against 1.5 times onnxruntime's time.

``Hoisted`` splits the traced program in two by data dependence, the way a compiler hoists loop
invariants: a *prepare* program of the equations that read parameters (and constants) only, and
a *main* program of the rest, which reads prepare's results ("residuals") as inputs. Prepare
runs once per set of parameters: its residuals are kept while the caller passes the very same
(immutable) parameter arrays again. Equations that expand their input (a bias broadcast to an
activation's shape) stay in main, where XLA fuses them, instead of becoming a residual as large
as an activation.

Where XLA's dots read a transposed operand in place as fast (YNNPACK's), a large matrix transposed
only to be a dot's operand (a tied LM head, ``logits = h @ embedding.T``) is not copied into a
residual: the transpose stays in main, folded into the dot.

On the CPU, a prepare program made of rearrangements only (transposes, slices, reshapes: every
CNN's) runs in NumPy instead of XLA: the parameters are host memory there already (read in
place), and XLA would compile one kernel per weight for work done once. MobileNetV2's 221
rearrangements were 101 kernels: 1.5-2 s of its first call (3.2-3.7 -> 1.7-2.2 s) and about 80 MiB
of the process's peak memory (244-257 -> 155-180 MiB beside a started JAX).

Only forward evaluation is split; gradients differentiate the whole program.
"""

from __future__ import annotations

import math
import operator

import jax
import jax.extend.core as jcore
import numpy as np

from ..host_memory import aligned_copy


def _is_var(atom) -> bool:
    return not isinstance(atom, jcore.Literal)


def _jaxpr(constvars, invars, outvars, eqns, effects, debug_info):
    """A Jaxpr, with its DebugInfo where this jax has one (jax.extend.core.DebugInfo: jax 0.5.x on;
    newer versions warn without it)."""
    make_info = getattr(jcore, "DebugInfo", None)
    if make_info is None or debug_info is None:
        return jcore.Jaxpr(constvars, invars, outvars, eqns, effects)
    return jcore.Jaxpr(constvars, invars, outvars, eqns, effects, make_info(*debug_info))


# Primitives that stay in main although their inputs are known: they build values from nothing
# or from a scalar (cheap to recompute, and fused into their consumers by XLA).
_KEEP_IN_MAIN = frozenset({"broadcast_in_dim", "iota", "rng_bit_generator", "random_bits", "random_seed",
                           "random_wrap", "random_unwrap"})
# Layout-free changes of shape: free in main.
_BITCASTS = frozenset({"reshape", "squeeze", "expand_dims"})


def _size(aval) -> int:
    return math.prod(getattr(aval, "shape", ()))


def _hoistable(eqn, dot_only=frozenset()) -> bool:
    if eqn.effects or eqn.primitive.name in _KEEP_IN_MAIN:
        return False
    if eqn.primitive.name == "transpose" and eqn.outvars[0] in dot_only:
        return False  # read in place by the dot (see _Split)
    # A value no larger than what it reads: rearrangements, casts, reductions, slices.
    ins = sum(_size(v.aval) for v in eqn.invars if _is_var(v))
    return all(_size(v.aval) <= max(ins, 1) for v in eqn.outvars)


# Only matrices this large (elements) are read transposed in place: the copy they would need is
# memory worth saving (GPT-2's tied 50257x256 LM head: 49 MiB, its speed unchanged), while a small
# weight's transposed copy costs little and is measured no slower (MobileNetV2's pointwise ones).
_IN_PLACE_MIN_SIZE = 1 << 20


def _dot_only_transposes(jaxpr) -> frozenset:
    """The outputs of the large 2-D transposes in ``jaxpr`` that only dot_generals read."""
    readers: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if _is_var(v):
                readers.setdefault(v, set()).add(eqn.primitive.name)
    outputs = {v for v in jaxpr.outvars if _is_var(v)}
    return frozenset(eqn.outvars[0] for eqn in jaxpr.eqns
                     if eqn.primitive.name == "transpose" and len(eqn.outvars[0].aval.shape) == 2
                     and _size(eqn.outvars[0].aval) >= _IN_PLACE_MIN_SIZE
                     and eqn.outvars[0] not in outputs and readers.get(eqn.outvars[0]) == {"dot_general"})


def _host_slice(x, start_indices, limit_indices, strides=None):
    steps = strides or (1,) * len(start_indices)
    return x[tuple(slice(a, b, c) for a, b, c in zip(start_indices, limit_indices, steps))]


# The primitives a prepare program may run in NumPy on the host, and the parameters each rule reads
# (any other parameter must be None: a reshape's ``dimensions`` or ``sharding`` keeps it in XLA).
# Rearrangements only: NumPy gives the very values XLA would.
_HOST_RULES = {
    "transpose": (lambda x, permutation: np.transpose(x, permutation), {"permutation"}),
    "reshape": (lambda x, new_sizes: np.reshape(x, new_sizes), {"new_sizes"}),
    "squeeze": (lambda x, dimensions: np.squeeze(x, tuple(dimensions)), {"dimensions"}),
    "rev": (lambda x, dimensions: np.flip(x, tuple(dimensions)), {"dimensions"}),
    "slice": (_host_slice, {"start_indices", "limit_indices", "strides"}),
    "concatenate": (lambda *xs, dimension: np.concatenate(xs, axis=dimension), {"dimension"}),
}
_NESTED = frozenset({"jit", "pjit"})


def _runs_on_host(eqns) -> bool:
    """Whether every equation has a NumPy rule (nested jit calls looked into)."""
    for eqn in eqns:
        name = eqn.primitive.name
        if name in _NESTED:
            if not _runs_on_host(eqn.params["jaxpr"].jaxpr.eqns):
                return False
        elif name not in _HOST_RULES or any(
                v is not None for k, v in eqn.params.items() if k not in _HOST_RULES[name][1]):
            return False
    return True


def _eval_on_host(jaxpr, consts, args) -> list[np.ndarray]:
    """``jaxpr`` (every equation of it :func:`_runs_on_host`) evaluated in NumPy."""
    env = dict(zip(jaxpr.constvars, map(np.asarray, consts)))
    env.update(zip(jaxpr.invars, map(np.asarray, args)))

    def read(v):
        return np.asarray(v.val) if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _NESTED:
            inner = eqn.params["jaxpr"]
            outs = _eval_on_host(inner.jaxpr, inner.consts, ins)
        else:
            rule, names = _HOST_RULES[eqn.primitive.name]
            outs = [rule(*ins, **{k: v for k, v in eqn.params.items() if k in names})]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _host_readable(leaves, device) -> bool:
    """Whether these parameter leaves are host memory NumPy can read in place: NumPy arrays, or
    concrete JAX arrays on ``device`` (a CPU device) alone; not tracers."""
    for v in leaves:
        if isinstance(v, np.ndarray):
            continue
        if isinstance(v, jax.core.Tracer) or not isinstance(v, jax.Array) or v.devices() != {device}:
            return False
    return True


class _Split:
    """One trace of ``forward`` at one set of input shapes, cut into prepare and main."""

    def __init__(self, forward, params, data, transposed_dot_operands: bool = False):
        closed, out_shape = jax.make_jaxpr(forward, return_shape=True)(params, data)
        self.out_tree = jax.tree_util.tree_structure(out_shape)
        jaxpr = closed.jaxpr
        n_params = len(jax.tree_util.tree_leaves(params))
        param_vars = jaxpr.invars[:n_params]
        known = set(param_vars) | set(jaxpr.constvars)
        # Matrices transposed only to be a dot's operand: where the dot reads either layout as fast
        # (transposed_dot_operands), the transpose stays in main, where XLA folds it into the dot's
        # dimension numbers, instead of a transposed copy of the weight kept as a residual.
        dot_only = _dot_only_transposes(jaxpr) if transposed_dot_operands else frozenset()
        prepare, main = [], []
        for eqn in jaxpr.eqns:
            if _hoistable(eqn, dot_only) and all(not _is_var(v) or v in known for v in eqn.invars):
                prepare.append(eqn)
                known.update(eqn.outvars)
            else:
                main.append(eqn)
        # Reshapes at the end of prepare only copy a parameter: main does them for free (XLA makes
        # them bitcasts), and a residual would be a second copy of the weight in memory.
        # (Walked backwards, so a chain of them moves whole.)
        kept, moved, used = [], [], set()
        for eqn in reversed(prepare):
            if eqn.primitive.name in _BITCASTS and used.isdisjoint(eqn.outvars):
                moved.append(eqn)
            else:
                kept.append(eqn)
                used.update(v for v in eqn.invars if _is_var(v))
        prepare, main = kept[::-1], moved[::-1] + main
        produced = {v for e in prepare for v in e.outvars}
        needed = [v for e in main for v in e.invars if _is_var(v)]
        needed += [v for v in jaxpr.outvars if _is_var(v)]
        residuals = list(dict.fromkeys(v for v in needed if v in produced))
        # Main reads the parameters it uses and the residuals: one argument list, "state", so a
        # call passes no parameter that only prepare reads.
        used = set(needed)
        self.main_params = [i for i, v in enumerate(param_vars) if v in used]
        self.residual_bytes = sum(_size(v.aval) * np.dtype(v.aval.dtype).itemsize for v in residuals)
        info = getattr(jaxpr, "debug_info", None)
        names = tuple(info.arg_names) if info is not None and info.arg_names is not None else ("",) * len(jaxpr.invars)
        residual_names = tuple(f"residuals[{i}]" for i in range(len(residuals)))
        self._prepare = jcore.ClosedJaxpr(_jaxpr(
            jaxpr.constvars, param_vars, residuals, prepare, frozenset(),
            info and ("jit", f"prepare of {info.func_src_info}", names[:n_params], residual_names),
        ), closed.consts)
        # Rearrangements only: NumPy may run prepare on a host device (Hoisted.host_device).
        self.host_prepare = _runs_on_host(prepare)
        self._main = jcore.ClosedJaxpr(_jaxpr(
            jaxpr.constvars, [param_vars[i] for i in self.main_params] + residuals + list(jaxpr.invars[n_params:]),
            jaxpr.outvars, main, jaxpr.effects,
            info and ("jit", info.func_src_info,
                      tuple(names[i] for i in self.main_params) + residual_names + names[n_params:],
                      info.result_paths),
        ), closed.consts)

    def prepare(self, params):
        return jcore.jaxpr_as_fun(self._prepare)(*jax.tree_util.tree_leaves(params))

    def prepare_on_host(self, param_leaves, device) -> list:
        """prepare, evaluated in NumPy (host_prepare), its results put on ``device``."""
        # NumPy's rearrangements are views; each result is copied once (as XLA's program writes
        # it), into a buffer aligned as XLA:CPU aligns its own, which device_put adopts as it is.
        return [jax.device_put(aligned_copy(out), device)
                for out in _eval_on_host(self._prepare.jaxpr, self._prepare.consts, param_leaves)]

    def state(self, param_leaves, residuals) -> list:
        """Main's first argument: the parameters it reads, then the residuals."""
        return [param_leaves[i] for i in self.main_params] + list(residuals)

    def main(self, state, data):
        leaves = [*state, *jax.tree_util.tree_leaves(data)]
        return jax.tree_util.tree_unflatten(self.out_tree, jcore.jaxpr_as_fun(self._main)(*leaves))


def _data_key(data) -> tuple | None:
    """Names, shapes and dtypes of the data arrays; None when a value is no array (a sequence)."""
    key = tuple((k, getattr(v, "shape", None), getattr(v, "dtype", None)) for k, v in data.items())
    return None if any(shape is None for _, shape, _ in key) else key


def _avals(leaves) -> tuple:
    return tuple((tuple(v.shape), np.dtype(v.dtype)) for v in leaves)


class Hoisted:
    """``forward(params, data)`` run as jit(prepare)(params) -> residuals, kept while the same
    parameter arrays come back, and jit(main)(state, data), state being the parameters main reads
    and the residuals."""

    def __init__(self, forward, jit, transposed_dot_operands: bool = False, host_device=None):
        self.forward = forward
        self._jit = jit  # fn -> jitted fn (the backend's jax.jit with its compiler options)
        # Whether the dots read a transposed operand as fast as a contiguous one (YNNPACK's do):
        # then a weight transposed for a dot is not copied into a residual.
        self.transposed_dot_operands = transposed_dot_operands
        # A CPU device whose parameters NumPy reads in place: a prepare made of rearrangements runs
        # there in NumPy (module docstring); None: prepare is always a jitted program.
        self.host_device = host_device
        self._programs: dict = {}  # input structures and shapes -> (split, prepare, main)
        self._kept = None  # (parameter names, parameter arrays, data key, main's state, main) of the last call

    def programs(self, key):
        """The split at these input structures and shapes, and its two jitted programs."""
        found = self._programs.get(key)
        if found is None:
            (p_tree, p_avals), (d_tree, d_avals) = key
            params, data = (jax.tree_util.tree_unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in avals])
                            for tree, avals in ((p_tree, p_avals), (d_tree, d_avals)))
            split = _Split(self.forward, params, data, self.transposed_dot_operands)
            found = self._programs[key] = (split, self._jit(split.prepare), self._jit(split.main))
        return found

    def _key(self, params, data):
        param_leaves, p_tree = jax.tree_util.tree_flatten(params)
        data_leaves, d_tree = jax.tree_util.tree_flatten(data)
        return ((p_tree, _avals(param_leaves)), (d_tree, _avals(data_leaves))), param_leaves

    def lower(self, params, data):
        """The per-call (main) program at these inputs, lowered: what runs on every call."""
        key, param_leaves = self._key(params, data)
        split, prepare, main = self.programs(key)
        return main.lower(split.state(param_leaves, jax.eval_shape(prepare, params)), data)

    def prepared(self, params, data):
        """The per-call program at these inputs, its state (prepare run now) and the parameter leaves."""
        key, param_leaves = self._key(params, data)
        split, prepare, main = self.programs(key)
        if (self.host_device is not None and split.host_prepare
                and _host_readable(param_leaves, self.host_device)):
            residuals = split.prepare_on_host(param_leaves, self.host_device)
        else:
            residuals = prepare(params)
        return main, split.state(param_leaves, residuals), param_leaves

    def __call__(self, params, data):
        kept = self._kept
        # The very same parameter arrays as last time, and data of the same shapes: the kept
        # residuals hold. (Checked per call: a few microseconds for a hundred parameters.)
        if (kept is not None and isinstance(params, dict) and kept[0] == tuple(params)
                and all(map(operator.is_, kept[1], params.values()))
                and kept[2] is not None and kept[2] == _data_key(data)):
            return kept[4](kept[3], data)
        main, state, param_leaves = self.prepared(params, data)
        # Only immutable arrays may be recognised by identity: a NumPy array can change in place.
        if isinstance(params, dict) and all(isinstance(v, jax.Array) for v in param_leaves):
            self._kept = (tuple(params), list(params.values()), _data_key(data), state, main)
        else:
            self._kept = None
        return main(state, data)
