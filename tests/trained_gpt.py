"""A tiny GPT-2 (transformers' GPT2LMHeadModel) trained for a few seconds in PyTorch, so the
generation tests compare backends on weights whose next-token predictions are confident, as a
user's trained model's are, rather than on random weights where the two largest logits differ by
a few hundredths and any rounding flips the argmax.

The corpus is learnable and needs the context: a sequence starts with a rule token ``r`` (one of
``RULES``), then a start token, then each token is ``tables[r][previous]`` (a random cycle
through the whole vocabulary, one per rule) or, with probability ``NOISE``, a uniformly random
token. The next token thus depends on the previous one and on the first token of the sequence,
which the model must attend to across the whole prefix. Everything is seeded and runs on one
PyTorch thread, so a seed always gives the same model."""

from __future__ import annotations

import contextlib

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
