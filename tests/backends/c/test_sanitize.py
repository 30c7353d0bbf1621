"""Issue 18 Must 7, "Safe": generated C run under AddressSanitizer and UBSan, and every call
checked in Python before it enters C.

The zoo's MLP, LeNet and ResNet-18 and a sample of node-suite cases are exported with
``ml.export_c`` (each under its own API prefix), compiled together into one executable with
``-fsanitize=address,undefined -fno-sanitize-recover=all`` (one compile: the kernel library is
parsed and instrumented once), run on the cases' inputs, and compared with NumPy (models) or
the suite's expected outputs (node cases). Any sanitizer report aborts the run and fails.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings

import numpy as np
import pytest

import mithril as ml
import models_zoo
from mithril.errors import DTypeError, MithrilError, ShapeError

CC = shutil.which("cc") or shutil.which("gcc")
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) on PATH")

# Node-suite cases whose op set the C backend runs strictly (fallback=None): one case per op set,
# picked with export_c over the whole suite (those C refuses left out), with the module of
# onnx.backend.test.case.node that makes each (importing only these takes ~2 s; the whole suite,
# ~20 s). The pooling modules (averagepool, lppool, maxpool: ~10 s of reference pooling) are left
# out: the zoo's LeNet and ResNet-18 run MaxPool and AveragePool here.
NODE_CASES = {
    'test_abs': 'abs',
    'test_acos_example': 'acos',
    'test_add': 'add',
    'test_and2d': 'and_',
    'test_argmax_no_keepdims_example': 'argmax',
    'test_argmin_no_keepdims_example': 'argmin',
    'test_atan_example': 'atan',
    'test_basic_conv_with_padding': 'conv',
    'test_batchnorm_example': 'batch_normalization',
    'test_bitshift_right_uint8': 'bitshift',
    'test_bitwise_and_i32_2d': 'bitwiseand',
    'test_bitwise_not_2d': 'bitwisenot',
    'test_ceil_example': 'ceil',
    'test_celu': 'celu',
    'test_clip_default_inbounds': 'clip',
    'test_concat_1d_axis_0': 'concat',
    'test_constantofshape_float_ones': 'constantofshape',
    'test_convtranspose': 'convtranspose',
    'test_cos_example': 'cos',
    'test_depthtospace_example': 'depthtospace',
    'test_div_example': 'div',
    'test_dropout_default': 'dropout',
    'test_edge_pad': 'pad',
    'test_elu_example': 'elu',
    'test_mean_example': 'mean',  # Mean scales its sum in place (the unary kernels take aliased x and y)
    'test_equal': 'equal',
    'test_erf': 'erf',
    'test_exp_example': 'exp',
    'test_expand_dim_changed': 'expand',
    'test_eyelike_without_dtype': 'eyelike',
    'test_flatten_axis0': 'flatten',
    'test_floor_example': 'floor',
    'test_gather_0': 'gather',
    'test_gather_elements_0': 'gatherelements',
    'test_gathernd_example_int32': 'gathernd',
    'test_gelu_tanh_1': 'gelu',
    'test_gemm_default_zero_bias': 'gemm',
    'test_globalaveragepool': 'globalaveragepool',
    'test_globalmaxpool': 'globalmaxpool',
    'test_greater_equal': 'greater_or_equal',
    'test_group_normalization_example': 'groupnormalization',
    'test_hardmax_example': 'hardmax',
    'test_hardswish': 'hardswish',
    'test_instancenorm_example': 'instance_normalization',
    'test_isinf': 'isinf',
    'test_isnan': 'isnan',
    'test_layer_normalization_4d_axis0': 'layernormalization',
    'test_leakyrelu_example': 'leakyrelu',
    'test_log_example': 'log',
    'test_logsoftmax_example_1': 'logsoftmax',
    'test_lrn': 'lrn',
    'test_matmul_2d': 'matmul',
    'test_max_example': 'max',
    'test_mod_mixed_sign_float64': 'mod',
    'test_mvn': 'meanvariancenormalization',
    'test_neg_example': 'neg',
    'test_not_2d': 'not_',
    'test_pow_example': 'pow',
    'test_prelu_example': 'prelu',
    'test_reciprocal_example': 'reciprocal',
    'test_reduce_log_sum_exp_do_not_keepdims_example': 'reduce_log_sum_exp',
    'test_reduce_prod_do_not_keepdims_example': 'reduceprod',
    'test_reduce_sum_square_do_not_keepdims_example': 'reducesumsquare',
    'test_reshape_reordered_all_dims': 'reshape',
    'test_resize_upsample_scales_nearest': 'resize',
    'test_reversesequence_time': 'reversesequence',
    'test_round': 'round',
    'test_scatter_elements_without_axis': 'scatterelements',
    'test_scatternd': 'scatternd',
    'test_selu_example': 'selu',
    'test_shrink_hard': 'shrink',
    'test_sigmoid_example': 'sigmoid',
    'test_sign': 'sign',
    'test_slice': 'slice',
    'test_softmax_example': 'softmax',
    'test_softplus_example': 'softplus',
    'test_spacetodepth': 'spacetodepth',
    'test_split_equal_parts_1d_opset13': 'split',
    'test_sqrt_example': 'sqrt',
    'test_squeeze': 'squeeze',
    'test_sum_example': 'sum',
    'test_tanh_example': 'tanh',
    'test_tile': 'tile',
    'test_transpose_default': 'transpose',
    'test_triu': 'trilu',
    'test_unsqueeze_axis_0': 'unsqueeze',
    'test_where_example': 'where',
    'test_xor2d': 'xor',
    'test_attention_4d_expanded': 'attention',
    'test_rotary_embedding_expanded': 'rotaryembedding',
    'test_swish_expanded': 'swish',
}

ZOO = {
    "mlp": (lambda: models_zoo.mlp([16, 8, 4]), (2, 12)),
    "lenet": (lambda: models_zoo.lenet(num_classes=10), (2, 1, 32, 32)),
    "resnet18": (lambda: models_zoo.resnet18(num_classes=10), (1, 3, 16, 16)),
}


@pytest.fixture(scope="module")
def sanitizers(tmp_path_factory):
    """Skip when the compiler cannot build and run a sanitized program (no libasan/libubsan)."""
    d = tmp_path_factory.mktemp("asan-probe")
    (d / "p.c").write_text("#include <stdlib.h>\nint main(void) { int *p = malloc(4); p[0] = 0; "
                           "int r = p[0]; free(p); return r; }\n")
    done = subprocess.run([CC, *SANITIZE, "-o", str(d / "p"), str(d / "p.c")], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{CC} cannot build with -fsanitize=address,undefined (no sanitizer runtime): "
                    f"{done.stderr.strip()[:200]}")
    if subprocess.run([str(d / "p")], capture_output=True).returncode != 0:
        pytest.skip("a program built with -fsanitize=address,undefined does not run here (ptrace/ASLR limits)")
    # The sanitizers are live: a heap overflow one past the end aborts with ASan's report.
    (d / "bad.c").write_text("#include <stdlib.h>\nint main(int argc, char **argv) { (void)argv; int *p = malloc(16); "
                             "int r = p[argc + 3]; free(p); return r; }\n")
    subprocess.run([CC, *SANITIZE, "-o", str(d / "bad"), str(d / "bad.c")], check=True, capture_output=True)
    bad = subprocess.run([str(d / "bad")], capture_output=True, text=True)
    assert bad.returncode != 0 and "heap-buffer-overflow" in bad.stderr


def _driver(cases: list[tuple[str, list[np.ndarray], int]]) -> str:
    """main(): for each exported model k, init (weights from DIR/k/k.bin), read DIR/k/in<i>.bin,
    run, write DIR/k/out<j>.bin; any failure is printed and ends the run with status 1."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>"]
    lines += [f'#include "{k}/{k}.c"' for k, _, _ in cases]
    lines += ["typedef struct { const char *name; int (*init)(const char *); int (*run)(const void *const *, void *const *);",
              "  void (*fin)(void); const char *(*msg)(int); int nin, nout; const size_t *inb, *outb; } model_t;",
              "static const model_t models[] = {"]
    for k, _, _ in cases:
        K = k.upper()
        lines.append(f'  {{"{k}", {k}_init, {k}_run_io, {k}_free, {k}_status_message, {K}_NUM_INPUTS, {K}_NUM_OUTPUTS, '
                     f"{k}_input_bytes, {k}_output_bytes}},")
    lines += ["};", r"""
static void *slurp(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    char *b = malloc(n ? n : 1);
    if (!f || !b || fread(b, 1, n, f) != n) { fprintf(stderr, "%s: cannot read %zu bytes\n", path, n); exit(1); }
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    char path[4096];
    if (argc != 2) return 2;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; ++m) {
        const model_t *M = &models[m];
        void *ins[16] = {0}, *outs[16] = {0};
        snprintf(path, sizeof path, "%s/%s/%s.bin", argv[1], M->name, M->name);
        int s = M->init(path);
        if (s) { fprintf(stderr, "%s: init: %s\n", M->name, M->msg(s)); return 1; }
        for (int i = 0; i < M->nin; ++i) {
            snprintf(path, sizeof path, "%s/%s/in%d.bin", argv[1], M->name, i);
            ins[i] = slurp(path, M->inb[i]);
        }
        for (int j = 0; j < M->nout; ++j) outs[j] = malloc(M->outb[j] ? M->outb[j] : 1);
        s = M->run((const void *const *)ins, outs);
        if (s) { fprintf(stderr, "%s: run: %s\n", M->name, M->msg(s)); return 1; }
        for (int j = 0; j < M->nout; ++j) {
            snprintf(path, sizeof path, "%s/%s/out%d.bin", argv[1], M->name, j);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(outs[j], 1, M->outb[j], f) != M->outb[j]) { fprintf(stderr, "%s: cannot write\n", path); return 1; }
            fclose(f);
        }
        for (int i = 0; i < M->nin; ++i) free(ins[i]);
        for (int j = 0; j < M->nout; ++j) free(outs[j]);
        M->fin();
    }
    return 0;
}
"""]
    return "\n".join(lines)


def _run_sanitized(root, cases) -> dict[str, list[np.ndarray]]:
    """Build ``cases`` (name, inputs, exported outputs as (shape, dtype)) into one sanitized
    executable under ``root``, run it, and read the outputs back."""
    for k, inputs, _ in cases:
        for i, x in enumerate(inputs):
            np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<"), copy=False).tofile(root / k / f"in{i}.bin")
    (root / "driver.c").write_text(_driver(cases))
    build = subprocess.run([CC, "-O1", "-g", *SANITIZE, "-std=c11", "-Wall", "-Wextra", "-Werror",
                            "-fopenmp", f"-I{root / cases[0][0] / 'lib'}",
                            "-o", str(root / "driver"), str(root / "driver.c"), "-lm"],
                           capture_output=True, text=True, cwd=root)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(root / "driver"), str(root)], capture_output=True, text=True, timeout=300,
                         env={"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1", "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0 and "runtime error" not in run.stderr and "Sanitizer" not in run.stderr, run.stderr[-3000:]
    return {k: [np.fromfile(root / k / f"out{j}.bin", dtype).reshape(shape) for j, (shape, dtype) in enumerate(outs)]
            for k, _, outs in cases}


def _node_case(name: str, module: str):
    """The suite's case ``name``, importing only ``module`` (it registers its cases on import)."""
    import importlib

    import onnx.backend.test.case.node as suite

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        importlib.import_module(f"onnx.backend.test.case.node.{module}")
    found = [tc for tc in suite._NodeTestCases if tc.name == name]
    assert found, f"{name} is not made by onnx.backend.test.case.node.{module}"
    return found[0]


def _zoo_params(pm):
    params = {k: np.asarray(v) for k, v in pm.randomize_params().items()}
    for k in params:
        if k.endswith("running_var"):
            params[k] = np.abs(params[k]) + 0.5
    return params


@pytest.mark.slow  # one sanitized compile of ~95 models: 10-30 s
def test_zoo_and_node_cases_run_clean_under_asan_and_ubsan(tmp_path, sanitizers):
    cases, expected, tolerances = [], {}, {}
    rng = np.random.default_rng(0)
    for k, (make, shape) in ZOO.items():
        model = make()
        ref = ml.compile(model, ml.NumpyBackend(), shapes={"input": shape}, inference=True)
        params = _zoo_params(ref)
        out = ml.export_c(model, tmp_path / k, shapes={"input": shape}, params=params, name=k,
                          weights="file" if k == "resnet18" else "auto")
        x = rng.standard_normal(shape).astype(np.float32)
        expected[k] = [ref.evaluate(params, {"input": x})["output"]]
        tolerances[k] = (1e-4, 1e-5)
        cases.append((k, [x], [(s, np.dtype(d)) for _, s, d in out.outputs]))
    for i, name in enumerate(NODE_CASES):
        tc = _node_case(name, NODE_CASES[name])
        (inputs, outputs), = tc.data_sets
        model = ml.load_onnx(tc.model)
        names = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
        k = f"n{i}"
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            out = ml.export_c(model, tmp_path / k, shapes={n: x.shape for n, x in zip(names, inputs)}, name=k)
        cases.append((k, [np.asarray(x) for x in inputs], [(s, np.dtype(d)) for _, s, d in out.outputs]))
        expected[k] = [np.asarray(y) for y in outputs]
        tolerances[k] = (tc.rtol, tc.atol)
    got = _run_sanitized(tmp_path, cases)
    names = {f"n{i}": n for i, n in enumerate(NODE_CASES)}
    for k, want in expected.items():
        rtol, atol = tolerances[k]
        for j, (g, w) in enumerate(zip(got[k], want)):
            assert g.shape == w.shape and g.dtype == w.dtype, (names.get(k, k), j, g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{names.get(k, k)} output {j}")


# -- the Python side: every call checked before it enters C -------------------------------
@pytest.fixture(scope="module")
def lenet_c(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MITHRIL_CACHE_DIR", str(tmp_path_factory.mktemp("mithril-c-cache")))
    pm = ml.compile(models_zoo.lenet(num_classes=10), ml.CBackend(fallback=None), shapes={"input": (1, 1, 32, 32)},
                    inference=True, static_shapes=True)
    yield pm
    mp.undo()


def test_a_wrong_shape_is_refused_before_c(lenet_c):
    params = lenet_c.get_parameters()
    with pytest.raises(ShapeError, match=r"input 'input' expects shape \[1, 1, 32, 32\] but got \[1, 1, 28, 28\]"):
        lenet_c.evaluate(params, {"input": np.zeros((1, 1, 28, 28), np.float32)})
    with pytest.raises(ShapeError, match=r"expects shape \[1, 1, 32, 32\] but got \[32, 32\]"):
        lenet_c.evaluate(params, {"input": np.zeros((32, 32), np.float32)})


def test_a_wrong_dtype_is_refused_before_c(lenet_c):
    params = lenet_c.get_parameters()
    with pytest.raises(DTypeError, match="input 'input' expects float32 but got float64"):
        lenet_c.evaluate(params, {"input": np.zeros((1, 1, 32, 32), np.float64)})
    bad = dict(params, **{"conv1.weight": np.zeros((6, 1, 3, 3), np.float32)})
    with pytest.raises(ShapeError, match="parameter 'conv1.weight' expects shape"):
        lenet_c.evaluate(bad, {"input": np.zeros((1, 1, 32, 32), np.float32)})


def test_a_segment_refuses_a_buffer_it_was_not_compiled_for(lenet_c):
    """The last guard, under evaluate's checks: CProgram.run_segment itself."""
    params = {k: np.asarray(v) for k, v in lenet_c.get_parameters().items()}
    x = np.zeros((1, 1, 32, 32), np.float32)
    assert lenet_c.program.run(params, {"input": x})["output"].shape == (1, 10)
    with pytest.raises(MithrilError, match=r"'input' must be a float32 array of shape \(1, 1, 32, 32\).*got float64"):
        lenet_c.program.run(params, {"input": x.astype(np.float64)})
    with pytest.raises(MithrilError, match=r"must be a float32 array of shape \(1, 1, 32, 32\).*got float32 \(2, 1, 32, 32\)"):
        lenet_c.program.run(params, {"input": np.zeros((2, 1, 32, 32), np.float32)})
