"""Direct ports of issue 21's four models to jax.numpy (under jax.jit) and mlx.core (under
mx.compile), written once over the small adapter in :mod:`peers.xp` and loaded from the torch
module's state_dict: the framework-native peers Mithril's JAX and MLX backends are timed against.

>>> from export_models import build                     # doctest: +SKIP
>>> ex = build("resnet18", image_size=64)                # doctest: +SKIP
>>> peer = make_peer("jax", ex.name, ex.module)          # doctest: +SKIP
>>> logits, = peer(ex.inputs)                            # NumPy arrays, as the torch module's  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from . import cnn, transformer
from .xp import JaxOps, MlxOps, Ops, make_ops

# model name (scripts/export_models.MODELS) -> port(ops, torch module) -> (forward, params)
PORTS = {
    "resnet18": cnn.resnet18,
    "mobilenet_v2": cnn.mobilenet_v2,
    "bert_h256": transformer.bert,
    "gpt2_h256": transformer.gpt2,
}
IMAGE_MODELS = ("resnet18", "mobilenet_v2")
FRAMEWORKS = ("jax", "mlx")


class Peer:
    """A compiled port: ``peer(inputs)`` runs it on a dict of NumPy inputs and returns NumPy outputs
    (results waited for: jax.block_until_ready, mx.eval). :meth:`bind` keeps the inputs as
    framework arrays and returns the call to time, as the Mithril rows convert theirs once."""

    def __init__(self, ops: Ops, model: str, module):
        if model not in PORTS:
            raise KeyError(f"no port of {model!r}; ports: {', '.join(PORTS)}")
        self.ops, self.model = ops, model
        forward, self.params = PORTS[model](ops, module)
        self.fn = ops.compile(forward)

    def _convert(self, inputs: dict[str, np.ndarray]) -> list:
        if self.model in IMAGE_MODELS:
            return [self.ops.image(v) for v in inputs.values()]
        return [self.ops.asarray(v.astype(np.int32)) for v in inputs.values()]

    def bind(self, inputs: dict[str, np.ndarray]):
        data = self._convert(inputs)
        return lambda: self.ops.to_numpy(self.fn(self.params, *data))

    def __call__(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.bind(inputs)()


def make_peer(framework: str, model: str, module, **options) -> Peer:
    """The ``framework`` ("jax" or "mlx") port of ``model`` with ``module``'s weights."""
    return Peer(make_ops(framework, **options), model, module)


__all__ = ["FRAMEWORKS", "PORTS", "JaxOps", "MlxOps", "Ops", "Peer", "make_ops", "make_peer"]
