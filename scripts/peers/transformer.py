"""transformers' BertModel and GPT2LMHeadModel forwards over :mod:`peers.xp`, eval mode, no
attention mask (input_ids only, as the exports take), weights from the module's state_dict."""

from __future__ import annotations

import numpy as np


def _state(module, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v.detach().numpy().astype(np.float32)
            for k, v in module.state_dict().items() if k.startswith(prefix) and v.is_floating_point()}


def _heads(ops, x, n_heads: int):
    b, s, d = x.shape
    return ops.xp.transpose(x.reshape(b, s, n_heads, d // n_heads), (0, 2, 1, 3))


def _merge(ops, x):
    b, h, s, hd = x.shape
    return ops.xp.transpose(x, (0, 2, 1, 3)).reshape(b, s, h * hd)


def bert(ops, module):
    """``(forward(params, input_ids) -> (last_hidden_state, pooler_output), params)`` for a wrapped
    ``BertModel`` (``module.model``; export_models' wrapper)."""
    cfg = module.model.config
    sd = _state(module, "model.")
    a = ops.asarray
    lin = lambda n: (a(sd[f"{n}.weight"].T), a(sd[f"{n}.bias"]))  # noqa: E731
    ln = lambda n: (a(sd[f"{n}.weight"]), a(sd[f"{n}.bias"]))  # noqa: E731
    p = {
        "word": a(sd["embeddings.word_embeddings.weight"]),
        "pos": a(sd["embeddings.position_embeddings.weight"]),
        "type0": a(sd["embeddings.token_type_embeddings.weight"][0]),
        "emb_ln": ln("embeddings.LayerNorm"),
        "pooler": lin("pooler.dense"),
        "layers": [],
    }
    for i in range(cfg.num_hidden_layers):
        n = f"encoder.layer.{i}"
        p["layers"].append({
            "q": lin(f"{n}.attention.self.query"), "k": lin(f"{n}.attention.self.key"),
            "v": lin(f"{n}.attention.self.value"), "o": lin(f"{n}.attention.output.dense"),
            "ln1": ln(f"{n}.attention.output.LayerNorm"), "up": lin(f"{n}.intermediate.dense"),
            "down": lin(f"{n}.output.dense"), "ln2": ln(f"{n}.output.LayerNorm"),
        })
    heads, eps = cfg.num_attention_heads, cfg.layer_norm_eps

    def dense(x, wb):
        return x @ wb[0] + wb[1]

    def forward(p, ids):
        seq = ids.shape[1]
        x = ops.embedding(p["word"], ids) + p["pos"][:seq] + p["type0"]
        x = ops.layer_norm(x, *p["emb_ln"], eps)
        for layer in p["layers"]:
            q, k, v = (_heads(ops, dense(x, layer[n]), heads) for n in ("q", "k", "v"))
            attn = _merge(ops, ops.attention(q, k, v, causal=False))
            x = ops.layer_norm(dense(attn, layer["o"]) + x, *layer["ln1"], eps)
            h = ops.gelu(dense(x, layer["up"]))
            x = ops.layer_norm(dense(h, layer["down"]) + x, *layer["ln2"], eps)
        pooled = ops.xp.tanh(dense(x[:, 0], p["pooler"]))
        return x, pooled

    return forward, p


def gpt2(ops, module):
    """``(forward(params, input_ids) -> (logits,), params)`` for a wrapped ``GPT2LMHeadModel``
    (``module.model``): pre-norm blocks, causal attention, gelu_new, the LM head tied to wte."""
    cfg = module.model.config
    sd = _state(module, "model.transformer.")
    a = ops.asarray
    conv1d = lambda n: (a(sd[f"{n}.weight"]), a(sd[f"{n}.bias"]))  # noqa: E731  (Conv1D: x @ W + b)
    ln = lambda n: (a(sd[f"{n}.weight"]), a(sd[f"{n}.bias"]))  # noqa: E731
    p = {"wte": a(sd["wte.weight"]), "wpe": a(sd["wpe.weight"]), "ln_f": ln("ln_f"), "blocks": []}
    for i in range(cfg.n_layer):
        n = f"h.{i}"
        p["blocks"].append({"ln_1": ln(f"{n}.ln_1"), "qkv": conv1d(f"{n}.attn.c_attn"),
                            "proj": conv1d(f"{n}.attn.c_proj"), "ln_2": ln(f"{n}.ln_2"),
                            "fc": conv1d(f"{n}.mlp.c_fc"), "out": conv1d(f"{n}.mlp.c_proj")})
    heads, eps, width = cfg.n_head, cfg.layer_norm_epsilon, cfg.n_embd

    def dense(x, wb):
        return x @ wb[0] + wb[1]

    def forward(p, ids):
        seq = ids.shape[1]
        x = ops.embedding(p["wte"], ids) + p["wpe"][:seq]
        for blk in p["blocks"]:
            qkv = dense(ops.layer_norm(x, *blk["ln_1"], eps), blk["qkv"])
            q, k, v = (_heads(ops, qkv[..., i * width:(i + 1) * width], heads) for i in range(3))
            x = x + dense(_merge(ops, ops.attention(q, k, v, causal=True)), blk["proj"])
            h = ops.gelu_tanh(dense(ops.layer_norm(x, *blk["ln_2"], eps), blk["fc"]))
            x = x + dense(h, blk["out"])
        return (ops.layer_norm(x, *p["ln_f"], eps) @ p["wte"].T,)  # the head tied to wte

    return forward, p
