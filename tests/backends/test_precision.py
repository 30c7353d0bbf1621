"""The float-precision pass (mithril/backends/precision.py): a backend's dtype applies to loaded
ONNX files. Exported ResNet-18, BERT and GPT-2 run in float16 and bfloat16 on JAX, Torch and MLX
and in float64 on NumPy, JAX and Torch, each against onnxruntime's float32 outputs; the graph
the pass makes is inspected (what stays float32, keep_io_types, subgraphs, dtype attributes);
float16 files stay float16; composed models take the dtype too; Torch's autocast and the pass
agree."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril.backends.table import BACKENDS
from mithril.errors import BackendUnavailableError, DTypeError
from mithril.backends.precision import KEEP_FLOAT32, KEEP_FLOAT32_ALWAYS, ConvertPrecision, convert_precision

from tests.conftest import make_model

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real"
MODELS = ("resnet18", "bert", "gpt2")
IMAGE_SIZE, SEQ = 32, 16

# A network evaluated in a dtype of unit roundoff u (half the dtype's epsilon) differs from exact
# arithmetic by a modest multiple of u relative to its output scale: each layer rounds its
# result once and the roundings add up across layers (the matmuls accumulate in float32). The
# measured maxima are 1.1-1.4 eps for float16 and bfloat16 on all three models (docs/precision.md),
# so 4 eps (8 u) bounds them with room. float64 is compared with onnxruntime's float32, whose
# own rounding dominates: 32 float32 eps (measured: 6 eps on ResNet-18, 2 on BERT and GPT-2).
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-23}
TOL = {"float16": 4 * EPS["float16"], "bfloat16": 4 * EPS["bfloat16"], "float64": 32 * EPS["float64"]}

pytestmark = [
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:torch"),
]


def _backend(name: str, dtype: str, **options):
    entry = BACKENDS[name]
    if not entry.installed():
        pytest.skip(f"backend {name} needs the {entry.array_modules[0]} package, which is not installed")
    return entry.load()(dtype=getattr(ml, dtype), **options)


def scaled_error(got, want) -> float:
    """max |got - want| over max |want|: the error relative to the output's scale (logits of
    magnitude 5 and 0.001 are judged alike, and a near-zero logit does not blow up the measure)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


class _Export:
    def __init__(self, name: str, path: Path):
        import onnxruntime as ort
        from models_zoo import torch_reference as models

        self.name = name
        self.spec = models.build(name, image_size=IMAGE_SIZE, seq=SEQ)
        models.export_onnx(self.spec, "torchscript", str(path))
        self.path = str(path)
        self.inputs = self.spec.numpy_inputs(2, seed=2)
        session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        self.reference = dict(zip(names, session.run(names, self.inputs)))

    def data(self, dtype) -> dict:
        """The inputs with their float ones in ``dtype`` (integer ids and masks as they are)."""
        return {k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in self.inputs.items()}


_exports: dict[str, _Export] = {}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(name) -> the model exported once per session, with onnxruntime's float32 outputs."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")

    def get(name: str) -> _Export:
        if name in ("bert", "gpt2"):
            pytest.importorskip("transformers", reason="transformers builds the BERT and GPT-2 models")
        if name not in _exports:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _exports[name] = _Export(name, tmp_path_factory.mktemp("precision") / f"{name}.onnx")
        return _exports[name]

    return get


def _converted(ex: _Export, dtype: ir.DataType, keep_io_types: bool = False) -> tuple[ir.Model, ConvertPrecision]:
    model = ml.load_onnx(ex.path).ir.clone()
    pass_ = ConvertPrecision(dtype, keep_io_types)
    pass_(model)
    return model, pass_


def _float_values(graph: ir.Graph):
    for v in (*graph.inputs, *graph.initializers.values(), *(o for n in graph.all_nodes() for o in n.outputs)):
        if v.dtype is not None and v.dtype.is_floating_point():
            yield v


# -- the three exported models on every backend and dtype ------------------------------------------
# 27 cases in about 25 s at these sizes (JAX's jit of ResNet-18 takes the longest, 2-4 s).
_MATRIX = [(m, b, d) for m in MODELS for b in ("jax", "torch", "mlx") for d in ("float16", "bfloat16")]
_MATRIX += [(m, b, "float64") for m in MODELS for b in ("numpy", "jax", "torch")]


@pytest.mark.parametrize("name, backend_name, dtype", [pytest.param(m, b, d, id=f"{m}-{b}-{d}") for m, b, d in _MATRIX])
@pytest.mark.filterwarnings("error::mithril.compile.JitFallbackWarning")
def test_exported_model_runs_in_the_backend_dtype(exported, name, backend_name, dtype):
    ex = exported(name)
    backend = _backend(backend_name, dtype)
    # Fixed shapes fold the exports' shape arithmetic, so JAX and MLX jit the whole program.
    pm = ml.compile(ex.path, backend, shapes={k: list(v.shape) for k, v in ex.inputs.items()})
    want = backend.dtype.numpy
    assert [pm._inputs[k].dtype for k in pm.input_keys] == [ir.DataType.from_numpy(v.dtype if v.dtype != np.float32
                                                            else np.dtype(want)) for v in ex.inputs.values()]
    out = pm.evaluate(None, ex.data(want))
    assert set(out) == set(ex.reference)
    for key, ref in ex.reference.items():
        got = np.asarray(backend.to_numpy(out[key]))
        assert got.dtype == want, f"{key}: {got.dtype}, not {want}"
        assert got.shape == ref.shape
        err = scaled_error(got, ref)
        assert err <= TOL[dtype], f"{name} {backend_name} {dtype} {key}: error {err:.3g} > {TOL[dtype]:.3g}"


def test_mlx_refuses_float64_naming_the_reason():
    if not BACKENDS["mlx"].installed():
        pytest.skip("backend mlx needs the mlx package, which is not installed")
    with pytest.raises(BackendUnavailableError, match="MlxBackend cannot use dtype ml.float64: MLX has no float64"):
        ml.MlxBackend(dtype=ml.float64)


# -- what the pass makes ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bert", "gpt2"])
@pytest.mark.parametrize("dtype", [ir.DataType.FLOAT16, ir.DataType.BFLOAT16])
def test_softmax_and_normalization_stay_float32(exported, name, dtype):
    model, pass_ = _converted(exported(name), dtype)
    ops = {}
    for node in model.graph.all_nodes():
        ops.setdefault(node.op_type, []).append(node)
    for op in ("Softmax", "LayerNormalization"):
        assert ops[op], f"{name} has no {op}: this test checks nothing"
        for node in ops[op]:
            types = {v.dtype for v in (*node.inputs, *node.outputs) if v is not None}
            assert types == {ir.DataType.FLOAT}, f"{node.name}: {types}"
            assert any(f"({op}): " in line for line in pass_.kept)
            # Fed by a Cast from the backend dtype, read through a Cast back to it (Shape reads any type).
            assert node.inputs[0].producer().op_type == "Cast"
            assert {use.node.op_type for use in node.outputs[0].uses()} - {"Shape"} == {"Cast"}
    for node in ops["MatMul"]:
        assert {v.dtype for v in node.inputs} == {dtype}, node.name
    # Integer tensors (ids, masks, shapes) are never touched.
    assert {v.name: v.dtype for v in model.graph.inputs} == {"input_ids": ir.DataType.INT64,
                                                              "attention_mask": ir.DataType.INT64}
    assert all(v.dtype == ir.DataType.INT64 for n in ops["Shape"] for v in n.outputs)


def test_float64_keeps_nothing_in_float32(exported):
    model, pass_ = _converted(exported("gpt2"), ir.DataType.DOUBLE)
    assert pass_.kept == []
    assert {v.dtype for v in _float_values(model.graph)} == {ir.DataType.DOUBLE}
    assert not [n for n in model.graph if n.op_type == "Cast" and n.attributes["to"].value == TensorProto.FLOAT]


def test_resnet_reduce_mean_and_global_pool_stay_float32():
    """The global average over a feature map is a sum over the whole map."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("ReduceMean", ["c"], ["m"], axes=[2, 3], keepdims=1),
             helper.make_node("Add", ["g", "m"], ["y"])]
    proto = make_model(nodes, [("x", TensorProto.FLOAT, [1, 2, 8, 8])], [("y", TensorProto.FLOAT, [1, 4, 1, 1])],
                       {"W": rng.standard_normal((4, 2, 3, 3)).astype(np.float32)})
    pm = ml.compile(proto, ml.NumpyBackend(dtype=ml.float16))
    kept = {n.op_type for n in pm.ir.graph if n.inputs and n.inputs[0].dtype == ir.DataType.FLOAT}
    assert {"GlobalAveragePool", "ReduceMean"} <= kept and "Conv" not in kept
    x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    ref = ml.compile(proto, ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    got = pm.evaluate(None, {"x": x.astype(np.float16)})["y"]
    assert got.dtype == np.float16 and scaled_error(got, ref) <= TOL["float16"]


@pytest.mark.parametrize("backend_name, dtype", [("torch", "float16"), ("numpy", "bfloat16"), ("numpy", "float64")])
def test_keep_io_types_casts_at_the_boundary(exported, backend_name, dtype):
    ex = exported("resnet18")
    backend = _backend(backend_name, dtype)
    pm = ml.compile(ex.path, backend, keep_io_types=True)
    graph = pm.ir.graph
    assert [v.dtype for v in graph.inputs if v.name == "input"] == [ir.DataType.FLOAT]
    assert [v.dtype for v in graph.outputs] == [ir.DataType.FLOAT]
    assert pm.input_keys == ["input"] and pm.output_keys == ["output"]  # the names are the file's
    # The Conv after the input reads it through a Cast to the backend dtype.
    first = next(use.node for use in next(v for v in graph.inputs if v.name == "input").uses())
    assert first.op_type == "Cast" and first.attributes["to"].value == backend.dtype.onnx
    out = pm.evaluate(None, ex.data(np.float32))["output"]
    got = np.asarray(backend.to_numpy(out))
    assert got.dtype == np.float32
    assert scaled_error(got, ex.reference["output"]) <= TOL[dtype]
    with pytest.raises(DTypeError, match=f"input 'input' expects float32 but got {np.dtype(backend.dtype.numpy)}"):
        pm.evaluate(None, ex.data(backend.dtype.numpy))


def test_wrong_dtype_input_is_refused(exported):
    ex = exported("resnet18")
    pm = ml.compile(ex.path, ml.NumpyBackend(dtype=ml.float16))
    with pytest.raises(DTypeError, match=re.escape("input 'input' expects float16 but got float32; cast it "
                                                   "explicitly (Mithril never casts inputs silently)")):
        pm.evaluate(None, ex.data(np.float32))


def test_float32_backend_leaves_the_model_as_loaded(exported):
    model = ml.load_onnx(exported("gpt2").path).ir
    before = ir.to_proto(model).SerializeToString()
    convert_precision(model, ml.NumpyBackend(), keep_io_types=True)
    assert ir.to_proto(model).SerializeToString() == before


# -- float16 files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("file", sorted(p.name for p in REAL.glob("fp16_*.onnx")))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float16_file_stays_float16(file, dtype):
    """Never widened: a float16 file runs in float16 whatever the backend's default dtype."""
    from mithril.conformance import real_inputs, real_reference

    entry = next(e for e in json.loads((REAL / "MANIFEST.json").read_text())["files"] if e["file"] == file)
    inputs = real_inputs(entry)
    names, ref = real_reference(REAL / file, inputs)
    pm = ml.compile(str(REAL / file), ml.NumpyBackend(dtype=getattr(ml, dtype)),
                    shapes={k: v["shape"] for k, v in entry["inputs"].items()})
    assert {k: pm._inputs[k].dtype for k in pm.input_keys} == {k: ir.DataType.from_numpy(v.dtype)
                                                               for k, v in inputs.items()}
    model = ml.load_onnx(str(REAL / file)).ir
    before = ir.to_proto(model).SerializeToString()
    convert_precision(model, pm.backend)
    assert ir.to_proto(model).SerializeToString() == before, "the pass changed a float16 file"
    out = pm.evaluate(None, inputs)
    for name, want in zip(names, ref):
        assert out[name].dtype == want.dtype == np.float16
        assert scaled_error(out[name], want) <= TOL["float16"]


# -- dtype-bearing ops, clamping, subgraphs ---------------------------------------------------------
def _ops_model() -> bytes:
    """Ops whose float types come from attributes or must stay float32: Cast to float, a
    ConstantOfShape without a value (float32 zeros), EyeLike, a Constant value_float, a float
    Range, Resize's scales, and an attention-mask constant at float32's lowest value."""
    lowest = np.finfo(np.float32).min
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),
        helper.make_node("EyeLike", ["x"], ["eye"], dtype=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Add", ["x", "zeros"], ["a"]),
        helper.make_node("Add", ["a", "eye"], ["b"]),
        helper.make_node("Mul", ["b", "half"], ["c"]),
        helper.make_node("Add", ["c", "ids_f"], ["d"]),
        helper.make_node("Mul", ["mask", "lowest"], ["bias"]),
        helper.make_node("Add", ["d", "bias"], ["e"]),
        helper.make_node("Softmax", ["e"], ["p"], axis=-1),
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Unsqueeze", ["p", "axes"], ["p4"]),
        helper.make_node("Resize", ["p4", "", "scales"], ["big"], mode="nearest"),
    ]
    return make_model(
        nodes,
        [("x", TensorProto.FLOAT, [4, 4]), ("ids", TensorProto.INT64, [4, 4]), ("mask", TensorProto.FLOAT, [4, 4])],
        [("p", TensorProto.FLOAT, [4, 4]), ("r", TensorProto.FLOAT, [4]), ("big", TensorProto.FLOAT, [1, 1, 8, 8])],
        {"lowest": np.array(lowest, np.float32), "start": np.array(0, np.float32),
         "limit": np.array(4, np.float32), "delta": np.array(1, np.float32),
         "axes": np.array([0, 1], np.int64), "scales": np.array([1, 1, 2, 2], np.float32)})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtype_attributes_scales_and_masks(dtype):
    proto = _ops_model()
    target = getattr(ml, dtype)
    model = ml.load_onnx(proto).ir.clone()
    ConvertPrecision(ir.DataType(target.onnx))(model)
    nodes = {n.op_type: n for n in model.graph}
    assert nodes["Cast"].attributes["to"].value == target.onnx
    assert nodes["EyeLike"].attributes["dtype"].value == target.onnx
    assert nodes["ConstantOfShape"].attributes["value"].value.dtype == ir.DataType(target.onnx)
    assert nodes["Constant"].attributes["value"].value.dtype == ir.DataType(target.onnx)
    assert model.graph.initializers["scales"].dtype == ir.DataType.FLOAT  # Resize's scales are tensor(float) only
    lowest = model.graph.initializers["lowest"].const_value.numpy()
    assert np.isfinite(lowest) and lowest < 0  # float32's lowest is -inf in float16 and bfloat16: clamped
    half = dtype != "float64"
    range_inputs = {v.dtype for v in nodes["Range"].inputs}
    assert range_inputs == ({ir.DataType.FLOAT} if half else {ir.DataType.DOUBLE})

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    ids = rng.integers(0, 3, (4, 4)).astype(np.int64)
    mask = (rng.random((4, 4)) < 0.3).astype(np.float32)
    ref = ml.compile(proto, ml.NumpyBackend()).evaluate(None, {"x": x, "ids": ids, "mask": mask})
    backend = ml.NumpyBackend(dtype=target)
    want = backend.dtype.numpy
    out = ml.compile(proto, backend).evaluate(None, {"x": x.astype(want), "ids": ids, "mask": mask.astype(want)})
    for key in ("p", "r", "big"):
        assert out[key].dtype == want
        assert np.isfinite(out[key].astype(np.float32)).all(), key  # 0 * lowest is 0, not NaN
        assert scaled_error(out[key], ref[key]) <= TOL[dtype], key


def _loop_model() -> bytes:
    """A Loop adding a float Constant to its carried value, inside an If's then-branch."""
    step = helper.make_node("Constant", [], ["step"], value=numpy_helper.from_array(np.array(0.25, np.float32)))
    body = helper.make_graph(
        [step, helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])])
    then = helper.make_graph([helper.make_node("Loop", ["n", "", "x"], ["looped"], body=body)], "then", [],
                             [helper.make_tensor_value_info("looped", TensorProto.FLOAT, [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["negated"])], "else", [],
                              [helper.make_tensor_value_info("negated", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    return make_model(nodes, [("x", TensorProto.FLOAT, [3]), ("n", TensorProto.INT64, []),
                              ("flag", TensorProto.BOOL, [])], [("y", TensorProto.FLOAT, [3])])


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_subgraphs_are_converted(dtype):
    proto = _loop_model()
    target = getattr(ml, dtype)
    model = ml.load_onnx(proto).ir.clone()
    ConvertPrecision(ir.DataType(target.onnx))(model)
    floats = {v.dtype for g in model.graph.subgraphs() for v in _float_values(g)}
    assert floats == {ir.DataType(target.onnx)}
    pm = ml.compile(proto, ml.NumpyBackend(dtype=target))
    x = np.array([1.0, 2.0, 3.0], target.numpy)
    for flag, want in ((True, x + 0.75), (False, -x)):
        out = pm.evaluate(None, {"x": x, "n": np.array(3), "flag": np.array(flag)})["y"]
        assert out.dtype == target.numpy
        np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64))


# -- other domains and quantized models -----------------------------------------------------------
def test_ml_ops_without_half_types_stay_float32():
    """ai.onnx.ml's Scaler and SVMClassifier take float and double, never float16: they stay float32,
    and so does the input only they read; the file's Cast of the probabilities to float gives float16."""
    from mithril.conformance import real_inputs, real_reference

    file = "skl_scaler_svc.onnx"
    entry = next(e for e in json.loads((REAL / "MANIFEST.json").read_text())["files"] if e["file"] == file)
    model = ml.load_onnx(str(REAL / file)).ir.clone()
    pass_ = ConvertPrecision(ir.DataType.FLOAT16)
    pass_(model)
    kept = {line.split(" (")[1].split(")")[0] for line in pass_.kept}
    assert {"Scaler", "SVMClassifier"} <= kept
    inputs = real_inputs(entry)
    names, ref = real_reference(REAL / file, inputs)
    pm = ml.compile(str(REAL / file), ml.NumpyBackend(dtype=ml.float16),
                    shapes={k: v["shape"] for k, v in entry["inputs"].items()})
    assert {pm._inputs[k].dtype for k in pm.input_keys} == {ir.DataType.FLOAT}
    out = pm.evaluate(None, inputs)
    np.testing.assert_array_equal(out[names[0]], ref[0])  # the labels
    assert out[names[1]].dtype == np.float16 and scaled_error(out[names[1]], ref[1]) <= TOL["float16"]


def test_integer_accumulators_are_rescaled_in_float32():
    """Dynamic quantization: MatMulInteger's int32 sums overflow float16 and the products of two
    scales underflow it; the Cast and the rescaling Muls stay float32 (NaN before)."""
    from mithril.conformance import real_inputs, real_reference

    file = "quant_dynamic_paddle_transformer.onnx"
    entry = next(e for e in json.loads((REAL / "MANIFEST.json").read_text())["files"] if e["file"] == file)
    model = ml.load_onnx(str(REAL / file)).ir.clone()
    pass_ = ConvertPrecision(ir.DataType.FLOAT16)
    pass_(model)
    assert sum("(Cast): an integer accumulator" in line for line in pass_.kept) >= 4
    inputs = real_inputs(entry)
    names, ref = real_reference(REAL / file, inputs)
    pm = ml.compile(str(REAL / file), ml.NumpyBackend(dtype=ml.float16),
                    shapes={k: v["shape"] for k, v in entry["inputs"].items()})
    out = pm.evaluate(None, inputs)[names[0]]
    assert out.dtype == np.float16 and np.isfinite(out).all()
    assert scaled_error(out, ref[0]) <= TOL["float16"]


# -- composed models ------------------------------------------------------------------------------
_COMPOSED = [(b, d) for b in ("jax", "torch", "mlx") for d in ("float16", "bfloat16")]
_COMPOSED += [(b, "float64") for b in ("numpy", "jax", "torch")] + [("numpy", "float16")]


@pytest.mark.parametrize("backend_name, dtype", _COMPOSED, ids=[f"{b}-{d}" for b, d in _COMPOSED])
def test_composed_model_takes_the_backend_dtype(backend_name, dtype):
    model = ml.Model()
    model |= ml.Linear(dimension=16)(input=ml.IOKey("input", shape=["N", 8]), output="hidden")
    model += ml.Relu()(input="hidden", output="act")
    model += ml.Linear(dimension=4)(input="act", output="output")
    reference = ml.compile(model, ml.NumpyBackend(dtype=ml.float64), shapes={"input": [3, 8]})
    params64 = {k: np.asarray(v) for k, v in reference.randomize_params().items()}
    x = np.random.default_rng(1).standard_normal((3, 8))
    want = reference.evaluate(params64, {"input": x})["output"]

    backend = _backend(backend_name, dtype)
    pm = ml.compile(model, backend, shapes={"input": [3, 8]})
    np_dtype = backend.dtype.numpy
    assert {np.dtype(backend.to_numpy(v).dtype) for v in pm.get_parameters().values()} == {np.dtype(np_dtype)}
    params = {k: backend.from_numpy(v.astype(np_dtype)) for k, v in params64.items()}
    got = np.asarray(backend.to_numpy(pm.evaluate(params, {"input": backend.from_numpy(x.astype(np_dtype))})["output"]))
    assert got.dtype == np_dtype
    tol = TOL[dtype] if dtype != "float64" else 1e-12
    assert scaled_error(got, want) <= tol


# -- Torch's autocast and the pass -------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet18", "gpt2"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_amp_and_the_precision_pass_agree(exported, name, dtype):
    """enable_amp autocasts to the backend's half dtype when it has one (the graph is already
    in it), so float16 and bfloat16 never meet in one op; on float32 the graph stays float32
    and autocast's bfloat16 does the lowering."""
    torch = pytest.importorskip("torch")
    ex = exported(name)
    backend = _backend("torch", dtype, enable_amp=True)
    pm = ml.compile(ex.path, backend)
    assert {v.dtype for v in pm.ir.graph.outputs} == {ir.DataType(backend.dtype.onnx)}
    (key, ref), = ex.reference.items()
    out = pm.evaluate(None, ex.data(backend.dtype.numpy))[key]
    assert out.dtype == getattr(torch, dtype)
    # Autocast on a float32 graph computes matmuls in bfloat16 on the CPU: bfloat16's tolerance.
    tol = TOL["bfloat16"] if dtype == "float32" else TOL[dtype]
    assert scaled_error(out.float().numpy(), ref) <= tol


def test_mlx_compute_precision_on_a_converted_model(exported):
    """MlxBackend(dtype=float16, compute_precision="float32"): weights, inputs and outputs in float16
    (the pass), the arithmetic in float32 (the backend casts on the way in): closer to onnxruntime
    than float16 throughout."""
    if not BACKENDS["mlx"].installed():
        pytest.skip("backend mlx needs the mlx package, which is not installed")
    ex = exported("gpt2")
    shapes = {k: list(v.shape) for k, v in ex.inputs.items()}
    errors = {}
    for compute in ("float32", None):
        backend = ml.MlxBackend(dtype=ml.float16, compute_precision=compute)
        out = ml.compile(ex.path, backend, shapes=shapes).evaluate(None, ex.data(np.float16))["logits"]
        got = np.asarray(backend.to_numpy(out))
        assert got.dtype == np.float16
        errors[compute] = scaled_error(got, ex.reference["logits"])
    assert errors["float32"] < errors[None] <= TOL["float16"]


@pytest.mark.parametrize("backend_name, dtype", [("numpy", "float16"), ("torch", "bfloat16"), ("jax", "float16")])
def test_gradients_in_the_backend_dtype(exported, backend_name, dtype):
    """A converted model differentiates in its dtype: every parameter's gradient comes back in it,
    and the gradient norms are those of float64 within a few eps."""
    ex = exported("gpt2")
    shapes = {k: list(v.shape) for k, v in ex.inputs.items()}

    def norms(backend):
        pm = ml.compile(ex.path, backend, shapes=shapes)
        data = {k: backend.from_numpy(v) for k, v in ex.data(backend.dtype.numpy).items()}
        cotangent = np.ones(ex.reference["logits"].shape, backend.dtype.numpy)
        _, grads = pm.evaluate(None, data, output_gradients={"logits": backend.from_numpy(cotangent)})
        arrays = {k: np.asarray(backend.to_numpy(v)) for k, v in grads.items()}
        return {k: float(np.linalg.norm(v.astype(np.float64))) for k, v in arrays.items()}, arrays

    want, _ = norms(ml.NumpyBackend(dtype=ml.float64))
    got, arrays = norms(_backend(backend_name, dtype))
    assert set(got) == set(want) and len(got) > 10
    assert {v.dtype for v in arrays.values()} == {np.dtype(getattr(ml, dtype).numpy)}
    worst = max(abs(got[k] - want[k]) / max(want[k], 1e-12) for k in want)
    assert worst <= TOL[dtype], f"gradient norms differ by {worst:.3g}"


# -- the documentation -----------------------------------------------------------------------------
def test_precision_doc_example_runs():
    """docs/precision.md's example, as written."""
    text = (ROOT / "docs" / "precision.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/precision.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/precision.md", "exec"), {})


def test_keep_float32_reasons_are_documented():
    text = (ROOT / "docs" / "precision.md").read_text()
    for _, op in (*KEEP_FLOAT32, *KEEP_FLOAT32_ALWAYS):
        assert op in text, f"docs/precision.md does not name {op}, which stays float32"


# -- ops whose float32 is their meaning ------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_bitcast_and_box_inputs_stay_float32(dtype):
    """BitCast reinterprets float32 bits and NonMaxSuppression's boxes are tensor(float) only: an
    input only they read keeps float32 (converting it would round what they read); an input that
    also meets converted ops takes the backend dtype."""
    nodes = [helper.make_node("BitCast", ["bits"], ["as_int"], to=TensorProto.INT32),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "keep"], ["selected"]),
             helper.make_node("Relu", ["scores"], ["relu"])]
    proto = make_model(nodes, [("bits", TensorProto.FLOAT, [3]), ("boxes", TensorProto.FLOAT, [1, 2, 4]),
                               ("scores", TensorProto.FLOAT, [1, 1, 2])],
                       [("as_int", TensorProto.INT32, [3]), ("selected", TensorProto.INT64, [None, 3]),
                        ("relu", TensorProto.FLOAT, [1, 1, 2])], {"keep": np.array([1], np.int64)}, opset=26)
    target = getattr(ml, dtype)
    pm = ml.compile(proto, ml.NumpyBackend(dtype=target))
    declared = {k: pm._inputs[k].dtype for k in pm.input_keys}
    assert declared == {"bits": ir.DataType.FLOAT, "boxes": ir.DataType.FLOAT, "scores": ir.DataType(target.onnx)}
    bits = np.array([1.0, -2.5, 1e-3], np.float32)
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1]]], np.float32)
    out = pm.evaluate(None, {"bits": bits, "boxes": boxes, "scores": np.array([[[0.9, 0.8]]], target.numpy)})
    np.testing.assert_array_equal(out["as_int"], bits.view(np.int32))
    np.testing.assert_array_equal(out["selected"], [[0, 0, 0]])  # the second box overlaps the first
    assert out["relu"].dtype == target.numpy


def test_torch_bfloat16_scalars_stay_bfloat16():
    """NumPy's weak-scalar rule skips ml_dtypes' bfloat16 (np.result_type(bfloat16, 0.5) is float64):
    the Torch facade applies it, so LpPool's `x ** p` and `** (1 / p)` stay bfloat16."""
    torch = pytest.importorskip("torch")
    nodes = [helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], p=2)]
    proto = make_model(nodes, [("x", TensorProto.FLOAT, [1, 1, 4, 4])], [("y", TensorProto.FLOAT, [1, 1, 3, 3])])
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    want = ml.compile(proto, ml.NumpyBackend()).evaluate(None, {"x": x})["y"]
    backend = ml.TorchBackend(dtype=ml.bfloat16)
    out = ml.compile(proto, backend).evaluate(None, {"x": backend.from_numpy(x.astype(backend.dtype.numpy))})["y"]
    assert out.dtype == torch.bfloat16
    assert scaled_error(out.float().numpy(), want) <= TOL["bfloat16"]


@pytest.mark.parametrize("backend_name", ["numpy", "torch", "mlx"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_output_type_attributes_and_float_indices(backend_name, dtype):
    """HannWindow's and MelWeightMatrix's output_datatype names float: the backend dtype now. OneHot
    with float indices compares them with integer classes (Torch's facade promotes bfloat16 with
    int64 as torch does; NumPy has no common type for them)."""
    nodes = [helper.make_node("HannWindow", ["size"], ["window"]),
             helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["mel"]),
             helper.make_node("OneHot", ["indices", "depth", "values"], ["hot"], axis=-1)]
    proto = make_model(
        nodes, [("indices", TensorProto.FLOAT, [3]), ("values", TensorProto.FLOAT, [2])],
        [("window", TensorProto.FLOAT, [8]), ("mel", TensorProto.FLOAT, [5, 4]), ("hot", TensorProto.FLOAT, [3, 4])],
        {"size": np.array(8, np.int64), "bins": np.array(4, np.int64), "dft": np.array(8, np.int64),
         "rate": np.array(8000, np.int64), "low": np.array(100.0, np.float32), "high": np.array(3000.0, np.float32),
         "depth": np.array([4], np.int64)}, opset=17)
    inputs = {"indices": np.array([0, 3, 1], np.float32), "values": np.array([0, 1], np.float32)}
    want = ml.compile(proto, ml.NumpyBackend()).evaluate(None, inputs)
    backend = _backend(backend_name, dtype)
    np_dtype = backend.dtype.numpy
    out = ml.compile(proto, backend).evaluate(None, {k: backend.from_numpy(v.astype(np_dtype)) for k, v in inputs.items()})
    for key, ref in want.items():
        got = np.asarray(backend.to_numpy(out[key]))
        assert got.dtype == np_dtype, key
        assert scaled_error(got, ref) <= TOL[dtype], key


@pytest.mark.parametrize("backend_name", ["numpy", "jax", "torch", "mlx"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_kernels_keep_half_dtypes(backend_name, dtype):
    """Clip, LpPool, GRU and AffineGrid return their input's half type (NumPy's bfloat16 clip,
    matmul and ``** 0.5`` return float32; the recurrences and the sums of powers run in float32
    and come back in the half type)."""
    rng = np.random.default_rng(0)
    hidden = 3
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["clipped"]),
             helper.make_node("LpPool", ["x"], ["pooled"], kernel_shape=[2, 2], p=3),
             helper.make_node("Reshape", ["x", "seq_shape"], ["seq"]),
             helper.make_node("GRU", ["seq", "W", "R"], ["", "h"], hidden_size=hidden),
             helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0)]
    proto = make_model(
        nodes, [("x", TensorProto.FLOAT, [1, 1, 4, 4]), ("theta", TensorProto.FLOAT, [1, 2, 3])],
        [("clipped", TensorProto.FLOAT, [1, 1, 4, 4]), ("pooled", TensorProto.FLOAT, [1, 1, 3, 3]),
         ("h", TensorProto.FLOAT, [1, 4, hidden]), ("grid", TensorProto.FLOAT, [1, 2, 2, 2])],
        {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32),
         "seq_shape": np.array([4, 4, 1], np.int64), "W": rng.standard_normal((1, 3 * hidden, 1)).astype(np.float32),
         "R": rng.standard_normal((1, 3 * hidden, hidden)).astype(np.float32), "size": np.array([1, 1, 2, 2], np.int64)},
        opset=20)
    inputs = {"x": rng.standard_normal((1, 1, 4, 4)).astype(np.float32),
              "theta": np.array([[[1.0, 0.2, 0.1], [-0.3, 0.9, 0.0]]], np.float32)}
    want = ml.compile(proto, ml.NumpyBackend()).evaluate(None, inputs)
    backend = _backend(backend_name, dtype)
    np_dtype = backend.dtype.numpy
    pm = ml.compile(proto, backend, jit=False)
    out = pm.evaluate(None, {k: backend.from_numpy(v.astype(np_dtype)) for k, v in inputs.items()})
    for key, ref in want.items():
        got = np.asarray(backend.to_numpy(out[key]))
        assert got.dtype == np_dtype, f"{key}: {got.dtype}"
        assert scaled_error(got, ref) <= TOL[dtype], key
