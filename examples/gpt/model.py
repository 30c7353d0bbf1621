"""GPT-2 (``create_gpt``): the model zoo's, under the name the guides import it by.

The model takes token ids ``input`` (int64 [N, T], T <= block_size; N and T stay symbolic until
``shapes`` fixes them) and gives logits ``output`` [N, T, vocab_size]. Its parameters carry
GPT-2's module names (``wte``, ``wpe``, ``h.0.attn.q_proj`` ...);
:func:`models_zoo.weights.gpt_params` maps a nanoGPT/GPT-2 ``state_dict`` onto them.

>>> import numpy as np, mithril as ml
>>> from examples.gpt.model import create_gpt
>>> gpt = create_gpt(bias=True, block_size=16, dims=8, num_heads=2, num_layers=1, vocab_size=32)
>>> pm = ml.compile(gpt, ml.NumpyBackend(), data_keys={"input"})
>>> ids = np.array([[1, 2, 3]], dtype=np.int64)
>>> pm.evaluate(pm.randomize_params(), {"input": ids})["output"].shape
(1, 3, 32)
"""

from models_zoo.transformers import create_gpt

__all__ = ["create_gpt"]
