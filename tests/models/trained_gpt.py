"""A tiny GPT-2 trained for a few seconds (transformers' GPT2LMHeadModel in PyTorch, or the zoo's
``create_gpt`` by Mithril's own ``fit``), so the generation tests compare backends on weights
whose next-token predictions are confident, as a user's trained model's are, rather than on
random weights where the two largest logits differ by a few hundredths and any rounding flips
the argmax.

The corpus is learnable and needs the context: a sequence starts with a rule token ``r`` (one of
``RULES``), then a start token, then each token is ``tables[r][previous]`` (a random cycle
through the whole vocabulary, one per rule) or, with probability ``NOISE``, a uniformly random
token. The next token thus depends on the previous one and on the first token of the sequence,
which the model must attend to across the whole prefix. Everything is seeded and runs on one
PyTorch thread, so a seed always gives the same model."""

from __future__ import annotations

import contextlib
import functools

import numpy as np

RULES = 2  # rule tokens 0 .. RULES - 1
NOISE = 0.05
LENGTH = 40  # training sequence length: covers a 4-token prompt and 32 new tokens (positions 0..35)


def tables(seed: int, vocab: int) -> np.ndarray:
    """[RULES, vocab]: rule r's next token after t is ``tables[r, t]``; each row is one cycle
    through every token, so following a rule never repeats a token within ``vocab`` steps."""
    rng = np.random.default_rng(seed)
    out = np.empty((RULES, vocab), np.int64)
    for r in range(RULES):
        order = rng.permutation(vocab)
        out[r, order] = np.roll(order, -1)
    return out


def corpus(table: np.ndarray, rng: np.random.Generator, count: int, length: int = LENGTH,
           noise: float = NOISE) -> np.ndarray:
    """[count, length] sequences: rule token, start token, then the rule's successors (each
    replaced by a random token with probability ``noise``)."""
    rules, vocab = table.shape
    rule = rng.integers(0, rules, count)
    seq = np.empty((count, length), np.int64)
    seq[:, 0] = rule
    seq[:, 1] = rng.integers(rules, vocab, count)
    for t in range(2, length):
        random = rng.random(count) < noise
        seq[:, t] = np.where(random, rng.integers(0, vocab, count), table[rule, seq[:, t - 1]])
    return seq


def follow(table: np.ndarray, prompt, count: int) -> np.ndarray:
    """The ``count`` tokens the prompt's rule (its first token) gives after its last token."""
    out, token = [], int(prompt[-1])
    for _ in range(count):
        token = int(table[int(prompt[0]), token])
        out.append(token)
    return np.array(out)


def prompt(table: np.ndarray, rule: int, start: int, length: int = 4) -> np.ndarray:
    """A noise-free prompt: the rule token, the start token and the rule's successors."""
    return np.concatenate([[rule, start], follow(table, [rule, start], length - 2)])


def median_gap(torch, model, sequences: np.ndarray) -> float:
    """The median over every position after the first two of the largest minus the second
    largest logit."""
    with torch.no_grad():
        top = model(torch.from_numpy(sequences)).logits[:, 2:].topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).median())


@contextlib.contextmanager
def _one_thread(torch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_gpt2(torch, transformers, *, vocab_size: int, block_size: int, dims: int, num_heads: int,
               num_layers: int, seed: int, steps: int = 160, batch: int = 16, lr: float = 1e-2):
    """GPT2LMHeadModel of these sizes (lm_head untied, GPT-2's own initialisation) trained with
    AdamW on :func:`corpus` of ``tables(seed)`` for ``steps`` steps of ``batch`` sequences,
    learning rate ``lr`` decayed linearly to zero. Returns ``(model in eval mode, table, report)``
    with the report's ``gap_before`` / ``gap_after`` (:func:`median_gap` on held-out sequences)
    and ``loss`` (the last step's)."""
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=block_size, n_embd=dims,
                                     n_layer=num_layers, n_head=num_heads, tie_word_embeddings=False,
                                     bos_token_id=None, eos_token_id=None, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    table = tables(seed, vocab_size)
    rng = np.random.default_rng(seed)
    held_out = corpus(table, np.random.default_rng(seed + 1000), 64)
    with _one_thread(torch):
        torch.manual_seed(seed)
        model = transformers.GPT2LMHeadModel(config).eval()
        before = median_gap(torch, model, held_out)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / steps)
        model.train()
        for _ in range(steps):
            x = torch.from_numpy(corpus(table, rng, batch))
            loss = model(x, labels=x).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        after = median_gap(torch, model, held_out)
    return model, table, {"gap_before": before, "gap_after": after, "loss": float(loss.detach())}


def train_zoo_gpt(ml, models_zoo, cfg: dict, init: dict, *, seed: int, steps: int = 100, batch: int = 16,
                  lr: float = 1e-2):
    """The zoo's ``create_gpt(**cfg)`` trained by Mithril itself (``ml.optimizers.fit``, Adam,
    learning rate ``lr`` decayed linearly to zero, on TorchBackend with one thread) from the
    parameters ``init`` on :func:`corpus` of ``tables(seed)``: ``steps`` steps of ``batch``
    sequences, the cross-entropy of every next token. Returns ``(params as NumPy arrays, table,
    report)``, the report as :func:`train_gpt2`'s (the gaps from the NumPy backend)."""
    import torch

    from mithril.optimizers import Adam, fit

    table = tables(seed, cfg["vocab_size"])
    rng = np.random.default_rng(seed)
    held_out = corpus(table, np.random.default_rng(seed + 1000), 64)
    pm, full = _zoo_programs(ml, models_zoo, tuple(sorted(cfg.items())), batch)
    backend = pm.backend

    def gap(params):
        top = np.sort(full.evaluate(params, {"input": held_out})["output"][:, 2:], axis=-1)[..., -2:]
        return float(np.median(top[..., 1] - top[..., 0]))

    with _one_thread(torch):
        prefix = "model_0."  # the zoo GPT's parameters inside the training model
        start = {prefix + k: backend.from_numpy(v) for k, v in init.items()}
        if set(start) != set(pm.trainable_keys):
            raise AssertionError(f"init's names {sorted(init)[:4]} do not match create_gpt's")

        def batches(epoch):
            for _ in range(steps):
                seq = corpus(table, rng, batch)
                yield {"input": backend.from_numpy(seq[:, :-1]), "target": backend.from_numpy(seq[:, 1:])}

        params, _, losses = fit(pm, start, batches, Adam(lambda step: lr * (1 - step / steps)), 1, progress=False)
    params = {k.removeprefix(prefix): backend.to_numpy(v) for k, v in params.items()}
    return params, table, {"gap_before": gap(init), "gap_after": gap(params), "loss": losses[-1]}


@functools.lru_cache(maxsize=None)
def _zoo_programs(ml, models_zoo, cfg: tuple, batch: int):
    """:func:`train_zoo_gpt`'s compiled programs, shared by its seeds: the training model
    (TorchBackend) and the inference model (NumPy) that measures the gaps."""
    from mithril.models import CrossEntropy, Mean, Model, TrainModel, Transpose

    cfg = dict(cfg)
    model = Model()
    model |= models_zoo.create_gpt(**cfg)(input="input", output="logits")
    model += Transpose(axes=(0, 2, 1))(output="output")  # CrossEntropy's classes are on axis 1
    train = TrainModel(model)
    train.add_loss(CrossEntropy(input_type="logits"), input="output", target="target", reduce_steps=[Mean()])
    shape = [batch, LENGTH - 1]
    pm = ml.compile(train, ml.TorchBackend(), shapes={"input": shape, "target": shape}, data_keys={"input", "target"})
    return pm, ml.compile(models_zoo.create_gpt(**cfg), ml.NumpyBackend(), inference=True)
