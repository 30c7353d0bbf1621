"""MlxBackend on a device mesh (issue 20, Musts 2 and 4): ``device_mesh=(1,)`` is the plain path;
on 2 local processes joined by mlx.core.distributed's ring backend, data-parallel, fully sharded
and tensor-parallel training of the zoo's MLP and GPT equals one process (loss curve and final
parameters), fsdp and tensor parallel hold about half the parameter (and optimizer-slot) bytes
per process, evaluate's outputs and gradients are the whole batch's on every rank, mlx.launch
starts the ranks, and what MLX meshes do not run (pipeline, a mesh larger than the ring) is a
MeshError saying so.

The workers are started once (mithril.distributed.launch.spawn, bounded by TIMEOUT) and every
test reads their results; mlx.launch's run is ended within 60 s."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.distributed.launch import free_port, spawn
from mithril.errors import MeshError
from mithril.models import CrossEntropy, Mean, Model, TrainModel, Transpose
from mithril.optimizers import SGD, fit

mx = pytest.importorskip("mlx.core")
if not mx.distributed.is_available():
    pytest.skip("this mlx build has no mlx.core.distributed", allow_module_level=True)

NPROC, STEPS, TIMEOUT = 2, 20, 120


def _mlp_case():
    """As tests/distributed/test_jax.py: the zoo's MLP on 8 x 16 batches labelled by a linear teacher."""
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((16, 8))
    xs = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(STEPS)]
    batches = [{"input": x, "target": (x @ teacher).argmax(1)} for x in xs]
    return (lambda: models_zoo.mlp((64, 32, 8))), {"input": [8, 16], "target": [8]}, batches


def _gpt_case():
    """As tests/distributed/test_torch.py: the zoo's GPT (1 layer, 2 heads, 16 dims) learning each
    token's successor; logits [N, T, vocab] -> [N, vocab, T] for CrossEntropy."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 32, (2, 8)) for _ in range(4)]
    batches = [{"input": ids[i % 4], "target": (ids[i % 4] + 1) % 32} for i in range(STEPS)]

    def build():
        gpt = models_zoo.create_gpt(bias=True, block_size=8, dims=16, num_heads=2, num_layers=1, vocab_size=32)
        model = Model()
        model |= gpt(input="input", output="logits")
        model += Transpose(axes=(0, 2, 1))(output="output")
        return model

    return build, {"input": [2, 8], "target": [2, 8]}, batches


CASES = {"mlp": _mlp_case, "gpt": _gpt_case}
STRATEGIES = ("data", "fsdp", "tensor")


def _trainer(model, backend, shapes, **kwargs):
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    return ml.compile(tm, backend, shapes=shapes, data_keys={"input", "target"}, **kwargs)


def _numpy(backend, pm, values):
    """Whole arrays as NumPy (on a mesh, split parameters' parts gathered first)."""
    if pm.sharding is not None:
        values = backend.gather(values, pm.sharding)
    return {k: backend.to_numpy(v) for k, v in values.items()}


def _train(pm, backend, init, batches):
    """20 SGD steps with momentum: (final parameters, losses, bytes of parameters this process
    holds, and of the optimizer's slots after training: they follow the parameters' parts)."""
    params = pm.place(init)
    held = backend.per_device_bytes(params)[backend.rank]
    params, state, losses = fit(pm, params, lambda epoch: batches, SGD(0.1, momentum=0.9), 1, progress=False)
    slots = [v for k, slot in state.items() if k != "step" for v in slot.values()]
    assert backend.per_device_bytes(slots)[backend.rank] == held
    return _numpy(backend, pm, params), np.array(losses), held


def _forward_case(pm, backend, init, batch):
    """A TrainModel's evaluate on one batch: its outputs and gradients, as NumPy."""
    outputs, grads = pm.evaluate(pm.place(init), batch)
    return {k: backend.to_numpy(v) for k, v in outputs.items()}, _numpy(backend, pm, grads)


def _on_mesh(inits):
    """One worker: the mesh's checks, then per case and strategy one evaluate and 20 training steps."""
    backend = ml.MLXBackend(device_mesh=(NPROC,), device="cpu")
    out = {"rank": backend.rank, "mesh": (backend.mesh.axis_names, backend.device_mesh)}
    part = backend.ones(8, 4, tensor_split=(0,))
    out["part"] = (tuple(part.shape), tuple(backend.randn(6, 4, tensor_split=(None,)).shape))
    try:
        ml.MLXBackend(device_mesh=(4,), device="cpu")
    except MeshError as exc:
        out["too_large"] = str(exc)
    build, shapes, batches = _mlp_case()
    try:  # refused when compiled
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer(build(), backend, shapes, parallel="pipeline")
    except MeshError as exc:
        out["pipeline"] = str(exc)
    for case, init in inits.items():
        build, shapes, batches = CASES[case]()
        for strategy in STRATEGIES:
            pm = _trainer(build(), backend, shapes, parallel=strategy)
            run = out[f"{case}-{strategy}"] = {"step": _forward_case(pm, backend, init, batches[0]),
                                         "specs": dict(pm.sharding.specs),
                                         "planned": pm.sharding.per_device_bytes(),
                                         "source": pm.program.forward.tensor_source}
            if strategy != "data":  # evaluate takes whole parameters too, and refuses other shapes
                run["whole_step"] = _forward_case(pm, backend, {k: np.asarray(v) for k, v in init.items()},
                                                  batches[0])
                name = next(n for n in pm.sharding.specs if n in pm.sharding.shapes)
                try:
                    pm.evaluate({**pm.place(init), name: np.zeros((3,) * len(init[name].shape), np.float32)},
                                batches[0])
                except ml.MithrilError as exc:
                    run["bad_shape"] = str(exc)
            run["params"], run["losses"], run["held"] = _train(pm, backend, init, batches)
    return out


_RUN: dict = {}


def _reference(case):
    """One process: initial parameters, one evaluate, 20 steps, parameter bytes."""
    if case not in _RUN:
        build, shapes, batches = CASES[case]()
        backend = ml.MLXBackend(device="cpu", random_seed=0)
        pm = _trainer(build(), backend, shapes)
        init = {k: backend.to_numpy(v) for k, v in pm.randomize_params().items()}
        _RUN[case] = (init, _forward_case(pm, backend, init, batches[0]), *_train(pm, backend, init, batches))
    return _RUN[case]


def _mesh_run(tmp_path_factory):
    if "mesh" not in _RUN:
        inits = {case: _reference(case)[0] for case in CASES}
        hosts = tmp_path_factory.mktemp("ring") / "hosts.json"
        hosts.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(NPROC)]))
        _RUN["mesh"] = spawn(_on_mesh, NPROC, args=(inits,), timeout=TIMEOUT, env={"MLX_HOSTFILE": str(hosts)})
    return _RUN["mesh"]


def test_one_device_mesh_is_the_plain_path():
    """The design's ``MLXBackend(device_mesh=(1,))``: same results as no mesh, nothing split."""
    backend = ml.MLXBackend(device_mesh=(1,), device="cpu")
    assert backend.device_mesh == (1,) and backend.mesh.axis_names == ("data",) and backend.rank == 0
    model = models_zoo.mlp((8, 4))
    pm = ml.compile(model, backend, shapes={"input": [4, 6]})
    assert pm.sharding is None
    params = pm.randomize_params()
    x = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
    got = np.array(pm.evaluate(params, {"input": x})["output"])
    plain = ml.compile(model, ml.MLXBackend(device="cpu"), shapes={"input": [4, 6]})
    want = np.array(plain.evaluate({k: np.array(v) for k, v in params.items()}, {"input": x})["output"])
    np.testing.assert_array_equal(got, want)
    assert backend.ones(4, 2, device_mesh=(1,), tensor_split=(0,)).shape == (4, 2)


def test_a_mesh_outside_a_ring_says_how_to_launch(monkeypatch):
    for name in ("MLX_RANK", "MLX_HOSTFILE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(MeshError, match=r"device_mesh=\(2,\) runs over 2 processes.*mlx.launch --backend ring -n 2"):
        ml.MLXBackend(device_mesh=(2,), device="cpu")
    with pytest.raises(MeshError, match=r"needs a backend on that mesh: MlxBackend\(device_mesh=\(2,\)\)"):
        ml.MLXBackend(device="cpu").ones(4, 2, device_mesh=(2,))


RUNS = [(case, strategy) for case in CASES for strategy in STRATEGIES]


@pytest.mark.parametrize("case, strategy", RUNS, ids=[f"{c}-{s}" for c, s in RUNS])
def test_strategy_trains_as_one_process(tmp_path_factory, case, strategy):
    """20 SGD steps with momentum on 2 ring processes: data parallel (each rank half of every
    batch, gradients all_sum-ed) and tensor parallel (Megatron's column- then row-split Linear
    layers, attention heads, vocabulary-split embeddings); the one-process loss curve and final
    parameters on both ranks. Under tensor parallel each process holds only its part of the
    split weights: the MLP's all split (half the bytes), the GPT's but its layer norms and the
    row-split layers' biases."""
    init, _, want_params, want_losses, whole_bytes = _reference(case)
    assert want_losses[-1] < want_losses[0]
    for rank, got in enumerate(_mesh_run(tmp_path_factory)):
        assert got["rank"] == rank and got["mesh"] == (("data",), (NPROC,))
        run = got[f"{case}-{strategy}"]
        np.testing.assert_allclose(run["losses"], want_losses, rtol=2e-5, atol=2e-6, err_msg=f"rank {rank}")
        assert set(run["params"]) == set(want_params)
        for name, want in want_params.items():
            np.testing.assert_allclose(run["params"][name], want, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: {name}")
        split = [n for n in run["specs"] if n in init]
        split_bytes = sum(init[n].nbytes for n in split)
        assert run["held"] == (whole_bytes if strategy == "data" else whole_bytes - split_bytes // NPROC)
        assert run["held"] == run["planned"]  # as the ShardingPlan's table says
        if strategy == "fsdp":  # every parameter of both models has a dim that 2 divides
            assert split_bytes == whole_bytes and run["held"] == whole_bytes // NPROC
        if strategy == "tensor" and case == "mlp":
            assert split_bytes == whole_bytes - init["linear_1.bias"].nbytes  # all but the row-split bias


def test_tensor_parallel_splits_linear_layers_column_then_row(tmp_path_factory):
    """The MLP's Linear layers (weights [out, in]): the first and last split on output features
    (columns), the middle one on input features (rows), whose partial products meet in an
    all_sum; the logits split over the ranks are gathered before the loss. The data stays whole."""
    for got in _mesh_run(tmp_path_factory):
        run = got["mlp-tensor"]
        assert run["specs"] == {"linear_0.weight": ("data", None), "linear_0.bias": ("data",),
                                "linear_1.weight": (None, "data"), "linear_2.weight": ("data", None),
                                "linear_2.bias": ("data",)}
        source = run["source"]
        assert source.count("= matmul_add_column_split_") == 2 and source.count("= matmul_add_row_split_") == 1
        assert "_whole_features_" in source  # CrossEntropy reads the whole logits
        assert got["mlp-data"]["source"] is None  # data parallel runs the program as compiled


def test_tensor_parallel_splits_attention_heads_and_embeddings(tmp_path_factory):
    """The GPT: Q/K/V and the MLP's first Linear column-split, the attention output and the MLP's
    second row-split; the heads stay split through reshape, transposes, the attention matmuls
    and softmax (one rank computes one head); the token and position tables are split on their
    rows (vocabulary-parallel lookups summed over the ranks); the vocabulary-split logits are
    gathered once, before the loss's LogSoftmax."""
    for got in _mesh_run(tmp_path_factory):
        source = got["gpt-tensor"]["source"]
        assert source.count("_column_split_") == 5 and source.count("_row_split_") == 2  # lm_head: a MatMul
        assert source.count("_split_heads_") == 4  # q, k, v into heads; heads back into features
        assert source.count("_vocab_split_") == 2
        assert source.count("_whole_features_") == 1 and "= log_softmax_whole_features_" in source


@pytest.mark.parametrize("case, strategy", RUNS, ids=[f"{c}-{s}" for c, s in RUNS])
def test_evaluate_returns_the_whole_batch_on_every_rank(tmp_path_factory, case, strategy):
    """One evaluate of the TrainModel: the logits (gathered in rank order under data parallel,
    their features gathered under tensor parallel), the batch-mean loss and the parameters'
    gradients (a split parameter's as the part its process holds, gathered here) are the
    one-process values on every rank. Under tensor parallel, whole parameters given to evaluate
    give the same, and a parameter of neither shape is a ShapeError naming both."""
    (want_out, want_grads) = _reference(case)[1]
    for rank, got in enumerate(_mesh_run(tmp_path_factory)):
        run = got[f"{case}-{strategy}"]
        for outputs, grads in [run["step"]] + ([run["whole_step"]] if strategy != "data" else []):
            assert set(outputs) == set(want_out) and set(grads) == set(want_grads)
            for name, want in want_out.items():
                assert outputs[name].shape == want.shape, name
                np.testing.assert_allclose(outputs[name], want, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}: {name}")
            for name, want in want_grads.items():
                np.testing.assert_allclose(grads[name], want, rtol=1e-4, atol=1e-6, err_msg=f"rank {rank}: {name}")
        if strategy != "data":
            assert "this process's part on the mesh" in run["bad_shape"], run["bad_shape"]


def test_what_mlx_meshes_do_not_run_is_a_mesh_error(tmp_path_factory):
    for rank, got in enumerate(_mesh_run(tmp_path_factory)):
        assert got["part"] == ((4, 4), (6, 4))  # this rank's rows of a split array; a whole one whole
        assert "device_mesh=(4,) needs 4 processes, but the ring group has 2" in got["too_large"]
        assert "pipeline is not implemented on MLX" in got["pipeline"]


_LAUNCHED = r"""
import json
import numpy as np
import mithril as ml
import models_zoo
backend = ml.MLXBackend(device_mesh=(2,), device="cpu")
pm = ml.compile(models_zoo.mlp((8, 4)), backend, shapes={"input": [4, 6]})
x = np.arange(24, dtype=np.float32).reshape(4, 6) / 10
params = {k: np.linspace(-1, 1, v.size, dtype=np.float32).reshape(v.shape) for k, v in pm.get_parameters().items()}
out = np.array(pm.evaluate(params, {"input": x})["output"])
print(json.dumps({"rank": backend.rank, "output": out.tolist()}), flush=True)
"""


def test_processes_from_mlx_launch(tmp_path):
    """``mlx.launch --backend ring -n 2`` starts the ranks (its hostfile, MLX_RANK); each sees the
    whole batch's output of a data-parallel evaluate, equal to one process's. Ended within 60 s."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent)) or shutil.which("mlx.launch")
    if launcher is None:
        pytest.skip("mlx.launch (mlx's launcher script) is not installed next to this Python")
    script = tmp_path / "launched.py"
    script.write_text(_LAUNCHED)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    proc = subprocess.Popen([sys.executable, launcher, "--backend", "ring", "-n", "2", "--python", sys.executable,
                             "--starting-port", str(free_port()), str(script)], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    results = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1], out[-3000:]
    pm = ml.compile(models_zoo.mlp((8, 4)), ml.MLXBackend(device="cpu"), shapes={"input": [4, 6]})
    params = {k: np.linspace(-1, 1, v.size, dtype=np.float32).reshape(v.shape) for k, v in pm.get_parameters().items()}
    want = np.array(pm.evaluate(params, {"input": np.arange(24, dtype=np.float32).reshape(4, 6) / 10})["output"])
    for r in results:
        np.testing.assert_allclose(np.array(r["output"]), want, rtol=1e-6, atol=1e-6)
