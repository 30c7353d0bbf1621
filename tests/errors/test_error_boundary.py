"""One error boundary: everything the public API raises is a MithrilError.

Each entry point is driven into a failure that starts in a library underneath (protobuf, the OS,
onnx_ir, NumPy, an optimizer's own bookkeeping); the test asserts the MithrilError subclass, the
message and that the library's exception is kept as ``__cause__``. The CLI prints one line and
exits non-zero, never a traceback unless asked with --debug.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import errors
from mithril.cli import main as cli_main

from tests.conftest import make_model

ROOT = Path(__file__).resolve().parents[2]


def relu_model():
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                      [("x", TensorProto.FLOAT, ["N", 3])], [("y", TensorProto.FLOAT, ["N", 3])])


def test_public_api_wrapper_keeps_mithril_errors_and_wraps_the_rest():
    @errors.public_api(errors.CompileError, "the step")
    def step(exc):
        raise exc

    own = errors.ShapeError("mine", node="n")
    with pytest.raises(errors.ShapeError) as info:
        step(own)
    assert info.value is own
    with pytest.raises(errors.CompileError, match=r"the step failed: ZeroDivisionError: boom") as info:
        step(ZeroDivisionError("boom"))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(KeyboardInterrupt):
        step(KeyboardInterrupt())


def test_load_onnx(tmp_path):
    with pytest.raises(errors.OnnxLoadError, match="cannot load an ONNX model from int"):
        ml.load_onnx(123)
    with pytest.raises(errors.OnnxLoadError, match="no such file"):
        ml.load_onnx(tmp_path / "missing.onnx")
    with pytest.raises(errors.OnnxLoadError):
        ml.load_onnx(tmp_path)  # a folder, not a file
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07\x12\xff\xff")
    with pytest.raises(errors.OnnxLoadError, match="not a valid ONNX protobuf"):
        ml.load_onnx(tmp_path / "bad.onnx")


def test_compile_names_the_pass_that_failed(monkeypatch):
    from mithril.backends.specialize import InferShapes

    def broken(self, model):
        raise ValueError("inference blew up")

    monkeypatch.setattr(InferShapes, "call", broken)
    with pytest.raises(errors.PassError, match=r"pass InferShapes failed on this model: ValueError: inference blew up") as info:
        ml.compile(relu_model(), ml.NumpyBackend())
    assert isinstance(info.value, errors.CompileError)
    assert isinstance(info.value.__cause__, ValueError)


def test_compile_wraps_a_failure_outside_the_passes(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(ml.NumpyBackend, "lower", broken)
    with pytest.raises(errors.CompileError, match="compile failed: RuntimeError: lowering exploded") as info:
        ml.compile(relu_model(), ml.NumpyBackend())
    assert isinstance(info.value.__cause__, RuntimeError)


def test_evaluate_wraps_failures_in_and_outside_kernels(monkeypatch):
    pm = ml.compile(relu_model(), ml.NumpyBackend())
    # Inside a kernel: named by node, op, opset, shapes and dtypes.
    from mithril.backends.kernels import elementwise

    namespace = pm.program.namespace
    name = next(k for k, v in namespace.items() if getattr(v, "__name__", "") == "relu")

    def failing_relu(x, **kwargs):
        raise FloatingPointError("overflow in the kernel")

    monkeypatch.setitem(namespace, name, failing_relu)
    with pytest.raises(errors.KernelError, match=r"node 'relu', op Relu, opset 17: .*FloatingPointError") as info:
        pm.evaluate(None, {"x": np.ones((2, 3), np.float32)})
    assert info.value.shapes == [[2, 3]] and info.value.dtypes == ["float32"]
    assert isinstance(info.value.__cause__, FloatingPointError)
    monkeypatch.setitem(namespace, name, elementwise.relu)
    # Outside the kernels: the backend's conversion of an input.
    monkeypatch.setattr(pm.backend, "prepare_inputs", lambda values: 1 / 0)
    with pytest.raises(errors.EvaluationError, match="evaluate failed: ZeroDivisionError") as info:
        pm.evaluate(None, {"x": np.ones((2, 3), np.float32)})
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_a_backend_name_instead_of_a_backend_is_refused_clearly():
    with pytest.raises(errors.CompileError, match=r"a backend instance such as ml.NumpyBackend\(\), not 'numpy'"):
        ml.compile(relu_model(), "numpy")
    with pytest.raises(errors.CompileError, match="not 'numpy'"):
        ml.validate(relu_model(), "numpy", shapes={"x": [2, 3]})


def test_validate_wraps_a_failure_underneath(monkeypatch):
    validate_module = sys.modules["mithril.validate"]

    monkeypatch.setattr(validate_module, "random_inputs", lambda *a: {}.pop("x"))
    with pytest.raises(errors.ValidationError, match="validate failed: KeyError") as info:
        ml.validate(relu_model(), ml.NumpyBackend(), shapes={"x": [2, 3]})
    assert isinstance(info.value.__cause__, KeyError)


def test_export_onnx_to_a_missing_folder(tmp_path):
    from mithril.models import Model, Relu

    m = Model()
    m |= Relu()(input="input", output="output")
    with pytest.raises(errors.ExportError, match="export_onnx failed: FileNotFoundError") as info:
        ml.export_onnx(m, tmp_path / "no" / "such" / "dir" / "m.onnx", shapes={"input": [2, 3]})
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_params_io(tmp_path):
    with pytest.raises(errors.ParamsFileError, match="load_params failed: FileNotFoundError") as info:
        ml.load_params(tmp_path / "missing.npz")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(errors.ParamsFileError):
        ml.load_params(tmp_path / "bad.npz")
    with pytest.raises(errors.ParamsFileError, match="safetensors or .npz"):
        ml.save_params({"w": np.ones(2)}, tmp_path / "w.bin")


def test_frontend_errors_are_model_errors():
    from mithril.models import Dropout, Model, Relu

    with pytest.raises(errors.ModelError, match="Dropout p"):
        Dropout(p=2.0)
    m = Model()
    m |= Relu()(input="input", output="output")
    with pytest.raises(errors.ConnectionKeyError, match="no connection 'nope'") as info:
        m["nope"]
    assert isinstance(info.value, KeyError)  # still a KeyError for code that treats models like dicts


# -- optimizers and fit ------------------------------------------------------------------------------
def test_optimizer_ignores_gradients_of_non_parameters():
    from mithril.optimizers import Adam, SGD

    params = {"w": np.array([1.0, 2.0])}
    for opt in (SGD(0.1), SGD(0.1, momentum=0.9), Adam(0.1)):
        state = opt.init(params)
        new, state = opt.update(params, {"w": np.array([1.0, -1.0]), "input": np.ones((4, 4))}, state)
        assert set(new) == {"w"} and new["w"][0] < 1.0 < new["w"][1]


def test_optimizer_refuses_what_it_cannot_use():
    from mithril.optimizers import Adam

    opt = Adam(0.1)
    params = {"w": np.ones(2), "b": np.ones(2)}
    state = opt.init({"w": params["w"]})
    with pytest.raises(errors.OptimizerError, match=r"\['b'\] have gradients but no optimizer state"):
        opt.update(params, {"w": np.ones(2), "b": np.ones(2)}, state)
    with pytest.raises(errors.OptimizerError, match="state is not this optimizer's"):
        opt.update(params, {"w": np.ones(2)}, {})
    with pytest.raises(errors.OptimizerError, match="Optimizer.update failed: ValueError"):
        opt.update(params, {"w": np.ones(3)}, state)  # a gradient of the wrong shape


def test_fit_refuses_a_model_without_a_loss():
    from mithril.optimizers import SGD, fit

    pm = ml.compile(relu_model(), ml.NumpyBackend())
    with pytest.raises(errors.InputError, match="fit trains a compiled TrainModel"):
        fit(pm, {}, lambda epoch: [], SGD(0.1), epochs=1)


def test_docs_manual_training_loop_runs_as_written(tmp_path, monkeypatch):
    """docs/training.md's written-out loop: gradients of the data input reach the optimizer."""
    pytest.importorskip("torch", reason="the page's example trains on TorchBackend")
    doc = (ROOT / "docs" / "training.md").read_text()
    first, second = [part.split("```", 1)[0] for part in doc.split("```python")[1:3]]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    scope: dict = {}
    exec(compile(first, "docs/training.md#a-training-run", "exec"), scope)
    assert len(scope["losses"]) == 8 and (tmp_path / "lenet_train.onnx").exists()
    before = {k: scope["backend"].to_numpy(v).copy() for k, v in scope["params"].items()}
    exec(compile(second, "docs/training.md#the-loop-written-out", "exec"), scope)
    assert "input" in scope["grads"] and "input" not in scope["params"]
    moved = [k for k, v in scope["params"].items() if not np.array_equal(scope["backend"].to_numpy(v), before[k])]
    assert moved, "the loop's SGD steps changed no parameter"


# -- the command line --------------------------------------------------------------------------------
def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mithril.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=120)


def test_cli_error_is_one_line_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(os.urandom(64))
    proc = run_cli("validate", str(bad))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mithril: error: file ") and "Traceback" not in proc.stderr


def test_cli_debug_shows_the_traceback(tmp_path):
    proc = run_cli("inspect", str(tmp_path / "missing.onnx"), "--debug")
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr and "mithril: error: no such file" in proc.stderr


def test_cli_internal_error_is_one_line_and_exit_3(monkeypatch, capsys):
    import mithril.cli as cli

    monkeypatch.setattr(cli, "cmd_inspect", lambda args: [][1])
    assert cli_main(["inspect", "m.onnx"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "mithril: internal error (IndexError): list index out of range"
    assert "--debug" in err[1] and len(err) == 2


def test_cli_bad_arguments_are_errors_not_tracebacks(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(relu_model().SerializeToString())
    proc = run_cli("validate", str(model), "--shape", "x=two,3")
    assert proc.returncode == 2 and "dims must be integers" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("validate", str(model), "--input", f"x={tmp_path / 'nothing.npy'}")
    assert proc.returncode == 2 and "cannot read a .npy array" in proc.stderr and "Traceback" not in proc.stderr


def test_a_kernel_returning_too_few_outputs_names_the_node(monkeypatch):
    model = make_model([helper.make_node("Split", ["x"], ["a", "b"], axis=1, name="halves", num_outputs=2)],
                       [("x", TensorProto.FLOAT, [2, 4])], [("a", TensorProto.FLOAT, [2, 2]),
                                                            ("b", TensorProto.FLOAT, [2, 2])], opset=18)
    pm = ml.compile(model, ml.NumpyBackend())
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = pm.evaluate(None, {"x": x})
    np.testing.assert_array_equal(out["b"], x[:, 2:])
    namespace = pm.program.namespace
    name = next(k for k, v in namespace.items() if getattr(v, "__name__", "").startswith("split"))
    monkeypatch.setitem(namespace, name, lambda x, *rest, **kwargs: (x[:, :2],))
    with pytest.raises(errors.KernelError, match=r"node 'halves', op Split, opset 18: .*returned 1 output\(s\) "
                                                 r"but the node has 2"):
        pm.evaluate(None, {"x": x})


def test_split_18_without_num_outputs_splits_into_its_output_count():
    model = make_model([helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0)],
                       [("x", TensorProto.FLOAT, [6])], [(n, TensorProto.FLOAT, [2]) for n in "abc"], opset=18)
    x = np.arange(6, dtype=np.float32)
    out = ml.compile(model, ml.NumpyBackend()).evaluate(None, {"x": x})
    assert [out[n].tolist() for n in "abc"] == [[0, 1], [2, 3], [4, 5]]
