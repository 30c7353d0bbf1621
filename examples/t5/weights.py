"""A ``transformers`` T5 ``state_dict`` -> the parameters of :func:`t5_encode` / :func:`t5_decode`.

The Mithril blocks carry the transformers module names, so the mapping only picks one half of
the model and drops its ``encoder.``/``decoder.`` prefix; the shared token embedding
(``shared.weight``) goes to both halves (and to the decoder's tied LM head).
"""

from __future__ import annotations

import numpy as np

from mithril.errors import ModelError

# T5Model ignores this key on load (only the first self-attention layers have a position bias).
_UNUSED = {"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}


def _numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bfloat16 has no NumPy twin: go through float32)
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def t5_params(state_dict, part: str) -> dict[str, np.ndarray]:
    """The ``part`` ("encoder" or "decoder") of a ``T5Model`` / ``T5ForConditionalGeneration`` /
    ``T5EncoderModel`` ``state_dict`` as NumPy arrays keyed by Mithril parameter name.

    >>> import numpy as np
    >>> sd = {"shared.weight": np.zeros((4, 2)), "encoder.block.0.layer.0.layer_norm.weight": np.ones(2),
    ...       "encoder.final_layer_norm.weight": np.ones(2), "decoder.final_layer_norm.weight": np.ones(2)}
    >>> sorted(t5_params(sd, "encoder"))
    ['block.0.layer.0.layer_norm.weight', 'final_layer_norm.weight', 'shared.weight']
    """
    if part not in ("encoder", "decoder"):
        raise ModelError(f"t5_params: part must be 'encoder' or 'decoder', got {part!r}")
    prefix = part + "."
    out = {k.removeprefix(prefix): _numpy(v) for k, v in state_dict.items()
           if k.startswith(prefix) and k not in _UNUSED}
    shared = state_dict.get("shared.weight", state_dict.get(prefix + "embed_tokens.weight"))
    if shared is None:
        raise ModelError(f"t5_params: the state_dict has no shared.weight or {prefix}embed_tokens.weight "
                         f"(the token embedding); its keys start {sorted(state_dict)[:5]}")
    out.pop("embed_tokens.weight", None)
    out["shared.weight"] = _numpy(shared)
    if not any(k.startswith("block.") for k in out):
        raise ModelError(f"t5_params: the state_dict has no {prefix}block.* weights (is it a T5 {part}?)")
    return out
