"""The compile pipeline: version resolution, schema defaults, shape folding, generated code."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.registry import KernelRegistry, make_spec

from tests.conftest import make_model


def test_registry_takes_newest_since_not_above_opset():
    reg = KernelRegistry()
    for since in (1, 13, 18):
        reg.register("*", make_spec(lambda x, s=since: s, "Op", "", since))
    assert reg.resolve("Op", 12).since == 1
    assert reg.resolve("Op", 13).since == 13
    assert reg.resolve("Op", 17).since == 13
    assert reg.resolve("Op", 25).since == 18
    assert reg.resolve("Other", 25) is None
    reg.register("jax", make_spec(lambda x: x, "Op", "", 13))
    assert reg.resolve("Op", 20, backend="jax").since == 18  # a newer shared kernel wins over an older override
    assert reg.resolve("Op", 17, backend="jax").fn is not reg.resolve("Op", 17).fn


def test_schema_default_attributes_are_passed():
    # LeakyRelu's alpha defaults to 0.01 in the schema; the node does not set it.
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [2])],
                       [("y", TensorProto.FLOAT, [2])])
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    # ONNX FLOAT attributes are float32: the default arrives as float32(0.01) exactly.
    assert f"alpha={float(np.float32(0.01))!r}" in pm.code
    out = pm.evaluate(None, {"x": np.array([-1.0, 2.0], np.float32)})["y"]
    np.testing.assert_allclose(out, [-0.01, 2.0], rtol=1e-6)


def test_opset_selects_semantics():
    # Softmax before opset 13 flattens to 2-D from `axis`; from 13 it normalises along `axis` only.
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    results = {}
    for opset in (11, 13):
        model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", TensorProto.FLOAT, [1, 2, 3])],
                           [("y", TensorProto.FLOAT, [1, 2, 3])], opset=opset)
        results[opset] = ml.compile(ml.load_onnx(model), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    assert results[11].sum() == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(results[13].sum(axis=1), np.ones((1, 3)), rtol=1e-5)


def _shape_subgraph_model():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "W"], ["y"], name="proj"),
    ]
    inits = {"zero": np.array(0, np.int64), "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
             "W": np.ones((12, 5), np.float32)}
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 3, 4])], [("y", TensorProto.FLOAT, ["N", 5])], inits)


def test_shape_subgraph_folds_when_shapes_are_given():
    model = ml.load_onnx(_shape_subgraph_model())
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"x": [2, 3, 4]})
    import re

    assert not re.search(r"\b(shape|gather|concat|unsqueeze)_\d", pm.code)
    assert pm.code.count("# ") == 2  # Reshape and MatMul remain, one line each
    out = pm.evaluate(None, {"x": np.ones((2, 3, 4), np.float32)})["y"]
    np.testing.assert_array_equal(out, np.full((2, 5), 12.0, np.float32))
    assert list(pm.get_parameters()) == ["W"]


def test_constant_powers_become_multiplies_and_sqrt():
    exps = {"e2": np.float32(2.0), "e3": np.array([3.0], np.float32), "e05": np.float64(0.5), "e4": np.float32(4.0)}
    nodes = [helper.make_node("Pow", ["x", e], [f"y_{e}"], name=f"pow_{e}") for e in exps]
    nodes.append(helper.make_node("Pow", ["x", "x"], ["y_x"], name="pow_data"))
    outs = [(f"y_{e}", TensorProto.FLOAT, [2, 3]) for e in exps] + [("y_x", TensorProto.FLOAT, [2, 3])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3])], outs, exps)
    x = np.random.default_rng(0).uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), constant_keys=set(exps))
    code = pm.code
    assert "pow_e2/Mul" in code and code.count("pow_e3/Mul") == 2 and "pow_e05/Sqrt" in code
    assert "'pow_e4'" in code and "'pow_data'" in code  # other exponents and data exponents stay Pow
    out = pm.evaluate({}, {"x": x})
    for e, v in exps.items():
        np.testing.assert_allclose(out[f"y_{e}"], x ** np.float32(np.asarray(v).reshape(-1)[0]), rtol=1e-6)
    # A trainable exponent is a parameter, not a constant: it keeps its Pow (and its gradient).
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    assert "pow_e2/Mul" not in pm.code


@pytest.mark.parametrize("name", ["numpy", "jax", "torch", "mlx"])
def test_matmul_plus_bias_fuses_into_one_node(name):
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((4, 5)), rng.standard_normal(5)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj/MatMul"),
             helper.make_node("Add", ["B", "h"], ["y"], name="proj/Add"),
             helper.make_node("MatMul", ["x", "W"], ["h2"], name="shared/MatMul"),
             helper.make_node("Add", ["h2", "B"], ["z"], name="shared/Add"),
             helper.make_node("Relu", ["h2"], ["r"], name="reads_h2")]
    dtype = ml.float32 if name == "mlx" else ml.float64
    elem = TensorProto.FLOAT if name == "mlx" else TensorProto.DOUBLE
    model = make_model(nodes, [("x", elem, ["N", 3, 4])], [("y", elem, ["N", 3, 5]), ("z", elem, ["N", 3, 5]),
                                                            ("r", elem, ["N", 3, 5])],
                       {"W": w.astype(dtype.numpy), "B": b.astype(dtype.numpy)})
    backend = getattr(ml, {"numpy": "NumpyBackend", "jax": "JaxBackend", "torch": "TorchBackend",
                           "mlx": "MlxBackend"}[name])(dtype=dtype)
    pm = ml.compile(ml.load_onnx(model), backend)  # leading dims symbolic: fuses all the same
    assert "MatMulAdd 'proj/Add'" in pm.code and "'proj/MatMul'" not in pm.code
    assert "'shared/MatMul'" in pm.code  # its product has a second reader: no fusion
    x = rng.standard_normal((2, 3, 4)).astype(dtype.numpy)
    g = {"y": np.ones((2, 3, 5)), "z": np.zeros((2, 3, 5)), "r": np.zeros((2, 3, 5))}
    out, grads = pm.evaluate(None, {"x": backend.from_numpy(x)},
                             output_gradients={k: backend.from_numpy(v.astype(dtype.numpy)) for k, v in g.items()})
    tol = dict(rtol=1e-5, atol=1e-5) if name == "mlx" else dict(rtol=1e-12)
    np.testing.assert_allclose(backend.to_numpy(out["y"]), x @ w + b, **tol)
    # y's cotangent reaches W through both the fused and the unfused path only via y: x^T 1 and 1 per row
    np.testing.assert_allclose(backend.to_numpy(grads["W"]), x.reshape(-1, 4).T @ np.ones((6, 5)), **tol)
    np.testing.assert_allclose(backend.to_numpy(grads["B"]), np.full(5, 6.0), **tol)


def test_symbolic_dims_run_at_several_batch_sizes():
    pm = ml.compile(ml.load_onnx(_shape_subgraph_model()), ml.NumpyBackend())
    assert " shape_" in pm.code  # not folded: the batch is symbolic
    for n in (1, 5):
        assert pm.evaluate(None, {"x": np.ones((n, 3, 4), np.float32)})["y"].shape == (n, 5)


def test_generated_code_frees_values_and_is_written(tmp_path, conv_model):
    path = tmp_path / "forward.py"
    pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(), file_path=str(path))
    assert path.read_text() == pm.code
    lines = pm.code.splitlines()
    assert lines[0] == "def forward(params, data):"
    assert sum("# " in line for line in lines) == 4  # one line per node
    assert any(line.strip().startswith("del ") for line in lines)


def test_parameters_roundtrip_and_randomize(conv_model):
    pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend())
    params = pm.get_parameters()
    assert list(params) == ["W"] and params["W"].shape == (8, 4, 3, 3) and params["W"].dtype == np.float32
    fresh = pm.randomize_params()
    assert fresh["W"].shape == params["W"].shape and fresh["W"].dtype == np.float32
    assert not np.allclose(fresh["W"], params["W"])
    x = np.ones((1, 4, 8, 8), np.float32)
    assert not np.allclose(pm.evaluate(fresh, {"x": x})["y"], pm.evaluate(params, {"x": x})["y"])


def test_load_from_path_bytes_and_proto(tmp_path, conv_model):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(conv_model, path)
    x = np.ones((1, 4, 8, 8), np.float32)
    outs = [ml.compile(ml.load_onnx(src), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
            for src in (path, str(path), conv_model.SerializeToString(), conv_model)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_old_opset_model_runs():
    # Opset 7: Upsample and BatchNormalization of that era.
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
        helper.make_node("Upsample", ["bn"], ["y"], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest"),
    ]
    c = np.ones(2, np.float32)
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 2, 2, 2])], [("y", TensorProto.FLOAT, [1, 2, 4, 4])],
                       {"s": c, "b": 0 * c, "m": 0 * c, "v": c}, opset=7, ir_version=3)
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    y = ml.compile(ml.load_onnx(model), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    expected = x / np.sqrt(1 + 1e-5)
    np.testing.assert_allclose(y, expected.repeat(2, axis=2).repeat(2, axis=3), rtol=1e-6)


def test_model_local_function_is_inlined():
    import onnx

    fn = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                    helper.make_opsetid("local", 1)], ir_version=10)
    onnx.checker.check_model(model)
    y = ml.compile(ml.load_onnx(model), ml.NumpyBackend()).evaluate(None, {"x": np.ones(3, np.float32)})["y"]
    np.testing.assert_array_equal(y, [2, 2, 2])


def test_if_reads_outer_scope_values():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                       [("c", TensorProto.BOOL, []), ("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(pm.evaluate(None, {"c": np.array(True), "x": x})["y"], 2 * x)
    np.testing.assert_array_equal(pm.evaluate(None, {"c": np.array(False), "x": x})["y"], -x)


def test_sparse_constant_is_densified():
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [2], [5.0, 6.0]),
                                       helper.make_tensor("i", TensorProto.INT64, [2], [1, 4]), [2, 3])
    model = make_model([helper.make_node("Constant", [], ["y"], sparse_value=sparse)], [],
                       [("y", TensorProto.FLOAT, [2, 3])], opset=13)
    y = ml.compile(ml.load_onnx(model), ml.NumpyBackend()).evaluate(None, {})["y"]
    np.testing.assert_array_equal(y, [[0, 5, 0], [0, 6, 0]])


def test_outputs_are_owned_arrays():
    # Expand returns a broadcast view internally; the caller still gets a writable array of its own.
    model = make_model([helper.make_node("Expand", ["x", "shape"], ["y"])], [("x", TensorProto.FLOAT, [1, 3])],
                       [("y", TensorProto.FLOAT, [2, 3])], {"shape": np.array([2, 3], np.int64)})
    x = np.ones((1, 3), np.float32)
    y = ml.compile(ml.load_onnx(model), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    y[0, 0] = 7.0
    assert x[0, 0] == 1.0 and y[1, 0] == 1.0


def test_numpy_thread_cap_applies_inside_the_program_only(conv_model):
    from threadpoolctl import threadpool_info

    from mithril.backends.registry import REGISTRY, override

    seen = []

    @override("numpy", "Sigmoid", since=13)
    def spy_sigmoid(x, *, xp):
        seen.append([p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"])
        return 1 / (1 + xp.exp(-x))

    try:
        pm = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend(num_threads=1))
        x = np.ones((1, 4, 8, 8), np.float32)
        capped = pm.evaluate(None, {"x": x})["y"]
    finally:
        REGISTRY.unregister("numpy", "Sigmoid", 13)
    assert seen and all(n == 1 for n in seen[0])
    free = ml.compile(ml.load_onnx(conv_model), ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    np.testing.assert_allclose(capped, free, rtol=1e-6)


def test_batchnorm_statistics_are_buffers():
    # Running mean/var are statistics: not trained by default, and randomize_params keeps them.
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["y"])]
    c = np.ones(2, np.float32)
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 1, 3, 3])], [("y", TensorProto.FLOAT, [1, 2, 3, 3])],
                       {"W": np.ones((2, 1, 1, 1), np.float32), "s": c, "b": 0 * c, "mean": 0 * c, "var": c})
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    assert pm.buffer_keys == {"mean", "var"}
    assert pm.trainable_keys == {"W", "s", "b"}
    for _ in range(5):
        params = pm.randomize_params()
        np.testing.assert_array_equal(params["var"], c)
        assert np.all(np.isfinite(pm.evaluate(params, {"x": np.ones((1, 1, 3, 3), np.float32)})["y"]))


def test_frontend_batchnorm_buffers_survive_randomize():
    from mithril.models import BatchNorm2D, Model

    model = Model()
    model |= BatchNorm2D()(input="input", output="output")
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"input": [2, 3, 4, 4]})
    assert pm.buffer_keys and not (pm.buffer_keys & pm.trainable_keys)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    assert np.all(np.isfinite(pm.evaluate(pm.randomize_params(), {"input": x})["output"]))


def test_jit_blockers_are_named_and_numpy_never_warns():
    import warnings

    from mithril.compile import JitFallbackWarning

    nodes = [helper.make_node("RandomNormalLike", ["x"], ["r"], name="noise"), helper.make_node("Add", ["x", "r"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])])
    with warnings.catch_warnings():
        warnings.simplefilter("error", JitFallbackWarning)
        ml.compile(ml.load_onnx(model), ml.NumpyBackend())  # nothing to jit, nothing to warn about
    jax_backend = getattr(ml, "JaxBackend", None)
    if jax_backend is None:
        pytest.skip("JAX not installed: the warning is only given by a jitting backend")
    with pytest.warns(JitFallbackWarning, match=r"noise \(RandomNormalLike: random draws\)"):
        pm = ml.compile(ml.load_onnx(model), jax_backend())
    x = np.zeros(3, np.float32)
    a, b = (np.asarray(pm.evaluate(None, {"x": x})["y"]) for _ in range(2))
    assert not np.array_equal(a, b)  # fresh draws each call, not one baked into a trace


def test_missing_gradient_rule_is_found_at_compile_and_raised_on_gradient_request():
    # NumPy has no VJP rule for Det: forward works, and the gradient request names the node.
    # A model compiled to train (with a loss) fails at compile instead.
    from mithril.errors import MithrilError

    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Det", ["h"], ["y"], name="det_node")]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [2, 2])], [("y", TensorProto.FLOAT, [])],
                       {"W": np.eye(2, dtype=np.float32)})
    pm = ml.compile(ml.load_onnx(model), ml.NumpyBackend())
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_allclose(pm.evaluate(None, {"x": x})["y"], -2.0, rtol=1e-5)
    if pm.gradient_error is None:
        pytest.skip("the NumPy backend has a Det rule now; pick another op without one")
    with pytest.raises(MithrilError, match="det_node"):
        pm.evaluate(None, {"x": x}, output_gradients={"y": np.ones((), np.float32)})
