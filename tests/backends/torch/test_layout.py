"""TorchBackend's channels_last convolutions: a layout, never a change of values or shapes."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml

from tests.conftest import make_model

torch = pytest.importorskip("torch", reason="the Torch backend needs torch (pip install mithril[torch])")
from mithril.backends.torch import overrides as tov  # noqa: E402


def _cnn():
    """Conv -> BatchNorm -> Relu -> depthwise Conv (stride 2) -> Add (1x1 Conv branch) ->
    MaxPool -> Clip, with a 4-D output and a pooled Gemm head."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "Wd"], ["d"], group=8, pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["r1", "Wp"], ["p"], strides=[2, 2]),
        helper.make_node("Add", ["d", "p"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["mp"], kernel_shape=[2, 2], strides=[1, 1]),
        helper.make_node("Clip", ["mp", "lo", "hi"], ["feat"]),
        helper.make_node("GlobalAveragePool", ["feat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["fl"]),
        helper.make_node("Gemm", ["fl", "W2", "C"], ["y"], transB=1),
    ]
    inits = {"W1": rng.standard_normal((8, 3, 3, 3)) * 0.4, "B1": rng.standard_normal(8),
             "s": rng.uniform(0.5, 1.5, 8), "b": rng.standard_normal(8), "m": rng.standard_normal(8) * 0.1,
             "v": rng.uniform(0.5, 1.5, 8), "Wd": rng.standard_normal((8, 1, 3, 3)) * 0.4,
             "Wp": rng.standard_normal((8, 8, 1, 1)) * 0.4, "W2": rng.standard_normal((5, 8)), "C": rng.standard_normal(5)}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    inits.update(lo=np.float32(-1.0), hi=np.float32(2.0))
    return make_model(nodes, [("x", f, [2, 3, 9, 9])], [("feat", f, [2, 8, 4, 4]), ("y", f, [2, 5])], inits)


def test_channels_last_convs_give_numpy_outputs_and_gradients():
    model = _cnn()
    x = np.random.default_rng(1).standard_normal((2, 3, 9, 9)).astype(np.float32)
    cot = {"feat": np.random.default_rng(2).standard_normal((2, 8, 4, 4)).astype(np.float32),
           "y": np.ones((2, 5), np.float32)}
    results = {}
    for backend in (ml.NumpyBackend(), ml.TorchBackend()):
        pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": x.shape}, data_keys=["x"])
        params = pm.get_parameters()
        outputs = pm.evaluate(params, {"x": x})
        out_g, grads = pm.evaluate(params, {"x": x}, output_gradients={k: backend.array(v) for k, v in cot.items()})
        results[backend.name] = (outputs, out_g, grads)
    (np_out, _, np_grads), (t_out, t_out_g, t_grads) = results["numpy"], results["torch"]
    for k in np_out:
        # Users get row-major tensors, as they would without the layout change.
        assert t_out[k].is_contiguous() and t_out_g[k].is_contiguous()
        np.testing.assert_allclose(t_out[k].numpy(), np_out[k], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(t_out_g[k].numpy(), np_out[k], rtol=1e-4, atol=1e-4)
    assert set(t_grads) == set(np_grads) and {"W1", "Wd", "Wp", "x"} <= set(t_grads)
    for k, g in t_grads.items():
        assert g.is_contiguous() and tuple(g.shape) == np.shape(np_grads[k]), k
        np.testing.assert_allclose(g.numpy(), np_grads[k], rtol=1e-3, atol=1e-3, err_msg=k)


def test_a_weight_changed_in_place_is_read_again():
    # The channels_last copy of a weight is kept across calls; an in-place change must not be missed.
    model = _cnn()
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 9)).astype(np.float32)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), shapes={"x": x.shape}, inference=True)
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), shapes={"x": x.shape}, inference=True)
    params = pm.get_parameters()
    first = pm.evaluate(params, {"x": x})["feat"].clone()
    np.testing.assert_allclose(first.numpy(), ref.evaluate(None, {"x": x})["feat"], rtol=1e-4, atol=1e-4)
    params["W1"].mul_(-0.5)
    ref_params = {k: v.numpy() for k, v in params.items()}
    second = pm.evaluate(params, {"x": x})["feat"]
    assert not torch.allclose(first, second)
    np.testing.assert_allclose(second.numpy(), ref.evaluate(ref_params, {"x": x})["feat"], rtol=1e-4, atol=1e-4)


def test_channels_last_weight_is_copied_once_per_weight_version():
    w = torch.randn(4, 3, 3, 3)
    with torch.no_grad():
        a = tov.channels_last_weight(w)
        assert a.is_contiguous(memory_format=torch.channels_last) and torch.equal(a, w)
        assert tov.channels_last_weight(w) is a  # kept, not copied again
        w.add_(1.0)
        b = tov.channels_last_weight(w)
        assert b is not a and torch.equal(b, w)
        assert tov.channels_last_weight(b) is b  # already channels_last
    with torch.enable_grad():  # a weight autograd does not differentiate (a buffer) is kept too
        assert tov.channels_last_weight(w) is b
    # While autograd records, the copy is part of the graph: the gradient reaches w.
    leaf = w.clone().requires_grad_(True)
    tov.channels_last_weight(leaf).sum().backward()
    assert torch.equal(leaf.grad, torch.ones_like(w))
    key = (id(w), "nhwc")
    assert key in tov.kept_copies
    del w
    assert key not in tov.kept_copies  # dropped with its weight


def test_forward_only_convs_run_channels_last_and_gradient_calls_nchw():
    x = tov.TorchArray(torch.randn(1, 4, 6, 6))
    w = torch.randn(5, 4, 3, 3)
    attrs = dict(auto_pad="NOTSET", dilations=(1, 1), group=1, kernel_shape=(3, 3), pads=(1, 1, 1, 1),
                 strides=(1, 1), xp=None)
    with torch.no_grad():
        fast = tov.conv(x, tov.TorchArray(w), **attrs).native
    assert fast.is_contiguous(memory_format=torch.channels_last) and not fast.is_contiguous()
    leaf = w.clone().requires_grad_(True)
    with torch.enable_grad():
        recorded = tov.conv(x, tov.TorchArray(leaf), **attrs).native
    assert recorded.is_contiguous()  # NHWC's backward was slower (ResNet-18's training step)
    torch.testing.assert_close(recorded.detach(), fast)


@pytest.mark.parametrize("shape,kernel,group", [((1, 4, 11), (6, 4, 3), 1), ((1, 4, 5, 6, 7), (4, 1, 3, 3, 3), 4)])
def test_1d_and_3d_convs_give_numpy_values_row_major(shape, kernel, group):
    rng = np.random.default_rng(4)
    w = rng.standard_normal(kernel).astype(np.float32)
    pads = [1] * (2 * (len(shape) - 2))
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], group=group, pads=pads)],
                       [("x", TensorProto.FLOAT, list(shape))], [("y", TensorProto.FLOAT, None)], {"W": w})
    x = rng.standard_normal(shape).astype(np.float32)
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), shapes={"x": shape}, inference=True)(None, {"x": x})["y"]
    got = ml.compile(ml.load_onnx(model), ml.TorchBackend(), shapes={"x": shape}, inference=True)(None, {"x": x})["y"]
    assert got.is_contiguous()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def _residual(lo=0.0, hi=6.0, n=2):
    """Conv -> Relu; Conv -> Add(residual) -> Relu; Conv -> Clip(lo, hi); a Conv -> Relu whose
    convolution is also a graph output (not fused); a 1x1 Conv -> Clip."""
    rng = np.random.default_rng(5)
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["r1", "c2"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "W3"], ["c3"], pads=[0, 0, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["y"]),
        helper.make_node("Conv", ["r2", "W4"], ["c4"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c4"], ["r4"]),
        helper.make_node("Conv", ["r4", "W5"], ["c5"]),
        helper.make_node("Clip", ["c5", "lo", "hi"], ["z"]),
    ]
    inits = {"W1": rng.standard_normal((8, 3, 3, 3)) * 0.4, "B1": rng.standard_normal(8),
             "W2": rng.standard_normal((8, 8, 3, 3)) * 0.3, "B2": rng.standard_normal(8),
             "W3": rng.standard_normal((4, 8, 3, 3)) * 0.3, "W4": rng.standard_normal((8, 8, 3, 3)) * 0.3,
             "W5": rng.standard_normal((4, 8, 1, 1)) * 0.3}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    inits.update(lo=np.float32(lo), hi=np.float32(hi))
    outputs = [("y", f, [n, 4, 4, 4]), ("c4", f, [n, 8, 9, 9]), ("r4", f, [n, 8, 9, 9]), ("z", f, [n, 4, 9, 9])]
    return make_model(nodes, [("x", f, [n, 3, 9, 9])], outputs, inits)


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (2.0, 1.0)])  # crossed bounds: ONNX gives hi everywhere
def test_fused_convolutions_give_numpy_outputs_and_gradients(lo, hi):
    from mithril.backends.torch.fusion import conv_activation

    model = _residual(lo, hi)
    x = np.random.default_rng(6).standard_normal((2, 3, 9, 9)).astype(np.float32)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), shapes={"x": x.shape}, data_keys=["x"])
    ref_params = ref.get_parameters()
    backend = ml.TorchBackend()
    pm = ml.compile(ml.load_onnx(model), backend, shapes={"x": x.shape}, data_keys=["x"])
    fused = [pn for pn in backend.forward_plan(pm.plan).nodes if pn.spec.fn is conv_activation]
    # Conv->Relu, Conv->Add->Relu, Conv->Clip and the 1x1 Conv->Clip; the Conv read as an output
    # alone (activation None), its Relu reading it apart.
    assert sorted(str(pn.kwargs["activation"]) for pn in fused) == ["Clip", "Clip", "None", "Relu", "Relu"]
    assert len(backend.forward_plan(pm.plan).nodes) == len(pm.plan.nodes) - 5
    params = pm.get_parameters()
    got = pm.evaluate(params, {"x": x})
    want = ref.evaluate(ref_params, {"x": x})
    for k in want:
        np.testing.assert_allclose(got[k].numpy(), want[k], rtol=1e-4, atol=1e-4, err_msg=k)
    if lo > hi:
        assert np.all(got["y"].numpy() == hi)
    # Every weight ran packed for oneDNN (kept with its tensor), the 1x1 one too.
    packed = {k for k, v in params.items() if (id(v), "mkldnn") in tov.kept_copies}
    assert packed == {"W1", "W2", "W3", "W4", "W5"}
    # Gradients take the unfused kernels under autograd: the same values as NumPy's.
    cot = {k: np.ones(v.shape, np.float32) for k, v in want.items()}
    _, grads = pm.evaluate(params, {"x": x}, output_gradients={k: backend.array(v) for k, v in cot.items()})
    _, ref_grads = ref.evaluate(ref_params, {"x": x}, output_gradients=cot)
    assert set(grads) == set(ref_grads)
    for k, g in grads.items():
        np.testing.assert_allclose(g.numpy(), ref_grads[k], rtol=1e-3, atol=1e-3, err_msg=k)


def test_a_packed_weight_is_packed_again_for_another_input_size():
    model = _residual(n="N")
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), inference=True)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    for n in (2, 3, 2):
        x = np.random.default_rng(n).standard_normal((n, 3, 9, 9)).astype(np.float32)
        got, want = pm.evaluate(None, {"x": x}), ref.evaluate(None, {"x": x})
        for k in want:
            np.testing.assert_allclose(got[k].numpy(), want[k], rtol=1e-4, atol=1e-4, err_msg=k)


@pytest.mark.parametrize("conv", [
    dict(pads=[0, 1, 1, 0], strides=[2, 2]),  # asymmetric: the input is padded before oneDNN
    dict(pads=[2, 2, 2, 2], dilations=[2, 2]),
    dict(pads=[1, 1, 1, 1], group=2),  # grouped, not depthwise: its weight is packed
    dict(auto_pad="SAME_UPPER", strides=[2, 1]),
    dict(auto_pad="VALID", bias=False),
    dict(pads=[1, 1, 1, 1], group=4, out=8),  # depthwise, two filters per channel
    dict(kernel=1),  # 1x1
    dict(kernel=1, strides=[2, 2], bias=False),
])
@pytest.mark.parametrize("act", ["Relu", "Clip", "AddRelu", "Add"])
def test_packed_and_fused_convolutions_match_numpy(conv, act):
    conv = dict(conv)
    bias, out, k = conv.pop("bias", True), conv.pop("out", 6), conv.pop("kernel", 3)
    group = conv.get("group", 1)
    rng = np.random.default_rng(7)
    f = TensorProto.FLOAT
    inits = {"W": (rng.standard_normal((out, 4 // group, k, k)) * 0.4).astype(np.float32),
             "lo": np.float32(-0.25), "hi": np.float32(0.5)}
    if bias:
        inits["B"] = rng.standard_normal(out).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"] if bias else ["x", "W"], ["c"], **conv)]
    if act == "AddRelu":  # the residual's shape is the convolution's, read from a first run below
        nodes += [helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    elif act == "Add":
        nodes.append(helper.make_node("Add", ["r", "c"], ["y"]))
    else:
        nodes.append(helper.make_node(act, ["c", "lo", "hi"] if act == "Clip" else ["c"], ["y"]))
    x = rng.standard_normal((3, 4, 9, 10)).astype(np.float32)
    shape = ml.compile(ml.load_onnx(make_model(nodes[:1], [("x", f, [3, 4, 9, 10])], [("c", f, None)], inits)),
                       ml.NumpyBackend(), inference=True).evaluate(None, {"x": x})["c"].shape
    inputs = [("x", f, [3, 4, 9, 10])] + ([("r", f, list(shape))] if act.startswith("Add") else [])
    model = make_model(nodes, inputs, [("y", f, None)], inits)
    data = {"x": x, **({"r": rng.standard_normal(shape).astype(np.float32)} if act.startswith("Add") else {})}
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True).evaluate(None, data)["y"]
    backend = ml.TorchBackend()
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    from mithril.backends.torch.fusion import conv_activation
    assert any(pn.spec.fn is conv_activation for pn in backend.forward_plan(pm.plan).nodes)
    params = pm.get_parameters()
    got = pm.evaluate(params, data)["y"]
    assert got.is_contiguous()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert (id(params["W"]), "mkldnn") in tov.kept_copies  # it ran the packed path


@pytest.mark.parametrize("act", [None, "Relu", "AddRelu"])
def test_a_geometry_onednn_refuses_runs_torchs_public_convolution(monkeypatch, act):
    """torch's private oneDNN convolutions raise for some geometries on some processors (torch 2.11
    on the device machine's CPU: "could not create a memory", ResNet-18's last 3x3 conv of a 1x1
    input with its residual Add): that geometry runs torch's public ops, to the same values, and
    is not tried again. The private calls are made to raise here; None: a Conv alone."""
    calls = []

    def refuse(*args):
        calls.append(len(args))
        raise RuntimeError("could not create a memory")

    monkeypatch.setattr(tov, "POINTWISE", refuse)
    monkeypatch.setattr(tov, "POINTWISE_BINARY", refuse)
    monkeypatch.setattr(tov, "_REFUSED", set())
    rng = np.random.default_rng(9)
    f = TensorProto.FLOAT
    inits = {"W": (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32),
             "B": rng.standard_normal(8).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c" if act else "y"], pads=[1, 1, 1, 1])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "AddRelu":
        nodes += [helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    inputs = [("x", f, [2, 8, 1, 1])] + ([("r", f, [2, 8, 1, 1])] if act == "AddRelu" else [])
    model = make_model(nodes, inputs, [("y", f, None)], inits)
    data = {k: rng.standard_normal((2, 8, 1, 1)).astype(np.float32) for k, *_ in inputs}
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True).evaluate(None, data)["y"]
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(), inference=True)
    params = pm.get_parameters()
    tried = []
    for _ in range(2):
        np.testing.assert_allclose(pm.evaluate(params, data)["y"].numpy(), want, rtol=1e-4, atol=1e-4)
        tried.append(len(calls))
    # The fused call refused, then the Conv's own packed call (the unfused path's first try); each
    # tried in the first run only.
    posts = {None: ["none"], "Relu": ["relu", "none"], "AddRelu": ["add+relu", "none"]}[act]
    assert tried == [len(posts)] * 2
    assert sorted(key[0] for key in tov._REFUSED) == sorted(posts)


def test_a_conv_is_not_fused_where_its_input_is_freed_before_the_add():
    """The fused node runs where the Add ran: a Neg between them that reads the convolution's
    input last (and frees it) keeps the Conv and the Add apart."""
    from mithril.backends.torch.fusion import conv_activation

    rng = np.random.default_rng(8)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Add", ["c", "n"], ["y"])]
    model = make_model(nodes, [("x", f, [1, 4, 5, 5])], [("y", f, None)],
                       {"W": rng.standard_normal((4, 4, 1, 1)).astype(np.float32)})
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    backend = ml.TorchBackend()
    pm = ml.compile(ml.load_onnx(model), backend, inference=True)
    assert [pn.op_type for pn in pm.plan.nodes] == ["Conv", "Neg", "Add"]
    nodes = backend.forward_plan(pm.plan).nodes
    assert [pn.op_type for pn in nodes] == ["Conv", "Neg", "Add"]  # the Conv alone, no Add in it
    assert nodes[0].spec.fn is conv_activation and nodes[0].kwargs["activation"] is None and len(nodes[0].inputs) == 2
    want = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True).evaluate(None, {"x": x})["y"]
    np.testing.assert_allclose(pm.evaluate(None, {"x": x})["y"].numpy(), want, rtol=1e-4, atol=1e-4)


def _conv_clip():
    rng = np.random.default_rng(11)
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = {"W": (rng.standard_normal((6, 4, 3, 3)) * 0.4).astype(np.float32),
             "B": rng.standard_normal(6).astype(np.float32), "lo": np.float32(-0.5), "hi": np.float32(0.75)}
    return make_model(nodes, [("x", f, [2, 4, 7, 7])], [("y", f, None)], inits)


def test_a_fused_node_reads_operands_changed_or_replaced_between_calls():
    """Each fused node keeps its oneDNN call's arguments (packed weight, Clip bounds) from one call
    to the next: a weight or bound changed in place, or a new tensor in its place, is read again."""
    from mithril.backends.torch.fusion import CallMemo

    model = _conv_clip()
    x = np.random.default_rng(12).standard_normal((2, 4, 7, 7)).astype(np.float32)
    ref = ml.compile(ml.load_onnx(model), ml.NumpyBackend(), inference=True)
    # Op by op: with the oneDNN graph (the default) the second call is a trace through torch's public
    # convolution and later ones run the graph, so no call would read the memo.
    pm = ml.compile(ml.load_onnx(model), ml.TorchBackend(onednn_graph=False), inference=True)
    assert "activation='Clip', memo=" in pm.code
    (memo,) = [v for v in pm.program.namespace.values() if isinstance(v, CallMemo)]
    params = pm.get_parameters()

    def check():
        want = ref.evaluate({k: v.numpy() for k, v in params.items()}, {"x": x})["y"]
        got = pm.evaluate(params, {"x": x})["y"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        return got

    first = check()
    kept = memo.state
    assert check().tobytes() == first.tobytes()  # the kept arguments: the same oneDNN call, the same result
    assert kept is not None and memo.state is kept  # read, not made again
    params["hi"].fill_(0.25)  # in place: its version changes
    assert check().max() == np.float32(0.25)
    assert memo.state is not kept
    params["lo"] = torch.tensor(-0.125)  # a new tensor
    assert check().min() == np.float32(-0.125)
    params["W"].mul_(-1.0)
    params["B"] = params["B"] + 1.0
    check()
    params["W"] = torch.flip(params["W"], (2,)).contiguous()
    check()


def test_a_call_memo_drops_what_it_keeps_with_its_weight():
    import copy
    import gc
    import pickle

    from mithril.backends.torch.fusion import CallMemo, conv_activation

    memo = CallMemo()
    x = tov.TorchArray(torch.randn(1, 4, 6, 6))
    w = tov.TorchArray(torch.randn(5, 4, 3, 3))
    attrs = dict(auto_pad="NOTSET", dilations=(1, 1), group=1, kernel_shape=(3, 3), pads=(0, 1, 1, 0),
                 strides=(1, 1), xp=None, activation=None, memo=memo)
    with torch.no_grad():
        y = conv_activation(x, w, **attrs).native
        assert memo.state is not None  # kept: the input's own padding (asymmetric pads) with it
        torch.testing.assert_close(conv_activation(x, w, **attrs).native, y)
        assert copy.deepcopy(memo).state is None and pickle.loads(pickle.dumps(memo)).state is None
        del w
        gc.collect()
        assert memo.state is None  # the packed weight goes with its weight
