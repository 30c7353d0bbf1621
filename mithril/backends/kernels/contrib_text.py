"""com.microsoft text kernels: Tokenizer (skl2onnx writes it for TfidfVectorizer's word split).

Host-side over NumPy object arrays of Python ``str``, like the ai.onnx string kernels (strings.py):
no backend has string arrays. Lengths are counted in characters (code points), as onnxruntime
counts UTF-8 characters.
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np

from ..registry import kernel

MS = "com.microsoft"
_START_TEXT, _END_TEXT = "\x02", "\x03"


def _separator_split(text: str, separators, mincharnum: int) -> list[str]:
    """Each separator in turn splits every piece left by the ones before; pieces shorter than
    mincharnum (the empty ones included) are dropped."""
    pieces = [text]
    for sep in separators:
        out = []
        for piece in pieces:
            start = 0
            while start <= len(piece):
                m = sep.search(piece, start)
                if m is None:
                    break
                if m.start() - start >= mincharnum:
                    out.append(piece[start : m.start()])
                # An empty match consumes one character, as onnxruntime steps past it.
                start = m.end() if m.end() > m.start() else m.start() + 1
            if len(piece) - start >= mincharnum:
                out.append(piece[start:])
        pieces = out
    return pieces


def _token_matches(text: str, tokenexp, mincharnum: int) -> list[str]:
    """The matches of tokenexp, left to right; a match shorter than mincharnum is skipped and the
    search resumes one character after where it began."""
    tokens = []
    start = 0
    while start <= len(text):
        m = tokenexp.search(text, start)
        if m is None:
            break
        if m.end() - m.start() >= mincharnum:
            tokens.append(m.group(0))
            start = m.end()
        else:
            start = m.start() + 1
    return tokens


@kernel("Tokenizer", since=1, domain=MS, data_dependent_shape=True, host_only=True)
def tokenizer(x, *, mark, mincharnum, pad_value, separators=None, tokenexp=None, tokenexpsplit=0):
    """[C] -> [C, D] and [N, C] -> [N, C, D]: the tokens of every string, padded with pad_value to
    the most any string has (D), inside 0x02/0x03 marks when ``mark``.

    Regular expressions are RE2 for onnxruntime (leftmost-longest) and Python's ``re`` here
    (leftmost-first): they agree on the patterns converters write (character classes with
    greedy quantifiers, word boundaries), not on alternations whose branches are prefixes of one
    another. ``tokenexpsplit=1`` (an mlprodict extension onnxruntime does not register) makes
    tokenexp a separator: the tokens are the text between its matches.
    """
    x = np.asarray(x, dtype=object)
    if x.ndim not in (1, 2):
        raise ValueError(f"Tokenizer takes a [C] or [N, C] string tensor, got shape {x.shape}")
    if mincharnum < 1:
        raise ValueError(f"Tokenizer mincharnum must be positive, got {mincharnum}")
    if separators is not None:
        if not separators:
            raise ValueError("Tokenizer separators must not be empty")
        by_char = tuple(separators) == ("",)
    elif tokenexp:
        by_char = tokenexp == "."
    else:
        raise ValueError("Tokenizer needs one of separators or tokenexp")
    if by_char and mincharnum >= 2:
        raise ValueError(f"Tokenizer mincharnum={mincharnum} is too big for character tokenization")
    # RE2's \w, \d, \s and \b are ASCII-only; Python's are Unicode unless told otherwise.
    if by_char:
        split = list
    elif separators is not None or tokenexpsplit:
        compiled = [re.compile(s, re.ASCII) for s in (separators if separators is not None else (tokenexp,))]
        split = partial(_separator_split, separators=compiled, mincharnum=mincharnum)
    else:
        compiled = re.compile(tokenexp, re.ASCII)
        split = partial(_token_matches, tokenexp=compiled, mincharnum=mincharnum)
    if x.size == 0:
        # [0] -> [0], [N, 0] -> [N, 0] (and [0, C] -> [0, 0]): no string, so no token axis either.
        return np.empty(x.shape[:-1] + (0,), dtype=object)

    rows = [split(str(s)) for s in x.reshape(-1)]
    width = max(len(r) for r in rows)
    if width == 0:
        # Nothing left of any string: an empty token axis, and no marks.
        return np.empty((*x.shape, 0), dtype=object)
    out = np.full((len(rows), width + 2 * bool(mark)), pad_value, dtype=object)
    for i, row in enumerate(rows):
        if mark:
            # Padding goes after the end mark, outside the marked tokens.
            row = [_START_TEXT, *row, _END_TEXT]
        out[i, : len(row)] = row
    return out.reshape(*x.shape, out.shape[1])
