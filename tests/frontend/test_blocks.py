"""Every frontend block: the NumPy-backend output of ``ml.compile(model)`` matches onnxruntime on
``ml.export_onnx(model)`` with the same parameters, and the export passes the full checker."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import mithril as ml
from mithril.models import (
    MLP,
    AbsoluteError,
    Absolute,
    Add,
    ArgMax,
    ArgMin,
    Buffer,
    Cast,
    Concat,
    Convolution2D,
    Cosine,
    CrossEntropy,
    Divide,
    Equal,
    Exponential,
    Flatten,
    Gelu,
    Greater,
    GreaterEqual,
    IOKey,
    Indexer,
    LayerNorm,
    LeakyRelu,
    Less,
    LessEqual,
    Linear,
    Log,
    LogicalAnd,
    LogicalNot,
    LogicalOr,
    LogicalXor,
    MatrixMultiply,
    Max,
    MaxPool2D,
    Mean,
    Min,
    Model,
    Multiply,
    Negate,
    NotEqual,
    Power,
    Prod,
    Relu,
    Reshape,
    Shape,
    Sigmoid,
    SiLU,
    Sine,
    Size,
    Softmax,
    Softplus,
    Split,
    Sqrt,
    SquaredError,
    Squeeze,
    Subtract,
    Sum,
    Tanh,
    Transpose,
    Variance,
    Where,
)

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def f32(*shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def i64(*shape, high=3):
    return RNG.integers(0, high, shape).astype(np.int64)


def bools(*shape):
    return RNG.random(shape) > 0.5


def single(block, inputs: dict, outputs=("output",)):
    """A model holding one block whose terminals are named after themselves."""
    m = Model()
    bind = {k: IOKey(k, type=ml.dtypes.as_dtype(v.dtype)) for k, v in inputs.items()}
    bind.update({o: o for o in outputs})
    m |= block(**bind)
    return m


def check_against_ort(model, inputs: dict, opset=None, rtol=1e-5, atol=1e-6):
    shapes = {k: v.shape for k, v in inputs.items()}
    pm = ml.compile(model, ml.NumpyBackend(), shapes=shapes, jit=False)
    params = pm.randomize_params()
    got = pm.evaluate(params, dict(inputs))
    proto = ml.export_onnx(model, None, shapes=shapes, params=params, opset=opset)
    onnx.checker.check_model(proto, full_check=True)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, dict(inputs))))
    assert set(got) == set(want)
    for k in want:
        g, w = np.asarray(got[k]), want[k]
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        assert g.shape == w.shape, (k, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=k)
    _check_other_backends(model, inputs, shapes, params, want, rtol, atol)
    return got


# C builds a shared library per model (2-3 s of gcc on 2 cores, ~60% of these files' time): the
# long tier runs every block on C too; the fast tier checks C's kernels op by op in tests/kernels
# and tests/backends/c, and composed models in tests/models.
_SKIP_IN_FAST_TIER = () if os.environ.get("MITHRIL_LONG_TESTS") == "1" else ("c",)


def _check_other_backends(model, inputs, shapes, params, want, rtol, atol):
    """Every other installed backend (C in the long tier), fed the same parameters, matches
    onnxruntime too."""
    from mithril.cli import available_backends
    from mithril.errors import BackendUnavailableError, UnsupportedDTypeError

    for name, cls in available_backends().items():
        if name == "numpy" or name in _SKIP_IN_FAST_TIER:
            continue
        try:
            backend = cls()
            pm = ml.compile(model, backend, shapes=shapes, jit=False)
        except (BackendUnavailableError, UnsupportedDTypeError):
            continue  # e.g. float64 on MLX: reported unsupported, not computed wrongly
        moved = {k: backend.from_numpy(np.asarray(v)) for k, v in params.items()}
        out = pm.evaluate(moved, {k: backend.from_numpy(v) for k, v in inputs.items()})
        for k, w in want.items():
            g = backend.to_numpy(out[k])
            assert g.dtype == w.dtype and g.shape == w.shape, (name, k, g.dtype, g.shape)
            # Other BLAS/reduction orders: float32 tolerances no tighter than 1e-5 relative.
            np.testing.assert_allclose(g, w, rtol=max(rtol, 1e-5), atol=max(atol, 1e-5), err_msg=f"{name}: {k}")


UNARY = [Negate, Exponential, Sqrt, Log, Absolute, Sine, Cosine, Relu, Sigmoid, Tanh, Softplus, SiLU, Buffer,
         lambda: LeakyRelu(slope=0.2), Gelu, lambda: Gelu(approximate="tanh"), lambda: Softmax(axis=1)]
BINARY = [Add, Subtract, Multiply, Divide, Power]
COMPARE = [Greater, GreaterEqual, Less, LessEqual, Equal, NotEqual]
LOGICAL = [LogicalAnd, LogicalOr, LogicalXor]


def _id(f):
    return getattr(f, "__name__", "block")


@pytest.mark.parametrize("make", UNARY, ids=[f"{_id(f)}{i}" for i, f in enumerate(UNARY)])
def test_unary(make):
    check_against_ort(single(make(), {"input": f32(3, 4, positive=True)}), {"input": f32(3, 4, positive=True)})


@pytest.mark.parametrize("make", BINARY, ids=_id)
def test_binary_broadcasts(make):
    inputs = {"left": f32(2, 3, 4, positive=True), "right": f32(3, 1, positive=True)}
    got = check_against_ort(single(make(), inputs), inputs)
    assert got["output"].shape == (2, 3, 4)


@pytest.mark.parametrize("make", COMPARE, ids=_id)
def test_comparisons(make):
    inputs = {"left": i64(4, 3), "right": i64(3)}
    got = check_against_ort(single(make(), inputs), inputs)
    assert got["output"].dtype == np.bool_


@pytest.mark.parametrize("make", LOGICAL, ids=_id)
def test_logical(make):
    inputs = {"left": bools(4, 3), "right": bools(4, 3)}
    check_against_ort(single(make(), inputs), inputs)


def test_logical_not():
    check_against_ort(single(LogicalNot(), {"input": bools(5)}), {"input": bools(5)})


@pytest.mark.parametrize("cls", [Sum, Mean, Max, Min, Prod, Variance])
@pytest.mark.parametrize("axis,keepdim", [(None, False), (1, False), ((0, 2), True), (-1, True)])
def test_reductions(cls, axis, keepdim):
    inputs = {"input": f32(2, 3, 4)}
    check_against_ort(single(cls(axis=axis, keepdim=keepdim), inputs), inputs)


def test_variance_correction_matches_numpy():
    x = f32(5, 6)
    got = check_against_ort(single(Variance(axis=1, correction=1), {"input": x}), {"input": x})
    np.testing.assert_allclose(got["output"], np.var(x, axis=1, ddof=1), rtol=1e-5)


@pytest.mark.parametrize("cls", [ArgMax, ArgMin])
@pytest.mark.parametrize("axis,keepdim", [(None, False), (1, False), (0, True), (None, True)])
def test_arg_reductions(cls, axis, keepdim):
    x = f32(3, 4)
    got = check_against_ort(single(cls(axis=axis, keepdim=keepdim), {"input": x}), {"input": x})
    ref = (np.argmax if cls is ArgMax else np.argmin)(x, axis=axis, keepdims=keepdim)
    np.testing.assert_array_equal(got["output"], ref)


@pytest.mark.parametrize("block,shape,ref", [
    (lambda: Reshape(shape=(4, -1)), (2, 3, 4), lambda x: x.reshape(4, -1)),
    (lambda: Transpose(), (2, 3, 4), lambda x: x.T),
    (lambda: Transpose(axes=(1, 0, 2)), (2, 3, 4), lambda x: x.transpose(1, 0, 2)),
    (lambda: Flatten(), (2, 3, 4), lambda x: x.reshape(2, -1)),  # per sample, as torch.nn.Flatten
    (lambda: Flatten(start_dim=0), (2, 3, 4), lambda x: x.reshape(-1)),
    (lambda: Flatten(start_dim=0, end_dim=1), (2, 3, 4), lambda x: x.reshape(6, 4)),
    (lambda: Indexer(index=(Ellipsis, slice(1, None))), (2, 3, 4), lambda x: x[..., 1:]),
    (lambda: Indexer(index=(0, slice(None, None, -1), None)), (2, 3, 4), lambda x: x[0, ::-1, None]),
    (lambda: Indexer(index=(-1, Ellipsis, slice(0, 3, 2))), (2, 3, 4), lambda x: x[-1, ..., 0:3:2]),
    (lambda: Squeeze(), (2, 1, 4, 1), lambda x: x.squeeze()),
    (lambda: Squeeze(axis=1), (2, 1, 4, 1), lambda x: x.squeeze(1)),
    (lambda: Shape(), (2, 3, 4), lambda x: np.array(x.shape, np.int64)),
    (lambda: Size(), (2, 3, 4), lambda x: np.array(x.size, np.int64)),
    (lambda: Cast(dtype=ml.int32), (2, 3), lambda x: x.astype(np.int32)),
], ids=["reshape", "T", "transpose", "flatten", "flatten0", "flatten01", "index_ellipsis", "index_mixed",
        "index_neg", "squeeze", "squeeze1", "shape", "size", "cast"])
def test_shape_blocks(block, shape, ref):
    x = f32(*shape)
    got = check_against_ort(single(block(), {"input": x}), {"input": x})
    np.testing.assert_array_equal(got["output"], ref(x))


def test_flatten_dims_outside_the_rank_are_refused():
    """Flatten() keeps dim 0, so a vector has no dim 1 to start from: an error, not a wrap-around."""
    m = Model()
    with pytest.raises(ml.errors.ShapeMismatchError, match=r"Flatten\(start_dim=1, end_dim=-1\) does not fit an "
                                                             r"input of rank 1"):
        m |= Flatten()(input=IOKey("x", shape=[3]), output="y")
    with pytest.raises(ml.errors.ShapeMismatchError, match="start_dim 2 comes after end_dim 1"):
        m |= Flatten(start_dim=2, end_dim=1)(input=IOKey("x", shape=[2, 3, 4]), output="y")


def test_concat_and_split():
    inputs = {"input1": f32(2, 3), "input2": f32(2, 5)}
    got = check_against_ort(single(Concat(n=2, axis=1), inputs), inputs)
    assert got["output"].shape == (2, 8)
    x = {"input": f32(6, 2)}
    got = check_against_ort(single(Split(n=3, axis=0), x, outputs=("output1", "output2", "output3")), x)
    np.testing.assert_array_equal(got["output2"], x["input"][2:4])
    got = check_against_ort(single(Split(sizes=(1, 5), axis=0), x, outputs=("output1", "output2")), x)
    assert got["output2"].shape == (5, 2)


def test_where():
    inputs = {"cond": bools(3, 4), "input1": f32(3, 4), "input2": f32(4)}
    got = check_against_ort(single(Where(), inputs), inputs)
    np.testing.assert_array_equal(got["output"], np.where(inputs["cond"], inputs["input1"], inputs["input2"]))


def test_matrix_multiply_batched_and_vector():
    inputs = {"left": f32(2, 3, 4), "right": f32(4, 5)}
    assert check_against_ort(single(MatrixMultiply(), inputs), inputs)["output"].shape == (2, 3, 5)
    inputs = {"left": f32(4), "right": f32(2, 4, 5)}
    assert check_against_ort(single(MatrixMultiply(), inputs), inputs)["output"].shape == (2, 5)


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear(use_bias):
    x = {"input": f32(5, 3, 7)}
    got = check_against_ort(single(Linear(dimension=4, use_bias=use_bias), x), x)
    assert got["output"].shape == (5, 3, 4)


def test_mlp():
    m = Model()
    m |= MLP(activations=[Relu, Sigmoid, None], dimensions=[8, 6, 2])(input="input", output="output")
    check_against_ort(m, {"input": f32(4, 5)})
    pm = ml.compile(m, ml.NumpyBackend(), shapes={"input": [4, 5]})
    assert sorted(pm.parameter_keys) == sorted(f"mlp_0.linear_{i}.{p}" for i in range(3) for p in ("weight", "bias"))


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, out_channels=4),
    dict(kernel_size=3, out_channels=4, padding="same"),
    dict(kernel_size=(3, 2), out_channels=6, padding="same", dilation=2),
    dict(kernel_size=3, out_channels=4, padding="same", stride=2),
    dict(kernel_size=3, out_channels=6, padding=(1, 2), stride=(2, 1), groups=3),
    dict(kernel_size=2, out_channels=4, padding=((0, 1), (1, 0)), use_bias=False),
    dict(kernel_size=1, out_channels=3, padding="valid", stride=3),
], ids=["plain", "same", "same_dil", "same_stride", "groups", "asym", "valid"])
def test_convolution2d(kw):
    x = {"input": f32(2, 6, 9, 8)}
    got = check_against_ort(single(Convolution2D(**kw), x), x, rtol=1e-4, atol=1e-5)
    if kw.get("padding") == "same" and kw.get("stride", 1) == 1:
        assert got["output"].shape[2:] == (9, 8)


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1),
                                dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1))])
def test_maxpool2d(kw):
    x = {"input": f32(2, 3, 8, 7)}
    check_against_ort(single(MaxPool2D(**kw), x), x)


@pytest.mark.parametrize("kw", [{}, dict(use_scale=False), dict(use_bias=False, eps=1e-3)])
def test_layernorm(kw):
    x = {"input": f32(2, 3, 8)}
    check_against_ort(single(LayerNorm(**kw), x), x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [SquaredError, AbsoluteError])
def test_pair_losses(cls):
    inputs = {"input": f32(4, 3), "target": f32(4, 3)}
    check_against_ort(single(cls(), inputs), inputs)


@pytest.mark.parametrize("input_type", ["logits", "probs"])
def test_cross_entropy(input_type):
    logits = f32(4, 5, 3)
    x = logits if input_type == "logits" else np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    inputs = {"input": x.astype(np.float32), "target": i64(4, 3, high=5)}
    got = check_against_ort(single(CrossEntropy(input_type=input_type), inputs), inputs, rtol=1e-4, atol=1e-5)
    lsm = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    ref = -np.take_along_axis(lsm, inputs["target"][:, None], 1)[:, 0]
    np.testing.assert_allclose(got["output"], ref, rtol=1e-4, atol=1e-5)


def test_cross_entropy_with_probability_targets():
    t = np.abs(f32(4, 5)) + 0.1
    inputs = {"input": f32(4, 5), "target": (t / t.sum(1, keepdims=True)).astype(np.float32)}
    check_against_ort(single(CrossEntropy(categorical=False), inputs), inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [17, 18, 20, 21])
def test_older_opsets(opset):
    """Version-dependent lowerings (Reduce* axes, Split, Gelu, SiLU) at the oldest opsets."""
    m = Model()
    m |= Linear(dimension=6)(input="input")
    m += Gelu()
    m += SiLU()
    m += Variance(axis=1, keepdim=True)
    m |= Mean(axis=0)(input=m.linear_0.output, output="mean")
    m |= Split(n=2, axis=1)(input=m.linear_0.output, output1="a", output2="b")
    m.set_outputs(var=m.variance_0.output)
    check_against_ort(m, {"input": f32(3, 4)}, opset=opset, rtol=1e-4, atol=1e-5)
