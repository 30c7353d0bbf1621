"""``ml.compile``: a model plus a backend becomes a :class:`PhysicalModel`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dataclasses
import functools
import time
import warnings
import weakref

import numpy as np
import onnx_ir as ir

from .backends import kernels  # noqa: F401  (registers every kernel)
from .backends.backend import Backend
from .backends.table import backend_of_array
from .backends.checkpoint import GradientCheckpointingWarning
from .backends.runner import JitFallbackWarning, Program, jit_fallback_reason, node_error
from .backends.emit_python import LoweredProgram
from .backends.plan import Plan, build_plan, static_initializers
from .dtypes import is_floating_np, np_dtype_of_onnx, tensor_array
from .errors import (CompileError, DTypeError, EvaluationError, InputError, JitTraceError, MithrilError, ShapeError,
                     UnsupportedDTypeError, public_api)
from .onnx_bridge.load import OnnxModel, load_onnx
from .backends.precision import convert_precision
from .backends.specialize import specialize


def _clone(model: ir.Model) -> ir.Model:
    # Passes mutate the graph in place; the user's model must stay as loaded. Tensors are shared
    # (passes replace values, never write into tensors), so this is cheap for big models.
    return model.clone()


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _batchnorm_statistics(graph: ir.Graph) -> set[str]:
    """Initializers read as BatchNormalization's running mean/var: statistics, not weights."""
    names: set[str] = set()
    for node in graph.all_nodes():
        if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
            for v in node.inputs[3:5]:
                if v is not None and v.is_initializer():
                    names.add(v.name)
    return names


class PhysicalModel:
    """A model lowered onto one backend.

    ``evaluate(params, data)`` runs it; ``code`` is the generated source.
    """

    def __init__(
        self,
        model: OnnxModel,
        backend: Backend,
        graph_model: ir.Model,
        program: LoweredProgram,
        param_names: list[str],
        trainable_keys: set[str],
        data_keys: set[str],
        inference: bool,
    ):
        self.model = model
        self.backend = backend
        self.ir = graph_model
        self.program = program
        self._param_names = param_names
        self.trainable_keys = trainable_keys
        self.data_keys = data_keys
        self.inference = inference
        # compile(gradient_checkpointing=True) applied: the backward pass recomputes activations.
        self.gradient_checkpointing = False
        graph = graph_model.graph
        self._inputs = {v.name: v for v in graph.inputs if v.name not in set(param_names)}
        # What each parameter is declared as: its graph input when it is one (it may be overridden
        # with other dims), else its initializer.
        declared_inputs = {v.name: v for v in graph.inputs}
        self._param_values = {n: declared_inputs.get(n) or graph.initializers[n] for n in param_names}
        self.input_keys = list(self._inputs)
        self.output_keys = [v.name for v in graph.outputs]
        # backend.jit's program (set by compile), None when evaluation is eager; a failed trace
        # before any jitted run worked sets it back to None (JitFallbackWarning).
        self._jitted = None
        # A jitted run worked: later failures are real errors, not reasons to fall back. Forward and
        # gradients are traced apart (JAX traces the vector-Jacobian product as its own program).
        self._jit_verified = {"forward": False, "gradients": False}
        self._gradients_jit = True  # False once the gradients' trace failed (the forward may still jit)
        # A backend without autodiff: its gradient program, built at compile (Backend.lower_backward).
        self.backward = None
        # Why this backend cannot differentiate the model (found at compile), if it cannot.
        self.gradient_error: MithrilError | None = None
        # Values a training step overwrites rather than trains (BatchNorm running statistics).
        self.buffer_keys: set[str] = set()
        # A compiled TrainModel's loss: evaluate(params, data) differentiates it by default; and
        # buffer -> the output holding its update, which a training loop copies back after a step.
        self.loss_key: str | None = None
        self.buffer_updates: dict[str, str] = {}
        # Python scalars and lists given as data take the input's dtype (compile's option).
        self.auto_scalar_promotion = True
        self._params_numpy = {
            name: tensor_array(graph.initializers[name].const_value) for name in param_names
        }
        # Weights held once where the backend keeps its own memory: the model keeps NumPy arrays
        # the backend runs in place (Backend.share: views of MLX's arrays; on JAX's CPU, buffers
        # aligned as XLA adopts them), hold() then shares them.
        user_inits = model.ir.graph.initializers
        shared_any = False
        for name in list(self._params_numpy):
            arr = self._params_numpy[name]
            shared = backend.share(arr)
            if shared is arr:
                continue
            self._params_numpy[name] = shared
            old = graph.initializers[name].const_value
            new = ir.Tensor(shared, name=old.name, doc_string=old.doc_string)
            graph.initializers[name].const_value = new
            if name in user_inits and user_inits[name].const_value is old:
                user_inits[name].const_value = new
            del old, new, arr
            shared_any = True
        if shared_any:
            from .onnx_bridge.load import release_freed_heap
            release_freed_heap()  # the NumPy copies' pages, back to the system
        # Where each parameter and input goes on the backend's device mesh (compile's parallel= and
        # sharding=; mithril.distributed.ShardingPlan), None on one device.
        self.sharding = None
        self._placed: dict[str, Any] | None = None  # the model's own parameters, placed (evaluate(None))

    @property
    def code(self) -> str:
        return self.program.source

    @property
    def parameter_keys(self) -> list[str]:
        return list(self._param_names)

    def memory_report(self):
        """Bytes this model holds: weights (per dtype), its intermediates' naive sum and peak by
        the plan's lifetimes, and the C backend's arena (:class:`mithril.memory.MemoryReport`;
        print it for a table)."""
        from .memory import plan_memory

        return plan_memory(self.plan, self.backend.name, self.program)

    def get_parameters(self) -> dict[str, Any]:
        """The model's initializers (those not folded into the program) as backend arrays (on a
        device mesh, placed by :attr:`sharding`).

        Weights are not copied where the backend computes on NumPy arrays (NumPy, C, GGML): those
        are read-only views of the model's own arrays (an optimizer step makes new arrays; to
        change one in place, ``np.array(params[k])`` first). Other backends copy each weight once
        into their own memory."""
        return self.place({k: _read_only(v) for k, v in self._params_numpy.items()})

    def _own_parameters(self) -> dict[str, Any]:
        # evaluate(None, ...): placed once, not copied onto the backend at every call.
        if self._placed is None:
            if self.sharding is None:  # held, not copied, where the backend can run on the model's arrays
                self._placed = {k: self.backend.hold(_read_only(v)) for k, v in self._params_numpy.items()}
            else:
                self._placed = self.get_parameters()
        return self._placed

    def place(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` (NumPy or backend arrays) as the model runs them: on a device mesh, each
        where :attr:`sharding` puts it (split, or on its pipeline stage); else backend arrays.
        Place parameters once before a training loop, so the optimizer state follows them."""
        if self.sharding is not None:
            return self.backend.place(dict(params), self.sharding)
        native = self.backend.name
        return {k: v if backend_of_array(v).name == native != "numpy" else self.backend.from_numpy(np.asarray(v))
                for k, v in params.items()}

    def randomize_params(self) -> dict[str, Any]:
        """Fresh random parameters with the same names, shapes and dtypes.

        Floating tensors get a fan-in-scaled normal; integer and boolean ones keep their values
        (they are indices or masks, not weights), and so do buffers (``buffer_keys``: running
        statistics, whose variance must stay positive).
        """
        rng = self.backend.rng
        out = {}
        for k, v in self._params_numpy.items():
            if is_floating_np(v.dtype) and k not in self.buffer_keys:
                fan_in = int(np.prod(v.shape[1:])) if v.ndim >= 2 else max(v.size, 1)
                arr = rng.standard_normal(v.shape) / np.sqrt(max(fan_in, 1))
                out[k] = arr.astype(v.dtype)
            else:
                out[k] = np.array(v)
        return self.place(out)

    # -- evaluation ------------------------------------------------------------------
    # What evaluate takes, checked before anything runs: names, then per value its kind (arrays of
    # another framework are refused: ForeignArrayError), dtype (never cast) and shape (never
    # broadcast). NumPy arrays are taken by every backend, Python scalars and lists take the dtype
    # declared (auto_scalar_promotion). Output gradients are checked as inputs are, against the
    # outputs' dtypes and shapes (symbolic dims bound by the inputs given).
    def _check_data(self, data: Mapping[str, Any]) -> dict[str, Any]:
        _check_mapping("data", data, self.input_keys)
        missing = [k for k in self.input_keys if k not in data]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model takes {self.input_keys}")
        unknown = [k for k in data if k not in self._inputs]
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model takes {self.input_keys}")
        checked = {}
        for name, value in data.items():
            declared = self._inputs[name]
            checked[name] = self._check_value(name, declared, value)
        return checked

    def _check_value(self, name: str, declared: ir.Value, value: Any) -> Any:
        return self._check_declared(f"input {name!r}", "inputs", declared, value)

    def _check_declared(self, what: str, kind: str, declared: ir.Value, value: Any, local=None) -> Any:
        """``value`` given for ``declared`` (an input or a parameter): its kind, its dtype and its
        shape (int dims; symbolic ones take any size). ``local``: another shape taken too (a
        parameter's part as this process of a mesh holds it, ``Backend.local_shape``)."""
        if declared.type is None or not isinstance(declared.type, ir.TensorType):
            return value  # sequences and optionals pass as they are
        def node():  # named only when an error is raised: a walk of the value's uses
            return _consumer_label(declared)

        value = self._check_kind(what, value, declared, node)
        want = np_dtype_of_onnx(int(declared.dtype))
        got_dtype = self.backend.dtype_of(value)
        if got_dtype is not None and got_dtype != want:
            raise DTypeError(f"{what} expects {want} but got {got_dtype}; cast it explicitly "
                             f"(Mithril never casts {kind} silently)", node=node())
        shape = tuple(getattr(value, "shape", ()))
        if declared.shape is not None and (local is None or shape != tuple(local)):
            dims = tuple(declared.shape)
            if len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape)):
                held = "" if local is None else f" (or {list(local)}, this process's part on the mesh)"
                raise ShapeError(f"{what} expects shape {[d if isinstance(d, int) else str(d) for d in dims]}"
                                 f"{held} but got {list(shape)}", node=node())
        return value

    def _check_kind(self, what: str, value: Any, declared: ir.Value, node: Callable[[], str | None]) -> Any:
        """``value`` as an array the backend takes: a Python literal becomes a NumPy array of the
        declared dtype (unless auto_scalar_promotion=False); another framework's array is refused.
        ``node()`` names the node an error points at."""
        if isinstance(value, (list, tuple, int, float, bool)):
            want = np_dtype_of_onnx(int(declared.dtype))
            if not self.auto_scalar_promotion:
                raise DTypeError(
                    f"{what} got a Python {type(value).__name__}; this model was compiled with "
                    f"auto_scalar_promotion=False: pass an array of dtype {want}", node=node())
            return np.asarray(value, dtype=want)  # a Python literal has no dtype to lose
        self.backend.check_array(value, what)
        if self.backend.dtype_of(value) is None:
            raise InputError(f"{what} is a {type(value).__name__}, not an array; "
                             f"{type(self.backend).__name__} takes its arrays or NumPy arrays")
        return value

    def _check_params(self, params: Mapping[str, Any]) -> None:
        _check_mapping("params", params, self._param_names)
        missing = [k for k in self._param_names if k not in params]
        if missing:
            raise InputError(f"missing parameter(s) {missing[:10]}{'...' if len(missing) > 10 else ''}")
        unknown = [k for k in params if k not in self._param_values]
        if unknown:
            raise InputError(f"unknown parameter(s) {unknown[:10]}{'...' if len(unknown) > 10 else ''}; the model's "
                             f"are {self._param_names[:10]}{'...' if len(self._param_names) > 10 else ''}")
        # A parameter passed again as the same array object was checked then (a training loop
        # passes the same dict every step; BERT on C spent 0.1 ms a call here). Only a NumPy array
        # reshaped in place (``a.shape = ...``) slips through; the kernels still see its shape.
        seen = self.__dict__.setdefault("_params_checked", {})
        for name, value in params.items():
            ref = seen.get(name)
            if ref is not None and ref() is value:
                continue
            declared, local = self._param_values[name], None
            if self.sharding is not None and declared.shape is not None:  # a mesh process may hold a part
                local = self.backend.local_shape(name, tuple(declared.shape), self.sharding)
                local = None if local == tuple(declared.shape) else local
            self._check_declared(f"parameter {name!r}", "parameters", declared, value, local)
            try:
                seen[name] = weakref.ref(value)
            except TypeError:  # an array type without weak references: checked every call
                seen.pop(name, None)

    def _check_output_gradients(self, output_gradients: Mapping[str, Any], data: Mapping[str, Any]):
        """The cotangents keyed by output name, checked like inputs (a None entry is left out: a
        zero cotangent), and the outputs whose shape only the run can tell (a dim no input
        fixes), to check against the outputs computed: ``(cotangents, {name: known dims})``."""
        _check_mapping("output_gradients", output_gradients, self.output_keys)
        unknown = [k for k in output_gradients if k not in self.output_keys]
        if unknown:
            raise InputError(f"output_gradients names {unknown}, which are not outputs; the outputs are "
                             f"{self.output_keys}")
        given = {k: v for k, v in output_gradients.items() if v is not None}
        if not given:
            raise InputError(f"output_gradients names no output with a cotangent; give one for at least one of "
                             f"{self.output_keys} (outputs left out get zero)")
        outputs = {v.name: v for v in self.ir.graph.outputs}
        bound = _bound_dims(self._inputs, data)
        cotangents, unresolved = {}, {}
        for name, value in given.items():
            out = outputs[name]
            what = f"output_gradients[{name!r}]"
            node = _producer_label(out)
            if not isinstance(out.type, ir.TensorType):
                raise InputError(f"{what}: output {name!r} is not a tensor; it takes no cotangent")
            want = np_dtype_of_onnx(int(out.dtype))
            if not is_floating_np(want):
                raise DTypeError(f"{what}: output {name!r} is {want}, which has no gradient; leave it out "
                                 f"of output_gradients", node=node)
            value = self._check_kind(what, value, out, lambda: node)
            got = self.backend.dtype_of(value)
            if got != want:
                raise DTypeError(f"{what} must have the dtype of output {name!r}, {want}, but got {got}; cast it "
                                 f"explicitly (Mithril never casts silently)", node=node)
            expected = _expected_shape(out, bound)
            shape = tuple(getattr(value, "shape", ()))
            if expected is not None and (len(expected) != len(shape) or
                                         any(d is not None and d != s for d, s in zip(expected, shape))):
                raise _cotangent_shape_error(name, expected, shape, node)
            if expected is None or None in expected:
                unresolved[name] = expected
            cotangents[name] = value
        return cotangents, unresolved

    def _check_computed_shapes(self, cotangents: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """Cotangents whose output shape was unknown before the run, against the outputs computed."""
        for name, value in cotangents.items():
            want, got = tuple(getattr(outputs.get(name), "shape", ())), tuple(getattr(value, "shape", ()))
            if want != got:
                raise _cotangent_shape_error(name, want, got, _producer_label(
                    next(v for v in self.ir.graph.outputs if v.name == name)))

    @public_api(EvaluationError, "evaluate")
    def evaluate(self, params: Mapping[str, Any] | None = None, data: Mapping[str, Any] | None = None,
                 output_gradients: Mapping[str, Any] | None = None):
        """Run the model: ``params`` and ``data`` keyed by name -> outputs keyed by name.

        With ``output_gradients`` (cotangents keyed by output name) returns ``(outputs, gradients)``:
        gradients of every trainable parameter and of the differentiable ``data_keys``. A compiled
        :class:`~mithril.models.TrainModel` (unless ``inference=True``) does so by default, with
        the cotangent 1 for its ``loss_key`` output. Each cotangent has its output's dtype and
        shape (nothing is cast or broadcast); outputs left out (or given None) get zero.

        Values are the backend's own arrays or NumPy arrays (Python scalars and lists take the
        declared dtype); another framework's array is refused (``ForeignArrayError``).
        """
        if output_gradients is None and self.loss_key is not None and not self.inference:
            dtype = np_dtype_of_onnx(int(next(v for v in self.ir.graph.outputs if v.name == self.loss_key).dtype))
            output_gradients = {self.loss_key: self.backend.from_numpy(np.ones((), dtype))}
        with self.backend.scope():  # JAX: x64 and the device, for this call only
            if self.sharding is not None and self.sharding.microbatches > 1:
                return self._evaluate_parts(params, data, output_gradients, self.sharding.microbatches)
            return self._evaluate(params, data, output_gradients)

    def _evaluate_parts(self, params, data, output_gradients, parts: int):
        """A pipeline's evaluate: the batch cut into ``parts`` micro-batches, each run through the
        stages; per-row outputs concatenated, the others (a batch-mean loss) averaged, gradients
        summed (:mod:`mithril.distributed.pipeline`)."""
        from .distributed.pipeline import split_batch

        data = {} if data is None else dict(data)
        batched = [k for k in self.input_keys if k in data and np.ndim(data[k]) >= 1]
        datas = split_batch("evaluate", data, batched, parts)
        rows = np.shape(datas[0][batched[0]])[0] if batched else None
        if params is None or (isinstance(params, Mapping) and not params):
            params = self._own_parameters()
        if output_gradients is None:
            return self._join([self._evaluate(params, d, None) for d in datas], rows, parts)
        prepared = []
        for i, d in enumerate(datas):
            cots = {}
            for k, g in output_gradients.items():
                if g is not None and np.ndim(g) >= 1 and np.shape(g)[0] == rows * parts:
                    cots[k] = g[i * rows:(i + 1) * rows]
                else:  # an output the parts average: each part's share of its cotangent
                    cots[k] = None if g is None else g * (1.0 / parts)
            p, d, c, _ = self._prepare(params, d, cots)
            prepared.append((p, d, dict(c)))
        diff_params, diff_data = self._diff_names()
        program = Program(self.program.forward, None, self.backward)
        # GPipe: the backend issues every part's forward before the backward passes (vjp_parts).
        results = self._run("gradients", program, lambda prog: self.backend.vjp_parts(
            prog, prepared, diff_params, diff_data))
        outputs = self._join([self.backend.finalize_outputs(r[0]) for r in results], rows, parts)
        # A parameter's gradient sums over the parts; a batched input's is its parts' rows, joined.
        grads = {k: self.backend.concat([r[1][k] for r in results], axis=0) if k in batched else
                 functools.reduce(lambda a, b: a + b, (r[1][k] for r in results)) for k in results[0][1]}
        return outputs, grads

    def _join(self, outs: list[dict], rows, parts: int) -> dict:
        joined = {}
        for k, first in outs[0].items():
            shape = np.shape(first)
            if rows is not None and len(shape) >= 1 and shape[0] == rows:
                joined[k] = self.backend.concat([o[k] for o in outs], axis=0)
            else:
                joined[k] = functools.reduce(lambda a, b: a + b, (o[k] for o in outs)) * (1.0 / parts)
        return joined

    def _prepare(self, params, data, output_gradients):
        """Checked and placed ``(params, data, cotangents, unresolved)`` for one run."""
        if params is None or (isinstance(params, Mapping) and not params):  # the model's own parameters
            params = self._own_parameters()
        else:
            self._check_params(params)
        checked = self._check_data({} if data is None else data)
        cotangents, unresolved = None, []
        if output_gradients is not None:
            if self.inference:
                raise MithrilError("this model was compiled with inference=True: it computes no gradients")
            cotangents, unresolved = self._check_output_gradients(output_gradients, checked)
        data = self.backend.prepare_inputs(checked)
        params = self.backend.prepare_inputs(dict(params))
        if self.sharding is not None:
            data, params = self.backend.place(data, self.sharding), self.backend.place(params, self.sharding)
        if output_gradients is not None and self.gradient_error is not None:
            raise self.gradient_error
        return params, data, cotangents, unresolved

    def _diff_names(self) -> tuple[list[str], list[str]]:
        diff_params = [k for k in self._param_names if k in self.trainable_keys]
        diff_data = [k for k in self.input_keys if k in self.data_keys and
                     is_floating_np(np_dtype_of_onnx(int(self._inputs[k].dtype)))]
        return diff_params, diff_data

    def _evaluate(self, params, data, output_gradients):
        params, data, cotangents, unresolved = self._prepare(params, data, output_gradients)
        if output_gradients is not None:
            diff_params, diff_data = self._diff_names()
            program = Program(self.program.forward, self._jitted if self._gradients_jit else None, self.backward)
            try:
                outputs, grads = self._run("gradients", program, lambda prog: self.backend.vjp(
                    prog, dict(params), data, diff_params, diff_data, dict(cotangents)))
            except MithrilError:
                if unresolved:  # the failure may be a cotangent of the wrong shape: say so if it is
                    self._check_computed_shapes({k: cotangents[k] for k in unresolved},
                                                self._run("forward", dataclasses.replace(program, jitted=None),
                                                          lambda prog: prog.forward(params, data)))
                raise
            if unresolved:
                self._check_computed_shapes({k: cotangents[k] for k in unresolved}, outputs)
            return self.backend.finalize_outputs(outputs), grads
        program = Program(self.program.forward, self._jitted, self.backward)
        out = self._run("forward", program, lambda prog: (prog.jitted or prog.forward)(params, data))
        return self.backend.finalize_outputs(out)

    def _run(self, kind: str, program: Program, call):
        """``call(program)``, the one place a jitted program falls back to eager: a jitted run
        that fails before one of its ``kind`` has worked runs once more with ``jitted=None``; if
        that works the trace was at fault, and this ``kind`` stays eager from then on (one
        JitFallbackWarning). Other failures are real errors, named by their node."""
        if program.jitted is not None:
            try:
                out = call(program)
            except Exception as exc:
                if self._jit_verified[kind]:
                    if isinstance(exc, MithrilError):
                        raise
                    raise node_error(self.program, exc) from exc
                trace_error = exc
            else:
                self._jit_verified[kind] = True
                return out
            out = self._run(kind, dataclasses.replace(program, jitted=None), call)
            # The eager run worked, so the failure was the trace (a value-dependent shape): stay eager.
            warnings.warn(f"running un-jitted: {jit_fallback_reason(self.program, trace_error)}", JitFallbackWarning,
                          stacklevel=5)
            if kind == "forward" or isinstance(trace_error, JitTraceError):  # the program itself does not compile
                self._jitted = None
            if kind == "gradients" or isinstance(trace_error, JitTraceError):
                self._gradients_jit = False
            return out
        try:
            return call(program)
        except MithrilError:
            raise
        except Exception as exc:
            raise node_error(self.program, exc) from exc

    __call__ = evaluate


def _check_mapping(what: str, value: Any, keys: list[str]) -> None:
    if not isinstance(value, Mapping):
        raise InputError(f"{what} must be a dict keyed by name ({', '.join(map(repr, keys[:8]))}"
                         f"{', ...' if len(keys) > 8 else ''}), not a {type(value).__name__}")


def _bound_dims(inputs: Mapping[str, ir.Value], data: Mapping[str, Any]) -> dict[str, int]:
    """Symbolic dim name -> its size in the inputs given (a name bound to two sizes is left out)."""
    bound: dict[str, int] = {}
    clash: set[str] = set()
    for name, value in data.items():
        declared = inputs[name]
        if declared.shape is None or not hasattr(value, "shape"):
            continue
        for d, s in zip(declared.shape, tuple(value.shape)):
            if not isinstance(d, int) and d.value is not None:
                if bound.setdefault(d.value, int(s)) != int(s):
                    clash.add(d.value)
    return {k: v for k, v in bound.items() if k not in clash}


def _expected_shape(value: ir.Value, bound: Mapping[str, int]) -> tuple[int | None, ...] | None:
    """``value``'s shape with symbolic dims replaced by their bound sizes (None where unknown);
    None when not even the rank is known."""
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else bound.get(d.value) for d in value.shape)


def _cotangent_shape_error(name: str, expected, got, node: str | None) -> ShapeError:
    want = [d if d is not None else "?" for d in expected] if expected is not None else "?"
    return ShapeError(f"output_gradients[{name!r}] must have the shape of output {name!r}, {want}, but got "
                      f"{list(got)} (a cotangent is never broadcast)", node=node)


def _producer_label(value: ir.Value) -> str | None:
    node = value.producer()
    return (node.name or node.op_type) if node is not None else None


def _consumer_label(value: ir.Value) -> str | None:
    uses = list(value.uses())
    if not uses:
        return None
    node = uses[0][0] if isinstance(uses[0], tuple) else uses[0].node
    return node.name or node.op_type


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
    buffers: set[str] = set()
    loss_key, buffer_outputs = None, {}
    model = _as_model(model)
    if not isinstance(model, OnnxModel):
        to_onnx = getattr(model, "to_onnx_model", None)
        if to_onnx is not None:
            from .frontend.nn import buffer_updates
            from .frontend.train import TrainModel

            if isinstance(model, TrainModel):
                updates = model.buffer_updates()
                buffers |= set(updates)
                loss_key = model.loss_key
                buffer_outputs = {k: v for k, v in updates.items() if v is not None}
            else:
                buffers |= set(buffer_updates(model))
            # Floats the model leaves open take the backend's dtype (float64 on NumpyBackend(dtype=ml.float64)).
            model = to_onnx(shapes=shapes, dtype=backend.dtype)
        else:
            model = load_onnx(model)
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
    pm.auto_scalar_promotion = auto_scalar_promotion
    pm.gradient_checkpointing = checkpointing
    if not inference:
        # The names evaluate() differentiates: trainable parameters and floating data_keys.
        diff_names = [k for k in param_names if k in trainable]
        diff_names += [k for k in pm.input_keys if k in pm.data_keys and
                       is_floating_np(np_dtype_of_onnx(int(pm._inputs[k].dtype)))]
        try:
            pm.backward = backend.lower_backward(
                plan, diff_names=diff_names,
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
            pm._jitted = jitted
        stages.done("jit (traced at the first evaluate)" if pm._jitted is not None else "jit (eager)")
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


def _as_model(model):
    """A bare block (``Linear(dimension=64)``) becomes a one-block Model whose terminals keep
    their port names (``input``, ``weight``, ``bias``, ``output``)."""
    from .frontend.model import Model, Primitive

    if isinstance(model, Primitive):
        wrapper = Model(model.name)
        wrapper |= model(**{port: port for port in model.port_specs()})
        return wrapper
    return model


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


__all__ = ["compile", "JitFallbackWarning", "PhysicalModel"]
