"""T5 (Raffel et al., 2020) built from Mithril blocks: an encoder (``t5_encode``) and a decoder
(``t5_decode``) that reproduce ``transformers.T5Model`` given the same config and weights.

What makes T5 differ from a GPT-style transformer, and where it lives here:

- :class:`T5LayerNorm`: RMS normalization, a scale and no bias, the mean not subtracted;
- :class:`RelativePositionBuckets`: each (query, key) pair's distance is put in one of
  ``relative_attention_num_buckets`` buckets (exact for small distances, logarithmic up to
  ``relative_attention_max_distance``); the first layer's ``relative_attention_bias`` embeds them
  into one additive score bias per head, which every later layer reuses. The encoder's buckets are
  bidirectional, the decoder's unidirectional;
- attention scores are not scaled by ``1 / sqrt(d_kv)`` and no projection has a bias;
- the feed-forward block is ``wo(act(wi(x)))``, or ``wo(act(wi_0(x)) * wi_1(x))`` for a gated
  ``feed_forward_proj`` such as ``"gated-gelu"`` (T5 v1.1).

Blocks are named after the transformers modules they mirror, so a ``T5Model`` ``state_dict``
maps onto the parameters with the ``encoder.``/``decoder.`` prefix dropped
(:func:`examples.t5.weights.t5_params`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from mithril.errors import ModelError
from mithril.frontend.model import In, Out, Param
from mithril.models import (
    Add,
    Embedding,
    Gelu,
    IOKey,
    Linear,
    Model,
    Multiply,
    Primitive,
    Relu,
    ScaledDotProduct,
    SiLU,
    Transpose,
)

# transformers' names of the dense activations (``config.dense_act_fn``) -> the Mithril block.
ACTIVATIONS = {
    "relu": Relu,
    "gelu": Gelu,  # the exact (erf) form, as torch.nn.functional.gelu
    "gelu_new": lambda: Gelu(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: Gelu(approximate="tanh"),
    "silu": SiLU,
    "swish": SiLU,
}


@dataclass(frozen=True)
class T5Settings:
    """The fields of a ``T5Config`` that shape the network (defaults: ``T5Config()``'s, i.e. t5-small)."""

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    # derived from feed_forward_proj unless given, as T5Config does
    dense_act_fn: str | None = None
    is_gated_act: bool | None = None
    # T5ForConditionalGeneration scales the decoder output by d_model ** -0.5 before its tied LM head
    scale_decoder_outputs: bool = True


# Keys of ``T5Config().to_dict()`` (transformers 4 and 5) and of checkpoints' config.json files
# that do not change the network's forward computation (token ids, generation and bookkeeping
# settings): a dict holding them is accepted and they are ignored.
_IGNORED_KEYS = frozenset("""
    _name_or_path add_cross_attention architectures bad_words_ids begin_suppress_tokens bos_token_id
    chunk_size_feed_forward classifier_dropout cross_attention_hidden_size decoder_start_token_id
    diversity_penalty do_sample dropout_rate dtype early_stopping encoder_no_repeat_ngram_size eos_token_id
    exponential_decay_length_penalty finetuning_task forced_bos_token_id forced_eos_token_id
    gradient_checkpointing id2label initializer_factor is_decoder is_encoder_decoder label2id length_penalty
    max_length min_length model_type n_positions no_repeat_ngram_size num_beam_groups num_beams
    num_return_sequences output_attentions output_hidden_states output_past output_scores pad_token_id prefix
    problem_type pruned_heads remove_invalid_values repetition_penalty return_dict return_dict_in_generate
    sep_token_id suppress_tokens task_specific_params temperature tf_legacy_loss tie_encoder_decoder
    tie_word_embeddings tokenizer_class top_k top_p torch_dtype torchscript transformers_version typical_p
    use_bfloat16 use_cache
""".split())


def t5_settings(config: Any) -> T5Settings:
    """Read a ``transformers.T5Config`` (or any object with its attributes) or a dict of its fields.

    A dict key that is neither a field Mithril reads nor a ``T5Config`` key without effect on the
    forward pass is an error naming it, so a misspelt ``d_modle`` cannot silently fall back to a default.
    """
    names = [f.name for f in fields(T5Settings)]
    if isinstance(config, T5Settings):
        values = {n: getattr(config, n) for n in names}
    elif isinstance(config, Mapping):
        unknown = sorted(k for k in config if k not in names and k not in _IGNORED_KEYS)
        if unknown:
            raise ModelError(f"T5 config: unknown key(s) {unknown}; the keys that shape the model are {names}")
        values = {n: config[n] for n in names if n in config}
        if "scale_decoder_outputs" not in values and "tie_word_embeddings" in config:
            values["scale_decoder_outputs"] = config["tie_word_embeddings"] is not False
    else:
        values = {n: getattr(config, n) for n in names if hasattr(config, n)}
        if not values:
            raise ModelError(f"T5 config: expected a transformers.T5Config or a dict of its fields, "
                             f"got {type(config).__name__}")
    s = T5Settings(**values)
    # as T5Config.__post_init__: "gated-gelu" -> gated, gelu_new; "relu" -> relu
    parts = s.feed_forward_proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ModelError(f"T5 config: feed_forward_proj {s.feed_forward_proj!r} is not 'ACT' or 'gated-ACT' "
                         f"with ACT one of {sorted(ACTIVATIONS)}")
    act = s.dense_act_fn or ("gelu_new" if s.feed_forward_proj == "gated-gelu" else parts[-1])
    if act not in ACTIVATIONS:
        raise ModelError(f"T5 config: activation {act!r} is not supported; choose one of {sorted(ACTIVATIONS)}")
    gated = s.is_gated_act if s.is_gated_act is not None else parts[0] == "gated"
    decoder_layers = s.num_decoder_layers if s.num_decoder_layers is not None else s.num_layers
    for n in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
              "relative_attention_max_distance"):
        if int(getattr(s, n)) <= 0:
            raise ModelError(f"T5 config: {n} must be a positive integer, got {getattr(s, n)!r}")
    return T5Settings(**{**values, "dense_act_fn": act, "is_gated_act": bool(gated),
                         "num_decoder_layers": int(decoder_layers)})


class T5LayerNorm(Primitive):
    """RMS normalization of the last dim: ``weight * input / sqrt(mean(input ** 2) + eps)`` (no
    mean subtracted, no bias). input [..., d], weight [d] (ones), output [..., d]."""

    def __init__(self, eps: float = 1e-6, name: str | None = None):
        self.eps = float(eps)
        super().__init__(name)

    ports = {"input": In(["...", "d"]), "weight": Param(["d"], init="ones"), "output": Out(["...", "d"])}

    def attributes(self):
        return {"eps": self.eps}

    def lower(self, g, input, weight):
        variance = g.reduce("ReduceMean", g.op("Mul", input, input), [-1], True)
        inv_rms = g.op("Reciprocal", g.op("Sqrt", g.op("Add", variance, g.const(self.eps, like=input))))
        return g.op("Mul", weight, g.op("Mul", input, inv_rms))


class RelativePositionBuckets(Primitive):
    """T5's bucket of each relative position ``key_position - query_position``: int64 [L, S] for
    query [..., L, E] and key [..., S, E] (only their lengths are read, so both stay dynamic).

    Bidirectional buckets give half the buckets to keys after the query; unidirectional ones
    (a causal decoder) send every later key to bucket 0. Of a side's buckets, the first half are
    exact distances and the rest grow logarithmically up to ``max_distance``; the arithmetic is
    float32 in transformers' order (``log(d / max_exact) / log(max_distance / max_exact) *
    (buckets - max_exact)``, truncated), so every backend puts each distance in the same bucket.
    """

    ports = {"query": In(["...", "L", None], type=None), "key": In(["...", "S", None], type=None),
             "output": Out(["L", "S"], type=int)}

    def __init__(self, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128,
                 name: str | None = None):
        self.bidirectional, self.num_buckets, self.max_distance = bool(bidirectional), int(num_buckets), int(max_distance)
        super().__init__(name)

    def attributes(self):
        return {"bidirectional": self.bidirectional, "num_buckets": self.num_buckets,
                "max_distance": self.max_distance}

    def lower(self, g, query, key):
        i64 = np.int64

        def positions(x):  # 0..len-1 of x's second-to-last axis
            length = g.op("Squeeze", g.op("Shape", x, start=-2, end=-1, dtype=i64), g.ints([0]), dtype=i64)
            return g.op("Range", g.const(0, dtype=i64), length, g.const(1, dtype=i64), dtype=i64)

        context = g.op("Unsqueeze", positions(query), g.ints([1]), dtype=i64)  # [L, 1]
        memory = g.op("Unsqueeze", positions(key), g.ints([0]), dtype=i64)  # [1, S]
        relative = g.op("Sub", memory, context, dtype=i64)  # [L, S]
        buckets = self.num_buckets
        if self.bidirectional:
            buckets //= 2
            after = g.op("Cast", g.op("Greater", relative, g.const(0, dtype=i64), dtype=np.bool_), to=7, dtype=i64)
            offset = g.op("Mul", after, g.const(buckets, dtype=i64), dtype=i64)
            distance = g.op("Abs", relative, dtype=i64)
        else:
            offset = None
            distance = g.op("Neg", g.op("Min", relative, g.const(0, dtype=i64), dtype=i64), dtype=i64)
        max_exact = buckets // 2
        small = g.op("Less", distance, g.const(max_exact, dtype=i64), dtype=np.bool_)
        # log is read only where distance >= max_exact; the Max keeps log(0) (and its cast) out of the graph
        far = g.op("Cast", g.op("Max", distance, g.const(max_exact, dtype=i64), dtype=i64), to=1, dtype=np.float32)
        f32 = np.float32
        scaled = g.op("Log", g.op("Div", far, g.const(max_exact, dtype=f32), dtype=f32), dtype=f32)
        scaled = g.op("Div", scaled, g.const(math.log(self.max_distance / max_exact), dtype=f32), dtype=f32)
        scaled = g.op("Mul", scaled, g.const(buckets - max_exact, dtype=f32), dtype=f32)
        large = g.op("Add", g.const(max_exact, dtype=i64), g.op("Cast", scaled, to=7, dtype=i64), dtype=i64)
        large = g.op("Min", large, g.const(buckets - 1, dtype=i64), dtype=i64)
        bucket = g.op("Where", small, distance, large, dtype=i64)
        return bucket if offset is None else g.op("Add", offset, bucket, dtype=i64)


class T5Attention(Model):
    """Multi-head attention without score scaling or biases: ``q``, ``k``, ``v`` (d_model ->
    num_heads * d_kv) and ``o``. Self-attention reads ``input`` [N, L, d_model]; ``cross`` reads
    keys and values from ``memory`` [N, S, d_model]. Self-attention adds ``position_bias``
    ([num_heads, L, L], broadcast over N): an input, or with ``relative_bias`` an output computed
    here by the ``relative_attention_bias`` embedding of the position buckets. ``causal`` masks
    later keys and makes the buckets unidirectional."""

    def __init__(self, cfg: T5Settings, causal: bool = False, cross: bool = False, relative_bias: bool = False,
                 name: str | None = None):
        super().__init__(name)
        heads, d_kv, d_model = cfg.num_heads, cfg.d_kv, cfg.d_model
        source = IOKey("memory", shape=[None, None, d_model]) if cross else "input"
        self |= Linear(heads * d_kv, use_bias=False, name="q")(input=IOKey("input", shape=[None, None, d_model]))
        self |= Linear(heads * d_kv, use_bias=False, name="k")(input=source)
        self |= Linear(heads * d_kv, use_bias=False, name="v")(input=source)
        mask = {}
        if not cross:
            if relative_bias:
                self |= RelativePositionBuckets(bidirectional=not causal, num_buckets=cfg.relative_attention_num_buckets,
                                                max_distance=cfg.relative_attention_max_distance,
                                                name="buckets")(query="input", key="input")
                self |= Embedding(cfg.relative_attention_num_buckets, heads, name="relative_attention_bias")(
                    input=self.buckets.output)
                self |= Transpose(axes=(2, 0, 1), name="bias_per_head")(  # [L, S, heads] -> [heads, L, S]
                    input=self.relative_attention_bias.output, output=IOKey("position_bias", expose=True))
            mask = {"mask": "position_bias"}

        def split(c):  # [N, L, heads * d_kv] -> [N, heads, L, d_kv]
            return c.reshape(0, 0, heads, d_kv).transpose((0, 2, 1, 3))

        self |= ScaledDotProduct(is_causal=causal, use_mask=not cross, scale=1.0, name="attention")(
            query=split(self.q.output), key=split(self.k.output), value=split(self.v.output), **mask)
        merged = self.attention.output.transpose((0, 2, 1, 3)).reshape(0, 0, heads * d_kv)
        self |= Linear(d_model, use_bias=False, name="o")(input=merged, output="output")


class T5LayerAttention(Model):
    """``input + attention(layer_norm(input))``: self-attention (child ``SelfAttention``) or,
    with ``cross``, attention over ``memory`` (child ``EncDecAttention``)."""

    def __init__(self, cfg: T5Settings, causal: bool = False, cross: bool = False, relative_bias: bool = False,
                 name: str | None = None):
        super().__init__(name)
        self |= T5LayerNorm(cfg.layer_norm_epsilon, name="layer_norm")(
            input=IOKey("input", shape=[None, None, cfg.d_model]))
        attention = T5Attention(cfg, causal=causal, cross=cross, relative_bias=relative_bias,
                                name="EncDecAttention" if cross else "SelfAttention")
        extra = {"memory": "memory"} if cross else {"position_bias": "position_bias"}
        self |= attention(input=self.layer_norm.output, **extra)
        self |= Add(name="residual")(left="input", right=attention.output, output="output")


class T5LayerFF(Model):
    """``input + DenseReluDense(layer_norm(input))``; DenseReluDense is ``wo(act(wi(x)))`` or,
    gated, ``wo(act(wi_0(x)) * wi_1(x))``."""

    def __init__(self, cfg: T5Settings, name: str | None = None):
        super().__init__(name)
        self |= T5LayerNorm(cfg.layer_norm_epsilon, name="layer_norm")(
            input=IOKey("input", shape=[None, None, cfg.d_model]))
        dense = Model(name="DenseReluDense")
        act = ACTIVATIONS[cfg.dense_act_fn]()
        if cfg.is_gated_act:
            dense |= Linear(cfg.d_ff, use_bias=False, name="wi_0")(input="input")
            dense |= Linear(cfg.d_ff, use_bias=False, name="wi_1")(input="input")
            dense |= act(input=dense.wi_0.output)
            dense |= Multiply(name="gate")(left=act.output, right=dense.wi_1.output)
            hidden = dense.gate.output
        else:
            dense |= Linear(cfg.d_ff, use_bias=False, name="wi")(input="input")
            dense |= act(input=dense.wi.output)
            hidden = act.output
        dense |= Linear(cfg.d_model, use_bias=False, name="wo")(input=hidden, output="output")
        self |= dense(input=self.layer_norm.output)
        self |= Add(name="residual")(left="input", right=dense.output, output="output")


class T5Block(Model):
    """One encoder or decoder layer; its sublayers are the children of ``layer``: ``0``
    self-attention, (decoder) ``1`` cross-attention over ``memory``, then the feed-forward."""

    def __init__(self, cfg: T5Settings, decoder: bool, relative_bias: bool, name: str | None = None):
        super().__init__(name)
        layer = Model(name="layer")
        bias = {"position_bias": IOKey("position_bias", expose=True) if relative_bias else "position_bias"}
        prev = T5LayerAttention(cfg, causal=decoder, relative_bias=relative_bias, name="0")
        layer |= prev(input="input", **bias)
        memory = {}
        if decoder:
            memory = {"memory": "memory"}
            cross = T5LayerAttention(cfg, cross=True, name="1")
            layer |= cross(input=prev.output, **memory)
            prev = cross
        layer |= T5LayerFF(cfg, name="2" if decoder else "1")(input=prev.output, output="output")
        self |= layer(input="input", **bias, **memory, output="output")


def _stack(cfg: T5Settings, decoder: bool, tokens: IOKey, output: str | None, name: str | None) -> Model:
    """The shared token embedding, the ``block`` stack (the first layer computes the position
    bias every layer adds) and ``final_layer_norm``."""
    memory = {"memory": "memory"} if decoder else {}
    stack = Model(name="block")
    prev, count = None, cfg.num_decoder_layers if decoder else cfg.num_layers
    for i in range(count):
        layer = T5Block(cfg, decoder=decoder, relative_bias=i == 0, name=str(i))
        last = {"output": "output"} if i == count - 1 else {}
        stack |= layer(input="input" if prev is None else prev.output, position_bias="position_bias", **memory, **last)
        prev = layer
    model = Model(name)
    model |= Embedding(cfg.vocab_size, cfg.d_model, name="shared")(input=tokens)
    if decoder:
        memory = {"memory": IOKey("memory", shape=["N", "S", cfg.d_model])}
    model |= stack(input=model.shared.output, **memory)
    model |= T5LayerNorm(cfg.layer_norm_epsilon, name="final_layer_norm")(
        input=stack.output, **({"output": output} if output else {}))
    return model


def t5_encode(config, name: str | None = None) -> Model:
    """The T5 encoder: token ids ``input`` (int64 [N, S]) -> hidden states ``output``
    [N, S, d_model], as ``T5Model(config).encoder(input).last_hidden_state``.

    ``config`` is a ``transformers.T5Config`` or a dict of its fields (see :func:`t5_settings`).

    >>> from examples.t5 import t5_encode
    >>> config = {"vocab_size": 32, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 2, "num_heads": 2}
    >>> t5_encode(config).shape_of("output")
    '[N, S, 8]'
    """
    cfg = t5_settings(config)
    return _stack(cfg, decoder=False, tokens=IOKey("input", shape=["N", "S"], type=int), output="output", name=name)


def t5_decode(config, lm_head: bool = False, name: str | None = None) -> Model:
    """The T5 decoder: decoder token ids ``input`` (int64 [N, T]) and the encoder's hidden states
    ``memory`` ([N, S, d_model]) -> ``output``, the last hidden state [N, T, d_model] (as
    ``T5Model``'s ``last_hidden_state``), or with ``lm_head`` the logits [N, T, vocab_size] of
    ``T5ForConditionalGeneration``: the hidden state (scaled by ``d_model ** -0.5`` unless the
    config says ``tie_word_embeddings=False``) times the shared embedding.

    >>> from examples.t5 import t5_decode
    >>> config = {"vocab_size": 32, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 2, "num_heads": 2}
    >>> t5_decode(config).shape_of("output"), t5_decode(config, lm_head=True).shape_of("output")
    ('[N, T, 8]', '[N, T, 32]')
    """
    cfg = t5_settings(config)
    tokens = IOKey("input", shape=["N", "T"], type=int)
    model = _stack(cfg, decoder=True, tokens=tokens, output=None if lm_head else "output", name=name)
    if not lm_head:
        return model
    hidden = model.final_layer_norm.output
    if cfg.scale_decoder_outputs:
        hidden = hidden * (cfg.d_model ** -0.5)
    model |= Linear(cfg.vocab_size, use_bias=False, name="lm_head")(
        input=hidden, weight=model.shared.weight, output="output")
    return model
