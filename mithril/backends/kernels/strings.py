"""String kernels over NumPy object arrays of Python ``str``, and ImageDecoder.

No other backend has string arrays: these kernels are ``host_only`` (registry.py), so every
backend runs them on the host with NumPy.
"""

from __future__ import annotations

import io
import re

import numpy as np

from ..registry import kernel


def _strings(x):
    return np.asarray(x, dtype=object)


@kernel("StringNormalizer", since=10, data_dependent_shape=True, host_only=True)
def string_normalizer(x, *, case_change_action, is_case_sensitive, locale, stopwords):
    # Python's str.lower/upper are locale-independent Unicode mappings; ``locale`` cannot change them.
    x = _strings(x)
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {x.shape}")
    words = list(x.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {s.casefold() for s in stopwords}
            words = [w for w in words if w.casefold() not in stop]
    if case_change_action == "LOWER":
        words = [w.lower() for w in words]
    elif case_change_action == "UPPER":
        words = [w.upper() for w in words]
    elif case_change_action not in ("NONE", None):
        raise ValueError(f"StringNormalizer case_change_action {case_change_action!r} is not LOWER/UPPER/NONE")
    if not words:
        words = [""]  # all dropped: one empty string, [1] or [1, 1]
    out = np.empty(len(words), dtype=object)
    out[:] = words
    return out if x.ndim == 1 else out.reshape(1, -1)


@kernel("StringConcat", since=20, host_only=True)
def string_concat(x, y):
    x, y = _strings(x), _strings(y)
    return np.asarray(np.add(x, y), dtype=object).reshape(np.broadcast_shapes(x.shape, y.shape))


@kernel("StringSplit", since=20, data_dependent_shape=True, host_only=True)
def string_split(x, *, delimiter, maxsplit):
    x = _strings(x)
    limit = -1 if maxsplit is None else int(maxsplit)
    if delimiter:
        # An empty string holds no substrings (ORT agrees), unlike Python's "".split(",") == [""].
        parts = [s.split(delimiter, limit) if s else [] for s in x.reshape(-1)]
    else:
        # Whitespace runs separate; leading and trailing whitespace go, also after maxsplit.
        parts = [s.strip().split(None, limit) for s in x.reshape(-1)]
    lengths = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in parts), default=0)
    substrings = np.full((len(parts), width), "", dtype=object)
    for row, p in enumerate(parts):
        substrings[row, : len(p)] = p
    return substrings.reshape(*x.shape, width), lengths


@kernel("RegexFullMatch", since=20, host_only=True)
def regex_full_match(x, *, pattern):
    # ONNX specifies RE2 syntax; Python's re agrees on the common subset (no backreferences in RE2).
    compiled = re.compile(pattern)
    x = _strings(x)
    matches = [compiled.fullmatch(s) is not None for s in x.reshape(-1)]
    return np.array(matches, dtype=bool).reshape(x.shape)


@kernel("ImageDecoder", since=20, data_dependent_shape=True, host_only=True)
def image_decoder(encoded_stream, *, pixel_format):
    from PIL import Image  # optional dependency: only models with ImageDecoder need Pillow

    try:
        image = Image.open(io.BytesIO(np.asarray(encoded_stream, dtype=np.uint8).tobytes()))
        image.load()
    except Exception:  # the spec asks for an empty result on any decoding failure
        return np.zeros((0, 0, 0), dtype=np.uint8)
    if pixel_format == "Grayscale":
        return np.asarray(image.convert("L"), dtype=np.uint8)[:, :, None]
    rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    if pixel_format == "BGR":
        return np.ascontiguousarray(rgb[:, :, ::-1])
    if pixel_format != "RGB":
        raise ValueError(f"ImageDecoder pixel_format {pixel_format!r} is not RGB/BGR/Grayscale")
    return rgb
