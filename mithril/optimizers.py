"""Optimizers over any backend's parameter dict, and :func:`fit`, a training loop with a progress bar.

An optimizer is a pair of pure functions: ``state = opt.init(params)`` and
``params, state = opt.update(params, grads, state)``. Parameters and gradients are dicts of
NumPy, JAX, torch or MLX arrays keyed by name; only parameters that have a gradient change (buffers
and frozen parameters pass through), and gradients of keys that are no parameters (a compiled
TrainModel also differentiates its floating ``data_keys`` inputs) are ignored. The arithmetic is the arrays' own (``+ - * /`` and their
framework's ``sqrt``), in the order optax, torch.optim and mlx.optimizers use.

>>> import numpy as np
>>> from mithril.optimizers import SGD
>>> opt = SGD(lr=0.1, momentum=0.9)
>>> params = {"w": np.array([1.0, 2.0])}
>>> state = opt.init(params)
>>> params, state = opt.update(params, {"w": np.array([1.0, -1.0])}, state)
>>> params["w"].tolist()
[0.9, 2.1]
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .backends.table import array_backend, arrays_of
from .errors import InputError, OptimizerError, public_api

Schedule = Callable[[int], float]


def _sqrt(x):
    return array_backend(x).sqrt(x)


def _zeros_like(x):
    return array_backend(x).zeros_like(x)


class Optimizer:
    r"""Base: ``lr`` is a number or a schedule ``step -> lr`` (step counts from 0).

    ``lr_scale`` gives parameter groups their own rate, as torch's param groups do: a mapping from
    a regular expression (searched in the parameter's name) to a multiplier of ``lr``; the first
    pattern that matches applies, parameters no pattern matches take ``lr`` itself. Fine-tuning a
    pretrained backbone at a tenth of the head's rate is ``Adam(1e-3, lr_scale={r"^backbone\.": 0.1})``.

    A subclass names its per-parameter slots (``slots``), the step's scalars (``_scalars``, plain
    floats) and the update of one parameter (``_apply_one``); the whole update is one program where
    the arrays' framework jits (``arrays.jit`` of its backend folder: on JAX one ``jax.jit``, as eager
    JAX dispatches each small op separately, which is slow)."""

    slots: tuple[str, ...] = ()

    def __init__(self, lr: float | Schedule, lr_scale: Mapping[str, float] | None = None):
        self.lr = lr
        self.lr_scale = {re.compile(k): float(v) for k, v in (lr_scale or {}).items()}
        self._scales: dict[str, float] = {}  # per parameter name, matched once, not every step
        self._jitted: dict[str, Callable] = {}  # per framework: its arrays module's jit of _apply

    def _scale(self, name: str) -> float:
        scale = self._scales.get(name)
        if scale is None:
            scale = self._scales[name] = next((s for p, s in self.lr_scale.items() if p.search(name)), 1.0)
        return scale

    def _lr(self, step: int) -> float:
        return float(self.lr(step)) if callable(self.lr) else float(self.lr)

    @public_api(OptimizerError, "Optimizer.init")
    def init(self, params: Mapping[str, Any]) -> dict:
        if not isinstance(params, Mapping):
            raise OptimizerError(f"init takes a dict of parameters, not {type(params).__name__}")
        with arrays_of(params.values()).update_scope():
            return {"step": 0, **{s: {k: _zeros_like(v) for k, v in params.items()} for s in self.slots}}

    @public_api(OptimizerError, "Optimizer.update")
    def update(self, params: Mapping[str, Any], grads: Mapping[str, Any], state: dict) -> tuple[dict, dict]:
        if not isinstance(state, Mapping) or "step" not in state or any(s not in state for s in self.slots):
            raise OptimizerError(f"state is not this optimizer's: make it with {type(self).__name__}.init(params)")
        # Gradients of keys that are no parameters (a TrainModel's data inputs) are not steps to take.
        grads = {k: g for k, g in grads.items() if k in params}
        stateless = [k for k in grads if any(k not in state[s] for s in self.slots)]
        if stateless:
            raise OptimizerError(f"parameter(s) {stateless[:5]} have gradients but no optimizer state: "
                                 f"init() was called without them")
        step = int(state["step"])
        scalars = self._scalars(step)
        p = {k: params[k] for k in grads}
        slots = {s: {k: state[s][k] for k in grads} for s in self.slots}
        arrays = arrays_of(grads.values())
        # Parameters on different devices (a pipeline's stages) update in one program per device set.
        groups = getattr(arrays, "device_groups", lambda values: [list(values)])(grads)
        new_p, new_slots = {}, {s: {} for s in self.slots}
        with arrays.update_scope():
            for keys in groups:
                gp, gs = self._program(arrays)({k: p[k] for k in keys}, {k: grads[k] for k in keys},
                                               {s: {k: slots[s][k] for k in keys} for s in self.slots}, scalars)
                new_p.update(gp)
                for s in self.slots:
                    new_slots[s].update(gs[s])
        params = {**params, **new_p}
        return params, {"step": step + 1, **{s: {**state[s], **new_slots[s]} for s in self.slots}}

    def _program(self, arrays):
        program = self._jitted.get(arrays.__name__)
        if program is None:
            program = self._jitted[arrays.__name__] = arrays.jit(self._apply)
        return program

    def _apply(self, params, grads, slots, scalars):
        new_p, new_slots = {}, {s: {} for s in self.slots}
        for k, g in grads.items():
            own = {s: slots[s][k] for s in self.slots}
            scale = self._scale(k)
            c = scalars if scale == 1.0 else {**scalars, "lr": scalars["lr"] * scale}
            new_p[k], own = self._apply_one(params[k], g, own, c)
            for s in self.slots:
                new_slots[s][k] = own[s]
        return new_p, new_slots

    def _scalars(self, step: int) -> dict[str, float]:
        return {"lr": self._lr(step)}

    def _apply_one(self, p, g, slots: dict, c: dict):
        raise NotImplementedError


class SGD(Optimizer):
    """``p -= lr * g``; with ``momentum``, ``t = momentum * t + g`` and ``p -= lr * t``
    (``nesterov``: ``p -= lr * (g + momentum * t)``), as torch.optim.SGD and optax.sgd."""

    def __init__(self, lr: float | Schedule, momentum: float = 0.0, nesterov: bool = False,
                 lr_scale: Mapping[str, float] | None = None):
        super().__init__(lr, lr_scale)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.slots = ("trace",) if self.momentum else ()

    def _apply_one(self, p, g, slots, c):
        if self.momentum:
            slots = {"trace": self.momentum * slots["trace"] + g}
            g = g + self.momentum * slots["trace"] if self.nesterov else slots["trace"]
        return p - c["lr"] * g, slots


class Adam(Optimizer):
    """Adam (Kingma & Ba): bias-corrected moments, ``p -= lr * m_hat / (sqrt(v_hat) + eps)``."""

    slots = ("mu", "nu")

    def __init__(self, lr: float | Schedule = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 lr_scale: Mapping[str, float] | None = None):
        super().__init__(lr, lr_scale)
        self.b1, self.b2 = (float(b) for b in betas)
        self.eps = float(eps)

    def _scalars(self, step):
        t = step + 1
        return {"lr": self._lr(step), "bc1": 1 - self.b1 ** t, "bc2": 1 - self.b2 ** t}

    def _direction(self, g, slots, c):
        mu = self.b1 * slots["mu"] + (1 - self.b1) * g
        nu = self.b2 * slots["nu"] + (1 - self.b2) * (g * g)
        return (mu / c["bc1"]) / (_sqrt(nu / c["bc2"]) + self.eps), {"mu": mu, "nu": nu}

    def _apply_one(self, p, g, slots, c):
        d, slots = self._direction(g, slots, c)
        return p - c["lr"] * d, slots


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    ``p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)``."""

    def __init__(self, lr: float | Schedule = 1e-3, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 lr_scale: Mapping[str, float] | None = None):
        super().__init__(lr, betas, eps, lr_scale)
        self.weight_decay = float(weight_decay)

    def _apply_one(self, p, g, slots, c):
        d, slots = self._direction(g, slots, c)
        return p - c["lr"] * (d + self.weight_decay * p), slots


# -- the training loop ------------------------------------------------------------------------------
@public_api(OptimizerError, "fit")
def fit(pm, params: Mapping[str, Any], batches: Callable[[int], Iterable[Mapping[str, Any]]], optimizer: Optimizer,
        epochs: int, state: dict | None = None, progress: bool = True,
        on_epoch: Callable[[int, float], None] | None = None) -> tuple[dict, dict, list[float]]:
    """Train a compiled :class:`~mithril.models.TrainModel` ``pm``: for each epoch, for each data
    dict of ``batches(epoch)``, evaluate the loss and gradients, step the optimizer on the trainable
    parameters and copy buffer updates (BatchNorm statistics) back. A rich progress bar shows the
    epoch, the step and the running loss. Returns ``(params, state, losses)``, one loss per step.
    """
    if getattr(pm, "loss_key", None) is None:
        raise InputError("fit trains a compiled TrainModel (ml.compile(TrainModel(model), ...)), "
                         f"not {type(pm).__name__}")
    backend = pm.backend
    params = dict(params)
    trainable = set(pm.trainable_keys)
    state = optimizer.init({k: v for k, v in params.items() if k in trainable}) if state is None else state
    losses: list[float] = []
    bar = _progress() if progress else None
    with bar or contextlib.nullcontext():
        task = bar.add_task("training", total=epochs) if bar else None
        for epoch in range(epochs):
            epoch_losses = []
            for data in batches(epoch):
                outputs, grads = pm.evaluate(params, data)
                with backend.scope():
                    params, state = optimizer.update(params, {k: g for k, g in grads.items() if k in trainable},
                                                     state)
                for buf, out in pm.buffer_updates.items():
                    params[buf] = outputs[out]
                loss = float(backend.to_numpy(outputs[pm.loss_key]))
                losses.append(loss)
                epoch_losses.append(loss)
                if bar:
                    bar.update(task, description=f"epoch {epoch + 1}/{epochs} loss {loss:.4f}")
            mean = float(np.mean(epoch_losses)) if epoch_losses else math.nan
            if bar:
                bar.update(task, advance=1, description=f"epoch {epoch + 1}/{epochs} loss {mean:.4f}")
            if on_epoch is not None:
                on_epoch(epoch, mean)
    return params, state, losses


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False)


__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "fit"]
