"""ml.save_params / ml.load_params: safetensors and npz, every dtype, across backends, and the
files of the safetensors library's own PyTorch, JAX and NumPy helpers."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import mithril as ml
import models_zoo
from mithril.params_io import ParamsFileError

ARRAYS = {
    "conv.weight": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "f64": np.linspace(-1, 1, 5),
    "f16": np.array([1.5, -2.25], np.float16),
    "bf16": np.array([1.0, -3.5, 1e-3], ml_dtypes.bfloat16),
    "f8e4m3": np.array([0.5, -448.0, 3.0], ml_dtypes.float8_e4m3fn),
    "f8e5m2": np.array([[0.25, -57344.0]], ml_dtypes.float8_e5m2),
    "idx": np.array([[1, 2], [3, 4]], np.int64),
    "u8": np.array([0, 255], np.uint8),
    "mask": np.array([True, False]),
    "empty": np.zeros((0, 3), np.float32),
    "scalar": np.float32(3.0),
}
# safetensors/safetensors#682: the library's NumPy reader has no float8
NUMPY_READS = [k for k in ARRAYS if not k.startswith("f8")]


def assert_same_bits(got: np.ndarray, want, key: str) -> None:
    want = np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), key
    assert got.tobytes() == want.tobytes(), key


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_round_trip_keeps_names_dtypes_shapes_values(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    ml.save_params(ARRAYS, path)
    got = ml.load_params(path)
    # safetensors keeps no order (the library sorts names); npz keeps the order saved
    assert list(got) == (sorted(ARRAYS) if suffix == ".safetensors" else list(ARRAYS))
    for k, want in ARRAYS.items():
        assert_same_bits(got[k], want, k)
    picked = ml.load_params(path, keys=["idx", "bf16", "f8e5m2"])
    assert list(picked) == ["idx", "bf16", "f8e5m2"]
    for k, v in picked.items():
        assert_same_bits(v, ARRAYS[k], k)


def test_safetensors_numpy_files_load_and_ours_load_there(tmp_path):
    ours = tmp_path / "ours.safetensors"
    ml.save_params(ARRAYS, ours)
    with safetensors.safe_open(ours, framework="numpy") as f:
        assert f.metadata() == {"format": "np"}
        for k in NUMPY_READS:
            assert_same_bits(f.get_tensor(k), ARRAYS[k], k)
    raw = dict(safetensors.deserialize(ours.read_bytes()))  # float8 as the library wrote it
    assert raw["f8e4m3"]["dtype"] == "F8_E4M3" and raw["f8e5m2"]["dtype"] == "F8_E5M2"
    assert bytes(raw["f8e4m3"]["data"]) == ARRAYS["f8e4m3"].tobytes()

    theirs = tmp_path / "theirs.safetensors"
    safetensors.numpy.save_file({k: np.asarray(v) for k, v in ARRAYS.items()}, theirs)
    got = ml.load_params(theirs)
    for k, v in ARRAYS.items():
        assert_same_bits(got[k], v, k)


def test_safetensors_torch_files_load_and_ours_load_there(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    theirs = {
        "bf16": torch.tensor([1.0, -3.5, 0.1, 3e38], dtype=torch.bfloat16),
        "f16": torch.tensor([[1.5, -2.25], [65504.0, 6e-8]], dtype=torch.float16),
        "f32": torch.linspace(-1, 1, 6).reshape(2, 3),
        "f8": torch.tensor([0.5, -448.0], dtype=torch.float8_e4m3fn),
        "i64": torch.arange(4),
        "mask": torch.tensor([True, False]),
    }
    numpy_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32,
                   "f8": ml_dtypes.float8_e4m3fn, "i64": np.int64, "mask": np.bool_}
    path = tmp_path / "torch.safetensors"
    st.save_file(theirs, path)
    got = ml.load_params(path)
    assert set(got) == set(theirs)
    for k, t in theirs.items():
        assert got[k].dtype == np.dtype(numpy_dtype[k]) and got[k].shape == tuple(t.shape), k
        assert got[k].tobytes() == t.view(torch.uint8).numpy().tobytes(), k

    ours = tmp_path / "ours.safetensors"
    # torch tensors in, through NumPy; the Torch backend has no float8 to NumPy, so that one goes in as loaded
    ml.save_params({k: got[k] if k == "f8" else t for k, t in theirs.items()}, ours)
    back = st.load_file(ours)
    with safetensors.safe_open(ours, framework="pt") as f:
        lazily = {k: f.get_tensor(k) for k in f.keys()}
    for k, t in theirs.items():
        for loaded in (back[k], lazily[k]):
            assert loaded.dtype == t.dtype and torch.equal(loaded.view(torch.uint8), t.view(torch.uint8)), k


def test_safetensors_flax_files_load_and_ours_load_there(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    stf = pytest.importorskip("safetensors.flax")
    theirs = {
        "bf16": jnp.array([1.0, -3.5, 0.1], jnp.bfloat16),
        "f16": jnp.array([1.5, -2.25], jnp.float16),
        "f32": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7,
        "i32": jnp.arange(4, dtype=jnp.int32),
        "mask": jnp.array([True, False]),
        "scalar": jnp.float32(2.5),
    }
    path = tmp_path / "flax.safetensors"
    stf.save_file(theirs, path)
    got = ml.load_params(path)
    for k, a in theirs.items():
        assert_same_bits(got[k], np.asarray(a), k)

    ours = tmp_path / "ours.safetensors"
    ml.save_params(theirs, ours)  # JAX arrays in
    back = stf.load_file(ours)
    with safetensors.safe_open(ours, framework="flax") as f:
        lazily = {k: f.get_tensor(k) for k in f.keys()}
    for k, a in theirs.items():
        for loaded in (back[k], lazily[k]):
            assert_same_bits(np.asarray(loaded), np.asarray(a), k)


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_keys_read_only_the_tensors_asked_for(tmp_path, suffix):
    path = tmp_path / f"big{suffix}"
    big = 64 * 2**20
    ml.save_params({"big": np.ones(big // 4, np.float32), "small": np.arange(3.0)}, path)

    def load_traced(**kwargs):
        tracemalloc.start()  # NumPy and bytearray buffers are traced, so a tensor read shows
        try:
            return ml.load_params(path, **kwargs), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    got, lazy_peak = load_traced(keys=["small"])
    np.testing.assert_array_equal(got["small"], np.arange(3.0))
    assert list(got) == ["small"]
    everything, full_peak = load_traced()
    assert everything["big"].nbytes == big and full_peak >= big  # the measure sees a read
    assert lazy_peak < big // 64, f"reading one small tensor peaked at {lazy_peak} bytes"


def test_unknown_suffix_unknown_key_and_unsupported_dtypes_are_errors(tmp_path):
    with pytest.raises(ParamsFileError, match=".safetensors or .npz"):
        ml.save_params({"a": np.ones(2)}, tmp_path / "p.bin")
    with pytest.raises(ParamsFileError, match=r"safetensors has no dtype for 'q' \(int4\)"):
        ml.save_params({"a": np.ones(2), "q": np.ones(2, ml_dtypes.int4)}, tmp_path / "q.safetensors")
    path = tmp_path / "p.safetensors"
    ml.save_params({"a": np.ones(2)}, path)
    with pytest.raises(ParamsFileError, match=r"p.safetensors has no tensor 'b'"):
        ml.load_params(path, keys=["a", "b"])
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    fp4 = torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)  # NumPy and ml_dtypes have no packed fp4
    st.save_file({"fp4": fp4}, tmp_path / "f4.safetensors")
    with pytest.raises(ParamsFileError, match=r"f4.safetensors: tensor 'fp4' has dtype F4, which NumPy cannot hold"):
        ml.load_params(tmp_path / "f4.safetensors")


def _corruptions(good: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "short": good[:5],
        "header cut": good[:20],
        "data cut": good[:-4],
        "bytes added": good + b"xx",
        "not json": b"\x05\x00\x00\x00\x00\x00\x00\x00nope!",
        "header length past the end": b"\xff" * 8 + good[8:],
    }


@pytest.mark.parametrize("case", list(_corruptions(b"")))
def test_truncated_or_corrupt_safetensors_is_a_params_file_error(tmp_path, case):
    good = tmp_path / "good.safetensors"
    ml.save_params({"w": np.arange(10, dtype=np.float32), "b": np.ones(3)}, good)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(_corruptions(good.read_bytes())[case])
    with pytest.raises(ParamsFileError, match=r"bad.safetensors is not a safetensors file: .*header") as info:
        ml.load_params(bad)
    assert info.value.__cause__ is None  # no library traceback to read through


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
