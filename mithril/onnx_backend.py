"""ONNX's backend API (``onnx.backend.base.Backend``) over Mithril's backends.

onnxruntime, onnx-tf and ONNX's reference evaluator implement this interface; it is how
``onnx.backend.test.BackendTest`` and the public ONNX Backend Scoreboard drive a runtime. This
module is the NumPy one; :func:`backend` gives the class for any row of
:data:`mithril.backends.table.BACKENDS`:

>>> import numpy as np
>>> from onnx import TensorProto, helper
>>> import mithril.onnx_backend as backend
>>> graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
>>> rep = backend.prepare(helper.make_model(graph))
>>> rep.run([np.array([[-1, 2, -3]], np.float32)])[0].tolist()
[[0.0, 2.0, 0.0]]
>>> backend.backend("c").__name__, backend.supports_device("CPU")
('MithrilCBackend', True)

``prepare(model, device, **options)`` builds the Mithril backend with ``options`` (its constructor's:
``dtype=``, ``num_threads=``, ``fallback=`` ...) and compiles the model as ``mithril conformance``
does, so both count the same programs. As there, C and GGML run strictly (``fallback=None``: a node
without a C kernel or a ggml rule is refused at compile) unless ``fallback="numpy"`` is given.
Errors are :class:`~mithril.errors.MithrilError` subclasses.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from mithril.backends.table import BACKENDS
from mithril.errors import BackendUnavailableError, InputError


def make_backend(name: str, **options):
    """A Mithril backend ``name`` built with ``options``; C and GGML strict unless ``fallback=`` is
    given (a node without the backend's own rule fails instead of running on NumPy)."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    from mithril.backends.segmented import SegmentedBackend

    cls = entry.load()
    if issubclass(cls, SegmentedBackend):
        options.setdefault("fallback", None)
    return cls(**options)


# How each backend names CUDA device i (``device=``); the others run on the CPU only. MLX's "gpu"
# is CUDA on Linux only (Metal on macOS, which ONNX's device names do not cover).
_CUDA_DEVICE = {"torch": "cuda:{}", "jax": "gpu:{}", **({"mlx": "gpu"} if sys.platform == "linux" else {})}


def _parse_device(device: str) -> tuple[str, int]:
    """ONNX's device string (``"CPU"``, ``"CUDA"``, ``"CUDA:1"``) as (kind, index)."""
    kind, _, index = str(device).upper().partition(":")
    if kind not in ("CPU", "CUDA") or (index and not index.isdigit()):
        raise InputError(f"device {device!r}: ONNX backends take 'CPU', 'CUDA' or 'CUDA:<index>'")
    return kind, int(index or 0)


class MithrilRep(BackendRep):
    """A model prepared on one Mithril backend: ``run(inputs)`` returns its outputs in graph order
    (a tuple whose items are also reachable by output name, as ``onnx.backend.base`` builds it).
    Backends that compile fixed shapes (C, GGML) compile at the first run for each distinct set of
    input shapes, so their refusals come from ``run``."""

    def __init__(self, model, backend):
        import mithril as ml

        self.backend = backend
        self.model = ml.load_onnx(model)
        self._programs: dict[tuple, Any] = {}
        self._program = None if backend.needs_static_shapes else ml.compile(self.model, backend)

    @property
    def input_names(self) -> list[str]:
        return self.model.input_names

    @property
    def output_names(self) -> list[str]:
        return self.model.output_names

    def _compiled(self, inputs: Sequence[Any]):
        if self._program is not None:
            return self._program
        import mithril as ml

        shapes = {n: list(np.shape(v)) for n, v in zip(self.input_names, inputs) if isinstance(v, np.ndarray)}
        key = tuple(sorted((n, tuple(s)) for n, s in shapes.items()))
        if key not in self._programs:
            self._programs[key] = ml.compile(self.model, self.backend, shapes=shapes)
        return self._programs[key]

    def _positional(self, inputs) -> list[Any]:
        if isinstance(inputs, Mapping):
            unknown = [k for k in inputs if k not in self.input_names]
            if unknown:
                raise InputError(f"unknown input(s) {unknown}; the model takes {self.input_names}")
            given = [inputs.get(n) for n in self.input_names]
            while given and given[-1] is None:  # trailing optional inputs left out
                given.pop()
            return given
        if isinstance(inputs, np.ndarray):
            return [inputs]
        return list(inputs)

    def run(self, inputs, **kwargs) -> tuple[Any, ...]:
        """The outputs for ``inputs``: a list or tuple in the graph's input order (trailing optional
        inputs may be left out), a dict by input name, or one array for a one-input model."""
        if kwargs:
            raise InputError(f"run takes no options ({sorted(kwargs)} given): give backend options to prepare")
        inputs = self._positional(inputs)
        program = self._compiled(inputs)
        names = program.input_keys
        if len(inputs) > len(names):
            raise InputError(f"{len(inputs)} inputs given but the model takes {names}")
        to_backend = self.backend.from_numpy
        data = {n: to_backend(v) if isinstance(v, np.ndarray) else v for n, v in zip(names, inputs)}
        out = program.evaluate(None, data)
        values = [self._to_numpy(out[k]) for k in program.output_keys]
        return namedtupledict("Outputs", program.output_keys)(*values)

    def _to_numpy(self, value):
        if isinstance(value, list):  # a sequence output
            return [self.backend.to_numpy(v) for v in value]
        return None if value is None else self.backend.to_numpy(value)


class MithrilBackend(Backend):
    """``onnx.backend.base.Backend`` on the Mithril backend named by ``mithril_backend`` (NumPy
    here; :func:`backend` makes the others)."""

    mithril_backend = "numpy"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> MithrilRep:
        """``model`` (a ModelProto, a path or bytes) loaded and compiled on ``device``; ``kwargs``
        are the Mithril backend's options (``dtype=``, ``num_threads=``, ``fallback=`` ...)."""
        kind, index = _parse_device(device)
        if not cls.supports_device(device):
            raise BackendUnavailableError(f"Mithril's {cls.mithril_backend} backend has no device {device!r} here")
        if kind == "CUDA":
            kwargs["device"] = _CUDA_DEVICE[cls.mithril_backend].format(index)
        return MithrilRep(model, make_backend(cls.mithril_backend, **kwargs))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """One node run on ``inputs`` (in the order of ``node.input``'s non-empty names, or a dict),
        as a one-node model of opset ``opset_version=`` (default: the installed onnx's newest);
        ``outputs_info`` gives the outputs' (dtype, shape) where the node's type rules cannot."""
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        model = node_model(node, inputs, outputs_info, opset)
        return cls.run_model(model, inputs, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """``"CPU"`` always; ``"CUDA[:i]"`` where this backend runs on CUDA and device i is present."""
        try:
            kind, index = _parse_device(device)
        except InputError:
            return False
        if kind == "CPU":
            return True
        entry = BACKENDS[cls.mithril_backend]
        spelled = _CUDA_DEVICE.get(cls.mithril_backend)
        if spelled is None or not entry.installed():
            return False
        try:
            return spelled.format(index) in entry.load().devices()
        except BackendUnavailableError:
            return False


def node_model(node: onnx.NodeProto, inputs, outputs_info=None, opset: int | None = None) -> onnx.ModelProto:
    """A model holding only ``node``: its inputs typed from ``inputs`` (arrays, or lists of arrays
    for sequences), its outputs from ``outputs_info`` when given, else left to the node's rules."""
    names = [n for n in node.input if n]
    values = [inputs[n] for n in names] if isinstance(inputs, Mapping) else list(inputs)
    if len(values) != len(names):
        raise InputError(f"node {node.name or node.op_type!r} takes inputs {names}; {len(values)} given")
    graph_inputs = [_value_info(n, v) for n, v in zip(names, values)]
    if outputs_info is not None:
        outputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                   for n, (dt, shape) in zip(node.output, outputs_info)]
    else:
        outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, outputs)
    opsets = [onnx.helper.make_opsetid("", opset or onnx.defs.onnx_opset_version())]
    if node.domain not in ("", "ai.onnx"):
        opsets.append(onnx.helper.make_opsetid(node.domain, 1))
    return onnx.helper.make_model(graph, opset_imports=opsets)


def _value_info(name: str, value) -> onnx.ValueInfoProto:
    if isinstance(value, list):
        elem = np.asarray(value[0]).dtype if value else np.dtype(np.float32)
        return onnx.helper.make_tensor_sequence_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(elem), None)
    value = np.asarray(value)
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
                                              list(value.shape))


@functools.cache
def backend(name: str) -> type[MithrilBackend]:
    """The ``onnx.backend.base.Backend`` class of Mithril backend ``name`` (a row of BACKENDS);
    the framework is imported when a model is prepared, not here."""
    if name == MithrilBackend.mithril_backend:
        return MithrilBackend
    entry = BACKENDS.get(name)
    if entry is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    return type(f"Mithril{entry.class_name}", (MithrilBackend,),
                {"mithril_backend": name, "__module__": __name__,
                 "__doc__": f"``onnx.backend.base.Backend`` on Mithril's {entry.class_name}."})


prepare = MithrilBackend.prepare
run_model = MithrilBackend.run_model
run_node = MithrilBackend.run_node
supports_device = MithrilBackend.supports_device

__all__ = ["MithrilBackend", "MithrilRep", "backend", "make_backend", "node_model", "prepare", "run_model",
           "run_node", "supports_device"]
