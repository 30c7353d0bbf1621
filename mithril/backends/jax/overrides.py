"""JAX kernels where the shared ones use NumPy-only constructs or XLA has a faster primitive.

Control flow maps to lax.cond / lax.while_loop / lax.scan when a value is traced; a body
whose shapes change between iterations cannot be one XLA loop, so it falls back to the shared
Python form (which, under jit, makes the whole program fall back to eager with a warning).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..kernels import control_flow, elementwise, nn, signal
from ..kernels.geometry import transposed_window, window
from ..kernels.nn import add_bias
from ..kernels.shape import element_index
from ..registry import override

# Failures of an XLA control-flow construct that the Python form may still handle.
_LAX_FAILURES = (TypeError, ValueError, jax.errors.JAXTypeError, jax.errors.JAXIndexError)


def _traced(*values) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


# ---------------------------------------------------------------------------------------------
# Convolution. On accelerators, XLA's own convolution. On the CPU, XLA's (Eigen) convolution is
# several times slower than onnxruntime's, and far slower for depthwise kernels (docs/performance.md),
# so the CPU path is written out:
#   * depthwise: one multiply-add of a shifted slice per kernel offset, which XLA fuses into a
#     single loop;
#   * otherwise im2col in channel-batch-pixel order, so the patch matrix is (C*k*k, N*pixels) and the
#     whole convolution is one plain 2-D matmul per group (no batched dot; the batch axis moves
#     into the matmul's N dimension, transposing the small input and output, never the patches);
#   * except where that patch matrix would pass 16 MB: then one sample at a time (lax.map), or
#     XLA's convolution when even one sample's patches are that large;
#   * and except where the backend's compiler options send XLA's convolution to XNNPACK and the
#     layer is one XNNPACK runs faster (below): the kernel's ``ctx`` (KernelOptions) says so.


def _on_cpu() -> bool:
    device = jax.config.jax_default_device  # set by JaxBackend.scope()
    return (device.platform if device is not None and not isinstance(device, str) else jax.default_backend()) == "cpu"


_PATCHES_MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class KernelOptions:
    """What a JaxBackend's options decide for the kernels that declare ``ctx`` (Conv, and the fused
    ops that run it): the backend's value is the generated program's ``ctx``. The default is XLA's
    own options.

    >>> import mithril as ml
    >>> ml.JaxBackend(compiler_options={}).kernel_context
    KernelOptions(library_convolutions=False, ynn_dots=True, small_images_to_library=False)
    """

    # The compiler options send `convolution` HLOs to XNNPACK.
    library_convolutions: bool = False
    # The compiler options leave dots to YNNPACK.
    ynn_dots: bool = False
    # A forward program traced for a CPU with AVX-512 (JaxBackend's jit passes it): XNNPACK's
    # convolution at every image size there (the 196-pixel floor below holds for gradient
    # programs and other CPUs).
    small_images_to_library: bool = False


_XLA_DEFAULTS = KernelOptions()


# XNNPACK against im2col + Eigen, per ResNet layer on 2 AVX2 cores (ms, batch 1): 64x56x56 1.6 vs
# 2.2, 128x28x28 1.5 vs 1.7, 64->128 stride 2 to 28x28 0.9 vs 1.1; the 3-channel 7x7 stem 2.5 vs
# 2.4. Those XNNPACK times included a transposing copy of the filter on every call; read in place
# (_conv_general), XNNPACK also wins at 14x14: whole ResNet-18, interleaved with onnxruntime, 1.29x
# against 1.37x with im2col there, and 1.33x with XNNPACK down to 7x7 as well (batch 8, whose 7x7
# layers have 392 pixels: 1.38x against 1.40x). So XNNPACK from 196 output pixels per call (14x14
# at batch 1) and 16 input channels.
# Where dots go to YNNPACK (an Intel Xeon with AVX-512), im2col's matmul is slower than Eigen's
# and XNNPACK wins at every size, 7x7 included (1 thread, ms): 512x7x7 2.65 against 5.5 with
# im2col + YNNPACK (3.6 with Eigen), 256->512 stride 2 to 7x7 1.5 against 2.9; whole ResNet-18
# 32 against 40 ms. Its 3-channel stem stays im2col (the channel floor).
# On an AMD EPYC (Zen 4, AVX-512, Eigen's dots) XNNPACK's 7x7 layers took ResNet-18 45.8 -> 43.1
# ms at 1 thread (one process, alternating blocks; even at 2), its stem 45.6 (slower). Not in
# gradient programs: a ResNet-18 trained over a four-device fsdp mesh drifted from its one-device
# run with them (tests/distributed/test_jax.py).
_LIBRARY_MIN_PIXELS = 196
_LIBRARY_MIN_CHANNELS = 16


def _library_conv_wins(x, w, win, group, ctx: KernelOptions) -> bool:
    # XNNPACK's convolution is 2-D; other ranks and dtypes would fall back to XLA's Eigen one.
    return (ctx.library_convolutions and x.ndim == 4 and x.dtype == jnp.float32
            and group == 1 and w.shape[1] >= _LIBRARY_MIN_CHANNELS
            and math.prod(win.kernel) > 1
            and (ctx.ynn_dots or ctx.small_images_to_library
                 or x.shape[0] * math.prod(win.out) >= _LIBRARY_MIN_PIXELS))


# Spatial axis letters for lax's dimension-number strings, by rank.
_SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def _conv_general(x, w, **kwargs):
    """lax.conv_general_dilated of an (N, C, *S) input and an (M, C/group, *kernel) filter."""
    nd = x.ndim - 2
    if _on_cpu() and nd in _SPATIAL:
        # XLA:CPU's convolutions (XNNPACK's and Eigen's) read the filter as (*kernel, C, M). Left
        # as (M, C, *kernel), XLA transposes the weights on every call (ResNet-18: 31.7 against
        # 29.9 ms); transposed here, it is parameter-only work, done once (hoist.py).
        s = _SPATIAL[nd]
        w = jnp.transpose(w, (*range(2, 2 + nd), 1, 0))
        kwargs["dimension_numbers"] = (f"NC{s}", f"{s}IO", f"NC{s}")
    return lax.conv_general_dilated(x, w, **kwargs)


def _lax_conv(x, w, b, win, group):
    y = _conv_general(
        x, w, window_strides=win.strides, padding=list(zip(win.begin, win.end)),
        rhs_dilation=win.dilations, feature_group_count=group,
    )
    return add_bias(y, b, jnp)


# Eigen's matmul with fewer rows than this is faster the other way round, (M, C) @ (C, pixels):
# MobileNetV2's 7x7 layers, 320->1280 0.30-0.34 against 0.42-0.52 ms, 160->960 0.14-0.18 against
# 0.18-0.29; from 14x14 (196 rows) rows @ W.T wins, 64->384 0.12 against 0.17 ms (on an AMD EPYC).
# YNNPACK's (an Intel Xeon with AVX-512) runs rows @ W.T faster whatever the rows: 320->1280 at
# 7x7 0.34 against 0.63 ms, and MobileNetV2 as a whole 11.8 against 13.7 ms of CPU a call on 2
# threads, 10.2 against 11.8 on one (the Eigen program's own times: 12.9 and 10.2).
_POINTWISE_MIN_ROWS = 64


def _channels_last(x):
    return jnp.moveaxis(x, 1, -1)  # (N, C, *S) -> (N, *S, C)


def _channels_first(y):
    return jnp.moveaxis(y, -1, 1)


def _conv_cpu(x, w, b, win, group, ctx: KernelOptions):
    n, c = x.shape[:2]
    m = w.shape[0]
    nd = w.ndim - 2
    w = w.astype(x.dtype)
    if group == c and group > 1 and w.shape[1] == 1:
        # Depthwise (output channel o reads input channel o // multiplier), channels last: each
        # tap is a multiply-add over whole channel vectors, and the per-tap weight vectors depend
        # on the parameters alone (the JAX backend computes them once, hoist.py).
        # Half-precision inputs accumulate in float32, as a matmul would.
        acc = jnp.float32 if jnp.dtype(x.dtype).itemsize < 4 else x.dtype
        padded = nn.pad_spatial(_channels_last(x), win, 0, jnp, channels_last=True).astype(acc)
        # XLA rewrites a tap that lies inside the unpadded input (the centre one) to read the pad's
        # operand, and then fuses that operand's producer into the depthwise loop, recomputing it
        # there. After MobileNetV2's stem, whose matmul writes channels first, that recomputation
        # includes a transpose read across 32 rows of 50 KB. The barrier keeps every tap on the
        # padded copy: MobileNetV2 6.86 against 7.09 ms a call, interleaved with onnxruntime.
        padded = lax.optimization_barrier(padded)
        if m != c:
            padded = jnp.repeat(padded, m // c, axis=-1)
        y = None
        for offset, tap in nn.window_taps(padded, win, channels_last=True):
            term = tap * w[(slice(None), 0) + offset].astype(acc)
            y = term if y is None else y + term
        return add_bias(_channels_first(y.astype(x.dtype)), b, jnp)
    if group == 1 and math.prod(win.kernel) == 1 and not any(win.begin) and not any(win.end):
        # Pointwise, reading the input channels last: (N*pixels, C) rows, whatever the batch. Around
        # depthwise layers (MobileNet) the moves between layouts cancel across the elementwise ops
        # in between (XLA makes them bitcasts), so the whole block runs channels last.
        rows = jnp.reshape(_channels_last(x)[(slice(None), *(slice(None, None, s) for s in win.strides))], (-1, c))
        w2 = jnp.reshape(w, (m, c))
        if rows.shape[0] >= _POINTWISE_MIN_ROWS or ctx.ynn_dots:
            # rows @ W.T, channels last out; W.T is parameter-only work (hoist.py).
            y = _channels_first(jnp.reshape(rows @ jnp.transpose(w2), (n, *win.out, m)))
        else:
            # Few rows: W @ rows.T, channels first out, which Eigen runs faster there.
            y = lax.dot_general(w2, rows, (((1,), (1,)), ((), ())))
            y = jnp.moveaxis(jnp.reshape(y, (m, n, *win.out)), 0, 1)
        return add_bias(y, b, jnp)
    if _library_conv_wins(x, w, win, group, ctx):
        return _lax_conv(x, w, b, win, group)
    cg, mg = c // group, m // group
    spatial = tuple(range(2, 2 + nd))
    taps = math.prod(win.kernel)
    sample_bytes = c * taps * math.prod(win.out) * x.dtype.itemsize
    if taps > 1 and n > 1 and n * sample_bytes > _PATCHES_MAX_BYTES and sample_bytes <= _PATCHES_MAX_BYTES:
        # Patch matrices this large (batched early layers: 58 MB for ResNet's 64x56x56 at batch 8)
        # cost more to write than the matmul takes: one sample at a time in an XLA loop instead
        # (batch 8: 21 ms, against 60 ms for the whole batch's patches and 25 ms for lax.conv).
        return lax.map(lambda xi: _conv_cpu(xi[None], w, b, win, group, ctx)[0], x)
    if taps > 1 and n * sample_bytes > _PATCHES_MAX_BYTES:
        return _lax_conv(x, w, b, win, group)
    xt = jnp.transpose(x, (1, 0) + spatial)  # (c, n, *size): a bitcast when n == 1
    padded = nn.pad_spatial(xt, win, 0, jnp)
    taps = [tap for _, tap in nn.window_taps(padded, win)]
    cols = taps[0] if len(taps) == 1 else jnp.stack(taps, axis=1)  # (c, taps, n, *out)
    length = n * math.prod(win.out)
    if group == 1:
        y = jnp.reshape(w, (m, -1)) @ jnp.reshape(cols, (c * len(taps), length))
    else:
        y = jnp.reshape(w, (group, mg, -1)) @ jnp.reshape(cols, (group, cg * len(taps), length))
    y = jnp.transpose(jnp.reshape(y, (m, n) + win.out), (1, 0) + spatial)
    return add_bias(y, b, jnp)


@override("jax", "Conv", since=1,
          reason="speed: on the CPU im2col as one 2-D matmul, depthwise as fused shifted slices, XNNPACK where faster (XLA's Eigen conv is 2-3x slower); lax's conv elsewhere")
def conv(x, w, b=None, *, auto_pad, dilations, group, kernel_shape, pads, strides, xp, ctx=None):
    win = window(x.shape[2:], w.shape[2:], strides, dilations, pads, auto_pad)
    if _on_cpu():
        return _conv_cpu(x, w, b, win, group, _XLA_DEFAULTS if ctx is None else ctx)
    return _lax_conv(x, w.astype(x.dtype), b, win, group)


@override("jax", "ConvTranspose", since=1,
          reason="semantic gap: the shared overlap-add mutates a NumPy canvas; here a conv of the stride-dilated input")
def conv_transpose(
    x, w, b=None, *, auto_pad, dilations, group, kernel_shape, output_padding, output_shape, pads, strides, xp
):
    size = x.shape[2:]
    nd = len(size)
    kernel = w.shape[2:]
    c, mg = x.shape[1], w.shape[1]
    cg = c // group
    geo = transposed_window(size, kernel, strides, dilations, pads, auto_pad, output_padding, output_shape)
    strides, dilations, begin, out = geo.strides, geo.dilations, geo.begin, geo.out
    # A transposed conv is a conv of the stride-dilated input with the flipped, transposed kernel;
    # the output window starts `begin` into the full result.
    lo = [(k - 1) * d - bg for k, d, bg in zip(kernel, dilations, begin)]
    hi = [o - (i - 1) * s - 1 + bg for o, i, s, bg in zip(out, size, strides, begin)]
    rhs = jnp.reshape(w, (group, cg, mg) + tuple(kernel))
    rhs = jnp.reshape(jnp.swapaxes(rhs, 1, 2), (group * mg, cg) + tuple(kernel))
    rhs = jnp.flip(rhs, axis=tuple(range(2, 2 + nd))).astype(x.dtype)
    y = _conv_general(
        x, rhs, window_strides=(1,) * nd, padding=[(max(a, 0), max(z, 0)) for a, z in zip(lo, hi)],
        lhs_dilation=strides, rhs_dilation=dilations, feature_group_count=group,
    )
    # Negative padding (output wider than the full result on one side is impossible; a crop is not).
    y = y[(Ellipsis, *(slice(max(-a, 0), max(-a, 0) + o) for a, o in zip(lo, out)))]
    return add_bias(y, b, jnp)


@override("jax", "Gemm", since=1,
          reason="speed: lax.dot_general names the contracted axes; XLA:CPU copied W.T on every call (740 against 140 us)")
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=0, xp):
    # The contracted axes are named instead of transposing: XLA:CPU copies the transposed
    # weights of `x @ W.T` before a matrix-vector product on every call (a classifier's
    # 1000x1280 weights: 740 us against 140 us).
    y = lax.dot_general(a, b, (((0 if transA else 1,), (1 if transB else 0,)), ((), ())))
    return nn.gemm_scale_add(y, c, alpha, beta, a.dtype)


# ---------------------------------------------------------------------------------------------
# Pooling: reduce_window instead of one slice per kernel offset.


@override("jax", "MaxPool", since=1,
          reason="gradient: reduce_window's sends a window's cotangent to one maximum, not split between ties")
def max_pool(x, *, auto_pad, kernel_shape, pads, strides, ceil_mode=0, dilations=None, storage_order=0,
             num_outputs=1, xp):
    if num_outputs >= 2:
        return nn.max_pool(x, auto_pad=auto_pad, kernel_shape=kernel_shape, pads=pads, strides=strides,
                           ceil_mode=ceil_mode, dilations=dilations, storage_order=storage_order,
                           num_outputs=num_outputs, xp=xp)
    win = window(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return _max_pool(x, win)


# The shared kernel's maximum of shifted slices, which XLA fuses into one loop: ResNet's 3x3/2 pool
# over 64x112x112 takes 0.44 ms (batch 8: 5.1 ms), against 1.19 ms (11.3 ms) for reduce_window.
# The gradient is reduce_window's, which sends a window's cotangent to one maximum where a chain
# of jnp.maximum would split it between ties (common after a ReLU).
@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x, win):
    return nn.window_max(x, win, jnp)


def _reduce_window_max(x, win):
    # A concrete (NumPy) identity lets lax pick reduce_window_max, which has a gradient; a traced
    # init would make the generic reduce_window, which does not.
    return lax.reduce_window(
        x, np.asarray(nn.lowest(x.dtype), dtype=x.dtype), lax.max, (1, 1) + tuple(win.kernel),
        (1, 1) + win.strides, [(0, 0), (0, 0), *win.read_pads(x.shape[2:])], window_dilation=(1, 1) + win.dilations,
    )


def _max_pool_fwd(x, win):
    return nn.window_max(x, win, jnp), x


def _max_pool_bwd(win, x, g):
    return jax.vjp(lambda v: _reduce_window_max(v, win), x)[1](g)


_max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)


# ---------------------------------------------------------------------------------------------
# Scatter: functional .at[] updates instead of mutating a copy.


def _scatter(data, index, updates, reduction):
    ref = jnp.asarray(data).at[index]
    updates = jnp.asarray(updates, dtype=data.dtype)
    if reduction == "none":
        return ref.set(updates)
    return {"add": ref.add, "mul": ref.multiply, "max": ref.max, "min": ref.min}[reduction](updates)


@override("jax", "ScatterElements", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here functional .at[] updates")
def scatter_elements(data, indices, updates, *, axis, reduction="none"):
    return _scatter(data, element_index(data, indices, axis), updates, reduction)


@override("jax", "Scatter", since=9,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here functional .at[] updates")
def scatter(data, indices, updates, *, axis):
    return _scatter(data, element_index(data, indices, axis), updates, "none")


@override("jax", "ScatterND", since=11,
          reason="semantic gap: the shared kernel mutates a NumPy copy; here functional .at[] updates")
def scatter_nd(data, indices, updates, *, reduction="none"):
    index = tuple(indices[..., j] for j in range(indices.shape[-1]))
    return _scatter(data, index, updates, reduction)


# ---------------------------------------------------------------------------------------------
# Erf and Gelu: XLA's own erf/erfc. The shared kernels write erf out for NumPy (which has none)
# as a float64 polynomial and continued fraction; under XLA that is ~40 float64 operations an
# element, and it was a third of the small BERT's time (BERT's Gelu is exported as Erf).


@override("jax", "Erf", since=9,
          reason="speed: lax.erf is one XLA op; the shared polynomial was a third of the small BERT's time")
def erf(x, *, xp):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return elementwise.erf(x, xp=xp)
    return elementwise.in_float32(lax.erf, x, xp=xp)


@override("jax", "Gelu", since=20,
          reason="speed: lax.erfc is one XLA op, as for Erf")
def gelu(x, *, approximate, xp):
    if approximate != "none" or not jnp.issubdtype(x.dtype, jnp.floating):
        return elementwise.gelu(x, approximate=approximate, xp=xp)
    # 0.5 * (1 + erf(v / sqrt2)) == 0.5 * erfc(-v / sqrt2), which keeps the tail of large -v.
    return elementwise.in_float32(lambda v: 0.5 * v * lax.erfc(-v / math.sqrt(2)), x, xp=xp)


# Pow by a one-element exponent. A float initializer is a parameter, so under jit GPT-2's Gelu
# exponent (x ** 3) is a traced scalar that XLA cannot simplify: it ran as a general pow, 2.0 ms
# against 0.27 for the branch below on a 128x1024 Gelu (2 threads), ~7 ms of GPT-2's ~55 ms.
# Exponents 2 and 3 (variance, Gelu) take a multiplication (at most two roundings more than a
# correctly rounded pow, as NumPy's and Torch's fast paths); lax.switch picks it at run time, so a
# new exponent never recompiles. Derivatives are pow's own (the exponent's included).


def _general_pow(x, y):
    return elementwise.pow_(x, y, xp=jnp)


def _square(x, y):
    return x * x


def _cube(x, y):
    return x * x * x


# Module-level branches: eager lax.switch caches its compiled branches by their identity.
_POW_BRANCHES = (_general_pow, _square, _cube)


@jax.custom_jvp
def _pow_by_scalar(x, y):
    case = jnp.where(y == 2, 1, jnp.where(y == 3, 2, 0)).astype(jnp.int32).reshape(())
    return lax.switch(case, _POW_BRANCHES, x, y)


@_pow_by_scalar.defjvp
def _pow_by_scalar_jvp(primals, tangents):
    return jax.jvp(_general_pow, primals, tangents)


@override("jax", "Pow", since=7,
          reason="speed: a traced one-element exponent of 2 or 3 (a parameter: Gelu's x ** 3) as multiplications "
                 "picked at run time; XLA's general pow was 7x slower")
def pow_(x, y, *, xp):
    if x.dtype in (jnp.float32, jnp.float64) and y.size == 1 and y.ndim <= x.ndim and \
            (jnp.issubdtype(y.dtype, jnp.floating) or jnp.issubdtype(y.dtype, jnp.integer)):
        if _traced(y):
            return _pow_by_scalar(x, y)
        # A concrete exponent (eager calls, constants): the branch chosen here, nothing left to XLA.
        e = float(np.asarray(y).reshape(()))
        if e in (2, 3):
            return _POW_BRANCHES[int(e) - 1](x, y)
    return elementwise.pow_(x, y, xp=xp)


# ---------------------------------------------------------------------------------------------
# Host-side semantics JAX lacks.


@override("jax", "Equal", since=7,
          reason="semantic gap: jax.numpy has no strings; string Equal compares NumPy object arrays")
def equal(a, b, *, xp):
    # Strings are NumPy object arrays on the host.
    if getattr(a, "dtype", None) == object or getattr(b, "dtype", None) == object:
        return np.equal(a, b)
    return jnp.equal(a, b)


def _dft_wide(input, inverse, run):
    # XLA's float32 forward FFT loses ~1e-5 absolute on the suite's sums (the inverse matches
    # float32 references only in float32): run it in float64 and round back.
    if input.dtype == np.float32 and not inverse:
        return run(input.astype(np.float64)).astype(np.float32)
    return run(input)


@override("jax", "DFT", since=17, static_inputs=(1,),
          reason="accuracy: XLA's float32 forward FFT loses ~1e-5; it runs in float64 and rounds back")
def dft_17(input, dft_length=None, *, axis, inverse, onesided, xp):
    return _dft_wide(input, inverse, lambda x: signal.dft_17(x, dft_length, axis=axis, inverse=inverse,
                                                    onesided=onesided, xp=xp))


@override("jax", "DFT", since=20, static_inputs=(1, 2),
          reason="accuracy: XLA's float32 forward FFT loses ~1e-5; it runs in float64 and rounds back")
def dft_20(input, dft_length=None, axis=None, *, inverse, onesided, xp):
    return _dft_wide(input, inverse, lambda x: signal.dft_20(x, dft_length, axis, inverse=inverse,
                                                    onesided=onesided, xp=xp))


# ---------------------------------------------------------------------------------------------
# Control flow


def _scalar(x):
    return jnp.reshape(x, (-1,))[0]


@override("jax", "If", since=1, graph_attributes=("then_branch", "else_branch"),
          reason="jit: lax.cond when the condition is traced")
def if_(cond, *, then_branch, else_branch):
    if not _traced(cond):
        return control_flow.if_(cond, then_branch=then_branch, else_branch=else_branch)
    # Both branches are traced; they must agree on output shapes and dtypes.
    return tuple(lax.cond(_scalar(cond).astype(bool), lambda: tuple(then_branch()), lambda: tuple(else_branch())))


def _like(values, template):
    return tuple(jnp.asarray(v).astype(t.dtype) for v, t in zip(values, template))


@override("jax", "Loop", since=1, graph_attributes=("body",),
          reason="jit: lax.scan or lax.while_loop when values are traced")
def loop(max_trip_count, cond, *initial, body, num_outputs, node, xp):
    n_carried = len(initial)
    plain = num_outputs > n_carried or any(isinstance(v, list) or v is None for v in initial)
    if not plain:
        try:
            return _while_loop(max_trip_count, cond, initial, body)
        except _LAX_FAILURES:
            pass  # carried shapes change per iteration: only the Python loop can run it
    return control_flow.loop(max_trip_count, cond, *initial, body=body, num_outputs=num_outputs, node=node, xp=xp)


# Longest counted loop run as a (differentiable) lax.scan; longer ones run as lax.while_loop.
_MAX_SCAN_TRIPS = 4096


def _while_loop(max_trip_count, cond, initial, body):
    carried0 = tuple(jnp.asarray(v) for v in initial)
    go0 = jnp.asarray(True) if cond is None else _scalar(jnp.asarray(cond)).astype(bool)
    state0 = (jnp.asarray(0, dtype=jnp.int64), go0, carried0)

    def step(state):
        i, go, carried = state
        outs = body(i, go, *carried)
        return i + 1, _scalar(jnp.asarray(outs[0])).astype(bool), _like(outs[1:1 + len(carried)], carried)

    if max_trip_count is not None and not _traced(max_trip_count):
        trips = int(np.asarray(max_trip_count).reshape(-1)[0])
        if trips <= _MAX_SCAN_TRIPS:
            # A counted loop: lax.scan (reverse-differentiable), each step gated on the condition.
            def counted(state, _):
                return lax.cond(state[1], step, lambda s: s, state), None

            return tuple(lax.scan(counted, state0, None, length=trips)[0][2])
    trips = None if max_trip_count is None else _scalar(jnp.asarray(max_trip_count)).astype(jnp.int64)

    def keep_going(state):
        i, go, _ = state
        return go if trips is None else go & (i < trips)

    return tuple(lax.while_loop(keep_going, step, state0)[2])


@override("jax", "Scan", since=9, graph_attributes=("body",),
          reason="jit: lax.scan when values are traced")
def scan(*inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None, num_outputs, xp):
    try:
        return _lax_scan(inputs, body, num_scan_inputs, scan_input_axes, scan_input_directions,
                         scan_output_axes, scan_output_directions, num_outputs)
    except _LAX_FAILURES:
        return control_flow.scan(*inputs, body=body, num_scan_inputs=num_scan_inputs,
                                 scan_input_axes=scan_input_axes, scan_input_directions=scan_input_directions,
                                 scan_output_axes=scan_output_axes, scan_output_directions=scan_output_directions,
                                 num_outputs=num_outputs, xp=xp)


def _lax_scan(inputs, body, num_scan_inputs, in_axes, in_dirs, out_axes, out_dirs, num_outputs):
    n_state = len(inputs) - num_scan_inputs
    n_scan_out = num_outputs - n_state
    states = tuple(jnp.asarray(v) for v in inputs[:n_state])
    seqs = []
    for k, x in enumerate(inputs[n_state:]):
        x = jnp.moveaxis(jnp.asarray(x), (in_axes[k] if in_axes else 0) % x.ndim, 0)
        seqs.append(jnp.flip(x, 0) if in_dirs and in_dirs[k] else x)

    def step(carry, xs):
        outs = body(*carry, *xs)
        return _like(outs[:n_state], carry), tuple(jnp.asarray(o) for o in outs[n_state:])

    states, ys = lax.scan(step, states, tuple(seqs))
    results = []
    for k, y in enumerate(ys[:n_scan_out]):
        if out_dirs and out_dirs[k]:
            y = jnp.flip(y, 0)
        results.append(jnp.moveaxis(y, 0, (out_axes[k] if out_axes else 0) % y.ndim))
    return tuple(states) + tuple(results)



# ---------------------------------------------------------------------------------------------
# Autodiff


@override("jax", "StopGradient", since=1, domain="ai.mithril",
          reason="gradient: lax.stop_gradient on traced values")
def stop_gradient(x):
    # Host values (static shapes, strings) carry no gradient and must stay concrete under jit.
    return lax.stop_gradient(x) if isinstance(x, jax.Array) else x


# ---------------------------------------------------------------------------------------------
# ai.onnx.ml


def _lax_loop(step, state, count):
    """kernels/ml.py's loop contract as one lax.while_loop: ``state, done = step(state)`` until
    every row is done or ``count`` steps ran."""
    def body(carry):
        i, s, _ = carry
        s, done = step(s)
        return i + 1, s, jnp.all(done)

    initial = (jnp.int32(0), jax.tree_util.tree_map(jnp.asarray, state), jnp.asarray(False))
    return lax.while_loop(lambda c: (c[0] < count) & ~c[2], body, initial)[1]


@override("jax", "SVMClassifier", since=1, domain="ai.onnx.ml",
          reason="compile time: the probability coupling as a while_loop (20 s of XLA compile unrolled)")
def svm_classifier(x, *, xp, **attributes):
    # The pairwise coupling of SVC probabilities iterates up to 100 sweeps: unrolled under jit
    # that took 20 s of XLA compile for a 3-class iris model; as a while_loop, well under 1 s.
    from ..kernels import ml

    return ml.svm_classifier(x, xp=xp, loop=_lax_loop, **attributes)
