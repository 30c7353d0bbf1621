"""Gelu written out as elementwise ops (BERT's exact form, GPT-2's tanh form) runs as one Gelu
kernel in TorchBackend's forward program (mithril/backends/passes/gelu.py), to the chain's values."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml

from tests.conftest import make_model

torch = pytest.importorskip("torch", reason="the Torch backend needs torch (pip install mithril[torch])")

F = TensorProto.FLOAT
SHAPE = [2, 3, 40]


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))


def _erf_gelu(scale="div", half="last", swap=False):
    """x -> x * 0.5 * (1 + erf(x / sqrt(2))) as BERT's export writes it, in one of its spellings."""
    pair = (lambda a, b: [b, a]) if swap else (lambda a, b: [a, b])
    nodes = [_const("s2", np.sqrt(2.0) if scale == "div" else 1 / np.sqrt(2.0)), _const("one", 1.0),
             _const("half", 0.5),
             helper.make_node("Div" if scale == "div" else "Mul", ["x", "s2"], ["z"]),
             helper.make_node("Erf", ["z"], ["e"]), helper.make_node("Add", pair("e", "one"), ["a"])]
    if half == "last":
        nodes += [helper.make_node("Mul", pair("x", "a"), ["m"]), helper.make_node("Mul", pair("m", "half"), ["y"])]
    else:
        nodes += [helper.make_node("Mul", pair("x", "half"), ["h"]), helper.make_node("Mul", pair("h", "a"), ["y"])]
    return nodes


def _tanh_gelu(cube=None):
    """GPT-2's gelu_new as its dynamo export writes it (constants as Constant nodes here); ``cube``:
    the nodes that make p (x^3) in place of Pow(x, 3)."""
    return [_const("half", 0.5), _const("three", 3.0), _const("cubic", 0.044715),
            _const("scale", np.sqrt(2 / np.pi)), _const("one", 1.0),
            helper.make_node("Mul", ["x", "half"], ["h"]),
            *(cube or [helper.make_node("Pow", ["x", "three"], ["p"])]),
            helper.make_node("Mul", ["p", "cubic"], ["c"]), helper.make_node("Add", ["x", "c"], ["s"]),
            helper.make_node("Mul", ["s", "scale"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["a"]), helper.make_node("Mul", ["h", "a"], ["y"])]


def _model(nodes, outputs=("y",), initializers=()):
    # A MatMul makes x a node's result, as the dense layer before BERT's activation does.
    w = np.random.default_rng(1).standard_normal((SHAPE[-1], SHAPE[-1])).astype(np.float32) / 6
    body = [helper.make_node("MatMul", ["input", "W"], ["x"])] + nodes
    return make_model(body, [("input", F, SHAPE)], [(o, F, None) for o in outputs], {"W": w, **dict(initializers)})


def _gelus(pm, backend):
    plan = backend.forward_plan(pm.plan)
    return [pn.kwargs["approximate"] for pn in plan.nodes if pn.op_type == "Gelu"], \
        sorted(pn.op_type for pn in plan.nodes if pn.op_type != "MatMul")


DATA = {"input": (np.random.default_rng(0).standard_normal(SHAPE) * 2).astype(np.float32)}


@pytest.mark.parametrize("nodes,approximate", [
    (_erf_gelu(), "none"), (_erf_gelu(scale="mul"), "none"), (_erf_gelu(half="first"), "none"),
    (_erf_gelu(swap=True), "none"), (_erf_gelu(scale="mul", half="first", swap=True), "none"),
    (_tanh_gelu(), "tanh"),
    (_tanh_gelu([helper.make_node("Mul", ["x", "x"], ["q"]), helper.make_node("Mul", ["x", "q"], ["p"])]), "tanh")],
    ids=["div", "mul", "half-first", "swapped", "mul-first-swapped", "tanh", "tanh-x*x*x"])
def test_written_out_gelu_runs_as_one_kernel_to_the_same_values(nodes, approximate):
    model = _model(nodes)
    backend = ml.TorchBackend()
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    assert _gelus(pm, backend) == ([approximate], ["Gelu"])
    assert "F.gelu" in pm.code or "gelu" in pm.code
    want = ort.InferenceSession(model.SerializeToString()).run(None, DATA)[0]
    got = pm.evaluate(pm.get_parameters(), DATA)["y"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_gradients_through_the_fused_gelu_equal_numpys(form):
    model = ml.load_onnx(_model(_erf_gelu() if form == "erf" else _tanh_gelu()))
    ref = ml.compile(model, ml.NumpyBackend())
    params = ref.get_parameters()
    seed = {"y": np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)}
    want_out, want = ref.evaluate(params, DATA, output_gradients=seed)
    backend = ml.TorchBackend()
    pm = ml.compile(model, backend)
    assert _gelus(pm, backend)[0] == ["none" if form == "erf" else "tanh"]
    got_out, got = pm.evaluate({k: torch.tensor(v) for k, v in params.items()}, DATA, output_gradients=seed)
    np.testing.assert_allclose(got_out["y"].detach().numpy(), want_out["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["W"].numpy(), want["W"], rtol=1e-4, atol=1e-4)


def test_chains_that_are_not_gelu_keep_their_nodes():
    backend = ml.TorchBackend()
    cases = {
        # an intermediate another output reads
        "erf read elsewhere": _model(_erf_gelu(), outputs=("y", "e")),
        # another constant: x * 0.6 * (1 + erf(x / sqrt(2)))
        "0.6": _model([n if n.output[0] != "half" else _const("half", 0.6) for n in _erf_gelu()]),
        # x / 2 inside the erf
        "x / 2": _model([n if n.output[0] != "s2" else _const("s2", 2.0) for n in _erf_gelu()]),
        # (1 + erf(x / sqrt 2)) times another value than x
        "times input": _model([n if n.output[0] != "m" else helper.make_node("Mul", ["input", "a"], ["m"])
                               for n in _erf_gelu()]),
        # a tanh chain with x^2, not x^3
        "square": _model([n if n.output[0] != "three" else _const("three", 2.0) for n in _tanh_gelu()]),
        # x * input * x, not x^3
        "x*input*x": _model(_tanh_gelu([helper.make_node("Mul", ["x", "input"], ["q"]),
                                        helper.make_node("Mul", ["q", "x"], ["p"])])),
    }
    for name, model in cases.items():
        pm = ml.compile(ml.load_onnx(model), backend, inference=True)
        assert _gelus(pm, backend)[0] == [], name
        want = ort.InferenceSession(model.SerializeToString()).run(None, DATA)
        got = pm.evaluate(pm.get_parameters(), DATA)
        for w, g in zip(want, got.values()):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_constant_given_at_run_time_is_not_folded_into_the_kernel():
    """An initializer the caller keeps changeable (``trainable_keys``) is a parameter whose value
    may change at each call: the chain stays. One nothing trains is read from the file, and
    evaluate refuses another value for it."""
    from mithril.errors import InputError

    nodes = [n for n in _erf_gelu() if n.output[0] != "half"]
    model = ml.load_onnx(_model(nodes, initializers={"half": np.float32(0.5)}))
    backend = ml.TorchBackend()
    fixed = ml.compile(model, backend, inference=True)
    assert _gelus(fixed, backend)[0] != [] and set(fixed.baked_params) == {"half"}
    params = fixed.get_parameters()
    params["half"] = torch.tensor(0.25)
    with pytest.raises(InputError, match="'half'"):
        fixed.evaluate(params, DATA)
    pm = ml.compile(model, backend, inference=True, trainable_keys=["half"])
    assert _gelus(pm, backend)[0] == []
    x = DATA["input"] @ params["W"].numpy()
    want = x * 0.25 * (1 + torch.erf(torch.tensor(x / np.sqrt(2))).numpy())
    np.testing.assert_allclose(pm.evaluate(params, DATA)["y"].numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_users_kernel_in_the_chain_keeps_its_nodes():
    calls = []

    def erf(x, *, xp):
        calls.append(1)
        return xp.asarray(torch.erf(x.native)) if hasattr(x, "native") else torch.erf(x)

    with ml.scoped_ops():
        ml.TorchBackend.register_op("Erf", erf, domain="", since=13, replace=True)
        backend = ml.TorchBackend()
        pm = ml.compile(ml.load_onnx(_model(_erf_gelu())), backend, inference=True)
        assert _gelus(pm, backend)[0] == []
        pm.evaluate(pm.get_parameters(), DATA)
    assert calls
