"""The GGML backend: the lowering plan built into ggml compute graphs (through ``ggml-python``),
weights in float32, float16, bfloat16 or quantized, inside a memory budget."""

from __future__ import annotations

import numpy as np

from ...errors import BackendOptionError, BackendUnavailableError, MithrilError
from ..segmented import SegmentedBackend
from ..segmented.policy import check_fixed_shapes
from .guard import GGMLPreconditionError
from .program import (DeferredGGMLProgram, GGMLFallbackWarning, GGMLKernelMissingError, GGMLMemoryError, GGMLProgram,
                      Segment, pending_values, why_not_ggml)
from .threads import import_ggml

_WEIGHT_TYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


class GGMLBackend(SegmentedBackend):
    """Runs models through ggml, llama.cpp's tensor library, on the CPU: inference only.

    ``dtype`` is the type of the matrices matmuls and embeddings read (``ml.float32``,
    ``ml.float16`` or ``ml.bfloat16``); activations are float32, as in llama.cpp, and so are the
    arrays this backend makes and returns. ``quantize`` stores those matrices in a ggml
    quantized type instead (``"int8"``/``"q8_0"``, ``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``,
    ``"q4_K"``, ``"q6_K"``). ``mem_size`` (bytes) is a budget: compile refuses a model whose
    weights, intermediates and work memory exceed it, naming what it needs. Every shape must be
    fixed at compile. Nodes without a ggml rule run on NumPy between ggml graphs, with one
    warning listing them (``fallback="numpy"``); ``fallback=None`` refuses them at compile.

    >>> import mithril as ml
    >>> ml.GGMLBackend().to_numpy(ml.GGMLBackend().ones(2)).tolist()
    [1.0, 1.0]
    """

    name = "ggml"
    supports_gradients = False
    segment_type = Segment
    fallback_warning = GGMLFallbackWarning
    missing_error = GGMLKernelMissingError

    def __init__(self, dtype=None, device: str = "cpu", num_threads: int | None = None, *,
                 mem_size: int | None = None, quantize: str | None = None, fallback: str | None = "numpy",
                 device_mesh=None, **unknown):
        from ... import dtypes
        from .quantize import quant_name

        if mem_size is not None and (not isinstance(mem_size, int) or mem_size <= 0):
            raise BackendOptionError(f"GGMLBackend: mem_size must be a positive number of bytes, got {mem_size!r}")
        weight = dtypes.float32 if dtype is None else dtype
        name = str(getattr(weight, "name", weight))
        name = {np.dtype(np.float32).name: "float32", np.dtype(np.float16).name: "float16"}.get(name, name)
        if name not in _WEIGHT_TYPES:
            raise BackendOptionError(f"GGMLBackend computes with float32, float16 or bfloat16 weights, not {dtype}")
        # Activations and the arrays the backend hands out are float32 whatever the weight type.
        super().__init__(dtypes.float32, device, num_threads, fallback=fallback, device_mesh=device_mesh, **unknown)
        self.weight_type = _WEIGHT_TYPES[name]
        self.quantize = quant_name(quantize)
        self.mem_size = mem_size

    @classmethod
    def native_rules(cls):
        from .program import OPS  # with every op family registered

        return OPS

    def lower(self, plan, *, file_path: str | None = None, gradient_checkpointing: bool = False):
        """The plan as ggml graphs: every graph input's shape fixed, the nodes without a ggml rule
        listed (warned, or refused with ``fallback=None``), weights converted, memory checked.
        When a rule reads a graph input at build time, the graphs are built at the first
        evaluate, for its value (:class:`.program.DeferredGGMLProgram`)."""
        try:
            import_ggml()  # noting libgomp's wait policy (.threads)
        except ImportError as exc:
            raise BackendUnavailableError(
                "GGMLBackend needs ggml-python: pip install 'ggml-python==0.0.45' "
                "(a source build, about 2 minutes; scripts/dev.sh builds it, docs/backends.md#ggml)") from exc
        check_fixed_shapes(type(self).__name__, plan)
        pending = pending_values(plan)
        if pending:  # built at the first evaluate, for the values of the inputs read at build time
            self.apply_fallback(self.capability(plan.nodes, pending))
            return DeferredGGMLProgram(plan, pending, self.build_program)
        return self.build_program(plan, file_path=file_path)

    def build_program(self, plan, *, file_path: str | None = None):
        """The plan partitioned and built (:meth:`compile_segments`). A node whose build makes a
        ggml call ggml would abort on (:class:`~.guard.GGMLPreconditionError`: its rule's
        ``check`` let through a case ggml refuses) runs on NumPy instead, and the program is
        built again; the fallback warning (or, with ``fallback=None``, the refusal) then lists
        it with the others, once."""
        refused: dict[str, str] = {}
        while True:
            part = self.partition(plan, refused, warn=False)
            if self.fallback is None:
                self.apply_fallback(part.capability)  # refused before anything is built
            try:
                program = self.compile_segments(part, file_path=file_path)
            except GGMLPreconditionError as exc:
                if exc.node is None or exc.node in refused:
                    raise
                refused[exc.node] = exc.reason
                continue
            self.apply_fallback(part.capability)
            return program

    def native_passes(self):
        """GELU chains as one ggml op, where ggml runs it (:func:`.fusion.ggml_gelu_pass`)."""
        from .fusion import ggml_gelu_pass

        return [ggml_gelu_pass(lambda pn: why_not_ggml(pn) is None)]

    def compile_segments(self, part, *, file_path: str | None = None):
        """Each segment built as a ggml graph, the weights converted, the memory checked."""
        return GGMLProgram(part.plan, part.steps, weight_type=self.weight_type, quantize=self.quantize,
                           num_threads=self.num_threads, mem_size=self.mem_size)

    def lower_backward(self, plan, *, diff_names, file_path=None, gradient_checkpointing: bool = False):
        raise MithrilError("GGMLBackend runs inference only (ggml here has no backward pass); train with "
                           "NumpyBackend, JaxBackend, TorchBackend, MlxBackend or CBackend, then compile with "
                           "inference=True on GGMLBackend")

    def vjp(self, program, params, data, diff_params, diff_data, output_gradients):
        raise MithrilError("GGMLBackend runs inference only: compute gradients on another backend")


__all__ = ["GGMLBackend", "GGMLFallbackWarning", "GGMLKernelMissingError", "GGMLMemoryError"]
