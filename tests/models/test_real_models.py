"""Real models (ResNet-18, MobileNetV2, small BERT and GPT-2 with random weights), exported by both
torch exporters, run on the NumPy backend and compared with onnxruntime on the same inputs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mithril as ml

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from models_zoo import torch_reference as models  # noqa: E402

IMAGE_SIZE = 64
SEQ = 16
RTOL, ATOL = 1e-4, 1e-5  # float32; observed max abs error is ~2e-6 on ResNet-18 logits of magnitude ~2
TEXT_MODELS = ("bert", "gpt2")

# The exporters warn about tracing Python conditionals and advanced indexing; the comparison with
# onnxruntime is what decides whether the export is right.
pytestmark = [
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning:torch"),
]


def _needs(name: str) -> None:
    if name in TEXT_MODELS:
        pytest.importorskip("transformers", reason="transformers is needed to build the BERT/GPT-2 models")
    if name == "dynamo":
        pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")


class _Export:
    def __init__(self, spec: models.ModelSpec, path: Path):
        self.spec = spec
        self.path = str(path)
        self.session = ort.InferenceSession(self.path, providers=["CPUExecutionProvider"])
        self.model = ml.load_onnx(self.path)

    def inputs(self, batch: int) -> dict[str, np.ndarray]:
        return self.spec.numpy_inputs(batch, seed=batch)

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, inputs)))

    def shapes(self, batch: int) -> dict[str, list[int]]:
        return {k: list(v.shape) for k, v in self.inputs(batch).items()}


_cache: dict[tuple[str, str], _Export] = {}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(model, exporter) -> _Export, built once per session."""

    def get(name: str, exporter: str) -> _Export:
        key = (name, exporter)
        if key not in _cache:
            _needs(name)
            _needs(exporter)
            spec = models.build(name, image_size=IMAGE_SIZE, seq=SEQ)
            path = tmp_path_factory.mktemp("onnx") / f"{name}_{exporter}.onnx"
            models.export_onnx(spec, exporter, str(path))
            _cache[key] = _Export(spec, path)
        return _cache[key]

    return get


def _compare(got: dict, want: dict) -> None:
    assert set(want) <= set(got), f"outputs {sorted(got)} lack {sorted(set(want) - set(got))}"
    for name, ref in want.items():
        out = np.asarray(got[name])
        assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != onnxruntime's {ref.dtype}"
        assert out.shape == ref.shape, f"{name}: shape {out.shape} != onnxruntime's {ref.shape}"
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=name)


def _ops_in(code: str) -> list[str]:
    # Every generated kernel call ends with "# OpType 'node label'".
    return re.findall(r"# (\w+) '", code)


@pytest.mark.parametrize("exporter", models.EXPORTERS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_matches_onnxruntime_dynamic_batch(exported, name, exporter):
    ex = exported(name, exporter)
    pm = ml.compile(ex.model, ml.NumpyBackend())
    params = pm.get_parameters()
    for batch in (1, 3):
        inputs = ex.inputs(batch)
        _compare(pm.evaluate(params, inputs), ex.reference(inputs))


@pytest.mark.parametrize("exporter", models.EXPORTERS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
@pytest.mark.parametrize("batch", (1, 3))
def test_matches_onnxruntime_fixed_shapes(exported, name, exporter, batch):
    ex = exported(name, exporter)
    pm = ml.compile(ex.model, ml.NumpyBackend(), shapes=ex.shapes(batch))
    inputs = ex.inputs(batch)
    _compare(pm.evaluate(pm.get_parameters(), inputs), ex.reference(inputs))


@pytest.mark.parametrize("exporter", models.EXPORTERS)
@pytest.mark.parametrize("name", TEXT_MODELS)
def test_fixed_shapes_fold_shape_subgraphs(exported, name, exporter):
    ex = exported(name, exporter)
    dynamic_ops = _ops_in(ml.compile(ex.model, ml.NumpyBackend()).code)
    assert "Shape" in dynamic_ops, "the export has no Shape op, so this test checks nothing"
    fixed_ops = _ops_in(ml.compile(ex.model, ml.NumpyBackend(), shapes=ex.shapes(2)).code)
    shape_math = {"Shape", "ConstantOfShape", "Range", "Constant", "Concat", "Unsqueeze", "Squeeze", "Slice"}
    left = sorted(op for op in fixed_ops if op in shape_math)
    assert not left, f"shape computations left after specialization: {left}"
    assert len(fixed_ops) < len(dynamic_ops)


def test_fixed_shapes_reject_other_batch(exported):
    ex = exported("resnet18", "torchscript")
    pm = ml.compile(ex.model, ml.NumpyBackend(), shapes=ex.shapes(2))
    with pytest.raises(ml.errors.ShapeError, match="expects shape"):
        pm.evaluate(pm.get_parameters(), ex.inputs(3))


@pytest.mark.parametrize("exporter", models.EXPORTERS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_matches_onnxruntime_in_c(exported, name, exporter):
    """Every exported model runs as generated C (issue 18): no node left to NumPy, outputs equal
    onnxruntime's at fixed shapes."""
    import warnings

    from mithril.backends.c.program import CFallbackWarning

    ex = exported(name, exporter)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CFallbackWarning)
        pm = ml.compile(ex.model, ml.CBackend(), shapes=ex.shapes(2), static_shapes=True, inference=True)
    assert not pm.program.fallback
    inputs = ex.inputs(2)
    _compare(pm.evaluate(pm.get_parameters(), inputs), ex.reference(inputs))


@pytest.mark.parametrize("exporter", models.EXPORTERS)
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_matches_onnxruntime_on_ggml(exported, name, exporter):
    """Every exported model runs on GGMLBackend (issue 19), nodes without a ggml rule on NumPy
    between ggml graphs, and equals onnxruntime in float32 at fixed shapes."""
    pytest.importorskip("ggml", reason="GGMLBackend needs ggml-python (installed by scripts/dev.sh)")
    import warnings

    from mithril.backends.ggml.program import GGMLFallbackWarning

    ex = exported(name, exporter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GGMLFallbackWarning)  # which nodes fall back is the conformance's count
        pm = ml.compile(ex.model, ml.GGMLBackend(), shapes=ex.shapes(2), static_shapes=True, inference=True)
    assert pm.program.segments, "no node ran in ggml"
    inputs = ex.inputs(2)
    got = pm.evaluate(pm.get_parameters(), inputs)
    for k, ref in ex.reference(inputs).items():
        np.testing.assert_allclose(np.asarray(got[k]), ref, rtol=1e-3, atol=1e-4, err_msg=k)
