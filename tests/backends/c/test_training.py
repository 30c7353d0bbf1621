"""Gradients in C (issue 18, Must 5): TrainModel and fit run forward and backward as generated C.
Gradients of the zoo's MLP, LeNet and ResNet-18 and of an imported (torch-exported) ResNet-18
equal NumPy's; LeNet trained with fit on scikit-learn's digits passes 95 %; a backward without
a C kernel runs on NumPy's rule with one warning, or is refused with fallback=None."""

from __future__ import annotations

import shutil
import subprocess
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
import models_zoo
from mithril.backends.c import build
from mithril.backends.c.backend import CFallbackWarning, CKernelMissingError
from mithril.models import CrossEntropy, Mean, TrainModel

from tests.conftest import digits_32x32

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler (cc or gcc) on PATH")



def _trainer(model, backend, shapes):
    tm = TrainModel(model)
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    return ml.compile(tm, backend, shapes=shapes, data_keys={"input", "target"})


ZOO = {
    "mlp": (lambda: models_zoo.mlp(), [8, 16]),
    "lenet": (lambda: models_zoo.lenet(num_classes=10), [4, 1, 32, 32]),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), [2, 3, 32, 32]),
}


def _compare_gradients(want: dict, got: dict, rtol: float) -> float:
    """The largest error relative to each gradient's largest entry; asserts it is within rtol."""
    assert set(got) == set(want)
    worst = 0.0
    for name, ref in want.items():
        ref, out = np.asarray(ref), np.asarray(got[name])
        assert out.shape == ref.shape and out.dtype == ref.dtype, name
        err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
        assert err <= rtol, f"{name}: gradient differs from NumPy's by {err:.2e} (relative to its largest entry)"
        worst = max(worst, err)
    return worst


# Each case builds two C libraries (the forward and the training step), ResNet-18 for ~10 s.
@pytest.mark.parametrize("name, dtype", [
    ("mlp", ml.float32), ("mlp", ml.float64), ("lenet", ml.float32), ("lenet", ml.float64),
    pytest.param("resnet18", ml.float32, marks=pytest.mark.slow)],
    ids=["mlp-float32", "mlp-float64", "lenet-float32", "lenet-float64", "resnet18-float32"])
def test_zoo_training_gradients_in_c_equal_numpy(name, dtype):
    build_model, shape = ZOO[name]
    shapes = {"input": shape, "target": shape[:1]}
    ref = _trainer(build_model(), ml.NumpyBackend(dtype=dtype), shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)  # every forward node and every backward is C
        pm = _trainer(build_model(), ml.CBackend(dtype=dtype), shapes)
    assert not pm.backward.fallback
    assert "mt_grad_" in pm.backward.source and pm.backward.source.count("int seg") == 1
    params = {k: np.asarray(v) for k, v in ref.randomize_params().items()}
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal(shape).astype(dtype.numpy),
            "target": rng.integers(0, 10, shape[:1]).astype(np.int64)}
    one = {"loss": np.ones((), dtype.numpy)}
    want_out, want = ref.evaluate(params, data, output_gradients=one)
    got_out, got = pm.evaluate(params, data, output_gradients=one)
    np.testing.assert_allclose(got_out["loss"], want_out["loss"], rtol=1e-5 if dtype == ml.float32 else 1e-12)
    _compare_gradients(want, got, 1e-4 if dtype == ml.float32 else 1e-10)
    report = pm.backward.memory_report()
    assert 0 < report["arena_bytes"] < report["naive_bytes"]  # forward values and gradients share the arena
    if name == "lenet":  # the training step's source compiles warning-free
        _compiles_with_warnings_as_errors(pm.backward.source)


def _compiles_with_warnings_as_errors(source: str) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    done = subprocess.run([cc, "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra", "-Werror", f"-I{build.LIB_DIR}",
                           "-x", "c", "-"], input=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_imported_resnet18_gradients_in_c_equal_numpy(tmp_path):
    """torchvision's ResNet-18 (models_zoo.torch_reference, random weights) exported by torch.onnx."""
    pytest.importorskip("torch")
    from models_zoo import torch_reference

    spec = torch_reference.build("resnet18", image_size=32)
    path = tmp_path / "resnet18.onnx"
    torch_reference.export_onnx(spec, "torchscript", str(path))
    model = ml.load_onnx(path)
    data = spec.numpy_inputs(2)
    shapes = {k: list(v.shape) for k, v in data.items()}
    ref = ml.compile(model, ml.NumpyBackend(), shapes=shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)
        pm = ml.compile(model, ml.CBackend(), shapes=shapes, static_shapes=True)
    ops = {pn.op_type for pn in pm.backward.plan.nodes}
    assert {"Conv", "Relu", "Add", "MaxPool", "GlobalAveragePool", "Gemm"} <= ops
    params = ref.get_parameters()
    out = ref.output_keys[0]
    cot = {out: np.random.default_rng(1).standard_normal((2, 1000)).astype(np.float32)}
    want_out, want = ref.evaluate(params, data, output_gradients=cot)
    got_out, got = pm.evaluate(params, data, output_gradients=cot)
    assert len(want) == 42  # 20 convolutions (weights and biases, batch norms folded) and fc
    np.testing.assert_allclose(got_out[out], want_out[out], rtol=1e-4, atol=1e-5)
    _compare_gradients(want, got, 1e-4)


# -- fit on the digits ---------------------------------------------------------------------------
BATCH, N_TRAIN, EPOCHS, LR = 64, 1500, 15, 3e-3


def _digits():
    """LeNet's digits (conftest.digits_32x32) in float32."""
    x, y, xt, yt = digits_32x32(N_TRAIN)
    return x.astype(np.float32), y, xt.astype(np.float32), yt


@pytest.mark.slow
def test_fit_lenet_on_digits_in_c_passes_95_percent():
    from mithril.optimizers import Adam, fit

    xtr, ytr, xte, yte = _digits()
    # One thread: OpenMP threads spinning against each other on shared cores cost more than they give.
    backend = ml.CBackend(num_threads=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)
        pm = _trainer(models_zoo.lenet(num_classes=10), backend, {"input": [BATCH, 1, 32, 32], "target": [BATCH]})

    def batches(epoch, shift=2):
        rng = np.random.default_rng(epoch)
        perm = rng.permutation(N_TRAIN)
        for i in range(0, N_TRAIN - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            pad = np.pad(xtr[idx], ((0, 0), (0, 0), (shift, shift), (shift, shift)))
            at = rng.integers(0, 2 * shift + 1, (BATCH, 2))
            x = np.stack([pad[j, :, a:a + 32, b:b + 32] for j, (a, b) in enumerate(at)])
            yield {"input": x, "target": ytr[idx]}

    steps = EPOCHS * (N_TRAIN // BATCH)
    opt = Adam(lambda step: LR * (1 - step / steps))
    params, _, losses = fit(pm, pm.randomize_params(), batches, opt, EPOCHS, progress=False)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    test = ml.compile(models_zoo.lenet(num_classes=10), backend, shapes={"input": list(xte.shape)}, inference=True)
    out = test.evaluate({k: params[k] for k in test.parameter_keys}, {"input": xte})["output"]
    acc = float((np.asarray(out).argmax(axis=1) == yte).mean())
    assert acc >= 0.95, f"LeNet in C: test accuracy {acc:.3f} after {EPOCHS} epochs"


# -- a backward without a C kernel ----------------------------------------------------------------


def _sine_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Sin", ["r"], ["s"], name="sine"),
             helper.make_node("Mul", ["s", "x"], ["y"], name="times")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_backward_without_c_kernel_runs_numpys_rule_with_one_warning():
    with pytest.warns(CFallbackWarning) as record:
        pm = ml.compile(_sine_model(), ml.CBackend(), data_keys={"x"})
    assert [str(r.message) for r in record] == [
        "CBackend: the backward of 1 node(s) runs on NumPy (no C backward kernel): sine (Sin: no C backward kernel)"]
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.25]], np.float32)
    g = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, grads = pm.evaluate({}, {"x": x}, output_gradients={"y": g})
    r = np.maximum(x, 0)
    np.testing.assert_allclose(out["y"], np.sin(r) * x, rtol=1e-6)
    # d/dx sin(relu(x)) * x = sin(relu(x)) + x cos(relu(x)) [x > 0]
    np.testing.assert_allclose(grads["x"], g * (np.sin(r) + x * np.cos(r) * (x > 0)), rtol=1e-5, atol=1e-6)
    assert pm.backward.source.count("int seg") == 2  # C, NumPy's Sin rule, C


def test_fallback_none_refuses_a_backward_without_c_kernel():
    with pytest.raises(CKernelMissingError, match=r"^CBackend\(fallback=None\): 1 node\(s\) have no C backward "
                                                  r"kernel: sine \(Sin: no C backward kernel\)$"):
        ml.compile(_sine_model(), ml.CBackend(fallback=None), data_keys={"x"})


# -- BatchNorm in training mode ----------------------------------------------------------------------


def test_frontend_batchnorm_training_gradients_in_c_equal_numpy():
    """BatchNorm2D(training=True) lowers to ReduceMean, Sub, Mul (x * x), Div, Sqrt: all in C."""
    from mithril.models import BatchNorm2D, Convolution2D, Flatten, IOKey, Linear, Model, Relu

    def bn_net():  # tests/frontend/test_training.py's
        m = Model()
        m |= Convolution2D(3, 4, padding=1, name="conv")(input=IOKey("input", shape=["N", 2, 6, 6]))
        m += BatchNorm2D(training=True, name="bn")
        m += Relu()
        m += Flatten(start_dim=1)
        m += Linear(3, name="fc")(output="output")
        return m

    shapes = {"input": [8, 2, 6, 6], "target": [8]}
    pms = {}
    for backend in (ml.NumpyBackend(), ml.CBackend()):
        tm = TrainModel(bn_net())
        tm.add_loss(CrossEntropy(), input="output", target="target", reduce_steps=[Mean()])
        with warnings.catch_warnings():
            warnings.simplefilter("error", CFallbackWarning)
            pms[backend.name] = ml.compile(tm, backend, shapes=shapes, data_keys={"input", "target"})
    rng = np.random.default_rng(0)
    data = {"input": (rng.standard_normal((8, 2, 6, 6)) * 3 + 1).astype(np.float32), "target": rng.integers(0, 3, 8)}
    params = {k: np.asarray(v) for k, v in pms["numpy"].randomize_params().items()}
    want_out, want = pms["numpy"].evaluate(params, data)
    got_out, got = pms["c"].evaluate(params, data)
    for k in ("loss", "bn.running_mean_out", "bn.running_var_out"):
        np.testing.assert_allclose(got_out[k], want_out[k], rtol=1e-5, atol=1e-6)
    # The batch mean takes the conv's bias away: its gradient is rounding noise on both sides.
    assert np.abs(got.pop("conv.bias")).max() < 1e-5 and np.abs(want.pop("conv.bias")).max() < 1e-5
    _compare_gradients(want, got, 1e-4)


def test_onnx_batchnorm_training_mode_backward_in_c():
    """BatchNormalization-15 with training_mode=1: the backward runs in C, from the batch's own
    statistics (the forward too where ops/nn.py has a training-mode kernel)."""
    c = 3
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                              name="bn", training_mode=1, epsilon=1e-3)]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [c], v) for n, v in
             [("scale", [1.5, -0.5, 2.0]), ("bias", [0.1, 0.2, 0.3]), ("mean", [0.0] * c), ("var", [1.0] * c)]]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, c, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, c, 5])], inits)
    model = ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]))
    ref = ml.compile(model, ml.NumpyBackend(), trainable_keys={"scale", "bias"}, data_keys={"x"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CFallbackWarning)  # the forward's, where C has no training kernel
        pm = ml.compile(model, ml.CBackend(), trainable_keys={"scale", "bias"}, data_keys={"x"})
    assert "mt_grad_batchnorm_f32(" in pm.backward.source and not pm.backward.fallback
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, c, 5)) * 2 + 1).astype(np.float32)
    cot = {"y": rng.standard_normal((4, c, 5)).astype(np.float32)}
    _, want = ref.evaluate(None, {"x": x}, output_gradients=cot)
    _, got = pm.evaluate(None, {"x": x}, output_gradients=cot)
    _compare_gradients(want, got, 1e-4)


# -- backward kernels on hand-made graphs: the edge cases the zoo misses ------------------------------


def _graph(nodes, inputs, output, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], list(inits))
    return ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


BACKWARD_CASES = {
    # padded windows: counts with and without the padding, ceil_mode's partial window, strides
    "pools": ([helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
               helper.make_node("AveragePool", ["x"], ["b"], kernel_shape=[2, 3], pads=[1, 0, 1, 1],
                                count_include_pad=1, ceil_mode=1),
               helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
                                ceil_mode=1),
               helper.make_node("GlobalAveragePool", ["x"], ["gp"]),
               helper.make_node("ReduceSum", ["a"], ["sa"], keepdims=0),
               helper.make_node("ReduceSum", ["b"], ["sb"], keepdims=0),
               helper.make_node("ReduceSum", ["m"], ["sm"], keepdims=0),
               helper.make_node("ReduceSum", ["gp"], ["sg"], keepdims=0),
               helper.make_node("Sum", ["sa", "sb", "sm", "sg"], ["y"])],
              [("x", [2, 3, 7, 6])], {"x": (2, 3, 7, 6)}),
    # broadcasting both ways, Sub's sign, Div's two gradients, Gemm transposed with a row bias
    "broadcast_gemm": ([helper.make_node("Sub", ["a", "b"], ["s"]),
                        helper.make_node("Mul", ["s", "b"], ["m"]),
                        helper.make_node("Div", ["m", "c"], ["d"]),
                        helper.make_node("Gemm", ["d", "w", "bias"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
                       [("a", [4, 3]), ("b", [1, 3]), ("c", [4, 1]), ("w", [5, 4]), ("bias", [5])],
                       {"a": (4, 3), "b": (1, 3), "c": (4, 1), "w": (5, 4), "bias": (5,)}),
    # activations [..., M, K] @ weights [K, N] (a transformer's Linear): the leading dims fold into M
    "matmul_3d": ([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 3, 4]), ("w", [4, 5])],
                  {"x": (2, 3, 4), "w": (4, 5)}),
    # Softmax over a middle axis, Sigmoid, strided Conv with groups and a 1x1 (pointwise) Conv
    "softmax_conv": ([helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 1], pads=[1, 0, 0, 1], group=2),
                      helper.make_node("Conv", ["c", "p"], ["q"]),
                      helper.make_node("Softmax", ["q"], ["s"], axis=1),
                      helper.make_node("Sigmoid", ["s"], ["y"])],
                     [("x", [2, 4, 6, 5]), ("w", [6, 2, 3, 2]), ("p", [3, 6, 1, 1])],
                     {"x": (2, 4, 6, 5), "w": (6, 2, 3, 2), "p": (3, 6, 1, 1)}),
}


@pytest.mark.parametrize("case", list(BACKWARD_CASES))
def test_backward_kernels_on_hand_made_graphs_equal_numpy(case):
    nodes, inputs, shapes = BACKWARD_CASES[case]
    model = _graph(nodes, inputs, "y")
    keys = set(shapes)
    ref = ml.compile(model, ml.NumpyBackend(dtype=ml.float64), shapes=shapes, data_keys=keys)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)
        pm = ml.compile(model, ml.CBackend(dtype=ml.float64), shapes=shapes, data_keys=keys)
    rng = np.random.default_rng(3)
    data = {k: rng.standard_normal(s) + (2.0 if k == "c" else 0.0) for k, s in shapes.items()}
    want_out, want = ref.evaluate({}, data, output_gradients={"y": np.ones_like(ref.evaluate({}, data)["y"])})
    got_out, got = pm.evaluate({}, data, output_gradients={"y": np.ones_like(want_out["y"])})
    np.testing.assert_allclose(got_out["y"], want_out["y"], rtol=1e-12, atol=1e-12)
    _compare_gradients(want, got, 1e-10)


@pytest.mark.parametrize("opset", [6, 17])
def test_clip_backward_in_c_equals_numpy_at_the_bounds(opset):
    """Clip-6 (attribute bounds, NumPy's rule: x within [min, max]) and Clip-11+ (scalar bound inputs,
    constant and data; the gradient stays where y is neither bound, the data bound's is the sum where y is
    it), inputs landing exactly on the bounds:
    MobileNetV2's ReLU6 trains without a NumPy step."""
    if opset < 11:
        nodes = [helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)]
        inputs, inits = [("x", [3, 4])], []
    else:
        nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
        inputs, inits = [("x", [3, 4]), ("hi", [])], [numpy_helper.from_array(np.array(-0.5), "lo")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], inits)
    model = ml.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))
    ref = ml.compile(model, ml.NumpyBackend(dtype=ml.float64), data_keys={n for n, _ in inputs})
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)
        pm = ml.compile(model, ml.CBackend(dtype=ml.float64), data_keys={n for n, _ in inputs})
    assert "mt_grad_clip_f64(" in pm.backward.source
    x = np.array([[-1.0, -0.5, -0.25, 0.0], [0.25, 0.5, 0.75, -0.5], [0.5, 1.5, -2.0, 0.1]])
    data = {"x": x, "hi": np.array(0.5)} if opset >= 11 else {"x": x}
    cot = {"y": np.arange(1.0, 13.0).reshape(3, 4)}
    want_out, want = ref.evaluate({}, data, output_gradients=cot)
    got_out, got = pm.evaluate({}, data, output_gradients=cot)
    np.testing.assert_array_equal(got_out["y"], want_out["y"])
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert np.count_nonzero(got["x"]) == (8 if opset < 11 else 4)  # the bounds themselves pass or not


# -- sanitizers ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_lenet_training_step_runs_clean_under_address_and_undefined_sanitizers(tmp_path):
    """The training step's C (forward and backward in one segment) built with
    -fsanitize=address,undefined into a program that gives every buffer its own exact-size
    allocation; its gradients equal the in-process run's."""
    cc = shutil.which("cc") or shutil.which("gcc")
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
    probe = tmp_path / "p.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run([cc, *sanitize, str(probe), "-o", str(tmp_path / "p")], capture_output=True).returncode:
        pytest.skip(f"{cc} cannot build with -fsanitize=address,undefined (no sanitizer runtime)")
    pm = _trainer(models_zoo.lenet(num_classes=10), ml.CBackend(), {"input": [2, 1, 32, 32], "target": [2]})
    prog = pm.backward
    (seg,) = prog.steps  # one C segment: nothing runs on NumPy
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal((2, 1, 32, 32)).astype(np.float32), "target": np.array([3, 7])}
    _, grads = prog.run(params, data, {"loss": np.ones((), np.float32)})
    values = {**{v: params[v.name] if v.kind == "param" else data[v.name] for v in prog.plan.inputs},
              **{v: params[v.name] for v in prog.plan.params}}
    values.update({cv: (np.ones if v.name == "loss" else np.zeros)(cv.static_shape, cv.dtype)
                   for v, cv in prog.cotangent_values.items()})  # as run() fills them: the loss's given
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "int seg0(void *const *io, char *arena);",
             "static void *load(const char *path, size_t n) {", "    void *p = malloc(n ? n : 1);",
             "    FILE *f = fopen(path, \"rb\");", "    if (!f || fread(p, 1, n, f) != n) exit(3);", "    fclose(f);",
             "    return p;", "}", "int main(void) {", f"    void *io[{len(seg.inputs) + len(seg.outputs)}];"]
    for i, v in enumerate(seg.inputs):
        a = np.ascontiguousarray(prog.read(v, values), dtype=v.dtype).reshape(v.static_shape)
        a.tofile(tmp_path / f"in{i}.bin")
        lines.append(f"    io[{i}] = load(\"{tmp_path / f'in{i}.bin'}\", {a.nbytes});")
    sizes = [int(np.prod(v.static_shape)) * v.dtype.itemsize for v in seg.outputs]
    for j, n in enumerate(sizes):
        lines.append(f"    io[{len(seg.inputs) + j}] = malloc({max(n, 1)});")
    lines += [f"    char *arena = aligned_alloc(64, {-(-max(prog.arena_bytes, 1) // 64) * 64});",
              "    if (seg0(io, arena)) return 2;"]
    for j, n in enumerate(sizes):
        lines.append(f"    {{ FILE *f = fopen(\"{tmp_path / f'out{j}.bin'}\", \"wb\"); "
                     f"fwrite(io[{len(seg.inputs) + j}], 1, {n}, f); fclose(f); }}")
    lines += ["    return 0;", "}"]
    (tmp_path / "main.c").write_text("\n".join(lines) + "\n")
    (tmp_path / "step.c").write_text(prog.source)
    built = subprocess.run([cc, "-O1", "-g", "-std=c11", *sanitize, f"-I{build.LIB_DIR}", str(tmp_path / "step.c"),
                            str(tmp_path / "main.c"), "-lm", "-o", str(tmp_path / "step")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    done = subprocess.run([str(tmp_path / "step")], capture_output=True, text=True,
                          env={"ASAN_OPTIONS": "detect_leaks=0", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    names = {gv: name for name, gv in prog.grad_values.items()}
    checked = 0
    for j, v in enumerate(seg.outputs):
        if v in names:
            got = np.fromfile(tmp_path / f"out{j}.bin", dtype=v.dtype).reshape(v.static_shape)
            np.testing.assert_allclose(got, grads[names[v]], rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked == len(grads) == 11


def test_dropout_training_backward_in_c():
    """Dropout-13 in training mode (its random forward on NumPy's generator, seeded): the backward
    in C passes the cotangent where an element was kept, scaled by 1 / (1 - ratio)."""
    consts = [helper.make_node("Constant", [], ["ratio"], value=helper.make_tensor("r", TensorProto.FLOAT, [], [0.25])),
              helper.make_node("Constant", [], ["train"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True]))]
    model = _graph(consts + [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop", seed=3)],
                   [("x", [4, 6])], "y", opset=13)
    ref = ml.compile(model, ml.NumpyBackend(), shapes={"x": (4, 6)}, data_keys={"x"}, trainable_keys=set())
    with pytest.warns(CFallbackWarning, match=r"^CBackend: 1 node\(s\) run on NumPy \(no C kernel\): drop "):
        pm = ml.compile(model, ml.CBackend(), shapes={"x": (4, 6)}, data_keys={"x"}, trainable_keys=set())
    assert "mt_grad_dropout_f32(" in pm.backward.source and not pm.backward.fallback
    x = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32) + 3
    g = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    want_out, want = ref.evaluate({}, {"x": x}, output_gradients={"y": g})
    got_out, got = pm.evaluate({}, {"x": x}, output_gradients={"y": g})
    np.testing.assert_array_equal(got_out["y"] != 0, want_out["y"] != 0)  # the same seeded mask
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-6)
    np.testing.assert_allclose(got["x"], np.where(got_out["y"] != 0, g / 0.75, 0), rtol=1e-6)
