"""mithril.optimizers step by step against optax (JAX), torch.optim (Torch) and mlx.optimizers (MLX)."""

from __future__ import annotations

import numpy as np
import pytest

from mithril.optimizers import SGD, Adam, AdamW

STEPS = 8
SHAPES = {"w": (3, 4), "b": (4,)}

CASES = {
    "sgd": dict(cls=SGD, kw=dict(lr=0.1)),
    "sgd_momentum": dict(cls=SGD, kw=dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov": dict(cls=SGD, kw=dict(lr=0.1, momentum=0.9, nesterov=True)),
    "adam": dict(cls=Adam, kw=dict(lr=0.01, betas=(0.9, 0.99), eps=1e-6)),
    "adamw": dict(cls=AdamW, kw=dict(lr=0.01, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-6)),
}


def _init():
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def _grads(params_np, step):
    # Depends on the parameters (so a wrong update compounds) and on the step (so moments matter).
    rng = np.random.default_rng(100 + step)
    return {k: 0.5 * params_np[k] + rng.standard_normal(params_np[k].shape) for k in sorted(params_np)}


def _run_mithril(case, to_array, to_numpy, params):
    opt = CASES[case]["cls"](**CASES[case]["kw"])
    params = {k: to_array(v) for k, v in params.items()}
    state = opt.init(params)
    trace = []
    for step in range(STEPS):
        grads = {k: to_array(v) for k, v in _grads({k: to_numpy(v) for k, v in params.items()}, step).items()}
        params, state = opt.update(params, grads, state)
        trace.append({k: to_numpy(v) for k, v in params.items()})
    return trace


def _optax_opt(case):
    import optax

    kw = CASES[case]["kw"]
    if case.startswith("sgd"):
        return optax.sgd(kw["lr"], momentum=kw.get("momentum") or None, nesterov=kw.get("nesterov", False))
    b1, b2 = kw["betas"]
    if case == "adam":
        return optax.adam(kw["lr"], b1=b1, b2=b2, eps=kw["eps"])
    return optax.adamw(kw["lr"], b1=b1, b2=b2, eps=kw["eps"], weight_decay=kw["weight_decay"])


@pytest.mark.parametrize("case", list(CASES))
def test_matches_optax_on_jax(case):
    jax = pytest.importorskip("jax")
    pytest.importorskip("optax", reason="optax is in the test extra: pip install optax")
    import jax.numpy as jnp
    import optax

    with jax.enable_x64(True):
        opt = _optax_opt(case)
        params = {k: jnp.asarray(v) for k, v in _init().items()}
        state = opt.init(params)
        want = []
        for step in range(STEPS):
            grads = {k: jnp.asarray(v) for k, v in _grads({k: np.asarray(v) for k, v in params.items()}, step).items()}
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            want.append({k: np.asarray(v) for k, v in params.items()})
        got = _run_mithril(case, jnp.asarray, np.asarray, _init())
    for step, (g, w) in enumerate(zip(got, want)):
        for k in w:
            assert g[k].dtype == np.float64
            np.testing.assert_allclose(g[k], w[k], rtol=1e-12, atol=1e-12, err_msg=f"step {step} {k}")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch_optim(case):
    torch = pytest.importorskip("torch")
    kw = CASES[case]["kw"]
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in _init().items()}
    if case.startswith("sgd"):
        opt = torch.optim.SGD(list(leaves.values()), lr=kw["lr"], momentum=kw.get("momentum", 0),
                              nesterov=kw.get("nesterov", False))
    elif case == "adam":
        opt = torch.optim.Adam(list(leaves.values()), lr=kw["lr"], betas=kw["betas"], eps=kw["eps"])
    else:
        opt = torch.optim.AdamW(list(leaves.values()), lr=kw["lr"], betas=kw["betas"], eps=kw["eps"],
                                weight_decay=kw["weight_decay"])
    want = []
    for step in range(STEPS):
        grads = _grads({k: v.detach().numpy() for k, v in leaves.items()}, step)
        for k, leaf in leaves.items():
            leaf.grad = torch.tensor(grads[k])
        opt.step()
        want.append({k: v.detach().numpy().copy() for k, v in leaves.items()})
    got = _run_mithril(case, torch.tensor, lambda t: t.numpy(), _init())
    for step, (g, w) in enumerate(zip(got, want)):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-12, atol=1e-12, err_msg=f"step {step} {k}")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_mlx_optimizers(case):
    mx = pytest.importorskip("mlx.core")
    import mlx.optimizers as mo

    kw = CASES[case]["kw"]
    if case.startswith("sgd"):
        opt = mo.SGD(kw["lr"], momentum=kw.get("momentum", 0.0), nesterov=kw.get("nesterov", False))
    elif case == "adam":
        opt = mo.Adam(kw["lr"], betas=list(kw["betas"]), eps=kw["eps"], bias_correction=True)
    else:
        opt = mo.AdamW(kw["lr"], betas=list(kw["betas"]), eps=kw["eps"], weight_decay=kw["weight_decay"],
                       bias_correction=True)
    f32 = {k: v.astype(np.float32) for k, v in _init().items()}
    params = {k: mx.array(v) for k, v in f32.items()}
    want = []
    for step in range(STEPS):
        grads = _grads({k: np.array(v) for k, v in params.items()}, step)
        params = opt.apply_gradients({k: mx.array(v.astype(np.float32)) for k, v in grads.items()}, params)
        want.append({k: np.array(v) for k, v in params.items()})
    got = _run_mithril(case, lambda v: mx.array(np.asarray(v, np.float32)), np.array, f32)
    # float32 throughout; mlx fuses the update differently, so a few ulps of float32 per step.
    for step, (g, w) in enumerate(zip(got, want)):
        for k in w:
            assert g[k].dtype == np.float32
            np.testing.assert_allclose(g[k], w[k], rtol=2e-5, atol=2e-6, err_msg=f"step {step} {k}")


@pytest.mark.parametrize("case", list(CASES))
def test_numpy_arrays_match_the_jax_run(case):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    with jax.enable_x64(True):
        want = _run_mithril(case, jnp.asarray, np.asarray, _init())
    got = _run_mithril(case, np.asarray, np.asarray, _init())
    for g, w in zip(got, want):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], rtol=1e-12, atol=1e-12)


def test_only_keys_with_gradients_change_and_schedules_apply():
    params = {"w": np.ones(2), "running_mean": np.zeros(2)}
    opt = SGD(lr=lambda step: 0.5 ** step)
    state = opt.init(params)
    for _ in range(3):
        params, state = opt.update(params, {"w": np.ones(2)}, state)
    assert params["w"].tolist() == [1 - 1 - 0.5 - 0.25] * 2
    assert params["running_mean"].tolist() == [0.0, 0.0]
    assert state["step"] == 3


@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "adamw"])
def test_lr_scale_matches_torch_param_groups(case):
    # lr_scale={"^b$": 0.1} is torch's two param groups: "w" at lr, "b" at lr / 10.
    torch = pytest.importorskip("torch")
    cls, kw = CASES[case]["cls"], dict(CASES[case]["kw"])
    lr = kw["lr"]
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in _init().items()}
    extra = {k: kw[k] for k in ("betas", "eps", "weight_decay", "momentum") if k in kw}
    groups = [{"params": [leaves["w"]], "lr": lr}, {"params": [leaves["b"]], "lr": lr * 0.1}]
    opt = {"sgd_momentum": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[case](groups, **extra)
    ours = cls(**kw, lr_scale={"^b$": 0.1})
    params = _init()
    state = ours.init(params)
    for step in range(STEPS):
        grads = _grads({k: v.detach().numpy() for k, v in leaves.items()}, step)
        for k, leaf in leaves.items():
            leaf.grad = torch.tensor(grads[k])
        opt.step()
        params, state = ours.update(params, _grads(params, step), state)
        for k in params:
            np.testing.assert_allclose(params[k], leaves[k].detach().numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"step {step} {k}")
