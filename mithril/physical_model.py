"""A compiled model: :class:`PhysicalModel` runs one lowered program on its backend, checking what
``evaluate`` is given before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import dataclasses
import functools
import warnings
import weakref

import numpy as np
import onnx_ir as ir

from .backends.backend import Backend
from .backends.table import backend_of_array
from .backends.runner import JitFallbackWarning, Program, jit_fallback_reason, node_error
from .backends.emit_python import LoweredProgram
from .dtypes import is_floating_np, np_dtype_of_onnx, tensor_array
from .errors import DTypeError, EvaluationError, InputError, JitTraceError, MithrilError, ShapeError, public_api
from .onnx_bridge.load import OnnxModel


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


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
        # The frozen one-element parameters (an inference compile's, or those trainable_keys leaves
        # out) whose file values a plan pass built into the program, by name, each with its plan
        # value: an exporter's constants written as initializers (torch.onnx's dynamo exporter
        # writes a Gelu's sqrt(2), 1 and 0.5 so). Set by compile once lowered; evaluate refuses
        # another value for them.
        self.baked_params: dict[str, Any] = {}
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
    def declared_inputs(self) -> dict[str, ir.Value]:
        """Each data input's declaration in the specialized graph (its dtype and shape), by name."""
        return dict(self._inputs)

    @property
    def jitted(self):
        """The backend's jitted forward program, or None where evaluation runs eagerly."""
        return self._jitted

    def use_jitted(self, jitted) -> None:
        """Run the forward through ``jitted`` (``backend.jit``'s program); the first run whose
        trace fails falls back to eager, once (``JitFallbackWarning``)."""
        self._jitted = jitted

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
        statistics, whose variance must stay positive) and :attr:`baked_params` (constants a
        fusion built in).
        """
        rng = self.backend.rng
        out = {}
        baked = self.baked_params
        for k, v in self._params_numpy.items():
            if is_floating_np(v.dtype) and k not in self.buffer_keys and k not in baked:
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

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Refuse ``params`` whose names, dtypes or shapes are not the model's, as ``evaluate``
        does (nothing is cast); a dict checked before is checked again only where a value changed."""
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
        baked = self.baked_params
        for name, value in params.items():
            ref = seen.get(name)
            if ref is not None and ref() is value:
                continue
            declared, local = self._param_values[name], None
            if self.sharding is not None and declared.shape is not None:  # a mesh process may hold a part
                local = self.backend.local_shape(name, tuple(declared.shape), self.sharding)
                local = None if local == tuple(declared.shape) else local
            self._check_declared(f"parameter {name!r}", "parameters", declared, value, local)
            if name in baked:
                self._check_baked(baked[name], value)
            try:
                seen[name] = weakref.ref(value)
            except TypeError:  # an array type without weak references: checked every call
                seen.pop(name, None)

    def _check_baked(self, pv, value) -> None:
        want = tensor_array(pv.tensor)
        got = np.asarray(value if isinstance(value, np.ndarray) else self.backend.to_numpy(value))
        if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
            raise InputError(
                f"parameter {pv.name!r} is {got.reshape(-1)[:1].tolist()}, but the program was compiled with the file's "
                f"{want.reshape(-1).tolist()} built in (a fusion read it as a constant: a one-element initializer "
                f"nothing trains in this compile); compile with trainable_keys naming {pv.name!r} to keep it "
                f"a parameter")

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
            p, d, c, _ = self.prepare(params, d, cots)
            prepared.append((p, d, dict(c)))
        diff_params, diff_data = self.diff_names()
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

    def prepare(self, params, data, output_gradients):
        """Checked and placed ``(params, data, cotangents, unresolved)`` for one run, as ``evaluate``
        passes them to the program (``params`` None or empty: the model's own)."""
        if params is None or (isinstance(params, Mapping) and not params):  # the model's own parameters
            params = self._own_parameters()
        else:
            self.check_params(params)
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

    def diff_names(self) -> tuple[list[str], list[str]]:
        """What gradients are taken of: ``(trainable parameters, floating data_keys)``, in order."""
        diff_params = [k for k in self._param_names if k in self.trainable_keys]
        diff_data = [k for k in self.input_keys if k in self.data_keys and
                     is_floating_np(np_dtype_of_onnx(int(self._inputs[k].dtype)))]
        return diff_params, diff_data

    def _evaluate(self, params, data, output_gradients):
        params, data, cotangents, unresolved = self.prepare(params, data, output_gradients)
        if output_gradients is not None:
            diff_params, diff_data = self.diff_names()
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


__all__ = ["PhysicalModel"]
