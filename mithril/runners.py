"""What runs a model for a comparison: onnxruntime or any backend with its options.

``validate`` and ``reduce`` compare two runners on the same inputs. A runner is named as on the
command line: ``onnxruntime`` (alias ``ort``), or a backend name with options after colons,
``ggml:quantize=q8_0``, ``torch:dtype=bfloat16``, ``c:num_threads=1``. Option values are read as
Python literals where they are one (``1``, ``0.5``, ``True``, ``None``), as a Mithril dtype where
they name one (``float16``, ``bfloat16``, ``float32``, ``float64``), and as text otherwise.

>>> from mithril.runners import parse_runner
>>> parse_runner("onnxruntime").name
'onnxruntime'
>>> parse_runner("numpy:dtype=float64").name
'numpy:dtype=float64'
"""

from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np
import onnx

from .backends.backend import Backend
from .errors import BackendOptionError, MithrilError, ValidationError

ORT_NAMES = ("onnxruntime", "ort")
_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _option_value(text: str) -> Any:
    from . import dtypes

    if text in _DTYPES:
        return getattr(dtypes, text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_backend_spec(spec: str) -> Backend:
    """A backend from ``name[:key=value]...``; an unknown name, one whose framework is not
    installed, or an option the backend does not take is a :class:`~mithril.errors.MithrilError`
    naming the spec."""
    from .backends.table import BACKENDS

    name, *opts = [p.strip() for p in spec.strip().split(":")]
    if name not in BACKENDS:
        raise MithrilError(f"unknown backend {name!r} in {spec!r}; choose from {', '.join(BACKENDS)}")
    entry = BACKENDS[name]
    if not entry.installed():
        raise MithrilError(f"backend {name!r} is not available: its framework "
                           f"({entry.framework or entry.array_modules[0]}) is not installed")
    options = {}
    for opt in opts:
        if "=" not in opt:
            raise MithrilError(f"backend option {opt!r} in {spec!r}: expected key=value")
        k, v = opt.split("=", 1)
        options[k.strip()] = _option_value(v.strip())
    try:
        return entry.load()(**options)
    except BackendOptionError as exc:
        raise BackendOptionError(f"{spec!r}: {exc}") from exc


def _drop_trailing_empty_inputs(graph: onnx.GraphProto) -> None:
    # onnxruntime 1.31 aborts the process on e.g. LayerNormalization(x, scale, ""); "" at the end
    # of a node's inputs means the same as leaving the input out.
    for node in graph.node:
        while node.input and node.input[-1] == "":
            node.input.pop()
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _drop_trailing_empty_inputs(attr.g)
            for g in attr.graphs:
                _drop_trailing_empty_inputs(g)


def ort_session(proto: onnx.ModelProto):
    """An onnxruntime CPU session of ``proto`` with graph optimisations off (the graph as written)."""
    import onnxruntime as ort

    if any(n.input and n.input[-1] == "" for n in proto.graph.node):
        cleaned = onnx.ModelProto()
        cleaned.CopyFrom(proto)
        _drop_trailing_empty_inputs(cleaned.graph)
        proto = cleaned

    opts = ort.SessionOptions()
    # The reference runs the graph as written: no fusions that change rounding.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        # onnx can write a newer IR version than onnxruntime reads; the IR version only gates
        # proto features, so the reference runs the same graph at the newest version it knows.
        m = re.search(r"max supported IR version: (\d+)", str(exc))
        if not m or proto.ir_version <= int(m.group(1)):
            raise
        older = onnx.ModelProto()
        older.CopyFrom(proto)
        older.ir_version = int(m.group(1))
        return ort.InferenceSession(older.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def compute_dtype(backend) -> np.dtype | None:
    """The float dtype ``backend`` computes in (the tolerance follows it); None when it has none."""
    dtype = getattr(backend, "dtype", None)
    numpy = getattr(dtype, "numpy", None)
    return np.dtype(numpy) if numpy is not None and np.dtype(numpy).name in _FLOAT_NAMES else None


class Runner:
    """Runs an ONNX model on given inputs and returns every requested output as a NumPy array.
    ``name`` is how reports label it; ``compute`` the float dtype it computes in when that is
    not the file's (a float16 backend): the tolerance follows it."""

    name: str = "runner"
    compute: np.dtype | None = None

    def run(self, model, inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, Any]:
        raise NotImplementedError


class OnnxruntimeRunner(Runner):
    """onnxruntime's CPU provider with graph optimisations off (the graph as written)."""

    name = "onnxruntime"

    def run(self, model, inputs, outputs=None):
        from .onnx_bridge.load import load_onnx
        proto = model if hasattr(model, "SerializeToString") else load_onnx(model).to_proto()
        try:
            sess = ort_session(proto)
            names = outputs or [o.name for o in sess.get_outputs()]
            return dict(zip(names, sess.run(names, inputs)))
        except Exception as exc:  # onnxruntime's own exceptions, at load or at run
            raise ValidationError(f"onnxruntime could not run the model: {exc}") from exc


class BackendRunner(Runner):
    """A Mithril backend: the model compiled for inference with its inputs and outputs kept in
    the file's dtypes (``keep_io_types``), so they meet the other runner's."""

    def __init__(self, backend: Backend, name: str | None = None):
        self.backend = backend
        self.name = name or backend.name
        self.compute = compute_dtype(backend)

    def run(self, model, inputs, outputs=None):
        from .compile import compile as ml_compile
        from .onnx_bridge.load import load_onnx

        loaded = load_onnx(model)
        b = self.backend
        pm = ml_compile(loaded, b, shapes={k: np.shape(v) for k, v in inputs.items()}, keep_io_types=True,
                        inference=True)
        got = pm.evaluate(None, {k: b.from_numpy(v) for k, v in inputs.items()})
        names = outputs or list(loaded.output_names)
        return {n: b.to_numpy(got[n]) for n in names}


def parse_runner(spec: str | Backend | Runner | None) -> Runner:
    """A runner from a name (``onnxruntime``/``ort``, or a backend spec), a Backend, or a Runner;
    None is onnxruntime."""
    if spec is None:
        return OnnxruntimeRunner()
    if isinstance(spec, Runner):
        return spec
    if isinstance(spec, Backend):
        return BackendRunner(spec)
    if isinstance(spec, str):
        if spec.strip().lower() in ORT_NAMES:
            return OnnxruntimeRunner()
        from .backends.table import BACKENDS

        name = spec.split(":")[0].strip()
        if name not in BACKENDS:
            raise MithrilError(f"unknown backend {name!r} in {spec!r}; choose onnxruntime or one of "
                               f"{', '.join(BACKENDS)}")
        return BackendRunner(parse_backend_spec(spec), name=spec.strip())
    raise MithrilError(f"a reference is 'onnxruntime', a backend name such as 'torch:dtype=bfloat16', or a "
                       f"Backend; got {type(spec).__name__}")
