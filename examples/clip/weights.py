"""Checkpoints -> parameters of :func:`examples.clip.model.clip`.

- :func:`openai_params`: a ``state_dict`` of OpenAI's ``CLIP`` (or open_clip's models built with
  its OpenAI layout). The names carry over; each attention's fused ``in_proj_weight`` /
  ``in_proj_bias`` is split into ``q_proj``, ``k_proj`` and ``v_proj``.
- :func:`hf_params`: a ``state_dict`` of transformers' ``CLIPModel`` (a ViT image tower),
  or of its text side alone; transformers keeps projections as Linear weights [out, in], so
  ``text_projection`` and ``visual.proj`` are transposed.

>>> import numpy as np
>>> sd = {"transformer.resblocks.0.attn.in_proj_weight": np.zeros((12, 4)), "logit_scale": np.array(2.0)}
>>> sorted(openai_params(sd))
['logit_scale', 'transformer.resblocks.0.attn.k_proj.weight', 'transformer.resblocks.0.attn.q_proj.weight', \
'transformer.resblocks.0.attn.v_proj.weight']
"""

from __future__ import annotations

import re

import numpy as np

from mithril.errors import InputError

# Entries of OpenAI's checkpoints that are no parameters (the JIT archive's config scalars).
_OPENAI_CONFIG = {"input_resolution", "context_length", "vocab_size"}

_HF_LAYER = [  # transformers' names inside an encoder layer -> OpenAI's inside a resblock
    ("self_attn.", "attn."),
    ("layer_norm1.", "ln_1."),
    ("layer_norm2.", "ln_2."),
    ("mlp.fc1.", "mlp.c_fc."),
    ("mlp.fc2.", "mlp.c_proj."),
]
_HF_NAMES = {
    "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "positional_embedding",
    "text_model.final_layer_norm.weight": "ln_final.weight",
    "text_model.final_layer_norm.bias": "ln_final.bias",
    "vision_model.embeddings.class_embedding": "visual.class_embedding",
    "vision_model.embeddings.patch_embedding.weight": "visual.conv1.weight",
    "vision_model.embeddings.position_embedding.weight": "visual.positional_embedding",
    "vision_model.pre_layrnorm.weight": "visual.ln_pre.weight",
    "vision_model.pre_layrnorm.bias": "visual.ln_pre.bias",
    "vision_model.post_layernorm.weight": "visual.ln_post.weight",
    "vision_model.post_layernorm.bias": "visual.ln_post.bias",
    "logit_scale": "logit_scale",
}
_HF_TRANSPOSED = {"text_projection.weight": "text_projection", "visual_projection.weight": "visual.proj"}
_HF_ENCODER = re.compile(r"(text|vision)_model\.encoder\.layers\.(\d+)\.(.+)")


def _numpy(t) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().cpu().float().numpy() if t.is_floating_point() else t.detach().cpu().numpy()
    return np.asarray(t)


def openai_params(state_dict) -> dict[str, np.ndarray]:
    """OpenAI CLIP ``state_dict`` -> Mithril parameters (BatchNorm's ``num_batches_tracked`` dropped)."""
    out: dict[str, np.ndarray] = {}
    for key, value in state_dict.items():
        if key in _OPENAI_CONFIG or key.endswith("num_batches_tracked"):
            continue
        arr = _numpy(value)
        if key.endswith(".in_proj_weight") or key.endswith(".in_proj_bias"):
            prefix, kind = key.rsplit(".", 1)
            leaf = "weight" if kind == "in_proj_weight" else "bias"
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), np.split(arr, 3, axis=0)):
                out[f"{prefix}.{proj}.{leaf}"] = part
            continue
        out[key] = arr
    return out


def hf_params(state_dict) -> dict[str, np.ndarray]:
    """transformers ``CLIPModel`` ``state_dict`` -> Mithril parameters of the ViT variant of
    :func:`~examples.clip.model.clip` (the ``position_ids`` buffers are dropped)."""
    out: dict[str, np.ndarray] = {}
    for key, value in state_dict.items():
        if key.endswith("position_ids"):
            continue
        arr = _numpy(value)
        if key in _HF_NAMES:
            out[_HF_NAMES[key]] = arr
        elif key in _HF_TRANSPOSED:
            out[_HF_TRANSPOSED[key]] = np.ascontiguousarray(arr.T)
        elif m := _HF_ENCODER.fullmatch(key):
            tower, index, rest = m.groups()
            for hf, openai in _HF_LAYER:
                rest = rest.replace(hf, openai)
            out[f"{'visual.' if tower == 'vision' else ''}transformer.resblocks.{index}.{rest}"] = arr
        else:
            raise InputError(f"hf_params: {key!r} is not a parameter of transformers' CLIPModel (its text_model.*, "
                             f"vision_model.*, text_projection, visual_projection and logit_scale map onto CLIP)")
    return out
