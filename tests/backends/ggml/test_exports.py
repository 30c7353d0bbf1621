"""Real exports on GGMLBackend (issue 57, Must 1): models built in the test from their configs,
with random weights, exported as users export them, run on ggml and compared with onnxruntime.
timm's FastViT-T8 (TorchScript export: ggml aborted, its context out of memory) and RegNetX-002
(refused: 'a graph of 4944 ggml tensors is larger than the 4800 planned') by both torch.onnx
exporters and Ultralytics' YOLOv8n from its yaml run every node in ggml, in one graph; decoders
optimum-onnx exports with their key/value cache run with their integer bookkeeping on NumPy.

scripts/vision_export.py makes the timm and Ultralytics files (in a child process: timm and
Ultralytics live in .venv/vision, see there why), scripts/optimum_export.py the decoders (in
.venv/optimum-onnx). The fast tier exports RegNetX-002 by TorchScript; the long tier the rest."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mithril as ml

pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("torch", reason="the models are exported by torch.onnx")

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import optimum_export  # noqa: E402
import vision_export  # noqa: E402

from mithril.backends.ggml.program import GGMLFallbackWarning  # noqa: E402

_LONG = pytest.mark.long(reason="exports a model by torch.onnx in a child process (15-40 s each); the fast tier "
                                "runs RegNetX-002's TorchScript export")


def _export(tmp_path, *args) -> Path:
    if not vision_export.available():
        pytest.skip("timm, torchvision and ultralytics are not installed (scripts/dev.sh puts them in .venv/vision)")
    out = tmp_path / "model.onnx"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "vision_export.py"), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def _runs_in_ggml_as_onnxruntime(path: Path, feeds: dict, rtol=1e-3, native=True):
    """Compiled on GGMLBackend with every node in one ggml graph (``native``; else some on
    NumPy, with the usual warning), and its outputs those of onnxruntime (to ``rtol`` of each
    output's largest value)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error" if native else "ignore", GGMLFallbackWarning)
        pm = ml.compile(ml.load_onnx(str(path)), ml.GGMLBackend(), shapes={k: list(v.shape) for k, v in feeds.items()})
    assert pm.program.segments
    if native:
        assert not pm.program.fallback and len(pm.program.segments) == 1
    got = pm.evaluate(None, feeds)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for out, want in zip(sess.get_outputs(), sess.run(None, feeds)):
        np.testing.assert_allclose(got[out.name], want, rtol=rtol, atol=rtol * float(np.abs(want).max()),
                                   err_msg=out.name)


def _image(size):
    return {"x": np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)}


@pytest.mark.parametrize("name, exporter", [
    ("regnetx_002", "torchscript"),
    pytest.param("regnetx_002", "dynamo", marks=_LONG),
    pytest.param("fastvit_t8", "torchscript", marks=_LONG),
    pytest.param("fastvit_t8", "dynamo", marks=_LONG),
])
def test_timm_model_runs_in_ggml(tmp_path, name, exporter):
    path = _export(tmp_path, "--timm", name, "--exporter", exporter, "--size", "224")
    _runs_in_ggml_as_onnxruntime(path, _image(224))


@_LONG
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_ultralytics_yolo_runs_in_ggml(tmp_path, exporter):
    path = _export(tmp_path, "--ultralytics", "yolov8n.yaml", "--exporter", exporter, "--size", "160")
    _runs_in_ggml_as_onnxruntime(path, _image(160))


@_LONG
def test_optimum_decoders_with_their_cache_run_in_ggml(tmp_path):
    if not optimum_export.available():
        pytest.skip("optimum-onnx is not installed (scripts/dev.sh installs it in .venv/optimum-onnx)")
    archs = ("gpt2", "llama")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "optimum_export.py"), "--arch", ",".join(archs),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for arch in archs:
        path = tmp_path / arch / "onnx" / "model.onnx"
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        past, new = 5, 3
        feeds = {"input_ids": rng.integers(0, 300, (1, new)), "attention_mask": np.ones((1, past + new), np.int64)}
        for i in sess.get_inputs():
            if i.name == "position_ids":
                feeds[i.name] = np.arange(past, past + new, dtype=np.int64)[None]
            elif i.name.startswith("past"):
                feeds[i.name] = rng.standard_normal((1, i.shape[1], past, i.shape[3])).astype(np.float32)
        # The integer bookkeeping (int64 ids and masks reshaped, a 5-D gather of the heads) runs on NumPy.
        _runs_in_ggml_as_onnxruntime(path, feeds, native=False)
