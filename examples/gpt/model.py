"""GPT-2 (``create_gpt``): the model zoo's, under the name the guides import it by.

The model takes token ids ``input`` (int64 [N, T], T <= block_size; N and T stay symbolic until
``shapes`` fixes them) and gives logits ``output`` [N, T, vocab_size]. Its parameters carry
GPT-2's module names (``wte``, ``wpe``, ``h.0.attn.q_proj`` ...);
:func:`models_zoo.weights.gpt_params` maps a nanoGPT ``state_dict`` onto them and
:func:`gpt2_params` a transformers ``GPT2Model`` / ``GPT2LMHeadModel`` one.

>>> import numpy as np, mithril as ml
>>> from examples.gpt.model import create_gpt
>>> gpt = create_gpt(bias=True, block_size=16, dims=8, num_heads=2, num_layers=1, vocab_size=32)
>>> pm = ml.compile(gpt, ml.NumpyBackend(), data_keys={"input"})
>>> ids = np.array([[1, 2, 3]], dtype=np.int64)
>>> pm.evaluate(pm.randomize_params(), {"input": ids})["output"].shape
(1, 3, 32)
"""

from __future__ import annotations

import re

import numpy as np

from models_zoo.transformers import create_gpt
from models_zoo.weights import gpt_params

__all__ = ["create_gpt", "gpt2_params"]

# transformers' GPT-2 keeps these projections in Conv1D modules: weight [in, out], the transpose
# of a Linear's (and of nanoGPT's) [out, in].
_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
# Older transformers versions store the causal mask as a buffer: not a parameter.
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(masked_)?bias$")


def gpt2_params(state_dict) -> dict[str, np.ndarray]:
    """A transformers ``GPT2Model`` or ``GPT2LMHeadModel`` ``state_dict`` -> :func:`create_gpt`'s
    parameters (``create_gpt(bias=True, block_size=n_positions, dims=n_embd, num_heads=n_head,
    num_layers=n_layer, vocab_size=vocab_size)``). Conv1D weights are transposed to Linear's
    layout, then :func:`models_zoo.weights.gpt_params` splits and renames them; a ``GPT2Model``
    has no ``lm_head``, so it takes the token embedding, tied as in ``GPT2LMHeadModel``."""
    nano = {}
    for key, value in state_dict.items():
        name = key.removeprefix("transformer.")
        if _MASK_BUFFER.search(name):
            continue
        arr = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
        nano[name] = arr.T if _CONV1D.search(name) else arr
    params = gpt_params(nano)
    params.setdefault("lm_head.weight", params["wte.weight"])
    return params
