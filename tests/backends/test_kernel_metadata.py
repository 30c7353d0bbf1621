"""Kernel metadata read by code (host_only, reason, location), the shared window geometry
against ONNX semantics, and ``mithril ops``."""

import importlib
import inspect
import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import mithril as ml
import mithril.backends.kernels  # noqa: F401  (registers the shared kernels)
from mithril import cli
from mithril.backends.kernels.geometry import grid_window, transposed_window, window
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


# -- geometry against the ONNX semantics ------------------------------------------------------


def _single_node(op, inputs, **attrs):
    node = helper.make_node(op, [n for n, _ in inputs], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F, None) for n, _ in inputs],
                              [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), dict(inputs)


def _onnxruntime(op, inputs, **attrs):
    ort = pytest.importorskip("onnxruntime")
    model, feeds = _single_node(op, inputs, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _reference(op, inputs, **attrs):
    model, feeds = _single_node(op, inputs, **attrs)
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _window_cases(ceil_modes=(0,)):
    """1-D windows: (size, kernel, stride, dilation, pad_begin, pad_end, auto_pad, ceil_mode)."""
    autos = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    for n, k, s, d, pb, pe, auto, ceil in itertools.product((5, 6, 7), (1, 2, 3), (1, 2, 3), (1, 2), (0, 1, 2),
                                                           (0, 1), autos, ceil_modes):
        span = (k - 1) * d + 1
        if (auto != "NOTSET" and (pb or pe)) or pb >= span or pe >= span:
            continue
        yield n, k, s, d, pb, pe, auto, ceil


def _attrs(k, s, d, pb, pe, auto, **more):
    attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], auto_pad=auto, **more)
    if auto == "NOTSET":
        attrs["pads"] = [pb, pe]
    return attrs


def test_conv_window_matches_onnx_reference():
    """A one-hot kernel at tap 0 reads x[o * stride - begin]: the reference Conv's output shows
    where every window starts and how many there are."""
    checked = 0
    for n, k, s, d, pb, pe, auto, _ in _window_cases():
        win = window((n,), (k,), (s,), (d,), (pb, pe) if auto == "NOTSET" else None, auto)
        x = np.arange(1, n + 1, dtype=np.float32).reshape(1, 1, n)
        w = np.zeros((1, 1, k), np.float32)
        w[0, 0, 0] = 1
        got = _reference("Conv", [("x", x), ("w", w)], **_attrs(k, s, d, pb, pe, auto))[0, 0]
        starts = [o * s - win.begin[0] for o in range(win.out[0])]
        expected = np.array([x[0, 0, i] if 0 <= i < n else 0 for i in starts], np.float32)
        assert got.tolist() == expected.tolist(), (n, k, s, d, pb, pe, auto, win)
        checked += 1
    assert checked > 300


def test_pool_window_matches_onnxruntime():
    """MaxPool of an increasing input is each window's last tap inside the input: its output
    shows every window's start, taps and count, ceil_mode included. onnxruntime's SAME padding
    of a dilated pool ignores the dilation, against the spec's formula (hand-checked below); it
    refuses pads as wide as the kernel, and SAME windows narrower than their stride (its padding
    formula goes negative there)."""
    checked = 0
    for n, k, s, d, pb, pe, auto, ceil in _window_cases(ceil_modes=(0, 1)):
        if auto.startswith("SAME") and (d > 1 or k < s) or max(pb, pe) >= k:
            continue
        win = window((n,), (k,), (s,), (d,), (pb, pe) if auto == "NOTSET" else None, auto, ceil)
        x = np.arange(1, n + 1, dtype=np.float32).reshape(1, 1, n)
        got = _onnxruntime("MaxPool", [("x", x)], **_attrs(k, s, d, pb, pe, auto, ceil_mode=ceil))[0, 0]
        expected = []
        for o in range(win.out[0]):
            inside = [i for i in (o * s + t * d - win.begin[0] for t in range(k)) if 0 <= i < n]
            expected.append(x[0, 0, max(inside)])
        assert got.tolist() == expected, (n, k, s, d, pb, pe, auto, ceil, win)
        checked += 1
    assert checked > 500


def test_same_padding_of_a_dilated_window_follows_the_spec():
    # pad = (out - 1) * stride + ((kernel - 1) * dilation + 1) - size: 5 taps wide over 5 pixels,
    # stride 1 -> 4 pixels of padding, the odd one at the end (SAME_UPPER) or the start.
    upper = window((5,), (3,), (1,), (2,), None, "SAME_UPPER")
    lower = window((5,), (3,), (1,), (2,), None, "SAME_LOWER")
    assert (upper.begin, upper.end, upper.out) == (lower.begin, lower.end, lower.out) == ((2,), (2,), (5,))
    upper = window((6,), (2,), (2,), (2,), None, "SAME_UPPER")
    lower = window((6,), (2,), (2,), (2,), None, "SAME_LOWER")
    assert (upper.begin, upper.end, upper.out) == ((0,), (1,), (3,))
    assert (lower.begin, lower.end, lower.out) == ((1,), (0,), (3,))


def test_ceil_mode_window_must_start_inside():
    # ceil_mode adds a last window only where it starts inside the input or the begin padding.
    assert window((5,), (2,), (2,), None, (0, 0), "NOTSET", 1).out == (3,)
    assert window((4,), (2,), (2,), None, (0, 0), "NOTSET", 1).out == (2,)
    assert window((5,), (3,), (3,), None, (1, 1), "NOTSET", 1).out == (2,)
    assert window((4,), (3,), (2,), None, (0, 0), "NOTSET", 1).read_pads((4,)) == ((0, 1),)


def _conv_transpose_cases():
    """(size, kernel, stride, dilation, output_padding, pads, auto_pad, output_shape or None)."""
    autos = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
    for n, k, s, d, op, pb, pe, auto, extra in itertools.product((3, 4), (1, 2, 3), (1, 2, 3), (1, 2), (0, 1),
                                                                (0, 1, 2), (0, 1), autos, (None, 0, -1, -2)):
        if op >= s or (auto != "NOTSET" or extra is not None) and (pb or pe):
            continue
        full = s * (n - 1) + (k - 1) * d + 1 + op
        out = full + extra if extra is not None else n * s if auto.startswith("SAME") else full - pb - pe
        # An output larger than the full result is where the spec (zeros before it) and
        # onnxruntime (zeros after it) part; a test of its own pins the spec's reading.
        if out <= 0 or out > full:
            continue
        yield n, k, s, d, op, (pb, pe), auto, None if extra is None else (full + extra,)


def _spread(x, w, s, d, geo):
    """ConvTranspose by hand: every input pixel adds its weighted kernel at i * stride."""
    canvas = np.zeros(geo.canvas[0], np.float32)
    for i, t in itertools.product(range(x.size), range(w.size)):
        canvas[geo.shift + i * s + t * d] += x[i] * w[t]
    return canvas[geo.shift + geo.begin[0]: geo.shift + geo.begin[0] + geo.out[0]]


def test_transposed_window_matches_onnxruntime():
    checked = 0
    for n, k, s, d, op, pads, auto, output_shape in _conv_transpose_cases():
        geo = transposed_window((n,), (k,), (s,), (d,), pads if auto == "NOTSET" else None, auto, (op,),
                                output_shape)
        x = np.arange(1, n + 1, dtype=np.float32)
        w = np.arange(k, dtype=np.float32) * 10 + 1
        attrs = dict(kernel_shape=[k], strides=[s], dilations=[d], auto_pad=auto, output_padding=[op])
        if output_shape is not None:
            attrs["output_shape"] = list(output_shape)
        elif auto == "NOTSET":
            attrs["pads"] = list(pads)
        got = _onnxruntime("ConvTranspose", [("x", x.reshape(1, 1, n)), ("w", w.reshape(1, 1, k))], **attrs)[0, 0]
        assert got.tolist() == _spread(x, w, s, d, geo).tolist(), (n, k, s, d, op, pads, auto, output_shape, geo)
        checked += 1
    assert checked > 400


def test_transposed_window_larger_output_pads_with_zeros_first():
    # output_shape past the full result: the spec's formula gives a negative begin pad (zeros
    # before the full result), which the ONNX suite's cases follow.
    geo = transposed_window((3,), (3,), (2,), None, None, "NOTSET", None, (9,))
    assert (geo.full, geo.begin, geo.out, geo.shift, geo.canvas) == ((7,), (-1,), (9,), 1, (9,))
    geo = transposed_window((3,), (3,), (2,), None, None, "SAME_UPPER", None, None)
    assert (geo.full, geo.begin, geo.out) == ((7,), (0,), (6,))
    # MaxUnpool's output is MaxPool's transposed window without dilation.
    assert transposed_window((2, 2), (2, 2), (2, 2), None, (0, 0, 0, 2)).out == (4, 2)
    assert grid_window((2,), (1,), (1,), (3,)).extent == (4,)


def test_shared_kernels_keep_onnx_reference_values():
    # The shared ConvTranspose (host_only) and Conv over the geometry, against the reference.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    attrs = dict(strides=[2, 1], pads=[1, 0, 0, 1], output_padding=[1, 0], dilations=[1, 2])
    got = REGISTRY.resolve("ConvTranspose", 11).fn(x, w, auto_pad="NOTSET", group=1, kernel_shape=None,
                                                   output_shape=None, **attrs)
    np.testing.assert_allclose(got, _reference("ConvTranspose", [("x", x), ("w", w)], **attrs), rtol=1e-5, atol=1e-5)


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
    einsum = next(t.split() for t in lines if t.split()[:1] == ["Einsum"])
    assert einsum[2 + list(BACKENDS).index("c")] == "."  # no C kernel: NumPy's, the fallback
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
