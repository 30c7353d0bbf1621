"""pm.memory_report(): weights, intermediates by the plan's lifetimes, the C backend's arena, and
parameters reaching C without a second copy."""

from __future__ import annotations

import numpy as np
import pytest

import mithril as ml
from mithril.memory import MemoryReport
from mithril.models import Linear, resnet18


def test_weights_and_intermediates_of_a_linear_layer():
    pm = ml.compile(Linear(4), ml.NumpyBackend(), shapes={"input": [2, 3]})
    report = pm.memory_report()
    assert isinstance(report, MemoryReport) and report.backend == "numpy"
    assert report.weight_bytes == (3 * 4 + 4) * 4 and report.weights_by_dtype == {"float32": 64}
    assert report.naive_bytes >= 2 * 4 * 4  # the output at least
    assert report.arena_bytes is None  # NumPy allocates through NumPy
    assert "weights:" in str(report) and "64 bytes" in str(report)


def small_model_with_batch_dim():
    from mithril.models import IOKey, Model

    model = Model()
    model |= Linear(dimension=4)(input=IOKey("input", shape=["N", 3]), output="output")
    return model


def test_a_symbolic_shape_leaves_the_intermediates_unknown():
    pm = ml.compile(small_model_with_batch_dim(), ml.NumpyBackend())
    report = pm.memory_report()
    assert report.weight_bytes == 64 and report.naive_bytes is None and report.peak_bytes is None
    assert "unknown (a shape is not static)" in str(report)


def test_resnet18_arena_in_c_is_at_most_half_the_naive_sum():
    """Issue 18's bar, at the size users run: ResNet-18 on 1x3x224x224."""
    model, shapes = resnet18(num_classes=1000), {"input": [1, 3, 224, 224]}
    c = ml.compile(model, ml.CBackend(), shapes=shapes, inference=True).memory_report()
    numpy = ml.compile(model, ml.NumpyBackend(), shapes=shapes, inference=True).memory_report()
    assert c.arena_bytes is not None and c.arena_bytes <= c.naive_bytes / 2, c
    # The plan is the same on both: weights and lifetimes agree.
    assert (c.weight_bytes, c.naive_bytes, c.peak_bytes) == (numpy.weight_bytes, numpy.naive_bytes, numpy.peak_bytes)
    assert c.weights_by_dtype["float32"] == 4 * sum(np.prod(s) for s in _resnet18_param_shapes(model, shapes))
    assert c.peak_bytes < c.naive_bytes
    assert "arena (C):" in str(c)


def _resnet18_param_shapes(model, shapes):
    pm = ml.compile(model, ml.NumpyBackend(), shapes=shapes, inference=True)
    return [np.shape(v) for v in pm.get_parameters().values() if np.asarray(v).dtype == np.float32]


def test_parameters_reach_c_without_a_copy():
    """The weights the caller passes are the buffers C reads: no second copy is made."""
    pm = ml.compile(Linear(4), ml.CBackend(), shapes={"input": [2, 3]}, inference=True)
    params = {k: np.ascontiguousarray(v) for k, v in pm.randomize_params().items()}
    program = pm.program
    seen = []
    segment = program._segments[0]

    def spy(io, arena):
        seen.extend(io[i] for i in range(len(program.steps[0].inputs) + len(program.steps[0].outputs)))
        return segment(io, arena)

    program._segments[0] = spy
    x = np.ones((2, 3), np.float32)
    out = pm.evaluate(params, {"input": x})["output"]
    want = ml.compile(Linear(4), ml.NumpyBackend(), shapes={"input": [2, 3]}).evaluate(params, {"input": x})["output"]
    np.testing.assert_allclose(out, want, rtol=1e-6)
    for name, value in params.items():
        assert value.ctypes.data in seen, f"{name} was copied before C read it"
    assert x.ctypes.data in seen and out.ctypes.data in seen


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_report_prints_a_table(backend):
    make = {"numpy": ml.NumpyBackend, "c": ml.CBackend}[backend]
    text = str(ml.compile(Linear(4), make(), shapes={"input": [2, 3]}, inference=True).memory_report())
    assert text.startswith(f"memory of a model compiled for {backend}:")
    assert ("arena (C):" in text) == (backend == "c")
