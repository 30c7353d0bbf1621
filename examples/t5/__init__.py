"""T5 built from Mithril blocks: ``t5_encode(config)`` and ``t5_decode(config)`` for a
``transformers.T5Config`` (or a dict of its fields); :func:`t5_params` maps a ``T5Model``
``state_dict`` onto their parameters. See examples/t5/README.md."""

from .model import RelativePositionBuckets, T5LayerNorm, t5_decode, t5_encode, t5_settings
from .weights import t5_params

__all__ = ["RelativePositionBuckets", "T5LayerNorm", "t5_decode", "t5_encode", "t5_params", "t5_settings"]
