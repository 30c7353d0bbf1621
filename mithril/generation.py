"""Greedy generation with a key/value cache: :func:`generate` runs a compiled decode-step model
one token at a time, on any backend.

A decode-step model (``models_zoo.create_gpt_decoder`` is one) reads one token per call and keeps
its past in fixed-size caches, so every shape is static and GGML and C run it like NumPy does.
:func:`generate` knows it by these names:

- ``input`` [N, 1] token ids in, ``output`` [N, 1, vocab] (or [N, vocab]) logits out;
- a cache is every input ``X`` with an output ``X_next`` (``k_cache_0`` -> ``k_cache_0_next``):
  zeros at the start, then each step's ``X_next`` becomes the next step's ``X`` (it stays a
  backend array in between);
- the position p of the token, in whichever of these forms the model declares: ``position``
  [1] int64 (p), ``mask`` [1, S] float (0 at 0..p, a large negative number after) and
  ``write`` [S, ...] float (ones in row p, zeros elsewhere), where S is the cache size.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from .errors import MithrilError, public_api

_POSITION_INPUTS = ("position", "mask", "write")


@public_api(MithrilError, "generate")
def generate(step, params: Mapping[str, Any] | None, prompt_ids, max_new_tokens: int, *,
             return_speed: bool = False):
    """Greedy decoding: feed ``prompt_ids`` ([T] or [N, T] ints) through the compiled step
    model ``step`` one token at a time (filling its caches), then append the argmax of each
    step's logits and feed it back, ``max_new_tokens`` times. ``params`` None or empty: the
    model's own (an ONNX file's initializers). Returns the new ids ([max_new_tokens]
    or [N, max_new_tokens], int64); with ``return_speed=True``, ``(ids, tokens_per_second)``
    where the rate counts the steps that produced new tokens (the prompt's last token onward),
    timed around ``step.evaluate`` including the transfer of the logits to NumPy.

    The step model's batch size N is fixed at compile; ``T + max_new_tokens - 1`` positions must
    fit its cache size S. The names it must use are in this module's docstring.

    >>> import mithril as ml, models_zoo
    >>> model = models_zoo.create_gpt_decoder(bias=True, block_size=16, dims=8, num_heads=2, num_layers=1,
    ...                                       vocab_size=32)
    >>> step = ml.compile(model, ml.NumpyBackend(), shapes={"input": (1, 1)}, inference=True)
    >>> params = step.randomize_params()
    >>> ids = ml.generate(step, params, [3, 1, 4], max_new_tokens=5)
    >>> ids.shape, ids.dtype
    ((5,), dtype('int64'))
    """
    backend = step.backend
    inputs = {v.name: v for v in step.ir.graph.inputs if v.name in step.input_keys}
    caches = [name for name in inputs if f"{name}_next" in step.output_keys]
    if "input" not in inputs or "output" not in step.output_keys:
        raise MithrilError(f"generate: the step model needs an 'input' (token ids) and an 'output' (logits); "
                           f"it has inputs {list(inputs)} and outputs {step.output_keys}")
    unknown = [n for n in inputs if n not in ("input", *_POSITION_INPUTS, *caches)]
    if unknown:
        raise MithrilError(f"generate: the step model's input(s) {unknown} are neither 'input', a position "
                           f"({', '.join(_POSITION_INPUTS)}) nor a cache X with an output X_next")
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    batched = prompt.ndim == 2
    prompt = prompt if batched else prompt[None]
    n, length = _static(inputs["input"])
    if prompt.ndim != 2 or prompt.shape[0] != n or length != 1 or prompt.shape[1] == 0:
        raise MithrilError(f"generate: prompt_ids {list(np.shape(prompt_ids))} do not fit the step model's input "
                           f"[{n}, {length}]: give [T] (batch 1) or [{n}, T] with T >= 1, and compile with input "
                           f"[N, 1]")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
        raise MithrilError(f"generate: max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    size = _cache_size(inputs)
    last = prompt.shape[1] + max_new_tokens - 2  # the position of the last token fed
    if size is not None and last >= size:
        raise MithrilError(f"generate: {prompt.shape[1]} prompt tokens and {max_new_tokens} new ones need "
                           f"{last + 1} positions; the step model's cache holds {size}")
    state = {name: backend.from_numpy(np.zeros(_static(inputs[name]), _np_dtype(inputs[name]))) for name in caches}
    # the same arrays on every step: GGML re-reads (and re-quantizes) a parameter given as a new array
    params = step.get_parameters() if not params else params
    params = {k: backend.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in params.items()}
    token_type = _np_dtype(inputs["input"])  # int64 from the zoo, int32 from some exports
    tokens, new, elapsed = prompt[:, 0], [], 0.0
    for p in range(last + 1):
        data = {"input": backend.from_numpy(tokens.reshape(n, 1).astype(token_type)), **state,
                **{k: backend.from_numpy(v) for k, v in _position(p, size, inputs).items()}}
        start = time.perf_counter()
        out = step.evaluate(params, data)
        logits = backend.to_numpy(out["output"])
        if p >= prompt.shape[1] - 1:
            elapsed += time.perf_counter() - start
            tokens = logits.reshape(n, -1).argmax(axis=-1).astype(np.int64)
            new.append(tokens)
        else:
            tokens = prompt[:, p + 1]
        state = {name: out[f"{name}_next"] for name in caches}
    ids = np.stack(new, axis=1) if new else np.zeros((n, 0), np.int64)
    ids = ids if batched else ids[0]
    return (ids, max_new_tokens / elapsed if elapsed else float("inf")) if return_speed else ids


def _static(value) -> tuple[int, ...]:
    dims = tuple(value.shape) if value.shape is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        raise MithrilError(f"generate: input {value.name!r} has shape {value.shape}; compile the step model with "
                           f"static shapes (shapes={{'input': (N, 1)}})")
    return dims


def _np_dtype(value) -> np.dtype:
    return np.dtype(value.dtype.numpy())


def _cache_size(inputs) -> int | None:
    if "mask" in inputs:
        return _static(inputs["mask"])[-1]
    if "write" in inputs:
        return _static(inputs["write"])[0]
    return None


def _position(p: int, size: int | None, inputs) -> dict[str, np.ndarray]:
    """The position inputs the model declares, for position ``p``."""
    feeds = {}
    if "position" in inputs:
        feeds["position"] = np.full(_static(inputs["position"]), p, _np_dtype(inputs["position"]))
    if "mask" in inputs:
        dtype = _np_dtype(inputs["mask"])
        # large and finite: a -inf row would turn into NaN wherever a backend multiplies it by 0
        hidden = -min(1e9, float(np.finfo(dtype).max) / 2)
        mask = np.where(np.arange(size) <= p, 0.0, hidden).astype(dtype)
        feeds["mask"] = mask.reshape(_static(inputs["mask"]))
    if "write" in inputs:
        shape = _static(inputs["write"])
        onehot = (np.arange(size) == p).astype(_np_dtype(inputs["write"])).reshape(size, *[1] * (len(shape) - 1))
        feeds["write"] = np.ascontiguousarray(np.broadcast_to(onehot, shape))
    return feeds
