"""``ml.compile(..., gradient_checkpointing=True)``: the backward pass recomputes activations
(``jax.checkpoint``, ``torch.utils.checkpoint``, ``mx.checkpoint``, or NumPy's gradient program
re-running forward segments) and the gradients are the same as without it.

The option comes from 000 backend comparison, "JAX Backend / Optimization Techniques"; how the
graph is cut is :mod:`mithril.backends.checkpoint`.
"""

from __future__ import annotations

import functools
import re
import tracemalloc
import warnings

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.backends.checkpoint import GradientCheckpointingWarning, checkpoint_segments
from mithril.backends.plan import build_plan
from mithril.backends.table import BACKENDS
from mithril.models import Dropout, IOKey, Linear, Model, Relu

BACKEND_NAMES = ["numpy", "jax", "torch", "mlx"]


def _backend(name: str):
    entry = BACKENDS[name]
    if not entry.installed():
        pytest.skip(f"{entry.array_modules[0]} is not installed")
    return entry.load()()


def _mlp(layers: int = 6, width: int = 16, batch: int = 4, features: int = 8) -> Model:
    model = Model()
    model |= Linear(width)(input=IOKey("input", shape=[batch, features]))
    for _ in range(layers):
        model += Relu()
        model += Linear(width)
    model += Linear(3)(output=IOKey("output"))
    return model


@functools.lru_cache(maxsize=None)
def _conv_net_onnx() -> bytes:
    """A small residual CNN exported from torch (Conv, BatchNormalization, Relu, Add, MaxPool,
    GlobalAveragePool, Flatten, Gemm), random weights."""
    torch = pytest.importorskip("torch")
    import io

    from torch import nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + x)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), Block(8), nn.MaxPool2d(2),
                        Block(8), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), Block(16),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5)).eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(2, 3, 16, 16),), f, input_names=["input"], output_names=["output"],
                          opset_version=17, dynamo=False)
    return f.getvalue()


def _gradients(backend, model, data: dict, *, seed: int | None = None, **options):
    """Outputs and gradients (NumPy) of ``model`` compiled with ``options``, cotangent ones, at
    the backend's seed-0 random parameters."""
    pm = ml.compile(model, backend, data_keys=set(data), **options)
    backend.set_seed(0)
    params = pm.randomize_params()
    if seed is not None:
        backend.set_seed(seed)
    cot = {v.name: backend.from_numpy(np.ones(tuple(v.shape), np.float32)) for v in pm.ir.graph.outputs}
    out, grads = pm.evaluate(params, {k: backend.from_numpy(v) for k, v in data.items()}, output_gradients=cot)
    return pm, {k: backend.to_numpy(v) for k, v in out.items()}, {k: backend.to_numpy(v) for k, v in grads.items()}


def _assert_same(a: dict, b: dict, rtol=1e-5, atol=1e-5):
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=rtol, atol=atol, err_msg=k)


def _count_calls(pm, op_type: str, program=None) -> dict:
    """Wrap the kernel the generated lines of ``op_type`` call; the returned dict counts calls."""
    program = program or pm.program
    names = set(re.findall(rf"= (?:_first\()?(\w+)\(.*  # {op_type} '[^']*': ", program.source))  # not rules
    assert names, f"no {op_type} line in the program"
    count = {"calls": 0}
    for name in names:
        fn = program.namespace[name]

        def counted(*args, _fn=fn, **kwargs):
            count["calls"] += 1
            return _fn(*args, **kwargs)

        program.namespace[name] = counted
    return count


# -- same gradients, every backend ------------------------------------------------------------

@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_mlp_gradients_match(name):
    backend = _backend(name)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    plain_pm, out, grads = _gradients(backend, _mlp(), {"input": x})
    pm, out_gc, grads_gc = _gradients(backend, _mlp(), {"input": x}, gradient_checkpointing=True)
    assert pm.gradient_checkpointing and not plain_pm.gradient_checkpointing
    assert "input" in grads and len(grads) == 17  # 8 Linear layers' weight and bias, and the input
    _assert_same(out, out_gc)
    _assert_same(grads, grads_gc)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_conv_net_gradients_match(name):
    backend = _backend(name)
    model = ml.load_onnx(_conv_net_onnx())
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    _, out, grads = _gradients(backend, model, {"input": x}, shapes={"input": [2, 3, 16, 16]})
    pm, out_gc, grads_gc = _gradients(backend, model, {"input": x}, shapes={"input": [2, 3, 16, 16]},
                                      gradient_checkpointing=True)
    assert len(grads) == 15  # 7 Conv weights and biases (BatchNorm folded in by the export), fc, input
    _assert_same(out, out_gc, rtol=1e-4, atol=1e-5)
    _assert_same(grads, grads_gc, rtol=1e-4, atol=1e-4)


# -- the activations really are recomputed ---------------------------------------------------

def test_numpy_gradient_program_reruns_forward_segments():
    backend = ml.NumpyBackend()
    model = ml.load_onnx(_conv_net_onnx())
    plain = ml.compile(model, backend, shapes={"input": [2, 3, 16, 16]})
    pm = ml.compile(model, backend, shapes={"input": [2, 3, 16, 16]}, gradient_checkpointing=True)
    conv_lines = functools.partial(re.findall, r"  # Conv '[^']*': ")  # forward lines, not the rules' (vjp)
    convs = len(conv_lines(plain.code))
    assert len(conv_lines(plain.backward.code)) == convs == 8 and "again" not in plain.backward.code
    # A Conv whose output a rule of its segment reads is printed twice: forward, and recomputed.
    assert convs < len(conv_lines(pm.backward.code)) <= 2 * convs
    assert re.search(r"# segment \d+ \('.*' to '.*'\) again: what its rules read", pm.backward.code)
    # The forward program itself is unchanged on NumPy: recomputation lives in the gradient program.
    assert pm.code == plain.code
    x = np.ones((2, 3, 16, 16), np.float32)
    count = _count_calls(pm, "Conv", pm.backward.program)
    pm.evaluate(None, {"input": x}, output_gradients={"output": np.ones((2, 5), np.float32)})
    assert count["calls"] == len(conv_lines(pm.backward.code))


def test_numpy_peak_memory_drops():
    """17 Linear layers over a [2048, 64] batch (activations far larger than the weights): the
    gradient program's peak drops from about all 34 activations to about 2*sqrt of them."""
    backend = ml.NumpyBackend()
    model = _mlp(layers=16, width=64, batch=2048, features=64)
    x = np.random.default_rng(0).standard_normal((2048, 64)).astype(np.float32)
    activation = x.nbytes
    peaks = {}
    for gc in (False, True):
        pm = ml.compile(model, backend, gradient_checkpointing=gc)
        params = pm.get_parameters()
        cot = {"output": np.ones((2048, 3), np.float32)}
        pm.evaluate(params, {"input": x}, output_gradients=cot)
        tracemalloc.start()
        pm.evaluate(params, {"input": x}, output_gradients=cot)
        peaks[gc] = tracemalloc.get_traced_memory()[1] / activation
        tracemalloc.stop()
    assert peaks[False] > 30, peaks
    assert peaks[True] < 14, peaks


def test_jax_recomputes_segments_after_the_cotangent():
    """Each segment keeps its arguments and is computed again in the backward pass; XLA's buffer
    assignment for the gradient program then holds about 2*sqrt of the activations (jax.checkpoint held all of them
    on XLA:CPU, which erases its optimization barriers before merging common subexpressions)."""
    jax = pytest.importorskip("jax")
    backend = ml.JaxBackend()
    model = _mlp(layers=16, width=64, batch=2048, features=64)
    x = np.random.default_rng(0).standard_normal((2048, 64)).astype(np.float32)
    cot = {"output": np.ones((2048, 3), np.float32)}
    texts, temps = {}, {}
    for gc in (False, True):
        pm = ml.compile(model, backend, jit=False, gradient_checkpointing=gc)
        params = pm.get_parameters()

        def grads(p, x):
            return pm.evaluate(p, {"input": x}, output_gradients=cot)[1]

        with backend.scope():
            texts[gc] = str(jax.make_jaxpr(grads)(params, x))
            temps[gc] = jax.jit(grads).lower(params, x).compile().memory_analysis().temp_size_in_bytes / x.nbytes
        assert ("= _backend.checkpoint(s0, " in pm.code) == gc
    # the gradient program computes most of the segments' matmuls again
    matmuls = {gc: len(re.findall(r"= dot_general\[", text)) for gc, text in texts.items()}
    assert matmuls[False] + 10 < matmuls[True] < 2 * matmuls[False], matmuls
    assert temps[False] > 30 and temps[True] < 15, temps
    # a forward-only call runs the segments as plain calls
    pm = ml.compile(_mlp(), backend, gradient_checkpointing=True)
    assert pm.evaluate(None, {"input": np.ones((4, 8), np.float32)})["output"].shape == (4, 3)


@pytest.mark.parametrize("name", ["torch", "mlx"])
def test_segments_run_again_in_the_backward_pass(name):
    backend = _backend(name)
    x = np.ones((4, 8), np.float32)
    calls = {}
    for gc in (False, True):
        pm = ml.compile(_mlp(), backend, data_keys={"input"}, jit=False, gradient_checkpointing=gc)
        segments = pm.code.count("= _backend.checkpoint(s")
        assert segments >= 3 if gc else segments == 0
        count = _count_calls(pm, "MatMulAdd")
        params = pm.get_parameters()
        pm.evaluate(params, {"input": backend.from_numpy(x)})
        forward_only = count["calls"]
        count["calls"] = 0
        pm.evaluate(params, {"input": backend.from_numpy(x)},
                    output_gradients={"output": backend.from_numpy(np.ones((4, 3), np.float32))})
        calls[gc] = (forward_only, count["calls"])
    assert calls[False] == (8, 8)
    forward_only, with_gradients = calls[True]
    assert forward_only == 8  # a forward-only call computes each layer once
    assert 8 < with_gradients <= 16  # the gradient call computes segments again


# -- where it cannot apply ----------------------------------------------------------------------

def test_inference_warns_and_prints_no_segments():
    with pytest.warns(GradientCheckpointingWarning,
                      match=r"gradient_checkpointing=True does nothing with inference=True: no gradients are computed"):
        pm = ml.compile(_mlp(), ml.TorchBackend(), inference=True, gradient_checkpointing=True)
    assert not pm.gradient_checkpointing and "_backend.checkpoint" not in pm.code
    assert pm.evaluate(None, {"input": np.ones((4, 8), np.float32)})["output"].shape == (4, 3)


def _if_model():
    """Gemm -> Relu -> Gemm -> Relu -> If(flag: x2 else x3) -> Mul -> Gemm -> Relu -> Gemm."""
    rng = np.random.default_rng(3)
    inits = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [8, 8], rng.standard_normal(64).astype(np.float32))
             for i in range(4)]
    branch = lambda v: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [f"k{v}"], value=helper.make_tensor("k", TensorProto.FLOAT, [], [v]))],
        f"b{v}", [], [helper.make_tensor_value_info(f"k{v}", TensorProto.FLOAT, [])])
    nodes = [helper.make_node("Gemm", ["x", "w0"], ["a0"], name="gemm0"), helper.make_node("Relu", ["a0"], ["r0"]),
             helper.make_node("Gemm", ["r0", "w1"], ["a1"], name="gemm1"), helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("If", ["flag"], ["scale"], name="choose", then_branch=branch(2.0),
                              else_branch=branch(3.0)),
             helper.make_node("Mul", ["r1", "scale"], ["m"]),
             helper.make_node("Gemm", ["m", "w2"], ["a2"], name="gemm2"), helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Gemm", ["r2", "w3"], ["y"], name="gemm3")]
    graph = helper.make_graph(nodes, "if_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                                                helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return ml.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_a_node_with_subgraphs_keeps_its_activations(name):
    """An If cannot be traced inside one checkpointed function (it branches on a value): it runs
    between segments, says so in one warning, and the gradients stay the same."""
    backend = _backend(name)
    model = _if_model()
    data = {"x": backend.from_numpy(np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)),
            "flag": backend.from_numpy(np.array(True))}
    cot = {"y": backend.from_numpy(np.ones((4, 8), np.float32))}
    results = []
    for gc in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pm = ml.compile(model, backend, jit=False, gradient_checkpointing=gc)
        messages = [str(w.message) for w in caught if issubclass(w.category, GradientCheckpointingWarning)]
        assert messages == ([
            "gradient_checkpointing: 1 node(s) keep their activations (not recomputed): choose (subgraphs)"]
            if gc else [])
        _, grads = pm.evaluate(None, data, output_gradients=cot)
        results.append({k: backend.to_numpy(v) for k, v in grads.items()})
    _assert_same(*results)


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_random_draws_are_not_drawn_again(name):
    """Dropout in training mode ends a segment: recomputing it would draw another mask, and the
    gradients would belong to a mask the forward never used."""
    backend = _backend(name)
    model = Model()
    model |= Linear(32, name="fc1")(input=IOKey("input", shape=[8, 8]))
    model += Relu()
    model += Linear(32, name="fc2")
    model += Dropout(p=0.5, training=True)
    model += Linear(32, name="fc3")
    model += Relu()
    model += Linear(1, name="fc4")(output=IOKey("output"))
    x = np.random.default_rng(5).standard_normal((8, 8)).astype(np.float32)
    _, out, grads = _gradients(backend, model, {"input": x}, seed=7, jit=False)
    pm, out_gc, grads_gc = _gradients(backend, model, {"input": x}, seed=7, jit=False, gradient_checkpointing=True)
    plan = build_plan(pm.ir.graph, pm.model.opset_imports, backend.name, param_names=set(pm.parameter_keys))
    cut = checkpoint_segments(plan)
    assert [(pn.op_type, why) for pn, why in cut.left_out] == [("Dropout", "random draws")]
    dropout = cut.left_out[0][0]
    assert all(dropout not in s.nodes for s in cut.segments) and len(cut.segments) >= 2
    _assert_same(out, out_gc)
    _assert_same(grads, grads_gc)


# -- the cut --------------------------------------------------------------------------------

def _chain_plan(widths: list[int]):
    """Relu chain x0 -> x1 -> ... with value i of shape [widths[i]]."""
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"x{i + 1}"], name=f"relu{i}") for i in range(len(widths) - 1)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [widths[0]])],
        [helper.make_tensor_value_info(f"x{len(widths) - 1}", TensorProto.FLOAT, [widths[-1]])],
        value_info=[helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [w]) for i, w in enumerate(widths)][1:-1])
    return build_plan(ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])).graph,
                      {"": 17})


def test_segments_of_a_chain_and_what_crosses_them():
    plan = _chain_plan([4] * 17)  # 16 nodes, 16 bytes each
    cut = checkpoint_segments(plan)
    # the modelled peak, the values crossing earlier cuts plus the segment's own, is at its least:
    # 6 values (5 cannot hold 16: 5 + 4 + 3 + 2 + 1 = 15), against 16 without checkpointing
    sizes = [len(s.nodes) for s in cut.segments]
    assert sum(sizes) == 16 and 4 <= len(sizes) <= 6
    assert max(size + i for i, size in enumerate(sizes)) == 6, sizes
    first, second = cut.segments[:2]
    assert [v.name for v in first.inputs] == ["x0"] and [v.name for v in first.outputs] == [f"x{sizes[0]}"]
    assert [v.name for v in second.inputs] == [f"x{sizes[0]}"] and second.frees == second.inputs
    assert [v.name for v in cut.segments[-1].outputs] == ["x16"]  # the plan's output


def test_cuts_go_where_the_fewest_bytes_are_live():
    # x3 (2 floats) is narrow: a cut there keeps almost nothing
    cut = checkpoint_segments(_chain_plan([64, 64, 64, 2, 64, 64, 64, 64, 64]))
    assert [v.name for v in cut.segments[1].inputs] == ["x3"]
    # ResNet-18's training graph: every cut falls between blocks (one value crosses it, or two
    # at a downsampling block's input), and the segments kept are far below all activations
    from models_zoo import resnet18
    from mithril.models import CrossEntropy, Mean, TrainModel

    tm = TrainModel(resnet18(num_classes=10))
    tm.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    pm = ml.compile(tm, ml.NumpyBackend(), shapes={"input": [2, 3, 64, 64], "target": [2]}, inference=True)
    plan = build_plan(pm.ir.graph, pm.model.opset_imports, "numpy", param_names=set(pm.parameter_keys))
    cut = checkpoint_segments(plan)
    assert 4 <= len(cut.segments) <= 12
    for segment in cut.segments[1:]:
        assert len([v for v in segment.inputs if v.kind == "node"]) <= 2, [v.name for v in segment.inputs]


def test_doc_jax_optimization_techniques():
    """000 backend comparison, "JAX Backend / Optimization Techniques": the backend as written
    ("gpu" falls back to the CPU here, with a warning), then compile with jit, static shapes and
    gradient checkpointing; the gradients are those of the same compile without checkpointing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: the backend says so and runs on the CPU
        backend = ml.JaxBackend(
            device="gpu",           # Use GPU
            precision="bfloat16",   # Use bfloat16 precision
            pre_allocate=True       # Pre-allocate memory
        )
    model = _mlp()
    compiled_model = ml.compile(
        model=model,
        backend=backend,
        jit=True,                # Enable JIT compilation
        static_shapes=True,      # Use static shape optimization
        gradient_checkpointing=True  # Save memory during backprop
    )
    assert compiled_model.gradient_checkpointing
    reference = ml.compile(model=model, backend=backend, jit=True, static_shapes=True)
    params = compiled_model.get_parameters()
    x = backend.randn(4, 8)
    cot = {"output": backend.ones(4, 3)}
    out, grads = compiled_model.evaluate(params, {"input": x}, output_gradients=cot)
    ref_out, ref_grads = reference.evaluate(params, {"input": x}, output_gradients=cot)
    assert out["output"].shape == (4, 3) and set(grads) == set(ref_grads) == set(params)
    for k in ref_grads:
        np.testing.assert_allclose(np.asarray(grads[k], np.float32), np.asarray(ref_grads[k], np.float32),
                                   rtol=1e-2, atol=1e-2, err_msg=k)
