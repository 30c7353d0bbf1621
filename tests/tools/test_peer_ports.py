"""The framework-native peers of issue 21's benchmark (scripts/peers): each direct port of a
torchvision/transformers forward to jax.numpy and mlx.core computes what the torch module does,
on small inputs; and scripts/export_models.py's exports compute it too under onnxruntime."""

import functools
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the ports load their weights from torch modules")
pytest.importorskip("transformers", reason="BERT and GPT-2 are built from transformers configs")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import export_models  # noqa: E402
import peers  # noqa: E402

# Small inputs keep the file fast; the architectures (and GPT-2's 50,257-word head) are full size.
SMALL = {"resnet18": {"image_size": 64}, "mobilenet_v2": {"image_size": 64}, "bert_h256": {"seq": 16},
         "gpt2_h256": {"seq": 16}}
FRAMEWORK_MODULES = {"jax": ("jax", "the JAX port needs jax: pip install mithril[jax]"),
                     "mlx": ("mlx.core", "the MLX port needs mlx: pip install mithril[mlx]")}


@functools.lru_cache(maxsize=None)
def _model(name: str):
    ex = export_models.build(name, **SMALL[name])
    return ex, ex.run_torch()


@pytest.mark.parametrize("framework", peers.FRAMEWORKS)
@pytest.mark.parametrize("name", export_models.MODELS)
def test_port_matches_torch_module(name, framework):
    pytest.importorskip(*FRAMEWORK_MODULES[framework][:1], reason=FRAMEWORK_MODULES[framework][1])
    ex, ref = _model(name)
    outs = peers.make_peer(framework, name, ex.module)(ex.inputs)
    assert len(outs) == len(ex.output_names)
    for out, key in zip(outs, ex.output_names):
        assert out.shape == ref[key].shape and out.dtype == np.float32, key
        scale = max(1.0, float(np.abs(ref[key]).max()))
        np.testing.assert_allclose(out, ref[key], rtol=1e-4, atol=1e-4 * scale, err_msg=f"{name} {framework} {key}")


def test_port_sees_the_weights():
    # The port reads the module's state_dict when built: changed weights change its outputs as torch's.
    pytest.importorskip("jax", reason=FRAMEWORK_MODULES["jax"][1])
    import torch

    ex = export_models.build("mobilenet_v2", image_size=32, seed=1)
    before = peers.make_peer("jax", ex.name, ex.module)(ex.inputs)[0]
    with torch.no_grad():
        ex.module.classifier[1].bias.add_(1.0)
    after = peers.make_peer("jax", ex.name, ex.module)(ex.inputs)[0]
    np.testing.assert_allclose(after - before, np.ones_like(before), atol=1e-4)
    np.testing.assert_allclose(after, ex.run_torch()["output"], rtol=1e-4, atol=1e-4)


def test_unknown_model_is_refused():
    ex, _ = _model("resnet18")
    with pytest.raises(KeyError, match="no port of 'vgg16'"):
        peers.Peer(peers.make_ops("jax"), "vgg16", ex.module)


def test_export_runs_in_onnxruntime_like_the_module(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the exports are checked against onnxruntime")
    import onnx

    path, ex = export_models.export("mobilenet_v2", tmp_path, image_size=64)
    model = onnx.load(path)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [export_models.OPSET]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input"] and sess.get_inputs()[0].shape == [1, 3, 64, 64]
    (out,) = sess.run(None, ex.inputs)
    np.testing.assert_allclose(out, ex.run_torch()["output"], rtol=1e-4, atol=1e-5)


def test_interleaved_samples_take_turns_and_keep_every_call():
    import bench_peers

    calls = []

    def runner(name, seconds):
        def fn():
            calls.append(name)
            time.sleep(seconds)
        return fn

    samples = bench_peers.interleaved_samples({"fast": runner("fast", 0.002), "slow": runner("slow", 0.006)},
                                              warmup=1, min_runs=4, max_runs=50, row_seconds=0.2)
    assert all(len(v) >= 4 for v in samples.values())
    assert min(samples["slow"]) >= 0.006 and min(samples["fast"]) >= 0.002
    assert np.median(samples["slow"]) > np.median(samples["fast"])
    # turns: the runners alternate in blocks, not one after the other
    switches = sum(a != b for a, b in zip(calls, calls[1:]))
    assert switches >= 3


@pytest.mark.long(reason="runs scripts/bench_peers.py's timing rounds on a user's file (~30 s); the fast tier "
                         "keeps the table and argument tests")
def test_bench_peers_times_a_users_file_and_replaces_only_its_section(tmp_path, conv_model):
    # The whole path a user takes: --model FILE (onnxruntime and Mithril only), a 1-thread child
    # process, --write splicing "## Peers" into the document and keeping the rest.
    import subprocess

    import onnx

    model = tmp_path / "conv.onnx"
    onnx.save(conv_model, model)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Machine\n\nkept\n\n## Results\n\nalso kept\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_peers.py"
    proc = subprocess.run([sys.executable, str(script), "--models", "", "--model", str(model), "--threads", "1",
                           "--runtimes", "numpy,torch-eager", "--row-seconds", "0.2", "--min-runs", "2",
                           "--warmup", "1", "--write", "--output", str(doc)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = doc.read_text()
    assert text.startswith("# Performance\n\n## Machine\n\nkept\n")
    assert text.index("## Peers\n") < text.index("## Results\n\nalso kept")  # in the report's order
    assert "### Mithril NumPy\n" in text  # the per-backend table before the per-model ones
    assert "### conv.onnx (x [1, 4, 8, 8])" in text
    assert "| 1 | onnxruntime (numpy group) |" in text and "| 1 | Mithril NumPy |" in text
    assert re.search(r"\| 1 \| Mithril NumPy \|.*\| Conv \d+%", text), text  # its hot ops, by ml.profile
    timing = text.split("### conv.onnx")[1].split("### Resident memory")[0]
    assert "Torch eager" not in timing  # a user's file has no module to run
    assert "conv.onnx 1t [numpy] Mithril NumPy" in proc.stderr  # a progress line per measurement
    # Resident memory, one fresh process per runtime: onnxruntime and the Mithril backends asked for.
    memory = text.split("### Resident memory")[1]
    for runtime in ("onnxruntime", "numpy"):
        row = re.search(rf"\| conv.onnx \| {runtime} \| (\d+) \| (\d+) \| ", memory)
        assert row, memory
    assert "| conv.onnx | torch |" not in memory and "| conv.onnx | torch-eager |" not in memory


def test_compile_time_rows_judge_each_backend_against_its_bar(tmp_path, conv_model):
    # Must 4's section: load+compile and first call per backend, beside onnxruntime's session, each
    # judged against its bar (NumPy load+compile < 1 s; JAX's first call < 5 s), with its outputs checked.
    import argparse

    import bench_peers
    import onnx

    import mithril as ml

    model = tmp_path / "conv.onnx"
    onnx.save(conv_model, model)
    args = argparse.Namespace(threads=1)
    notes = []
    rows = bench_peers._compile_rows({"name": "conv.onnx", "path": str(model)}, {"numpy": ml.NumpyBackend()},
                                     args, notes)
    assert not notes and [r["runtime"] for r in rows] == ["onnxruntime", "numpy"]
    assert rows[1]["compile_s"] > 0 and rows[1]["first_s"] > 0 and rows[1]["diff"] < 1e-4
    table = bench_peers._compile_table(rows, "conv.onnx")
    assert any(re.fullmatch(r"\| Mithril NumPy \| [\d.]+ \| [\d.]+ \| load\+compile < 1 s \| met \| .*", line)
               for line in table), table
    slow = dict(rows[1], runtime="jax", first_s=7.5)
    assert "| first call < 5 s | missed |" in bench_peers._compile_table([rows[0], slow], "conv.onnx")[-1]


@pytest.mark.long(reason="scripts/bench_memory.py's peer rows start a fresh process per runtime (~100 s); "
                         "the fast tier keeps its argument and table tests")
def test_memory_rows_set_each_mithril_row_against_its_frameworks_peer(tmp_path):
    # The framework-native peers' resident memory measured as the backends' (a fresh process each),
    # each Mithril row divided by its framework's; peers only for built-in models, which they build
    # from the torch module.
    pytest.importorskip("jax", reason=FRAMEWORK_MODULES["jax"][1])
    import bench_memory

    path, _ = export_models.export("mobilenet_v2", tmp_path, image_size=64)
    found = bench_memory.rows({"mobilenet_v2": path, "theirs.onnx": path},
                              ["onnxruntime", "torch-eager", "jax-port-options", "jax"], progress=lambda s: None)
    by = {(r["model"], r["runtime"]): r for r in found}
    assert set(by) == {("mobilenet_v2", r) for r in ("onnxruntime", "torch-eager", "jax-port-options", "jax")} | {
        ("theirs.onnx", "onnxruntime"), ("theirs.onnx", "jax")}  # a user's file has no module to port
    for r in found:
        assert r["peak"] > 2**20 and r["after"] > 0, r  # the weights alone are 13.6 MiB
    jax_row = by[("mobilenet_v2", "jax")]
    assert jax_row["peer"] == "jax-port-options"
    assert jax_row["vs_peer"] == pytest.approx(jax_row["peak"] / by[("mobilenet_v2", "jax-port-options")]["peak"])
    assert "vs_peer" not in by[("theirs.onnx", "jax")]
    table = "\n".join(bench_memory.table(found))
    assert re.search(r"\| mobilenet_v2 \| jax \| \d+ \| \d+ \| [\d.]+x \| [\d.]+x jax-port-options \|", table), table
    assert "needs a built-in model" in bench_memory.measure(path, "torch-eager", name="theirs.onnx")["error"]


def test_bench_memory_refuses_what_it_cannot_measure(capsys):
    # A model that is neither a file nor a built-in name, and a runtime it does not know: argparse's
    # error naming both the input and what it takes, before any process starts.
    import bench_memory

    for argv, said, offered in ((["no_such_model.onnx"], "no_such_model.onnx: no such file, and not a built-in model",
                                 "mobilenet_v2"),
                                (["mobilenet_v2", "--runtimes", "onnxruntime,tvm"], "unknown runtime 'tvm'",
                                 "jax-port-options")):
        with pytest.raises(SystemExit) as exc:
            bench_memory.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert said in err and offered in err, err
