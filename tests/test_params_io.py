"""ml.save_params / ml.load_params: safetensors and npz, every dtype, across backends."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.params_io import ParamsFileError

ARRAYS = {
    "conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "f64": np.linspace(-1, 1, 5),
    "f16": np.array([1.5, -2.25], np.float16),
    "bf16": np.array([1.0, -3.5, 1e-3], ml_dtypes.bfloat16),
    "idx": np.array([[1, 2], [3, 4]], np.int64),
    "mask": np.array([True, False]),
    "scalar": np.float32(3.0),
}


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_round_trip_keeps_names_dtypes_shapes_values(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    ml.save_params(ARRAYS, path)
    got = ml.load_params(path)
    assert list(got) == list(ARRAYS)
    for k, want in ARRAYS.items():
        assert got[k].dtype == np.asarray(want).dtype, k
        assert got[k].shape == np.shape(want), k
        np.testing.assert_array_equal(got[k].astype(np.float64), np.asarray(want).astype(np.float64))


def test_safetensors_interop_with_the_reference_library(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is in the test extra")
    plain = {k: v for k, v in ARRAYS.items() if k != "bf16"}  # the numpy API of safetensors has no bfloat16
    ml.save_params(plain, tmp_path / "ours.safetensors")
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    for k, v in plain.items():
        np.testing.assert_array_equal(theirs[k], v)
    st.save_file({k: np.ascontiguousarray(v) for k, v in plain.items()}, str(tmp_path / "theirs.safetensors"))
    ours = ml.load_params(tmp_path / "theirs.safetensors")
    for k, v in plain.items():
        assert ours[k].dtype == np.asarray(v).dtype
        np.testing.assert_array_equal(ours[k], v)


def test_torch_bfloat16_and_safetensors_torch_reader(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    t = torch.tensor([1.0, -3.5, 0.1], dtype=torch.bfloat16)
    ml.save_params({"t": t}, tmp_path / "p.safetensors")
    assert torch.equal(st.load_file(str(tmp_path / "p.safetensors"))["t"], t)
    assert ml.load_params(tmp_path / "p.safetensors")["t"].dtype == ml_dtypes.bfloat16


def test_unknown_suffix_and_broken_file_are_errors(tmp_path):
    with pytest.raises(ParamsFileError, match=".safetensors or .npz"):
        ml.save_params({"a": np.ones(2)}, tmp_path / "p.bin")
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    with pytest.raises(ParamsFileError, match="not a safetensors file"):
        ml.load_params(tmp_path / "bad.safetensors")


def _backends():
    out = [ml.NumpyBackend()]
    for cls, mod in ((ml.JaxBackend, "jax"), (ml.TorchBackend, "torch"), (ml.MlxBackend, "mlx.core")):
        try:
            __import__(mod)
        except ImportError:
            continue
        out.append(cls())
    return out


def test_parameters_saved_on_one_backend_give_the_same_outputs_on_every_other(tmp_path):
    backends = _backends()
    if len(backends) < 2:
        pytest.skip("needs a second backend (jax, torch or mlx) to move parameters to")
    shapes = {"input": [4, 1, 32, 32]}
    x = np.random.default_rng(0).standard_normal((4, 1, 32, 32)).astype(np.float32)
    source = backends[-1]  # arrays of a framework, not NumPy, go to disk
    pm = ml.compile(models_zoo.lenet(num_classes=10), source, shapes=shapes)
    params = pm.randomize_params()
    want = source.to_numpy(pm.evaluate(params, {"input": source.from_numpy(x)})["output"])
    paths = [tmp_path / "lenet.safetensors", tmp_path / "lenet.npz"]
    for path in paths:
        ml.save_params(params, path)
    for backend in backends:
        target = ml.compile(models_zoo.lenet(num_classes=10), backend, shapes=shapes)
        for path in paths:
            loaded = ml.load_params(path, backend)
            assert set(loaded) == set(pm.parameter_keys)
            got = target.evaluate(loaded, {"input": backend.from_numpy(x)})["output"]
            np.testing.assert_allclose(backend.to_numpy(got), want, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{backend.name} {path.suffix}")
