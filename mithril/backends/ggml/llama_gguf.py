"""Decoder LLMs as GGUF files llama.cpp runs, and those files run by Mithril.

:func:`save_llama_gguf` (``ml.save_gguf(model, path, arch=...)``, ``mithril export-gguf``) turns a
decoder exported to ONNX with its key/value cache (optimum's ``text-generation-with-past``
export: ``input_ids``, ``past_key_values.N.key/value`` in, ``logits``, ``present.N.*`` out) into
a GGUF file of llama.cpp's architecture ``gpt2``, ``llama``, ``qwen2`` or ``phi3``: the weights
under llama.cpp's tensor names and layouts (float32, or every matrix in one ggml type such as
``q8_0``; 1-D tensors and GPT-2's position table stay float32, as llama.cpp's converter keeps
them), the hyperparameters under ``{arch}.*`` and a byte-level BPE tokenizer under
``tokenizer.ggml.*``.

The weights are found by the names torch's exporter gives nodes, which keep the module path
(``/model/layers.0/self_attn/q_proj/MatMul`` reads ``model.layers.0.self_attn.q_proj.weight``,
transposed), so initializers renamed ``onnx::MatMul_733`` or shared between layers by the
exporter's deduplication still map to their parameter. Hyperparameters come from the
``config.json`` optimum writes next to ``model.onnx`` (or ``config=``), else from the graph
(the cache inputs' shapes, the weights, the norms' epsilon, the rotary frequencies).

:func:`gguf_decoder` reads such a file back as a decode-step model :func:`mithril.generate`
runs (one token per call, fixed-size caches), quantized weights passed to GGMLBackend as the
file stores them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import BackendOptionError, MithrilError
from .gguf_metadata import read_metadata

ARCHS = ("gpt2", "llama", "qwen2", "phi3")
# ggml types a file's matrices may be stored in (1-D tensors stay float32)
FILE_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q6_K")
_MODEL_TYPES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "phi3": "phi3"}
_NEOX = ("qwen2", "phi3")  # llama.cpp's rope type per architecture: halves (NEOX) or adjacent pairs


# -- the parameters of an ONNX export --------------------------------------------------------------


def _as_proto(source):
    """(onnx.ModelProto, the folder of its file or None) of a path, bytes, ModelProto, OnnxModel
    or compiled model."""
    import onnx

    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        return onnx.load(path), os.path.dirname(os.path.abspath(path))
    if isinstance(source, (bytes, bytearray)):
        return onnx.load_from_string(bytes(source)), None
    if isinstance(source, onnx.ModelProto):
        return source, None
    model = getattr(source, "model", source)  # a compiled model: the OnnxModel it was compiled from
    ir_model = getattr(model, "ir", None)
    if ir_model is None or not hasattr(ir_model, "graph"):
        raise MithrilError(f"save_gguf(arch=...) takes an ONNX decoder (a path, bytes, onnx.ModelProto, "
                           f"ml.load_onnx's model or a model compiled from one), not a {type(source).__name__}")
    import onnx_ir as ir

    where = getattr(model, "source", None)
    folder = os.path.dirname(os.path.abspath(where)) if isinstance(where, str) and os.path.isfile(where) else None
    return ir.serde.serialize_model(ir_model), folder


def _constants(proto) -> dict[str, np.ndarray]:
    """Initializers and Constant nodes' values, by name, with Identity nodes' outputs resolved."""
    from onnx import numpy_helper

    values = {t.name: t for t in proto.graph.initializer}
    arrays: dict[str, Any] = dict(values)
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            arrays[node.output[0]] = node.attribute[0].t
        elif node.op_type == "Identity" and node.input[0] in arrays:
            arrays[node.output[0]] = arrays[node.input[0]]
    cache: dict[int, np.ndarray] = {}

    class _Lazy(dict):
        def __missing__(self, key):
            t = arrays[key]
            if id(t) not in cache:
                cache[id(t)] = numpy_helper.to_array(t)
            return cache[id(t)]

        def __contains__(self, key):
            return key in arrays

    return _Lazy()


def _module(node) -> str | None:
    """The module path torch's exporter put in a node's name (``/model/layers.0/mlp/up_proj/MatMul``
    -> ``model.layers.0.mlp.up_proj``), or None."""
    name = node.name
    if not name.startswith("/") or name.count("/") < 2:
        return None
    return name[1:].rsplit("/", 1)[0].replace("/", ".")


def hf_state(proto) -> dict[str, np.ndarray]:
    """The Hugging Face parameters (name -> float32 array, ``nn.Linear``'s [out, in] layout for
    every projection, GPT-2's Conv1D included) an ONNX export reads, found by its nodes' names."""
    const = _constants(proto)
    state: dict[str, np.ndarray] = {}
    matmul_out: dict[str, str] = {}  # output of a projection's MatMul -> its module

    def put(key, value):
        state.setdefault(key, np.asarray(value, dtype=np.float32))

    for node in proto.graph.node:
        module = _module(node)
        if module is None:
            continue
        ins = list(node.input)
        op = node.op_type
        if op == "MatMul" and len(ins) == 2 and ins[1] in const and const[ins[1]].ndim == 2:
            put(f"{module}.weight", const[ins[1]].T)
            matmul_out[node.output[0]] = module
        elif op == "Gemm" and len(ins) >= 2 and ins[1] in const:
            attrs = {a.name: a.i for a in node.attribute if a.type == 2}
            w = const[ins[1]]
            put(f"{module}.weight", w if attrs.get("transB", 0) else w.T)
            if len(ins) > 2 and ins[2] in const:
                put(f"{module}.bias", const[ins[2]].reshape(-1))
        elif op == "Add" and len(ins) == 2 and (ins[0] in matmul_out or ins[1] in matmul_out):
            product, other = (ins[0], ins[1]) if ins[0] in matmul_out else (ins[1], ins[0])
            if other in const and const[other].ndim == 1 and matmul_out[product] == module:
                put(f"{module}.bias", const[other])
        elif op == "Gather" and ins[0] in const and const[ins[0]].ndim == 2:
            put(f"{module}.weight", const[ins[0]])
        elif op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"):
            if len(ins) > 1 and ins[1] in const:
                put(f"{module}.weight", const[ins[1]])
            if len(ins) > 2 and ins[2] in const:
                put(f"{module}.bias", const[ins[2]])
        elif op == "Mul" and "norm" in module.rsplit(".", 1)[-1]:
            for i in ins:
                if i in const and const[i].ndim == 1 and const[i].size > 1:
                    put(f"{module}.weight", const[i])
    return state


def _norm_eps(proto) -> float | None:
    """The epsilon of the first norm in the graph (LayerNormalization's attribute, or the constant
    an RMSNorm adds to the mean of squares)."""
    const = _constants(proto)
    for node in proto.graph.node:
        if node.op_type in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
            for a in node.attribute:
                if a.name == "epsilon":
                    return float(a.f)
        module = _module(node) or ""
        if node.op_type == "Add" and "norm" in module.rsplit(".", 1)[-1]:
            for i in node.input:
                if i in const and const[i].size == 1:
                    return float(const[i].reshape(-1)[0])
    return None


def _rope_theta(proto, head_dim: int) -> float | None:
    """rope_theta from the inverse frequencies the rotary module expands (theta^(-2i/d))."""
    const = _constants(proto)
    for node in proto.graph.node:
        if "rotary" in (node.name or "") and node.op_type in ("Expand", "MatMul", "Mul"):
            for i in node.input:
                if i in const and const[i].size == head_dim // 2 and head_dim >= 4:
                    f = const[i].reshape(-1).astype(np.float64)
                    if f[0] == 1.0 and 0 < f[1] < 1:
                        theta = f[1] ** (-head_dim / 2)
                        return float(f"{theta:.6g}")
    return None


# -- hyperparameters -------------------------------------------------------------------------------


def _read_config(config, folder) -> dict:
    if config is None and folder is not None and os.path.isfile(os.path.join(folder, "config.json")):
        config = os.path.join(folder, "config.json")
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        return config.to_dict()
    with open(os.fspath(config), encoding="utf-8") as f:
        return json.load(f)


def _detect_arch(state: dict, config: dict) -> str:
    kind = config.get("model_type")
    if kind in _MODEL_TYPES:
        return _MODEL_TYPES[kind]
    if kind is not None:
        raise MithrilError(f"save_gguf: model_type {kind!r} has no llama.cpp mapping here; arch may be one of "
                           f"{', '.join(ARCHS)}")
    if any(k.startswith("transformer.h.") for k in state):
        return "gpt2"
    if any(".qkv_proj." in k for k in state):
        return "phi3"
    if any(k.endswith("self_attn.q_proj.bias") for k in state):
        return "qwen2"
    if any(k.endswith("self_attn.q_proj.weight") for k in state):
        return "llama"
    raise MithrilError("save_gguf: found no GPT-2, Llama, Qwen2 or Phi-3 parameters in this graph (its nodes "
                       "should carry torch's module paths, as optimum's exports do); pass arch= and check the export")


def _cache_inputs(proto) -> list:
    """The ``past_key_values.N.key`` inputs' dims, by layer."""
    found = {}
    for v in proto.graph.input:
        m = re.fullmatch(r"past_key_values\.(\d+)\.key", v.name)
        if m:
            found[int(m.group(1))] = [d.dim_value if d.HasField("dim_value") else None
                                      for d in v.type.tensor_type.shape.dim]
    return [found[i] for i in sorted(found)]


def _hparams(arch: str, state: dict, proto, config: dict, context_length: int | None) -> dict:
    def pick(*keys, default=None):
        for k in keys:
            if config.get(k) is not None:
                return config[k]
        return default

    if arch == "gpt2":
        vocab, n_embd = state["transformer.wte.weight"].shape
        n_layer = len({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
        n_ff = state["transformer.h.0.mlp.c_fc.weight"].shape[0]
        caches = _cache_inputs(proto)
        head_dim = caches[0][3] if caches and caches[0][3] else None
        n_head = pick("n_head", "num_attention_heads", default=n_embd // head_dim if head_dim else None)
        hp = dict(n_vocab=vocab, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head, n_head_kv=n_head,
                  eps=pick("layer_norm_epsilon", default=_norm_eps(proto) or 1e-5),
                  n_ctx=pick("n_positions", "n_ctx", default=state["transformer.wpe.weight"].shape[0]))
    else:
        vocab, n_embd = state["model.embed_tokens.weight"].shape
        n_layer = len({k.split(".")[2] for k in state if k.startswith("model.layers.")})
        if arch == "phi3":
            n_ff = state["model.layers.0.mlp.down_proj.weight"].shape[1]
        else:
            n_ff = state["model.layers.0.mlp.up_proj.weight"].shape[0]
        caches = _cache_inputs(proto)
        kv_from_graph = caches[0][1] if caches else None
        head_dim = pick("head_dim", default=caches[0][3] if caches and caches[0][3] else None)
        n_head = pick("num_attention_heads", default=n_embd // head_dim if head_dim else None)
        if n_head is None:
            raise MithrilError("save_gguf: cannot tell the number of attention heads; pass config= (the config.json "
                               "optimum writes next to model.onnx)")
        head_dim = head_dim or n_embd // n_head
        theta = pick("rope_theta")
        if theta is None and isinstance(config.get("rope_parameters"), Mapping):
            theta = config["rope_parameters"].get("rope_theta")
        scaling = config.get("rope_scaling")
        if isinstance(scaling, Mapping) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise MithrilError(f"save_gguf: rope_scaling {scaling!r} is not supported (plain RoPE only)")
        hp = dict(n_vocab=vocab, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
                  n_head_kv=pick("num_key_value_heads", default=kv_from_graph or n_head), head_dim=head_dim,
                  eps=pick("rms_norm_eps", default=_norm_eps(proto) or 1e-6),
                  rope_theta=float(theta if theta is not None else (_rope_theta(proto, head_dim) or 10000.0)),
                  n_rot=int(pick("partial_rotary_factor", default=1.0) * head_dim),
                  n_ctx=pick("max_position_embeddings", default=None))
        if arch == "phi3":
            hp["n_ctx_orig"] = pick("original_max_position_embeddings", default=hp["n_ctx"])
            hp["sliding_window"] = pick("sliding_window", default=0) or 0
    if context_length is not None:
        hp["n_ctx"] = int(context_length)
    if hp["n_ctx"] is None:
        raise MithrilError("save_gguf: the context length is not in the graph; pass config= or context_length=")
    hp["n_ctx"] = int(hp["n_ctx"])
    return hp


# -- tensors in llama.cpp's names and layouts ---------------------------------------------------


def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a Q or K projection (or bias) reordered so that llama.cpp's rope on adjacent pairs
    computes what Hugging Face's rotate_half (halves of each head) does."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(arch: str, state: dict, hp: dict) -> dict[str, np.ndarray]:
    """llama.cpp's tensors (GGUF name -> float32 array in NumPy order, [out, in] for matrices)."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], hp["n_layer"])
    out: dict[str, np.ndarray] = {}
    skipped = []
    for key, value in state.items():
        if arch == "gpt2" and key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            skipped.append(key)
            continue
        if arch == "llama" and re.search(r"\.self_attn\.(q|k)_proj\.", key):
            value = _permute_rope(value, hp["n_head"] if ".q_proj." in key else hp["n_head_kv"])
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    if skipped:
        raise MithrilError(f"save_gguf: no {arch} tensor for parameter(s) {skipped[:6]}")
    if "output.weight" not in out:  # tied embeddings: llama.cpp may fall back, phi3 does not; write it
        out["output.weight"] = out["token_embd.weight"]
    required = ["token_embd.weight", "output_norm.weight", "output.weight"]
    per_block = {"gpt2": ["attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
                          "ffn_up.weight", "ffn_down.weight"],
                 "phi3": ["attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
                          "ffn_up.weight", "ffn_down.weight"]}.get(
        arch, ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
               "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"])
    if arch == "gpt2":
        required.append("position_embd.weight")
    if arch == "qwen2":
        per_block += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    required += [f"blk.{i}.{t}" for i in range(hp["n_layer"]) for t in per_block]
    missing = [n for n in required if n not in out]
    if missing:
        raise MithrilError(f"save_gguf: the graph gives no {missing[:6]} for arch {arch!r}; found "
                           f"{sorted(state)[:8]}...")
    order = {n: i for i, n in enumerate(required)}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


# -- tokenizer ----------------------------------------------------------------------------------


@dataclass
class _Vocab:
    tokens: list
    types: list
    merges: list
    pre: str
    bos: int | None
    eos: int | None
    add_bos: bool = False


def _byte_level(node) -> bool:
    if not isinstance(node, Mapping):
        return False
    if node.get("type") == "ByteLevel":
        return True
    return any(_byte_level(n) for n in node.get("pretokenizers", []) or [])


def _gpt2_regex(pre) -> bool:
    """A lone ByteLevel pre-tokenizer with its regex: GPT-2's split, llama.cpp's pre type 'gpt-2'."""
    if isinstance(pre, Mapping) and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    return isinstance(pre, Mapping) and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)


def _read_vocab(tokenizer, folder, n_vocab: int, config: dict) -> _Vocab:
    if tokenizer is None and folder is not None and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        tokenizer = os.path.join(folder, "tokenizer.json")
    if tokenizer is None:
        raise MithrilError("save_gguf: llama.cpp needs the tokenizer; pass tokenizer= (a tokenizer.json file or a "
                           "tokenizers.Tokenizer) or put tokenizer.json next to the model")
    if hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
        spec = json.loads(tokenizer.to_str())
    elif isinstance(tokenizer, Mapping):
        spec = dict(tokenizer)
    else:
        with open(os.fspath(tokenizer), encoding="utf-8") as f:
            spec = json.load(f)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not (_byte_level(spec.get("pre_tokenizer")) or _byte_level(spec.get("decoder"))):
        raise MithrilError(f"save_gguf: only byte-level BPE tokenizers (GPT-2's kind) are converted; this one is a "
                           f"{model.get('type')} with pre-tokenizer {(spec.get('pre_tokenizer') or {}).get('type')}")
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {t["id"]: t for t in spec.get("added_tokens") or []}
    for i, t in added.items():
        vocab.setdefault(t["content"], i)
    if vocab and max(vocab.values()) >= n_vocab:
        raise MithrilError(f"save_gguf: the tokenizer has ids up to {max(vocab.values())}, the model's embedding "
                           f"{n_vocab} rows")
    import gguf

    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n_vocab):  # ids the tokenizer lacks: placeholders, as llama.cpp's converter writes
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        elif i in added:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED))
        else:
            tokens.append(by_id[i])
            types.append(int(gguf.TokenType.NORMAL))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]

    def special(key):
        v = config.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        return int(v) if v is not None and 0 <= int(v) < n_vocab else None

    bos, eos = special("bos_token_id"), special("eos_token_id")
    if eos is None:  # GPT-2's convention: one <|endoftext|> is both
        eos = next((i for i, t in added.items() if t.get("special") and "end" in t["content"]), None)
    if bos is None:
        bos = eos
    post = spec.get("post_processor") or {}
    add_bos = post.get("type") == "TemplateProcessing" and bos is not None and any(
        (s.get("SpecialToken") or {}).get("id") == by_id.get(bos) for s in post.get("single", [])[:1])
    return _Vocab(tokens, types, merges, "gpt-2" if _gpt2_regex(spec.get("pre_tokenizer")) else "default", bos, eos,
                  add_bos)


# -- writing ---------------------------------------------------------------------------------------


# llama.cpp sets attributes of these tokens in any model whose general.name contains "phi3" or
# "phi-3" (llama-vocab.cpp), and fails to load one whose vocabulary lacks one of them
_PHI3_NAMED_TOKENS = ("</s>", "<unk>", "<s>", "<|endoftext|>")


def _model_name(name: str | None, cfg: dict, proto, vocab: _Vocab) -> str:
    """general.name: ``name``, else the model's folder as the config names it, else the graph's."""
    if name is None:
        exported = os.path.basename(str(cfg.get("_name_or_path") or "").rstrip("/\\"))
        graph_name = proto.graph.name if proto.graph.name not in ("", "main_graph", "torch_jit") else None
        name = exported or graph_name or "mithril export"
    missing = [t for t in _PHI3_NAMED_TOKENS if t not in vocab.tokens]
    if ("phi3" in name.lower() or "phi-3" in name.lower()) and missing:
        raise MithrilError(f"save_gguf: llama.cpp treats a model named {name!r} as Phi-3's and looks up the tokens "
                           f"{missing}, which this tokenizer lacks (it would not load); pass another name=")
    return name


def _file_type(quantize: str | None):
    import gguf

    ft = gguf.LlamaFileType
    return {None: ft.ALL_F32, "f32": ft.ALL_F32, "f16": ft.MOSTLY_F16, "q8_0": ft.MOSTLY_Q8_0,
            "q4_0": ft.MOSTLY_Q4_0, "q4_1": ft.MOSTLY_Q4_1, "q5_0": ft.MOSTLY_Q5_0, "q5_1": ft.MOSTLY_Q5_1,
            "q4_K": ft.MOSTLY_Q4_K_S, "q6_K": ft.MOSTLY_Q6_K}[quantize]


def _stored_type(name: str, a: np.ndarray, quantize: str | None) -> str:
    """The ggml type tensor ``name`` is written in: matrices in ``quantize`` (f32 where the rows are
    not whole blocks, as llama.cpp's converter falls back), 1-D tensors and the position table in f32."""
    from .quantize import QUANT_TYPES

    if quantize in (None, "f32") or a.ndim < 2 or name.startswith("position_embd"):
        return "f32"
    if quantize == "f16":
        return "f16"
    return quantize if a.shape[-1] % QUANT_TYPES[quantize][1] == 0 else "f32"


def _canonical_type(quantize: str | None) -> str | None:
    if quantize is None or quantize in ("f32", "f16"):
        return quantize
    from .quantize import quant_name

    q = quant_name(quantize)
    if q not in FILE_TYPES:
        raise BackendOptionError(f"save_gguf: quantize must be one of {', '.join(FILE_TYPES)}, got {quantize!r}")
    return q


def save_llama_gguf(source, path, arch: str | None = "auto", quantize: str | None = None, *, tokenizer=None,
                    config=None, name: str | None = None, context_length: int | None = None) -> dict:
    """Write the ONNX decoder ``source`` as a GGUF file llama.cpp loads (see the module's doc).

    ``arch``: ``"gpt2"``, ``"llama"``, ``"qwen2"``, ``"phi3"`` or ``"auto"`` (from the config's
    ``model_type``, else from the parameter names). ``quantize``: None/``"f32"``, ``"f16"``,
    ``"q8_0"``, ``"q4_0"``... for every matrix. ``tokenizer``: a ``tokenizer.json`` path, a
    ``tokenizers.Tokenizer`` or its JSON as a dict (default: ``tokenizer.json`` beside the
    model's file). ``config``: the Hugging Face ``config.json`` (path, dict or PretrainedConfig;
    default: the one beside the file). Returns the hyperparameters written.
    """
    import gguf

    path = os.fspath(path)
    quantize = _canonical_type(quantize)
    proto, folder = _as_proto(source)
    cfg = _read_config(config, folder)
    state = hf_state(proto)
    arch = _detect_arch(state, cfg) if arch in (None, "auto") else arch
    if arch not in ARCHS:
        raise MithrilError(f"save_gguf: arch must be one of {', '.join(ARCHS)} or 'auto', got {arch!r}")
    hp = _hparams(arch, state, proto, cfg, context_length)
    tensors = gguf_tensors(arch, state, hp)
    vocab = _read_vocab(tokenizer, folder, hp["n_vocab"], cfg)
    from .quantize import quantize_rows

    writer = gguf.GGUFWriter(path, arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(_model_name(name, cfg, proto, vocab))
    writer.add_file_type(int(_file_type(quantize)))
    writer.add_context_length(hp["n_ctx"])
    writer.add_embedding_length(hp["n_embd"])
    writer.add_block_count(hp["n_layer"])
    writer.add_feed_forward_length(hp["n_ff"])
    writer.add_head_count(hp["n_head"])
    writer.add_head_count_kv(hp["n_head_kv"])
    if arch == "gpt2":
        writer.add_layer_norm_eps(float(hp["eps"]))
    else:
        writer.add_layer_norm_rms_eps(float(hp["eps"]))
        writer.add_rope_freq_base(float(hp["rope_theta"]))
        writer.add_rope_dimension_count(hp["n_rot"])
        if hp["head_dim"] * hp["n_head"] != hp["n_embd"]:
            writer.add_key_length(hp["head_dim"])
            writer.add_value_length(hp["head_dim"])
        if arch == "llama":
            writer.add_vocab_size(hp["n_vocab"])
        if arch == "phi3":
            writer.add_rope_scaling_orig_ctx_len(int(hp["n_ctx_orig"]))
            writer.add_sliding_window(int(hp["sliding_window"]))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    if vocab.bos is not None:
        writer.add_bos_token_id(vocab.bos)
    if vocab.eos is not None:
        writer.add_eos_token_id(vocab.eos)
    writer.add_add_bos_token(bool(vocab.add_bos))
    if quantize not in (None, "f32", "f16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for tname, a in tensors.items():
        kind = _stored_type(tname, a, quantize)
        if kind == "f32":
            writer.add_tensor(tname, a)
        elif kind == "f16":
            writer.add_tensor(tname, a.astype(np.float16))
        else:
            raw = quantize_rows(a.reshape(-1, a.shape[-1]), kind).reshape(a.shape[0], -1)
            writer.add_tensor(tname, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[kind.upper()])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"arch": arch, **hp}


# -- reading a file back as a decode-step model --------------------------------------------------


@dataclass
class GGUFDecoder:
    """A llama.cpp GGUF file as one decode step (:func:`gguf_decoder`): ``model`` (an OnnxModel
    with :func:`mithril.generate`'s inputs and caches), ``params`` (its weights, quantized ones
    as the file stores them), ``quantize`` and ``weight_type`` (the file's matrix type, as
    GGMLBackend's ``quantize``/``dtype``), ``arch``, ``hparams`` and ``tokens`` (the vocabulary)."""

    model: Any
    params: dict
    quantize: str | None
    arch: str
    hparams: dict
    tokens: list = field(default_factory=list, repr=False)
    weight_type: str = "f32"

    def backend(self, **options):
        """A GGMLBackend that stores the matrices in the file's type (their bytes used as they are)."""
        from .backend import GGMLBackend

        if self.weight_type == "f16":
            options.setdefault("dtype", "float16")
        return GGMLBackend(quantize=self.quantize, **options)


def gguf_decoder(path, context: int | None = None) -> GGUFDecoder:
    """The GGUF file ``path`` (architecture gpt2, llama, qwen2 or phi3, as :func:`save_llama_gguf`
    or llama.cpp's converter writes it) as a decode-step model for :func:`mithril.generate`,
    with caches of ``context`` positions (default: the file's context length, at most 512).

    Matrices stored in one quantized type are passed as :class:`QuantizedTensor` whose bytes
    GGMLBackend(quantize=that type) reads without converting; other backends dequantize them.
    """
    import gguf

    from ...onnx_bridge.load import load_onnx
    from .quantize import QuantizedTensor, stored_shape

    path = os.fspath(path)
    reader = gguf.GGUFReader(path, "r")
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise MithrilError(f"gguf_decoder: {path!r} is a {arch!r} model; the architectures read are {', '.join(ARCHS)}")

    def key(k, default=None):
        return meta.get(f"{arch}.{k}", default)

    tensors: dict[str, tuple[str, tuple, np.ndarray]] = {}
    for t in reader.tensors:
        tname = t.tensor_type.name
        kind = tname[:-2].lower() + "_K" if tname.endswith("_K") else tname.lower()
        tensors[t.name] = (kind, tuple(int(d) for d in t.shape[::-1]), np.array(t.data))
    hp = {"n_embd": key("embedding_length"), "n_layer": key("block_count"), "n_ff": key("feed_forward_length"),
          "n_head": key("attention.head_count"), "n_ctx": key("context_length")}
    hp["n_head_kv"] = key("attention.head_count_kv", hp["n_head"])
    hp["head_dim"] = key("attention.key_length", hp["n_embd"] // hp["n_head"])
    hp["eps"] = key("attention.layer_norm_epsilon") if arch == "gpt2" else key("attention.layer_norm_rms_epsilon")
    hp["rope_theta"] = key("rope.freq_base", 10000.0)
    hp["n_rot"] = key("rope.dimension_count", hp["head_dim"])
    hp["n_vocab"] = tensors["token_embd.weight"][1][0]
    size = int(context or min(hp["n_ctx"], 512))
    if arch == "gpt2" and size > hp["n_ctx"]:
        raise MithrilError(f"gguf_decoder: GPT-2's position table has {hp['n_ctx']} rows; context {size} exceeds it")
    stored = sorted({kind for name, (kind, shape, _) in tensors.items()
                     if kind != "f32" and len(shape) == 2 and name != "position_embd.weight"})
    if len(stored) > 1:
        raise MithrilError(f"gguf_decoder: {path!r} mixes the types {stored}; GGMLBackend stores its matrices in one")
    matrix_type = stored[0] if stored else None  # the file's matrices: f16, a quantized type, or float32
    quantize = matrix_type if matrix_type not in (None, "f16") else None

    params: dict[str, Any] = {}

    def dense(name) -> np.ndarray:
        kind, shape, data = tensors[name]
        if kind == "f32":
            return data.reshape(shape).astype(np.float32)
        if kind == "f16":
            return data.view(np.float16).reshape(shape).astype(np.float32)
        from .quantize import dequantize_rows

        return dequantize_rows(data, kind, int(np.prod(shape[:-1])), shape[-1]).reshape(shape)

    def matrix(name, transposed=True):
        """A weight read by MatMul as [in, out] (stored [out, in]: layout 't') or by Gather as is."""
        kind, shape, data = tensors[name]
        layout = "t" if transposed else "rows"
        own = (shape[1], shape[0]) if transposed else shape
        if kind == matrix_type and kind is not None and stored_shape(layout, kind, own) == shape:
            params[name] = QuantizedTensor(kind, layout, own, data)
        else:
            params[name] = dense(name).T.copy() if transposed else dense(name)
        return name

    def vector(name):
        params[name] = dense(name).reshape(-1)
        return name

    graph = _DecoderGraph(arch, hp, size, tensors, matrix, vector, dense, params)
    model = load_onnx(graph.build())
    _lazy_weights(model, params)
    return GGUFDecoder(model, params, quantize, arch, {**hp, "context": size},
                       list(meta.get("tokenizer.ggml.tokens") or []), "f16" if matrix_type == "f16" else "f32")


def _lazy_weights(model, params: dict) -> None:
    """The weights, declared as graph inputs, become initializers whose float32 values are made
    only if asked for (``get_parameters()``, another backend): GGMLBackend reads ``params``, the
    file's bytes, and a model of billions of weights needs no float32 copy."""
    import onnx_ir as ir

    graph = model.ir.graph
    for value in list(graph.inputs):
        if value.name not in params:
            continue
        source = params[value.name]

        def make(source=source, name=value.name):
            return ir.Tensor(np.ascontiguousarray(np.asarray(source, dtype=np.float32)), name=name)

        value.const_value = ir.LazyTensor(make, dtype=ir.DataType.FLOAT, shape=ir.Shape(value.shape.dims))
        graph.register_initializer(value)


class _DecoderGraph:
    """One decode step of a GGUF decoder as an ONNX graph (batch 1): ``input`` [1, 1] int64,
    ``mask`` [1, S], ``write`` [S, 1]; per layer ``k_cache_i``/``v_cache_i`` [n_kv, S, head_dim]
    with ``*_next`` outputs; ``output`` [1, 1, vocab]."""

    def __init__(self, arch, hp, size, tensors, matrix, vector, dense, params):
        self.arch, self.hp, self.size, self.tensors, self.params = arch, hp, size, tensors, params
        self.matrix, self.vector, self.dense = matrix, vector, dense
        self.nodes, self.inits, self.n = [], [], 0

    def op(self, op_type, *inputs, **attrs):
        from onnx import helper

        self.n += 1
        out = f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, name=None):
        """A Constant node (the weights alone are initializers: the parameters)."""
        from onnx import helper, numpy_helper

        self.n += 1
        name = name or f"c_{self.n}"
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))))
        return name


    def linear(self, x, prefix):
        y = self.op("MatMul", x, self.matrix(f"{prefix}.weight"))
        if f"{prefix}.bias" in self.tensors:
            y = self.op("Add", y, self.vector(f"{prefix}.bias"))
        return y

    def norm(self, x, prefix):
        eps = float(self.hp["eps"])
        if self.arch == "gpt2":
            return self.op("LayerNormalization", x, self.vector(f"{prefix}.weight"), self.vector(f"{prefix}.bias"),
                           axis=-1, epsilon=eps)
        return self.op("RMSNormalization", x, self.vector(f"{prefix}.weight"), axis=-1, epsilon=eps)

    def slice(self, x, start, end, axis=-1):
        return self.op("Slice", x, self.const(np.array([start], np.int64)), self.const(np.array([end], np.int64)),
                       self.const(np.array([axis], np.int64)))

    def reshape(self, x, shape):
        return self.op("Reshape", x, self.const(np.array(shape, np.int64)))

    def rope(self, x, heads, cos, sin):
        """x [heads, head_dim] rotated at this step's position (cos/sin [1, n_rot/2])."""
        hd, n_rot = self.hp["head_dim"], self.hp["n_rot"]
        rot, rest = (x, None) if n_rot == hd else (self.slice(x, 0, n_rot), self.slice(x, n_rot, hd))
        half = n_rot // 2
        if self.arch in _NEOX:  # halves of each head
            a, b = self.slice(rot, 0, half), self.slice(rot, half, n_rot)
            first = self.op("Sub", self.op("Mul", a, cos), self.op("Mul", b, sin))
            second = self.op("Add", self.op("Mul", b, cos), self.op("Mul", a, sin))
            rot = self.op("Concat", first, second, axis=-1)
        else:  # adjacent pairs (the file's Q/K rows are permuted for it)
            pairs = self.reshape(rot, [heads, half, 2])
            a, b = self.slice(pairs, 0, 1), self.slice(pairs, 1, 2)
            c, s = self.reshape(cos, [1, half, 1]), self.reshape(sin, [1, half, 1])
            first = self.op("Sub", self.op("Mul", a, c), self.op("Mul", b, s))
            second = self.op("Add", self.op("Mul", a, s), self.op("Mul", b, c))
            rot = self.reshape(self.op("Concat", first, second, axis=-1), [heads, n_rot])
        return rot if rest is None else self.op("Concat", rot, rest, axis=-1)

    def at_position(self, table, write):
        """Row p of ``table`` [S, n] as [1, n]: a one-hot sum (a float operand, never quantized)."""
        return self.op("ReduceSum", self.op("Mul", table, write), self.const(np.array([0], np.int64)), keepdims=1)

    def build(self):
        from onnx import TensorProto, helper

        hp, size, arch = self.hp, self.size, self.arch
        n_embd, n_head, n_kv, hd = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
        group = n_head // n_kv
        write, mask = "write", "mask"
        keep = self.op("Sub", self.const(np.array(1.0, np.float32)), write)
        x = self.reshape(self.op("Gather", self.matrix("token_embd.weight", transposed=False), "input"), [1, n_embd])
        if arch == "gpt2":
            table = self.const(self.dense("position_embd.weight")[:size].astype(np.float32), "position_embd.weight")
            x = self.op("Add", x, self.at_position(table, write))
        else:
            n_rot = hp["n_rot"]
            # llama.cpp's angles: p * theta^(-2i/n_rot), in float32
            inv = (float(hp["rope_theta"]) ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
            angles = np.arange(size, dtype=np.float64)[:, None] * inv[None]
            cos = self.at_position(self.const(np.cos(angles).astype(np.float32)), write)
            sin = self.at_position(self.const(np.sin(angles).astype(np.float32)), write)
        scale = self.const(np.array(1.0 / math.sqrt(hd), np.float32))
        inputs = [helper.make_tensor_value_info("input", TensorProto.INT64, [1, 1]),
                  helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, size]),
                  helper.make_tensor_value_info("write", TensorProto.FLOAT, [size, 1])]
        outputs = []
        for i in range(hp["n_layer"]):
            blk = f"blk.{i}"
            h = self.norm(x, f"{blk}.attn_norm")
            if f"{blk}.attn_qkv.weight" in self.tensors:
                qkv = self.linear(h, f"{blk}.attn_qkv")
                q = self.slice(qkv, 0, n_head * hd)
                k = self.slice(qkv, n_head * hd, (n_head + n_kv) * hd)
                v = self.slice(qkv, (n_head + n_kv) * hd, (n_head + 2 * n_kv) * hd)
            else:
                q, k, v = (self.linear(h, f"{blk}.attn_{t}") for t in "qkv")
            q, k = self.reshape(q, [n_head, hd]), self.reshape(k, [n_kv, hd])
            if arch != "gpt2":
                q, k = self.rope(q, n_head, cos, sin), self.rope(k, n_kv, cos, sin)
            q = self.reshape(q, [n_kv, group, hd])
            k, v = self.reshape(k, [n_kv, 1, hd]), self.reshape(v, [n_kv, 1, hd])
            caches = {}
            for kv, new in (("k", k), ("v", v)):
                name = f"{kv}_cache_{i}"
                inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [n_kv, size, hd]))
                nxt = self.op("Add", self.op("Mul", name, keep), self.op("Mul", new, write))
                self.nodes.append(helper.make_node("Identity", [nxt], [f"{name}_next"]))
                outputs.append(helper.make_tensor_value_info(f"{name}_next", TensorProto.FLOAT, [n_kv, size, hd]))
                caches[kv] = f"{name}_next"
            scores = self.op("MatMul", q, self.op("Transpose", caches["k"], perm=[0, 2, 1]))
            probs = self.op("Softmax", self.op("Add", self.op("Mul", scores, scale), mask), axis=-1)
            attn = self.reshape(self.op("MatMul", probs, caches["v"]), [1, n_head * hd])
            x = self.op("Add", x, self.linear(attn, f"{blk}.attn_output"))
            h = self.norm(x, f"{blk}.ffn_norm")
            if arch == "gpt2":
                up = self.op("Gelu", self.linear(h, f"{blk}.ffn_up"), approximate="tanh")
            elif f"{blk}.ffn_gate.weight" in self.tensors:
                g = self.linear(h, f"{blk}.ffn_gate")
                up = self.op("Mul", self.op("Mul", self.op("Sigmoid", g), g), self.linear(h, f"{blk}.ffn_up"))
            else:  # phi3: gate and up in one matrix, the gate first
                gu = self.linear(h, f"{blk}.ffn_up")
                g = self.slice(gu, 0, hp["n_ff"])
                up = self.slice(gu, hp["n_ff"], 2 * hp["n_ff"])
                up = self.op("Mul", self.op("Mul", self.op("Sigmoid", g), g), up)
            x = self.op("Add", x, self.linear(up, f"{blk}.ffn_down"))
        x = self.norm(x, "output_norm")
        logits = self.linear(x, "output")
        self.nodes.append(helper.make_node("Reshape", [logits, self.const(np.array([1, 1, -1], np.int64))],
                                           ["output"]))
        outputs.insert(0, helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, hp["n_vocab"]]))
        # the weights: declared here, made initializers (lazily valued) by _lazy_weights
        used = {i for n in self.nodes for i in n.input}
        for name in sorted(used & set(self.params)):
            p = self.params[name]
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(p.shape)))
        graph = helper.make_graph(self.nodes, f"{arch}_decode_step", inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


__all__ = ["ARCHS", "FILE_TYPES", "GGUFDecoder", "gguf_decoder", "gguf_tensors", "hf_state", "save_llama_gguf"]
