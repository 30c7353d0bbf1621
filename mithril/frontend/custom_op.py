"""A custom op in a composed model: one node of a domain of the user's (docs/custom_ops.md).

The op's kernel is registered with ``backend.register_op`` / ``ml.register_op``: any time before
compile, but before the block is made when the block should take the registered ``output_shapes``
rule (otherwise it is elementwise). Export writes a node of the op's domain, an opset import for
that domain and the node's output shapes (``value_info``), so a loaded copy compiles as the model
does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..backends.custom_ops import check_op
from ..backends.registry import CUSTOM_DOMAIN, REGISTRY
from ..errors import KernelRegistrationError, ModelError
from .block import register
from .model import In, Out, Primitive, ShapeView
from .shapes import Conflict


@register
class CustomOp(Primitive):
    """Op ``op_type`` of ``domain`` (``mithril.custom`` unless given) as a block.

    ``inputs`` / ``outputs`` name its terminals in the node's order (default one ``input`` and one
    ``output``); keyword arguments beyond these are the node's attributes. Shapes: the op's
    ``output_shapes`` rule when given here or at registration (applied once the inputs' shapes
    are known), else elementwise: every output has the first input's shape. Outputs have the first
    input's dtype unless ``dtype`` (an ml dtype) says otherwise. ``version`` is the domain's opset
    version written into the export: by default the newest ``since`` registered for the op, or 1.

    >>> import numpy as np, mithril as ml
    >>> with ml.scoped_ops():
    ...     _ = ml.register_op("swish", lambda x, *, xp: x / (1 + xp.exp(-x)))
    ...     model = ml.Model()
    ...     model |= ml.Linear(dimension=4)(input="input", output="hidden")
    ...     model += ml.CustomOp("swish")(input="hidden", output="output")
    ...     model.shape_of("output")
    '[...v, 4]'
    """

    def __init__(self, op_type: str, *, domain: str = CUSTOM_DOMAIN, inputs: Sequence[str] = ("input",),
                 outputs: Sequence[str] = ("output",), output_shapes: Callable | None = None, dtype=None,
                 version: int | None = None, name: str | None = None, **attributes):
        try:
            self.domain = check_op(op_type, domain, 1 if version is None else version)
        except KernelRegistrationError as exc:
            raise ModelError(f"CustomOp: {exc}") from None
        if self.domain in ("", "ai.mithril"):
            raise ModelError(f"CustomOp({op_type!r}) needs a domain of your own, not {domain!r}: ONNX's ops have "
                             f"their blocks (ml.models), and ai.mithril is Mithril's internal domain")
        self.op_type = op_type
        self.input_names, self.output_names = tuple(inputs), tuple(outputs)
        for what, names in (("inputs", self.input_names), ("outputs", self.output_names)):
            if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
                raise ModelError(f"CustomOp({op_type!r}): {what} is a sequence of distinct names, not {names!r}")
        if set(self.input_names) & set(self.output_names):
            raise ModelError(f"CustomOp({op_type!r}): {sorted(set(self.input_names) & set(self.output_names))} "
                             "is both an input and an output")
        if output_shapes is not None and not callable(output_shapes):
            raise ModelError(f"CustomOp({op_type!r}): output_shapes is a function, not {output_shapes!r}")
        from ..dtypes import as_dtype

        self.dtype = None if dtype is None else as_dtype(dtype)
        self.version = version
        self.attributes_ = dict(attributes)
        self._rule = output_shapes or REGISTRY.shape_rule(op_type, version or 10**6, self.domain)
        super().__init__(name)

    def port_specs(self):
        first = self.input_names[0]
        # Elementwise: the outputs share the first input's shape ("..."); with a rule, each is free.
        shape = ["..."] if self._rule is None else None
        ports = {n: In(shape if n == first else None, "T" if n == first else None) for n in self.input_names}
        out_type = "T" if self.dtype is None else self.dtype
        ports.update({n: Out(shape, out_type) for n in self.output_names})
        return ports

    def attributes(self):
        return {"op": f"{self.domain}::{self.op_type}", **self.attributes_}

    def opset_version(self) -> int:
        """The domain's version the export imports: as given, else the newest ``since`` of the op."""
        if self.version is not None:
            return self.version
        versions = [v for table in REGISTRY.where(self.op_type, self.domain)
                    for v in REGISTRY.versions(self.op_type, self.domain, table)]
        return max(versions, default=1)

    def infer(self, s: ShapeView) -> None:
        if self._rule is None:
            return
        inputs = []
        for n in self.input_names:
            values = s.values(n)
            if values is None or None in values:
                return  # applied once every input's shape is known
            t = self._ports[n].type.root().value
            inputs.append((tuple(values), getattr(t, "numpy", None)))
        try:
            results = list(self._rule(inputs, dict(self.attributes_)) or ())
        except Exception as exc:  # the user's rule: say which op's rule failed, and how
            raise Conflict(f"the output_shapes rule of {self.domain}::{self.op_type} raised "
                           f"{type(exc).__name__}: {exc}") from None
        if len(results) != len(self.output_names):
            raise Conflict(f"the output_shapes rule of {self.domain}::{self.op_type} gave {len(results)} "
                           f"result(s) for {len(self.output_names)} output(s) {list(self.output_names)}")
        for n, result in zip(self.output_names, results):
            shape = result[0] if isinstance(result, tuple) and len(result) == 2 else result
            if shape is not None:
                s.set(n, [int(d) for d in shape])

    def lower(self, g, **inputs):
        args = [inputs[n] for n in self.input_names]
        dtype = None if self.dtype is None else self.dtype.numpy
        out = g.op(self.op_type, *args, outputs=len(self.output_names), dtype=dtype, domain=self.domain,
                   domain_version=self.opset_version(), **self.attributes_)
        return out


__all__ = ["CustomOp"]
