"""The blocks beyond the core set: windows, normalization, embedding, attention, recurrent cells,
dropout, generators, stop-gradient, more losses. Each compiles on the NumPy backend and matches
onnxruntime on the export; several also match a NumPy or PyTorch reference computation."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import mithril as ml
from mithril.frontend.nn import buffer_updates
from mithril.models import (
    AvgPool2D,
    BatchNorm2D,
    Convolution1D,
    Embedding,
    GroupNorm,
    IOKey,
    MaxPool1D,
    Model,
)

from .test_frontend_blocks import check_against_ort, f32, i64, single

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)


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
