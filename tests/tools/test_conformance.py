"""The ONNX backend test suite: no case recorded as passing may regress.

NumPy re-runs every case; JAX, Torch and MLX re-run a fixed sample. The record is
reports/conformance.json, written by `python scripts/conformance.py --backend numpy,jax,torch,mlx,c,ggml --write-docs`
(no test writes it).
"""

import os

import pytest

from mithril import conformance


@pytest.fixture(scope="module")
def numpy_results():
    return {r.name: r for r in conformance.run_suite("numpy", jobs=os.cpu_count() or 1, progress=False)}


def test_no_recorded_pass_regresses(numpy_results):
    record = conformance.load_record()["backends"]["numpy"]["cases"]
    recorded_pass = {n for n, c in record.items() if c["status"] == "pass"}
    regressed = {n: numpy_results[n].reason for n in recorded_pass if n in numpy_results
                 and numpy_results[n].status != "pass"}
    assert not regressed, f"{len(regressed)} case(s) passed before and fail now: {regressed}"
    now_pass = sum(r.status == "pass" for r in numpy_results.values())
    assert now_pass >= len(recorded_pass)


def test_node_pass_count_meets_target(numpy_results):
    node_pass = sum(r.status == "pass" for r in numpy_results.values() if r.kind == "node")
    assert node_pass >= 1780, f"NumPy passes {node_pass} of the node cases; the target is 1,780"


def test_every_failure_has_a_reason(numpy_results):
    documented = conformance.expected_failures("numpy")
    silent = [n for n, r in numpy_results.items() if r.status != "pass" and not (r.reason or documented.get(n))]
    assert not silent


def test_expected_failure_entries_are_not_stale(numpy_results):
    documented = conformance.expected_failures("numpy")
    stale = [n for n in documented if n in numpy_results and numpy_results[n].status == "pass"]
    assert not stale, f"expected-failure entries that now pass (remove them): {stale}"
    unknown = [n for n in documented if n not in numpy_results]
    assert not unknown, f"expected-failure entries naming no case: {unknown}"


# The other backends: the recorded counts must meet the targets, and a deterministic sample
# (every 7th node case; C every 14th) is re-run so a regression in shared kernels or a backend shows up in CI
# without re-running all 2,024 cases three more times.
# c and ggml: strict (fallback=None). ggml: the count reached (issue #19 asks 700), minus a margin.
TARGETS = {"numpy": 1780, "jax": 1650, "torch": 1650, "mlx": 1450, "c": 1690, "ggml": 975}
# The fast tier re-runs every 14th recorded case (C: only its own samples, below); the long tier
# (MITHRIL_LONG_TESTS=1) every 7th, and every 14th on C, which compiles a library per case.
_TIER = 1 if os.environ.get("MITHRIL_LONG_TESTS") == "1" else 2
SAMPLE_STRIDE = 7 * _TIER
SAMPLE_STRIDES = {"c": 14 * _TIER}


def _installed(backend: str) -> bool:
    # Only look: creating the backend here would start its framework in this process.
    import importlib.util
    import shutil

    import mithril as ml

    if backend == "c":  # counted strictly (fallback=None): it needs a C compiler, nothing else
        return shutil.which(os.environ.get("CC", "cc").split()[0]) is not None
    if backend == "ggml":  # counted strictly too; needs ggml-python
        return importlib.util.find_spec("ggml") is not None
    cls = {"jax": "JaxBackend", "torch": "TorchBackend", "mlx": "MlxBackend"}[backend]
    return getattr(ml, cls, None) is not None and importlib.util.find_spec(backend) is not None


@pytest.mark.parametrize("backend", sorted(TARGETS))
def test_recorded_count_meets_target(backend):
    record = conformance.load_record()["backends"]
    assert backend in record, (f"reports/conformance.json has no {backend} column: "
                               f"run scripts/conformance.py --backend {backend} --write-docs")
    cases = record[backend]["cases"]
    node_pass = sum(c["status"] == "pass" and c["kind"] == "node" for c in cases.values())
    assert node_pass >= TARGETS[backend], f"{backend}: {node_pass} node cases recorded as passing"
    assert all(c["reason"] or conformance.expected_failures(backend).get(n)
               for n, c in cases.items() if c["status"] != "pass")


@pytest.mark.parametrize("backend", ["jax", "torch", "mlx", pytest.param("c", marks=pytest.mark.long(
    reason="C compiles a library per case (~1 s on 2 cores); the fast tier runs C's own node-suite samples in "
           "tests/backends/c/test_{elementwise,movement,nn}.py and tests/backends/c/test_cli.py")), "ggml"])
def test_sampled_recorded_passes_still_pass(backend):
    if not _installed(backend):
        pytest.skip(f"{backend} is not installed here")
    cases = conformance.load_record()["backends"][backend]["cases"]
    node_names = sorted(n for n, c in cases.items() if c["kind"] == "node")
    sample = node_names[::SAMPLE_STRIDES.get(backend, SAMPLE_STRIDE)]
    pattern = "^(" + "|".join(sample) + ")$"
    results = conformance.run_suite(backend, pattern, jobs=os.cpu_count() or 1, include_models=False, progress=False)
    regressed = {r.name: r.reason for r in results if cases[r.name]["status"] == "pass" and r.status != "pass"}
    assert len(results) == len(sample)
    assert not regressed, f"{backend}: {len(regressed)} sampled case(s) passed before and fail now: {regressed}"


def _abort_on_crash_case(args):
    name, backend = args
    if name == "crash":
        os.abort()  # what a native library's failed assertion does
    return conformance.CaseResult(name, "node", "pass", "", [], 0.0)


def test_a_worker_that_dies_fails_its_case_and_the_run_goes_on():
    """A case that kills its worker process (ggml's GGML_ASSERT aborts) is a failure naming the
    case; the parallel run neither hangs nor loses the other cases."""
    import multiprocessing as mp

    tasks = [(f"ok{i}", "numpy") for i in range(6)] + [("crash", "numpy")] + [(f"ok{i}", "numpy") for i in range(6, 9)]
    ctx = mp.get_context("forkserver")  # as run_suite's workers
    results = {r.name: r for r in conformance._run_in_workers(ctx, 2, tasks, worker=_abort_on_crash_case)}
    assert sorted(results) == sorted(n for n, _ in tasks)
    assert results["crash"].status == "fail" and "worker process died" in results["crash"].reason
    assert all(r.status == "pass" for n, r in results.items() if n != "crash")


def test_the_package_reads_nothing_under_tests():
    """An installed Mithril has no tests/ beside it: the expected-failure lists are package files,
    and no module builds a path into tests/ (the real corpus is the caller's --corpus)."""
    import ast
    from pathlib import Path

    package = Path(conformance.__file__).resolve().parent
    assert conformance.EXPECTED_DIR.parent == package and (package / "expected_failures" / "torch.py").is_file()
    reads = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # "tests" as a path part: REPO / "tests", Path("tests/..."), os.path.join(..., "tests")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                parts = [node.left, node.right]
            elif isinstance(node, ast.Call):
                parts = node.args
            else:
                continue
            for part in parts:
                if isinstance(part, ast.Constant) and isinstance(part.value, str) and (
                        part.value == "tests" or part.value.startswith("tests/")):
                    reads.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    assert not reads, reads
