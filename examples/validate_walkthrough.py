#!/usr/bin/env python
"""Write the pre-norm MLP block that docs/validate.md validates, reduces and fixes.

    python examples/validate_walkthrough.py --out block.onnx
    python examples/validate_walkthrough.py --norm fused --out fused.onnx

A decoder's block as torch.onnx.export writes it: ``h = x @ w_in + b_in``, the RMSNorm
``h * (1 / sqrt(mean(h ** 2) + eps)) * gamma`` as the ops torch decomposes it into (Pow,
ReduceMean, Add, Sqrt, Div, Mul, Mul), an MLP, and the residual ``y = h + mlp(norm(h))``. One
channel of ``h`` carries an offset of 600, as a few channels of an LLM's residual stream carry
activations of hundreds to thousands. ``--norm fused`` writes the norm as the one ONNX op
RMSNormalization (opset 23) instead. Only numpy and onnx are needed; the weights are seeded.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TOKENS, WIDTH, HIDDEN = 16, 64, 128
MASSIVE_CHANNEL, MASSIVE_VALUE = 5, 600.0


def block(norm: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    b_in = np.zeros(WIDTH)
    b_in[MASSIVE_CHANNEL] = MASSIVE_VALUE
    weights = {
        "w_in": rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH),
        "b_in": b_in,
        "gamma": np.ones(WIDTH),
        "w_up": rng.standard_normal((WIDTH, HIDDEN)) / np.sqrt(WIDTH),
        "w_down": rng.standard_normal((HIDDEN, WIDTH)) / np.sqrt(HIDDEN),
    }
    node = helper.make_node
    if norm == "fused":
        norm_nodes = [node("RMSNormalization", ["h", "gamma"], ["n"], name="norm/RMSNormalization",
                           axis=-1, epsilon=1e-6)]
        opset = 23
    else:  # torch.onnx.export of h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gamma
        weights.update(two=np.float32(2.0), eps=np.float32(1e-6), one=np.float32(1.0))
        norm_nodes = [
            node("Pow", ["h", "two"], ["sq"], name="norm/Pow"),
            node("ReduceMean", ["sq", "axes"], ["ms"], name="norm/ReduceMean", keepdims=1),
            node("Add", ["ms", "eps"], ["ms_eps"], name="norm/Add"),
            node("Sqrt", ["ms_eps"], ["rms"], name="norm/Sqrt"),
            node("Div", ["one", "rms"], ["inv_rms"], name="norm/Div"),
            node("Mul", ["h", "inv_rms"], ["hn"], name="norm/Mul"),
            node("Mul", ["hn", "gamma"], ["n"], name="norm/Mul_1"),
        ]
        opset = 18
    nodes = [
        node("MatMul", ["x", "w_in"], ["proj"], name="in_proj/MatMul"),
        node("Add", ["proj", "b_in"], ["h"], name="in_proj/Add"),
        *norm_nodes,
        node("MatMul", ["n", "w_up"], ["up"], name="mlp/up/MatMul"),
        node("Relu", ["up"], ["act"], name="mlp/Relu"),
        node("MatMul", ["act", "w_down"], ["down"], name="mlp/down/MatMul"),
        node("Add", ["h", "down"], ["y"], name="residual/Add"),
    ]
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()]
    if norm != "fused":
        initializers.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    graph = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TOKENS, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", TOKENS, WIDTH])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--norm", choices=["decomposed", "fused"], default="decomposed",
                   help="the RMSNorm as torch exports it (Pow, ReduceMean, ...) or as one RMSNormalization op")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    args = p.parse_args()
    model = block(args.norm)
    onnx.save(model, args.out)
    print(f"wrote {args.out}: {len(model.graph.node)} nodes, opset {model.opset_import[0].version}, "
          f"x [batch, {TOKENS}, {WIDTH}] -> y [batch, {TOKENS}, {WIDTH}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
