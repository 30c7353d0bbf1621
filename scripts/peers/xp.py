"""The array-namespace adapter the ports are written over: what jax.numpy and mlx.core spell
differently (convolution layout, pooling, layer norm, attention, compilation, waiting for results).

Images are NHWC inside the ports (the layout both lax.conv_general_dilated and mx.conv2d are
fastest in on CPU): :meth:`Ops.image` converts the NCHW input once and :meth:`Ops.conv_weight`
converts torch's OIHW weights once, at load.
"""

from __future__ import annotations

import math

import numpy as np


class Ops:
    """Shared by both namespaces; subclasses set ``xp`` (the array module) and the ops below."""

    name = ""
    xp = None

    def asarray(self, a: np.ndarray):
        return self.xp.asarray(np.ascontiguousarray(a))

    def image(self, x_nchw: np.ndarray):
        return self.asarray(x_nchw.transpose(0, 2, 3, 1))

    def relu(self, x):
        return self.xp.maximum(x, 0)

    def relu6(self, x):
        return self.xp.minimum(self.xp.maximum(x, 0), 6)

    def gelu_tanh(self, x):
        # GPT-2's gelu_new
        return 0.5 * x * (1 + self.xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))

    def gelu(self, x):
        # BERT's "gelu": the exact, erf form
        return 0.5 * x * (1 + self.erf(x * (1 / math.sqrt(2))))

    def embedding(self, table, ids):
        return self.xp.take(table, ids, axis=0)

    def attention(self, q, k, v, causal: bool):
        """Softmax attention over (batch, heads, seq, head_dim)."""
        xp = self.xp
        scores = (q @ xp.swapaxes(k, -1, -2)) * (1 / math.sqrt(q.shape[-1]))
        if causal:
            n = q.shape[-2]
            keep = xp.arange(n)[:, None] >= xp.arange(n)[None, :]
            scores = xp.where(keep, scores, -1e30)
        return self.softmax(scores, axis=-1) @ v


class JaxOps(Ops):
    name = "jax"

    def __init__(self, compiler_options: dict | None = None):
        import jax
        import jax.numpy as jnp

        self.jax, self.xp, self.lax = jax, jnp, jax.lax
        self.compiler_options = compiler_options  # jax.jit's XLA options; None: XLA's defaults

    def asarray(self, a: np.ndarray):
        # jax.device_put, not jnp.asarray, which dispatches a conversion eagerly for each weight:
        # MobileNetV2's port held 99 MiB over the process once loaded that way, 49 this way (the
        # torch module's 21 included), and its memory row measured the loading, not the program.
        return self.jax.device_put(np.ascontiguousarray(a))

    def conv_weight(self, w_oihw: np.ndarray):
        return self.asarray(w_oihw.transpose(2, 3, 1, 0))  # HWIO

    def conv2d(self, x, w, stride: int, padding: int, groups: int = 1):
        # Depthwise too (feature_group_count=channels), as flax's nn.Conv does: XLA:CPU runs that
        # grouped convolution slowly (a 96-channel 112x112 3x3 one took 89 ms here, 102 ms in NCHW).
        return self.lax.conv_general_dilated(x, w, (stride, stride), [(padding, padding)] * 2,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)

    def max_pool(self, x, kernel: int, stride: int, padding: int):
        pad = ((0, 0), (padding, padding), (padding, padding), (0, 0))
        return self.lax.reduce_window(x, -np.inf, self.lax.max, (1, kernel, kernel, 1), (1, stride, stride, 1), pad)

    def layer_norm(self, x, weight, bias, eps: float):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) * self.lax.rsqrt(var + eps) * weight + bias

    def erf(self, x):
        return self.lax.erf(x)

    def softmax(self, x, axis: int):
        return self.jax.nn.softmax(x, axis=axis)

    def compile(self, fn):
        if self.compiler_options:
            return self.jax.jit(fn, compiler_options=self.compiler_options)
        return self.jax.jit(fn)

    def to_numpy(self, outs) -> list[np.ndarray]:
        return [np.asarray(o) for o in self.jax.block_until_ready(outs)]


class MlxOps(Ops):
    name = "mlx"

    def __init__(self, use_compile: bool = True):
        import mlx.core as mx

        self.xp = self.mx = mx
        self.use_compile = use_compile

    def conv_weight(self, w_oihw: np.ndarray):
        return self.asarray(w_oihw.transpose(0, 2, 3, 1))  # O, kH, kW, I/groups

    def conv2d(self, x, w, stride: int, padding: int, groups: int = 1):
        return self.mx.conv2d(x, w, stride=stride, padding=padding, groups=groups)

    def max_pool(self, x, kernel: int, stride: int, padding: int):
        # mlx.core has no pooling op: the max of the kernel*kernel strided views of the padded input
        mx = self.mx
        x = mx.pad(x, [(0, 0), (padding, padding), (padding, padding), (0, 0)], constant_values=-float("inf"))
        h = (x.shape[1] - kernel) // stride + 1
        w = (x.shape[2] - kernel) // stride + 1
        out = None
        for i in range(kernel):
            for j in range(kernel):
                view = x[:, i:i + stride * (h - 1) + 1:stride, j:j + stride * (w - 1) + 1:stride, :]
                out = view if out is None else mx.maximum(out, view)
        return out

    def layer_norm(self, x, weight, bias, eps: float):
        return self.mx.fast.layer_norm(x, weight, bias, eps)

    def erf(self, x):
        return self.mx.erf(x)

    def softmax(self, x, axis: int):
        return self.mx.softmax(x, axis=axis)

    def attention(self, q, k, v, causal: bool):
        return self.mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]),
                                                         mask="causal" if causal else None)

    def compile(self, fn):
        return self.mx.compile(fn) if self.use_compile else fn

    def to_numpy(self, outs) -> list[np.ndarray]:
        self.mx.eval(outs)
        return [np.array(o) for o in outs]


def make_ops(framework: str, **options) -> Ops:
    """``"jax"`` or ``"mlx"``; ImportError when the framework is not installed."""
    if framework == "jax":
        return JaxOps(**options)
    if framework == "mlx":
        return MlxOps(**options)
    raise ValueError(f"unknown framework {framework!r}; choose from jax, mlx")
