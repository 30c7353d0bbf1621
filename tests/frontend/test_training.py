"""Training on every backend: TrainModel, LeNet-5 on scikit-learn's digits, step-by-step loss
agreement across backends, fine-tuning an imported ONNX LeNet, BatchNorm buffers in training."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.backends.table import BACKENDS
from mithril.errors import ModelError
from mithril.models import (
    L2,
    BatchNorm2D,
    Convolution2D,
    CrossEntropy,
    Dropout,
    Flatten,
    IOKey,
    Linear,
    Mean,
    Model,
    OnnxBlock,
    Relu,
    SquaredError,
    TrainModel,
)
from mithril.optimizers import Adam, fit

from tests.conftest import digits_32x32

BATCH = 64
N_TRAIN = 1500


def _backend(name: str, dtype=ml.float32):
    entry = BACKENDS[name]
    if not entry.installed():
        pytest.skip(f"{entry.array_modules[0]} is not installed")
    return entry.load()(dtype=dtype)


@functools.lru_cache(maxsize=None)
def _digits():
    return digits_32x32(N_TRAIN)


def _batches(backend, dtype=np.float32, shift: int = 2):
    """Shuffled batches of 64 (the last partial one dropped: shapes are static), each image moved
    by up to ``shift`` pixels: the test images are other writers', and the shifts carry LeNet past 95%."""
    xtr, ytr, _, _ = _digits()

    def batches(epoch):
        rng = np.random.default_rng(epoch)
        perm = rng.permutation(N_TRAIN)
        for i in range(0, N_TRAIN - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            x = xtr[idx]
            if shift:
                pad = np.pad(x, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
                at = rng.integers(0, 2 * shift + 1, (BATCH, 2))
                x = np.stack([pad[j, :, a:a + 32, b:b + 32] for j, (a, b) in enumerate(at)])
            yield {"input": backend.from_numpy(x.astype(dtype)), "target": backend.from_numpy(ytr[idx])}

    return batches


def _lenet_trainer(backend):
    tm = TrainModel(models_zoo.lenet(num_classes=10))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    return ml.compile(tm, backend, shapes={"input": [BATCH, 1, 32, 32], "target": [BATCH]},
                      data_keys={"input", "target"})


def _accuracy(model, backend, params) -> float:
    _, _, xte, yte = _digits()
    pm = ml.compile(model, backend, shapes={"input": list(xte.shape)}, inference=True)
    x = backend.from_numpy(xte.astype(backend.dtype.numpy))
    out = backend.to_numpy(pm.evaluate({k: params[k] for k in pm.parameter_keys}, {"input": x})["output"])
    return float((out.argmax(axis=1) == yte).mean())


def _train_lenet(backend, epochs: int, lr: float = 3e-3):
    pm = _lenet_trainer(backend)
    params = pm.randomize_params()  # the backend's seed 0: the same initial values everywhere
    steps = epochs * (N_TRAIN // BATCH)
    opt = Adam(lambda step: lr * (1 - step / steps))  # linear decay to 0
    params, _, losses = fit(pm, params, _batches(backend), opt, epochs, progress=False)
    return params, losses


# -- real training -----------------------------------------------------------------------------------
# 15 epochs (345 steps) of Adam with a linear decay from the backends' seed 0 (the same initial
# values everywhere) take every backend to 96.3%. Measured on two quiet cores: NumPy 6.7 s,
# Torch 4.6 s, JAX 7.6 s (jit), MLX 35 s (its CPU build's conv is slow).
EPOCHS, LR, BAR = 15, 3e-3, 0.95


@functools.lru_cache(maxsize=None)
def _trained(name: str):
    backend = _backend(name)
    params, losses = _train_lenet(backend, EPOCHS, LR)
    return backend, params, losses


_SAME_RUN_AGAIN = pytest.mark.long(reason="the same 15 epochs on another backend; the fast tier trains on JAX, "
                                          "and test_loss_agrees_with_jax_step_by_step checks NumPy, Torch and MLX "
                                          "step by step")


@pytest.mark.parametrize("name", ["jax", pytest.param("torch", marks=_SAME_RUN_AGAIN),
                                  pytest.param("mlx", marks=_SAME_RUN_AGAIN), pytest.param("numpy", marks=_SAME_RUN_AGAIN)])
def test_lenet_learns_digits(name):
    backend, params, losses = _trained(name)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    acc = _accuracy(models_zoo.lenet(num_classes=10), backend, params)
    assert acc >= BAR, f"{name}: test accuracy {acc:.3f} after {EPOCHS} epochs"


def _twenty_steps(backend, init):
    pm = _lenet_trainer(backend)
    params = {k: backend.from_numpy(v.astype(backend.dtype.numpy)) for k, v in init.items()}
    batches = _batches(backend, backend.dtype.numpy)
    first_20 = lambda epoch: (b for _, b in zip(range(20), batches(epoch)))  # noqa: E731
    return np.array(fit(pm, params, first_20, Adam(1e-3), 1, progress=False)[2])


@functools.lru_cache(maxsize=None)
def _jax_reference():
    reference = _backend("jax", ml.float64)
    init = {k: np.asarray(reference.to_numpy(v)) for k, v in _lenet_trainer(reference).randomize_params().items()}
    return init, _twenty_steps(reference, init)


@pytest.mark.parametrize("name", ["numpy", "torch", "mlx"])
def test_loss_agrees_with_jax_step_by_step(name):
    """Same initial parameters, same batches, Adam: the loss of 20 steps, float64 where the
    backend has it (agreement to 1e-9 relative), float32 on MLX (to 2e-4: float32 rounding, grown
    over 20 steps through Adam's normalisation, stays within that on this problem)."""
    dtype = ml.float32 if name == "mlx" else ml.float64
    other = _backend(name, dtype)
    init, want = _jax_reference()
    got = _twenty_steps(other, init)
    assert len(got) == 20 and want[-1] < want[0]
    np.testing.assert_allclose(got, want, rtol=1e-9 if dtype == ml.float64 else 2e-4)


# -- TrainModel ----------------------------------------------------------------------------------------
def _mlp():
    m = Model()
    m |= Linear(dimension=8, name="fc1")(input="input", output="hidden")
    m += Relu()
    m += Linear(dimension=3, name="fc2")(output="output")
    return m


@pytest.mark.parametrize("name", ["jax", "torch", "mlx", "numpy"])
def test_train_model_loss_regularization_and_gradients(name):
    backend = _backend(name, ml.float32 if name == "mlx" else ml.float64)
    shapes = {"input": [5, 4], "target": [5]}
    plain = TrainModel(_mlp())
    plain.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    reg = TrainModel(_mlp())
    reg.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    reg.add_regularization(L2(), coef=0.1, input=r"fc\d\.weight")
    pm0 = ml.compile(plain, backend, shapes=shapes, data_keys={"input", "target"})
    pm1 = ml.compile(reg, backend, shapes=shapes, data_keys={"input", "target"})
    infer = ml.compile(_mlp(), backend, shapes={"input": [5, 4]})
    assert pm1.parameter_keys == pm0.parameter_keys == infer.parameter_keys
    assert pm1.output_keys == ["output", "loss"] and pm1.loss_key == "loss"
    params = pm0.randomize_params()
    rng = np.random.default_rng(0)
    data = {"input": backend.from_numpy(rng.standard_normal((5, 4)).astype(backend.dtype.numpy)),
            "target": backend.from_numpy(np.array([0, 1, 2, 1, 0]))}
    out0, g0 = pm0.evaluate(params, data)
    out1, g1 = pm1.evaluate(params, data)
    assert set(pm1.trainable_keys) <= set(g1)
    p = {k: backend.to_numpy(v) for k, v in params.items()}
    penalty = 0.1 * 0.5 * sum(float(np.sum(p[k] ** 2)) for k in ("fc1.weight", "fc2.weight"))
    tol = dict(rtol=1e-4, atol=1e-5) if name == "mlx" else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(float(backend.to_numpy(out1["loss"])), float(backend.to_numpy(out0["loss"])) + penalty,
                               **tol)
    for k in pm1.trainable_keys:
        decay = 0.1 * p[k] if k.endswith("weight") else 0.0
        np.testing.assert_allclose(backend.to_numpy(g1[k]), backend.to_numpy(g0[k]) + decay, **tol, err_msg=k)
    # the logits equal the plain model's, by the same parameter keys
    np.testing.assert_allclose(backend.to_numpy(out1["output"]),
                               backend.to_numpy(infer.evaluate(params, {"input": data["input"]})["output"]), **tol)
    # inference=True: outputs alone (a validation loss)
    only = ml.compile(reg, backend, shapes=shapes, inference=True).evaluate(params, data)
    np.testing.assert_allclose(float(backend.to_numpy(only["loss"])), float(backend.to_numpy(out1["loss"])), **tol)


def test_train_model_exports_its_training_graph_and_onnxruntime_agrees(tmp_path):
    import onnxruntime as ort

    backend = ml.NumpyBackend(dtype=ml.float64)
    tm = TrainModel(_mlp())
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    tm.add_regularization(L2(), coef=0.1, input=r"fc\d\.weight")
    shapes = {"input": [5, 4], "target": [5]}
    pm = ml.compile(tm, backend, shapes=shapes, data_keys={"input", "target"})
    params = pm.randomize_params()
    rng = np.random.default_rng(1)
    data = {"input": rng.standard_normal((5, 4)), "target": np.array([2, 0, 1, 1, 0])}
    outputs, _ = pm.evaluate(params, data)
    path = tmp_path / "train.onnx"
    proto = ml.export_onnx(tm, path, shapes=shapes, params=params)
    assert [o.name for o in proto.graph.output] == ["output", "loss"]
    # float64 parameters export as float64 (never silently narrowed to the float32 default)
    assert {i.data_type for i in proto.graph.initializer if i.data_type in (1, 11)} == {11}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, data)))
    np.testing.assert_allclose(got["loss"], outputs["loss"], rtol=1e-12)
    np.testing.assert_allclose(got["output"], outputs["output"], rtol=1e-12)


def test_train_model_errors_name_the_problem():
    backend = _backend("jax")
    tm = TrainModel(_mlp())
    tm.add_loss(SquaredError(), input="output", target="target")
    with pytest.raises(ModelError, match=r"not a scalar; reduce it"):
        ml.compile(tm, backend, shapes={"input": [2, 4], "target": [2, 3]})
    tm = TrainModel(_mlp())
    tm.add_loss(CrossEntropy(), input="logits", target="target", reduce_steps=[Mean()])
    with pytest.raises(ModelError, match=r"'logits', which is not a value of the model"):
        ml.compile(tm, backend, shapes={"input": [2, 4], "target": [2]})
    tm = TrainModel(_mlp())
    tm.add_loss(CrossEntropy(), input="output", target="target", reduce_steps=[Mean()])
    tm.add_regularization(L2(), coef=1e-3, input="conv.*")
    with pytest.raises(ModelError, match=r"matches no trainable parameter"):
        ml.compile(tm, backend, shapes={"input": [2, 4], "target": [2]})
    with pytest.raises(ModelError, match="TrainModel has no loss"):
        ml.compile(TrainModel(_mlp()), backend, shapes={"input": [2, 4]})


def _bn_net(training: bool):
    m = Model()
    m |= Convolution2D(3, 4, padding=1, name="conv")(input=IOKey("input", shape=["N", 2, 6, 6]))
    m += BatchNorm2D(training=training, name="bn")
    m += Relu()
    m += Flatten(start_dim=1)
    m += Linear(3, name="fc")(output="output")
    return m


@pytest.mark.parametrize("name", ["jax", "torch", "mlx", "numpy"])
def test_batchnorm_buffers_update_in_training_and_freeze_in_inference(name):
    backend = _backend(name)
    tm = TrainModel(_bn_net(training=True))
    tm.add_loss(CrossEntropy(), input="output", target="target", reduce_steps=[Mean()])
    tm.add_regularization(L2(), coef=1e-3, input=".*")  # a regex over everything still skips buffers
    pm = ml.compile(tm, backend, shapes={"input": [8, 2, 6, 6], "target": [8]}, data_keys={"target"})
    assert pm.buffer_updates == {"bn.running_mean": "bn.running_mean_out", "bn.running_var": "bn.running_var_out"}
    assert not pm.trainable_keys & {"bn.running_mean", "bn.running_var"}
    assert {"bn.running_mean_out", "bn.running_var_out", "loss"} <= set(pm.output_keys)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 2, 6, 6)) * 3 + 1).astype(np.float32)
    data = {"input": backend.from_numpy(x), "target": backend.from_numpy(rng.integers(0, 3, 8))}
    params = pm.randomize_params()
    before = backend.to_numpy(params["bn.running_mean"]).copy()
    trained, _, _ = fit(pm, params, lambda epoch: [data], Adam(1e-2), 1, progress=False)
    after = backend.to_numpy(trained["bn.running_mean"])
    # the statistics fit wrote back are the update the training graph computed from the initial ones
    out, _ = pm.evaluate(params, data)
    np.testing.assert_allclose(after, backend.to_numpy(out["bn.running_mean_out"]), rtol=1e-6)
    assert not np.allclose(after, before)
    # inference: the same keys, the statistics are read, not updated
    infer = ml.compile(_bn_net(training=False), backend, shapes={"input": [8, 2, 6, 6]})
    assert set(infer.parameter_keys) == set(pm.parameter_keys)
    assert "bn.running_mean_out" not in infer.output_keys


def _dropout_net(training: bool):
    m = Model()
    m |= Linear(64, name="fc1")(input="input")
    m += Dropout(p=0.5, training=training)
    m += Linear(1, name="fc2")(output="output")
    return m


@pytest.mark.parametrize("name", ["numpy", "torch", "mlx", "jax"])
def test_dropout_follows_the_mode(name):
    backend = _backend(name)
    tm = TrainModel(_dropout_net(training=True))
    tm.add_loss(SquaredError(), input="output", target="target", reduce_steps=[Mean()])
    pm = ml.compile(tm, backend, shapes={"input": [16, 8], "target": [16, 1]}, data_keys={"target"})
    params = pm.randomize_params()
    rng = np.random.default_rng(0)
    data = {"input": backend.from_numpy(rng.standard_normal((16, 8)).astype(np.float32)),
            "target": backend.from_numpy(np.zeros((16, 1), np.float32))}
    infer = ml.compile(_dropout_net(training=False), backend, shapes={"input": [16, 8]})
    plain = backend.to_numpy(infer.evaluate(params, {"input": data["input"]})["output"])
    np.testing.assert_array_equal(backend.to_numpy(infer.evaluate(params, {"input": data["input"]})["output"]), plain)
    first, _ = pm.evaluate(params, data)
    second, _ = pm.evaluate(params, data)
    a, b = backend.to_numpy(first["output"]), backend.to_numpy(second["output"])
    assert not np.allclose(a, plain) and not np.allclose(a, b), "training mode drops a fresh mask each step"


# -- backend dtype -------------------------------------------------------------------------------------
def test_frontend_floats_follow_the_backend_dtype():
    pm = ml.compile(_mlp(), ml.NumpyBackend(dtype=ml.float64), shapes={"input": [2, 4]})
    params = pm.get_parameters()
    assert {v.dtype for v in params.values()} == {np.dtype(np.float64)}
    out = pm.evaluate(params, {"input": np.ones((2, 4))})["output"]
    assert out.dtype == np.float64
    assert ml.compile(_mlp(), ml.NumpyBackend(), shapes={"input": [2, 4]}).get_parameters()["fc1.weight"].dtype == \
        np.float32


# -- fine-tuning an imported ONNX model ----------------------------------------------------------------
def test_fine_tune_imported_lenet_then_export_matches_onnxruntime(tmp_path):
    """The JAX-trained LeNet, exported to ONNX and cut after its 84 features, becomes the backbone
    of a model with a new 10-class head; two epochs training the head give > 93%,
    and onnxruntime runs the export of the result to Mithril's outputs."""
    import onnx
    import onnxruntime as ort

    backend, pretrained, _ = _trained("jax")
    full = tmp_path / "lenet.onnx"
    ml.export_onnx(models_zoo.lenet(num_classes=10), full, shapes={"input": [1, 1, 32, 32]},
                   params=pretrained, dynamic_axes={"input": {0: "N"}})
    cut = tmp_path / "lenet_features.onnx"
    onnx.utils.extract_model(str(full), str(cut), ["input"], ["tanh_3.output"])
    backbone = ml.load_onnx(cut)

    model = Model()
    model |= OnnxBlock(backbone, name="backbone")(input="input", **{"tanh_3.output": "features"})
    model += Linear(dimension=10, name="head")(output="output")
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    tm.add_regularization(L2(), coef=1e-4, input=r"head\.weight")
    # the imported backbone stays frozen (its weights already know digits); the new head trains
    pm = ml.compile(tm, backend, shapes={"input": [BATCH, 1, 32, 32], "target": [BATCH]}, data_keys={"target"},
                    trainable_keys={"head.weight", "head.bias"})
    params = pm.get_parameters()  # imported weights for the backbone, fresh ones for the head
    np.testing.assert_array_equal(backend.to_numpy(params["backbone.fc1.weight"]), pretrained["fc1.weight"])
    steps = 2 * (N_TRAIN // BATCH)
    params, _, losses = fit(pm, params, _batches(backend), Adam(lambda t: 1e-2 * (1 - t / steps)), 2, progress=False)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    acc = _accuracy(model, backend, params)
    assert acc >= 0.93, f"fine-tuned accuracy {acc:.3f}"  # 95.3% with this seed; the backbone alone had 96.3%

    _, _, xte, _ = _digits()
    x = xte[:16].astype(np.float32)
    mine = backend.to_numpy(ml.compile(model, backend, shapes={"input": [16, 1, 32, 32]}).evaluate(
        params, {"input": backend.from_numpy(x)})["output"])
    out_path = tmp_path / "finetuned.onnx"
    ml.export_onnx(model, out_path, shapes={"input": [16, 1, 32, 32]},
                   params={k: backend.to_numpy(v) for k, v in params.items()})
    theirs = ort.InferenceSession(str(out_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(theirs, mine, rtol=1e-4, atol=1e-5)
