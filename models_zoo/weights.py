"""PyTorch ``state_dict`` -> Mithril parameters for zoo models.

Zoo models name their blocks after the torch modules they mirror, so most keys carry over as
they are; the GPT's fused query/key/value projection is split into ``q_proj``/``k_proj``/``v_proj``
and its MLP layers are renamed.

>>> import torch
>>> from models_zoo.torch_reference import resnet18 as torch_resnet18
>>> params = resnet18_params(torch_resnet18(num_classes=10).state_dict())
>>> params["layer2.0.downsample.0.weight"].shape
(128, 64, 1, 1)
"""

from __future__ import annotations

import numpy as np


def _numpy(t) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def resnet_params(state_dict) -> dict[str, np.ndarray]:
    """torchvision-architecture ResNet (18/34/50) weights for :func:`models_zoo.resnet18` & co.:
    the keys are the same; BatchNorm's ``num_batches_tracked`` counters are dropped."""
    return {k: _numpy(v) for k, v in state_dict.items() if not k.endswith("num_batches_tracked")}


resnet18_params = resnet_params


def gpt_params(state_dict) -> dict[str, np.ndarray]:
    """``models_zoo.torch_reference.GPT`` (nanoGPT/GPT-2 names) weights for :func:`models_zoo.create_gpt`."""
    out: dict[str, np.ndarray] = {}
    for key, value in state_dict.items():
        arr = _numpy(value)
        name = key.removeprefix("transformer.")
        if ".attn.c_attn." in name:  # [3 * dims, dims] -> three [dims, dims] (query, key, value)
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), np.split(arr, 3, axis=0)):
                out[name.replace("c_attn", proj)] = part
            continue
        name = (name.replace(".attn.c_proj.", ".attn.out_proj.")
                .replace(".mlp.c_fc.", ".mlp.linear_0.")
                .replace(".mlp.c_proj.", ".mlp.linear_1."))
        out[name] = arr
    return out
