"""Kernel metadata read by code (host_only, reason, location) and ``mithril ops``; the shared
window geometry is tests/kernels/test_geometry.py's."""

import importlib
import inspect

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
import mithril.backends.kernels  # noqa: F401  (registers the shared kernels)
from mithril import cli
from mithril.backends.registry import REGISTRY, make_spec
from mithril.backends.table import BACKENDS
from mithril.compile import JitFallbackWarning

from tests.conftest import make_model

F = TensorProto.FLOAT


def _loaded_backends() -> list[str]:
    """Backends whose overrides are registered (their framework installed)."""
    loaded = []
    for name, entry in BACKENDS.items():
        try:
            importlib.import_module(f"{entry.package}.overrides")
        except ImportError:
            continue
        loaded.append(name)
    return loaded


# -- metadata read by code ---------------------------------------------------------------------


def test_host_only_kernel_receives_numpy_arrays():
    jnp = pytest.importorskip("jax.numpy")
    seen = []

    def probe(a, b, seq, *, axis, xp):
        seen.append((type(a), b, [type(v) for v in seq], axis, xp))
        return a

    spec = make_spec(probe, "Probe", "", 1, host_only=True)
    out = spec.fn(jnp.ones(2), None, [jnp.zeros(1)], axis=0, xp=jnp)
    assert seen == [(np.ndarray, None, [np.ndarray], 0, np)]
    assert isinstance(out, np.ndarray)
    # The spec still names the function it wraps.
    assert spec.location.endswith(f"tests/backends/test_kernel_metadata.py:{probe.__code__.co_firstlineno}")
    assert spec.function.endswith("probe")


def test_host_only_kernel_runs_on_numpy_under_the_jax_backend():
    """Lowering calls the spec's function: a host_only kernel on JAX sees NumPy, whatever the
    backend passes it, and the caller still gets JAX arrays."""
    jax = pytest.importorskip("jax")
    seen = []

    def unique_probe(x, *, axis, sorted, xp):
        seen.append((type(x), xp))
        return xp.unique(x, return_index=True, return_inverse=True, return_counts=True)

    REGISTRY.register("jax", make_spec(unique_probe, "Unique", "", 11, host_only=True, data_dependent_shape=True))
    try:
        model = make_model([helper.make_node("Unique", ["x"], ["y"])], [("x", F, [5])], [("y", F, None)], opset=17)
        backend = ml.JaxBackend()
        with pytest.warns(JitFallbackWarning):  # Unique's value-dependent shape
            pm = ml.compile(ml.load_onnx(model), backend)
        y = pm.evaluate({}, {"x": backend.array(np.array([3, 1, 3, 2, 1], np.float32))})["y"]
    finally:
        REGISTRY.unregister("jax", "Unique", 11)
    assert seen and all(t is np.ndarray and xp is np for t, xp in seen)
    assert isinstance(y, jax.Array) and np.asarray(y).tolist() == [1, 2, 3]


def test_metadata_is_consistent():
    shared = [spec for key in REGISTRY.ops() for spec in REGISTRY.entries(key[1], key[0])]
    host = {spec.name for spec in shared if spec.host_only}
    # Strings, tokenizers, ai.onnx.ml maps and the in-place NumPy kernels are host kernels.
    assert {"StringSplit-20", "com.microsoft::Tokenizer-1", "ai.onnx.ml::ZipMap-1", "ConvTranspose-1",
            "ScatterND-11", "Unique-11", "NonMaxSuppression-10"} <= host
    for spec in shared:
        # emit_required names host kernels an emit-based backend must implement itself.
        assert not spec.emit_required or spec.host_only, spec.name
        assert not spec.reason, f"{spec.name}: reasons are for overrides"
    # An override exists for a semantic gap or for speed, and says which.
    for backend in _loaded_backends():
        for domain, op in REGISTRY.ops(backend):
            for spec in REGISTRY.entries(op, domain, backend):
                assert spec.reason, f"{backend} override {spec.name} at {spec.location} without a reason"


def test_every_location_names_its_definition():
    _loaded_backends()
    for table in ["*", *REGISTRY.backends()]:
        for domain, op in REGISTRY.ops(table):
            for spec in REGISTRY.entries(op, domain, table):
                path, line = spec.location.rsplit(":", 1)
                fn = inspect.unwrap(spec.fn)
                lines, first = inspect.getsourcelines(fn)
                assert int(line) == first and inspect.getsourcefile(fn).endswith(path), (spec.name, spec.location)


# -- mithril ops ---------------------------------------------------------------------------------


def _blocks(text: str) -> dict[str, list[str]]:
    """The ``mithril ops OP`` output per backend: the backend's line, then its indented lines."""
    blocks, current = {}, None
    for line in text.splitlines()[1:]:
        if not line.startswith(" "):
            current = line.split(":")[0]
            blocks[current] = [line]
        else:
            blocks[current].append(line)
    return blocks


def test_ops_names_each_backends_function_and_location(capsys):
    loaded = _loaded_backends()
    assert cli.main(["ops", "Conv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "ai.onnx::Conv"
    blocks = _blocks(out)
    assert list(blocks) == list(BACKENDS)
    for backend in loaded:
        [support] = BACKENDS[backend].load().op_ranges("Conv")
        line = next(t for t in blocks[backend] if "opset 1+" in t)
        assert support.function in line and line.endswith(support.location), (backend, line)
        if support.kind in ("shared", "override"):  # a registry kernel: the resolved one
            spec = REGISTRY.resolve("Conv", 22, "", backend)
            assert spec.function in line and line.endswith(spec.location), (backend, line)
    # NumPy overrides Conv (depthwise, mithril/backends/numpy/conv.py); C renders its own rule.
    assert "mithril.backends.numpy.overrides.conv (override)" in "\n".join(blocks["numpy"])
    assert "mithril.backends.c.ops.nn.conv (C kernel)  mithril/backends/c/ops/nn.py:" in "\n".join(blocks["c"])
    if "jax" in loaded:
        line = next(t for t in blocks["jax"] if "opset 1+" in t)
        assert "mithril.backends.jax.overrides.conv (override)" in line
        path, number = line.split()[-1].rsplit(":", 1)
        assert path == "mithril/backends/jax/overrides.py"
        source = inspect.getsourcefile(inspect.unwrap(REGISTRY.resolve("Conv", 11, "", "jax").fn))
        assert open(source).read().splitlines()[int(number) - 1].startswith('@override("jax", "Conv"')


def test_ops_shows_opset_ranges_and_metadata(capsys):
    _loaded_backends()
    assert cli.main(["ops", "Softmax"]) == 0
    numpy_block = _blocks(capsys.readouterr().out)["numpy"]
    assert [t.split()[:2] for t in numpy_block[1:]] == [["opset", "1-12"], ["opset", "13+"]]
    assert cli.main(["ops", "Reshape"]) == 0
    assert any("static_inputs=1" in t for t in _blocks(capsys.readouterr().out)["numpy"])
    assert cli.main(["ops", "--domain", "com.microsoft", "Attention"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("com.microsoft::Attention\n") and "contrib_attention" in out
    assert cli.main(["ops", "StringSplit"]) == 0
    assert "host_only" in capsys.readouterr().out


def test_ops_lists_every_op_with_counts_per_backend(capsys):
    loaded = _loaded_backends()
    assert cli.main(["ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["op", "shared", *BACKENDS]
    conv = next(t.split() for t in lines if t.split()[:1] == ["Conv"])
    # NumPy overrides Conv (depthwise); C runs its own rule: "+1" for both, "." for the shared kernel.
    assert conv[1] == "1" and conv[2 + list(BACKENDS).index("numpy")] == "+1"
    assert conv[2 + list(BACKENDS).index("c")] == "+1"
    bernoulli = next(t.split() for t in lines if t.split()[:1] == ["Bernoulli"])
    assert bernoulli[2 + list(BACKENDS).index("c")] == "."  # no C kernel (a random op): NumPy's, the fallback
    if "jax" in loaded:
        assert conv[2 + list(BACKENDS).index("jax")] == "+1"
    for backend in loaded:
        assert any(t.startswith(f"{backend}: ") and " ops, " in t for t in lines)


def test_ops_unknown_op_is_a_one_line_error(capsys):
    assert cli.main(["ops", "Conv2d"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mithril: error: no kernel for ai.onnx::Conv2d on any backend; did you mean Conv?"]
    assert cli.main(["ops", "Tokenizer"]) == 2
    assert "com.microsoft" in capsys.readouterr().err
