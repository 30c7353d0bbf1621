"""One error hierarchy for everything Mithril raises on bad input.

Every error that concerns a graph node names it: its name (or ``op_type#index`` when the
node is unnamed), its op type and the opset in force, plus the shapes and dtypes involved.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence


class MithrilError(Exception):
    """Base class of every error Mithril raises on purpose."""


def describe_node(node_label: str | None, op_type: str | None, opset: int | None) -> str:
    parts = []
    if node_label:
        parts.append(f"node {node_label!r}")
    if op_type:
        parts.append(f"op {op_type}")
    if opset is not None:
        parts.append(f"opset {opset}")
    return ", ".join(parts)


class NodeError(MithrilError):
    """An error tied to one node of a graph."""

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        op_type: str | None = None,
        opset: int | None = None,
        shapes: Sequence | None = None,
        dtypes: Sequence | None = None,
    ):
        self.node = node
        self.op_type = op_type
        self.opset = opset
        self.shapes = list(shapes) if shapes is not None else None
        self.dtypes = list(dtypes) if dtypes is not None else None
        where = describe_node(node, op_type, opset)
        text = f"{where}: {message}" if where else message
        if self.shapes is not None:
            text += f" (input shapes {self.shapes}"
            text += f", dtypes {self.dtypes})" if self.dtypes is not None else ")"
        elif self.dtypes is not None:
            text += f" (input dtypes {self.dtypes})"
        super().__init__(text)


class OnnxLoadError(MithrilError):
    """The file or bytes given are not a loadable ONNX model."""


class UnsafeExternalDataError(OnnxLoadError):
    """An external-data path points outside the model's folder."""


class TensorTooLargeError(OnnxLoadError):
    """A tensor's dims and dtype ask for more bytes than the size limit (by default the machine's
    memory); refused before anything is allocated, naming the tensor and its size in bytes."""


class UnsupportedOpError(NodeError):
    """No kernel for this op at this opset (on this backend)."""


def _node_lines(rows: Iterable[tuple[str, str, int | None]], notes: dict[str, str] | None) -> list[str]:
    """``  label: op (opset N); note`` per node."""
    lines = []
    for label, op, opset in rows:
        line = f"  {label}: {op}" + (f" (opset {opset})" if opset is not None else "")
        if notes and notes.get(label):
            line += f"; {notes[label]}"
        lines.append(line)
    return lines


class UnsupportedDomainError(MithrilError):
    """The graph uses operator domains with no kernel on the backend (none registered, or only
    for other backends: ``notes`` says which); ``hint`` says how to register one."""

    def __init__(self, nodes: Iterable[tuple[str, str, str]], *, backend: str | None = None,
                 opsets: dict[str, int] | None = None, notes: dict[str, str] | None = None, hint: str = ""):
        self.nodes = list(nodes)
        self.backend = backend
        lines = _node_lines(((label, f"{domain}::{op}", (opsets or {}).get(domain)) for label, domain, op in self.nodes),
                            notes)
        domains = sorted({d for _, d, _ in self.nodes})
        on = f" on backend {backend!r}" if backend and backend != "*" else ""
        super().__init__(
            f"unsupported domain(s) {', '.join(domains)}{on}; {len(self.nodes)} node(s) use them:\n"
            + "\n".join(lines) + (f"\n{hint}" if hint else "")
        )


class KernelRegistrationError(MithrilError):
    """A kernel registered twice by accident (both definitions named), or with a bad name, domain,
    version or function (``register_op``, ``@kernel``, ``@override``)."""


class UnsupportedOpsError(MithrilError):
    """Several ops at once have no kernel: raised listing all of them."""

    def __init__(self, missing: list[tuple[str, str, int]], backend: str, *, notes: dict[str, str] | None = None,
                 hint: str = ""):
        self.missing = missing
        lines = _node_lines(missing, notes)
        super().__init__(
            f"backend {backend!r} has no kernel for {len(missing)} node(s):\n" + "\n".join(lines)
            + (f"\n{hint}" if hint else "")
        )


class UnsupportedAttributeError(NodeError):
    """The kernel does not implement an attribute the node sets."""


class ShapeError(NodeError):
    """Shapes that cannot agree, or a shape the compile step needs but was not given."""


class DTypeError(NodeError):
    """A dtype that is wrong for the input, or unsupported by a backend."""


class UnsupportedDTypeError(DTypeError):
    """The backend cannot represent a dtype the graph uses (MLX float64, torch uint32...)."""


class InputError(MithrilError):
    """Missing, unexpected, or mis-shaped/mis-typed inputs to ``evaluate``."""


class ForeignArrayError(InputError, TypeError):
    """An array of another framework where a backend takes its own arrays or NumPy's (a
    ``torch.Tensor`` given to a JaxBackend model or to ``JaxBackend().add``): the message names
    the kinds it takes and how to convert. A TypeError too, as Python raises for a wrong type."""


class NotABackendError(MithrilError, TypeError):
    """A backend class or a name where a backend instance is expected (``ml.NumpyBackend.ones(3)``
    for ``ml.NumpyBackend().ones(3)``); the message says what to write. A TypeError too."""


class KernelError(NodeError):
    """A kernel failed while running; wraps the underlying exception with node context."""


class BackendUnavailableError(MithrilError):
    """The framework behind a backend is not installed, or the device is not present."""


class ValidationError(MithrilError):
    """Validation against onnxruntime could not be carried out."""


# -- the logical-model frontend ---------------------------------------------------------------------
class ModelError(MithrilError):
    """Composing a logical Model went wrong; the message names the model and the terminal."""


class LambdaTraceError(ModelError):
    """A Lambda's function could not be traced into ONNX nodes (``ml.Lambda``)."""


class ShapeMismatchError(ModelError, ShapeError):
    """Two connected terminals (or a block's shape rule) disagree on a shape."""


class TypeMismatchError(ModelError, DTypeError):
    """Two connected terminals disagree on an element type."""


class UnconnectedInputError(ModelError):
    """A required input terminal is bound to nothing when the model is compiled or exported."""


class CycleError(ModelError):
    """A connection would make a block depend on its own output."""


class DuplicateOutputError(ModelError):
    """Two blocks write the same named connection."""


class MissingShapeError(ModelError, ShapeError):
    """Compile or export needs a concrete shape (a parameter's) that the given shapes do not fix."""


# -- the boundary of the public API -----------------------------------------------------------------
class CompileError(MithrilError):
    """Lowering a model failed for a reason no single node explains."""


class PassError(CompileError):
    """A graph pass failed on this model; the message names the pass."""


class EvaluationError(MithrilError):
    """Running a compiled model failed outside any one kernel (a backend's input conversion...)."""


class JitTraceError(EvaluationError):
    """A backend's jit could not trace or compile the program (torch.compile's dynamo or
    inductor...); ``evaluate`` then runs it eagerly with one ``JitFallbackWarning``. ``where``
    lists the ``(filename, line)`` of the generated code being traced, innermost last, so the
    warning can name the node."""

    def __init__(self, message: str, where: Sequence[tuple[str, int]] = ()):
        self.where = list(where)
        super().__init__(message)


class ExportError(ModelError):
    """A model could not be exported to ONNX, or the file could not be written."""


class OptimizerError(MithrilError):
    """An optimizer step or the training loop got what it cannot use."""


class ParamsFileError(MithrilError):
    """A parameter file that cannot be written or read."""


class ConnectionKeyError(ModelError, KeyError):
    """A model has no connection of that name (``model["x"]``); a KeyError too, as for a dict."""

    def __str__(self) -> str:  # KeyError's str() quotes the message
        return str(self.args[0]) if self.args else ""


def public_api(error: type[MithrilError], what: str):
    """Decorate an entry point of the public API so that everything it raises is a MithrilError.

    A MithrilError passes unchanged. Any other exception (a library's, or a bug of Mithril's own)
    becomes ``error`` saying what failed and why, with the original kept as ``__cause__`` for the
    traceback. KeyboardInterrupt and SystemExit are no errors and pass through.
    """

    def wrap(fn):
        @functools.wraps(fn)
        def entry(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except MithrilError:
                raise
            except RecursionError as exc:
                raise error(f"{what} failed: the model nests too deeply to process ({exc})") from exc
            except MemoryError as exc:
                raise error(f"{what} failed: out of memory ({exc or 'no details'})") from exc
            except Exception as exc:
                raise error(f"{what} failed: {type(exc).__name__}: {exc}") from exc

        return entry

    return wrap


# -- backend options ---------------------------------------------------------------------------------
class BackendOptionError(MithrilError, TypeError, ValueError):
    """A backend constructor (or its ``jit_options``) got an option it does not have, or a value
    it cannot use; the message lists the valid ones. A TypeError and a ValueError too, as Python
    raises for an unknown keyword or a bad value."""


class BackendOptionWarning(UserWarning):
    """A backend option that cannot apply on this machine (``cudnn_benchmark`` without CUDA,
    ``use_ane`` off Apple...): the backend says so in one line and runs without it."""


class DeviceFallbackWarning(BackendOptionWarning):
    """The device asked for is not present here; the backend runs on the CPU instead."""


class FallbackWarning(BackendOptionWarning):
    """A segmented backend (C, GGML) runs the nodes it has no rule for on NumPy, between its own
    segments (``fallback="numpy"``): one warning at compile, listing them with why."""


class KernelMissingError(CompileError):
    """A segmented backend made with ``fallback=None`` and nodes it has no rule for: all of them
    listed, with why each is not run natively."""


# -- device meshes -----------------------------------------------------------------------------------
class MeshError(MithrilError, ValueError):
    """A device mesh that can't be built here (more devices than the engine sees, a process group
    of another size), or an array or parameter that can't be split over it (a dim that is not a
    multiple of its axis); the message says how to get the devices or which split to change."""


class ReplicatedOpsWarning(UserWarning):
    """A parallel strategy left some parameters whole on every device (a dim that does not divide,
    an op the strategy can't split): one warning at compile, listing them."""
