"""The blocks beyond the core set: windows, normalization, embedding, attention, recurrent cells,
dropout, generators, stop-gradient, more losses. Each compiles on the NumPy backend and matches
onnxruntime on the export; several also match a NumPy or PyTorch reference computation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import mithril as ml
from mithril.frontend.elementwise import STOP_GRADIENT
from mithril.frontend.nn import buffer_updates
from mithril.models import (
    Arange,
    AvgPool2D,
    BatchNorm2D,
    BinaryCrossEntropy,
    Convolution1D,
    Dropout,
    Embedding,
    GroupNorm,
    HingeLoss,
    IOKey,
    KLDivergence,
    Linear,
    LSTM,
    LSTMCell,
    MaxPool1D,
    Model,
    MultiHeadAttention,
    Randn,
    Reshape,
    RNNCell,
    ScaledDotProduct,
    StopGradient,
    TransformerBlock,
    Transpose,
)

from tests.frontend.test_blocks import check_against_ort, f32, i64, single

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)
pytestmark = pytest.mark.filterwarnings("ignore::mithril.frontend.onnx_export.RandomParamsWarning")


def ort_run(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


# -- windows ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, out_channels=4),
    dict(kernel_size=4, out_channels=4, padding="same"),
    dict(kernel_size=3, out_channels=6, padding="same", dilation=2),
    dict(kernel_size=3, out_channels=4, padding="same", stride=2),
    dict(kernel_size=3, out_channels=6, padding=(1, 2), stride=2, groups=3),
    dict(kernel_size=2, out_channels=4, padding=1, dilation=3, use_bias=False),
    dict(kernel_size=(5,), out_channels=3, padding="valid", stride=(3,)),
], ids=["plain", "same_even", "same_dil", "same_stride", "asym_groups", "int_dil", "valid"])
def test_convolution1d(kw):
    x = {"input": f32(2, 6, 11)}
    got = check_against_ort(single(Convolution1D(**kw), x), x, rtol=1e-4, atol=1e-5)
    if kw.get("padding") == "same" and kw.get("stride", 1) == 1:
        assert got["output"].shape[2] == 11


def test_convolution1d_matches_torch():
    torch = pytest.importorskip("torch")
    m = single(Convolution1D(kernel_size=3, out_channels=6, padding="same", dilation=2, groups=2),
               {"input": f32(2, 4, 9)})
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [2, 4, 9]}, jit=False)
    params = pm.randomize_params()
    x = f32(2, 4, 9)
    got = pm.evaluate(params, {"input": x})["output"]
    want = torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(params["convolution1d_0.weight"]),
                                      torch.from_numpy(params["convolution1d_0.bias"]), padding="same",
                                      dilation=2, groups=2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1),
                                dict(kernel_size=3, stride=2, dilation=2), dict(kernel_size=2, padding=(0, 1))])
def test_maxpool1d(kw):
    x = {"input": f32(2, 3, 10)}
    check_against_ort(single(MaxPool1D(**kw), x), x)


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1),
                                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                                dict(kernel_size=(2, 3), stride=(1, 2))])
def test_avgpool2d(kw):
    x = {"input": f32(2, 3, 8, 7)}
    got = check_against_ort(single(AvgPool2D(**kw), x), x)
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(x["input"]), kw["kernel_size"], kw.get("stride"),
                                          kw.get("padding", 0), count_include_pad=kw.get("count_include_pad", True))
    np.testing.assert_allclose(got["output"], want.numpy(), rtol=1e-5, atol=1e-6)


# -- normalization and embedding ----------------------------------------------------------------
@pytest.mark.parametrize("shape,groups,kw", [((2, 6, 4, 5), 3, {}), ((2, 4, 7), 2, dict(use_bias=False)),
                                             ((3, 8), 4, dict(eps=1e-3))])
def test_groupnorm(shape, groups, kw):
    x = {"input": f32(*shape)}
    m = single(GroupNorm(num_groups=groups, **kw), x)
    got = check_against_ort(m, x, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": shape}, jit=False)
    params = pm.randomize_params()
    torch = pytest.importorskip("torch")
    want = torch.nn.functional.group_norm(torch.from_numpy(x["input"]), groups,
                                          torch.from_numpy(params["groupnorm_0.weight"]),
                                          torch.from_numpy(params["groupnorm_0.bias"]) if "groupnorm_0.bias" in params
                                          else None, eps=kw.get("eps", 1e-5))
    got = pm.evaluate(params, x)["output"]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def _bn_params(pm, c):
    params = pm.randomize_params()
    params["batchnorm2d_0.running_var"] = np.abs(params["batchnorm2d_0.running_var"]) + 0.5
    return params


def test_batchnorm2d_inference_uses_running_stats():
    x = {"input": f32(2, 3, 4, 5)}
    m = single(BatchNorm2D(), x)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [2, 3, 4, 5]}, jit=False)
    params = _bn_params(pm, 3)
    got = pm.evaluate(params, x)["output"]
    proto = ml.export_onnx(m, None, shapes={"input": [2, 3, 4, 5]}, params=params)
    onnx.checker.check_model(proto, full_check=True)
    np.testing.assert_allclose(got, ort_run(proto, x)["output"], rtol=1e-5, atol=1e-5)
    p = {k.split(".")[1]: v[:, None, None] for k, v in params.items()}
    ref = (x["input"] - p["running_mean"]) / np.sqrt(p["running_var"] + 1e-5) * p["weight"] + p["bias"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert buffer_updates(m) == {"batchnorm2d_0.running_mean": None, "batchnorm2d_0.running_var": None}


def test_batchnorm2d_training_matches_torch():
    torch = pytest.importorskip("torch")
    x = {"input": f32(4, 3, 5, 6)}
    m = Model()
    m |= BatchNorm2D(training=True, momentum=0.2)(input="input", output="output",
                                                  running_mean_out=IOKey("mean_out", expose=True),
                                                  running_var_out=IOKey("var_out", expose=True))
    assert buffer_updates(m) == {"batchnorm2d_0.running_mean": "mean_out", "batchnorm2d_0.running_var": "var_out"}
    got = check_against_ort(m, x, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [4, 3, 5, 6]}, jit=False)
    params = _bn_params(pm, 3)
    got = pm.evaluate(params, x)
    bn = torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        for k in ("weight", "bias", "running_mean", "running_var"):
            getattr(bn, k).copy_(torch.from_numpy(params[f"batchnorm2d_0.{k}"]))
    want = bn.train()(torch.from_numpy(x["input"])).detach().numpy()
    np.testing.assert_allclose(got["output"], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["mean_out"], bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["var_out"], bn.running_var.numpy(), rtol=1e-5, atol=1e-6)


def test_embedding():
    m = Model()
    m |= Embedding(num_embeddings=10, dim=4)(input=IOKey("input", type=ml.int64), output="output")
    assert m.shape_of("output").endswith(", 4]")
    idx = {"input": i64(3, 5, high=10)}
    got = check_against_ort(m, idx)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [3, 5]}, jit=False)
    params = pm.randomize_params()
    np.testing.assert_array_equal(pm.evaluate(params, idx)["output"], params["embedding_0.weight"][idx["input"]])
    assert got["output"].shape == (3, 5, 4)


# -- attention ----------------------------------------------------------------------------------
def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("kw,mask", [({}, None), (dict(is_causal=True), None), (dict(use_mask=True), "bool"),
                                     (dict(use_mask=True, scale=0.3), "float"),
                                     (dict(is_causal=True, use_mask=True), "float")],
                         ids=["plain", "causal", "bool_mask", "float_mask_scale", "causal_float_mask"])
def test_scaled_dot_product(kw, mask):
    torch = _torch()
    inputs = {"query": f32(2, 3, 5, 4), "key": f32(2, 3, 6, 4), "value": f32(2, 3, 6, 7)}
    if mask == "bool":
        inputs["mask"] = RNG.random((5, 6)) > 0.3
        inputs["mask"][:, 0] = True  # no row fully masked
    elif mask == "float":
        inputs["mask"] = f32(1, 5, 6)
    got = check_against_ort(single(ScaledDotProduct(**kw), inputs), inputs, rtol=1e-4, atol=1e-5)
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    want = torch.nn.functional.scaled_dot_product_attention(t["query"], t["key"], t["value"], attn_mask=t.get("mask"),
                                                            is_causal=kw.get("is_causal", False) and "mask" not in t,
                                                            scale=kw.get("scale"))
    if kw.get("is_causal") and "mask" in t:  # torch takes one or the other: add the causal part by hand
        causal = torch.ones(5, 6, dtype=torch.bool).tril()
        want = torch.nn.functional.scaled_dot_product_attention(
            t["query"], t["key"], t["value"], attn_mask=t["mask"].masked_fill(~causal, float("-inf")))
    np.testing.assert_allclose(got["output"], want.numpy(), rtol=1e-4, atol=1e-5)


def _mha_torch(torch, params, prefix, x, dims, heads, causal):
    mha = torch.nn.MultiheadAttention(dims, heads, batch_first=True)
    p = {k[len(prefix):]: torch.from_numpy(v) for k, v in params.items() if k.startswith(prefix)}
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([p["q_proj.weight"], p["k_proj.weight"], p["v_proj.weight"]]))
        mha.in_proj_bias.copy_(torch.cat([p["q_proj.bias"], p["k_proj.bias"], p["v_proj.bias"]]))
        mha.out_proj.weight.copy_(p["out_proj.weight"])
        mha.out_proj.bias.copy_(p["out_proj.bias"])
    n = x.shape[1]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if causal else None
    return mha(x, x, x, attn_mask=mask, need_weights=False)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_torch(causal):
    torch = _torch()
    m = Model()
    m |= MultiHeadAttention(dims=8, num_heads=2, is_causal=causal)(input="input", output="output")
    x = {"input": f32(2, 5, 8)}
    check_against_ort(m, x, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [2, 5, 8]}, jit=False)
    assert sorted(pm.parameter_keys) == sorted(f"multiheadattention_0.{p}.{w}" for w in ("weight", "bias")
                                               for p in ("q_proj", "k_proj", "v_proj", "out_proj"))
    params = pm.randomize_params()
    want = _mha_torch(torch, params, "multiheadattention_0.", torch.from_numpy(x["input"]), 8, 2, causal)
    np.testing.assert_allclose(pm.evaluate(params, x)["output"], want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_multi_head_attention_without_bias_and_names():
    m = Model()
    m |= MultiHeadAttention(dims=6, num_heads=3, bias=False, name="attn")(input="input", output="output")
    check_against_ort(m, {"input": f32(1, 4, 6)}, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [1, 4, 6]}, jit=False)
    assert sorted(pm.parameter_keys) == sorted(f"attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "out_proj"))


def test_transformer_block_matches_torch_and_stays_dynamic():
    torch = _torch()
    F = torch.nn.functional
    m = Model()
    m |= TransformerBlock(dims=8, num_heads=2, name="block")(input="input", output="output")
    x = {"input": f32(2, 5, 8)}
    check_against_ort(m, x, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [2, 5, 8]}, jit=False)
    params = pm.randomize_params()
    got = pm.evaluate(params, x)["output"]
    p = {k[len("block."):]: torch.from_numpy(v) for k, v in params.items()}
    h = torch.from_numpy(x["input"])
    a = F.layer_norm(h, (8,), p["ln_1.weight"], p["ln_1.bias"])
    h = h + _mha_torch(torch, {k: v.numpy() for k, v in p.items()}, "attn.", a, 8, 2, True)
    a = F.layer_norm(h, (8,), p["ln_2.weight"], p["ln_2.bias"])
    a = F.linear(F.gelu(F.linear(a, p["mlp.linear_0.weight"], p["mlp.linear_0.bias"])),
                 p["mlp.linear_1.weight"], p["mlp.linear_1.bias"])
    np.testing.assert_allclose(got, (h + a).detach().numpy(), rtol=1e-4, atol=1e-5)
    # batch and sequence axes stay dynamic in the export
    proto = ml.export_onnx(m, None, shapes={"input": [2, 5, 8]}, params=params,
                           dynamic_axes={"input": {0: "batch", 1: "seq"}})
    onnx.checker.check_model(proto, full_check=True)
    np.testing.assert_allclose(ort_run(proto, x)["output"], got, rtol=1e-4, atol=1e-5)
    xi = f32(3, 7, 8)
    out = ort_run(proto, {"input": xi})["output"]
    assert out.shape == (3, 7, 8)
    # causal: the first three steps do not see later ones
    np.testing.assert_allclose(ort_run(proto, {"input": xi[:, :3]})["output"], out[:, :3], rtol=1e-4, atol=1e-5)


# -- recurrent ----------------------------------------------------------------------------------
def _torch_params(module, params, prefix, suffix=""):
    torch = _torch()
    with torch.no_grad():
        for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(module, k + suffix).copy_(torch.from_numpy(params[prefix + k]))
    return module


def test_rnn_cell_matches_torch():
    torch = _torch()
    m = Model()
    m |= RNNCell(hidden_size=5)(input="input", prev_hidden="h", output="output")
    inputs = {"input": f32(3, 4), "h": f32(3, 5)}
    check_against_ort(m, inputs, rtol=1e-5, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={k: v.shape for k, v in inputs.items()}, jit=False)
    params = pm.randomize_params()
    cell = _torch_params(torch.nn.RNNCell(4, 5), params, "rnncell_0.")
    want = cell(torch.from_numpy(inputs["input"]), torch.from_numpy(inputs["h"])).detach().numpy()
    np.testing.assert_allclose(pm.evaluate(params, inputs)["output"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [17, None])
def test_lstm_cell_matches_torch(opset):
    torch = _torch()
    m = Model()
    m |= LSTMCell(hidden_size=5)(input="input", prev_hidden="h", prev_cell="c", output="output", cell="cell")
    inputs = {"input": f32(3, 4), "h": f32(3, 5), "c": f32(3, 5)}
    check_against_ort(m, inputs, opset=opset, rtol=1e-5, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={k: v.shape for k, v in inputs.items()}, jit=False)
    params = pm.randomize_params()
    got = pm.evaluate(params, inputs)
    cell = _torch_params(torch.nn.LSTMCell(4, 5), params, "lstmcell_0.")
    h, c = cell(torch.from_numpy(inputs["input"]), (torch.from_numpy(inputs["h"]), torch.from_numpy(inputs["c"])))
    np.testing.assert_allclose(got["output"], h.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["cell"], c.detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_bias", [True, False])
def test_lstm_many_to_one_matches_torch(use_bias):
    torch = _torch()
    m = Model()
    m |= LSTM(hidden_size=6, use_bias=use_bias)(input="input", output="output", hidden_states="states")
    x = {"input": f32(3, 7, 4)}
    check_against_ort(m, x, rtol=1e-4, atol=1e-5)
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [3, 7, 4]}, jit=False)
    params = pm.randomize_params()
    got = pm.evaluate(params, x)
    lstm = torch.nn.LSTM(4, 6, batch_first=True, bias=use_bias)
    with torch.no_grad():
        for k in ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if use_bias else ()):
            getattr(lstm, k + "_l0").copy_(torch.from_numpy(params["lstm_0." + k]))
    ys, (hn, _) = lstm(torch.from_numpy(x["input"]))
    np.testing.assert_allclose(got["output"], hn[0].detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["states"], ys.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_sequence_length_stays_dynamic():
    m = Model()
    m |= LSTM(hidden_size=4)(input="input", output="output")
    proto = ml.export_onnx(m, None, shapes={"input": [2, 5, 3]}, dynamic_axes={"input": {0: "N", 1: "T"}})
    onnx.checker.check_model(proto, full_check=True)
    assert ort_run(proto, {"input": f32(3, 9, 3)})["output"].shape == (3, 4)


# -- dropout, stop-gradient, generators ---------------------------------------------------------
def test_dropout_inference_is_identity():
    x = {"input": f32(4, 5)}
    m = single(Dropout(p=0.3), x)
    got = check_against_ort(m, x)
    np.testing.assert_array_equal(got["output"], x["input"])
    proto = ml.export_onnx(m, None, shapes={"input": [4, 5]})
    assert [n.op_type for n in proto.graph.node] == ["Identity"]


def test_dropout_training_drops_and_rescales():
    x = {"input": np.abs(f32(200, 50)) + 1}
    m = single(Dropout(p=0.25, training=True, seed=3), x)
    proto = ml.export_onnx(m, None, shapes={"input": [200, 50]})
    onnx.checker.check_model(proto, full_check=True)
    assert [n.op_type for n in proto.graph.node if n.op_type == "Dropout"] == ["Dropout"]
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [200, 50]}, jit=False)
    for out in (pm.evaluate({}, x)["output"], ort_run(proto, x)["output"]):
        kept = out != 0
        assert abs(kept.mean() - 0.75) < 0.02
        np.testing.assert_allclose(out[kept], x["input"][kept] / 0.75, rtol=1e-6)


def test_stop_gradient_is_a_marked_identity():
    x = {"input": f32(3, 4)}
    m = single(StopGradient(), x)
    np.testing.assert_array_equal(check_against_ort(m, x)["output"], x["input"])
    proto = ml.export_onnx(m, None, shapes={"input": [3, 4]}, opset=17)
    onnx.checker.check_model(proto, full_check=True)
    (node,) = proto.graph.node
    assert node.op_type == "Identity"
    assert {p.key: p.value for p in node.metadata_props} == {STOP_GRADIENT: "true"}


@pytest.mark.parametrize("args,dtype", [((5,), np.int64), ((2, 9, 3), np.int64), ((1.0, 2.0, 0.25), np.float32),
                                        ((4, 0, -1), np.int64)])
def test_arange(args, dtype):
    m = Model()
    m |= Arange(*args)(output="output")
    got = check_against_ort(m, {})
    np.testing.assert_array_equal(got["output"], np.arange(*args).astype(dtype))
    assert m.shape_of("output") == f"[{len(np.arange(*args))}]"


def test_arange_feeds_other_blocks():
    m = Model()
    m |= Arange(4)(output="pos")
    m |= Embedding(num_embeddings=4, dim=3)(input=m.pos, output="output")
    assert m.shape_of("output") == "[4, 3]"
    check_against_ort(m, {})


def test_randn_fixed_shape_and_like():
    m = Model()
    m |= Randn(shape=(400, 300), mean=2.0, std=0.5, seed=1)(output="noise")
    m |= Randn(dtype=ml.float64)(input="input", output="like")
    assert m.shape_of("noise") == "[400, 300]"
    x = f32(300, 200)
    onnx.checker.check_model(ml.export_onnx(m, None, shapes={"input": [300, 200]}), full_check=True)
    # onnxruntime 1.31 has no RandomNormal(-Like) kernel for opset 22+ (their bfloat16 version)
    proto = ml.export_onnx(m, None, shapes={"input": [300, 200]}, opset=21)
    onnx.checker.check_model(proto, full_check=True)
    assert sorted(n.op_type for n in proto.graph.node) == ["RandomNormal", "RandomNormalLike"]
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [300, 200]}, jit=False)
    for out in (pm.evaluate({}, {"input": x}), ort_run(proto, {"input": x})):
        assert out["noise"].shape == (400, 300) and out["noise"].dtype == np.float32
        assert abs(out["noise"].mean() - 2.0) < 0.01 and abs(out["noise"].std() - 0.5) < 0.01
        assert out["like"].shape == (300, 200) and out["like"].dtype == np.float64
        assert abs(out["like"].mean()) < 0.02 and abs(out["like"].std() - 1) < 0.02
    a, b = pm.evaluate({}, {"input": x})["like"], pm.evaluate({}, {"input": x})["like"]
    assert not np.array_equal(a, b)


# -- losses -------------------------------------------------------------------------------------
@pytest.mark.parametrize("input_type", ["logits", "probs"])
def test_binary_cross_entropy_matches_torch(input_type):
    torch = _torch()
    logits = f32(6, 4) * 4
    x = logits if input_type == "logits" else 1 / (1 + np.exp(-logits))
    inputs = {"input": x.astype(np.float32), "target": RNG.random((6, 4)).astype(np.float32)}
    got = check_against_ort(single(BinaryCrossEntropy(input_type=input_type), inputs), inputs, rtol=1e-4, atol=1e-5)
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    F = torch.nn.functional
    want = (F.binary_cross_entropy_with_logits if input_type == "logits" else F.binary_cross_entropy)(
        t["input"], t["target"], reduction="none")
    np.testing.assert_allclose(got["output"], want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("log_input", [True, False])
def test_kl_divergence_matches_torch(log_input):
    torch = _torch()
    p = np.exp(f32(5, 4))
    q = np.exp(f32(5, 4))
    p[0, 0] = 0  # a zero target contributes 0
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    inputs = {"input": (np.log(q) if log_input else q).astype(np.float32), "target": p.astype(np.float32)}
    got = check_against_ort(single(KLDivergence(log_input=log_input), inputs), inputs, rtol=1e-4, atol=1e-6)
    want = torch.nn.functional.kl_div(torch.from_numpy(np.log(q).astype(np.float32)),
                                      torch.from_numpy(inputs["target"]), reduction="none")
    np.testing.assert_allclose(got["output"], want.numpy(), rtol=1e-4, atol=1e-6)
    assert got["output"][0, 0] == 0


def test_hinge_loss():
    inputs = {"input": f32(4, 3), "target": np.where(RNG.random((4, 3)) > 0.5, 1, -1).astype(np.float32)}
    got = check_against_ort(single(HingeLoss(), inputs), inputs)
    np.testing.assert_allclose(got["output"], np.maximum(0, 1 - inputs["target"] * inputs["input"]), rtol=1e-6)


@pytest.mark.parametrize("opset", [17, 18, 19, 21])
def test_older_opsets(opset):
    """Version-dependent lowerings of these blocks (Reduce* axes, AveragePool dilations, Gelu) at old opsets."""
    m = Model()
    m |= Convolution1D(kernel_size=3, out_channels=4, padding="same")(input="input")
    m += GroupNorm(num_groups=2)
    m += MaxPool1D(kernel_size=2)
    m |= Transpose(axes=(0, 2, 1))(input=m.maxpool1d_0.output)
    m += TransformerBlock(dims=4, num_heads=2, mlp_ratio=2)
    m += LSTM(hidden_size=3)(output="output")
    m |= Reshape(shape=(0, 4, 2, 3))(input=m.groupnorm_0.output)
    m += BatchNorm2D(training=True)
    m += AvgPool2D(kernel_size=2, stride=1, padding=1, count_include_pad=False)(output="pooled")
    check_against_ort(m, {"input": f32(2, 4, 6)}, opset=opset, rtol=1e-4, atol=1e-5)


def test_shape_rules_raise_at_the_connecting_line():
    from mithril.errors import ShapeMismatchError

    m = Model()
    with pytest.raises(ShapeMismatchError, match="groups"):
        m |= Convolution1D(kernel_size=3, out_channels=6, groups=3)(input=IOKey("input", shape=[2, 4, 9]))
    m = Model()
    with pytest.raises(ShapeMismatchError, match="do not divide into 4 groups"):
        m |= GroupNorm(num_groups=4)(input=IOKey("input", shape=[2, 6, 5]))
    m = Model()
    m |= MultiHeadAttention(dims=8, num_heads=2)(input="input", output="output")
    with pytest.raises(ShapeMismatchError):
        m |= Linear(dimension=6)(input="x", output="input")
    m = Model()
    m |= LSTM(hidden_size=5)(input=IOKey("input", shape=[2, 7, 3]), output="h")
    assert m.shape_of("h") == "[2, 5]"
    with pytest.raises(ShapeMismatchError):
        m |= RNNCell(hidden_size=4)(input="h", prev_hidden=m.h, output="out")
