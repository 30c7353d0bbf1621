"""Backends, one folder each (``numpy/``, ``jax/``, ``torch/``, ``mlx/``, ``c/``, ``ggml/``), listed in
:mod:`mithril.backends.table`; :class:`Backend` is their contract and the base of a custom one.

Importing this package imports no framework: a backend imports its own when created.

>>> from mithril.backends import Backend, MLXBackend, NumpyBackend
>>> issubclass(MLXBackend, Backend), NumpyBackend().name
(True, 'numpy')
"""

from .backend import Backend
from .c.backend import CBackend
from .ggml.backend import GGMLBackend
from .jax.backend import JaxBackend
from .mlx.backend import MLXBackend, MlxBackend
from .numpy.backend import NumpyBackend
from .table import BACKENDS
from .torch.backend import TorchBackend

__all__ = ["Backend", "MLXBackend", *(entry.class_name for entry in BACKENDS.values())]
