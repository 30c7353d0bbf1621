"""The one list of backends: each row names its folder under ``mithril/backends/``, where its
class lives and how to recognise its framework's arrays. The CLI, the conformance runner, the
optimizers and params I/O read this table; nothing else lists the backends.

Adding a backend is adding a folder (``backend.py`` with a :class:`~mithril.backends.backend.Backend`
subclass, ``arrays.py`` with the array helpers, ``overrides.py`` for its kernels) and one row here.
Nothing in this module imports a framework: classes and array helpers are imported when asked for.

>>> from mithril.backends.table import BACKENDS, array_backend
>>> BACKENDS["torch"].class_name, BACKENDS["jax"].array_modules
('TorchBackend', ('jax', 'jaxlib'))
>>> import numpy as np
>>> array_backend(np.ones(2)).zeros_like(np.ones(2)).tolist()
[0.0, 0.0]
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class BackendEntry:
    """One backend: ``name`` (``--backend``, ``Backend.name``, the override key of its kernels),
    the class ``class_name`` in ``mithril.backends.<name>.backend``, and the top-level modules
    of its framework's array types (``type(array).__module__``'s first part), and the array
    type as users name it (``array_type``, for messages)."""

    name: str
    class_name: str
    array_modules: tuple[str, ...]
    array_type: str
    framework: str | None = None  # the package the backend needs, when not its arrays' (ggml)

    @property
    def package(self) -> str:
        """The backend's folder as a package: ``mithril.backends.<name>``."""
        return f"{__package__}.{self.name}"

    @property
    def module(self) -> str:
        """The module holding the class (importing it does not import the framework)."""
        return f"{self.package}.backend"

    def installed(self) -> bool:
        """Whether the framework's package is importable (found, not imported)."""
        return importlib.util.find_spec(self.framework or self.array_modules[0]) is not None

    def load(self) -> type:
        """The backend class."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def arrays(self) -> ModuleType:
        """The folder's ``arrays`` module (imports the framework): ``sqrt``, ``zeros_like``,
        ``to_numpy``, ``update_scope`` and ``jit`` over this framework's arrays."""
        return importlib.import_module(f"{self.package}.arrays")


BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry("numpy", "NumpyBackend", ("numpy",), "numpy.ndarray"),
    BackendEntry("jax", "JaxBackend", ("jax", "jaxlib"), "jax.Array"),
    BackendEntry("torch", "TorchBackend", ("torch",), "torch.Tensor"),
    BackendEntry("mlx", "MlxBackend", ("mlx",), "mlx.core.array"),
    # Generated C over NumPy buffers: its arrays are NumPy's (it needs a C compiler when compiling).
    BackendEntry("c", "CBackend", ("numpy",), "numpy.ndarray"),
    # ggml graphs through ggml-python over NumPy buffers: its arrays are NumPy's too.
    BackendEntry("ggml", "GGMLBackend", ("numpy",), "numpy.ndarray", framework="ggml"),
)}

_BY_MODULE: dict[str, BackendEntry] = {}
for _entry in BACKENDS.values():  # the first row owning a module keeps it (NumPy arrays are numpy's, not c's)
    for _module in _entry.array_modules:
        _BY_MODULE.setdefault(_module, _entry)


def backend_of_array(value: Any) -> BackendEntry:
    """The row whose framework made ``value``; NumPy's for anything else (Python scalars, lists)."""
    return _BY_MODULE.get(type(value).__module__.partition(".")[0], BACKENDS["numpy"])


_ARRAYS: dict[str, ModuleType] = {}  # type(value).__module__ -> its arrays module (called per parameter)


def array_backend(value: Any) -> ModuleType:
    """The array helpers (``mithril.backends.<name>.arrays``) for a value of that framework."""
    module = type(value).__module__
    arrays = _ARRAYS.get(module)
    if arrays is None:
        arrays = _ARRAYS[module] = backend_of_array(value).arrays()
    return arrays


def arrays_of(values: Iterable[Any]) -> ModuleType:
    """The array helpers for a collection: the first value of a framework other than NumPy
    decides (a JAX model's parameters may mix JAX and NumPy arrays); NumPy's when none is."""
    for value in values:
        if backend_of_array(value).name != "numpy":
            return array_backend(value)
    return BACKENDS["numpy"].arrays()


__all__ = ["BACKENDS", "BackendEntry", "array_backend", "arrays_of", "backend_of_array"]
