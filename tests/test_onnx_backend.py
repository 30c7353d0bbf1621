"""mithril.onnx_backend: ONNX's backend API, and ``onnx.backend.test.BackendTest`` run through it as
onnxruntime's backend test series runs onnxruntime.backend (``BackendTest(backend, __name__)``, its
``exclude(...)`` patterns, its test cases put in this module's globals).

Default tier: BackendTest's node cases of FAST_OPS and the model tests FAST_MODEL_TESTS on NumPy.
Long tier (MITHRIL_LONG_TESTS=1): every CPU test (and CUDA where the backend has it) on each installed
backend, in classes named ``OnnxBackend<Suite>Test_<backend>``. Excluded, each with its reason on
the skip: the cases Mithril's runner fails on that backend (mithril/expected_failures, and
reports/conformance.json's recorded reasons) and BACKEND_TEST_ONLY, which fail only BackendTest's
way. ``python scripts/conformance.py --scoreboard`` counts the same tests without exclusions.
"""

import importlib
import os
import re
import unittest
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnx.backend.test
import onnx.backend.test.loader
import onnx.backend.test.runner
import pytest
from onnx import TensorProto, helper

import mithril.onnx_backend as ob
from mithril import conformance
from mithril.backends.table import BACKENDS
from mithril.errors import (BackendOptionError, BackendUnavailableError, DTypeError, InputError, KernelMissingError,
                            MithrilError)

DOCS = Path(__file__).resolve().parent.parent / "docs"
LONG = os.environ.get("MITHRIL_LONG_TESTS") == "1"

# Cases that fail BackendTest's way only, on every backend: what onnx's runner does differently
# from Mithril's (mithril.conformance.run_case), found by `scripts/conformance.py --scoreboard`.
BACKEND_TEST_ONLY = {
    "test_loop16_seq_none": "onnx's assert_similar_outputs compares a sequence output's tensors as if each "
                            "were a list of outputs, and len() of the 0-d tensor this sequence starts with raises "
                            "TypeError (ONNX's reference evaluator fails it so on the scoreboard too)",
}


def exclusions(backend: str) -> dict[str, str]:
    """BackendTest names (without the device suffix) excluded on ``backend``, each with its reason."""
    out = dict(BACKEND_TEST_ONLY)
    recorded = conformance.load_record()["backends"].get(backend, {}).get("cases", {})
    for case, entry in recorded.items():
        if entry["status"] != "pass":
            out[case.rpartition("/")[2]] = f"Mithril's runner: {entry['status']}: {entry['reason']}"
    for case, reason in conformance.expected_failures(backend).items():
        out[case.rpartition("/")[2]] = reason  # a documented reason over a recorded error message
    return out


def build_backend_test(backend: str, suffix: str = "") -> dict[str, type]:
    """BackendTest's test-case classes for ``backend``: exclusions applied with their reasons, tests
    of a device the backend lacks left out (as the scoreboard's ``-k 'not _cuda'``), marked by backend."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # onnx computing its expected outputs (overflowing casts, log 0)
        backend_test = onnx.backend.test.BackendTest(ob.backend(backend), __name__)
    reasons = exclusions(backend)
    for name in sorted(reasons):
        backend_test.exclude(f"^{re.escape(name)}_(cpu|cuda)$")
    cases = {}
    for cls_name, cls in backend_test.test_cases.items():
        for attr in [a for a in vars(cls) if a.startswith("test_")]:
            device = attr.rpartition("_")[2].upper()
            if not ob.backend(backend).supports_device(device):
                delattr(cls, attr)
            elif attr.rpartition("_")[0] in reasons:
                # exclude() skips with its pattern as the message: the skip names the reason instead
                setattr(cls, attr, unittest.skip(reasons[attr.rpartition("_")[0]])(getattr(cls, attr)))
        cls.pytestmark = [getattr(pytest.mark, backend)]
        cases[cls_name + suffix] = cls
    return cases


@pytest.fixture(autouse=True)
def _light_models_in_tmp(tmp_path_factory, monkeypatch):
    """BackendTest's model-zoo tests write their generated inputs under $ONNX_HOME (~/.onnx)."""
    monkeypatch.setenv("ONNX_HOME", str(tmp_path_factory.getbasetemp() / "onnx_home"))


# -- the default tier: a few op families on NumPy ----------------------------------------------------
FAST_OPS = {"Abs", "Add", "Relu", "Gemm", "MatMul", "Conv", "Reshape", "Transpose", "Where", "Gather",
            "ReduceSum", "If", "Loop", "SequenceInsert"}
FAST_MODEL_TESTS = {"test_single_relu_model", "test_sequence_model1", "test_operator_add_broadcast", "test_Conv2d"}


def _fast_model_tests(data_dir=onnx.backend.test.loader.DATA_DIR, kind=None):
    """BackendTest's loader narrowed to FAST_OPS and FAST_MODEL_TESTS. onnx 1.23 builds its node
    cases in Python when they are loaded (~14 s of CPU for all); importing only the op families'
    modules builds these few."""
    if kind != "node":
        return [c for c in onnx.backend.test.loader.load_model_tests(data_dir, kind) if c.name in FAST_MODEL_TESTS]
    node_cases = importlib.import_module("onnx.backend.test.case.node")
    for op in FAST_OPS:
        importlib.import_module(f"onnx.backend.test.case.node.{'if_' if op == 'If' else op.lower()}")
    # One-node models of these ops: the same set whether or not every family was imported before.
    return [c for c in node_cases._NodeTestCases
            if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in FAST_OPS]


with mock.patch.object(onnx.backend.test.runner, "load_model_tests", _fast_model_tests):
    FAST_CASES = build_backend_test("numpy")
globals().update(FAST_CASES)

if LONG:
    for _backend, _entry in BACKENDS.items():
        if _entry.installed():
            globals().update(build_backend_test(_backend, f"_{_backend}"))


def test_the_fast_tier_runs_a_few_dozen_node_cases_and_its_model_tests():
    node = [a for a in vars(FAST_CASES["OnnxBackendNodeModelTest"]) if a.startswith("test_")]
    assert 40 <= len(node) <= 120, len(node)
    models = {a.removesuffix("_cpu") for name, cls in FAST_CASES.items() if name != "OnnxBackendNodeModelTest"
              for a in vars(cls) if a.startswith("test_")}
    assert models == FAST_MODEL_TESTS
    assert not any(a.endswith("_cuda") for cls in FAST_CASES.values() for a in vars(cls))


def test_every_exclusion_has_a_reason_and_each_backend_test_only_entry_names_a_case():
    reasons = exclusions("numpy")
    assert all(isinstance(r, str) and len(r) > 15 for r in reasons.values())
    recorded = {n.rpartition("/")[2] for n in conformance.load_record()["backends"]["numpy"]["cases"]}
    assert set(BACKEND_TEST_ONLY) <= recorded
    skipped = FAST_CASES["OnnxBackendNodeModelTest"].test_loop16_seq_none_cpu
    assert skipped.__unittest_skip_why__ == BACKEND_TEST_ONLY["test_loop16_seq_none"]


# -- the API -----------------------------------------------------------------------------------------
def _two_input_model():
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["p"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_run_takes_a_list_a_dict_or_one_array_and_returns_outputs_in_graph_order():
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.full((2, 2), 3, np.float32)
    rep = ob.prepare(_two_input_model())
    s, p = rep.run([a, b])
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(p, a * b)
    by_name = rep.run({"b": b, "a": a})
    np.testing.assert_array_equal(by_name["p"], a * b)
    assert by_name._fields == ("s", "p") and rep.output_names == ["s", "p"]
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])]))
    (y,) = ob.run_model(relu, np.array([-1, 0, 2], np.float32))
    assert y.tolist() == [0, 0, 2]


def test_run_node_builds_a_one_node_model():
    node = helper.make_node("Add", ["x", "y"], ["z"])
    x = np.ones((2, 3), np.float32)
    (z,) = ob.run_node(node, [x, x], opset_version=13)
    assert z.dtype == np.float32 and z.tolist() == (2 * x).tolist()
    (z,) = ob.run_node(node, {"x": x, "y": x}, outputs_info=[(np.float32, (2, 3))])
    assert z.shape == (2, 3)
    with pytest.raises(InputError, match="takes inputs"):
        ob.run_node(node, [x])


def test_prepare_takes_the_backends_options_and_refuses_unknown_ones():
    rep = ob.prepare(_two_input_model(), num_threads=1)
    assert rep.backend.name == "numpy"
    with pytest.raises(BackendOptionError, match="bogus"):
        ob.prepare(_two_input_model(), bogus=1)


def test_devices():
    assert ob.supports_device("CPU") and ob.supports_device("CPU:0")
    assert not ob.supports_device("CUDA") and not ob.supports_device("TPU")
    assert not ob.backend("c").supports_device("CUDA")
    with pytest.raises(BackendUnavailableError, match="no device 'CUDA'"):
        ob.prepare(_two_input_model(), "CUDA")
    with pytest.raises(InputError, match="'CPU', 'CUDA'"):
        ob.prepare(_two_input_model(), "gpu0")


def test_errors_stay_mithril_errors():
    rep = ob.prepare(_two_input_model())
    x = np.ones((2, 2), np.float32)
    with pytest.raises(DTypeError):
        rep.run([x, x.astype(np.float64)])
    with pytest.raises(InputError, match="3 inputs given"):
        rep.run([x, x, x])
    with pytest.raises(InputError, match="unknown input"):
        rep.run({"a": x, "c": x})
    with pytest.raises(BackendUnavailableError, match="unknown backend"):
        ob.backend("tpu")
    with pytest.raises(MithrilError):
        ob.prepare(b"not a model")


def test_c_is_strict_unless_a_fallback_is_given():
    graph = helper.make_graph([helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    words = np.array(["ab", "c"], dtype=object)
    assert ob.backend("c").__name__ == "MithrilCBackend" and ob.backend("c") is ob.backend("c")
    strict = ob.backend("c").prepare(model)  # C compiles at the first run, for its input shapes
    with pytest.raises(KernelMissingError, match="StringNormalizer"):
        strict.run([words])
    with pytest.warns(UserWarning, match="run on NumPy"):
        (y,) = ob.backend("c").prepare(model, fallback="numpy").run([words])
    assert y.tolist() == ["AB", "C"]


def test_the_docs_example_runs():
    text = (DOCS / "onnx_backend.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    exec(compile(block, str(DOCS / "onnx_backend.md"), "exec"), {})


# -- the scoreboard's count (mithril conformance --scoreboard) -------------------------------------------
def test_scoreboard_counts_each_cpu_test_once(monkeypatch, tmp_path, capsys):
    import json

    # The fast tier's cases stand in for the whole BackendTest (built in seconds, not minutes).
    monkeypatch.setitem(conformance._BACKEND_TESTS, "numpy", FAST_CASES)
    out = tmp_path / "run.json"
    assert conformance.main(["--scoreboard", "--backend", "numpy", "-k", r"test_(abs|loop16_seq_none|single_relu_model)",
                             "-j", "1", "--no-progress", "--output", str(out)]) == 0
    tests = json.loads(out.read_text())["scoreboard"]["numpy"]["tests"]
    assert tests == {"OnnxBackendNodeModelTest::test_abs_cpu": {"status": "pass"},
                     "OnnxBackendNodeModelTest::test_loop16_seq_none_cpu": {
                         "status": "skip", "reason": BACKEND_TEST_ONLY["test_loop16_seq_none"]},
                     "OnnxBackendSimpleModelTest::test_single_relu_model_cpu": {"status": "pass"}}
    assert "numpy (onnx " in capsys.readouterr().out
    assert conformance.runner_case("OnnxBackendSimpleModelTest::test_single_relu_model_cpu") == "simple/test_single_relu_model"
    assert conformance.runner_case("OnnxBackendRealModelTest::test_squeezenet_cpu") is None


def test_the_scoreboard_section_sets_both_counts_beside_the_published_ones():
    record = {"onnx_version": "1.23.2",
              "backends": {"numpy": {"cases": {"test_a": {"status": "pass", "reason": ""},
                                               "simple/test_b": {"status": "fail", "reason": "x"}}}},
              "scoreboard": {"1.23.2": {"numpy": {"tests": {
                  "OnnxBackendNodeModelTest::test_a_cpu": {"status": "fail", "reason": "TypeError: y"},
                  "OnnxBackendSimpleModelTest::test_b_cpu": {"status": "fail", "reason": "z"},
                  "OnnxBackendRealModelTest::test_c_cpu": {"status": "pass"}}}},
                  "1.22.0": {"numpy": {"tests": {"OnnxBackendNodeModelTest::test_a_cpu": {"status": "pass"}}}}}}
    text = "\n".join(conformance.render_scoreboard(record))
    assert "| numpy | 1.23.2 | 1 / 2 | 1 / 3 | 0 / 1 | 0 / 1 | 0 / 0 | 0 / 0 | 1 / 1 |" in text
    assert "| numpy | 1.22.0 | not run on this onnx | 1 / 1 |" in text
    assert "ONNX Reference 1,882 / 1,914" in text and "onnx==1.22.0" in text
    assert "- numpy OnnxBackendNodeModelTest::test_a_cpu: passes Mithril's runner; BackendTest: fail: TypeError: y" in text
    assert "test_b_cpu:" not in text  # fails both ways
