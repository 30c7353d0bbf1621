"""The C backend (issue 18, first slice): zoo models as generated C equal to NumPy, float64,
the NumPy fallback (warned, or refused), the compiler and its cache, zero-copy buffers."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mithril as ml
import models_zoo
from mithril.backends.c import build
from mithril.backends.c.backend import CFallbackWarning
from mithril.errors import CompileError, MithrilError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")



CASES = {
    "mlp": (lambda: models_zoo.mlp([16, 8, 4]), (2, 12)),
    "lenet": (lambda: models_zoo.lenet(num_classes=10), (2, 1, 32, 32)),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), (1, 3, 32, 32)),
}


def _params(pm):
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    for k in params:
        if k.endswith("running_var"):
            params[k] = np.abs(params[k]) + 0.5
    return params


@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model_in_c_equals_numpy(name):
    build_model, shape = CASES[name]
    model = build_model()
    shapes = {"input": shape}
    ref = ml.compile(model, ml.NumpyBackend(), shapes=shapes, inference=True)
    params = _params(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)  # every node of these models has a C kernel
        pm = ml.compile(model, ml.CBackend(), shapes=shapes, inference=True, static_shapes=True)
    assert not pm.program.fallback
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ref.evaluate(params, {"input": x})["output"]
    got = pm.evaluate(params, {"input": x})["output"]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    report = pm.program.memory_report()
    assert 0 < report["arena_bytes"] < report["naive_bytes"]  # buffers are reused across lifetimes


def test_float64_runs_in_double():
    model = models_zoo.lenet(num_classes=10)
    shapes = {"input": (1, 1, 32, 32)}
    ref = ml.compile(model, ml.NumpyBackend(dtype=ml.float64), shapes=shapes, inference=True)
    params = _params(ref)
    pm = ml.compile(model, ml.CBackend(dtype=ml.float64), shapes=shapes, inference=True, static_shapes=True)
    assert "mt_conv_f64(" in pm.program.source and "float" not in pm.program.source.split("mithril_kernels.h")[1]
    x = np.random.default_rng(1).standard_normal((1, 1, 32, 32))
    got = pm.evaluate(params, {"input": x})["output"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref.evaluate(params, {"input": x})["output"], rtol=1e-10, atol=1e-12)


@pytest.fixture
def twice():
    """A custom op (a registered NumPy kernel): C has no kernel for it, whatever C gains."""
    with ml.scoped_ops():
        ml.register_op("Twice", lambda x: 2 * x, output_shapes=lambda inputs, attributes: [inputs[0]])
        yield


def _graph_with_unsupported_op():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Twice", ["r"], ["c"], name="twice", domain="mithril.custom"),
             helper.make_node("Add", ["c", "x"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                            helper.make_opsetid("mithril.custom", 1)]))


def test_fallback_runs_numpy_between_c_segments_with_one_warning(twice):
    model = _graph_with_unsupported_op()
    with pytest.warns(CFallbackWarning) as record:
        pm = ml.compile(model, ml.CBackend(), inference=True)
    assert len(record) == 1
    assert str(record[0].message) == ("CBackend: 1 node(s) run on NumPy (no C kernel): "
                                      "twice (Twice: no C kernel)")
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], np.float32)
    r = np.maximum(x, 0)
    np.testing.assert_allclose(pm.evaluate({}, {"x": x})["y"], 2 * r + x, rtol=1e-6)
    assert pm.program.source.count("int seg") == 2  # Relu, then Add: two C segments around NumPy's Twice


def test_fallback_none_refuses_naming_each_node(twice):
    with pytest.raises(CompileError, match=r"CBackend\(fallback=None\): 1 node\(s\) have no C kernel: "
                                           r"twice \(Twice: no C kernel\)"):
        ml.compile(_graph_with_unsupported_op(), ml.CBackend(fallback=None), inference=True)


def test_missing_compiler_is_one_clear_error(monkeypatch, twice):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("MITHRIL_CACHE_DIR", "/nonexistent-cache-never-created")
    with pytest.raises(MithrilError, match=r"CBackend needs a C compiler and found none: CC='/nonexistent/cc'"):
        ml.compile(_graph_with_unsupported_op(), ml.CBackend(), inference=True)


def test_second_compile_reuses_the_cached_library():
    model = models_zoo.mlp([16, 8, 4])
    ml.compile(model, ml.CBackend(), shapes={"input": (3, 12)}, inference=True)
    before = build.BUILDS["count"]
    pm = ml.compile(model, ml.CBackend(), shapes={"input": (3, 12)}, inference=True)
    assert build.BUILDS["count"] == before
    assert pm.evaluate(_params(pm), {"input": np.ones((3, 12), np.float32)})["output"].shape == (3, 4)


def test_buffers_pass_without_copies(monkeypatch):
    """The C segment reads the caller's input buffer and writes the output NumPy returns."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])])
    pm = ml.compile(ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])),
                    ml.CBackend(), inference=True)
    program = pm.program
    seen = []
    seg = program._segments[0]
    program._segments[0] = lambda io, arena: (seen.append((io[0], io[1])), seg(io, arena))[1]
    x = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    y = program.forward({}, {"x": x})["y"]
    assert seen == [(x.ctypes.data, y.ctypes.data)]
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_symbolic_input_shape_is_refused_naming_the_input():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(CompileError, match=r"CBackend needs every input shape fixed; .* for: x \['N', 3\]"):
        ml.compile(model, ml.CBackend(), inference=True)


def test_generated_source_compiles_with_warnings_as_errors():
    pm = ml.compile(models_zoo.lenet(num_classes=10), ml.CBackend(), shapes={"input": (1, 1, 32, 32)},
                    inference=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{build.LIB_DIR}",
                           "-x", "c", "-"], input=pm.program.source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_validate_all_lists_c(tmp_path):
    model = models_zoo.mlp([16, 8, 4])
    path = tmp_path / "mlp.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # export writes random parameters, which is what this test wants
        proto = ml.export_onnx(model, shapes={"input": [2, 12]})
    onnx.save(proto, path)
    done = subprocess.run([sys.executable, "-m", "mithril", "validate", str(path), "--backend", "all"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ c "))
    assert "output" in row and "[2, 4]" in row and row.rstrip().endswith("pass   │")


def test_a_0d_constant_reaches_a_numpy_node_as_0d():
    """A scalar initializer read by a node NumPy runs keeps its shape () (a 0-d constant once
    came through as [1], and a Loop's trip count then grew every loop-carried value a dim)."""
    seen = []

    def rank_probe(x, c):
        seen.append(np.shape(c))
        return x + c

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("rank_probe", ["r", "c"], ["y"], domain="mithril.custom")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                          initializer=[onnx.numpy_helper.from_array(np.array(2.0, np.float32), "c")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("mithril.custom", 1)])
    with ml.scoped_ops():
        ml.register_op("rank_probe", rank_probe)
        with pytest.warns(CFallbackWarning, match="rank_probe"):
            pm = ml.compile(ml.load_onnx(model), ml.CBackend(), inference=True, constant_keys=["c"])
        y = pm.evaluate({}, {"x": np.array([-1.0, 0.0, 1.0], np.float32)})["y"]
    assert seen == [()]
    np.testing.assert_array_equal(y, [2.0, 2.0, 3.0])


def test_docs_backends_examples_run(capsys):
    """docs/backends.md's C example runs as written and prints the output shape and the report."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "backends.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/backends.md", "exec"), {})
    out = capsys.readouterr().out
    assert "(1, 10)" in out and "arena (C):" in out


def test_compiler_refusing_the_source_is_an_error_from_compile(monkeypatch, tmp_path):
    """The compiler runs in the background (build.start_build); its refusal still comes from
    ml.compile, with the compiler's message, and leaves no temporary folder in the cache."""
    fake = tmp_path / "fakecc"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "fakecc 1.0"; exit 0; fi\n'
                    'echo "model.c:1: error: this compiler refuses everything" >&2\nexit 1\n')
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("MITHRIL_CACHE_DIR", str(cache))
    model = models_zoo.mlp([16, 8, 4])
    with pytest.raises(build.CCompilerError, match=r"(?s)refused the generated source.*refuses everything"):
        ml.compile(model, ml.CBackend(), shapes={"input": (3, 12)}, inference=True)
    assert list(cache.iterdir()) == []  # no library, no leftover build folder


def test_a_build_dropped_unwaited_is_stopped_and_its_folder_removed(monkeypatch, tmp_path):
    """lower starts the compiler in the background; when the gradient program then fails with an
    error compile re-raises, the forward build nobody will wait for is stopped (not left running
    for its full time) and the cache keeps no temporary folder."""
    fake = tmp_path / "fakecc"
    fake.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "fakecc 1.0"; exit 0; fi\nexec sleep 60\n')
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("MITHRIL_CACHE_DIR", str(cache))

    def refuse(self, plan, **kwargs):
        raise CompileError("no gradients for this test")

    monkeypatch.setattr(ml.CBackend, "lower_backward", refuse)
    model = models_zoo.mlp([16, 8, 4])
    started = time.perf_counter()
    with pytest.raises(CompileError, match="no gradients for this test"):
        ml.compile(model, ml.CBackend(), shapes={"input": (3, 12)}, data_keys=["input"])
    gc.collect()
    assert time.perf_counter() - started < 30  # the 60 s "compiler" was stopped, not waited for
    assert list(cache.iterdir()) == []
