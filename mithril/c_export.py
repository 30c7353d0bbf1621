"""``ml.export_c``: a model as a standalone C source tree (issue 18, docs/c_export.md).

It compiles the model for the C backend like :func:`mithril.compile` (fixed shapes, every node
a C kernel) and hands the rendered plan to :mod:`mithril.backends.c.export`, which writes the
tree; it lives up here because it drives the compile pipeline, which backends do not import.
"""

from __future__ import annotations

import re

import numpy as np

from . import dtypes
from .backends.c.backend import CKernelMissingError
from .backends.c.export import WEIGHTS_CHOICES, CExport, ExportBackend, check_out_dir, write_tree
from .compile import compile as ml_compile
from .errors import CompileError, ExportError, InputError


def export_c(model, out_dir, shapes=None, dtype=None, params=None, *, weights: str = "auto",
             name: str = "model") -> CExport:
    """Write ``model`` as a standalone C source tree into ``out_dir``: ``<name>.h`` (the API),
    ``<name>.c``, the weights, ``main.c``, a ``Makefile`` and ``lib/`` (the kernel headers); the
    layout is in :mod:`mithril.backends.c.export` and docs/c_export.md.

    - ``model``: an ONNX path, bytes or proto, a loaded model (``ml.load_onnx``), or a frontend
      ``Model``; ``shapes`` fixes every input's dims (``{"input": (1, 3, 32, 32)}``).
    - ``dtype``: ``ml.float32`` (default) or ``ml.float64``, the C code's float type.
    - ``params``: parameter values (name -> array) replacing the model's own initializers
      (for a frontend model, pass the ones you trained; names as ``pm.parameter_keys``).
    - ``weights``: ``"file"`` writes ``<name>.bin``, ``"embed"`` puts them in ``<name>.c``,
      ``"auto"`` embeds up to ``EMBED_LIMIT`` bytes (256 KiB).
    - ``name``: the files' stem and the API's prefix (``model_run``), a C identifier.

    >>> import mithril as ml, tempfile
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    >>> out = ml.export_c(helper.make_model(g), tempfile.mkdtemp())
    >>> sorted(p.name for p in out.files if p.parent == out.directory)
    ['Makefile', 'main.c', 'model.c', 'model.h']
    """
    if weights not in WEIGHTS_CHOICES:
        raise ExportError(f"export_c: weights={weights!r}; choose from {', '.join(WEIGHTS_CHOICES)}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name == "main":
        raise ExportError(f"export_c: name={name!r} must be a C identifier (letters, digits, _) other than 'main'")
    if name == "lib":
        raise ExportError("export_c: name='lib' would clash with the kernel headers' folder lib/")
    directory = check_out_dir(out_dir)
    backend = ExportBackend(dtype=dtype if dtype is not None else dtypes.float32, fallback=None)
    try:
        pm = ml_compile(model, backend, shapes=shapes, inference=True, static_shapes=True, jit=False)
    except CKernelMissingError:
        raise
    except CompileError as exc:
        raise type(exc)(f"export_c: {exc}") from exc
    values = {k: np.asarray(v) for k, v in pm.get_parameters().items()}
    if params:
        unknown = [k for k in params if k not in values]
        if unknown:
            raise InputError(f"export_c: unknown parameter(s) {unknown[:10]}; the model's are "
                             f"{list(values)[:10]}{'...' if len(values) > 10 else ''}")
        values.update({k: v for k, v in params.items()})
        pm.check_params(values)  # dtypes and shapes as evaluate checks them: never cast
        values = {k: np.asarray(v) for k, v in values.items()}
    program = pm.program
    return write_tree(directory, name, program.plan, program.rendered, values, weights, str(backend._np_dtype))


__all__ = ["CExport", "export_c"]
