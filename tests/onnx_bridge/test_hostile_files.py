"""Hostile or broken ONNX files are refused cheaply and safely: the right error class, a message
naming what is wrong, no hang (every test runs under a SIGALRM watchdog), no read outside the
model's folder, nothing allocated for a tensor that could never fit.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mithril as ml
from mithril import errors
from mithril.onnx_bridge.check import default_max_tensor_bytes

F32 = TensorProto.FLOAT
HANG_LIMIT_S = 30  # generous: each case takes milliseconds; only a hang comes near it


@pytest.fixture(autouse=True)
def watchdog():
    """Fail (rather than hang the run) when a case takes longer than HANG_LIMIT_S."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise TimeoutError(f"hung: still running after {HANG_LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(HANG_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def model(nodes, inputs=(("x", F32, [2]),), outputs=(("y", F32, [2]),), initializers=(),
          opsets=(("", 17),), ir_version=8) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        initializer=list(initializers),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir_version
    return m


def add_w(tensor: TensorProto) -> onnx.ModelProto:
    """x + w, with ``w`` the tensor under test."""
    return model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], initializers=[tensor])


def relu_model() -> onnx.ModelProto:
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")])


# -- bytes that are not a model ------------------------------------------------------------------
def test_truncated_file_is_refused(tmp_path):
    weights = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(32, 2), "w")
    data = model([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs=[("x", F32, [1, 32])],
                 outputs=[("y", F32, [1, 2])], initializers=[weights]).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.OnnxLoadError, match="truncated") as info:
        ml.load_onnx(path)
    assert "cut.onnx" in str(info.value)
    # Every cut point: a refusal or (a cut on a field boundary) a smaller model, never a crash.
    for end in range(0, len(data), 7):
        try:
            ml.load_onnx(data[:end])
        except errors.OnnxLoadError:
            pass


def test_random_bytes_are_refused():
    rng = np.random.default_rng(0)
    for size in (1, 7, 100, 4096, 1 << 16):
        with pytest.raises(errors.OnnxLoadError, match="not a valid ONNX protobuf|holds no graph"):
            ml.load_onnx(rng.integers(0, 256, size, dtype=np.uint8).tobytes())


# -- graph structure ------------------------------------------------------------------------------
def test_cycle_is_refused():
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Neg", ["a"], ["b"], name="second"),
        helper.make_node("Relu", ["a"], ["y"], name="last"),
    ]
    with pytest.raises(errors.OnnxLoadError, match="cycle") as info:
        ml.load_onnx(model(nodes))
    assert "'first'" in str(info.value) and "'second'" in str(info.value)


def test_node_reading_itself_is_a_cycle():
    with pytest.raises(errors.OnnxLoadError, match="cycle.*'loop'"):
        ml.load_onnx(model([helper.make_node("Add", ["x", "y"], ["y"], name="loop")]))


def test_unsorted_acyclic_graph_loads():
    # onnxruntime sorts nodes itself; so does Mithril.
    nodes = [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])]
    pm = ml.compile(ml.load_onnx(model(nodes)), ml.NumpyBackend())
    assert pm.evaluate({}, {"x": np.array([1, -2], np.float32)})["y"].tolist() == [0, 2]


def test_undefined_input_is_refused():
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="adder")]
    with pytest.raises(errors.OnnxLoadError, match="node 'adder' \\(op Add\\) reads 'nowhere'"):
        ml.load_onnx(model(nodes))


def test_undefined_graph_output_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], outputs=[("missing", F32, [2])])
    with pytest.raises(errors.OnnxLoadError, match="graph output 'missing' is not defined"):
        ml.load_onnx(m)


def test_undefined_value_in_subgraph_is_refused():
    then = helper.make_graph([helper.make_node("Neg", ["ghost"], ["t"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("t", F32, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F32, [2])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)
    m = model([node], inputs=[("x", F32, [2]), ("c", TensorProto.BOOL, [])])
    with pytest.raises(errors.OnnxLoadError, match="subgraph 'then_branch' of node 'branch'.*reads 'ghost'"):
        ml.load_onnx(m)


def test_two_nodes_writing_one_value_are_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="one"), helper.make_node("Neg", ["x"], ["y"], name="two")]
    with pytest.raises(errors.OnnxLoadError, match="'y' is defined twice") as info:
        ml.load_onnx(model(nodes))
    assert "'one'" in str(info.value) and "'two'" in str(info.value)


def test_node_overwriting_a_graph_input_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["x"], name="clobber"), helper.make_node("Neg", ["x"], ["y"])]
    with pytest.raises(errors.OnnxLoadError, match="'x' is defined twice: graph input 'x' and node 'clobber'"):
        ml.load_onnx(model(nodes))


def test_recursive_local_function_is_refused():
    body = [helper.make_node("Loopy", ["a"], ["b"], domain="local")]
    fn = helper.make_function("local", "Loopy", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    m = model([helper.make_node("Loopy", ["x"], ["y"], domain="local")], opsets=(("", 17), ("local", 1)))
    m.functions.append(fn)
    with pytest.raises(errors.OnnxLoadError, match="local::Loopy calls itself"):
        ml.load_onnx(m)


# -- ops and opsets -------------------------------------------------------------------------------
def test_unknown_op_is_refused_at_compile():
    # Loading keeps it (``mithril inspect`` reports which backend can run what); compiling refuses.
    m = model([helper.make_node("NotAnOnnxOp", ["x"], ["y"], name="mystery")])
    loaded = ml.load_onnx(m)
    with pytest.raises(errors.UnsupportedOpsError, match="mystery: NotAnOnnxOp \\(opset 17\\)"):
        ml.compile(loaded, ml.NumpyBackend())


def test_unknown_domain_is_refused_at_compile():
    m = model([helper.make_node("Foo", ["x"], ["y"], name="alien", domain="com.example")],
              opsets=(("", 17), ("com.example", 1)))
    with pytest.raises(errors.UnsupportedDomainError, match="alien: com.example::Foo"):
        ml.compile(ml.load_onnx(m), ml.NumpyBackend())


@pytest.mark.parametrize("version, message", [
    (0, "'ai.onnx' has version 0: versions start at 1"),
    (-3, "'ai.onnx' has version -3: versions start at 1"),
    (10**9, "'ai.onnx' has version 1000000000, newer than any released"),
])
def test_absurd_opset_is_refused(version, message):
    m = model([helper.make_node("Relu", ["x"], ["y"])], opsets=(("", version),))
    with pytest.raises(errors.OnnxLoadError, match=message):
        ml.load_onnx(m)


def test_absurd_opset_of_a_known_domain_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], opsets=(("", 17), ("ai.onnx.ml", 10**9)))
    with pytest.raises(errors.OnnxLoadError, match="'ai.onnx.ml' has version 1000000000"):
        ml.load_onnx(m)


def test_missing_opset_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], opsets=())
    with pytest.raises(errors.OnnxLoadError, match="imports no opset"):
        ml.load_onnx(m)
    m.ir_version = 2  # before IR version 3 there was no opset_import: opset 1 is implied
    assert ml.load_onnx(m).opset == 1


# -- tensors --------------------------------------------------------------------------------------
def test_raw_data_of_the_wrong_length_is_refused():
    w = TensorProto(name="w", data_type=F32, dims=[2], raw_data=b"\0" * 7)
    with pytest.raises(errors.OnnxLoadError, match="initializer 'w' has 7 bytes of raw_data .* need 8 bytes"):
        ml.load_onnx(add_w(w))


def test_typed_data_of_the_wrong_count_is_refused():
    w = TensorProto(name="w", data_type=F32, dims=[2], float_data=[1.0])
    with pytest.raises(errors.OnnxLoadError, match="initializer 'w' holds 1 values but its dims \\[2\\] need 2"):
        ml.load_onnx(add_w(w))


def test_constant_attribute_of_the_wrong_length_is_refused():
    value = TensorProto(name="v", data_type=TensorProto.INT64, dims=[3], raw_data=b"\0" * 16)
    node = helper.make_node("Constant", [], ["y"], name="const", value=value)
    m = model([node], inputs=(), outputs=[("y", TensorProto.INT64, [3])])
    with pytest.raises(errors.OnnxLoadError, match="node 'const' \\(op Constant\\) attribute 'value' has 16 bytes"):
        ml.load_onnx(m)


def test_invalid_dtype_is_refused():
    for dtype in (TensorProto.UNDEFINED, 99):
        w = TensorProto(name="w", data_type=dtype, dims=[2], raw_data=b"\0" * 8)
        with pytest.raises(errors.OnnxLoadError, match="initializer 'w' has an invalid element type"):
            ml.load_onnx(add_w(w))


def test_negative_dim_is_refused():
    w = TensorProto(name="w", data_type=F32, dims=[-2], raw_data=b"")
    with pytest.raises(errors.OnnxLoadError, match="initializer 'w' has a negative dim -2"):
        ml.load_onnx(add_w(w))


def test_tensor_too_large_to_allocate_is_refused_before_allocating():
    # 10**24 float32 elements: refused from the dims alone, naming the tensor and its byte size.
    w = TensorProto(name="huge", data_type=F32, dims=[10**6] * 4)
    m = model([helper.make_node("Add", ["x", "huge"], ["y"])], initializers=[w])
    with pytest.raises(errors.TensorTooLargeError, match="initializer 'huge' .* would take 4000000000000000000000000 bytes"):
        ml.load_onnx(m)


def test_dims_overflowing_int64_are_refused():
    w = TensorProto(name="w", data_type=TensorProto.DOUBLE, dims=[2**62, 2**62, 4])
    with pytest.raises(errors.TensorTooLargeError, match=f"would take {2**62 * 2**62 * 4 * 8} bytes"):
        ml.load_onnx(add_w(w))


def test_sparse_tensor_expanding_past_memory_is_refused():
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "s_idx")
    sparse = helper.make_sparse_tensor(values, indices, [10**7, 10**7])
    node = helper.make_node("Constant", [], ["y"], name="dense", sparse_value=sparse)
    m = model([node], inputs=(), outputs=[("y", F32, [10**7, 10**7])])
    with pytest.raises(errors.TensorTooLargeError, match="node 'dense' .* would take 400000000000000 bytes"):
        ml.load_onnx(m)


def test_sparse_index_out_of_range_is_refused():
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.array([5], np.int64), "s_idx")
    node = helper.make_node("Constant", [], ["y"], name="dense",
                            sparse_value=helper.make_sparse_tensor(values, indices, [2]))
    m = model([node], inputs=(), outputs=[("y", F32, [2])])
    with pytest.raises(errors.OnnxLoadError, match="sparse index lies outside the dims \\[2\\]"):
        ml.load_onnx(m)


def test_size_limit_is_configurable_and_honest_sizes_pass():
    w = numpy_helper.from_array(np.ones((1024, 256), np.float32), "w")  # 1 MiB
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], inputs=[("x", F32, [1024, 256])],
              outputs=[("y", F32, [1024, 256])], initializers=[w])
    assert ml.load_onnx(m).initializer_names == ["w"]
    with pytest.raises(errors.TensorTooLargeError, match="initializer 'w' .* 1048576 bytes, more than the limit of 1000"):
        ml.load_onnx(m, max_tensor_bytes=1000)
    assert default_max_tensor_bytes() > 1 << 30


# -- external data --------------------------------------------------------------------------------
def external_model(folder, location, offset=None, length=None, data=np.ones(2, np.float32).tobytes()):
    """A model whose initializer ``w`` (2 float32) lives in ``location``; writes ``data`` to
    ``folder/weights.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(data)
    w = TensorProto(name="w", data_type=F32, dims=[2])
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if offset is not None:
        entries["offset"] = str(offset)
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    path = folder / "model.onnx"
    path.write_bytes(add_w(w).SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    path = external_model(tmp_path / "m", "weights.bin")
    pm = ml.compile(ml.load_onnx(path), ml.NumpyBackend())
    assert pm.evaluate(None, {"x": np.zeros(2, np.float32)})["y"].tolist() == [1, 1]


def test_external_data_with_dotdot_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    path = external_model(tmp_path / "m", "../secret.bin")
    with pytest.raises(errors.UnsafeExternalDataError, match="initializer 'w'.*'../secret.bin' escapes the model folder"):
        ml.load_onnx(path)


def test_external_data_with_absolute_path_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    path = external_model(tmp_path / "m", str(tmp_path / "secret.bin"))
    with pytest.raises(errors.UnsafeExternalDataError, match="initializer 'w'.*is absolute"):
        ml.load_onnx(path)


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_external_data_through_a_symlink_leaving_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    path = external_model(tmp_path / "m", "link.bin")
    os.symlink(tmp_path / "secret.bin", tmp_path / "m" / "link.bin")
    with pytest.raises(errors.UnsafeExternalDataError, match="'link.bin' escapes the model folder"):
        ml.load_onnx(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_external_data_in_a_fifo_is_refused_without_blocking(tmp_path):
    path = external_model(tmp_path / "m", "pipe.bin")
    os.mkfifo(tmp_path / "m" / "pipe.bin")  # opening it for reading would block forever
    with pytest.raises(errors.OnnxLoadError, match="not a regular file"):
        ml.load_onnx(path)


def test_external_data_offset_past_the_end_is_refused(tmp_path):
    path = external_model(tmp_path / "m", "weights.bin", offset=4096)
    with pytest.raises(errors.OnnxLoadError, match="initializer 'w'.*region \\[4096, 4096\\) runs past the end .* \\(8 bytes\\)"):
        ml.load_onnx(path)


def test_external_data_length_past_the_end_is_refused(tmp_path):
    path = external_model(tmp_path / "m", "weights.bin", offset=4, length=8)
    with pytest.raises(errors.OnnxLoadError, match="region \\[4, 12\\) runs past the end"):
        ml.load_onnx(path)


def test_external_data_length_not_matching_dims_is_refused(tmp_path):
    path = external_model(tmp_path / "m", "weights.bin", data=b"\0" * 64)
    with pytest.raises(errors.OnnxLoadError, match="external data holds 64 bytes .* need 8 bytes"):
        ml.load_onnx(path)


def test_external_data_in_bytes_is_refused(tmp_path):
    # Without a model file there is no folder: the data would be read relative to the cwd.
    path = external_model(tmp_path / "m", "weights.bin")
    with pytest.raises(errors.OnnxLoadError, match="can only be read when the model is loaded from a path"):
        ml.load_onnx(path.read_bytes())


def test_graph_input_of_undefined_type_is_refused():
    for dtype in (TensorProto.UNDEFINED, 99):
        m = model([helper.make_node("Relu", ["x"], ["y"])], inputs=[("x", dtype, [2])])
        with pytest.raises(errors.OnnxLoadError, match="graph input 'x' declares an invalid element type"):
            ml.load_onnx(m)


def test_node_with_too_few_inputs_is_refused():
    m = model([helper.make_node("Shape", [], ["s"], name="shape"), helper.make_node("Relu", ["x"], ["y"])])
    with pytest.raises(errors.OnnxLoadError, match="node 'shape' \\(op Shape, opset 17\\) has 0 input\\(s\\); the schema takes 1"):
        ml.load_onnx(m)


def test_attribute_of_the_wrong_type_is_refused():
    node = helper.make_node("Softmax", ["x"], ["y"], name="soft", axis=0)
    node.attribute[0].type = onnx.AttributeProto.TENSOR  # declared a tensor, holds an int
    with pytest.raises(errors.OnnxLoadError, match="attribute 'axis' is of type TENSOR but the schema wants INT"):
        ml.load_onnx(model([node]))


def test_missing_required_attribute_is_refused():
    m = model([helper.make_node("Cast", ["x"], ["y"], name="cast")])
    with pytest.raises(errors.OnnxLoadError, match="node 'cast' \\(op Cast, opset 17\\) lacks its required attribute 'to'"):
        ml.load_onnx(m)


def test_names_that_are_not_utf8_are_refused():
    data = relu_model().SerializeToString().replace(b"Relu", b"Re\x98u")
    with pytest.raises(errors.OnnxLoadError, match="not valid UTF-8 text: b'Re\\\\x98u'"):
        ml.load_onnx(data)


def test_loading_leaves_the_callers_proto_unchanged():
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "s_idx")
    node = helper.make_node("Constant", [], ["y"], sparse_value=helper.make_sparse_tensor(values, indices, [2]))
    m = model([node], inputs=(), outputs=[("y", F32, [2])], opsets=(), ir_version=2)
    before = m.SerializeToString()
    ml.load_onnx(m)
    assert m.SerializeToString() == before


def test_einsum_equation_that_hangs_shape_inference_is_refused():
    # onnx's Einsum shape inference (onnxruntime's too) never returns on 'j-.i'.
    m = model([helper.make_node("Einsum", ["x"], ["y"], name="ein", equation="j-.i")], inputs=[("x", F32, [4, 4])])
    with pytest.raises(errors.OnnxLoadError, match="node 'ein' \\(op Einsum, opset 17\\) has an invalid equation b'j-.i'"):
        ml.load_onnx(m)


def test_compile_never_materializes_a_huge_constant():
    # ConstantOfShape [20000, 20000] (1.6 GB of float32) is left to run time, not folded.
    import resource

    shape = numpy_helper.from_array(np.array([20000, 20000], np.int64), "s")
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["x", "c"], ["y"])]
    m = model(nodes, inputs=[("x", F32, [1])], outputs=[("y", F32, None)], initializers=[shape])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    pm = ml.compile(ml.load_onnx(m), ml.NumpyBackend())
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert "ConstantOfShape" in pm.code
    assert grown_mib < 500, f"compiling grew the process by {grown_mib:.0f} MiB"


def test_file_over_the_protobuf_limit_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        f.truncate(2**31)  # a sparse file: 2 GiB long, nothing written, nothing to read
    with pytest.raises(errors.OnnxLoadError, match="is 2147483648 bytes: an ONNX protobuf holds at most 2 GiB"):
        ml.load_onnx(path)
