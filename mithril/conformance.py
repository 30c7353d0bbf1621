"""Run the ONNX backend test suite (node cases and model tests) on a Mithril backend.

``mithril conformance --backend numpy`` (or ``python scripts/conformance.py``) runs every case,
compares with the expected outputs at each case's own rtol/atol, prints a summary and every failing
case not in the expected-failure lists (``mithril/expected_failures``), and exits 1 when there is one.
It writes nothing unless asked: ``--output FILE`` (this run as JSON), ``--write-docs`` (merge into
``reports/conformance.json``, per-case results for each backend, and ``docs/conformance.md``).
``--scoreboard`` counts ``onnx.backend.test.BackendTest`` instead, run through
:mod:`mithril.onnx_backend` as the ONNX Backend Scoreboard runs a runtime (see its section below).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import re
import signal
import sys
import time
import traceback
import unittest
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

from mithril.backends.table import BACKENDS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
REPORTS = REPO / "reports"  # generated data (the per-case record) stays out of the prose in docs/
EXPECTED_DIR = Path(__file__).resolve().parent / "expected_failures"
MODEL_TEST_DIRS = ("simple", "pytorch-converted", "pytorch-operator", "light")
CASE_TIMEOUT_S = 60


@dataclass
class CaseResult:
    name: str
    kind: str  # "node" or the model-test folder
    status: str  # "pass", "fail", "unsupported"
    reason: str
    ops: list[str]
    seconds: float


# -- collecting cases ------------------------------------------------------------------
_NODE_CASES = None


def node_cases():
    global _NODE_CASES
    if _NODE_CASES is None:
        from onnx.backend.test.case.node import collect_testcases

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            _NODE_CASES = {tc.name: tc for tc in collect_testcases(None)}
    return _NODE_CASES


def _data_root() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def model_test_dirs() -> dict[str, tuple[str, Path]]:
    out = {}
    for kind in MODEL_TEST_DIRS:
        for d in sorted((_data_root() / kind).glob("*")):
            if (d / "model.onnx").exists():
                out[f"{kind}/{d.name}"] = (kind, d)
    return out


def _read_pb(path: str):
    data = Path(path).read_bytes()
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(data)
        if tensor.data_type or tensor.dims:
            return onnx.numpy_helper.to_array(tensor)
    except Exception:
        pass
    seq = onnx.SequenceProto()
    seq.ParseFromString(data)
    return onnx.numpy_helper.to_list(seq)


def _model_test_data(d: Path):
    sets = []
    for ds in sorted(d.glob("test_data_set_*")):
        inputs = [_read_pb(p) for p in sorted(glob.glob(str(ds / "input_*.pb")), key=_pb_index)]
        outputs = [_read_pb(p) for p in sorted(glob.glob(str(ds / "output_*.pb")), key=_pb_index)]
        sets.append((inputs, outputs))
    return sets


def _pb_index(path: str) -> int:
    return int(re.search(r"_(\d+)\.pb$", path).group(1))


# -- running one case ------------------------------------------------------------------
def _ops_of(model: onnx.ModelProto) -> list[str]:
    ops = set()

    def walk(graph):
        for n in graph.node:
            ops.add(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for g in a.graphs:
                    walk(g)

    walk(model.graph)
    return sorted(ops)


def compare_outputs(name: str, expected, got, rtol: float, atol: float) -> None:
    """Raise AssertionError naming output ``name`` unless ``got`` matches ``expected`` as the ONNX
    node suite asks: same dtype and shape, exact for integers/strings/bools, else within rtol/atol."""
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            raise AssertionError(f"output {name!r}: expected a sequence of {len(expected)}, got {type(got).__name__}"
                                 f"{' of ' + str(len(got)) if isinstance(got, list) else ''}")
        for i, (e, g) in enumerate(zip(expected, got)):
            compare_outputs(f"{name}[{i}]", e, g, rtol, atol)
        return
    if expected is None:
        if got is not None:
            raise AssertionError(f"output {name!r}: expected an empty optional, got {type(got).__name__}")
        return
    if got is None:
        raise AssertionError(f"output {name!r}: expected a value, got None")
    expected = np.asarray(expected)
    got_arr = np.asarray(got)
    if expected.dtype != got_arr.dtype and not (expected.dtype == object and got_arr.dtype.kind in "OU"):
        raise AssertionError(f"output {name!r}: dtype {got_arr.dtype}, expected {expected.dtype}")
    if expected.shape != got_arr.shape:
        raise AssertionError(f"output {name!r}: shape {list(got_arr.shape)}, expected {list(expected.shape)}")
    if expected.dtype == object or expected.dtype.kind in "OUSb" or expected.dtype.kind in "iu":
        if not np.array_equal(expected, got_arr.astype(expected.dtype) if expected.dtype == object else got_arr):
            bad = int(np.sum(expected != got_arr))
            raise AssertionError(f"output {name!r}: {bad} of {expected.size} elements differ")
        return
    e = expected.astype(np.float64) if expected.dtype.kind != "c" else expected
    g = got_arr.astype(np.float64) if got_arr.dtype.kind != "c" else got_arr
    try:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    except AssertionError:
        with np.errstate(all="ignore"):
            err = np.abs(g - e)
            finite = np.isfinite(err)
            worst = float(np.max(err[finite])) if finite.any() else float("nan")
        nan_mismatch = int(np.sum(np.isnan(g) != np.isnan(e)))
        raise AssertionError(
            f"output {name!r}: values differ (max abs err {worst:.3g}, rtol {rtol}, atol {atol}"
            + (f", {nan_mismatch} NaN mismatches" if nan_mismatch else "") + ")"
        ) from None


def decode_value(value):
    """A case's TensorProto (or a list of them) as NumPy arrays; anything else unchanged."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    return value


def _timeout_handler(signum, frame):
    raise TimeoutError(f"case exceeded {CASE_TIMEOUT_S} s")


def run_case(name: str, backend_name: str) -> CaseResult:
    """Run one node case or model test (``kind/dir``) through load -> compile -> evaluate."""
    from mithril.errors import (KernelMissingError, UnsupportedAttributeError, UnsupportedDomainError,
                                UnsupportedDTypeError, UnsupportedOpsError)

    if "/" in name:
        kind, d = model_test_dirs()[name]
        model = onnx.load(str(d / "model.onnx"))
        data_sets = _model_test_data(d)
        rtol, atol = 1e-3, 1e-7
    else:
        tc = node_cases()[name]
        kind, model, data_sets, rtol, atol = "node", tc.model, tc.data_sets, tc.rtol, tc.atol
    # The suite stores narrow types (float8, int4, ...) as TensorProto: decode them like any array.
    data_sets = [([decode_value(v) for v in ins], [decode_value(v) for v in outs]) for ins, outs in data_sets]
    ops = _ops_of(model)
    start = time.perf_counter()
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _timeout_handler)
        signal.alarm(CASE_TIMEOUT_S)
    try:
        from mithril.onnx_backend import MithrilRep

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            # The path of ONNX's backend API (mithril.onnx_backend), so BackendTest's count and this
            # runner's run the same programs. C and GGML compile fixed shapes: each data set's.
            rep = MithrilRep(model, make_backend(backend_name))
            for inputs, expected in data_sets:
                for oname, exp, got in zip(rep.output_names, expected, rep.run(inputs)):
                    compare_outputs(oname, exp, got, rtol, atol)
        status, reason = "pass", ""
    except (UnsupportedOpsError, UnsupportedDomainError, UnsupportedAttributeError, UnsupportedDTypeError,
            KernelMissingError) as exc:
        status, reason = "unsupported", _one_line(exc)
    except Exception as exc:  # every failure is recorded with its reason
        status, reason = "fail", f"{type(exc).__name__}: {_one_line(exc)}"
        if os.environ.get("MITHRIL_CONFORMANCE_TRACEBACK"):
            traceback.print_exc()
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return CaseResult(name, kind, status, reason, ops, round(time.perf_counter() - start, 4))


def _one_line(exc: Exception, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_backend(name: str):
    """Backend ``name`` as this runner counts it: C and GGML strictly (``fallback=None``), a node
    without the backend's own rule failing the case instead of running on NumPy."""
    from mithril.onnx_backend import make_backend as build

    return build(name)


# -- expected failures -----------------------------------------------------------------
def expected_failures(backend: str, folder: Path = EXPECTED_DIR) -> dict[str, str]:
    """Documented expected failures: ``mithril/expected_failures/*.py`` (or ``folder``'s),
    ``BACKEND = {case: reason}``."""
    out: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.py")):
        ns: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), ns)
        out.update(ns.get(backend.upper(), {}))
    return out


# -- running many ------------------------------------------------------------------------
def _worker(args):
    name, backend = args
    return run_case(name, backend)


def _run_in_workers(ctx, jobs: int, tasks: list, worker=None):
    """Each task's result (``worker(task)``, :func:`_worker` by default) from ``jobs`` worker
    processes of the multiprocessing context ``ctx``, in completion order. A worker that dies (a
    native library aborting or crashing) does not hang the run: the cases it may have held run
    again one per fresh process, and the one that kills its process is a failure saying so."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    worker = worker or _worker
    pending = list(tasks)
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        futures = {pool.submit(worker, t): t for t in pending}
        try:
            for f in as_completed(futures):
                r = f.result()
                pending.remove(futures[f])
                yield r
        except BrokenProcessPool:
            pass
    for t in pending:  # after a crash: one process per case, so a crash names its case
        with ProcessPoolExecutor(1, mp_context=ctx) as alone:
            try:
                yield alone.submit(worker, t).result()
            except BrokenProcessPool:
                name, backend = t
                yield CaseResult(name, model_test_dirs()[name][0] if "/" in name else "node", "fail",
                                 f"the worker process died running this case on {backend} (a native crash or abort)",
                                 [], 0.0)


def case_names(pattern: str | None = None, include_models: bool = True) -> list[str]:
    """Node cases (then model tests, ``kind/dir``) whose name matches ``pattern`` (a regex)."""
    if pattern:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            from mithril.errors import InputError

            raise InputError(f"-k {pattern!r} is not a regular expression: {exc}") from None
    names = list(node_cases())
    if include_models:
        names += list(model_test_dirs())
    return [n for n in names if rx.search(n)] if pattern else names


def run_suite(backend: str, pattern: str | None = None, jobs: int = 1, include_models: bool = True,
              progress: bool = True, log_progress: bool = False) -> list[CaseResult]:
    """Every matching case on ``backend``. ``progress``: a rich bar on stderr; ``log_progress``:
    a plain line on stderr per tenth of the run (for logs)."""
    names = case_names(pattern, include_models)
    results: list[CaseResult] = []
    tasks = [(n, backend) for n in names]
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[passed]} passed"), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=False, console=Console(stderr=True)) as bar:
        task = bar.add_task(f"{backend} conformance", total=len(tasks), passed=0)
        passed = 0
        every = max(len(tasks) // 10, 1)

        def log_line():
            # Without a terminal (CI logs) progress is a line per tenth of the run.
            done = len(results)
            if not progress and log_progress and (done % every == 0 or done == len(tasks)):
                print(f"{backend} conformance: {done}/{len(tasks)} cases, {passed} passed", file=sys.stderr, flush=True)
        if jobs > 1:
            import multiprocessing as mp

            # ggml answers a failed assertion by running gdb for a backtrace before it aborts
            # (minutes); a case that aborts is reported as a dead worker instead.
            os.environ.setdefault("GGML_NO_BACKTRACE", "1")

            # Workers start from a clean forkserver: a child forked from this process (XLA's, torch's,
            # MLX's, ggml's or OpenMP's threads running, as in a test session) can deadlock on a lock
            # one of those threads held at the fork.
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["mithril.conformance"])
            for r in _run_in_workers(ctx, jobs, tasks):
                results.append(r)
                passed += r.status == "pass"
                bar.update(task, advance=1, passed=passed)
                log_line()
        else:
            for t in tasks:
                r = _worker(t)
                results.append(r)
                passed += r.status == "pass"
                bar.update(task, advance=1, passed=passed)
                log_line()
    order = {n: i for i, n in enumerate(names)}
    results.sort(key=lambda r: order[r.name])
    return results


# -- the real-model corpus ---------------------------------------------------------------------
# A folder of ONNX files and their MANIFEST.json (a checkout's is tests/data/real, made by
# scripts/make_real_corpus.py); always named by the caller, since an installed package has none.
def real_manifest(root: Path) -> dict[str, dict]:
    """file -> MANIFEST entry of the real-converter corpus in ``root``."""
    path = root / "MANIFEST.json"
    if not path.exists():
        return {}
    return {e["file"]: e for e in json.loads(path.read_text())["files"]}


def real_inputs(entry: dict) -> dict[str, np.ndarray]:
    """Deterministic inputs from a MANIFEST entry's spec, seeded by the file name."""
    import zlib

    rng = np.random.default_rng(zlib.crc32(entry["file"].encode()))
    out = {}
    for name, spec in entry["inputs"].items():
        dtype, shape = np.dtype(spec["dtype"]), tuple(spec["shape"])
        if "value" in spec:
            arr = np.full(shape, spec["value"], dtype)
        elif "low" in spec:
            arr = rng.uniform(spec["low"], spec["high"], shape)
            arr = np.floor(arr) if spec.get("integer") else arr
        elif dtype.kind == "f":
            arr = rng.standard_normal(shape)
        else:
            arr = rng.integers(0, 10, shape)
        out[name] = np.asarray(arr).astype(dtype)
    return out


def real_reference(path: Path, inputs: dict[str, np.ndarray]) -> tuple[list[str], list]:
    """onnxruntime's outputs, with its graph optimizations off (as ``ml.validate`` runs it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(names, inputs)


def _zipmap_rows(value):
    """A sequence of maps (skl2onnx's ZipMap output): its keys per row and its values as a matrix."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        return [sorted(row) for row in value], np.array([[row[k] for k in sorted(row)] for row in value], np.float32)
    return None, None


def real_mismatches(entry: dict, backend, root: Path) -> list[str]:
    """Run one corpus file on ``backend`` and on onnxruntime; the outputs outside ``ml.validate``'s
    per-dtype tolerance, one line each (empty when every output matches)."""
    import mithril as ml
    from mithril.validate import compare

    path = root / entry["file"]
    inputs = real_inputs(entry)
    names, ref = real_reference(path, inputs)
    pm = ml.compile(ml.load_onnx(str(path)), backend, shapes={k: v["shape"] for k, v in entry["inputs"].items()})
    got = pm.evaluate(None, {k: backend.from_numpy(v) for k, v in inputs.items()})
    failures = []
    for name, r in zip(names, ref):
        ref_keys, ref_rows = _zipmap_rows(r)
        if ref_keys is not None:
            keys, rows = _zipmap_rows(got[name])
            if keys != ref_keys:
                failures.append(f"{name}: ZipMap keys {(keys or [None])[:1]} != onnxruntime's {ref_keys[:1]}")
                continue
            rep = compare(name, backend.name, rows, ref_rows)
        else:
            rep = compare(name, backend.name, backend.to_numpy(got[name]), np.asarray(r))
        if not rep.passed:
            failures.append(f"{name}: {list(rep.shape)} {rep.dtype} max abs err {rep.max_abs_err:.3g}, "
                            f"max rel err {rep.max_rel_err:.3g} (rtol {rep.rtol:g}, atol {rep.atol:g}) {rep.note}")
    return failures


def run_real(backend_name: str, root: Path, progress: bool = False) -> dict[str, dict]:
    """Every corpus file on one backend: file -> {status, reason}. ``progress``: a line per file
    on stderr."""
    from mithril.errors import UnsupportedDTypeError, UnsupportedOpsError

    results = {}
    manifest = real_manifest(root)
    for i, (file, entry) in enumerate(manifest.items(), 1):
        if progress:
            print(f"{backend_name} real models: {i}/{len(manifest)} {file}", file=sys.stderr, flush=True)
        try:
            backend = make_backend(backend_name)
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                failures = real_mismatches(entry, backend, root)
            status, reason = ("pass", "") if not failures else ("fail", "; ".join(failures))
        except (UnsupportedOpsError, UnsupportedDTypeError) as exc:
            status, reason = "unsupported", _one_line(exc)
        except Exception as exc:  # every failure is recorded with its reason
            status, reason = "fail", f"{type(exc).__name__}: {_one_line(exc)}"
        results[file] = {"status": status, "reason": _one_line(Exception(reason)) if reason else ""}
    return results


# -- BackendTest, counted the scoreboard's way ------------------------------------------------
# The ONNX Backend Scoreboard (onnx.ai/backend-scoreboard, github.com/onnx/backend-scoreboard) runs
# onnx.backend.test.BackendTest through a runtime's onnx.backend module under pytest with
# -k 'not _cuda' and no exclusion; its score is passed / (passed + failed + skipped) over every CPU
# test: the node cases, the model tests of onnx/backend/test/data and nine model-zoo networks
# ("real"; onnx ships them light, with generated inputs and the reference evaluator's outputs).
# --scoreboard runs the same tests through mithril.onnx_backend, one per worker task (a native abort
# fails its test, not the run); --write-docs records each outcome under the running onnx's version.

# What the published scoreboard ran and scored (results/*/stable/{pip-list,trend}.json on its
# benchmark-results branch, the run of 2026-07-02): all on onnx 1.22.0, 1,914 CPU tests.
SCOREBOARD_ONNX = "1.22.0"
PUBLISHED_ON = "2026-07-02"
PUBLISHED = (("ONNX Reference", 1882, 1914), ("emx-onnx-cgen 1.3.5", 1873, 1914), ("onnxruntime 1.27.0", 1571, 1914))

# BackendTest's test-case classes and the name of their suite here (a result's "kind").
BACKEND_TEST_KINDS = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
                      "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
                      "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator",
                      "OnnxBackendRealModelTest": "real"}

# The scoreboard sets no time limit; one guards against a hang, long enough for JAX to compile the
# model-zoo networks on a busy machine (minutes each), where CASE_TIMEOUT_S would fail them.
BACKEND_TEST_TIMEOUT_S = 900

_BACKEND_TESTS: dict[str, dict[str, type[unittest.TestCase]]] = {}  # backend -> its test cases, once per process


def backend_test_cases(backend: str) -> dict[str, type[unittest.TestCase]]:
    """``BackendTest(mithril.onnx_backend.backend(backend)).test_cases``, built once per process
    (onnx 1.23 generates its ~1,900 node cases in Python when they are loaded: seconds)."""
    if backend not in _BACKEND_TESTS:
        import onnx.backend.test

        from mithril.onnx_backend import backend as onnx_backend

        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            _BACKEND_TESTS[backend] = onnx.backend.test.BackendTest(onnx_backend(backend), __name__).test_cases
    return _BACKEND_TESTS[backend]


def backend_test_names(backend: str, pattern: str | None = None) -> list[str]:
    """``Class::test_x_cpu`` for every CPU test (the scoreboard's ``-k 'not _cuda'``), matching
    ``pattern`` (a regex searched in that name) when given."""
    rx = re.compile(pattern) if pattern else None
    names = [f"{cls}::{name}" for cls, case in backend_test_cases(backend).items()
             for name in sorted(vars(case)) if name.startswith("test_") and name.endswith("_cpu")]
    return [n for n in names if rx is None or rx.search(n)]


def runner_case(test: str) -> str | None:
    """This runner's case for BackendTest's ``test`` (``Class::test_x_cpu`` -> ``test_x`` or
    ``simple/test_x``); None for the model-zoo networks, which this runner leaves out."""
    cls, _, name = test.partition("::")
    kind = BACKEND_TEST_KINDS.get(cls)
    if kind in (None, "real"):
        return None
    case = name.removesuffix("_cpu")
    return case if kind == "node" else f"{kind}/{case}"


def _backend_test_timeout(signum, frame):
    raise TimeoutError(f"test exceeded {BACKEND_TEST_TIMEOUT_S} s")


class _Outcome(unittest.TestResult):
    status, reason = "fail", "the test reported nothing"

    def addSuccess(self, test):
        self.status, self.reason = "pass", ""

    def addSkip(self, test, reason):
        self.status, self.reason = "skip", reason

    def addError(self, test, err):
        self.status, self.reason = "fail", f"{err[0].__name__}: {_one_line(err[1])}"

    addFailure = addError


def run_backend_test(task: tuple[str, str]) -> CaseResult:
    """One BackendTest test (``Class::test_x_cpu``) on a backend: pass, fail (with the error) or skip."""
    name, backend = task
    cls, _, method = name.partition("::")
    start = time.perf_counter()
    outcome = _Outcome()
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _backend_test_timeout)
        signal.alarm(BACKEND_TEST_TIMEOUT_S)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            backend_test_cases(backend)[cls](method).run(outcome)
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return CaseResult(name, BACKEND_TEST_KINDS.get(cls, cls), outcome.status, outcome.reason, [],
                      round(time.perf_counter() - start, 4))


def run_scoreboard(backend: str, pattern: str | None = None, jobs: int = 1, progress: bool = False) -> list[CaseResult]:
    """Every CPU test of BackendTest on ``backend`` (those matching ``pattern``), in name order.
    ``progress``: a line on stderr per tenth of the run."""
    tasks = [(n, backend) for n in backend_test_names(backend, pattern)]
    if jobs > 1:
        import multiprocessing as mp

        os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # as run_suite: an abort is a dead worker, not gdb
        ctx = mp.get_context("forkserver")  # as run_suite: no framework threads forked
        ctx.set_forkserver_preload(["mithril.conformance"])
        outcomes = _run_in_workers(ctx, jobs, tasks, worker=run_backend_test)
    else:
        outcomes = map(run_backend_test, tasks)
    results, every = [], max(len(tasks) // 10, 1)
    for r in outcomes:
        r.kind = BACKEND_TEST_KINDS.get(r.name.partition("::")[0], r.kind)  # a dead worker's result names none
        results.append(r)
        if progress and (len(results) % every == 0 or len(results) == len(tasks)):
            passed = sum(x.status == "pass" for x in results)
            print(f"{backend} BackendTest: {len(results)}/{len(tasks)} tests, {passed} passed", file=sys.stderr,
                  flush=True)
    return sorted(results, key=lambda r: r.name)


def _scoreboard_entry(results: list[CaseResult]) -> dict:
    """What reports/conformance.json keeps of a run: each test's status, and the reason when not passed."""
    return {"tests": {r.name: {"status": r.status, "reason": r.reason} if r.status != "pass" else {"status": "pass"}
                      for r in results}}


# -- reports -------------------------------------------------------------------------------
def load_record() -> dict:
    path = REPORTS / "conformance.json"
    if path.exists():
        return json.loads(path.read_text())
    return {"onnx_version": onnx.__version__, "backends": {}}


def _cases_record(results: list[CaseResult]) -> dict[str, dict]:
    return {r.name: {"status": r.status, "reason": r.reason, "kind": r.kind, "ops": r.ops} for r in results}


def save_record(record: dict, backend: str, results: list[CaseResult] | None,
                real: dict[str, dict] | None = None, replace: bool = True, corpus: Path | None = None) -> None:
    """Write ``record`` with ``backend``'s results into reports/conformance.json and
    docs/conformance.md: ``replace`` the backend's cases (a full run), or update only those in
    ``results`` (a filtered run); the real-models table lists the files of ``corpus``'s manifest."""
    record["onnx_version"] = onnx.__version__
    if results is not None:
        cases = {} if replace else dict(record["backends"].get(backend, {}).get("cases", {}))
        cases.update(_cases_record(results))
        record["backends"][backend] = {"cases": cases}
    if real is not None:
        record.setdefault("real", {})[backend] = real
    write_record(record, corpus)


def write_record(record: dict, corpus: Path | None = None) -> None:
    """``record`` into reports/conformance.json and, rendered, docs/conformance.md."""
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "conformance.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    (DOCS / "conformance.md").write_text(render_markdown(record, corpus))


def summarize(cases: dict) -> dict[str, Counter]:
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for c in cases.values():
        by_kind[c["kind"]][c["status"]] += 1
    return by_kind


def render_markdown(record: dict, corpus: Path | None = None) -> str:
    backends = sorted(record["backends"])
    kinds = ["node", *MODEL_TEST_DIRS]
    out = [
        "# Conformance",
        "",
        f"Generated by `python scripts/conformance.py --write-docs` with onnx {record['onnx_version']}: every case of the ONNX "
        "backend node suite (`onnx.backend.test.case.node.collect_testcases`) and the model tests in "
        "`onnx/backend/test/data`, compared with the expected outputs at each case's own rtol/atol. "
        "Do not edit by hand.",
        "",
        "## Totals",
        "",
        "| suite | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    sums = {b: summarize(record["backends"][b]["cases"]) for b in backends}
    for kind in kinds:
        cells = []
        for b in backends:
            c = sums[b].get(kind, Counter())
            total = sum(c.values())
            cells.append(f"{c['pass']} / {total}" + (f" ({c['unsupported']} unsupported)" if c["unsupported"] else ""))
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    # per-op table over node cases
    out += ["", "## Node cases per op", "", "Passed / cases that use the op.", "",
            "| op | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    per_op: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for b in backends:
        for c in record["backends"][b]["cases"].values():
            if c["kind"] != "node":
                continue
            for op in c["ops"]:
                per_op[op][b][c["status"] == "pass"] += 1
    for op in sorted(per_op):
        cells = []
        for b in backends:
            c = per_op[op][b]
            cells.append(f"{c[True]} / {c[True] + c[False]}")
        out.append(f"| {op} | " + " | ".join(cells) + " |")
    out += render_real(record, corpus)
    out += render_scoreboard(record)
    for b in backends:
        fails = {n: c for n, c in record["backends"][b]["cases"].items() if c["status"] != "pass"}
        documented = expected_failures(b)
        out += ["", f"## Failures: {b} ({len(fails)})", "", "| case | status | reason |", "|---|---|---|"]
        for n, c in sorted(fails.items()):
            reason = documented.get(n) or c["reason"]
            reason = reason.replace("|", "\\|").replace("\n", " ")
            out.append(f"| {n} | {c['status']} | {reason} |")
    return "\n".join(out) + "\n"


def render_real(record: dict, corpus: Path | None) -> list[str]:
    """The real-models table: one row per file of ``corpus``'s manifest, one column per backend."""
    real = record.get("real") or {}
    manifest = real_manifest(corpus) if corpus is not None else {}
    if not real or not manifest:
        return []
    backends = sorted(real)
    out = ["", "## Real models", "",
           "Files made by real converters (tf2onnx, paddle2onnx, skl2onnx, onnxscript, onnxruntime's quantizers, "
           "onnxconverter-common's float16) and ONNX files shipped in PyPI wheels: `tests/data/real/`, made by "
           "`scripts/make_real_corpus.py`. Each runs on the MANIFEST's inputs and "
           "is compared with onnxruntime at `ml.validate`'s per-dtype tolerances (`--real`).", "",
           "| file | made by | what | " + " | ".join(backends) + " |", "|---|---|---|" + "---|" * len(backends)]
    notes = []
    for file, entry in manifest.items():
        cells = []
        for b in backends:
            r = real[b].get(file)
            if r is None:
                cells.append("not run")
            elif r["status"] == "pass":
                cells.append("pass")
            else:
                notes.append(f"- {file} on {b}: {r['status']}: {r['reason']}".replace("|", "\\|"))
                cells.append(r["status"])
        tool = entry["producer"]["tool"]
        version = entry["producer"].get("version", "")
        what = entry.get("source", "").replace("|", "\\|")
        out.append(f"| {file} | {tool} {version} | {what} | " + " | ".join(cells) + " |")
    passed = {b: sum(r["status"] == "pass" for r in real[b].values()) for b in backends}
    out += ["", "Passed: " + ", ".join(f"{b} {passed[b]} / {len(manifest)}" for b in backends) + "."]
    if notes:
        out += ["", "Why the others do not pass:", "", *notes]
    return out


def render_scoreboard(record: dict) -> list[str]:
    """The scoreboard section: each way's count per backend and onnx version, and the tests whose
    outcome differs between the two ways."""
    runs = record.get("scoreboard") or {}
    if not runs:
        return []
    installed = record.get("onnx_version")
    kinds = list(BACKEND_TEST_KINDS.values())
    out = ["", "## The scoreboard's way", "",
           "Two counts of the suites. **Mithril's runner** (the totals above, `--write-docs`) runs every node case "
           "of `collect_testcases()` and the model tests of `onnx/backend/test/data`, compares them with "
           "`mithril.conformance.compare_outputs` and counts each case once. **The scoreboard's way** "
           "(`python scripts/conformance.py --scoreboard --backend numpy --write-docs`) runs "
           "`onnx.backend.test.BackendTest` through `mithril.onnx_backend.backend(name)` as "
           "[onnx.ai/backend-scoreboard](https://onnx.ai/backend-scoreboard/) runs a runtime (`pytest "
           "test_backend.py -k 'not _cuda'`): every CPU test, no exclusion, onnx's own `assert_similar_outputs`, "
           "and nine model-zoo networks (`real`: onnx ships them light, run on generated inputs against the "
           "reference evaluator's outputs), which Mithril's runner leaves out. Score: passed / (passed + failed + "
           f"skipped). Both ways run the same programs (`mithril.onnx_backend.MithrilRep`); C and GGML strictly. "
           f"A test running past {BACKEND_TEST_TIMEOUT_S // 60} minutes counts as failed (the scoreboard sets no "
           f"limit; Mithril's runner fails a case at {CASE_TIMEOUT_S} s).",
           "",
           f"The published scoreboard ({PUBLISHED_ON}, onnx {SCOREBOARD_ONNX}): "
           + "; ".join(f"{who} {p:,} / {t:,}" for who, p, t in PUBLISHED) + ". "
           f"A row for onnx {SCOREBOARD_ONNX} comes from the same command run with that onnx first on the path: "
           f"`pip install --no-deps --target /tmp/onnx-{SCOREBOARD_ONNX} onnx=={SCOREBOARD_ONNX}`, then "
           f"`PYTHONPATH=/tmp/onnx-{SCOREBOARD_ONNX} python scripts/conformance.py --scoreboard ...`.",
           "",
           "| backend | onnx | Mithril's runner | scoreboard's way | " + " | ".join(kinds) + " |",
           "|---|---|---|---|" + "---|" * len(kinds)]
    for b in sorted({b for per in runs.values() for b in per}):
        for version in sorted(runs, key=_version_key, reverse=True):
            entry = runs[version].get(b)
            if entry is None:
                continue
            tests = entry["tests"]
            cells = []
            for kind in kinds:
                of_kind = [t for n, t in tests.items() if BACKEND_TEST_KINDS.get(n.partition("::")[0]) == kind]
                cells.append(f"{sum(t['status'] == 'pass' for t in of_kind)} / {len(of_kind)}")
            passed = sum(t["status"] == "pass" for t in tests.values())
            runner = "not run on this onnx"
            cases = record.get("backends", {}).get(b, {}).get("cases")
            if version == installed and cases:
                runner = f"{sum(c['status'] == 'pass' for c in cases.values())} / {len(cases)}"
            out.append(f"| {b} | {version} | {runner} | {passed} / {len(tests)} | " + " | ".join(cells) + " |")
    differ = []
    for b, entry in sorted((runs.get(installed) or {}).items()):
        cases = record.get("backends", {}).get(b, {}).get("cases") or {}
        for name, t in sorted(entry["tests"].items()):
            case = cases.get(runner_case(name) or "")
            if case is None or (case["status"] == "pass") == (t["status"] == "pass"):
                continue
            why = (f"passes BackendTest; Mithril's runner: {case['status']}: {case['reason']}" if t["status"] == "pass"
                   else f"passes Mithril's runner; BackendTest: {t['status']}: {t['reason']}")
            differ.append(f"- {b} {name}: {why}".replace("|", "\\|"))
    if differ:
        out += ["", f"Tests whose outcome differs between the two ways (onnx {installed}):", "", *differ]
    return out


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", version))


def _check_backends(spec: str, start: bool) -> list[str]:
    """The backends named in ``--backend``, each known and installed (and, with ``start``, able to
    start in this process); the first that is not raises before any case runs."""
    from mithril.errors import BackendUnavailableError, MithrilError

    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BackendUnavailableError(f"--backend names no backend; choose from {', '.join(BACKENDS)}")
    for name in names:
        entry = BACKENDS.get(name)
        if entry is None:
            raise BackendUnavailableError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
        if not entry.installed():
            raise BackendUnavailableError(f"backend {name!r} is not available: its framework "
                                          f"({entry.array_modules[0]}) is not installed")
        if not start:
            continue
        try:
            make_backend(name)
        except MithrilError as exc:
            raise BackendUnavailableError(f"backend {name!r} cannot start: {exc}") from exc
    return names


def _expected_failure_folder(value: str | None) -> Path | None:
    """``--expected-failures``: a folder of lists, ``none`` for no list, or Mithril's own."""
    from mithril.errors import InputError

    if value is None:
        return EXPECTED_DIR if EXPECTED_DIR.is_dir() else None
    if value.lower() == "none":
        return None
    folder = Path(value)
    if not folder.is_dir():
        raise InputError(f"--expected-failures {value}: no such folder (a folder of .py files, each "
                         "setting NUMPY = {{case: reason}} and the like, or 'none')")
    return folder


def _corpus_folder(value: str | None, needed: bool) -> Path | None:
    """``--corpus``: a folder holding MANIFEST.json, or None when not given and not ``needed``."""
    from mithril.errors import InputError

    if value is None:
        if needed:
            raise InputError("--real runs the real-model corpus: give its folder with --corpus DIR "
                             "(a checkout's tests/data/real; python scripts/conformance.py passes it)")
        return None
    folder = Path(value)
    if not (folder / "MANIFEST.json").is_file():
        raise InputError(f"--corpus {value}: no MANIFEST.json there (a folder made by "
                         "scripts/make_real_corpus.py)")
    return folder


def _writable_docs() -> Path:
    from mithril.errors import InputError

    if not (REPO / "pyproject.toml").exists() or not DOCS.is_dir():
        raise InputError(f"--write-docs updates the docs/ of a Mithril checkout; {REPO} is not one "
                         "(this is an installed package): use --output FILE")
    return DOCS


def check_results(results: list[CaseResult], expected: dict[str, str]) -> tuple[list[CaseResult], list[str]]:
    """The cases that failed (or were unsupported) without an expected-failure entry, and the
    entries whose case now passes."""
    unexpected = [r for r in results if r.status != "pass" and r.name not in expected]
    now_pass = [r.name for r in results if r.status == "pass" and r.name in expected]
    return unexpected, now_pass


def main(argv: list[str] | None = None) -> int:
    """``mithril conformance``: exit 0 when every case passes or is an expected failure, 1 when
    any other case fails, 2 for a usage error (an unknown backend, a filter matching nothing)."""
    p = argparse.ArgumentParser(
        prog="mithril conformance", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 every case passed or is an expected failure, 1 a case failed that is not in\n"
               "the expected-failure lists (--real: a corpus file failed), 2 a usage error (unknown\n"
               "backend, a filter matching no case), 3 an internal error, 130 interrupted.\n\n"
               "Nothing is written unless asked: --output FILE (this run's results as JSON) or\n"
               "--write-docs (merge into reports/conformance.json and docs/conformance.md of the checkout).")
    p.add_argument("--backend", default="numpy",
                   help=f"{', '.join(BACKENDS)} (comma-separated for several; default: numpy)")
    p.add_argument("-k", "--cases", "--filter", dest="filter", default=None, metavar="REGEX",
                   help="only the cases whose name matches this regular expression")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case's result")
    p.add_argument("--no-models", action="store_true", help="node cases only")
    p.add_argument("--expected-failures", default=None, metavar="DIR",
                   help="folder of expected-failure lists (default: Mithril's own, mithril/expected_failures); "
                        "'none': every failing case counts")
    p.add_argument("--output", default=None, metavar="FILE", help="write this run's per-case results as JSON")
    p.add_argument("--write-docs", action="store_true",
                   help="merge the results into reports/conformance.json and docs/conformance.md (a full run "
                        "replaces the backend's column; with -k only the cases that ran are updated)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines on stderr")
    p.add_argument("--real", action="store_true",
                   help="run only the real-model corpus (--corpus); with --write-docs, update its table")
    p.add_argument("--scoreboard", action="store_true",
                   help="count onnx.backend.test.BackendTest through mithril.onnx_backend as the ONNX Backend "
                        "Scoreboard does (every CPU test, no exclusion); with --write-docs, record it under "
                        "this onnx's version")
    p.add_argument("--corpus", default=None, metavar="DIR",
                   help="the real-model corpus: ONNX files and their MANIFEST.json (a checkout's tests/data/real, "
                        "which scripts/conformance.py passes)")
    args = p.parse_args(argv)
    from mithril.errors import InputError

    if args.jobs < 1:
        raise InputError(f"--jobs {args.jobs}: give 1 or more worker processes")
    corpus = _corpus_folder(args.corpus, needed=args.real)
    # Starting JAX, Torch or MLX here would put their thread pools into the NumPy workers that
    # run_suite forks; with workers, only NumPy starts in this process (the others in theirs).
    backends = _check_backends(args.backend, start=args.real or args.jobs == 1)
    docs = _writable_docs() if args.write_docs else None
    if args.output and not Path(args.output).resolve().parent.is_dir():
        raise InputError(f"--output {args.output}: its folder does not exist")
    if args.real:
        return _main_real(args, backends, docs, corpus)
    if args.scoreboard:
        return _main_scoreboard(args, backends, docs, corpus)
    folder = _expected_failure_folder(args.expected_failures)
    names = case_names(args.filter, not args.no_models)
    if not names:
        raise InputError(f"-k {args.filter!r} matches no case")
    if folder is None:
        print("no expected-failure lists: every failing case counts", file=sys.stderr)
    record = load_record() if docs else None
    output = {"onnx_version": onnx.__version__, "backends": {}}
    status = 0
    for backend in backends:
        tty = sys.stderr.isatty()
        results = run_suite(backend, args.filter, args.jobs, not args.no_models,
                            progress=not args.no_progress and tty, log_progress=not args.no_progress and not tty)
        expected = expected_failures(backend, folder) if folder else {}
        unexpected, now_pass = check_results(results, expected)
        counts = Counter(r.status for r in results)
        node_pass = sum(r.status == "pass" for r in results if r.kind == "node")
        node_total = sum(r.kind == "node" for r in results)
        for r in results:
            if args.verbose or r in unexpected:
                tag = "" if r.status == "pass" or r in unexpected else "  (expected)"
                print(f"{r.status.upper():12s} {r.name}  {r.reason}{tag}")
        n_expected = sum(r.status != "pass" for r in results) - len(unexpected)
        print(f"{backend}: {counts['pass']} passed, {counts['fail']} failed, {counts['unsupported']} unsupported "
              f"(node cases: {node_pass} / {node_total}); {n_expected} expected failure(s), "
              f"{len(unexpected)} unexpected")
        if now_pass:
            print(f"{backend}: {len(now_pass)} expected failure(s) now pass (remove them from {folder}): "
                  + ", ".join(now_pass))
        status = max(status, 1 if unexpected else 0)
        output["backends"][backend] = {
            "cases": _cases_record(results),
            "unexpected_failures": [r.name for r in unexpected],
            "expected_failures_now_passing": now_pass,
        }
        if docs:
            full = args.filter is None and not args.no_models
            save_record(record, backend, results, replace=full, corpus=corpus)
            print(f"wrote {docs / 'conformance.md'} and {REPORTS / 'conformance.json'} ({backend}: "
                  + ("every case" if full else f"{len(results)} case(s) updated") + ")")
    if args.output:
        _write_output(args.output, output)
    elif not docs and args.filter is None and not args.no_models:
        print("docs/conformance.md and reports/conformance.json left as they are (--write-docs updates them)",
              file=sys.stderr)
    return status


def _main_real(args, backends: list[str], docs: Path | None, corpus: Path) -> int:
    record = load_record() if docs else None
    output = {"onnx_version": onnx.__version__, "real": {}}
    status = 0
    for backend in backends:
        real = run_real(backend, corpus, progress=not args.no_progress)
        counts = Counter(r["status"] for r in real.values())
        for file, r in real.items():
            if args.verbose or r["status"] != "pass":
                print(f"{r['status'].upper():12s} {file}  {r['reason']}")
        print(f"{backend} real models: {counts['pass']} passed, {counts['fail']} failed, "
              f"{counts['unsupported']} unsupported")
        # A backend that refuses a file with a clear Unsupported* error is honest; wrong values or
        # any other error are failures.
        status = max(status, 1 if counts["fail"] else 0)
        output["real"][backend] = real
        if docs:
            save_record(record, backend, None, real, corpus=corpus)
            print(f"wrote {docs / 'conformance.md'} and {REPORTS / 'conformance.json'} ({backend} real models)")
    if args.output:
        _write_output(args.output, output)
    return status


def _main_scoreboard(args, backends: list[str], docs: Path | None, corpus: Path | None) -> int:
    """``--scoreboard``: exit 0 once it ran (the score is a count, not a gate)."""
    from mithril.errors import InputError

    if args.filter:
        try:
            re.compile(args.filter)
        except re.error as exc:
            raise InputError(f"-k {args.filter!r} is not a regular expression: {exc}") from None
    output = {"onnx_version": onnx.__version__, "scoreboard": {}}
    for backend in backends:
        results = run_scoreboard(backend, args.filter, args.jobs, progress=not args.no_progress)
        if not results:
            raise InputError(f"-k {args.filter!r} matches no BackendTest test")
        counts = Counter(r.status for r in results)
        for r in results:
            if args.verbose or r.status != "pass":
                print(f"{r.status.upper():5s} {r.name}  {r.reason}")
        print(f"{backend} (onnx {onnx.__version__}, the scoreboard's way): {counts['pass']} / {len(results)} passed, "
              f"{counts['fail']} failed, {counts['skip']} skipped")
        entry = _scoreboard_entry(results)
        output["scoreboard"][backend] = entry
        if docs:
            record = load_record()  # read now: a run takes minutes, and other runs may have written meanwhile
            runs = record.setdefault("scoreboard", {}).setdefault(onnx.__version__, {})
            if args.filter and backend in runs:  # a filtered run updates the tests it ran
                runs[backend]["tests"].update(entry["tests"])
            else:
                runs[backend] = entry
            write_record(record, corpus)
            print(f"wrote {docs / 'conformance.md'} and {REPORTS / 'conformance.json'} "
                  f"({backend}, the scoreboard's way, onnx {onnx.__version__})")
    if args.output:
        _write_output(args.output, output)
    return 0


def _write_output(path: str, data: dict) -> None:
    from mithril.errors import InputError

    try:
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise InputError(f"--output {path}: {exc.strerror or exc}") from exc
    print(f"wrote {path}")
