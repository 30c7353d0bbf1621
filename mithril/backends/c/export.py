"""Standalone C export: a model as a source tree that builds with nothing but a C compiler.

:func:`mithril.export_c` (mithril/c_export.py) compiles the model for ``CBackend(fallback=None)``
at fixed shapes (every node must have a C kernel; the refusal lists those that do not) with
:class:`ExportBackend`, which renders the plan without building it; :func:`write_tree` writes::

    out_dir/
      model.h      the API: model_init / model_run / model_free, inputs, outputs, arena size
      model.c      the rendered C segment and the run function that feeds it weights and arena
      model.bin    the weights (unless embedded in model.c): the layout is in model.h
      main.c       reads each input from a raw file, runs, writes each output to a raw file
      Makefile     `make` builds ./model with `cc -O3 -fopenmp ... -lm` (no Python, no BLAS)
      lib/*.h      the kernel library headers model.c includes

The layout of model.bin: bytes 0-7 the magic ``MITHRIL1``, 8-15 the payload size and 16-23
the tensor count (little-endian uint64), zeros to byte 64, then the payload: each tensor's
C-contiguous little-endian bytes at the 64-byte aligned offset model.h lists for it. Weights of
``EMBED_LIMIT`` bytes or less are embedded as ``static const`` arrays instead (``weights="auto"``).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

import numpy as np

from ...errors import ExportError, MithrilError
from .backend import CBackend, CKernelMissingError
from .nchwc import PackedValue

EMBED_LIMIT = 256 * 1024  # bytes of weights up to which weights="auto" embeds them in model.c
ALIGN = 64
MAGIC = b"MITHRIL1"
WEIGHTS_CHOICES = ("auto", "file", "embed")
LIB_DIR = Path(__file__).parent / "lib"


@dataclass
class CExport:
    """What :func:`mithril.export_c` wrote: the folder, its files, the arena and weight bytes, and
    whether the weights are embedded in the C source or in ``<name>.bin``."""

    directory: Path
    files: list[Path]
    arena_bytes: int
    weight_bytes: int
    embedded: bool
    inputs: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)
    outputs: list[tuple[str, tuple[int, ...], str]] = field(default_factory=list)


class _Rendered:
    """What the export backend's ``lower`` returns: the plan and its C rendering, unbuilt."""

    def __init__(self, plan, rendered):
        self.plan = plan
        self.rendered = rendered
        self.source = rendered.source

    def forward(self, params, data):  # pragma: no cover - never run: the export only renders
        raise MithrilError("an export_c program is not run in Python; build it with make")


class ExportBackend(CBackend):
    """CBackend(fallback=None) that renders the plan and stops: no compiler needed to export."""

    def lower(self, plan, *, file_path=None, gradient_checkpointing=False):
        from .render import render, why_not_c

        rendered = render(plan, self._np_dtype, pack_params=True)  # the weights are fixed once written
        if rendered.fallback:
            listed = ", ".join(f"{pn.label} ({pn.op_type}: {why_not_c(pn)})" for pn in rendered.fallback)
            raise CKernelMissingError(f"export_c: {len(rendered.fallback)} node(s) have no C kernel, so the model "
                                      f"cannot be exported as C: {listed}")
        return _Rendered(plan, rendered)


def _identifier(text: str, taken: set[str]) -> str:
    """``text`` as a C identifier not in ``taken`` (added to it)."""
    name = re.sub(r"\W", "_", text, flags=re.ASCII) or "v"
    if name[0].isdigit():
        name = "v_" + name
    base, i = name, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _c_string(text: str) -> str:
    return '"' + "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else f"\\{ord(c) & 0xFF:03o}"
                         for c in text) + '"'


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def _literals(arr: np.ndarray) -> list[str]:
    """Every element of ``arr`` as an exact C literal of its type (hex floats)."""
    flat = arr.reshape(-1)
    if flat.dtype.kind == "f":
        out = []
        for x in flat.astype(np.float64).tolist():
            if x != x:
                out.append("NAN")
            elif x in (float("inf"), float("-inf")):
                out.append("-INFINITY" if x < 0 else "INFINITY")
            else:
                out.append(x.hex())
        return out
    if flat.dtype.kind == "b":
        return ["1" if x else "0" for x in flat.tolist()]
    if flat.dtype.kind == "u":
        return [f"{x}u" if flat.dtype.itemsize < 8 else f"{x}ULL" for x in flat.tolist()]
    lo = int(np.iinfo(flat.dtype).min)
    return [f"({lo + 1}{'LL' if flat.dtype.itemsize == 8 else ''} - 1)" if x == lo else
            f"{x}{'LL' if flat.dtype.itemsize == 8 else ''}" for x in flat.tolist()]


def _kernel_headers() -> list[Path]:
    """mithril_kernels.h and every header it includes, transitively (the gradient family is not)."""
    seen: list[Path] = []
    todo = [LIB_DIR / "mithril_kernels.h"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.M):
            todo.append(LIB_DIR / inc)
    return sorted(seen)


def check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path; a file there (or as its parent) is an ExportError."""
    path = Path(os.fspath(out_dir))
    if path.exists() and not path.is_dir():
        raise ExportError(f"export_c: {str(path)!r} is a file, not a folder; give a folder to write the C sources into")
    if not path.exists() and path.parent.exists() and not path.parent.is_dir():
        raise ExportError(f"export_c: cannot create {str(path)!r}: {str(path.parent)!r} is a file")
    return path


def write_tree(directory: Path, name: str, plan, rendered, param_values: dict, weights: str, dtype_name: str) -> CExport:
    """The C tree of a rendered plan (:func:`mithril.export_c` compiles the model and calls this):
    ``param_values`` the parameters' arrays, ``weights`` "file" | "embed" | "auto"."""
    from .ops import C_TYPES

    NAME = name.upper()
    segments = [s for s in rendered.steps if hasattr(s, "nodes")]
    if len(segments) > 1:  # fallback=None leaves no NumPy node, so no second segment
        raise ExportError(f"export_c: the model rendered as {len(segments)} C segments; expected one")
    seg = segments[0] if segments else None
    for v in list(plan.inputs) + list(plan.outputs):
        if v.dtype not in C_TYPES or v.static_shape is None:
            what = "input" if v in plan.inputs else "output"
            raise ExportError(f"export_c: {what} {v.name!r} is {v.dtype} of shape {v.shape}; C export takes tensors of "
                              f"fixed shape and one of the types {', '.join(str(d) for d in C_TYPES)}")
    inputs = [v for v in plan.inputs if v.kind == "input"]
    outputs = list(plan.outputs)

    # Weights: every parameter and constant the segment reads, in the order it reads them.
    stored = [v for v in (seg.inputs if seg else []) if v.kind in ("param", "constant")]
    for v in outputs:
        if v.kind in ("param", "constant") and v not in stored:
            stored.append(v)
    arrays = []
    for v in stored:
        if isinstance(v, PackedValue) and v.source is not None and v.source.kind == "param":
            arr = v.pack(np.asarray(param_values[v.source.name]))  # weights packed for NCHWc kernels
        else:
            arr = np.asarray(v.value) if v.kind == "constant" else np.asarray(param_values[v.name])
        if arr.dtype != v.dtype or tuple(arr.shape) != v.static_shape:
            arr = arr.reshape(v.static_shape) if arr.size == prod(v.static_shape) and arr.dtype == v.dtype else arr
        if arr.dtype != v.dtype or tuple(arr.shape) != v.static_shape:
            raise ExportError(f"export_c: {v.kind} {v.name!r} holds {arr.dtype} {list(arr.shape)}, the program reads "
                              f"{v.dtype} {list(v.static_shape)}")
        arrays.append(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False))
    offsets, top = [], 0
    for arr in arrays:
        offsets.append(top)
        top += -(-max(arr.nbytes, 1) // ALIGN) * ALIGN
    weight_bytes = sum(a.nbytes for a in arrays)
    embedded = weights == "embed" or (weights == "auto" and weight_bytes <= EMBED_LIMIT)

    taken = {"model", "status", "io", "inputs", "outputs"}
    in_ids = [_identifier(v.name, taken) for v in inputs]
    out_ids = [_identifier(v.name, taken) for v in outputs]

    def ctype(v):
        return C_TYPES[v.dtype][0]

    def shape_text(v):
        return "[" + ", ".join(map(str, v.static_shape)) + "]"

    def nbytes(v):
        return prod(v.static_shape) * v.dtype.itemsize

    arena = rendered.arena_bytes
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lib").mkdir(exist_ok=True)
    files: list[Path] = []

    # -- the header ------------------------------------------------------------------------
    init_arg = "NULL" if embedded else _c_string(f"{name}.bin")
    h = [f"/* {name}.h: the C API of a model exported by Mithril (mithril.export_c). */",
         f"#ifndef {NAME}_H", f"#define {NAME}_H", "", "#include <stddef.h>", "#include <stdint.h>", "",
         "/* One-call API (not reentrant: one arena per process; call from one thread at a time):",
         " *",
         f" *   if ({name}_init({init_arg}) != 0) ...   "
         "load the weights, allocate the arena",
         f" *   status = {name}_run({', '.join(in_ids + out_ids)});",
         f" *   {name}_free();",
         " *",
         " * Every status is 0 on success; otherwise " + f"{name}_status_message(status) says what went wrong",
         " * (negative: init/file errors; positive: a kernel refused the data, e.g. an out-of-range index).",
         " * Buffers are C-contiguous (row-major), of the element type and element count below; outputs are",
         " * written by the caller-owned buffers given. No allocation happens in run.",
         " *",
         f" * Weights: {'embedded in ' + name + '.c (' + name + '_init ignores its argument)' if embedded else name + '.bin, read by ' + name + '_init(path)'};"
         f" {weight_bytes} bytes in {len(arrays)} tensor(s).",
         " */", "",
         f"#define {NAME}_DTYPE {_c_string(dtype_name)}  /* the float type the model computes in */",
         f"#define {NAME}_ARENA_BYTES {max(arena, 0)}UL  /* intermediates: one block, offsets planned from lifetimes */",
         f"#define {NAME}_WEIGHT_BYTES {weight_bytes}UL",
         f"#define {NAME}_WEIGHTS_EMBEDDED {1 if embedded else 0}",
         f"#define {NAME}_NUM_INPUTS {len(inputs)}",
         f"#define {NAME}_NUM_OUTPUTS {len(outputs)}", "", "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    for kind, vals, ids in (("INPUT", inputs, in_ids), ("OUTPUT", outputs, out_ids)):
        for i, (v, ident) in enumerate(zip(vals, ids)):
            h += [f"/* {kind.lower()} {i}: {_comment(repr(v.name))} ({ident}), {v.dtype} {shape_text(v)} */",
                  f"#define {NAME}_{kind}{i}_NAME {_c_string(v.name)}",
                  f"#define {NAME}_{kind}{i}_DTYPE {_c_string(str(v.dtype))}",
                  f"#define {NAME}_{kind}{i}_RANK {len(v.static_shape)}",
                  f"#define {NAME}_{kind}{i}_SHAPE {{{', '.join(map(str, v.static_shape)) or '1'}}}",
                  f"#define {NAME}_{kind}{i}_SIZE {prod(v.static_shape)}UL  /* elements */",
                  f"#define {NAME}_{kind}{i}_BYTES {nbytes(v)}UL", ""]
    h += ["/* Status codes below zero (positive ones are kernel refusals, see *_status_message). */",
          f"#define {NAME}_ERR_NOT_INITIALIZED (-1)", f"#define {NAME}_ERR_OPEN (-2)  /* the weights file cannot be read */",
          f"#define {NAME}_ERR_FORMAT (-3)  /* the weights file is not this model's (magic, size) */",
          f"#define {NAME}_ERR_MEMORY (-4)", f"#define {NAME}_ERR_ENDIAN (-5)  /* weights are little-endian; this host is not */",
          ""]
    if not embedded:
        h += [f"/* {name}.bin: bytes 0-7 \"MITHRIL1\", 8-15 payload bytes, 16-23 tensor count (uint64 little-endian),",
              " * zeros to byte 64, then the payload: each tensor C-contiguous, little-endian, at its offset:",
              " *   offset      bytes  dtype    shape  name"]
        for v, off, arr in zip(stored, offsets, arrays):
            h.append(f" *   {off:>10}  {arr.nbytes:>9}  {str(v.dtype):<7}  {shape_text(v)}  {_comment(v.name)}")
        h += [" */", f"#define {NAME}_WEIGHT_FILE_PAYLOAD {top}UL", ""]
    h += [f"/* Load the weights (path to {name}.bin; ignored when embedded) and allocate the arena. */",
          f"int {name}_init(const char *weights_path);",
          "/* Run the model: inputs then outputs, in the order above. */",
          f"int {name}_run({', '.join([f'const {ctype(v)} *{i}' for v, i in zip(inputs, in_ids)] + [f'{ctype(v)} *{i}' for v, i in zip(outputs, out_ids)]) or 'void'});",
          "/* The same with arrays of pointers (inputs[i] of INPUTi_BYTES, outputs[j] of OUTPUTj_BYTES). */",
          f"int {name}_run_io(const void *const *inputs, void *const *outputs);",
          f"void {name}_free(void);",
          f"const char *{name}_status_message(int status);",
          f"/* OpenMP threads when built with -fopenmp (the Makefile's default); no effect otherwise. */",
          f"void {name}_set_threads(int n);",
          "",
          f"extern const char *const {name}_input_names[];",
          f"extern const size_t {name}_input_bytes[];",
          f"extern const char *const {name}_output_names[];",
          f"extern const size_t {name}_output_bytes[];",
          "", "#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {NAME}_H */", ""]

    # -- the source ------------------------------------------------------------------------
    body = rendered.source
    first = re.search(r"^int seg\d+\(", body, flags=re.M)
    body = body[first.start():] if first else ""
    body = re.sub(r"^int seg(\d+)\(", rf"static int {name}_seg\1(", body, flags=re.M)
    c = [f"/* {name}.c: generated by Mithril (mithril.export_c). The API is in {name}.h. */",
         "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", '#include "mithril_kernels.h"',
         f'#include "{name}.h"', "", "#ifdef _OPENMP", "#include <omp.h>",
         f"void {name}_set_threads(int n) {{ omp_set_num_threads(n); }}", "#else",
         f"void {name}_set_threads(int n) {{ (void)n; }}", "#endif", "",
         f"const char *const {name}_input_names[] = {{{', '.join(_c_string(v.name) for v in inputs) or 'NULL'}}};",
         f"const size_t {name}_input_bytes[] = {{{', '.join(f'{nbytes(v)}UL' for v in inputs) or '0'}}};",
         f"const char *const {name}_output_names[] = {{{', '.join(_c_string(v.name) for v in outputs) or 'NULL'}}};",
         f"const size_t {name}_output_bytes[] = {{{', '.join(f'{nbytes(v)}UL' for v in outputs) or '0'}}};", "",
         f"static char *{name}_arena_block_;  /* malloc'd; {name}_arena_ is it aligned to 64 bytes */",
         f"static char *{name}_arena_;"]
    if embedded:
        for i, (v, arr) in enumerate(zip(stored, arrays)):
            lits = _literals(arr) or ["0"]
            c.append(f"/* {_comment(v.name)}: {v.dtype} {shape_text(v)} */")
            rows = [", ".join(lits[j:j + 8]) for j in range(0, len(lits), 8)]
            c.append(f"static const {ctype(v)} {name}_w{i}[{max(len(lits), 1)}] = {{\n    " + ",\n    ".join(rows) + "};")
        c.append(f"static int {name}_ready_;")
    else:
        c += [f"static char *{name}_weights_block_;", f"static char *{name}_weights_;"]
    c.append("")
    c += [f"void {name}_free(void) {{", f"    free({name}_arena_block_);",
          f"    {name}_arena_block_ = NULL;", f"    {name}_arena_ = NULL;"]
    c += ([f"    {name}_ready_ = 0;"] if embedded else
          [f"    free({name}_weights_block_);", f"    {name}_weights_block_ = NULL;", f"    {name}_weights_ = NULL;"])
    c += ["}", ""]
    c += [f"static char *{name}_aligned_(char **block, size_t bytes) {{",
          "    *block = malloc(bytes + 64);",
          "    if (!*block) return NULL;",
          "    return *block + ((64 - ((uintptr_t)*block % 64)) % 64);", "}", ""]
    c += [f"int {name}_init(const char *weights_path) {{", f"    {name}_free();"]
    if embedded:
        c.append("    (void)weights_path;")
    else:
        c += ["    const unsigned one = 1;",
              f"    if (*(const unsigned char *)&one != 1) return {NAME}_ERR_ENDIAN;",
              "    FILE *f = weights_path ? fopen(weights_path, \"rb\") : NULL;",
              f"    if (!f) return {NAME}_ERR_OPEN;",
              "    unsigned char head[64];",
              "    uint64_t payload = 0, count = 0;",
              "    int ok = fread(head, 1, 64, f) == 64 && memcmp(head, \"MITHRIL1\", 8) == 0;",
              "    for (int i = 7; ok && i >= 0; --i) {",
              "        payload = (payload << 8) | head[8 + i];",
              "        count = (count << 8) | head[16 + i];",
              "    }",
              f"    if (!ok || payload != {NAME}_WEIGHT_FILE_PAYLOAD || count != {len(arrays)}) {{",
              f"        fclose(f);", f"        return {NAME}_ERR_FORMAT;", "    }",
              f"    {name}_weights_ = {name}_aligned_(&{name}_weights_block_, (size_t)payload);",
              f"    if (!{name}_weights_) {{", "        fclose(f);", f"        return {NAME}_ERR_MEMORY;", "    }",
              f"    ok = fread({name}_weights_, 1, (size_t)payload, f) == (size_t)payload && fgetc(f) == EOF;",
              "    fclose(f);",
              "    if (!ok) {", f"        {name}_free();", f"        return {NAME}_ERR_FORMAT;", "    }"]
    c += [f"    {name}_arena_ = {name}_aligned_(&{name}_arena_block_, {NAME}_ARENA_BYTES);",
          f"    if (!{name}_arena_) {{", f"        {name}_free();", f"        return {NAME}_ERR_MEMORY;", "    }"]
    if embedded:
        c.append(f"    {name}_ready_ = 1;")
    c += ["    return 0;", "}", ""]
    failures = rendered.failures
    c += [f"const char *{name}_status_message(int status) {{", "    switch (status) {",
          '    case 0: return "ok";',
          f'    case {NAME}_ERR_NOT_INITIALIZED: return "{name}_init was not called, or failed";',
          f'    case {NAME}_ERR_OPEN: return "the weights file cannot be opened";',
          f'    case {NAME}_ERR_FORMAT: return "the weights file is not this model\'s (wrong magic, size or tensor count)";',
          f'    case {NAME}_ERR_MEMORY: return "out of memory";',
          f'    case {NAME}_ERR_ENDIAN: return "the weights are little-endian and this host is not";']
    for k, (pn, problem) in enumerate(failures, start=1):
        c.append(f"    case {k}: return {_c_string(f'node {pn.label} ({pn.op_type}): {problem}')};")
    c += ['    default: return "unknown status";', "    }", "}", ""]
    c.append(body)
    # The run function: the segment's io array, from the caller's buffers, the weights and the arena.
    ready = f"{name}_ready_" if embedded else f"{name}_weights_"
    c += [f"int {name}_run_io(const void *const *inputs, void *const *outputs) {{",
          f"    if (!{name}_arena_ || !{ready}) return {NAME}_ERR_NOT_INITIALIZED;",
          "    (void)inputs; (void)outputs;"]
    out_index = {}
    for j, v in enumerate(outputs):
        out_index.setdefault(v, j)
    if seg is not None:
        io = seg.inputs + seg.outputs
        c.append(f"    void *io[{max(len(io), 1)}];")
        for k, v in enumerate(io):
            if v in seg.outputs:
                src = f"outputs[{out_index[v]}]"
            elif v.kind == "input":
                src = f"(void *)inputs[{inputs.index(v)}]"
            elif embedded:
                src = f"(void *){name}_w{stored.index(v)}"
            else:
                src = f"(void *)({name}_weights_ + {offsets[stored.index(v)]})"
            c.append(f"    io[{k}] = {src};  /* {_comment(v.name)} */")
        c += [f"    int status = {name}_seg{seg.index}(io, {name}_arena_);", "    if (status) return status;"]
    produced = set(seg.outputs) if seg else set()
    for j, v in enumerate(outputs):
        if out_index[v] != j:
            src = f"outputs[{out_index[v]}]"
        elif v in produced:
            continue
        elif v.kind == "input":
            src = f"inputs[{inputs.index(v)}]"
        elif embedded:
            src = f"{name}_w{stored.index(v)}"
        else:
            src = f"{name}_weights_ + {offsets[stored.index(v)]}"
        c.append(f"    memcpy(outputs[{j}], {src}, {nbytes(v)}UL);  /* {_comment(v.name)} */")
    c += ["    return 0;", "}", ""]
    params_c = [f"const {ctype(v)} *{i}" for v, i in zip(inputs, in_ids)] + [f"{ctype(v)} *{i}" for v, i in zip(outputs, out_ids)]
    c += [f"int {name}_run({', '.join(params_c) or 'void'}) {{",
          f"    const void *ins[{max(len(inputs), 1)}] = {{{', '.join(in_ids) or 'NULL'}}};",
          f"    void *outs[{max(len(outputs), 1)}] = {{{', '.join(out_ids) or 'NULL'}}};",
          f"    return {name}_run_io(ins, outs);", "}", ""]

    # -- main.c ----------------------------------------------------------------------------
    default_weights = "NULL" if embedded else _c_string(f"{name}.bin")
    m = [f"/* main.c: run the exported model on raw files (generated by Mithril).",
         " *",
         f" *   ./{name} [-w WEIGHTS] [-t THREADS] INPUT.bin... OUTPUT.bin...",
         " *",
         f" * Give {len(inputs)} input file(s), then {len(outputs)} output path(s), in the order of {name}.h.",
         " * Each file is the tensor's raw bytes: C-contiguous (row-major), little-endian, exactly",
         f" * {name}.h's INPUTi_BYTES long (numpy: x.astype(dtype).tofile(path); np.fromfile(path, dtype)).",
         f" * -w: the weights file (default {name}.bin; not used when the weights are embedded).",
         " * Exit status: 0 success, 1 a run or file error, 2 a usage error. */",
         "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", f'#include "{name}.h"', "",
         "static void *read_file(const char *path, size_t bytes) {",
         "    FILE *f = fopen(path, \"rb\");",
         "    if (!f) {", "        fprintf(stderr, \"%s: cannot open\\n\", path);", "        return NULL;", "    }",
         "    char *buf = malloc(bytes ? bytes : 1);",
         "    size_t got = buf ? fread(buf, 1, bytes, f) : 0;",
         "    int extra = fgetc(f) != EOF;",
         "    fclose(f);",
         "    if (!buf || got != bytes || extra) {",
         "        fprintf(stderr, \"%s: expected exactly %zu bytes\\n\", path, bytes);",
         "        free(buf);", "        return NULL;", "    }", "    return buf;", "}", "",
         "int main(int argc, char **argv) {",
         f"    const char *weights = {default_weights};",
         "    int first = 1;",
         "    while (first + 1 < argc && argv[first][0] == '-' && argv[first][1] && !argv[first][2]) {",
         "        if (argv[first][1] == 'w') weights = argv[first + 1];",
         f"        else if (argv[first][1] == 't') {name}_set_threads(atoi(argv[first + 1]));",
         "        else break;",
         "        first += 2;", "    }",
         f"    if (argc - first != {NAME}_NUM_INPUTS + {NAME}_NUM_OUTPUTS) {{",
         f"        fprintf(stderr, \"usage: %s [-w WEIGHTS] [-t THREADS] \"",
         "                \"" + " ".join(f"{i}.bin" for i in in_ids) + (" " if in_ids and out_ids else "")
         + " ".join(f"{o}.bin" for o in out_ids) + "\\n\", argv[0]);",
         "        return 2;", "    }",
         f"    int status = {name}_init(weights);",
         "    if (status) {",
         f"        fprintf(stderr, \"{name}_init(%s): %s\\n\", weights ? weights : \"embedded\", {name}_status_message(status));",
         "        return 1;", "    }",
         f"    void *ins[{max(len(inputs), 1)}] = {{0}};",
         f"    void *outs[{max(len(outputs), 1)}] = {{0}};",
         "    int rc = 0;",
         f"    for (int i = 0; i < {NAME}_NUM_INPUTS && rc == 0; ++i) {{",
         f"        ins[i] = read_file(argv[first + i], {name}_input_bytes[i]);",
         "        if (!ins[i]) rc = 1;", "    }",
         f"    for (int j = 0; j < {NAME}_NUM_OUTPUTS && rc == 0; ++j) {{",
         f"        outs[j] = malloc({name}_output_bytes[j] ? {name}_output_bytes[j] : 1);",
         "        if (!outs[j]) rc = 1;", "    }",
         "    if (rc == 0) {",
         f"        status = {name}_run_io((const void *const *)ins, outs);",
         "        if (status) {",
         f"            fprintf(stderr, \"{name}_run: %s\\n\", {name}_status_message(status));",
         "            rc = 1;", "        }", "    }",
         f"    for (int j = 0; j < {NAME}_NUM_OUTPUTS && rc == 0; ++j) {{",
         f"        const char *path = argv[first + {NAME}_NUM_INPUTS + j];",
         "        FILE *f = fopen(path, \"wb\");",
         f"        if (!f || fwrite(outs[j], 1, {name}_output_bytes[j], f) != {name}_output_bytes[j]) {{",
         "            fprintf(stderr, \"%s: cannot write\\n\", path);", "            rc = 1;", "        }",
         "        if (f && fclose(f) != 0) rc = 1;", "    }",
         f"    for (int i = 0; i < {NAME}_NUM_INPUTS; ++i) free(ins[i]);",
         f"    for (int j = 0; j < {NAME}_NUM_OUTPUTS; ++j) free(outs[j]);",
         f"    {name}_free();", "    return rc;", "}", ""]

    make = [f"# Builds ./{name} (main.c + {name}.c) with nothing but a C compiler and libm (generated by Mithril).",
            "#   make                 -O3 -fno-math-errno (-O3 keeps the kernels' register tiles in registers;",
            "#                        loops calling libm vectorize), OpenMP threads",
            "#   make OPENMP=         without OpenMP (one thread)",
            "#   make CFLAGS='-O3 -march=native -fno-math-errno'",
            f"#   make lib{name}.a       the model alone, to link into your program (include {name}.h)",
            "CC = cc", "CFLAGS = -O3 -fno-math-errno", "OPENMP = -fopenmp",
            "WARN = -std=c11 -Wall -Wextra -Wno-unknown-pragmas", "LDLIBS = -lm", "",
            f"all: {name}", "",
            f"{name}: main.c {name}.c {name}.h",
            f"\t$(CC) $(CFLAGS) $(WARN) $(OPENMP) -Ilib -o $@ main.c {name}.c $(LDFLAGS) $(LDLIBS)", "",
            f"{name}.o: {name}.c {name}.h",
            f"\t$(CC) $(CFLAGS) $(WARN) $(OPENMP) -Ilib -c -o $@ {name}.c", "",
            f"lib{name}.a: {name}.o", "\t$(AR) rcs $@ $^", "",
            "clean:", f"\trm -f {name} {name}.o lib{name}.a", "",
            f".PHONY: all clean", ""]

    def write(path: Path, text: str | bytes) -> None:
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        files.append(path)

    write(directory / f"{name}.h", "\n".join(h))
    write(directory / f"{name}.c", "\n".join(c))
    write(directory / "main.c", "\n".join(m))
    write(directory / "Makefile", "\n".join(make))
    if not embedded:
        payload = bytearray(top)
        for off, arr in zip(offsets, arrays):
            payload[off:off + arr.nbytes] = arr.tobytes()
        head = MAGIC + struct.pack("<QQ", top, len(arrays))
        write(directory / f"{name}.bin", head + bytes(ALIGN - len(head)) + bytes(payload))
    stale = directory / f"{name}.bin"
    if embedded and stale.exists():
        stale.unlink()  # an earlier export's weights would no longer match this model.c
    for header in _kernel_headers():
        write(directory / "lib" / header.name, header.read_text())
    return CExport(directory, files, arena, weight_bytes, embedded,
                   [(v.name, v.static_shape, str(v.dtype)) for v in inputs],
                   [(v.name, v.static_shape, str(v.dtype)) for v in outputs])


__all__ = ["CExport", "EMBED_LIMIT", "WEIGHTS_CHOICES", "check_out_dir", "write_tree"]
