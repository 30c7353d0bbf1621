"""``ml.compile``: a model plus a backend becomes a :class:`~mithril.physical_model.PhysicalModel`.

``compile`` takes ONNX (a path, bytes, a proto or a loaded :class:`OnnxModel`) or any object
that exports itself: one with an ``export_for_compile(shapes=..., dtype=...)`` method returning
an :class:`ExportedModel` (the frontend's ``Model``, its blocks and ``TrainModel`` do). Compiling
knows nothing of the frontend beyond that hook.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import dataclasses
import time
import warnings

import numpy as np
import onnx_ir as ir

from .backends import kernels  # noqa: F401  (registers every kernel)
from .backends.backend import Backend
from .backends.checkpoint import GradientCheckpointingWarning
from .backends.runner import JitFallbackWarning
from .backends.plan import Plan, build_plan, static_initializers
from .dtypes import is_floating_np, np_dtype_of_onnx
from .errors import CompileError, MithrilError, ShapeError, UnsupportedDTypeError, public_api
from .onnx_bridge.load import OnnxModel, load_onnx
from .backends.precision import convert_precision
from .backends.specialize import specialize
from .physical_model import PhysicalModel


@dataclasses.dataclass(frozen=True)
class ExportedModel:
    """A model exported for :func:`compile`: its ONNX graph and the roles of some of its values.

    - ``buffers``: values a training step overwrites rather than trains (BatchNorm running
      statistics); compile keeps them out of the default trainable keys.
    - ``loss_key``: the output a training graph differentiates by default (None: no loss).
    - ``buffer_updates``: buffer -> the output holding its update, which a training loop copies
      back after each step (``PhysicalModel.buffer_updates``).

    >>> import mithril as ml
    >>> exported = ml.Linear(dimension=2).export_for_compile(shapes={"input": [1, 3]}, dtype=None)
    >>> type(exported).__name__, exported.loss_key, sorted(exported.buffers)
    ('ExportedModel', None, [])
    """

    onnx: OnnxModel
    buffers: frozenset[str] = frozenset()
    loss_key: str | None = None
    buffer_updates: Mapping[str, str] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Exportable(Protocol):
    """What compile asks of a model object that is not ONNX: export yourself, with the input
    dims ``shapes`` fixes and floats left open taking ``dtype`` (the backend's)."""

    def export_for_compile(self, *, shapes: Mapping[str, Iterable[int]] | None, dtype) -> ExportedModel:
        ...


def _export(model, shapes, dtype) -> ExportedModel:
    """``model`` as compile takes it: ONNX as it is, an :class:`Exportable` by its hook."""
    if isinstance(model, OnnxModel):
        return ExportedModel(model)
    if isinstance(model, Exportable):
        exported = model.export_for_compile(shapes=shapes, dtype=dtype)
        if not isinstance(exported, ExportedModel):
            raise CompileError(f"{type(model).__name__}.export_for_compile returned a {type(exported).__name__}, "
                               f"not an ExportedModel")
        return exported
    return ExportedModel(load_onnx(model))


def _clone(model: ir.Model) -> ir.Model:
    # Passes mutate the graph in place; the user's model must stay as loaded. Tensors are shared
    # (passes replace values, never write into tensors), so this is cheap for big models.
    return model.clone()


def _batchnorm_statistics(graph: ir.Graph) -> set[str]:
    """Initializers read as BatchNormalization's running mean/var: statistics, not weights."""
    names: set[str] = set()
    for node in graph.all_nodes():
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for v in node.inputs[3:5]:
                if v is not None and v.is_initializer():
                    names.add(v.name)
    return names


@public_api(CompileError, "compile")
def compile(
    model,
    backend: Backend,
    shapes: Mapping[str, Iterable[int]] | None = None,
    data_keys: Iterable[str] | None = None,
    constant_keys: Iterable[str] | None = None,
    trainable_keys: Iterable[str] | None = None,
    inference: bool = False,
    jit: bool | None = None,
    file_path: str | None = None,
    *,
    jit_options: Mapping[str, Any] | None = None,
    static_shapes: bool = False,
    static_inference: bool = False,
    auto_scalar_promotion: bool = True,
    verbose: bool = False,
    gradient_checkpointing: bool = False,
    keep_io_types: bool = False,
    parallel: str | Mapping[str, str] | None = None,
    sharding: Mapping[str, Any] | None = None,
    **unknown_options,
) -> PhysicalModel:
    """Lower ``model`` (an ONNX path/bytes/proto, a loaded model, or a frontend ``Model`` or
    block) onto ``backend``.

    - ``shapes`` fixes input dims for this compilation; ``data_keys`` names the inputs fed as data
      (their gradients are returned); ``constant_keys`` folds initializers into the program;
      ``trainable_keys`` chooses what is differentiated (default: floating initializers).
    - ``inference=True`` (or ``static_inference=True``) builds no gradient program.
    - ``jit``: None takes the backend's default (``backend.jit_by_default``: JAX and MLX jit,
      Torch runs eagerly unless asked); ``jit_options`` go to the backend's jit
      (``torch.compile``'s ``backend``/``mode``, ...).
    - ``static_shapes=True`` refuses a program with a dim left symbolic, naming the inputs whose
      dims ``shapes`` must fix.
    - ``auto_scalar_promotion`` (default True): Python scalars and lists given as data take the
      input's declared dtype; with False they are refused (pass arrays of that dtype).
    - ``verbose=True`` prints each stage (build, specialize, plan, lower, gradients, jit) with
      its time, and the inputs and outputs with their shapes.
    - ``gradient_checkpointing=True`` recomputes activations in the backward pass instead of
      keeping them: the graph is cut into segments (:mod:`mithril.backends.checkpoint`), each
      run again before its gradients (``torch.utils.checkpoint``, ``mx.checkpoint``, a
      ``custom_vjp`` per segment on JAX; NumPy's gradient program re-runs them). Same gradients,
      less memory, about one more forward pass of work.
    - ``parallel`` (on a backend with a ``device_mesh``): the strategy, ``"data"`` (the default
      there), ``"fsdp"``, ``"tensor"`` or ``"pipeline"``, or a dict ``{strategy: mesh axis}`` such
      as ``{"data": "data", "tensor": "model"}`` (a pipeline's also takes ``"microbatches": n``,
      default one per stage; ``shapes`` then gives the whole batch); ``sharding`` overrides it per
      name, ``{regex: spec}`` with one mesh axis or None per dim. ``pm.sharding`` is the resulting
      :class:`~mithril.distributed.ShardingPlan` (docs/distributed.md).
    - A float32 model on a float16, bfloat16 or float64 backend is converted to that dtype
      (:mod:`mithril.backends.precision`; docs/precision.md); ``keep_io_types=True`` keeps its
      float inputs and outputs in the file's dtype, with Casts at the boundary.

    >>> import mithril as ml, numpy as np
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    >>> pm = ml.compile(ml.load_onnx(helper.make_model(g)), ml.NumpyBackend(), shapes={"x": [2, 3]})
    >>> pm.evaluate({}, {"x": np.array([[-1, 2, 3]] * 2, np.float32)})["y"].tolist()
    [[0.0, 2.0, 3.0], [0.0, 2.0, 3.0]]
    """
    if unknown_options:
        raise CompileError(f"unknown compile option(s) {sorted(unknown_options)}; valid options: "
                           f"{', '.join(_COMPILE_OPTIONS)}")
    if not isinstance(backend, Backend):
        if isinstance(backend, type) and issubclass(backend, Backend):
            raise CompileError(f"compile takes a backend instance: {backend.__name__}(), not the class")
        raise CompileError(f"compile takes a backend instance such as ml.NumpyBackend(), not {backend!r}")
    inference = inference or static_inference
    if jit is None:
        jit = backend.jit_by_default
    if parallel is None:
        parallel = backend.default_parallel
    parts = _microbatches(backend, parallel)
    if parts > 1 and shapes:  # a pipeline's program runs one micro-batch: its batch is the given one's part
        shapes = _micro_shapes(shapes, parts)
    stages = _Stages(verbose, backend)
    # Floats the model leaves open take the backend's dtype (float64 on NumpyBackend(dtype=ml.float64)).
    exported = _export(model, shapes, backend.dtype)
    model, buffers = exported.onnx, set(exported.buffers)
    loss_key, buffer_outputs = exported.loss_key, dict(exported.buffer_updates)
    stages.done("build" if loss_key is None and not buffers else "build (training graph)")
    work = _clone(model.ir)
    convert_precision(work, backend, keep_io_types=keep_io_types)
    opsets = OnnxModel(work).opset_imports  # the precision pass may import the ONNX domain for its Casts
    graph = work.graph
    buffers |= _batchnorm_statistics(graph)
    constant_keys = set(constant_keys or ())
    unknown = constant_keys - set(graph.initializers)
    if unknown:
        raise MithrilError(f"constant_keys names {sorted(unknown)}, which are not initializers of the model")
    # Non-floating initializers (shapes, indices) and those read as static inputs are constants.
    constants = set(constant_keys)
    constants |= {n for n, v in graph.initializers.items() if v.const_value is not None and
                  not is_floating_np(np_dtype_of_onnx(int(v.const_value.dtype)))}
    constants |= static_initializers(graph, opsets, backend.name)  # read as a shape, axes, scales...
    # An initializer that is also a graph input can be overridden by the caller: never a constant.
    constants -= {v.name for v in graph.inputs}
    specialize(work, dict(shapes) if shapes else None, constants, opsets)
    graph = work.graph
    stages.done("specialize")
    param_names = [n for n in graph.initializers if n not in constants]
    for v in graph.inputs:
        if v.name in graph.initializers and v.name not in param_names:
            param_names.append(v.name)
    if trainable_keys is not None:
        trainable = set(trainable_keys)
    else:
        trainable = {n for n in param_names
                     if is_floating_np(np_dtype_of_onnx(int(graph.initializers[n].const_value.dtype)))}
    trainable -= constant_keys
    if trainable_keys is None:
        trainable -= buffers
    inputs = [v for v in graph.inputs if v.name not in set(param_names)]
    data_keys = set(data_keys or ())
    _check_data_keys(data_keys, inputs, param_names)
    stages.shapes(inputs, graph.outputs)
    if static_shapes:
        _check_static_inputs(inputs)
    _check_backend_dtypes(graph, backend, set(param_names))
    plan = build_plan(graph, opsets, backend.name, param_names=set(param_names))
    # What gradients or buffer updates change, and (inference) what the caller keeps changeable.
    moving = buffers | (set(trainable_keys or ()) if inference else trainable)
    for pv in plan.params:
        pv.frozen = pv.name not in moving
    if static_shapes:
        _check_static_plan(plan)
    stages.done(f"plan ({len(plan.nodes)} nodes)")
    if gradient_checkpointing and inference:
        warnings.warn("gradient_checkpointing=True does nothing with inference=True: no gradients are computed",
                      GradientCheckpointingWarning, stacklevel=3)
    checkpointing = bool(gradient_checkpointing) and not inference
    sharding_plan = _sharding_plan(backend, plan, parallel, sharding)
    if sharding_plan is not None:
        backend.check_sharding(sharding_plan)
    if sharding_plan is not None and sharding_plan.pipeline is not None:
        if checkpointing:
            raise CompileError("gradient_checkpointing=True and a pipeline: each pipeline stage keeps its "
                               "activations; choose one")
        # Each stage is its own program on its devices (backend.pipeline_stage), not one jitted whole.
        program, jit = backend.lower_stages(plan, sharding_plan.pipeline, file_path=file_path), False
    else:
        program = backend.lower(plan, file_path=file_path, gradient_checkpointing=checkpointing)
    stages.done("lower")
    pm = PhysicalModel(model, backend, work, program, param_names, trainable, data_keys, inference)
    pm.sharding = sharding_plan
    pm.buffer_keys = buffers & set(param_names)
    pm.plan = plan
    pm.baked_params = {pv.name: pv for pv in plan.params if pv.baked}  # the passes ran in lower
    pm.auto_scalar_promotion = auto_scalar_promotion
    pm.gradient_checkpointing = checkpointing
    if not inference:
        diff_params, diff_data = pm.diff_names()
        try:
            pm.backward = backend.lower_backward(
                plan, diff_names=diff_params + diff_data,
                file_path=file_path + ".vjp.py" if file_path else None, gradient_checkpointing=checkpointing,
            )
        except MithrilError as exc:
            # Found at compile either way. A model compiled to train (it has a loss, or the caller
            # chose what to differentiate with trainable_keys / data_keys) fails here; one that may
            # only ever run forward keeps the error for its first gradient request.
            if loss_key is not None or trainable_keys is not None or data_keys:
                raise
            pm.gradient_error = exc
        stages.done("gradients")
    pm.loss_key, pm.buffer_updates = loss_key, buffer_outputs
    backend.wait_for_build(program)
    stages.done("build")
    if jit:
        jitted = backend.jit(program.forward, dict(jit_options or {}))
        blocking = _jit_blockers(plan) if jitted is not program.forward else []
        if blocking:
            warnings.warn(f"running un-jitted because of {'; '.join(blocking)}", JitFallbackWarning, stacklevel=3)
        elif jitted is not program.forward:
            pm.use_jitted(jitted)
        stages.done("jit (traced at the first evaluate)" if pm.jitted is not None else "jit (eager)")
    elif jit_options:
        raise CompileError("jit_options were given with jit=False")
    return pm


_COMPILE_OPTIONS = ("shapes", "data_keys", "constant_keys", "trainable_keys", "inference", "jit",
                    "file_path", "jit_options", "static_shapes", "static_inference",
                    "auto_scalar_promotion", "verbose", "gradient_checkpointing", "keep_io_types", "parallel",
                    "sharding")


def _microbatches(backend: Backend, parallel) -> int:
    if parallel is None or backend.mesh is None or backend.mesh.size == 1:
        return 1
    from .distributed.sharding import microbatches

    return microbatches("compile", parallel, backend.mesh)


def _micro_shapes(shapes: Mapping[str, Iterable[int]], parts: int) -> dict[str, list]:
    """``shapes`` with each fixed batch (dim 0) cut into ``parts``."""
    out = {}
    for name, shape in shapes.items():
        shape = list(shape)
        if shape and isinstance(shape[0], int):
            if shape[0] % parts:
                raise CompileError(f"shapes[{name!r}] = {shape}: its batch ({shape[0]}) is not a multiple of the "
                                   f"pipeline's {parts} micro-batches")
            shape[0] //= parts
        out[name] = shape
    return out


def _sharding_plan(backend: Backend, plan: Plan, parallel, sharding):
    """The ShardingPlan on a backend with a device mesh of several devices. None without a mesh,
    where parallel= and sharding= are errors (nothing to split over), and on a one-device mesh,
    whose plan splits nothing: the options are checked (a script written for N devices runs on
    one, and its typos show there too) and the plain program runs."""
    mesh = backend.mesh
    if mesh is None:
        if parallel is not None or sharding is not None:
            option = "parallel" if parallel is not None else "sharding"
            raise CompileError(f"{option}= splits a model over a device mesh, and {type(backend).__name__} has none: "
                               f"create the backend with device_mesh=..., e.g. JaxBackend(device_mesh=(2,))")
        return None
    from .distributed import plan_sharding

    if mesh.size == 1:
        if parallel is not None or sharding is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what one device cannot split is no news
                plan_sharding("compile", plan, mesh, parallel, sharding)
        return None
    return plan_sharding("compile", plan, mesh, parallel, sharding)


class _Stages:
    """``compile(verbose=True)``: one line per stage with its wall time, and the program's
    inputs and outputs with their shapes after specialization."""

    def __init__(self, verbose: bool, backend: Backend):
        self.verbose = verbose
        self.start = self.last = time.perf_counter()
        if verbose:
            print(f"[mithril.compile] {type(backend).__name__}(dtype={backend.dtype!r}, device={backend.device!r})")

    def done(self, stage: str) -> None:
        if self.verbose:
            now = time.perf_counter()
            print(f"[mithril.compile] {stage:<40} {1e3 * (now - self.last):9.1f} ms")
            self.last = now

    def shapes(self, inputs, outputs) -> None:
        if self.verbose:
            for kind, values in (("input", inputs), ("output", outputs)):
                for v in values:
                    print(f"[mithril.compile]   {kind} {v.name}: {_describe(v)}")


def _describe(value: ir.Value) -> str:
    shape = "?" if value.shape is None else "[" + ", ".join(str(d) for d in value.shape) + "]"
    dtype = str(np_dtype_of_onnx(int(value.dtype))) if value.dtype is not None else "?"
    return f"{shape} {dtype}"


def _check_data_keys(data_keys: set[str], inputs: list[ir.Value], param_names: list[str]) -> None:
    unknown = sorted(data_keys - {v.name for v in inputs})
    if not unknown:
        return
    params = [k for k in unknown if k in param_names]
    if params:
        raise CompileError(f"data_keys names {params}, which are parameters of the model, not inputs; "
                           f"choose what trains with trainable_keys, or freeze with constant_keys")
    raise CompileError(f"data_keys names {unknown}, which the model does not take; its inputs are "
                       f"{[v.name for v in inputs]}")


def _check_static_inputs(inputs: list[ir.Value]) -> None:
    """static_shapes=True: every dim of every input is a number."""
    loose = {v.name: _describe(v) for v in inputs
             if isinstance(v.type, ir.TensorType) and (v.shape is None or any(not isinstance(d, int) for d in v.shape))}
    if loose:
        listed = "; ".join(f"{k}: {d}" for k, d in loose.items())
        raise CompileError(f"static_shapes=True needs every input dim fixed; give shapes= for {listed}")


def _check_static_plan(plan: Plan) -> None:
    """static_shapes=True: no node whose output shape depends on input values."""
    for pn in plan.all_nodes():
        if pn.spec.data_dependent_shape:
            raise ShapeError("static_shapes=True, but this node's output shape depends on input values",
                             node=pn.label, op_type=pn.op_type, opset=pn.opset)


def _check_backend_dtypes(graph: ir.Graph, backend: Backend, params: set[str]) -> None:
    """A dtype the backend cannot hold is an error at compile time, with the reason."""
    seen = set()
    # A constant no node reads any more (an int4 weight whose DequantizeLinear folded) never
    # reaches the backend; parameters do, read or not.
    read = {v for node in graph.all_nodes() for v in node.inputs} | set(graph.outputs)
    values = list(graph.inputs) + [v for v in graph.initializers.values() if v in read or v.name in params]
    for node in graph.all_nodes():
        values.extend(node.outputs)
    for v in values:
        if v.dtype is None or not isinstance(v.type, ir.TensorType):
            continue
        try:
            dt = np_dtype_of_onnx(int(v.dtype))
        except (KeyError, ValueError, TypeError):
            continue
        if dt in seen:
            continue
        seen.add(dt)
        reason = backend.unsupported_dtype_reason(dt)
        if reason:
            producer = v.producer()
            raise UnsupportedDTypeError(
                f"{type(backend).__name__} cannot hold {dt} (value {v.name!r}): {reason}",
                node=(producer.name or producer.op_type) if producer is not None else None,
                op_type=producer.op_type if producer is not None else None,
            )


def _jit_blockers(plan: Plan) -> list[str]:
    """Nodes that keep a graph from being traced once: value-dependent output shapes, and random
    draws (a trace would bake one draw into the compiled program)."""
    out = []
    for pn in plan.all_nodes():
        if pn.spec.data_dependent_shape:
            out.append(f"{pn.label} ({pn.op_type}: output shape depends on input values)")
        elif pn.spec.nondeterministic and not _inference_dropout(pn):
            out.append(f"{pn.label} ({pn.op_type}: random draws)")
    return out


def _inference_dropout(pn) -> bool:
    """Dropout without a training_mode input, or with a constant false one, is the identity."""
    if pn.op_type != "Dropout":
        return False
    mode = pn.inputs[2] if len(pn.inputs) > 2 else None
    if mode is None:
        return True
    return mode.kind == "constant" and not bool(np.asarray(mode.value).reshape(-1)[0])


__all__ = ["compile", "Exportable", "ExportedModel", "JitFallbackWarning", "PhysicalModel"]
