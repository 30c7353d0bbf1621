"""The tensor API users call on a backend (``backend.ones(3)``, ``backend.add(a, b)``), and
its metaclass: methods a Lambda block traces, and methods that say so when called on a backend
class instead of an instance. :class:`~mithril.backends.backend.Backend` inherits it."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ..dtypes import DType, as_dtype
from ..errors import BackendOptionError, MeshError, NotABackendError
from .host_memory import process_memory_info
from .options import check_device_mesh, cpu_device
from .table import backend_of_array


# The tensor API a Lambda block traces (mithril/frontend/lambda_block.py). Called with a traced
# value among its arguments (a type with __mithril_function__, as torch's __torch_function__),
# a method of these names forwards the call to that value, which emits ONNX nodes, instead of
# computing; TensorAPI wraps them in every backend class, defined in its body or set later.
TRACEABLE_API = frozenset({
    "add", "subtract", "multiply", "divide", "power", "matmul", "maximum", "minimum", "negative", "abs",
    "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "sin", "cos", "isnan",
    "sum", "mean", "max", "min", "reshape", "transpose", "concat", "where",
})


def _traceable(name: str, method):
    @functools.wraps(method)
    def traceable(self, *args, **kwargs):
        foreign = None
        for arg in (*args, *kwargs.values()):
            for v in arg if isinstance(arg, (list, tuple)) else (arg,):
                if hasattr(type(v), "__mithril_function__"):
                    return v.__mithril_function__(self, name, args, kwargs)
                if foreign is None and backend_of_array(v).name not in ("numpy", self.name):
                    foreign = v
        if foreign is not None:  # another framework's array would compute there, or fail deep inside
            self.check_array(foreign, f"an argument of {name}()")
        return method(self, *args, **kwargs)

    return traceable


# The tensor API users call on a backend: TensorAPI makes each method say so when it is called on
# a backend class instead of an instance (``backend = ml.NumpyBackend`` then ``backend.ones(3)``).
INSTANCE_API = TRACEABLE_API | frozenset({
    "array", "zeros", "ones", "randn", "rand", "arange", "zeros_like", "ones_like", "to_device", "to_numpy",
    "from_numpy", "get_random_key", "split_key", "random_normal", "shape", "get_memory_info", "set_seed",
})


class _TensorMethod:
    """A tensor-API method as its class holds it: bound as usual when fetched from an instance;
    fetched from the class, a function refusing a first argument that is not a backend."""

    def __init__(self, name: str, fn):
        self.name, self.__func__ = name, fn
        functools.update_wrapper(self, fn)

    def __get__(self, obj, owner=None):
        if obj is not None:
            return self.__func__.__get__(obj, owner)
        fn, name, cls = self.__func__, self.name, owner.__name__

        @functools.wraps(fn)
        def on_class(self, *args, **kwargs):
            if not isinstance(self, TensorMethods):
                raise NotABackendError(f"{name}() is a method of a backend instance: {cls}().{name}(...) (or the "
                                       f"backend you made), not {cls}.{name}(...) on the class")
            return fn(self, *args, **kwargs)

        return on_class


def _api_method(key: str, fn):
    return _TensorMethod(key, _traceable(key, fn) if key in TRACEABLE_API else fn)


class TensorAPI(type):
    """The metaclass of backends: wraps their :data:`TRACEABLE_API` methods for tracing, and
    every :data:`INSTANCE_API` method so that calling it on the class says what was expected."""

    def __init__(cls, name, bases, namespace, **kwargs):
        super().__init__(name, bases, namespace, **kwargs)
        for key in INSTANCE_API & namespace.keys():
            if inspect.isfunction(namespace[key]):
                type.__setattr__(cls, key, _api_method(key, namespace[key]))

    def __setattr__(cls, key, value):
        if key in INSTANCE_API and inspect.isfunction(value):
            value = _api_method(key, value)
        super().__setattr__(key, value)


class TensorMethods(metaclass=TensorAPI):
    """The tensor API of a backend, in its framework's arrays: creation, devices, random keys,
    inspection and arithmetic. It relies on the backend contract's ``from_numpy``,
    ``to_numpy``, ``backend_dtype``, ``dtype``, ``xp`` and ``check_array``."""

    # -- creation --------------------------------------------------------------------
    # Every creation method takes ``dtype`` (default: the backend's) and ``device`` (default: the
    # backend's; see :meth:`to_device`).
    def set_seed(self, seed: int) -> None:
        """Seed this backend's draws (``randn``, ``rand``, ``get_random_key``, random kernels and
        ``randomize_params``): the same seed gives the same values."""
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def array(self, data, dtype: DType | None = None, device: str | None = None, device_mesh=None,
              tensor_split=None):
        """A backend array from a list, a scalar or a NumPy array. Floating Python data takes the
        backend's dtype; a NumPy array keeps its own unless ``dtype`` is given. ``device_mesh`` and
        ``tensor_split`` split it over a mesh as they do for :meth:`ones`."""
        if dtype is None and isinstance(data, np.ndarray):
            return self._on_mesh(data, device, device_mesh, tensor_split)
        if dtype is None:
            arr = np.asarray(data)
            dtype = self.dtype if np.issubdtype(arr.dtype, np.floating) else as_dtype(arr.dtype)
        return self._on_mesh(np.asarray(data, dtype=self.backend_dtype(dtype)), device, device_mesh, tensor_split)

    def zeros(self, *shape, dtype: DType | None = None, device: str | None = None, device_mesh=None,
              tensor_split=None):
        return self._on_mesh(np.zeros(_shape(shape), dtype=self.backend_dtype(dtype)), device, device_mesh, tensor_split)

    def ones(self, *shape, dtype: DType | None = None, device: str | None = None, device_mesh=None,
             tensor_split=None):
        return self._on_mesh(np.ones(_shape(shape), dtype=self.backend_dtype(dtype)), device, device_mesh, tensor_split)

    def randn(self, *shape, dtype: DType | None = None, device: str | None = None, device_mesh=None,
              tensor_split=None):
        values = self.rng.standard_normal(_shape(shape)).astype(self.backend_dtype(dtype))
        return self._on_mesh(values, device, device_mesh, tensor_split)

    def rand(self, *shape, dtype: DType | None = None, device: str | None = None, device_mesh=None,
             tensor_split=None):
        return self._on_mesh(self.rng.random(_shape(shape)).astype(self.backend_dtype(dtype)), device, device_mesh,
                             tensor_split)

    def arange(self, *args, dtype: DType | None = None, device: str | None = None):
        if dtype is None:
            dtype = self.dtype if any(isinstance(a, float) for a in args) else as_dtype(np.int64)
        return self._placed(self.from_numpy(np.arange(*args).astype(self.backend_dtype(dtype))), device)

    def zeros_like(self, x, dtype: DType | None = None, device: str | None = None):
        n = self.to_numpy(x)
        out = np.zeros(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype))
        return self._placed(self.from_numpy(out), device)

    def ones_like(self, x, dtype: DType | None = None, device: str | None = None):
        n = self.to_numpy(x)
        out = np.ones(n.shape, dtype=n.dtype if dtype is None else self.backend_dtype(dtype))
        return self._placed(self.from_numpy(out), device)

    def _placed(self, x, device):
        return x if device is None else self.to_device(x, device)

    def _on_mesh(self, values: np.ndarray, device, device_mesh, tensor_split):
        """A created array (NumPy ``values``) on ``device``, or split over ``device_mesh`` by
        ``tensor_split`` (:mod:`mithril.backends.mesh`) through the backend's :meth:`shard`. A
        backend without meshes takes a one-device mesh only."""
        if not hasattr(self, "shard"):
            check_device_mesh(self, device_mesh, tensor_split)
            return self._placed(self.from_numpy(values), device)
        if device_mesh is None and tensor_split is None:
            return self._placed(self.from_numpy(values), device)
        from .mesh import parse_mesh, split_spec

        owner = type(self).__name__
        mesh = self.mesh if device_mesh is None else parse_mesh(owner, device_mesh)
        if mesh is None:
            raise BackendOptionError(f"{owner}: tensor_split needs a device_mesh (on the array or the backend)")
        if self.mesh is None or self.mesh.size == 1 or mesh.shape != self.mesh.shape:
            if mesh.size == 1:  # one device: nothing to split
                return self._placed(self.from_numpy(values), device)
            raise MeshError(f"{owner}: an array on device_mesh={mesh.shape} needs a backend on that mesh: "
                            f"{owner}(device_mesh={mesh.shape}) (this one has device_mesh={self.device_mesh})")
        return self.shard(values, split_spec(owner, self.mesh, np.shape(values), tensor_split))

    # -- devices -----------------------------------------------------------------------
    def to_device(self, x, device):
        """``x`` on ``device``. A CPU-only backend (NumPy, the base) keeps ``x`` where it is: for
        ``"cpu"`` silently, for an accelerator (``"cuda"``, ``"gpu:0"``...) with one
        :class:`~mithril.errors.DeviceFallbackWarning`; a name that is no device is an error."""
        cpu_device(self, device)
        return x

    # -- random keys -------------------------------------------------------------------
    # JAX and MLX use their frameworks' PRNG keys; here a key is a Python int, the seed of a
    # NumPy Generator, so the same key gives the same draws.
    def get_random_key(self):
        """A fresh key drawn from the backend's seeded state (:meth:`set_seed`)."""
        return int(self.rng.integers(0, 2**63 - 1))

    def split_key(self, key):
        """Two new keys ``(key, subkey)`` derived from ``key``, the same ones every time."""
        first, second = np.random.SeedSequence(int(key)).generate_state(2, dtype=np.uint64) >> np.uint64(1)
        return int(first), int(second)

    def random_normal(self, key, shape=(), dtype: DType | None = None):
        """Standard-normal values of ``shape`` drawn from ``key`` (the same key, the same values)."""
        values = np.random.default_rng(int(key)).standard_normal(_shape((shape,) if isinstance(shape, int) else shape))
        return self.from_numpy(values.astype(self.backend_dtype(dtype)))

    # -- inspection ------------------------------------------------------------------
    def shape(self, x) -> tuple[int, ...]:
        """The shape of ``x`` as a tuple of ints."""
        return tuple(int(d) for d in np.shape(x))

    def get_memory_info(self) -> dict:
        """Memory in use: ``used`` and ``peak`` in MB, and ``source`` saying what was measured
        (here the process's resident memory; backends on an accelerator ask their framework)."""
        return process_memory_info()

    # -- arithmetic ------------------------------------------------------------------
    def add(self, a, b):
        return a + b

    def subtract(self, a, b):
        return a - b

    def multiply(self, a, b):
        return a * b

    def divide(self, a, b):
        return a / b

    def matmul(self, a, b):
        return self.xp.matmul(a, b)

    def maximum(self, a, b):
        return self.xp.maximum(a, b)

    def minimum(self, a, b):
        return self.xp.minimum(a, b)

    def power(self, a, b):
        return self.xp.power(a, b)

    def negative(self, x):
        return -x

    def abs(self, x):
        return self.xp.abs(x)

    def exp(self, x):
        return self.xp.exp(x)

    def log(self, x):
        return self.xp.log(x)

    def sqrt(self, x):
        return self.xp.sqrt(x)

    def sin(self, x):
        return self.xp.sin(x)

    def cos(self, x):
        return self.xp.cos(x)

    def where(self, condition, a, b):
        return self.xp.where(condition, a, b)

    def relu(self, x):
        return self.xp.maximum(x, 0)

    def sigmoid(self, x):
        return 1 / (1 + self.xp.exp(-x))

    def tanh(self, x):
        return self.xp.tanh(x)

    def isnan(self, x):
        """Where ``x`` is NaN, as a boolean backend array (``backend.isnan(x).any()``)."""
        return self.xp.isnan(x)

    def sum(self, x, axis=None, keepdim: bool = False):
        return self.xp.sum(x, axis=axis, keepdims=keepdim)

    def mean(self, x, axis=None, keepdim: bool = False):
        return self.xp.mean(x, axis=axis, keepdims=keepdim)

    def max(self, x, axis=None, keepdim: bool = False):
        return self.xp.max(x, axis=axis, keepdims=keepdim)

    def min(self, x, axis=None, keepdim: bool = False):
        return self.xp.min(x, axis=axis, keepdims=keepdim)

    def reshape(self, x, shape):
        return self.xp.reshape(x, tuple(shape))

    def transpose(self, x, axes=None):
        return self.xp.transpose(x, axes)

    def concat(self, arrays, axis: int = 0):
        return self.xp.concatenate(list(arrays), axis=axis)


def _shape(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)
