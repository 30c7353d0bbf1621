"""The real-converter corpus (tests/data/real/, made by scripts/make_real_corpus.py): ONNX files
written by tf2onnx, paddle2onnx, skl2onnx, onnxscript and shipped inside PyPI wheels, each run on
NumPy, JAX, Torch and MLX and compared with onnxruntime under `ml.validate`'s per-dtype tolerances.

Inputs are the MANIFEST's: concrete shapes, and value ranges where a model needs them (silero's
sample rate, magika's byte values). Every case that cannot pass is an xfail(strict=True) whose
reason names the root cause and where it is to be fixed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

import mithril as ml
from mithril.validate import compare

ort = pytest.importorskip("onnxruntime")

DATA = Path(__file__).parent / "data" / "real"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text())
ENTRIES = {e["file"]: e for e in MANIFEST["files"]}

# name -> (backend class name, the package it needs)
BACKENDS = {"numpy": ("NumpyBackend", "numpy"), "jax": ("JaxBackend", "jax"), "torch": ("TorchBackend", "torch"),
            "mlx": ("MlxBackend", "mlx")}

# (file, backend or "*") -> why it fails today and where that is to be fixed.
XFAIL: dict[tuple[str, str], str] = {
    ("wheel_onnxruntime_logreg_iris.onnx", "*"):
        "ai.onnx.ml LinearClassifier (mithril/backends/kernels/ml.py): the shipped file is inconsistent, 12 "
        "coefficients for 3 classes but a [3, 2] input; onnxruntime reads coefficients row-major as "
        "[n_classes, n_features of X] (its first 6 values) while ml.py reshapes them to [n_classes, -1] = [3, 4] "
        "and its matmul fails on the [3, 2] input. ml.py should read them as onnxruntime does",
}


def make_inputs(entry: dict) -> dict[str, np.ndarray]:
    """Deterministic inputs from the MANIFEST spec, seeded by the file name."""
    rng = np.random.default_rng(zlib.crc32(entry["file"].encode()))
    out = {}
    for name, spec in entry["inputs"].items():
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if "value" in spec:
            arr = np.full(shape, spec["value"], dtype)
        elif "low" in spec:
            arr = rng.uniform(spec["low"], spec["high"], shape)
            arr = np.floor(arr) if spec.get("integer") else arr
        elif dtype.kind == "f":
            arr = rng.standard_normal(shape)
        else:
            arr = rng.integers(0, 10, shape)
        out[name] = np.asarray(arr).astype(dtype)
    return out


def reference(path: Path, inputs: dict[str, np.ndarray]) -> tuple[list[str], list]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ml.validate runs it
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(names, inputs)


def as_array(value) -> np.ndarray:
    """A sequence of maps (skl2onnx's ZipMap) becomes its keys checked by the caller and values as rows."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        return np.array([[row[k] for k in sorted(row)] for row in value], dtype=np.float32)
    return np.asarray(value)


def map_keys(value):
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        return [sorted(row) for row in value]
    return None


def _cases():
    for file in ENTRIES:
        for backend in BACKENDS:
            reason = XFAIL.get((file, backend)) or XFAIL.get((file, "*"))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(file, backend, marks=marks, id=f"{file.removesuffix('.onnx')}-{backend}")


@pytest.mark.parametrize("file,backend_name", list(_cases()))
def test_matches_onnxruntime(file, backend_name):
    cls, pkg = BACKENDS[backend_name]
    if importlib.util.find_spec(pkg) is None:
        pytest.skip(f"backend {backend_name} needs the {pkg} package, which is not installed")
    entry = ENTRIES[file]
    path = DATA / file
    inputs = make_inputs(entry)
    names, ref = reference(path, inputs)

    backend = getattr(ml, cls)()
    model = ml.load_onnx(str(path))
    pm = ml.compile(model, backend, shapes={k: v["shape"] for k, v in entry["inputs"].items()})
    got = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in inputs.items()})

    failures = []
    for name, r in zip(names, ref):
        g = got[name]
        if map_keys(r) is not None:
            if map_keys(g) != map_keys(r):
                failures.append(f"{name}: ZipMap keys {map_keys(g)[:1]} != onnxruntime's {map_keys(r)[:1]}")
                continue
            rep = compare(name, backend_name, as_array(g), as_array(r))
        else:
            rep = compare(name, backend_name, backend.to_numpy(g), np.asarray(r))
        if not rep.passed:
            failures.append(f"{name}: {list(rep.shape)} {rep.dtype} max abs err {rep.max_abs_err:.3g}, "
                            f"max rel err {rep.max_rel_err:.3g} (rtol {rep.rtol:g}, atol {rep.atol:g}) {rep.note}")
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
    assert {"tf2onnx", "skl2onnx", "onnxscript", "pip wheel"} <= producers
    assert sum(e["group"] == "wheels" for e in ENTRIES.values()) >= 6
