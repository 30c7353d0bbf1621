"""The real-converter corpus (tests/data/real/, made by scripts/make_real_corpus.py): ONNX files
written by tf2onnx, paddle2onnx, skl2onnx, onnxscript and shipped inside PyPI wheels, each run on
NumPy, JAX, Torch and MLX and compared with onnxruntime under `ml.validate`'s per-dtype tolerances.

Inputs are the MANIFEST's: concrete shapes, and value ranges where a model needs them (silero's
sample rate, magika's byte values). The run itself is `mithril.conformance.real_mismatches`, the
same one that renders the real-models table of docs/conformance.md. Every case that cannot pass
is an xfail(strict=True) whose reason names the root cause and where it is to be fixed.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest

from mithril.backends.table import BACKENDS
from mithril.compile import JitFallbackWarning
from mithril.conformance import real_mismatches

DATA = Path(__file__).resolve().parents[1] / "data" / "real"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
ENTRIES = {e["file"]: e for e in MANIFEST["files"]}


# (file, backend or "*") -> why it fails today and where that is to be fixed.
XFAIL: dict[tuple[str, str], str] = {
    ("skl_scaler_ridge_double.onnx", "mlx"):
        "MLX has no float64 (its CPU path converts to float32): MlxBackend refuses the float64 input X with "
        "UnsupportedDTypeError, by design",
}


# The files whose C libraries take longest to build (8-25 s each on 2 cores): the long tier runs them
# on C (and `mithril conformance --real --backend c` does); the fast tier runs the other files on C,
# CNNs, recurrent, quantized, half-precision, signal and scikit-learn models among them.
SLOW_ON_C = {
    "wheel_rapidocr_ppocr_mobile_cls.onnx", "paddle_transformer.onnx", "paddle_upsample.onnx", "paddle_cnn.onnx",
    "keras_cnn.onnx", "wheel_silero_vad_16k_op15.onnx", "wheel_magika_standard_v1.onnx",
    "wheel_openwakeword_melspectrogram.onnx", "wheel_openwakeword_embedding.onnx", "onnxscript_local_functions.onnx",
    "tf_math_ops.onnx", "skl_pca_kmeans.onnx", "wheel_faster_whisper_silero_vad_v6.onnx", "keras_attention.onnx",
}
_SLOW_ON_C = pytest.mark.long(reason="C builds this file's library for 8-25 s; the fast tier runs the corpus's other "
                                     "files on C")


def _cases():
    for file in ENTRIES:
        for backend in BACKENDS:
            reason = XFAIL.get((file, backend)) or XFAIL.get((file, "*"))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            if backend == "c" and file in SLOW_ON_C:
                marks.append(_SLOW_ON_C)
            yield pytest.param(file, backend, marks=marks, id=f"{file.removesuffix('.onnx')}-{backend}")


@pytest.mark.parametrize("file,backend_name", list(_cases()))
def test_matches_onnxruntime(file, backend_name):
    entry = BACKENDS[backend_name]
    if not entry.installed():
        pytest.skip(f"backend {backend_name} needs the {entry.array_modules[0]} package, which is not installed")
    failures = real_mismatches(ENTRIES[file], entry.load()(), DATA)
    assert not failures, f"{file} on {backend_name}:\n" + "\n".join(failures)



@pytest.mark.parametrize("backend_name", ["jax", "mlx"])
@pytest.mark.parametrize("file", ["skl_knn.onnx", "skl_mlp.onnx"])
def test_sklearn_classifiers_run_jitted(file, backend_name):
    """ArrayFeatureExtractor reads class labels at ArgMax/TopK outputs: the indices stay traced
    values, so the whole graph compiles (no JitFallbackWarning) and still matches onnxruntime."""
    entry = BACKENDS[backend_name]
    if not entry.installed():
        pytest.skip(f"backend {backend_name} needs the {entry.array_modules[0]} package, which is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        failures = real_mismatches(ENTRIES[file], entry.load()(), DATA)
    assert not failures, f"{file} on {backend_name}:\n" + "\n".join(failures)

@pytest.mark.parametrize("file", list(ENTRIES))
def test_file_matches_manifest(file):
    entry = ENTRIES[file]
    data = (DATA / file).read_bytes()
    assert len(data) == entry["size"]
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{file} differs from its MANIFEST sha256"


def test_corpus_is_small_and_complete():
    on_disk = {p.name for p in DATA.glob("*.onnx")}
    assert on_disk == set(ENTRIES), f"files without a MANIFEST entry or missing: {on_disk ^ set(ENTRIES)}"
    assert sum(e["size"] for e in ENTRIES.values()) < 20_000_000
    assert all(e["size"] < 2_000_000 for e in ENTRIES.values())
    producers = {e["producer"]["tool"] for e in ENTRIES.values()}
    assert {"tf2onnx", "paddle2onnx", "skl2onnx", "onnxscript", "pip wheel"} <= producers
    assert sum(e["group"] == "wheels" for e in ENTRIES.values()) >= 6
