"""Forward-only CPU calls of a convolutional model as one graph run by oneDNN's graph API.

Op by op, every oneDNN convolution pays a fixed cost outside its kernel (torch and ideep build its
descriptors at each call: ~30-60 us, MobileNetV2's 52 calls 2-3 ms of a 10-13 ms run;
docs/performance.md). oneDNN's graph API (LLGA, reached through TorchScript:
``torch.jit.enable_onednn_fusion``) compiles a graph's convolutions with the activations, adds and
pools around them into partitions once, and runs them with the weights it laid out once, as
onnxruntime's session does: MobileNetV2 ~1.6x -> 1.1-1.2x onnxruntime's time, ResNet-18 1.1x ->
0.97x (AMD EPYC, one process, scripts/bench_peers.py).

:class:`OneDnnGraph` wraps a TorchBackend program whose plan :func:`eligible` accepts. A call it
has seen before (the same data shapes, dtypes and strides, the same parameter tensors, unchanged in
place) runs the graph; the second such call traces the generated forward (``torch.jit.trace``,
with the kernels' plain torch paths: no packed weights, no in-place activations), freezes its
parameters into it as constants, lets oneDNN fuse it, and keeps it only when its outputs agree with
the traced call's own. A one-off call never pays for a trace; a gradient call, a call on other
tensors (a DTensor, a tensor autograd records) and anything the trace or the check refused run the
program op by op, as before. A parameter changed in place, or another dict of parameters, is a new
graph, traced at the second call that brings it.

Only plans of :data:`TRACEABLE` ops with a Conv: each was checked under oneDNN's fuser
(tests/backends/torch/test_graph.py), the trace bakes in what a kernel reads on the host, so a Clip bound or
static input computed from the data would be wrong for other data (refused), and transformer plans
hit asserts inside TorchScript's oneDNN bridge (matmul chains with reshapes) where they gain
nothing over the program's oneDNN matmuls.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from ...onnx_bridge.load import release_freed_heap
from ..plan import Plan
from .xp import TorchArray

# (domain, op type) whose torch kernels trace into ops oneDNN's fuser takes or leaves to TorchScript,
# each run under it in tests/backends/torch/test_graph.py.
TRACEABLE = frozenset({("", op) for op in (
    "Conv", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Add", "Sub", "Mul", "Div", "MaxPool", "AveragePool",
    "GlobalAveragePool", "Flatten", "Reshape", "Gemm", "MatMul", "BatchNormalization", "Concat", "Identity",
    "Softmax", "Transpose")} | {("ai.mithril", "MatMulAdd")})

# Largest difference from the traced call's outputs a graph may give, relative to the outputs'
# largest magnitude (at least 1): oneDNN picks other convolution algorithms, whose float32 sums
# differ in the last bits (MobileNetV2: 7e-8, ResNet-18: 2e-6 against outputs of ~1-10).
TOLERANCE = 1e-4
# Graphs kept per program (input shapes or parameter sets), the oldest dropped first.
KEPT = 4

AVAILABLE = hasattr(torch.jit, "enable_onednn_fusion") and hasattr(torch.jit, "onednn_fusion_enabled") and \
    hasattr(torch._C, "_is_tracing") and torch.backends.mkldnn.is_available()


def eligible(plan: Plan) -> bool:
    """Whether ``plan`` may run as a oneDNN graph: only :data:`TRACEABLE` ops resolved to
    Mithril's own kernels, at least one Conv, no subgraph, and no Clip bound or static input
    computed from a data input (a trace would bake its value in)."""
    if not any(pn.op_type == "Conv" and pn.domain == "" for pn in plan.nodes):
        return False
    from_data = set(plan.inputs)
    for pn in plan.nodes:
        if (pn.domain, pn.op_type) not in TRACEABLE or pn.spec is None or pn.spec.custom or pn.subgraphs:
            return False
        host = set(pn.spec.static_inputs) | ({1, 2} if pn.op_type == "Clip" else set())
        if any(v in from_data for i, v in enumerate(pn.inputs) if i in host and v is not None):
            return False
        if any(v in from_data for v in pn.inputs if v is not None):
            from_data.update(pn.outputs)
    return True


class _Refused(Exception):
    """Why a program's forward cannot run as a graph."""


def _data_key(data) -> tuple | None:
    """What a graph is specialised on: each data input's name, shape, dtype and strides; None
    where an input is not a plain CPU tensor autograd does not record."""
    key = []
    for name in sorted(data):
        v = data[name]
        t = v.native if type(v) is TorchArray else None
        if type(t) is not torch.Tensor or t.device.type != "cpu" or t.requires_grad:
            return None
        key.append((name, tuple(t.shape), t.dtype, t.stride()))
    return tuple(key)


def _param_tensors(params) -> dict | None:
    """Name -> plain tensor of each parameter; None where one is something else (an inference
    tensor too: it has no version counter to tell an in-place change)."""
    out = {}
    for name, v in params.items():
        t = v.native if type(v) is TorchArray else None
        if type(t) is not torch.Tensor or t.requires_grad or t.is_inference():
            return None
        out[name] = t
    return out


class _Stamp:
    """Parameter tensors as a call brought them: the same objects, unchanged in place."""

    __slots__ = ("refs",)

    def __init__(self, tensors: dict):
        self.refs = tuple((name, weakref.ref(t), t._version) for name, t in tensors.items())

    def holds(self, params) -> bool:
        if len(params) != len(self.refs):
            return False
        for name, ref, version in self.refs:
            v = params.get(name)
            t = v.native if type(v) is TorchArray else None
            if t is None or ref() is not t or t._version != version:
                return False
        return True


class OneDnnGraph:
    """``forward(params, data)`` of a TorchBackend program whose plan :func:`eligible` accepts,
    run as a oneDNN graph where it can (the module docstring). ``refused`` says why none was
    built, after a trace or its check failed (the program then stays op by op)."""

    # What ``mithril profile`` says of a program so run (its rows time the program op by op).
    profile_note = ("; wall and program time run it as one oneDNN graph (TorchBackend's default for this model, "
                    "from its second call), the rows op by op, as onednn_graph=False runs it")

    def __init__(self, forward, memos=()):
        self.forward = forward
        self._memos = tuple(memos)  # the fused nodes' CallMemos (packed weights), dropped for a graph
        self._graphs: dict = {}  # data key -> (stamp, graph, output names)
        self._last = None  # (data key, stamp) of the last call run op by op
        self.refused: str | None = None
        self.built = 0  # graphs traced so far (tests)

    def __call__(self, params, data):
        if self.refused is not None or torch.is_grad_enabled():
            return self.forward(params, data)
        key = _data_key(data)
        if key is None:
            return self.forward(params, data)
        held = self._graphs.get(key)
        if held is not None and held[0].holds(params):
            stamp, graph, names = held
            try:
                out = graph(*(data[k].native for k, *_ in key))
            except Exception as exc:  # noqa: BLE001 - TorchScript's, not the program's: op by op from now on
                self.refused = f"oneDNN graph failed: {type(exc).__name__}: {str(exc)[:200]}"
                self._graphs.clear()
                return self.forward(params, data)
            return dict(zip(names, map(TorchArray, (out,) if isinstance(out, torch.Tensor) else out)))
        last = self._last
        if last is not None and last[0] == key and last[1].holds(params):
            self._last = None
            return self._build(params, data, key, last[1])
        tensors = _param_tensors(params)
        if tensors is None:
            return self.forward(params, data)
        self._last = (key, _Stamp(tensors))
        return self.forward(params, data)

    def _build(self, params, data, key, stamp):
        """This call's outputs, from the trace; the graph kept for the next calls when oneDNN's
        run of it agrees with them."""
        names = [k for k, *_ in key]
        inputs = tuple(data[k].native for k in names)
        forward, order, traced_outputs = self.forward, [], []
        self._drop_eager_copies(params)  # first: the graph's own packed weights may take their memory

        class Traced(torch.nn.Module):
            def forward(self, *xs):
                out = forward(params, dict(zip(names, map(TorchArray, xs))))
                if not all(type(v) is TorchArray and type(v.native) is torch.Tensor for v in out.values()):
                    raise _Refused("an output is not a tensor")
                order[:], traced_outputs[:] = list(out), [v.native for v in out.values()]
                return tuple(traced_outputs)

        with warnings.catch_warnings():
            # TracerWarning: the kernels read shapes (fixed by the key) and constant Clip bounds
            # (eligible() refused data-dependent ones) on the host. DeprecationWarning: TorchScript's,
            # whose oneDNN bridge is torch's only way into oneDNN's graph API.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                traced = torch.jit.trace(Traced(), inputs, check_trace=False)
            except Exception as exc:  # noqa: BLE001 - the op-by-op run raises what is the program's own
                self.refused = f"trace failed: {type(exc).__name__}: {str(exc)[:200]}"
                return self.forward(params, data)
            reference = tuple(traced_outputs)  # the traced run computed this call's outputs
            try:
                graph = torch.jit.freeze(traced.eval())
                was = torch.jit.onednn_fusion_enabled()
                torch.jit.enable_onednn_fusion(True)  # only while TorchScript's executor optimises the graph
                try:
                    for _ in range(3):  # the executor profiles the first run and fuses at the second
                        got = graph(*inputs)
                finally:
                    torch.jit.enable_onednn_fusion(was)
                _check((got,) if isinstance(got, torch.Tensor) else tuple(got), reference)
            except Exception as exc:  # noqa: BLE001 - refused: the program stays op by op
                self.refused = f"oneDNN graph refused: {type(exc).__name__}: {str(exc)[:200]}"
                return dict(zip(order, map(TorchArray, reference)))
        self._graphs.pop(key, None)
        while len(self._graphs) >= KEPT:
            self._graphs.pop(next(iter(self._graphs)))
        self._graphs[key] = (stamp, graph, tuple(order))
        self.built += 1
        # The trace's and oneDNN's compile-time heap, freed (MobileNetV2: ~13 MiB kept otherwise).
        release_freed_heap()
        return dict(zip(order, map(TorchArray, reference)))

    def _drop_eager_copies(self, params) -> None:
        """Forget what the op-by-op program kept for these parameters (packed and channels_last
        weights, the fused nodes' arguments): the graph lays out its own, and they would stay
        resident beside it. An op-by-op call (a graph refused) makes them again."""
        from . import overrides

        for memo in self._memos:
            memo._drop()
        ids = {id(v.native) for v in params.values() if type(v) is TorchArray}
        for ident in [k for k in overrides.kept_copies if k[0] in ids]:
            overrides.kept_copies.pop(ident, None)


def _check(got: tuple, reference: tuple) -> None:
    """Raises where the graph's outputs differ from the traced call's beyond :data:`TOLERANCE`."""
    if len(got) != len(reference):
        raise _Refused(f"{len(got)} outputs against {len(reference)}")
    for g, r in zip(got, reference):
        if g.shape != r.shape or g.dtype != r.dtype:
            raise _Refused(f"an output of shape {list(g.shape)} {g.dtype} against {list(r.shape)} {r.dtype}")
        if not r.is_floating_point():
            if not torch.equal(g, r):
                raise _Refused("an integer output differs")
            continue
        if not torch.equal(torch.isnan(g), torch.isnan(r)):
            raise _Refused("NaNs in other places")
        finite = torch.isfinite(r)
        scale = max(1.0, float(r[finite].abs().max()) if finite.any() else 1.0)
        diff = float((g - r).abs().nan_to_num(0.0).max()) if r.numel() else 0.0
        if diff > TOLERANCE * scale:
            raise _Refused(f"outputs differ by {diff:.3g} (largest magnitude {scale:.3g})")


__all__ = ["AVAILABLE", "OneDnnGraph", "TRACEABLE", "eligible"]
