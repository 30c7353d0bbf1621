"""The ``mithril`` command line (also ``python -m mithril``): ``inspect``, ``validate``,
``reduce``, ``conformance``, ``ops``, ``export-c``, ``export-gguf``, ``launch``, ``profile``.

    mithril inspect model.onnx
    mithril validate model.onnx --backend numpy --shape input=1,3,224,224 --per-node
    mithril profile model.onnx --backend torch --shape input=1,3,224,224 --top 10
    mithril reduce model.onnx --backend numpy -o small.onnx
    mithril conformance --backend numpy
    mithril ops Conv
    mithril export-c model.onnx out_dir --shape input=1,3,32,32
    mithril export-gguf model.onnx model.gguf --quantize q8_0
    mithril launch --nproc 4 train.py --epochs 3

Every command exits 0 on success and non-zero otherwise (:data:`EXIT_STATUS`); an error is one
line on stderr, with the traceback only under ``--debug``; nothing is written into the package's
files unless asked (``conformance --write-docs``). Tables keep every figure when stdout is not a
terminal; long work reports progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections import Counter

import numpy as np

from .backends.table import BACKENDS
from .errors import MithrilError


EXIT_STATUS = """exit status:
  0    success (validate: every output within tolerance; conformance: every case passed or
       is an expected failure)
  1    a check failed (an output out of tolerance, a backend that raised, a failing case)
  2    a usage or input error (unknown backend or input name, bad shape syntax, a missing or
       unreadable file, a model no backend can run)
  3    an internal error: a bug in mithril (run again with --debug and report it)
  130  interrupted

Errors are one line on stderr; --debug (or MITHRIL_DEBUG=1) adds the traceback."""


def available_backends() -> dict[str, type]:
    """Backend name -> class, for the rows of the backend table whose framework is installed."""
    return {name: entry.load() for name, entry in BACKENDS.items() if entry.installed()}


def make_backends(spec: str, dtype: str | None = None) -> tuple[list, dict[str, str]]:
    """The backends ``--backend`` names (Backend instances), and (for ``all``) backend -> why it
    cannot run here: :func:`make_runners`' backends."""
    runners, skipped = make_runners(spec, dtype)
    return [r.backend for r in runners], skipped


def make_runners(spec: str, dtype: str | None = None) -> tuple[list, dict[str, str]]:
    """The backends ``--backend`` names, as runners labelled with their specs, and (for ``all``)
    backend -> why it cannot run here.

    ``spec`` is ``all`` or comma-separated backend specs with options (``numpy``,
    ``ggml:quantize=q8_0``, ``torch:dtype=bfloat16``: :func:`mithril.runners.parse_backend_spec`).
    A name that is unknown, not installed or fails to start is an error when named; under ``all``
    every backend of the table is tried and those that cannot start are listed with the reason.
    ``dtype`` (``--dtype``) is each backend's ``dtype=`` where its spec sets none: a float32 file
    then computes in it."""
    from .runners import BackendRunner, parse_backend_spec

    options = {} if dtype is None else {"dtype": _parse_dtype(dtype)}
    if spec.strip() == "all":
        backends, skipped = [], {}
        for name, entry in BACKENDS.items():
            if not entry.installed():
                skipped[name] = f"not installed (no {entry.array_modules[0]} package)"
                continue
            try:
                backends.append(BackendRunner(entry.load()(**options)))
            except MithrilError as exc:
                skipped[name] = str(exc).splitlines()[0]
        return backends, skipped
    pieces = [s.strip() for s in spec.split(",") if s.strip()]
    if not pieces:
        raise MithrilError(f"--backend names no backend; choose from {', '.join(BACKENDS)} or 'all'")
    backends = []
    for piece in pieces:
        n = piece.split(":")[0].strip()
        if n not in BACKENDS:
            raise MithrilError(f"unknown backend {n!r}; choose from {', '.join(BACKENDS)} or 'all'")
        if not BACKENDS[n].installed():
            raise MithrilError(f"backend {n!r} is not available: its framework "
                               f"({BACKENDS[n].array_modules[0]}) is not installed")
        if dtype is not None and not any(o.strip().startswith("dtype=") for o in piece.split(":")[1:]):
            piece = f"{piece}:dtype={dtype}"
        backends.append(BackendRunner(parse_backend_spec(piece), name=piece))
    return backends, {}


_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _parse_dtype(text: str):
    import mithril as ml

    if text not in _DTYPES:
        raise MithrilError(f"--dtype {text}: choose from {', '.join(_DTYPES)}")
    return getattr(ml, text)


def console():
    """A rich console for stdout. On a terminal, tables fit its width (cells fold, never cut);
    elsewhere (a pipe, a log file) lines are as long as their content, so no figure is lost."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=100_000, soft_wrap=True)


def _progress_printer():
    """Progress lines on stderr, with the seconds since the start."""
    import time

    start = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", file=sys.stderr, flush=True)

    return say


def _parse_kv(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise MithrilError(f"{flag} expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def cmd_inspect(args) -> int:
    from rich.table import Table

    import mithril as ml
    from .onnx_bridge.schema import canonical_domain
    from .dtypes import onnx_type_name

    model = ml.load_onnx(args.model)
    out = console()
    out.print(f"[bold]{args.model}[/bold]  ir_version {model.ir.ir_version}, producer "
                  f"{model.ir.producer_name or '?'} {model.ir.producer_version or ''}")
    out.print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(model.opset_imports.items())))
    io = Table(title="inputs and outputs")
    for col in ("kind", "name", "dtype", "shape"):
        io.add_column(col, overflow="fold")
    inits = model.graph.initializers
    for kind, values in (("input", [v for v in model.graph.inputs if v.name not in inits]), ("output", model.graph.outputs)):
        for v in values:
            dtype = onnx_type_name(int(v.dtype)) if v.dtype is not None else str(v.type)
            shape = [d if isinstance(d, int) else str(d) for d in v.shape] if v.shape is not None else "?"
            io.add_row(kind, v.name, dtype, str(shape))
    out.print(io)
    n_params = sum(int(np.prod(v.shape)) for v in inits.values() if v.shape is not None)
    out.print(f"{len(inits)} initializers, {n_params:,} elements")
    backends = list(BACKENDS)
    ops = Table(title="ops")
    ops.add_column("op", overflow="fold")
    ops.add_column("count", justify="right", overflow="fold")
    for b in backends:
        ops.add_column(b, justify="center", overflow="fold")
    unsupported: dict[str, list[str]] = {b: [] for b in backends}
    on_numpy: dict[str, list[str]] = {b: [] for b in backends}  # run by a backend's NumPy fallback
    counts = Counter()
    for node in model.graph.all_nodes():
        counts[(canonical_domain(node.domain), node.op_type)] += 1
    avail = available_backends()
    for (domain, op), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        opset = model.opset_imports.get(domain, 1)
        label = f"{domain}::{op}" if domain else op
        row = [label, str(n)]
        for b in backends:
            if b not in avail:
                row.append("[dim]n/a[/dim]")
                continue
            support = avail[b].op_support(op, domain, opset)
            if support is None:
                row.append("[red]no[/red]")
                unsupported[b].append(f"{label} (opset {opset})")
            elif support.kind == "NumPy fallback":
                row.append("[yellow]NumPy[/yellow]")
                on_numpy[b].append(label)
            else:
                row.append("[green]yes[/green]")
        ops.add_row(*row)
    out.print(ops)
    for b in backends:
        if b in avail:
            missing = unsupported[b]
            fallback = (f" ({len(on_numpy[b])} on its NumPy fallback: {', '.join(on_numpy[b])})"
                        if on_numpy[b] else "")
            out.print(f"{b}: " + (f"[red]{len(missing)} unsupported op(s):[/red] " + ", ".join(missing)
                                  if missing else "[green]every op supported[/green]") + fallback)
    if any(on_numpy.values()):
        out.print("[dim]NumPy: the backend has no rule of its own; NumPy runs the op between its segments "
                  "(fallback='numpy', warned at compile)[/dim]")
    if any(b not in avail for b in backends):
        out.print("[dim]n/a: backend not available in this installation[/dim]")
    return 0


def _load_array(name: str, path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise MithrilError(f"--input {name}={path}: cannot read a .npy array: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise MithrilError(f"--input {name}={path}: cannot read a .npy array: {exc}") from exc


def _parse_shape(name: str, text: str) -> list[int]:
    try:
        dims = [int(d) for d in text.split(",")] if text.strip() else []
    except ValueError:
        raise MithrilError(f"--shape {name}={text}: dims must be integers separated by commas") from None
    if any(d < 0 for d in dims):
        raise MithrilError(f"--shape {name}={text}: dims must not be negative")
    return dims


def _parse_tolerance(items: list[str] | None, flag: str):
    """``--atol 1e-3`` (every output) and ``--atol logits=1e-3`` (one output), repeatable: None,
    a figure, or output name -> figure with ``"*"`` for the bare one."""
    per_output: dict[str, float] = {}
    for item in items or []:
        name, _, text = item.rpartition("=")
        try:
            value = float(text)
        except ValueError:
            raise MithrilError(f"{flag} {item}: expected a number or NAME=NUMBER") from None
        per_output[name or "*"] = value
    if not per_output:
        return None
    return per_output["*"] if list(per_output) == ["*"] else per_output


def cmd_validate(args) -> int:
    """Exit 0 when every output of every backend that ran is within tolerance, 1 when one is not
    (or a backend raised while running under ``--backend all``), 2 for bad arguments or when no
    backend could run the model."""
    import mithril as ml

    from .errors import ValidationError
    from .validate import check_input_names, check_inputs

    shapes = {k: _parse_shape(k, v) for k, v in _parse_kv(args.shape, "--shape").items()} or None
    input_files = _parse_kv(args.input, "--input")
    rtol = _parse_tolerance(args.rtol, "--rtol")
    atol = _parse_tolerance(args.atol, "--atol")
    if args.per_node_memory <= 0:
        raise MithrilError(f"--per-node-memory {args.per_node_memory:g}: a number of MiB above 0")
    if args.load_outputs is not None and args.reference is not None:
        raise MithrilError("--reference and --load-outputs: the saved outputs are the reference; give one")
    if args.load_outputs is not None and args.per_node:
        raise MithrilError("--per-node needs a reference that runs: --load-outputs holds only the model's outputs")
    model = ml.load_onnx(args.model)
    check_input_names(model, input_files, "--input")  # a misspelt name before its file
    inputs = {k: _load_array(k, v) for k, v in input_files.items()} or None
    check_inputs(model, inputs, shapes, flags=("--input", "--shape"))
    backends, skipped = make_runners(args.backend, args.dtype)
    say = _progress_printer() if not args.no_progress else None
    report = ml.validate(model, backends, inputs=inputs, shapes=shapes, per_node=args.per_node,
                         rtol=rtol, atol=atol, seed=args.seed,
                         skip_unsupported=args.backend.strip() == "all", progress=say,
                         reference=args.reference, load_inputs=args.load_inputs, save_inputs=args.save_inputs,
                         load_outputs=args.load_outputs, save_outputs=args.save_outputs,
                         memory_budget=args.per_node_memory * 2**20)
    report.skipped = {**skipped, **report.skipped}
    out = console()
    if report.outputs:
        out.print(report.table())
    for b, d in report.first_divergence.items():
        out.print(f"{b}: " + (d.describe() if d else "every node within tolerance"), markup=False)
    for b, reason in report.errors.items():
        out.print(f"{b}: [red]FAILED[/red]: {reason}")
    for b, reason in report.skipped.items():
        out.print(f"{b}: not run: {reason}")
    if args.json:
        report.to_json(args.json)
        out.print(f"report written to {args.json}", markup=False)
    if args.report:
        report.to_html(args.report)
        out.print(f"report written to {args.report}", markup=False)
    ran = {o.backend for o in report.outputs} | set(report.errors)
    if not ran:
        raise ValidationError("no backend could run the model: "
                              + "; ".join(f"{b}: {r}" for b, r in report.skipped.items()))
    out.print("[green]all outputs pass[/green]" if report.passed else "[red]validation failed[/red]")
    return 0 if report.passed else 1


def cmd_reduce(args) -> int:
    """Shrink a failing model to a few nodes that fail the same way (:func:`mithril.reduce`) and
    write them with their inputs; exit 0 when reduced, 1 when the model does not fail at all, 2 for
    bad arguments."""
    import mithril as ml

    from .runners import parse_runner
    from .validate import check_input_names, check_inputs

    shapes = {k: _parse_shape(k, v) for k, v in _parse_kv(args.shape, "--shape").items()} or None
    input_files = _parse_kv(args.input, "--input")
    model = ml.load_onnx(args.model)
    check_input_names(model, input_files, "--input")  # a misspelt name before its file
    inputs = {k: _load_array(k, v) for k, v in input_files.items()} or None
    check_inputs(model, inputs, shapes, flags=("--input", "--shape"))
    backend, reference = parse_runner(args.backend), parse_runner(args.reference)
    out = args.out or os.path.splitext(args.model)[0] + ".reduced.onnx"
    say = _progress_printer() if not args.no_progress else None
    result = ml.reduce(model, backend, reference, inputs=inputs, shapes=shapes, rtol=args.rtol, atol=args.atol,
                       out=out, seed=args.seed, progress=say)
    print(result)
    return 0 if result.failed else 1


def cmd_export_c(args) -> int:
    """Write the model as a standalone C source tree (ml.export_c); exit 2 on bad arguments or a
    model C cannot run (a node without a C kernel, a symbolic shape left unfixed)."""
    import mithril as ml

    import onnx_ir as ir

    from .validate import check_inputs, model_inputs

    shapes = {k: _parse_shape(k, v) for k, v in _parse_kv(args.shape, "--shape").items()} or None
    if args.dtype not in ("float32", "float64"):
        raise MithrilError(f"--dtype {args.dtype}: the C backend computes in float32 or float64")
    model = ml.load_onnx(args.model)
    check_inputs(model, None, shapes, flags=("--input", "--shape"))
    loose = [f"{n} {[d if isinstance(d, int) else str(d) for d in v.shape] if v.shape is not None else '(rank unknown)'}"
             for n, v in model_inputs(model).items() if n not in (shapes or {})
             and isinstance(v.type, ir.TensorType) and (v.shape is None or not all(isinstance(d, int) for d in v.shape))]
    if loose:
        raise MithrilError(f"C code has fixed shapes: give --shape NAME=D0,D1,... for {'; '.join(loose)}")
    out = ml.export_c(model, args.out_dir, shapes=shapes, dtype=getattr(ml, args.dtype), weights=args.weights,
                      name=args.name)
    where = "embedded in " + f"{args.name}.c" if out.embedded else f"{args.name}.bin"
    print(f"wrote {len(out.files)} files to {out.directory}: {args.name}.h, {args.name}.c, main.c, Makefile, lib/ "
          f"(weights {out.weight_bytes:,} bytes, {where}; arena {out.arena_bytes:,} bytes)")
    for kind, values in (("input", out.inputs), ("output", out.outputs)):
        for n, shape, dtype in values:
            print(f"  {kind} {n}: {dtype} {list(shape)}")
    print(f"build: make -C {out.directory}; run: ./{args.name} INPUT.bin... OUTPUT.bin... (raw little-endian)")
    return 0


def cmd_export_gguf(args) -> int:
    """Write an ONNX decoder (optimum's export with its key/value cache) as a GGUF file llama.cpp
    runs (ml.save_gguf(..., arch=...)); exit 2 on a model or tokenizer that cannot be converted."""
    from .backends.ggml.llama_gguf import save_llama_gguf

    if not os.path.isfile(args.model):
        raise MithrilError(f"export-gguf: no file {args.model!r}")
    hp = save_llama_gguf(args.model, args.out, arch=args.arch, quantize=args.quantize, tokenizer=args.tokenizer,
                         config=args.config, name=args.name, context_length=args.context_length)
    print(f"wrote {args.out}: {hp['arch']}, {hp['n_layer']} blocks, embedding {hp['n_embd']}, {hp['n_head']} heads "
          f"({hp['n_head_kv']} key/value), vocabulary {hp['n_vocab']}, context {hp['n_ctx']}, "
          f"matrices {args.quantize or 'f32'} ({os.path.getsize(args.out):,} bytes)")
    return 0


def cmd_profile(args) -> int:
    """Time per op type and per node of one backend (:func:`mithril.profile.profile`) on random
    inputs; exit 2 on bad arguments or a model the backend cannot run."""
    import mithril as ml

    from .profile import profile
    from .validate import check_inputs, random_inputs

    if args.runs < 1 or args.top < 1 or (args.threads is not None and args.threads < 1):
        raise MithrilError(f"--runs, --top and --threads must be at least 1 (got {args.runs}, {args.top}, "
                           f"{args.threads})")
    names = [s.strip() for s in args.backend.split(",") if s.strip()]
    if len(names) != 1 or names[0] == "all":
        raise MithrilError(f"profile runs one backend: --backend NAME, from {', '.join(BACKENDS)} "
                           f"(got {args.backend!r})")
    if names[0] not in BACKENDS:
        raise MithrilError(f"unknown backend {names[0]!r}; choose from {', '.join(BACKENDS)}")
    # As validate's, and 1x3x224x224 too.
    shapes = {k: _parse_shape(k, v.replace("x", ",")) for k, v in _parse_kv(args.shape, "--shape").items()} or None
    model = ml.load_onnx(args.model)
    check_inputs(model, None, shapes, flags=("--input", "--shape"))
    (backend,), _ = make_backends(names[0])
    if args.threads is not None:
        if not backend.set_num_threads(args.threads):
            print(f"mithril: note: --threads does not apply to {backend.name}: its thread pool is fixed when it "
                  "starts", file=sys.stderr)
    inputs = random_inputs(model, shapes, args.seed)
    pm = ml.compile(model, backend, shapes={k: v.shape for k, v in inputs.items()}, inference=True)
    report = profile(pm, None, {k: backend.from_numpy(v) for k, v in inputs.items()}, runs=args.runs)
    out = console()
    out.print(f"[bold]{args.model}[/bold]  inputs " + ", ".join(
        f"{k} {'x'.join(map(str, v.shape)) or 'scalar'} {v.dtype}" for k, v in inputs.items()))
    out.print(report.summary())
    out.print(report.op_table())
    out.print(report.node_table(args.top))
    if args.json:
        try:
            report.write_json(args.json, model=args.model,
                              inputs={k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in inputs.items()})
        except OSError as exc:
            raise MithrilError(f"--json {args.json}: cannot write: {exc.strerror or exc}") from None
        out.print(f"wrote {args.json}")
    return 0


def cmd_conformance(rest: list[str]) -> int:
    from .conformance import main as conformance_main

    return conformance_main(rest)


def _load_overrides() -> dict[str, str]:
    """Registers every backend's overrides; backend -> why not, for those whose framework is
    not installed."""
    import importlib

    importlib.import_module("mithril.backends.kernels")  # registers the shared kernels

    missing = {}
    for name, entry in BACKENDS.items():
        try:
            importlib.import_module(f"{entry.package}.overrides")
        except ImportError as exc:
            missing[name] = str(exc) or type(exc).__name__
    return missing


def cmd_ops(args) -> int:
    """What runs an op on each backend, per opset range, and where it is defined: each backend
    class answers (``Backend.op_ranges``)."""
    import difflib

    from .onnx_bridge.schema import canonical_domain

    missing = _load_overrides()
    classes = {name: entry.load() for name, entry in BACKENDS.items()}
    if args.op is None:
        return _list_ops(classes, missing, None if args.domain is None else canonical_domain(args.domain))
    domain = canonical_domain(args.domain or "")
    label = f"{domain or 'ai.onnx'}::{args.op}"
    keys = set().union(*(cls.op_keys() for cls in classes.values()))
    if (domain, args.op) not in keys:
        elsewhere = sorted({d or "ai.onnx" for d, op in keys if op == args.op})
        if elsewhere:
            raise MithrilError(f"no kernel for {label}; {args.op} is in domain {', '.join(elsewhere)} (--domain)")
        names = sorted({op for d, op in keys if d == domain})
        close = difflib.get_close_matches(args.op, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise MithrilError(f"no kernel for {label} on any backend{hint}")
    print(label)
    for b, cls in classes.items():
        if b in missing:
            print(f"{b}: overrides not loaded ({missing[b]}); its framework is not installed")
            continue
        print(b)
        ranges = cls.op_ranges(args.op, domain)
        if not ranges:
            print("  no kernel")
        for r in ranges:
            span = f"opset {r.first}+" if r.last is None else f"opset {r.first}-{r.last}"
            print(f"  {span:<12} {r.function} ({r.kind})  {r.location}")
            if r.meta:
                print(f"  {'':<12} {r.meta}")
    return 0


# What an op's ranges on a backend come from, besides its own kernels or rules.
_NOT_OWN = ("shared", "NumPy fallback")


def _list_ops(classes: dict[str, type], missing: dict[str, str], domain: str | None) -> int:
    """Every op (of ``domain``, or of all), with its shared versions and what each backend runs of its own."""
    from .backends.registry import REGISTRY

    ops = sorted({key for cls in classes.values() for key in cls.op_keys() if domain is None or key[0] == domain})
    if not ops:
        raise MithrilError(f"no kernel in domain {domain or 'ai.onnx'!r}")
    width = max(len(f"{d}::{op}" if d else op) for d, op in ops) + 2
    print((f"{'op':<{width}}{'shared':<14}" + "".join(f"{b:<10}" for b in classes)).rstrip())
    counts = {b: [0, 0] for b in classes}  # ops with a kernel, ops with its own
    for d, op in ops:
        shared = REGISTRY.versions(op, d)
        row = f"{(f'{d}::{op}' if d else op):<{width}}{','.join(map(str, shared)) or '-':<14}"
        for b, cls in classes.items():
            if b in missing:
                row += f"{'?':<10}"
                continue
            ranges = cls.op_ranges(op, d)
            own = [r.first for r in ranges if r.kind not in _NOT_OWN]
            cell = "+" + ",".join(map(str, own)) if own else "." if ranges else "-"
            counts[b][0] += bool(ranges)
            counts[b][1] += bool(own)
            row += f"{cell:<10}"
        print(row.rstrip())
    print(f"{len(ops)} ops. Per backend: '.' the shared kernel (on NumPy where the backend falls back to it), "
          "'+N' its own since opset N, '-' none.")
    for b in classes:
        if b in missing:
            print(f"{b}: overrides not loaded ({missing[b]})")
        else:
            print(f"{b}: {counts[b][0]} ops, {counts[b][1]} of its own")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mithril", description="Mithril: ONNX-centred model compiler.",
                                epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__import__('mithril').__version__}")
    # Read by main() before parsing, so it works before or after the command.
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="inputs, outputs, opsets, op counts and backend support of an ONNX file",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    i.add_argument("model")
    v = sub.add_parser("validate", help="run a model on backends and on a reference (onnxruntime, another backend, "
                       "or saved outputs) and compare outputs",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("model")
    v.add_argument("--backend", default="numpy",
                   help=f"comma-separated backends from {', '.join(BACKENDS)}, each with options "
                        "(ggml:quantize=q8_0,torch:dtype=bfloat16), or 'all' (default: numpy)")
    v.add_argument("--reference", default=None, metavar="SPEC",
                   help="what to compare with: onnxruntime (default) or a backend with options (torch:dtype=float64)")
    v.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="input data (repeatable); inputs not given get random data")
    v.add_argument("--shape", action="append", metavar="NAME=D0,D1,...", help="input shape for random data (repeatable)")
    v.add_argument("--dtype", default=None, metavar="DTYPE",
                   help=f"the backends' dtype ({', '.join(_DTYPES)}): a float32 file computes in it, its inputs "
                        "and outputs kept float32, held to that dtype's tolerance (default: each backend's own)")
    v.add_argument("--load-inputs", default=None, metavar="PATH",
                   help="every input from PATH: a .npz file or a folder of NAME.npy files (--input overrides one)")
    v.add_argument("--save-inputs", default=None, metavar="PATH", help="write the inputs used to PATH (.npz or a folder)")
    v.add_argument("--load-outputs", default=None, metavar="PATH",
                   help="compare with these saved outputs instead of running a reference (.npz or a folder)")
    v.add_argument("--save-outputs", default=None, metavar="PATH",
                   help="write the reference's outputs to PATH (.npz or a folder)")
    v.add_argument("--per-node", action="store_true", help="find the first node whose output leaves tolerance")
    v.add_argument("--per-node-memory", type=float, default=512, metavar="MiB",
                   help="--per-node compares at most this many MiB of values at once (default 512)")
    v.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    v.add_argument("--rtol", action="append", default=None, metavar="[NAME=]RTOL",
                   help="relative tolerance for every output, or NAME=RTOL for one (repeatable; default: per dtype)")
    v.add_argument("--atol", action="append", default=None, metavar="[NAME=]ATOL",
                   help="absolute tolerance for every output, or NAME=ATOL for one (repeatable; default: per dtype)")
    v.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    v.add_argument("--json", default=None, metavar="FILE", help="also write the whole report as JSON")
    v.add_argument("--report", default=None, metavar="FILE.html",
                   help="also write an HTML page: the table and, with --per-node, a plot of error per node")
    rd = sub.add_parser("reduce", help="shrink a model that fails on a backend to a few nodes that fail the same way",
                        epilog="exit status: 0 reduced (the files written), 1 the model does not fail at all, "
                               "2 a usage or input error, 3 an internal error",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    rd.add_argument("model")
    rd.add_argument("--backend", required=True, metavar="SPEC",
                    help="the backend that fails, with its options: numpy, torch:dtype=bfloat16, ggml:quantize=q8_0")
    rd.add_argument("--reference", default=None, metavar="SPEC",
                    help="what it is compared with: onnxruntime (default) or a backend spec")
    rd.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                    help="input data (repeatable); inputs not given get random data")
    rd.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                    help="input shape for random data (repeatable)")
    rd.add_argument("--rtol", type=float, default=None, help="override the per-dtype relative tolerance")
    rd.add_argument("--atol", type=float, default=None, help="override the per-dtype absolute tolerance")
    rd.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    rd.add_argument("-o", "--out", default=None, metavar="OUT.onnx",
                    help="the reduced model (default: MODEL.reduced.onnx beside MODEL); its inputs go to OUT.npz")
    rd.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    e = sub.add_parser("export-c", help="write a model as a standalone C source tree (model.h/.c, main.c, Makefile)",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("model")
    e.add_argument("out_dir", help="the folder to write into (created if needed; files of the same names are replaced)")
    e.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                   help="fix an input's shape (repeatable); every symbolic dim must be fixed")
    e.add_argument("--dtype", default="float32", metavar="DTYPE", help="float32 (default) or float64")
    e.add_argument("--weights", default="auto", choices=("auto", "file", "embed"),
                   help="model.bin, embedded arrays, or auto: embedded up to 256 KiB (default)")
    e.add_argument("--name", default="model", help="the files' stem and the C API's prefix (default: model)")
    gg = sub.add_parser("export-gguf", help="write an ONNX decoder LLM as a GGUF file llama.cpp runs",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    gg.add_argument("model", help="the decoder with its key/value cache (optimum's text-generation-with-past export)")
    gg.add_argument("out", help="the GGUF file to write")
    gg.add_argument("--arch", default="auto", choices=("auto", "gpt2", "llama", "qwen2", "phi3"),
                    help="llama.cpp's architecture (default: from config.json's model_type, else the weights' names)")
    gg.add_argument("--quantize", default=None, metavar="TYPE",
                    help="the matrices' type: f32 (default), f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K")
    gg.add_argument("--tokenizer", default=None, metavar="FILE",
                    help="a tokenizer.json (byte-level BPE; default: the one next to the model)")
    gg.add_argument("--config", default=None, metavar="FILE",
                    help="the Hugging Face config.json (default: the one next to the model; else read from the graph)")
    gg.add_argument("--context-length", type=int, default=None, help="the context length to declare")
    gg.add_argument("--name", default=None, help="general.name (default: the config's or the graph's name)")
    pr = sub.add_parser("profile", help="time per op type and per node of a model on one backend",
                        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("model")
    pr.add_argument("--backend", default="numpy", help=f"one of {', '.join(BACKENDS)} (default: numpy)")
    pr.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                    help="input shape for random data (repeatable; 1x3x224x224 also reads); symbolic dims default to 1")
    pr.add_argument("--runs", type=int, default=10, help="profiled runs after one warm-up; times are medians "
                                                        "over them (default 10)")
    pr.add_argument("--threads", type=int, default=None,
                    help="threads for numpy (BLAS), torch, c and ggml (default: each backend's own)")
    pr.add_argument("--top", type=int, default=10, help="how many of the slowest nodes to list (default 10)")
    pr.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    pr.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    sub.add_parser("conformance", help="run the ONNX backend test suite (see `mithril conformance --help`)",
                   add_help=False)
    sub.add_parser("launch", help="run a script on N processes of one torch.distributed group (torchrun)",
                   add_help=False)
    o = sub.add_parser("ops", help="which kernel runs an op on each backend, per opset, and where it is defined",
                       epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("op", nargs="?", help="an op type (Conv); without it, every op with counts per backend")
    o.add_argument("--domain", default=None, help="the op's domain (default: ai.onnx; com.microsoft, ai.onnx.ml...)")
    return p


def _launch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mithril launch", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run SCRIPT on NPROC processes of one torch.distributed process group, through torchrun "
                    "(python -m torch.distributed.run); inside it, TorchBackend(device_mesh=(NPROC,)) joins the "
                    "group. When a worker fails, torchrun ends the others and its summary names the first failing "
                    "rank with its traceback.",
        epilog="Two hosts, 4 processes each: on the first (rank-0) host\n"
               "  mithril launch --nproc 4 --nnodes 2 --node-rank 0 --master-addr HOST0 --master-port 29500 train.py\n"
               "and the same with --node-rank 1 on the second.\n\n"
               "exit status: 0 every worker succeeded, 1 a worker failed or ran past --timeout, 2 a usage error.")
    p.add_argument("--nproc", type=int, required=True, help="processes on this node (one per device)")
    p.add_argument("--nnodes", default="1", help="nodes (hosts) in all (default 1: this one, torchrun --standalone)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank among the nodes (default 0)")
    p.add_argument("--master-addr", default=None, help="the rank-0 node's address (several nodes)")
    p.add_argument("--master-port", type=int, default=None, help="the port the rank-0 node listens on (several nodes)")
    p.add_argument("--timeout", type=float, default=None, help="end every worker after this many seconds")
    p.add_argument("script", help="the Python script each process runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def cmd_launch(argv: list[str]) -> int:
    """``mithril launch``: the script through torchrun; 0 when every worker succeeded, 1 when one failed."""
    from .distributed.launch import WorkerError, run_script

    args = _launch_parser().parse_args(argv)
    if not os.path.isfile(args.script):
        raise MithrilError(f"launch: no script {args.script!r}")
    try:
        status = run_script(args.script, args.nproc, args.args, timeout=args.timeout, nnodes=args.nnodes,
                            node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port)
    except WorkerError as exc:  # past --timeout: every worker was ended
        print(f"mithril: {exc}", file=sys.stderr)
        return 1
    if status != 0:
        print(f"mithril: launch: a worker of {args.script} failed (exit status {status}); torchrun's summary above "
              "names the first failing rank", file=sys.stderr)
        return 1
    return 0


def _report(exc: BaseException, debug: bool) -> None:
    """One line on stderr (the message's own further lines, such as a list of nodes, indented
    under it); the traceback only with --debug."""
    if debug:
        traceback.print_exception(exc)
    kind = "error" if isinstance(exc, MithrilError) else f"internal error ({type(exc).__name__})"
    first, *rest = (str(exc) or type(exc).__name__).splitlines()
    print(f"mithril: {kind}: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line.strip()}", file=sys.stderr)
    if not debug and not isinstance(exc, MithrilError):
        print("mithril: this is a bug in mithril; run again with --debug for the traceback", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Exit status (:data:`EXIT_STATUS`): 0 success, 1 a check failed (validate: an output out of
    tolerance; conformance: a case failed that is not an expected failure), 2 an error (bad
    arguments or input, an unsupported model, a usage error), 3 an internal error, 130 interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    launched = argv  # launch passes every argument after the script to it, --debug included
    debug = "--debug" in argv or os.environ.get("MITHRIL_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    try:
        if launched and launched[0] == "launch":
            return cmd_launch(launched[1:])
        if argv and argv[0] == "conformance":
            return cmd_conformance(argv[1:])
        args = parser.parse_args(argv)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "reduce":
            return cmd_reduce(args)
        if args.command == "export-c":
            return cmd_export_c(args)
        if args.command == "export-gguf":
            return cmd_export_gguf(args)
        if args.command == "ops":
            return cmd_ops(args)
        if args.command == "profile":
            return cmd_profile(args)
        parser.error(f"unknown command {args.command}")
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("mithril: interrupted", file=sys.stderr)
        return 130
    except MithrilError as exc:
        _report(exc, debug)
        return 2
    except Exception as exc:  # the boundary: a bug shows as one line, not a traceback
        _report(exc, debug)
        return 3
    return 2


if __name__ == "__main__":
    sys.exit(main())
