"""Text feature kernels: TfIdfVectorizer (n-gram counts over an int or string token pool)."""

from __future__ import annotations

import numpy as np

from ..registry import kernel


def _pool_grams(pool, ngram_counts, xp):
    """Splits the pool into per-length gram tables: {n: (first gram index, [G_n, n] array)}.

    ngram_counts[n-1] is where the n-grams start in the pool; they run to the next length's start."""
    tables = {}
    first = 0
    for n, start in enumerate(ngram_counts, start=1):
        end = ngram_counts[n] if n < len(ngram_counts) else len(pool)
        count = (end - start) // n
        if count:
            tables[n] = (first, xp.reshape(pool[start : start + count * n], (count, n)))
        first += count
    return tables, first


def _gram_counts(x, grams, n, max_skip_count, xp):
    """How often each [n]-token gram occurs in every row of x ([N, C]), over all skips: [N, G]."""
    length = x.shape[-1]
    total = xp.zeros((x.shape[0], grams.shape[0]), dtype=xp.float32)
    # A unigram is the same token whatever the skip: count it once.
    for skip in range(max_skip_count + 1 if n > 1 else 1):
        stride = skip + 1
        positions = length - (n - 1) * stride
        if positions <= 0:
            break
        idx = xp.arange(positions)[:, None] + xp.arange(n)[None, :] * stride
        windows = x[:, idx]  # [N, P, n]
        hits = xp.all(windows[:, :, None, :] == grams[None, None, :, :], axis=-1)  # [N, P, G]
        total = total + xp.sum(hits, axis=1).astype(xp.float32)
    return total


@kernel("TfIdfVectorizer", since=9)
def tfidf_vectorizer(
    X,
    *,
    mode,
    min_gram_length,
    max_gram_length,
    max_skip_count,
    ngram_counts,
    ngram_indexes,
    pool_int64s=None,
    pool_strings=None,
    weights=None,
    xp,
):
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer mode {mode!r} is not TF/IDF/TFIDF")
    if pool_strings:
        # numpy-only: string tokens live in object arrays.
        pool = np.asarray(pool_strings, dtype=object)
        xp = np
    else:
        pool = xp.asarray(pool_int64s or (), dtype=xp.int64)
    tables, num_grams = _pool_grams(pool, tuple(ngram_counts or ()), xp)
    if len(ngram_indexes) != num_grams:
        raise ValueError(f"TfIdfVectorizer: {len(ngram_indexes)} ngram_indexes for {num_grams} pool n-grams")
    rows = X if X.ndim == 2 else xp.reshape(X, (1, -1))
    parts = []
    for n in range(1, len(ngram_counts or ()) + 1):
        if n not in tables:
            continue
        first, grams = tables[n]
        if min_gram_length <= n <= max_gram_length:
            parts.append(_gram_counts(rows, grams, n, max_skip_count, xp))
        else:
            parts.append(xp.zeros((rows.shape[0], grams.shape[0]), dtype=xp.float32))
    counts = xp.concatenate(parts, axis=1) if parts else xp.zeros((rows.shape[0], 0), dtype=xp.float32)
    if mode == "IDF":
        counts = xp.minimum(counts, 1)
    if mode != "TF" and weights:
        counts = counts * xp.asarray(weights, dtype=xp.float32)
    # Gram i lands at output column ngram_indexes[i]: a one-hot matmul instead of a scatter.
    width = max(ngram_indexes) + 1 if num_grams else 0
    placement = (xp.asarray(ngram_indexes)[:, None] == xp.arange(width)[None, :]).astype(xp.float32)
    y = counts @ placement
    return y if X.ndim == 2 else xp.reshape(y, (width,))
