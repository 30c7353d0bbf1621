"""Custom ops (issue 17, Must 2): kernels registered for a domain of the user's, on one backend or on
all, used from composed models (``ml.CustomOp``) and from loaded files, with clear errors where a
backend lacks the op. Every registration here is undone after its test (``ml.scoped_ops``)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril import errors
from mithril.backends import custom_ops
from mithril.backends.registry import CUSTOM_DOMAIN, REGISTRY, kernel, override
from mithril.backends.vjp import RULES, vjp_rule

ROOT = Path(__file__).resolve().parents[2]
W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
X = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 2


@pytest.fixture(autouse=True)
def _isolated():
    """Registrations a test makes do not reach the next one."""
    with ml.scoped_ops():
        yield
    assert not REGISTRY.where("Swish", "com.example") and not RULES.where("Swish", "com.example")


def swish_file(opset_version: int = 1) -> onnx.ModelProto:
    """MatMul by an initializer, then com.example::Swish(beta=1.5): a file a user's exporter wrote."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Swish", ["h"], ["y"], domain="com.example", name="swish", beta=1.5)]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              initializer=[numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.example", opset_version)])


def swish_reference(x=X, beta=1.5):
    h = x @ W
    s = 1 / (1 + np.exp(-beta * h))
    y = h * s
    dw = x.T @ (s + beta * h * s * (1 - s))  # d(sum y)/dw
    return y, dw


def swish_vjp(g, h, *, beta, needs):
    s = 1 / (1 + np.exp(-beta * h))
    return (g * (s + beta * h * s * (1 - s)) if needs[0] else None,)


def _framework_swish(name):
    """Swish written in each framework itself, as a user of that backend would."""
    if name == "numpy":
        return lambda h, *, beta: h / (1 + np.exp(-beta * h))
    if name == "jax":
        jax = pytest.importorskip("jax", reason="the JAX backend needs jax")
        return lambda h, *, beta: h * jax.nn.sigmoid(beta * h)
    if name == "torch":
        torch = pytest.importorskip("torch", reason="the Torch backend needs torch")
        return lambda h, *, beta: h * torch.sigmoid(beta * h)
    mx = pytest.importorskip("mlx.core", reason="the MLX backend needs mlx")
    return lambda h, *, beta: h * mx.sigmoid(beta * h)


BACKENDS = {"numpy": "NumpyBackend", "jax": "JaxBackend", "torch": "TorchBackend", "mlx": "MlxBackend"}


def _run(model, backend, params=None, x=X, **kw):
    pm = ml.compile(model, backend, **kw)
    out, grads = pm.evaluate(params or {}, {"x": backend.array(x)}, output_gradients={"y": backend.ones(2, 4)})
    return np.asarray(backend.to_numpy(out["y"])), {k: np.asarray(backend.to_numpy(v)) for k, v in grads.items()}


# -- loaded files carrying custom nodes --------------------------------------------------------------
@pytest.mark.parametrize("name", list(BACKENDS))
def test_loaded_file_runs_and_differentiates_on_each_backend(name):
    """register_op on the backend's class, in its framework; NumPy has no autodiff and takes the
    op's gradient rule (vjp=); JAX, Torch and MLX differentiate the function themselves."""
    fn = _framework_swish(name)
    cls = getattr(ml, BACKENDS[name])
    cls.register_op("Swish", fn, domain="com.example", vjp=swish_vjp if name == "numpy" else None)
    y, grads = _run(ml.load_onnx(swish_file()), cls())
    ref_y, ref_dw = swish_reference()
    np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["w"], ref_dw, rtol=1e-4, atol=1e-5)


def test_one_shared_kernel_over_xp_runs_on_every_backend():
    """ml.register_op without a backend: one function over xp for all four backends."""

    @ml.register_op("Swish", domain="com.example")
    def swish(h, *, beta=1.0, xp):
        return h / (1 + xp.exp(-beta * h))

    assert REGISTRY.where("Swish", "com.example") == ["*"]
    ref_y, ref_dw = swish_reference()
    for name, cls_name in BACKENDS.items():
        if name == "numpy":
            backend = ml.NumpyBackend()
            y = np.asarray(ml.compile(ml.load_onnx(swish_file()), backend).evaluate({}, {"x": X})["y"])
        else:
            pytest.importorskip({"jax": "jax", "torch": "torch", "mlx": "mlx.core"}[name], reason=f"{cls_name} needs it")
            y, grads = _run(ml.load_onnx(swish_file()), getattr(ml, cls_name)())
            np.testing.assert_allclose(grads["w"], ref_dw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)


def test_numpy_gradient_without_a_rule_says_how_to_give_one():
    ml.NumpyBackend.register_op("Swish", _framework_swish("numpy"), domain="com.example")
    pm = ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    np.testing.assert_allclose(pm.evaluate({}, {"x": X})["y"], swish_reference()[0], rtol=1e-6)
    with pytest.raises(ml.backends.vjp.NoGradientRuleError) as info:
        pm.evaluate({}, {"x": X}, output_gradients={"y": np.ones((2, 4), np.float32)})
    msg = str(info.value)
    assert "node 'swish': op com.example::Swish (opset 1)" in msg
    assert "com.example::Swish is a custom op" in msg
    assert "register_op('Swish', fn, domain='com.example', vjp=rule)" in msg
    assert "@vjp_rule('Swish', domain='com.example')" in msg


def test_vjp_rule_decorator_gives_numpy_its_gradient():
    """The long form of vjp=: @vjp_rule for the domain, beside a shared @kernel."""
    kernel("Swish", domain="com.example")(lambda h, *, beta, xp: h / (1 + xp.exp(-beta * h)))
    vjp_rule("Swish", domain="com.example")(swish_vjp)
    y, grads = _run(ml.load_onnx(swish_file()), ml.NumpyBackend())
    np.testing.assert_allclose(grads["w"], swish_reference()[1], rtol=1e-5)


def test_domain_version_picks_the_newest_kernel_not_newer_than_the_file():
    ml.register_op("Swish", lambda h, *, beta: h, domain="com.example", since=1)
    ml.register_op("Swish", lambda h, *, beta: 2 * h, domain="com.example", since=3)
    h = X @ W
    for version, want in ((1, h), (2, h), (3, 2 * h), (7, 2 * h)):
        pm = ml.compile(ml.load_onnx(swish_file(version)), ml.NumpyBackend())
        np.testing.assert_allclose(pm.evaluate({}, {"x": X})["y"], want, rtol=1e-6)


def test_kernel_newer_than_the_files_domain_version_is_named():
    ml.register_op("Swish", lambda h, *, beta: h, domain="com.example", since=2)
    with pytest.raises(errors.UnsupportedOpsError) as info:
        ml.compile(ml.load_onnx(swish_file(1)), ml.NumpyBackend())
    assert "backend 'numpy' has no kernel for 1 node(s):\n  swish: com.example::Swish (opset 1)" in str(info.value)


# -- errors ----------------------------------------------------------------------------------------
def test_unregistered_domain_names_node_op_opset_backend_and_the_fix():
    with pytest.raises(errors.UnsupportedDomainError) as info:
        ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    assert str(info.value) == (
        "unsupported domain(s) com.example on backend 'numpy'; 1 node(s) use them:\n"
        "  swish: com.example::Swish (opset 1)\n"
        "register a kernel (docs/custom_ops.md): ml.NumpyBackend.register_op('Swish', fn, domain='com.example') "
        "for this backend, in its framework, or ml.register_op('Swish', fn, domain='com.example') for every "
        "backend, over xp")
    assert isinstance(info.value, ml.MithrilError)


def test_op_registered_for_another_backend_only_is_named():
    """Registered for JAX only, compiled on Torch (and NumPy): the error says where it is."""
    ml.JaxBackend.register_op("Swish", lambda h, *, beta: h, domain="com.example")
    with pytest.raises(errors.UnsupportedDomainError) as info:
        ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    msg = str(info.value)
    assert "  swish: com.example::Swish (opset 1); registered for jax only" in msg
    assert "ml.NumpyBackend.register_op('Swish', fn, domain='com.example')" in msg
    # The domain known on this backend through another op: the op itself is what is missing.
    ml.NumpyBackend.register_op("Other", lambda h: h, domain="com.example")
    with pytest.raises(errors.UnsupportedOpsError) as info:
        ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    msg = str(info.value)
    assert msg.startswith("backend 'numpy' has no kernel for 1 node(s):\n"
                          "  swish: com.example::Swish (opset 1); registered for jax only\nregister a kernel")


def test_torch_compile_of_a_jax_only_op_names_jax():
    pytest.importorskip("torch", reason="the Torch backend needs torch")
    ml.JaxBackend.register_op("Swish", lambda h, *, beta: h, domain="com.example")
    with pytest.raises(errors.UnsupportedDomainError,
                       match=r"(?s)on backend 'torch'.*registered for jax only\n.*ml\.TorchBackend\.register_op"):
        ml.compile(ml.load_onnx(swish_file()), ml.TorchBackend())


def test_unknown_standard_op_gets_no_custom_hint():
    node = helper.make_node("NotAnOnnxOp", ["x"], ["y"], name="mystery")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(errors.UnsupportedOpsError) as info:
        ml.compile(ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])),
                   ml.NumpyBackend())
    assert str(info.value) == "backend 'numpy' has no kernel for 1 node(s):\n  mystery: NotAnOnnxOp (opset 17)"


def test_accidental_duplicate_of_a_builtin_names_both_definitions():
    """The old README block: Softmax-13 registered again without saying so."""
    with pytest.raises(errors.KernelRegistrationError) as info:
        @kernel("Softmax", since=13)
        def softmax(x, *, axis, xp):
            return x
    msg = str(info.value)
    assert msg.startswith("kernel Softmax-13 registered twice for every backend: first "
                          "mithril.backends.kernels.reduce.softmax at mithril/backends/kernels/reduce.py:")
    assert f"again {__name__}.test_accidental_duplicate_of_a_builtin_names_both_definitions.<locals>.softmax at " in msg
    assert "tests/backends/test_custom_ops.py:" in msg and "pass replace=True to replace it on purpose" in msg
    ml.NumpyBackend()  # its overrides are registered when the first one is made
    with pytest.raises(errors.KernelRegistrationError, match="kernel Erf-9 registered twice for backend 'numpy'"):
        override("numpy", "Erf", since=9)(lambda x, *, xp: x)
    with pytest.raises(errors.KernelRegistrationError, match="kernel Relu-6 registered twice"):
        ml.register_op("Relu", lambda x, *, xp: x, domain="", since=6)


def test_replace_true_replaces_a_builtin_and_scoped_ops_brings_it_back():
    builtin = REGISTRY.resolve("Relu", 14)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    with ml.scoped_ops():
        kernel("Relu", since=6, replace=True)(lambda x, *, xp: xp.abs(x))
        assert REGISTRY.versions("Relu") == [6]
        assert REGISTRY.resolve("Relu", 14) is not builtin
        np.testing.assert_array_equal(ml.compile(model, ml.NumpyBackend()).evaluate({}, {"x": x})["y"], [1, 0, 2])
    assert REGISTRY.resolve("Relu", 14) is builtin
    np.testing.assert_array_equal(ml.compile(model, ml.NumpyBackend()).evaluate({}, {"x": x})["y"], [0, 0, 2])


def test_register_op_replaces_its_own_earlier_registration():
    """A re-run notebook cell: the second register_op of the same op wins, without an error."""
    ml.NumpyBackend.register_op("Swish", lambda h, *, beta: h, domain="com.example")
    ml.NumpyBackend.register_op("Swish", lambda h, *, beta: 3 * h, domain="com.example")
    assert len(REGISTRY.entries("Swish", "com.example", "numpy")) == 1
    y = ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend()).evaluate({}, {"x": X})["y"]
    np.testing.assert_allclose(y, 3 * (X @ W), rtol=1e-6)
    # ...but an @override of it is a second definition, refused unless replace=True.
    with pytest.raises(errors.KernelRegistrationError, match="com.example::Swish-1 registered twice for backend 'numpy'"):
        override("numpy", "Swish", domain="com.example")(lambda h, *, beta: h)
    override("numpy", "Swish", domain="com.example", replace=True)(lambda h, *, beta: -h)


@pytest.mark.parametrize("call, message", [
    (lambda: ml.register_op("", lambda x: x), "an op's name is a non-empty string, not ''"),
    (lambda: ml.register_op("f", lambda x: x, since=0), "since= is the domain's opset version"),
    (lambda: ml.register_op("f", lambda x: x, domain=3), "domain= is a string such as 'mithril.custom'"),
    (lambda: ml.register_op("f", lambda x: x, backend="bogus"),
     "backend='bogus' is not a backend; valid names: numpy, jax, torch, mlx"),
    (lambda: ml.register_op("f", "not a function"), "register_op('f') registers a function, not 'not a function'"),
    (lambda: ml.register_op("f", lambda x: x, shape=1), "register_op('f') has no option(s) shape"),
    (lambda: ml.register_op("f", lambda x: x, output_shapes=3), "output_shapes= is a function, not 3"),
    (lambda: ml.unregister_op("never_registered"), "no shared kernel of mithril.custom::never_registered"),
    (lambda: ml.unregister_op("Relu", domain=""), "kernel Relu-6 is Mithril's own (mithril/backends/kernels/"),
])
def test_registration_arguments_are_checked(call, message):
    with pytest.raises(errors.KernelRegistrationError) as info:
        call()
    assert message in str(info.value)


# -- registration forms and isolation ------------------------------------------------------------
def test_registration_forms_land_in_the_right_table():
    backend = ml.NumpyBackend()

    @backend.register_op("a")  # the design's form: a decorator on an instance
    def a(x):
        return x

    ml.NumpyBackend.register_op("b", lambda x: x)  # a call on the class
    ml.register_op("c", lambda x, *, xp: x)  # every backend
    ml.register_op("d", lambda x: x, backend="jax")  # one backend by name
    kernel("e", domain=CUSTOM_DOMAIN)(lambda x, *, xp: x)  # the registry's own forms
    override("torch", "f", domain="com.example")(lambda x: x)
    assert a.__name__ == "a"  # the decorator returns the function
    assert [REGISTRY.where(op, CUSTOM_DOMAIN) for op in "abcde"] == [["numpy"], ["numpy"], ["*"], ["jax"], ["*"]]
    assert REGISTRY.where("f", "com.example") == ["torch"]
    assert CUSTOM_DOMAIN in REGISTRY.domains("numpy") and "com.example" not in REGISTRY.domains("numpy")


def test_unregister_op_and_scoped_ops_undo_registrations():
    ml.NumpyBackend.register_op("Swish", lambda h, *, beta: h, domain="com.example", vjp=swish_vjp)
    assert RULES.where("Swish", "com.example") == ["*"]
    ml.NumpyBackend.unregister_op("Swish", domain="com.example")
    assert REGISTRY.where("Swish", "com.example") == [] and RULES.where("Swish", "com.example") == []
    with pytest.raises(errors.UnsupportedDomainError):
        ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    with ml.scoped_ops():
        ml.register_op("Swish", lambda h, *, beta, xp: h, domain="com.example")
        ml.compile(ml.load_onnx(swish_file()), ml.NumpyBackend())
    assert REGISTRY.where("Swish", "com.example") == []


def test_scoped_ops_keeps_mithrils_own_registrations_made_inside():
    """A backend's overrides first imported inside a scope (its first construction) stay."""
    (builtin,) = REGISTRY.entries("Erf", "", "numpy")
    with ml.scoped_ops():
        REGISTRY.unregister("numpy", "Erf", builtin.since)  # as if not imported yet...
        REGISTRY.register("numpy", builtin)  # ...then imported inside the scope
        ml.NumpyBackend.register_op("Erf", lambda x: x, domain="com.example")
    assert REGISTRY.entries("Erf", "", "numpy") == [builtin]
    assert REGISTRY.where("Erf", "com.example") == []


# -- composed models ---------------------------------------------------------------------------------
def swish_model(**block_options):
    model = ml.Model()
    model |= ml.Linear(dimension=4)(input="x", output="h")
    model += ml.CustomOp("Swish", domain="com.example", beta=1.5, **block_options)(input="h", output="y")
    return model


def test_composed_model_exports_a_custom_domain_node_and_round_trips():
    ml.register_op("Swish", lambda h, *, beta, xp: h / (1 + xp.exp(-beta * h)), domain="com.example", since=2)
    model = swish_model()
    model += ml.Relu()(input="y", output="out")
    assert model.shape_of("y") == model.shape_of("h") == "[...v, 4]"
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"x": [2, 3]})
    params = pm.get_parameters()
    direct = pm.evaluate(params, {"x": X})["out"]
    proto = ml.export_onnx(model, shapes={"x": [2, 3]}, params=params)
    onnx.checker.check_model(proto, full_check=True)
    (node,) = [n for n in proto.graph.node if n.domain]
    assert (node.domain, node.op_type, [(a.name, a.f) for a in node.attribute]) == ("com.example", "Swish", [("beta", 1.5)])
    assert {o.domain: o.version for o in proto.opset_import}["com.example"] == 2  # the kernel's since
    declared = {v.name: v for v in proto.graph.value_info}["y"]  # ONNX cannot infer past the node
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [2, 4]
    assert declared.type.tensor_type.elem_type == TensorProto.FLOAT
    loaded = ml.compile(ml.load_onnx(proto.SerializeToString()), ml.NumpyBackend())
    np.testing.assert_allclose(loaded.evaluate({}, {"x": X})["out"], direct, rtol=1e-6)
    w, b = params["linear_0.weight"], params["linear_0.bias"]
    h = X @ w.T + b
    np.testing.assert_allclose(direct, np.maximum(h / (1 + np.exp(-1.5 * h)), 0), rtol=1e-5)


def test_composed_model_differentiates_on_jax_and_torch():
    jax = pytest.importorskip("jax", reason="the JAX backend needs jax")
    torch = pytest.importorskip("torch", reason="the Torch backend needs torch")
    ml.JaxBackend.register_op("Swish", lambda h, *, beta: h * jax.nn.sigmoid(beta * h), domain="com.example")
    ml.TorchBackend.register_op("Swish", lambda h, *, beta: h * torch.sigmoid(beta * h), domain="com.example")
    model = swish_model()
    grads = []
    for backend in (ml.JaxBackend(), ml.TorchBackend()):
        pm = ml.compile(model, backend, shapes={"x": [2, 3]})
        params = {k: backend.array(v) for k, v in
                  {"linear_0.weight": W.T.copy(), "linear_0.bias": np.zeros(4, np.float32)}.items()}
        _, g = pm.evaluate(params, {"x": backend.array(X)}, output_gradients={"y": backend.ones(2, 4)})
        grads.append(np.asarray(backend.to_numpy(g["linear_0.weight"])))
    np.testing.assert_allclose(grads[0], swish_reference()[1].T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_custom_op_with_output_shapes_rule_several_inputs_and_outputs():
    """A registered output_shapes rule gives the block its shapes; two inputs and two outputs."""

    def rule(inputs, attributes):
        (a, dtype), (b, _) = inputs
        return [((a[0], a[1] + b[1]), dtype), ((a[0],), dtype)]

    @ml.register_op("JoinAndSum", output_shapes=rule)
    def join_and_sum(a, b, *, xp):
        joined = xp.concatenate([a, b], axis=1)
        return joined, xp.sum(joined, axis=1)

    model = ml.Model()
    model |= ml.CustomOp("JoinAndSum", inputs=("a", "b"), outputs=("joined", "total"))(
        a="a", b="b", joined="joined", total="total")
    a, b = np.ones((2, 3), np.float32), np.full((2, 2), 2.0, np.float32)
    pm = ml.compile(model, ml.NumpyBackend(), shapes={"a": [2, 3], "b": [2, 2]})
    out = pm.evaluate({}, {"a": a, "b": b})
    np.testing.assert_array_equal(out["total"], [7.0, 7.0])
    assert out["joined"].shape == (2, 5)
    proto = ml.export_onnx(model, shapes={"a": [2, 3], "b": [2, 2]})
    dims = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in proto.graph.output}
    assert dims == {"joined": [2, 5], "total": [2]}
    # A rule giving the wrong number of results is named at the line that makes the shapes known.
    bad = ml.Model()
    bad |= ml.CustomOp("JoinAndSum", inputs=("a", "b"), outputs=("joined",))(a="a", b="b", joined="joined")
    with pytest.raises(errors.ModelError, match=r"mithril.custom::JoinAndSum gave 2 result\(s\) for 1 output"):
        ml.compile(bad, ml.NumpyBackend(), shapes={"a": [2, 3], "b": [2, 2]})


def test_custom_op_block_arguments_are_checked():
    with pytest.raises(errors.ModelError, match="needs a domain of your own, not ''"):
        ml.CustomOp("Relu", domain="")
    with pytest.raises(errors.ModelError, match=r"\['x'\] is both an input and an output"):
        ml.CustomOp("f", inputs=("x",), outputs=("x",))
    with pytest.raises(errors.ModelError, match="an op's name is a non-empty string"):
        ml.CustomOp("")


def test_composed_model_without_the_kernel_names_the_block_node():
    model = swish_model()
    with pytest.raises(errors.UnsupportedDomainError, match=r"customop_0/Swish_node_\d+: com.example::Swish \(opset 1\)"):
        ml.compile(model, ml.NumpyBackend(), shapes={"x": [2, 3]})


# -- documentation -------------------------------------------------------------------------------------
def test_docs_custom_ops_in_short_runs_as_written(capsys):
    """docs/custom_ops.md's "In short" block is code users paste: it runs and prints what it says."""
    doc = (ROOT / "docs" / "custom_ops.md").read_text()
    block = doc[doc.index("## In short"):].split("```python", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/custom_ops.md#in-short", "exec"), {})
    expected = next(line[2:] for line in block.splitlines() if line.startswith("# ("))
    assert capsys.readouterr().out.strip() == expected


def test_docs_custom_ops_examples_run(capsys):
    """docs/custom_ops.md's Python blocks run in order, as one session."""
    pytest.importorskip("jax", reason="the page's JAX example needs jax")
    doc = (ROOT / "docs" / "custom_ops.md").read_text()
    scope: dict = {}
    for i, block in enumerate(doc.split("```python")[1:]):
        exec(compile(block.split("```", 1)[0], f"docs/custom_ops.md#{i}", "exec"), scope)


@pytest.mark.parametrize("module", ["mithril.backends.custom_ops", "mithril.frontend.custom_op",
                                    "mithril.backends.backend"])
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    finder = doctest.DocTestFinder()
    tests = [t for t in finder.find(mod) if t.examples and ("register_op" in t.name or "scoped_ops" in t.name
                                                            or "CustomOp" in t.name)]
    assert tests
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0
    assert custom_ops.register_op is ml.register_op
