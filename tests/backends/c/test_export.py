"""Issue 18 Must 6, "Standalone export": ``ml.export_c`` and ``mithril export-c`` write a C tree
(model.h/model.c, main.c, Makefile, the kernel headers, the weights) that builds with nothing but
``make`` and ``cc`` and whose outputs equal onnxruntime's; the errors a user can hit are
MithrilErrors naming what is wrong."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mithril as ml
import models_zoo
from mithril.backends.c.backend import CKernelMissingError
from mithril.backends.c.export import EMBED_LIMIT
from mithril.cli import main as cli_main
from mithril.errors import CompileError, ExportError, InputError, ShapeError

ort = pytest.importorskip("onnxruntime")
CC = shutil.which("cc")
needs_make = pytest.mark.skipif(CC is None or shutil.which("make") is None,
                                reason="building the export needs make and cc on PATH")


def _lenet_onnx(path, dynamic=False):
    model = models_zoo.lenet(num_classes=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # export_onnx randomizes the parameters and says so
        ml.export_onnx(model, path, shapes={"input": [2, 1, 32, 32]}, dynamic_axes={"input": [0]} if dynamic else None)
    return path


def _make(directory, *args) -> str:
    done = subprocess.run(["make", "-C", str(directory), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _run(exe, *args, cwd=None):
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


@needs_make
def test_lenet_exported_builds_with_make_alone_and_equals_onnxruntime(tmp_path):
    path = _lenet_onnx(tmp_path / "lenet.onnx")
    out = ml.export_c(path, tmp_path / "c", shapes={"input": (2, 1, 32, 32)}, weights="file")
    assert not out.embedded and out.weight_bytes > 0
    names = sorted(p.relative_to(out.directory).as_posix() for p in out.files)
    assert {"model.h", "model.c", "model.bin", "main.c", "Makefile", "lib/mithril_kernels.h"} <= set(names)
    assert not any(n.startswith("lib/mt_grad") for n in names)  # gradient kernels: not part of an inference export
    log = _make(out.directory)
    # Plain cc: no Python headers, no BLAS, nothing outside the tree but libm (and OpenMP).
    assert re.search(r"^cc .*-O3 .*-fopenmp -Ilib -o model main\.c model\.c +-lm$", log, flags=re.M), log
    assert "python" not in log.lower() and "blas" not in log.lower() and "warning" not in log
    header = (out.directory / "model.h").read_text()
    assert f"#define MODEL_ARENA_BYTES {out.arena_bytes}UL" in header
    assert "#define MODEL_INPUT0_SHAPE {2, 1, 32, 32}" in header and '#define MODEL_OUTPUT0_DTYPE "float32"' in header
    assert "int model_run(const float *input, float *output);" in header
    assert "int model_init(const char *weights_path);" in header and "void model_free(void);" in header

    x = np.random.default_rng(0).standard_normal((2, 1, 32, 32)).astype(np.float32)
    x.tofile(tmp_path / "x.bin")
    done = _run(out.directory / "model", tmp_path / "x.bin", tmp_path / "y.bin", cwd=out.directory)
    assert done.returncode == 0, done.stderr
    want = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    got = np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    # main.c's errors: a file of the wrong size, weights of another model, a missing argument.
    x[:1].tofile(tmp_path / "short.bin")
    bad = _run(out.directory / "model", tmp_path / "short.bin", tmp_path / "y.bin", cwd=out.directory)
    assert bad.returncode == 1 and "expected exactly 8192 bytes" in bad.stderr
    (tmp_path / "other.bin").write_bytes(b"MITHRIL1" + bytes(100))
    bad = _run(out.directory / "model", "-w", tmp_path / "other.bin", tmp_path / "x.bin", tmp_path / "y.bin")
    assert bad.returncode == 1 and "is not this model's" in bad.stderr
    bad = _run(out.directory / "model", tmp_path / "x.bin", cwd=out.directory)
    assert bad.returncode == 2 and "usage:" in bad.stderr and "input.bin output.bin" in bad.stderr


@needs_make
def test_cli_export_c_float64_equals_onnxruntime(tmp_path, capsys):
    """`mithril export-c model.onnx out_dir --shape input=...` with --dtype float64 and --name:
    the weights in lenet.bin, a static library target for linking it into another program."""
    path = _lenet_onnx(tmp_path / "lenet.onnx", dynamic=True)
    rc = cli_main(["export-c", str(path), str(tmp_path / "c64"), "--shape", "input=3,1,32,32", "--dtype", "float64",
                   "--name", "lenet"])
    printed = capsys.readouterr().out
    assert rc == 0 and "lenet.h, lenet.c" in printed and "input input: float64 [3, 1, 32, 32]" in printed
    d = tmp_path / "c64"
    assert re.search(r"weights 49\d,\d{3} bytes, lenet\.bin", printed) and (d / "lenet.bin").exists()  # over 256 KiB
    _make(d)
    _make(d, "liblenet.a")
    assert (d / "liblenet.a").stat().st_size > 0
    x = np.random.default_rng(1).standard_normal((3, 1, 32, 32))
    x.tofile(tmp_path / "x.bin")
    done = _run(d / "lenet", "-w", d / "lenet.bin", "-t", "1", tmp_path / "x.bin", tmp_path / "y.bin")
    assert done.returncode == 0, done.stderr
    want = ort.InferenceSession(str(path)).run(None, {"input": x.astype(np.float32)})[0]
    got = np.fromfile(tmp_path / "y.bin", np.float64).reshape(3, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _gather_model():
    g = helper.make_graph(
        [helper.make_node("Gather", ["data", "idx"], ["y"], name="pick")], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@needs_make
def test_a_kernel_refusal_is_a_status_naming_the_node(tmp_path):
    """An out-of-range Gather index: model_run returns a status whose message names the node;
    main exits 1 with it (no crash, no garbage output). Built with `make OPENMP=`."""
    out = ml.export_c(_gather_model(), tmp_path / "g")
    assert out.embedded and out.weight_bytes == 0
    exe = tmp_path / "g" / "model"
    # Without OpenMP (one thread), warnings as errors: the kernel library is clean either way.
    _make(tmp_path / "g", "OPENMP=", "CFLAGS=-O1 -Werror")
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    data.tofile(tmp_path / "d.bin")
    np.array([3, -4], np.int64).tofile(tmp_path / "i.bin")
    ok = _run(exe, tmp_path / "d.bin", tmp_path / "i.bin", tmp_path / "y.bin")
    assert ok.returncode == 0, ok.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(2, 3), data[[3, 0]])
    np.array([1, 4], np.int64).tofile(tmp_path / "i.bin")
    bad = _run(exe, tmp_path / "d.bin", tmp_path / "i.bin", tmp_path / "y.bin")
    assert bad.returncode == 1 and "model_run: node pick (Gather):" in bad.stderr and "range" in bad.stderr


# -- errors a user can hit -----------------------------------------------------------------
def test_a_node_without_a_c_kernel_is_refused_with_the_list(tmp_path):
    from mithril.backends.c.ops import KERNELS

    # Bernoulli: a random op, which runs on NumPy's generator, never in C.
    assert ("", "Bernoulli") not in KERNELS
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Bernoulli", ["r"], ["v"], name="top")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3, 3])])
    with pytest.raises(CKernelMissingError, match=r"export_c: 1 node\(s\) have no C kernel.*top \(Bernoulli: no C kernel\)"):
        ml.export_c(helper.make_model(g), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_symbolic_shape_not_fixed_is_refused_naming_the_input(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    with pytest.raises(CompileError, match=r"export_c: .*needs every input dim fixed; give shapes= for x: .*N"):
        ml.export_c(helper.make_model(g), tmp_path / "out")
    out = ml.export_c(helper.make_model(g), tmp_path / "out", shapes={"x": (4, 3)})
    assert "#define MODEL_INPUT0_SHAPE {4, 3}" in (out.directory / "model.h").read_text()


def test_bad_arguments_are_export_errors(tmp_path):
    model = _gather_model()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is a file, not a folder"):
        ml.export_c(model, tmp_path / "file")
    with pytest.raises(ExportError, match=r"weights='zip'; choose from auto, file, embed"):
        ml.export_c(model, tmp_path / "o", weights="zip")
    with pytest.raises(ExportError, match="must be a C identifier"):
        ml.export_c(model, tmp_path / "o", name="my-model")
    with pytest.raises(Exception) as info:
        ml.export_c(model, tmp_path / "o", dtype=ml.float16)
    assert isinstance(info.value, ml.MithrilError) and "float32 or float64" in str(info.value)


def test_params_replace_the_models_own_and_are_checked(tmp_path):
    model = models_zoo.mlp([4, 3])
    shapes = {"input": (1, 5)}
    pm = ml.compile(model, ml.NumpyBackend(), shapes=shapes, inference=True)
    params = {k: np.full(np.shape(v), 0.5, np.float32) for k, v in pm.get_parameters().items()}
    out = ml.export_c(model, tmp_path / "o", shapes=shapes, params=params, weights="embed")
    source = (out.directory / "model.c").read_text()
    assert source.count("0x1.0000000000000p-1") == sum(v.size for v in params.values())  # 0.5, exact
    name = next(iter(params))
    with pytest.raises(InputError, match=r"unknown parameter\(s\) \['nope'\]"):
        ml.export_c(model, tmp_path / "o", shapes=shapes, params={"nope": np.zeros(1, np.float32)})
    with pytest.raises(ShapeError, match=f"parameter '{name}' expects shape"):
        ml.export_c(model, tmp_path / "o", shapes=shapes, params={name: np.zeros((7, 7), np.float32)})


def test_weights_auto_embeds_up_to_the_limit(tmp_path):
    small = ml.export_c(models_zoo.mlp([4, 3]), tmp_path / "s", shapes={"input": (1, 5)})
    assert small.embedded and small.weight_bytes <= EMBED_LIMIT and not (tmp_path / "s" / "model.bin").exists()
    big = ml.export_c(models_zoo.mlp([300, 300]), tmp_path / "b", shapes={"input": (1, 300)})
    assert big.weight_bytes > EMBED_LIMIT and not big.embedded
    blob = (tmp_path / "b" / "model.bin").read_bytes()
    assert blob[:8] == b"MITHRIL1"
    payload, count = np.frombuffer(blob[8:24], "<u8")
    assert len(blob) == 64 + payload and count == 4  # two weights, two biases


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    onnx.save(helper.make_model(g), tmp_path / "m.onnx")
    (tmp_path / "file").write_text("x")
    cases = [
        (["export-c", str(tmp_path / "m.onnx"), str(tmp_path / "o")], "give --shape NAME=D0,D1,... for x ['N', 3]"),
        (["export-c", str(tmp_path / "m.onnx"), str(tmp_path / "o"), "--shape", "z=1,3"], "the model has no input 'z'"),
        (["export-c", str(tmp_path / "m.onnx"), str(tmp_path / "o"), "--shape", "x=1,a"], "dims must be integers"),
        (["export-c", str(tmp_path / "m.onnx"), str(tmp_path / "file"), "--shape", "x=1,3"], "is a file, not a folder"),
        (["export-c", str(tmp_path / "m.onnx"), str(tmp_path / "o"), "--shape", "x=1,3", "--dtype", "int8"],
         "computes in float32 or float64"),
        (["export-c", str(tmp_path / "missing.onnx"), str(tmp_path / "o")], "missing.onnx"),
    ]
    for argv, message in cases:
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("mithril: error: ") and message in err and "Traceback" not in err, (argv, err)
    assert cli_main(["export-c", str(tmp_path / "m.onnx")]) == 2  # argparse: out_dir missing
    assert "out_dir" in capsys.readouterr().err


@needs_make
def test_outputs_that_are_inputs_constants_or_views_are_copied(tmp_path):
    """Outputs no kernel writes (a graph input passed through, an initializer, a Reshape view of
    an input) are copied by model_run; an input nobody reads is still taken; names that are not
    C identifiers, or that repeat, become distinct parameters of model_run."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x:0"], ["y"]), helper.make_node("Reshape", ["x:0", "s"], ["v"])], "g",
        [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("unused", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("x:0", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor("s", TensorProto.INT64, [2], [3, 2]), helper.make_tensor("w", TensorProto.FLOAT, [2], [1.5, -2])])
    out = ml.export_c(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "e",
                      params={"w": np.array([0.25, -8], np.float32)})
    header = (out.directory / "model.h").read_text()
    assert "int model_run(const float *x_0, const int32_t *unused, float *y, float *x_0_2, float *w, float *v);" in header
    _make(out.directory)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    x.tofile(tmp_path / "x.bin")
    np.zeros(4, np.int32).tofile(tmp_path / "u.bin")
    outs = [tmp_path / f"o{j}.bin" for j in range(4)]
    done = _run(out.directory / "model", tmp_path / "x.bin", tmp_path / "u.bin", *outs)
    assert done.returncode == 0, done.stderr
    got = [np.fromfile(p, np.float32) for p in outs]
    np.testing.assert_array_equal(got[0], np.maximum(x, 0).ravel())
    np.testing.assert_array_equal(got[1], x.ravel())
    np.testing.assert_array_equal(got[2], [0.25, -8])
    np.testing.assert_array_equal(got[3], x.ravel())
