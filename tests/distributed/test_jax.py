"""Device meshes on JAX (issue 20): sharded arrays, and data / fully sharded / tensor parallel
training proven equal to one device, on JAX host devices (tests/conftest.py asks for four).

Each strategy trains for 20 steps from the same initial parameters on the same batches as the
one-device run; the loss curves and the final parameters must agree within float32 tolerance
(the partitioned program sums in another order, nothing else changes). ResNet-18 runs its own
rules (tensor parallel over Conv channels, fsdp) here and every strategy with
MITHRIL_LONG_TESTS=1, the long tier.
"""

from __future__ import annotations

import os
import re
import types
import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.errors import CompileError, MeshError, ReplicatedOpsWarning
from mithril.models import CrossEntropy, Mean, Model, OnnxBlock, TrainModel, Transpose
from mithril.optimizers import SGD, Adam, fit

jax = pytest.importorskip("jax")
if len(jax.devices("cpu")) < 4:  # JAX started before conftest could ask for host devices
    pytest.skip("needs 4 JAX host devices (XLA_FLAGS=--xla_force_host_platform_device_count=4 before JAX starts)",
                allow_module_level=True)

STEPS = 20


# -- meshes and sharded arrays ------------------------------------------------------------------------
def test_mesh_axes_and_sharded_creation():
    backend = ml.JaxBackend(device_mesh=(2, 2))
    assert backend.mesh.axis_names == ("data", "model") and backend.device_mesh == (2, 2)
    x = backend.ones(128, 64, device_mesh=(2, 2), tensor_split=(0, 1))
    assert x.shape == (128, 64) and {s.data.shape for s in x.addressable_shards} == {(64, 32)}
    assert np.asarray(x).sum() == 128 * 64
    # The design's form: dim 0 over the first axis; replicated over the second.
    y = ml.JaxBackend(device_mesh=(2,)).ones(128, 64, device_mesh=(2,), tensor_split=(0,))
    assert {s.data.shape for s in y.addressable_shards} == {(64, 64)} and len(y.sharding.device_set) == 2
    z = backend.randn(8, 6, tensor_split=(None, 0))  # whole over "data", rows over "model"
    assert {s.data.shape for s in z.addressable_shards} == {(4, 6)}
    named = ml.JaxBackend(device_mesh=(4,), axis_names=("batch",))
    assert named.mesh.axis_names == ("batch",)
    assert named.array(np.arange(3)).sharding.is_fully_replicated
    # array takes the same two arguments: each device holds its block of the data given.
    data = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    a = backend.array(data, device_mesh=(2, 2), tensor_split=(1, 0))  # columns over "data", rows over "model"
    assert {s.data.shape for s in a.addressable_shards} == {(4, 3)}
    for s in a.addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), data[s.index])
    rows = named.array([[1.0, 2.0]] * 4, tensor_split=(0,))  # Python floats take the backend's dtype
    assert rows.dtype == np.float32 and {s.data.shape for s in rows.addressable_shards} == {(1, 2)}
    with pytest.raises(MeshError, match=r"needs a backend on that mesh: JaxBackend\(device_mesh=\(2,\)\)"):
        named.array(data, device_mesh=(2,))
    with pytest.raises(MeshError, match=r"shape \(3,\) can't be split on dim 0 \(3\) over mesh axis 'batch'"):
        named.array([1, 2, 3], tensor_split=(0,))
    with pytest.raises(ml.errors.BackendOptionError, match="tensor_split needs a device_mesh"):
        ml.JaxBackend().array(data, tensor_split=(0,))


def test_mesh_errors_say_how_to_fix_them(monkeypatch):
    # Both causes hold here: conftest's XLA_FLAGS asks for 4, and JAX has started.
    with pytest.raises(MeshError, match=r"device_mesh=\(8,\) needs 8 devices, but jax sees 4 cpu device\(s\): "
                                        r"XLA_FLAGS asks for 4 host device\(s\) .*; JAX had already started in this "
                                        r"process\. .*in a new process, raise the count in XLA_FLAGS to "
                                        r"--xla_force_host_platform_device_count=8\.$"):
        ml.JaxBackend(device_mesh=(8,))
    # Before JAX starts, with the user's own smaller XLA_FLAGS count (kept as it is): only that cause.
    from mithril.backends.jax import mesh as jax_mesh
    from mithril.backends.mesh import parse_mesh

    monkeypatch.setattr(jax_mesh, "_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    eight = parse_mesh("JaxBackend", (8,))
    with pytest.raises(MeshError, match=r"jax sees 4 cpu device\(s\): XLA_FLAGS asks for 2 host device\(s\) "
                                        r"\(--xla_force_host_platform_device_count=2\)\. JAX makes host devices only "
                                        r"when it starts: raise the count in XLA_FLAGS to "
                                        r"--xla_force_host_platform_device_count=8\.$"):
        jax_mesh.build_mesh(jax, "cpu", eight, jax_mesh.ask_host_devices(jax, eight))
    monkeypatch.undo()
    # A GPU that is present, but fewer of them than the mesh: an error (not a silent move to the
    # CPU) naming the count and both ways out. A stand-in for jax with one GPU.
    one_gpu = types.SimpleNamespace(devices=lambda kind: [object()] if kind == "gpu" else jax.devices(kind))
    with pytest.raises(MeshError, match=r"^JaxBackend: device_mesh=\(2, 2\) needs 4 devices, but jax sees 1 gpu "
                                        r"device\(s\)\. Give a device_mesh of at most 1 device\(s\), or "
                                        r"device='cpu' to run the mesh over the CPU's host devices\.$"):
        jax_mesh.build_mesh(one_gpu, "gpu", parse_mesh("JaxBackend", (2, 2)))
    backend = ml.JaxBackend(device_mesh=(4,))
    with pytest.raises(MeshError, match=r"shape \(6, 2\) can't be split on dim 0 \(6\) over mesh axis 'data' of 4 "
                                        r"devices"):
        backend.ones(6, 2, tensor_split=(0,))
    with pytest.raises(MeshError, match=r"needs a backend on that mesh: JaxBackend\(device_mesh=\(2,\)\)"):
        backend.ones(4, 2, device_mesh=(2,))
    with pytest.raises(ml.errors.BackendOptionError, match="axis_names must be 2 distinct strings"):
        ml.JaxBackend(device_mesh=(2, 2), axis_names=("a", "a"))
    pm_args = dict(shapes={"input": [8, 16]})
    with pytest.raises(CompileError, match=r"parallel= splits a model over a device mesh, and JaxBackend has none"):
        ml.compile(models_zoo.mlp((8,)), ml.JaxBackend(), parallel="data", **pm_args)
    with pytest.raises(MeshError, match=r"puts tensor on axis 'model', but the mesh's axes are \('data',\)"):
        ml.compile(models_zoo.mlp((8,)), backend, parallel={"tensor": "model"}, **pm_args)
    with pytest.raises(MeshError, match=r"unknown parallel strategy 'zero2'"):
        ml.compile(models_zoo.mlp((8,)), backend, parallel="zero2", **pm_args)
    with pytest.raises(MeshError, match=r"the batch of input 'input' \(6, dim 0 of \(6, 16\)\) is not a multiple of "
                                        r"the 4 devices"):
        ml.compile(models_zoo.mlp((8,)), backend, shapes={"input": [6, 16]})
    with pytest.raises(MeshError, match=r"sharding rule 'nothing' matches no parameter or input"):
        ml.compile(models_zoo.mlp((8,)), backend, sharding={"nothing": ()}, **pm_args)


_FRESH = r"""
import warnings
import jax
import mithril as ml
from mithril.errors import DeviceFallbackWarning, MeshError
def mesh_error(shape):
    try:
        ml.JaxBackend(device_mesh=shape)
    except MeshError as e:
        return str(e)
    return "no error"
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    # No GPU for JAX here (the test runs the process with JAX_PLATFORMS=cpu): the backend falls
    # back to the CPU, which has the host devices it asked for.
    on_gpu = ml.JaxBackend(device="gpu", device_mesh=(2,))
print("fallback", any(issubclass(w.category, DeviceFallbackWarning) for w in seen), on_gpu._device.platform)
# Design 003's Device Mesh: (2,) then (2, 2) in one process.
print("devices", len(jax.devices("cpu")), ml.JaxBackend(device_mesh=(2, 2)).device_mesh)
print("error", mesh_error((16,)))
"""


def test_host_devices_in_a_fresh_process():
    """A fresh process (the test process has started JAX with conftest's 4 host devices): the first
    mesh asks JAX for 8 host devices, so a later, larger mesh finds its own, also when the device
    asked for (a GPU) is absent and the backend falls back to the CPU; past 8, the error says JAX
    had started (test_mesh_errors_say_how_to_fix_them checks the XLA_FLAGS cause). JAX_PLATFORMS=cpu
    hides a GPU, so the process sees what a machine without one does (with one GPU,
    device="gpu" and a mesh of 2 is a MeshError: test_initialization_reference_meshes)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", _FRESH], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert out["fallback"] == "True cpu"
    assert out["devices"] == "8 (2, 2)"
    assert re.fullmatch(r"JaxBackend: device_mesh=\(16,\) needs 16 devices, but jax sees 8 cpu device\(s\): JAX had "
                        r"already started in this process\. JAX makes host devices only when it starts: in a new "
                        r"process, run with XLA_FLAGS=--xla_force_host_platform_device_count=16, .*", out["error"])


def test_compile_takes_sharded_inputs_and_outputs_follow():
    """The design's "Parallel Evaluation": a model compiled for a mesh, parameters from the
    compiled model, a batch split with tensor_split; outputs equal the one-device run."""
    backend = ml.JaxBackend(device_mesh=(2,))
    model = models_zoo.mlp((64, 32))
    pm = ml.compile(model, backend, shapes={"input": [16, 24]})
    params = pm.randomize_params()
    x = backend.randn(16, 24, device_mesh=(2,), tensor_split=(0,))
    out = pm.evaluate(params, {"input": x})["output"]
    assert out.sharding.spec[0] == "data" and {s.data.shape for s in out.addressable_shards} == {(8, 32)}
    single = ml.compile(model, ml.JaxBackend(), shapes={"input": [16, 24]})
    want = single.evaluate({k: np.asarray(v) for k, v in params.items()}, {"input": np.asarray(x)})["output"]
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6, atol=1e-6)
    # NumPy data is placed by the plan (batch over "data"); so are NumPy parameters.
    out2 = pm.evaluate({k: np.asarray(v) for k, v in params.items()}, {"input": np.asarray(x)})["output"]
    assert out2.sharding.spec[0] == "data"
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


# -- strategies, each equal to one device --------------------------------------------------------------
def _trainer(model, backend, shapes, data_keys=("input", "target"), **kwargs):
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    return ml.compile(tm, backend, shapes=shapes, data_keys=set(data_keys), **kwargs)


def _mlp_case():
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((16, 8))  # a learnable target: the class a fixed linear map picks
    xs = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(STEPS)]
    batches = [{"input": x, "target": (x @ teacher).argmax(1)} for x in xs]
    return (lambda: models_zoo.mlp((64, 32, 8))), {"input": [8, 16], "target": [8]}, batches


def _gpt_case():
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 64, (4, 16)) for _ in range(STEPS)]
    batches = [{"input": x, "target": (x + 1) % 64} for x in ids]  # learnable: each id's successor
    def build():  # logits [N, T, vocab] -> [N, vocab, T]: CrossEntropy's classes are on axis 1
        gpt = models_zoo.create_gpt(bias=True, block_size=16, dims=32, num_heads=4, num_layers=2, vocab_size=64)
        model = Model()
        model |= gpt(input="input", output="logits")
        model += Transpose(axes=(0, 2, 1))(output="output")
        return model

    return build, {"input": [4, 16], "target": [4, 16]}, batches


_RESNET: dict = {}


def _resnet_case():
    """torchvision's ResNet-18 (random weights, batch norms folded by the exporter), imported from
    its torch.onnx export; 32x32 images, batch 4."""
    if "proto" not in _RESNET:
        pytest.importorskip("torch")
        from models_zoo import torch_reference

        _RESNET["proto"] = torch_reference.export_onnx(torch_reference.build("resnet18", image_size=32), "torchscript")
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((3 * 32 * 32, 10))
    xs = [rng.standard_normal((4, 3, 32, 32)).astype(np.float32) for _ in range(STEPS)]
    batches = [{"input": x, "target": (x.reshape(4, -1) @ teacher).argmax(1)} for x in xs]
    def build():
        model = Model()
        model |= OnnxBlock(ml.load_onnx(_RESNET["proto"]), name="resnet")(input="input", output="output")
        return model

    return build, {"input": [4, 3, 32, 32], "target": [4]}, batches


CASES = {"mlp": _mlp_case, "gpt": _gpt_case, "resnet18": _resnet_case}
# (strategy, mesh): data and fully sharded over 4 devices; tensor over 4; both over a 2x2 mesh; a
# pipeline of 4 stages, each batch in 4 micro-batches; a pipeline of 2 stages over the 2x2 mesh's
# "model" axis with each stage's micro-batch rows split over its "data" axis.
DATA_PIPELINE = {"data": "data", "pipeline": "model", "microbatches": 2}
STRATEGIES = [("data", (4,)), ("fsdp", (4,)), ("tensor", (4,)), ({"data": "data", "tensor": "model"}, (2, 2)),
              ("pipeline", (4,)), (DATA_PIPELINE, (2, 2))]


def _train(pm, backend, init, batches):
    params = {k: backend.array(v) for k, v in init.items()} if backend.mesh is None else pm.place(init)
    # SGD, not Adam: Adam divides each gradient by its own scale, so a gradient that is zero in exact
    # arithmetic (attention's key bias: softmax ignores a shift) becomes steps of float noise.
    # ResNet's pretrained-like start takes a small rate: at 0.01 its loss leapt to 11 by step 2, and
    # that chaos grew float32's summation-order noise (1e-6) to 1.4% by step 8 on an AVX2 EPYC; at
    # 0.003 it still grew to 7e-5 by step 18 on an AVX-512 Xeon.
    lr = 0.001 if any(k.startswith("resnet.") for k in params) else 0.1
    params, _, losses = fit(pm, params, lambda epoch: batches, SGD(lr, momentum=0.9), 1, progress=False)
    return {k: backend.to_numpy(v) for k, v in params.items()}, np.array(losses)


_REFERENCE: dict = {}


def _reference(case: str):
    if case not in _REFERENCE:
        build, shapes, batches = CASES[case]()
        backend = ml.JaxBackend()
        pm = _trainer(build(), backend, shapes)
        backend.set_seed(0)
        # The imported ResNet starts from its exported weights (torchvision's initialization, batch
        # norms folded); the zoo's models from the backend's seeded draws.
        init = {k: np.asarray(v) for k, v in (pm.get_parameters() if case == "resnet18" else
                                              pm.randomize_params()).items()}
        _REFERENCE[case] = (init, *_train(pm, backend, init, batches))
    return _REFERENCE[case]


@pytest.mark.parametrize("strategy, mesh", STRATEGIES, ids=["data", "fsdp", "tensor", "data+tensor", "pipeline",
                                                            "data+pipeline"])
@pytest.mark.parametrize("case", list(CASES))
def test_strategy_trains_like_one_device(case, strategy, mesh):
    if case == "resnet18" and strategy != "tensor" and os.environ.get("MITHRIL_LONG_TESTS") != "1":
        # tensor (Conv channels) is ResNet's own rule; fsdp splits its weights as it splits the MLP's
        # and GPT's, and so do the others. About 4 minutes on 2 cores: MITHRIL_LONG_TESTS=1 runs them.
        pytest.skip("ResNet-18 under data, fsdp, data+tensor and the pipelines runs in the long tier "
                    "(MITHRIL_LONG_TESTS=1)")
    init, want_params, want_losses = _reference(case)
    build, shapes, batches = CASES[case]()
    backend = ml.JaxBackend(device_mesh=mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplicatedOpsWarning)
        pm = _trainer(build(), backend, shapes, parallel=strategy)
    got_params, got_losses = _train(pm, backend, init, batches)
    assert want_losses[-1] < want_losses[0]
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5, atol=2e-6)
    for name, want in want_params.items():
        np.testing.assert_allclose(got_params[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    split = {n for n, spec in pm.sharding.specs.items() if n in want_params}
    if strategy in ("fsdp", "tensor") or isinstance(strategy, dict) and "tensor" in strategy:
        assert split, "the strategy split no parameter"
    if strategy == "pipeline":  # the parameters spread over the stages, each stage on its own device
        stages = pm.sharding.stages
        assert len(set(stages.values())) >= 3 and len(pm.sharding.pipeline.segments) == 4
        placed = pm.place(init)
        devices = {stages[k]: next(iter(v.sharding.device_set)) for k, v in placed.items()}
        assert len(set(devices.values())) == len(devices)
    if strategy == DATA_PIPELINE:  # 2 stages, each on a column of the 2x2 mesh, whole on its 2 devices
        placed = pm.place(init)
        groups = {frozenset(v.sharding.device_set) for v in placed.values()}
        assert len(groups) == 2 and all(len(g) == 2 for g in groups) and not set.intersection(*map(set, groups))
        assert all(v.sharding.is_fully_replicated for v in placed.values())
        outputs, _ = pm.evaluate(placed, batches[0])  # each stage's rows split over its data axis
        assert outputs["output"].sharding.spec[0] == "data", outputs["output"].sharding


def test_tensor_parallel_pairs_columns_then_rows():
    """Megatron's pairing on an MLP block and on attention: the first matmul of a pair split on its
    output features, the second on its input features, with their biases following."""
    backend = ml.JaxBackend(device_mesh=(2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplicatedOpsWarning)
        pm = ml.compile(models_zoo.mlp((64, 32, 8)), backend, shapes={"input": [8, 16]},
                        parallel={"data": "data", "tensor": "model"})
    specs = pm.sharding.specs
    # Linear weights are [out, in] (read through a Transpose): columns = dim 0, rows = dim 1.
    assert specs["linear_0.weight"] == ("model", None) and specs["linear_0.bias"] == ("model",)
    assert specs["linear_1.weight"] == (None, "model") and "linear_1.bias" not in specs
    assert specs["linear_2.weight"] == ("model", None)
    assert specs["input"] == ("data", None)
    gpt = _trainer(_gpt_case()[0](), backend, {"input": [4, 16], "target": [4, 16]}, parallel="tensor")
    assert gpt.sharding.specs["model_0.wte.weight"] == ("model", None)  # vocab-parallel embedding
    spec = gpt.sharding.specs.get  # absent: whole on every device
    for block in ("model_0.h.0", "model_0.h.1"):
        # Attention: q, k, v by columns (each device computes its heads: 2 of 4), the output
        # projection by rows (it sums the heads' parts); its bias added once, after the sum.
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert spec(f"{block}.attn.{proj}.weight") == ("model", None), proj
            assert spec(f"{block}.attn.{proj}.bias") == ("model",), proj
        assert spec(f"{block}.attn.out_proj.weight") == (None, "model")
        assert spec(f"{block}.attn.out_proj.bias") is None
        assert spec(f"{block}.mlp.linear_0.weight") == ("model", None)
        assert spec(f"{block}.mlp.linear_1.weight") == (None, "model")
    text = str(gpt.sharding)
    assert "mesh (data=2, model=2); tensor over 'model'" in text


def test_what_a_strategy_cannot_split_is_named_once():
    """A weight whose features don't divide over the axis stays whole on every device: one
    warning at compile lists each with why; the model still runs (replicated there)."""
    backend = ml.JaxBackend(device_mesh=(4,), axis_names=("model",))
    with pytest.warns(ReplicatedOpsWarning, match=r"tensor parallel leaves 1 parameter\(s\) whole on every device: "
                                                  r"linear_2.weight \(10, 32\): MatMulAdd output features 10 not a "
                                                  r"multiple of 4$"):
        pm = ml.compile(models_zoo.mlp((64, 32, 10)), backend, shapes={"input": [8, 16]}, parallel="tensor")
    params = pm.randomize_params()
    out = pm.evaluate(params, {"input": np.ones((8, 16), np.float32)})["output"]
    single = ml.compile(models_zoo.mlp((64, 32, 10)), ml.JaxBackend(), shapes={"input": [8, 16]})
    want = single.evaluate({k: np.asarray(v) for k, v in params.items()}, {"input": np.ones((8, 16), np.float32)})
    np.testing.assert_allclose(np.asarray(out), np.asarray(want["output"]), rtol=1e-5, atol=1e-6)


def test_fully_sharded_parameters_take_a_quarter_per_device(tmp_path):
    """ZeRO-3: each of 4 devices holds about a quarter of the parameters (measured from the arrays'
    shards), and the optimizer state follows the parameters. A checkpoint of the sharded run
    (save_params) holds whole arrays: it loads on one device, and back onto the mesh by the plan."""
    build, shapes, batches = _mlp_case()
    backend = ml.JaxBackend(device_mesh=(4,))
    with pytest.warns(ReplicatedOpsWarning, match=r"fsdp parallel leaves 1 parameter\(s\) whole on every device: "
                                                  r"linear_2.bias \(10,\): no dim of \(10,\) is a multiple of 4"):
        pm = _trainer(models_zoo.mlp((64, 32, 10)), backend, shapes, parallel="fsdp")
    params = pm.randomize_params()
    total = sum(np.asarray(v).nbytes for v in params.values())
    per_device = backend.per_device_bytes(params)
    assert len(per_device) == 4
    for used in per_device.values():
        assert used <= total / 4 + 64, (used, total)  # the 10-float bias is whole on each device
    assert max(per_device.values()) == pm.sharding.per_device_bytes()
    state = Adam(1e-3).init(params)
    assert max(backend.per_device_bytes(state["mu"]).values()) == max(per_device.values())

    path = tmp_path / "fsdp.safetensors"
    ml.save_params(params, path)
    single = ml.JaxBackend()
    loaded = ml.load_params(path, single)
    for name, v in params.items():
        assert len(loaded[name].sharding.device_set) == 1, name  # whole, on one device
        np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(v), err_msg=name)
    back = pm.place(ml.load_params(path))  # NumPy arrays, split again by the plan
    assert {k: v.sharding.spec for k, v in back.items()} == {k: v.sharding.spec for k, v in params.items()}
    assert backend.per_device_bytes(back) == per_device
    one = _trainer(models_zoo.mlp((64, 32, 10)), single, shapes)
    want = pm.evaluate(params, batches[0])  # outputs and gradients
    for got, exact in ((one.evaluate(loaded, batches[0]), False), (pm.evaluate(back, batches[0]), True)):
        for part, want_part in zip(got, want):
            for name, w in want_part.items():
                if exact:  # the same program on the same placement
                    np.testing.assert_array_equal(np.asarray(part[name]), np.asarray(w), err_msg=name)
                else:
                    np.testing.assert_allclose(np.asarray(part[name]), np.asarray(w), rtol=1e-5, atol=1e-6,
                                               err_msg=name)


def test_sharding_rules_override_by_name():
    backend = ml.JaxBackend(device_mesh=(2, 2))
    pm = ml.compile(models_zoo.mlp((64, 32)), backend, shapes={"input": [8, 16]},
                    sharding={r"linear_0\.weight": (None, "model"), "input": ()})
    assert pm.sharding.specs["linear_0.weight"] == (None, "model") and "input" not in pm.sharding.specs
    out = pm.evaluate(pm.get_parameters(), {"input": np.ones((8, 16), np.float32)})["output"]
    single = ml.compile(models_zoo.mlp((64, 32)), ml.JaxBackend(), shapes={"input": [8, 16]})
    want = single.evaluate({k: np.asarray(v) for k, v in pm.get_parameters().items()},
                           {"input": np.ones((8, 16), np.float32)})["output"]
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-6)
    with pytest.raises(MeshError, match=r"gives \('model',\) for 'linear_0.weight', which has 2 dims"):
        ml.compile(models_zoo.mlp((64, 32)), backend, shapes={"input": [8, 16]},
                   sharding={r"linear_0\.weight": ("model",)})


# -- two hosts ------------------------------------------------------------------------------------------
_HOST = r"""
import os, sys
rank, port = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # two devices per "host"
# The hosts' devices are CPUs: on a GPU machine both processes would otherwise take its GPU as
# jax's default (NCCL: "Duplicate GPU detected").
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")  # collectives between CPU processes
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=rank)
import numpy as np
import mithril as ml
sys.path.insert(0, os.getcwd())
from tests.distributed.test_jax import _mlp_case, _trainer, _train
build, shapes, batches = _mlp_case()
init, want = dict(np.load(sys.argv[3])), dict(np.load(sys.argv[4]))
for strategy in ("data", "fsdp"):
    backend = ml.JaxBackend(device_mesh=(4,))  # the mesh spans both processes' devices
    pm = _trainer(build(), backend, shapes, parallel=strategy)
    params, losses = _train(pm, backend, init, batches)
    diff = max(float(np.abs(params[k] - want[k]).max()) for k in want)
    print(strategy, rank, len(jax.devices()), len(jax.local_devices()), f"{diff:.3g}",
          " ".join(f"{x:.7f}" for x in losses), flush=True)
"""


def test_two_hosts_train_like_one_device(tmp_path):
    """Multi-host as JAX runs it: two processes ("hosts") of two devices each, joined by
    jax.distributed.initialize on localhost; a mesh of 4 spans both, and data parallel and fully
    sharded training give one device's loss curve on every process."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    init, want_params, want = _reference("mlp")
    np.savez(tmp_path / "init.npz", **init)
    np.savez(tmp_path / "want.npz", **want_params)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, "-c", _HOST, str(rank), str(port), str(tmp_path / "init.npz"),
                               str(tmp_path / "want.npz")],
                              cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    lines = [line.split() for out, _ in outs for line in out.splitlines() if line.startswith(("data", "fsdp"))]
    assert len(lines) == 4
    for strategy, rank, n_global, n_local, diff, *rest in lines:
        assert (n_global, n_local) == ("4", "2")
        assert float(diff) < 1e-4, f"{strategy} on process {rank}: final parameters differ by {diff}"
        losses = np.array([float(x) for x in rest[-STEPS:]])
        np.testing.assert_allclose(losses, want, rtol=2e-5, atol=2e-6, err_msg=f"{strategy} on process {rank}")


def test_pipeline_gradient_of_a_batched_input_joins_its_parts():
    """A data input's gradient under a pipeline is its micro-batches' rows joined (each part's
    rows are its own), not their sum; a parameter's gradient sums over the parts."""
    model = models_zoo.mlp((32, 8))
    shapes = {"input": [8, 16]}
    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    single = ml.compile(model, ml.JaxBackend(), shapes=shapes, data_keys={"input"})
    params = {k: np.asarray(v) for k, v in single.randomize_params().items()}
    cot = {"output": np.ones((8, 8), np.float32)}
    _, want = single.evaluate(params, {"input": x}, output_gradients=cot)
    pm = ml.compile(models_zoo.mlp((32, 8)), ml.JaxBackend(device_mesh=(2,)), shapes=shapes, data_keys={"input"},
                    parallel={"pipeline": "data", "microbatches": 4})
    _, got = pm.evaluate(params, {"input": x}, output_gradients=cot)
    assert np.shape(got["input"]) == (8, 16)
    for k, g in want.items():
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(g), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("parallel", ["data", "fsdp", "tensor", {"pipeline": "data", "microbatches": 2}])
def test_one_device_mesh_takes_every_strategy_as_the_plain_program(parallel):
    """A script written for N devices runs with N = 1: JaxBackend(device_mesh=(1,)) with any
    parallel= compiles the plain program (nothing to split), and a wrong option still fails."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    pm = ml.compile(models_zoo.mlp((8, 4)), ml.JaxBackend(device_mesh=(1,)), shapes={"input": [4, 6]},
                    parallel=parallel)
    assert pm.sharding is None
    params = pm.randomize_params()
    plain = ml.compile(models_zoo.mlp((8, 4)), ml.JaxBackend(), shapes={"input": [4, 6]})
    np.testing.assert_array_equal(np.asarray(pm.evaluate(params, {"input": x})["output"]),
                                  np.asarray(plain.evaluate(params, {"input": x})["output"]))
    with pytest.raises(MeshError, match=r"unknown parallel strategy 'dta'"):
        ml.compile(models_zoo.mlp((8, 4)), ml.JaxBackend(device_mesh=(1,)), shapes={"input": [4, 6]}, parallel="dta")
