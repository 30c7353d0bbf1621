"""The design documents' backend tensor API, typed in as a user would (issue 22, Must 5).

Every call the documents make on a backend (``backend.zeros(3, 3)``, ``backend.ones(3, 3,
device="cpu")``, ``backend.random_normal(subkey, shape=(3, 4))``, ``backend.dtype(tensor)``...)
runs on every backend, NumPy, JAX, PyTorch and MLX, with the same names and arguments; each test
names the document and section it types in and checks values, dtypes and shapes.
"""

from __future__ import annotations

import pickle

import jax
import mlx.core as mx
import numpy as np
import pytest
import torch

import mithril as ml
from mithril.backends import Backend, MLXBackend
from mithril.errors import DeviceFallbackWarning

MAKERS = {"numpy": ml.NumpyBackend, "jax": ml.JaxBackend, "torch": ml.TorchBackend, "mlx": MLXBackend}
# Each framework's array type: what the tensor API returns on that backend.
NATIVE = {"numpy": np.ndarray, "jax": jax.Array, "torch": torch.Tensor, "mlx": mx.array}
# An accelerator name in each backend's spelling, absent on this machine (checked below).
ACCELERATOR = {"numpy": "cuda", "jax": "gpu", "torch": "cuda", "mlx": "gpu"}


@pytest.fixture(params=list(MAKERS))
def named_backend(request):
    return request.param, MAKERS[request.param](dtype=ml.float32)


def host(backend, x) -> np.ndarray:
    return np.asarray(backend.to_numpy(x))


def test_creating_tensors(named_backend):
    """001 backends, "Creating Tensors"; 003 JAX backend, "Creating Tensors": zeros, ones,
    randn, rand, arange, array from NumPy and the ``dtype=`` forms."""
    name, backend = named_backend
    zeros = backend.zeros(3, 3)
    ones = backend.ones(3, 3)
    random = backend.randn(3, 3)
    arange = backend.arange(10)
    float16_tensor = backend.ones(3, 3, dtype=ml.float16)
    for t in (zeros, ones, random, arange, float16_tensor):
        assert isinstance(t, NATIVE[name])
    assert host(backend, zeros).tolist() == [[0.0] * 3] * 3 and host(backend, zeros).dtype == np.float32
    assert host(backend, ones).tolist() == [[1.0] * 3] * 3
    assert host(backend, random).shape == (3, 3) and host(backend, random).std() > 0
    assert host(backend, arange).tolist() == list(range(10)) and host(backend, arange).dtype == np.int64
    assert host(backend, float16_tensor).dtype == np.float16 and backend.dtype(float16_tensor) == ml.float16

    rand = backend.rand(3, 4)
    assert host(backend, rand).shape == (3, 4) and 0 <= host(backend, rand).min() and host(backend, rand).max() < 1
    numpy_array = np.random.randn(3, 4)
    tensor = backend.array(numpy_array.astype(np.float32))
    np.testing.assert_array_equal(host(backend, tensor), numpy_array.astype(np.float32))
    int32_tensor = backend.ones(3, 4, dtype=ml.int32)
    assert host(backend, int32_tensor).dtype == np.int32 and backend.shape(int32_tensor) == (3, 4)


def test_array_from_lists_and_numpy(named_backend):
    """004 MLX backend, "Creating Tensors" / "Lazy Evaluation": ``backend.array`` of a Python
    list (floats take the backend's dtype, ints stay ints) and of a NumPy array (its dtype is
    kept; a float64 one on MLX, which has no float64, is refused with the reason)."""
    name, backend = named_backend
    x = backend.array([[1, 2, 3], [4, 5, 6]])
    assert host(backend, x).tolist() == [[1, 2, 3], [4, 5, 6]] and host(backend, x).dtype == np.int64
    y = backend.array([1.0, 2.0, 3.0])
    z = backend.add(y, backend.array([4.0, 5.0, 6.0]))
    assert backend.dtype(z) == ml.float32 and host(backend, z).tolist() == [5.0, 7.0, 9.0]
    x_np = np.random.randn(3, 4)
    if name == "mlx":
        with pytest.raises(ml.errors.UnsupportedDTypeError, match="MlxBackend cannot hold float64"):
            backend.array(x_np)
        x = backend.array(x_np, dtype=ml.float32)  # what a float32 user means
    else:
        x = backend.array(x_np)
    np.testing.assert_allclose(host(backend, x), x_np, rtol=1e-6)
    assert backend.shape(backend.zeros(3, 4)) == (3, 4) and backend.shape(backend.randn(3, 4)) == (3, 4)


def test_tensor_operations(named_backend):
    """001 backends, "Tensor Operations"; 003 JAX backend, "Mathematical Operations"."""
    name, backend = named_backend
    a = backend.ones(3, 4)
    b = backend.ones(3, 4)
    assert host(backend, backend.add(a, b)).tolist() == [[2.0] * 4] * 3
    assert host(backend, backend.subtract(a, b)).tolist() == [[0.0] * 4] * 3
    assert host(backend, backend.multiply(a, b)).tolist() == [[1.0] * 4] * 3
    assert host(backend, backend.divide(a, b)).tolist() == [[1.0] * 4] * 3
    matmul = backend.matmul(backend.ones(3, 4), backend.ones(4, 5))
    assert host(backend, matmul).tolist() == [[4.0] * 5] * 3
    assert float(host(backend, backend.sum(a))) == 12.0
    assert host(backend, backend.sum(a, axis=0)).tolist() == [3.0] * 4
    assert float(host(backend, backend.mean(a))) == 1.0 and float(host(backend, backend.max(a))) == 1.0
    v = backend.array([[-1.0, 0.5], [2.0, -3.0]])
    np.testing.assert_allclose(host(backend, backend.relu(v)), [[0, 0.5], [2, 0]])
    np.testing.assert_allclose(host(backend, backend.sigmoid(v)), 1 / (1 + np.exp(-host(backend, v))), rtol=1e-6)
    np.testing.assert_allclose(host(backend, backend.tanh(v)), np.tanh(host(backend, v)), rtol=1e-6)
    np.testing.assert_allclose(host(backend, backend.maximum(v, backend.zeros(2, 2))), [[0, 0.5], [2, 0]])
    np.testing.assert_allclose(host(backend, backend.minimum(v, backend.zeros(2, 2))), [[-1, 0], [0, -3]])
    for t in (backend.relu(v), backend.sigmoid(v), backend.sum(a, axis=0), matmul):
        assert isinstance(t, NATIVE[name])


def test_shape_manipulation(named_backend):
    """003 JAX backend, "Shape Manipulation": reshape, transpose, concat."""
    _, backend = named_backend
    reshaped = backend.reshape(backend.arange(12), (3, 4))
    assert backend.shape(reshaped) == (3, 4) and host(backend, reshaped)[1].tolist() == [4, 5, 6, 7]
    transposed = backend.transpose(backend.ones(3, 4))
    assert backend.shape(transposed) == (4, 3)
    concatenated = backend.concat([backend.ones(3, 4), backend.zeros(3, 4)], axis=0)  # Result shape: (6, 4)
    assert backend.shape(concatenated) == (6, 4) and host(backend, concatenated)[3:].sum() == 0


def test_custom_operation_with_backend_maximum(named_backend):
    """004 MLX backend, "Custom MLX Operations": ``backend.maximum(0.01 * x, x)``, a leaky
    ReLU written with a Python scalar times a backend array."""
    _, backend = named_backend

    def custom_activation(x):
        return backend.maximum(0.01 * x, x)

    out = custom_activation(backend.array([-2.0, 0.0, 3.0]))
    np.testing.assert_allclose(host(backend, out), [-0.02, 0.0, 3.0], rtol=1e-6)


def test_debugging_shape_dtype_isnan(named_backend):
    """004 MLX backend, "Debugging" (2 and 3): ``backend.shape(tensor)`` is a tuple of ints,
    ``backend.dtype(tensor)`` the tensor's ml dtype, ``backend.isnan(tensor).any()`` a truth."""
    _, backend = named_backend
    tensor = backend.array([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]])
    shape = backend.shape(tensor)
    assert shape == (2, 3) and all(type(d) is int for d in shape)
    assert backend.dtype(tensor) == ml.float32 and f"Dtype: {backend.dtype(tensor)}" == "Dtype: ml.float32"
    has_nan = backend.isnan(tensor).any()
    assert bool(has_nan) is True and bool(backend.isnan(backend.ones(2)).any()) is False
    assert host(backend, backend.isnan(tensor)).tolist() == [[False, True, False], [False, False, False]]


def test_backend_dtype_is_the_default_and_a_lookup(named_backend):
    """001 backends, "Data Types" (``backend.dtype`` as the default) and 004 "Debugging"
    (``backend.dtype(tensor)``): one object, the default DType (equal to ``ml.float32``, usable
    wherever a DType is, copied or pickled as the plain dtype) that, called with an array,
    gives that array's ml dtype."""
    _, backend = named_backend
    assert backend.dtype == ml.float32 and repr(backend.dtype) == "ml.float32"
    assert hash(backend.dtype) == hash(ml.float32) and {ml.float32: "f32"}[backend.dtype] == "f32"
    assert backend.dtype != ml.float16 and backend.dtype.numpy == np.float32
    assert backend.dtype(backend.ones(2, dtype=backend.dtype)) == ml.float32
    assert backend.dtype(backend.ones(2, dtype=ml.int32)) is ml.int32
    assert backend.dtype(backend.arange(3)) == ml.int64
    assert pickle.loads(pickle.dumps(backend.dtype)) is ml.float32
    assert ml.dtypes.as_dtype(backend.dtype) is ml.float32
    with pytest.raises(ml.MithrilError, match="has no element dtype"):
        backend.dtype("float32")


def test_creation_on_a_device_and_to_device(named_backend):
    """001 backends, "PyTorch-specific Features": ``backend.ones(3, 3, device="cpu")`` and
    ``backend.to_device(cpu_tensor, "cuda")``, on every backend in its own accelerator
    spelling. Absent here: one DeviceFallbackWarning, and the tensor stays where it is; a name
    that is no device is an error."""
    name, backend = named_backend
    cpu_tensor = backend.ones(3, 3, device="cpu")
    assert host(backend, cpu_tensor).tolist() == [[1.0] * 3] * 3
    assert backend.device.startswith("cpu")
    with pytest.warns(DeviceFallbackWarning, match=f"'{ACCELERATOR[name]}'"):
        gpu_tensor = backend.to_device(cpu_tensor, ACCELERATOR[name])
    assert isinstance(gpu_tensor, NATIVE[name]) and host(backend, gpu_tensor).tolist() == [[1.0] * 3] * 3
    if name == "torch":
        assert gpu_tensor.device.type == "cpu"
    if name == "jax":
        assert gpu_tensor.devices() == {jax.devices("cpu")[0]}
    same = backend.to_device(cpu_tensor, "cpu")
    assert host(backend, same).tolist() == [[1.0] * 3] * 3
    with pytest.raises(ml.errors.BackendOptionError, match="'banana' is not a device"):
        backend.to_device(cpu_tensor, "banana")
    for make in (backend.zeros, backend.randn, backend.rand):
        assert backend.shape(make(2, 2, device="cpu")) == (2, 2)
    assert host(backend, backend.arange(3, device="cpu")).tolist() == [0, 1, 2]
    assert host(backend, backend.zeros_like(cpu_tensor, device="cpu")).sum() == 0


def test_torch_specific_features():
    """001 backends, "PyTorch-specific Features", as written on a TorchBackend: set_seed(42),
    a CPU tensor, and to_device(..., "cuda") (no CUDA here: one warning, the tensor stays on the CPU)."""
    backend = ml.TorchBackend()
    backend.set_seed(42)
    cpu_tensor = backend.ones(3, 3, device="cpu")
    if torch.cuda.is_available():
        assert backend.to_device(cpu_tensor, "cuda").device.type == "cuda"
    else:
        with pytest.warns(DeviceFallbackWarning, match=r"TorchBackend: device 'cuda' is not present \(present devices: cpu\); "
                                                       r"the tensor stays on cpu"):
            gpu_tensor = backend.to_device(cpu_tensor, "cuda")
        assert gpu_tensor.device.type == "cpu" and torch.equal(gpu_tensor, cpu_tensor)


def test_jax_specific_features():
    """001 backends, "JAX-specific Features": ``JaxBackend(jit=True)``, ``set_seed(42)``
    (reproducible draws) and ``backend.device``."""
    backend = ml.JaxBackend(jit=True)
    backend.set_seed(42)
    first = np.asarray(backend.randn(4))
    backend.set_seed(42)
    assert np.array_equal(np.asarray(backend.randn(4)), first)
    device = backend.device
    assert device == "cpu" and backend.jit_by_default


def test_random_keys(named_backend):
    """003 JAX backend, "JAX Random Number Generation": set_seed(42), get_random_key(),
    split_key(key) -> (new_key, subkey), random_normal(subkey, shape=(3, 4)), on every backend.
    JAX and MLX give their frameworks' PRNG keys; NumPy and PyTorch a Python int, the seed of a
    NumPy generator. The same seed gives the same keys and draws; two keys give different ones."""
    name, backend = named_backend
    backend.set_seed(42)
    key = backend.get_random_key()
    new_key, subkey = backend.split_key(key)
    random_numbers = backend.random_normal(subkey, shape=(3, 4))
    assert isinstance(random_numbers, NATIVE[name]) and backend.shape(random_numbers) == (3, 4)
    assert backend.dtype(random_numbers) == ml.float32
    values = host(backend, random_numbers)
    assert 0.3 < values.std() < 2.5
    backend.set_seed(42)
    again = backend.random_normal(backend.split_key(backend.get_random_key())[1], shape=(3, 4))
    np.testing.assert_array_equal(host(backend, again), values)
    other = host(backend, backend.random_normal(new_key, shape=(3, 4)))
    assert not np.allclose(other, values)
    assert not np.allclose(host(backend, backend.random_normal(backend.get_random_key(), shape=(3, 4))), values)
    if name == "jax":
        assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    elif name == "mlx":
        assert isinstance(key, mx.array) and key.dtype == mx.uint32
    else:
        assert isinstance(key, int)
    assert host(backend, backend.random_normal(subkey, shape=5, dtype=ml.float16)).dtype == np.float16


def test_memory_info(named_backend):
    """004 MLX backend, "Monitor memory usage": ``backend.get_memory_info()['used']`` in MB,
    with the peak, from the framework (MLX's allocator; CUDA's or XLA's on an accelerator; the
    process's resident memory on the CPU, which ``source`` names)."""
    name, backend = named_backend
    kept = backend.ones(256, 256)
    if name == "mlx":
        mx.eval(kept)
    memory_info = backend.get_memory_info()
    print(f"Used memory: {memory_info['used']} MB")
    assert memory_info["used"] > 0 and memory_info["peak"] >= memory_info["used"]
    if name == "mlx":
        assert memory_info["source"] == "mlx allocator" and memory_info["used"] >= 256 * 256 * 4 / 2**20
        assert memory_info["limit"] == mx.get_memory_limit() / 2**20
    else:
        assert memory_info["source"] == "process resident memory (RSS)" and memory_info["used"] > 10  # Python + numpy


def test_mlx_tensor_conversion():
    """004 MLX backend, "Tensor Conversion" and "Using MLX Optimizers": from_mlx(mx_array),
    to_mlx(x), array(np_array), to_numpy(x)."""
    backend = MLXBackend()
    mx_array = mx.random.normal((3, 4))
    x = backend.from_mlx(mx_array)
    assert isinstance(x, mx.array) and mx.array_equal(x, mx_array)
    mx_array = backend.to_mlx(x)
    assert isinstance(mx_array, mx.array) and mx_array.shape == (3, 4)
    np_array = np.random.randn(3, 4).astype(np.float32)
    x = backend.array(np_array)
    np.testing.assert_array_equal(backend.to_numpy(x), np_array)
    assert backend.to_mlx(np_array).dtype == mx.float32
    with pytest.raises(ml.errors.InputError, match="from_mlx takes an mx.array, got ndarray"):
        backend.from_mlx(np_array)


def test_copying_between_backends():
    """001 backends, "Copying Between Backends": a JAX tensor through NumPy into PyTorch."""
    jax_backend = ml.JaxBackend(dtype=ml.float32)
    jax_tensor = jax_backend.ones(3, 3)
    torch_backend = ml.TorchBackend(dtype=ml.float32)
    torch_tensor = torch_backend.from_numpy(jax_backend.to_numpy(jax_tensor))
    assert isinstance(torch_tensor, torch.Tensor) and torch_tensor.dtype == torch.float32
    assert torch.equal(torch_tensor, torch.ones(3, 3))


def test_ones_like_for_output_gradients(named_backend):
    """003 JAX backend, "Computing Gradients": ``backend.ones_like(outputs["output"])`` keeps
    the output's shape and dtype."""
    _, backend = named_backend
    output = backend.randn(2, 5, dtype=ml.float16)
    gradient = backend.ones_like(output)
    assert backend.shape(gradient) == (2, 5) and backend.dtype(gradient) == ml.float16
    assert host(backend, gradient).tolist() == [[1.0] * 5] * 2


def test_custom_backend():
    """001 backends, "Custom Backends": a subclass of ``mithril.backends.Backend`` whose
    ``__init__`` passes ``dtype`` up and which implements zeros and ones; the rest of the tensor
    API comes from Backend (over NumPy), and compile runs models on it."""

    class MyCustomBackend(Backend):
        def __init__(self, dtype=ml.float32):
            super().__init__(dtype=dtype)
            self.calls = []  # Initialize your backend

        def zeros(self, *shape, dtype=None):
            self.calls.append("zeros")
            return np.zeros(shape, dtype=self.backend_dtype(dtype))

        def ones(self, *shape, dtype=None):
            self.calls.append("ones")
            return np.ones(shape, dtype=self.backend_dtype(dtype))

    backend = MyCustomBackend()
    assert backend.dtype == ml.float32 and backend.device == "cpu"
    a = backend.ones(3, 3)
    b = backend.zeros(3, 3, dtype=ml.float64)
    assert backend.calls == ["ones", "zeros"] and b.dtype == np.float64
    assert backend.add(a, backend.ones(3, 3)).tolist() == [[2.0] * 3] * 3
    assert backend.matmul(a, a).tolist() == [[3.0] * 3] * 3
    assert backend.shape(backend.concat([a, a])) == (6, 3) and backend.dtype(a) == ml.float32
    assert MyCustomBackend(dtype=ml.float64).randn(2).dtype == np.float64

    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    pm = ml.compile(ml.load_onnx(helper.make_model(graph)), backend)
    assert pm.evaluate({}, {"x": np.array([-1.0, 2.0], np.float32)})["y"].tolist() == [0.0, 2.0]


def test_sharded_tensors():
    """003 JAX backend, "Sharded Tensors": ``backend.ones(128, 64, device_mesh=(2,))`` (split on
    dim 0 by default) and ``(..., device_mesh=(2,), tensor_split=(0,))`` on a backend made with
    that mesh; a one-device mesh gives the plain array; a mesh the backend lacks is an error."""
    backend = ml.JaxBackend(device_mesh=(2,))
    for kwargs in ({"device_mesh": (2,)}, {"device_mesh": (2,), "tensor_split": (0,)}):
        sharded_tensor = backend.ones(128, 64, **kwargs)
        assert backend.shape(sharded_tensor) == (128, 64)
        assert [s.data.shape for s in sharded_tensor.addressable_shards] == [(64, 64), (64, 64)]
    single = ml.JaxBackend()
    sharded_tensor = single.ones(128, 64, device_mesh=(1,), tensor_split=(0,))
    assert single.shape(sharded_tensor) == (128, 64)
    with pytest.raises(ml.errors.MeshError, match=r"needs a backend on that mesh: JaxBackend\(device_mesh=\(2,\)\)"):
        single.ones(128, 64, device_mesh=(2,))
    with pytest.raises(ml.errors.BackendOptionError, match="tensor_split needs a device_mesh"):
        single.ones(128, 64, tensor_split=(0,))


def test_parallel_evaluation():
    """003 JAX backend, "Parallel Evaluation", as written: a model compiled for a 2-device mesh
    (data parallel by default; the batch stays symbolic), parameters from the compiled model, a
    batch split over the mesh; the outputs are split the same way and equal one device's."""
    model = ml.models.MLP(input_size=1024, hidden_sizes=[2048, 2048], output_size=1024)
    backend = ml.JaxBackend(device_mesh=(2,))
    compiled_model = ml.compile(model, backend)
    params = compiled_model.randomize_params()
    batch_size = 128
    inputs = {"input": backend.ones(batch_size, 1024, device_mesh=(2,), tensor_split=(0,))}
    outputs = compiled_model.evaluate(params, inputs)
    out = outputs["output"]
    assert out.shape == (128, 1024) and [s.data.shape for s in out.addressable_shards] == [(64, 1024)] * 2
    single = ml.compile(model, ml.JaxBackend())
    want = single.evaluate({k: np.asarray(v) for k, v in params.items()}, {"input": np.ones((128, 1024), np.float32)})
    np.testing.assert_allclose(np.asarray(out), np.asarray(want["output"]), rtol=1e-5, atol=1e-5)
