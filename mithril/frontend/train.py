"""Training graphs: a model plus losses and regularization, exported as one ONNX graph with a
``loss`` output that ``evaluate`` differentiates.

>>> import mithril as ml, numpy as np
>>> from mithril.models import Model, Linear, TrainModel, CrossEntropy, Mean, L2
>>> model = Model()
>>> model |= Linear(dimension=3, name="fc")(input="input", output="output")
>>> tm = TrainModel(model)
>>> tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
>>> tm.add_regularization(L2(), coef=1e-4, input=r"fc\\.weight")
>>> pm = ml.compile(tm, ml.JaxBackend(), shapes={"input": [4, 5], "target": [4]}, data_keys={"input", "target"})
>>> sorted(pm.parameter_keys), pm.output_keys
(['fc.bias', 'fc.weight'], ['output', 'loss'])
>>> data = {"input": np.ones((4, 5), np.float32), "target": np.array([0, 1, 2, 0])}
>>> outputs, grads = pm.evaluate(pm.randomize_params(), data)
>>> sorted(grads), outputs["loss"].shape  # data_keys that are floats get gradients too
(['fc.bias', 'fc.weight', 'input'], ())
"""

from __future__ import annotations

import copy
import re

import numpy as np
import onnx
from onnx import helper

from .. import dtypes as _dtypes
from ..errors import ModelError
from .block import register
from .model import Block, In, IOKey, Model, Out, Primitive

LOSS_KEY = "loss"
_PREFIX = "train/"  # internal values of the loss graph, kept apart from the model's names


@register
class L2(Primitive):
    """``0.5 * sum(input ** 2)``: its gradient is ``input``, so a coefficient is a weight decay."""

    ports = {"input": In(None), "output": Out([])}

    def lower(self, g, input):
        total = g.reduce("ReduceSum", g.op("Mul", input, input), None, False)
        return g.op("Mul", total, g.const(0.5, like=input))


@register
class L1(Primitive):
    """``sum(|input|)``."""

    ports = {"input": In(None), "output": Out([])}

    def lower(self, g, input):
        return g.reduce("ReduceSum", g.op("Abs", input), None, False)


class TrainModel:
    """A model with losses and regularization terms, compiled as one graph.

    ``ml.compile(tm, backend, ...)`` exports the wrapped model, adds the loss graph and the output
    ``loss`` (:attr:`loss_key`): the sum of every loss (reduced to a scalar by its
    ``reduce_steps``, times its ``coef``) and every regularization term. The compiled model's
    ``evaluate(params, data)`` returns ``(outputs, gradients)``: the cotangent of ``loss`` is 1 unless
    ``output_gradients`` says otherwise, gradients are those of every trainable parameter. Compile
    with ``inference=True`` for the outputs alone (a validation loss).

    Parameter keys are the wrapped model's, so trained parameters feed the plain model compiled for
    inference. Buffers (BatchNorm2D running statistics) stay out of the trainable keys; where a
    block is in training mode (``BatchNorm2D(training=True)``) the updated statistics are extra
    outputs, named by :meth:`buffer_updates`, which a training loop copies back after each step.
    The mode is a block setting: Dropout and BatchNorm2D built with ``training=True`` train, the
    same model built with the default runs inference; parameter keys are the same in both.
    """

    loss_key = LOSS_KEY

    def __init__(self, model: Model):
        if not isinstance(model, Model):
            raise ModelError(f"TrainModel wraps a Model, not {type(model).__name__}")
        self.model = model
        self._losses: list[tuple[Block, str, str | None, list[Block], float]] = []
        self._regs: list[tuple[Block, float, str]] = []

    def __repr__(self) -> str:
        return f"TrainModel({self.model!r}, losses={len(self._losses)}, regularizations={len(self._regs)})"

    def add_loss(self, loss: Block, input: str = "output", target: str | None = "target",
                 reduce_steps=None, coef: float = 1.0) -> None:
        """Add ``coef * reduce(loss(input, target))``: ``input`` names a value of the model (an
        output), ``target`` a new data input (None for a loss of the input alone);
        ``reduce_steps`` (e.g. ``[Mean()]``) must bring the loss to a scalar."""
        ports = loss._ports_for_parent()
        if "input" not in ports or (target is not None and "target" not in ports):
            raise ModelError(f"{type(loss).__name__} is not a loss: it needs the terminals 'input'"
                             f"{' and target' if target is not None else ''} (it has {list(ports)})")
        steps = list(reduce_steps or [])
        for step in steps:
            if "input" not in step._ports_for_parent():
                raise ModelError(f"reduce step {type(step).__name__} has no 'input' terminal")
        self._losses.append((loss, str(input), None if target is None else str(target), steps, float(coef)))

    def add_regularization(self, reg: Block, coef: float, input: str) -> None:
        """Add ``coef * reg(p)`` for the parameter named ``input``, or for every trainable float
        parameter whose name matches it as a regular expression (``r".*weight"``); buffers never."""
        if "input" not in reg._ports_for_parent():
            raise ModelError(f"regularization {type(reg).__name__} has no 'input' terminal")
        self._regs.append((reg, float(coef), str(input)))

    def buffer_updates(self) -> dict[str, str | None]:
        """Buffer name -> name of the output holding its update (None where its block is in
        inference mode); after each training step, copy each output into its buffer."""
        from .onnx_export import buffer_updates

        return buffer_updates(self.model)

    def export_for_compile(self, *, shapes=None, dtype=None):
        """``ml.compile``'s hook (:class:`mithril.compile.Exportable`): the training graph, its
        ``loss`` output and its buffers with the outputs holding their updates."""
        from ..compile import ExportedModel

        updates = self.buffer_updates()
        return ExportedModel(self.to_onnx_model(shapes=shapes, dtype=dtype), buffers=frozenset(updates),
                             loss_key=self.loss_key,
                             buffer_updates={k: v for k, v in updates.items() if v is not None})

    # -- export ----------------------------------------------------------------------------------
    def build_onnx(self, shapes=None, params=None, opset: int | None = None, dynamic_axes=None,
                   dtype=None) -> onnx.ModelProto:
        """The training graph: the model's graph, the buffer updates and ``loss`` as outputs."""
        from .onnx_export import build_onnx, default_opset

        if not self._losses and not self._regs:
            raise ModelError("TrainModel has no loss: call add_loss first")
        opset = default_opset() if opset is None else int(opset)
        targets = {t for _, _, t, _, _ in self._losses if t is not None}
        shapes, dynamic = dict(shapes or {}), dict(dynamic_axes or {})
        base, _ = build_onnx(self.model, shapes={k: v for k, v in shapes.items() if k not in targets},
                             params=params, opset=opset, dtype=dtype,
                             dynamic_axes={k: v for k, v in dynamic.items() if k not in targets} or None)
        known = _declared_values(base)
        head = self._loss_model(base, known)
        loss_proto, _ = build_onnx(head, shapes={k: v for k, v in shapes.items() if k in targets},
                                   opset=opset, dtype=dtype,
                                   dynamic_axes={k: v for k, v in dynamic.items() if k in targets} or None)
        return self._merge(base, loss_proto)

    def to_onnx_model(self, shapes=None, params=None, opset: int | None = None, dynamic_axes=None, dtype=None):
        """The training graph as an OnnxModel (``ml.compile`` calls this with the backend's dtype)."""
        import onnx_ir as ir

        from ..onnx_bridge.load import OnnxModel

        proto = self.build_onnx(shapes=shapes, params=params, opset=opset, dynamic_axes=dynamic_axes, dtype=dtype)
        return OnnxModel(ir.serde.deserialize_model(proto), source=f"train({self.model.name or 'model'})")

    def _loss_model(self, base: onnx.ModelProto, known: dict[str, onnx.TypeProto]) -> Model:
        """A frontend model reading the model's values by name and writing ``loss``."""
        head = Model(name="train")
        inits = {t.name: t for t in base.graph.initializer}

        def value(name: str, what: str) -> IOKey:
            if name in head._named:
                return IOKey(name)
            if name not in known:
                raise ModelError(f"TrainModel: {what} names {name!r}, which is not a value of the model "
                                 f"(outputs: {[o.name for o in base.graph.output]})")
            shape, dtype = _shape_and_dtype(known[name])
            return IOKey(name, shape=shape, type=dtype)

        terms: list[tuple[str, float]] = []
        for i, (loss, inp, target, steps, coef) in enumerate(self._losses):
            loss = copy.deepcopy(loss)
            bindings = {"input": value(inp, "add_loss input")}
            if target is not None:
                bindings["target"] = IOKey(target) if target not in known else value(target, "target")
            out = f"loss_{i}"
            head |= loss(**bindings, output=IOKey(f"{out}.0"))
            for j, step in enumerate(steps, start=1):
                head |= copy.deepcopy(step)(input=head[f"{out}.{j - 1}"], output=IOKey(f"{out}.{j}"))
            last = f"{out}.{len(steps)}"
            if head.shape_of(last) != "[]":
                raise ModelError(f"TrainModel: loss {i} ({type(loss).__name__} of {inp!r}) has shape "
                                 f"{head.shape_of(last)}, not a scalar; reduce it (reduce_steps=[Mean()])")
            terms.append((last, coef))
        buffers = set(self.buffer_updates())
        floats = [n for n, t in inits.items() if n not in buffers and
                  _dtypes.is_floating_np(helper.tensor_dtype_to_np_dtype(t.data_type))]
        for k, (reg, coef, pattern) in enumerate(self._regs):
            names = [pattern] if pattern in floats else [n for n in floats if re.fullmatch(pattern, n)]
            if not names:
                raise ModelError(f"TrainModel: regularization {k} ({type(reg).__name__}) names {pattern!r}, "
                                 f"which matches no trainable parameter (parameters: {floats[:20]})")
            for n in names:
                out = f"reg_{k}.{n}"
                head |= copy.deepcopy(reg)(input=value(n, "add_regularization input"), output=IOKey(out))
                if head.shape_of(out) != "[]":
                    raise ModelError(f"TrainModel: regularization {type(reg).__name__} of {n!r} has shape "
                                     f"{head.shape_of(out)}, not a scalar")
                terms.append((out, coef))
        total = None
        for name, coef in terms:
            term = head[name] if coef == 1.0 else head[name] * coef
            total = term if total is None else total + term
        from .elementwise import Buffer

        head |= Buffer()(input=total, output=IOKey(LOSS_KEY))
        return head

    def _merge(self, base: onnx.ModelProto, head: onnx.ModelProto) -> onnx.ModelProto:
        """The model's graph with the loss graph's nodes appended, wired by value name."""
        graph = base.graph
        known = _declared_values(base)
        if LOSS_KEY in known:
            raise ModelError(f"TrainModel: the model already has a value named {LOSS_KEY!r}; rename it")
        rename = {o: _PREFIX + o for node in head.graph.node for o in node.output if o != LOSS_KEY}
        for node in head.graph.node:
            node.name = _PREFIX + node.name
            node.input[:] = [rename.get(i, i) for i in node.input]
            node.output[:] = [rename.get(o, o) for o in node.output]
            graph.node.append(node)
        graph.input.extend(v for v in head.graph.input if v.name not in known)
        outputs = {o.name for o in graph.output}
        inits = {t.name: t for t in graph.initializer}
        for buf, update in self.buffer_updates().items():
            if update is not None and update not in outputs and buf in inits:
                t = inits[buf]
                graph.output.append(helper.make_tensor_value_info(update, t.data_type, list(t.dims)))
        graph.output.extend(head.graph.output)
        return base


def _declared_values(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value of the graph with its type (shape inference fills intermediate ones)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # a custom domain op: keep what is declared
        inferred = proto
    g = inferred.graph
    out = {v.name: v.type for v in list(g.value_info) + list(g.input) + list(g.output)}
    for t in g.initializer:
        out[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    for node in g.node:
        for o in node.output:
            out.setdefault(o, onnx.TypeProto())
    return out


def _shape_and_dtype(t: onnx.TypeProto):
    if not t.HasField("tensor_type"):
        return None, None
    tt = t.tensor_type
    dtype = _dtypes.as_dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
    if not tt.HasField("shape"):
        return None, dtype
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return dims, dtype


__all__ = ["L1", "L2", "LOSS_KEY", "TrainModel"]
