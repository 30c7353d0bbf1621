"""The ai.onnx.ml operator set, with onnxruntime's semantics where the spec leaves room.

Numeric work runs over ``xp``. String and map work (labels, vocabularies, ZipMap's dicts) has no
array type outside NumPy, so it runs on the host with NumPy, as in strings.py: the label, category
and map kernels are ``host_only`` (registry.py); a string step inside a numeric kernel converts
its operand with ``np.asarray`` and returns a NumPy object array.

Tree ensembles are flattened once per attribute set into node arrays (feature, threshold, mode,
true and false child) and evaluated level by level: every sample walks every tree at once, one
gather per level, for as many levels as the deepest tree has.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..registry import kernel

ML = "ai.onnx.ml"

# -- helpers ------------------------------------------------------------------------------------


def _strings(x):
    return np.asarray(x, dtype=object)


def _is_strings(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def _rows(x, xp):
    """The input as [N, F]: onnxruntime reads a 1-D input as one row."""
    if x.ndim == 1:
        return xp.reshape(x, (1, -1))
    if x.ndim > 2:
        return xp.reshape(x, (x.shape[0], -1))
    return x


def _as_float32(x, xp):
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _host(x) -> np.ndarray:
    return np.asarray(x)


class _Cache:
    """Structures built from a node's attributes, once per node: the generated program passes the
    same constant objects on every call, so the identities of the arguments name the node (equal
    constants the compiler merged into one object build equal structures)."""

    def __init__(self):
        self._entries: dict = {}

    def get(self, build, *args):
        key = (build, *(a if isinstance(a, (int, float, str, type(None))) else id(a) for a in args))
        hit = self._entries.get(key)
        if hit is not None and all(a is b or isinstance(a, (int, float, str)) for a, b in zip(hit[0], args)):
            return hit[1]
        value = build(*args)
        if len(self._entries) > 256:
            self._entries.clear()
        self._entries[key] = (args, value)
        return value


_CACHE = _Cache()


# -- post transforms (onnxruntime's ml_common.h) --------------------------------------------------


def _logistic(s, xp):
    return 1 / (1 + xp.exp(-s))


def _probit(s, xp):
    # onnxruntime's closed-form approximation of erfinv (Winitzki, a = 0.147), not the exact inverse.
    v = 2 * s - 1
    t = (1 - v) * (1 + v)
    lg = xp.log(t)
    a = 2 / (3.14159 * 0.147) + 0.5 * lg
    return 1.41421356 * xp.sign(v) * xp.sqrt(-a + xp.sqrt(a * a - lg / 0.147))


def _softmax(s, xp):
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def _softmax_zero(s, xp):
    # Scores that are exactly zero stay (almost) zero and do not count in the sum.
    m = xp.max(s, axis=-1, keepdims=True)
    nonzero = xp.abs(s) > 1e-7
    e = xp.where(nonzero, xp.exp(s - m), s * xp.exp(-m))
    return e / xp.sum(xp.where(nonzero, e, 0 * e), axis=-1, keepdims=True)


def _transform(scores, post_transform, xp):
    """``post_transform`` over [N, K] scores; with one score per row only PROBIT applies."""
    if post_transform in (None, "NONE"):
        return scores
    if post_transform == "PROBIT":
        return _probit(scores, xp)
    if scores.shape[-1] < 2:
        return scores
    if post_transform == "LOGISTIC":
        return _logistic(scores, xp)
    if post_transform == "SOFTMAX":
        return _softmax(scores, xp)
    if post_transform == "SOFTMAX_ZERO":
        return _softmax_zero(scores, xp)
    raise ValueError(f"unknown post_transform {post_transform!r}")


def _second_class(s, post_transform, mixed: bool, xp):
    """A binary classifier's one score [N] as two columns, the way onnxruntime writes them: with
    mixed-sign weights [-s, s] (LOGISTIC: [logistic(-s), logistic(s)]); otherwise [1 - p, p] with
    p = logistic(s) under LOGISTIC and s else, or [probit(s), s] under PROBIT."""
    if mixed:
        if post_transform == "LOGISTIC":
            return xp.stack([_logistic(-s, xp), _logistic(s, xp)], axis=1)
        return xp.stack([-s, s], axis=1)
    if post_transform == "PROBIT":
        return xp.stack([_probit(s, xp), s], axis=1)
    p = _logistic(s, xp) if post_transform == "LOGISTIC" else s
    return xp.stack([1 - p, p], axis=1)


def _labels(index, labels, xp):
    """Class labels at ``index``: int64 over xp, strings on the host."""
    if isinstance(labels[0], str):
        return _strings(labels)[_host(index).astype(np.int64)]
    return xp.take(xp.asarray(np.asarray(labels, dtype=np.int64)), index)


# -- simple transforms ------------------------------------------------------------------------------


@kernel("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(x, y, *, xp):
    if isinstance(x, np.ndarray) and x.dtype.kind in "OSU":  # a string initializer may hold bytes (|S)
        out = np.take(x, _host(y).astype(np.int64).reshape(-1), axis=-1)
        return out.reshape(1, -1) if x.ndim == 1 else out
    # The indices stay backend arrays: skl2onnx's classifiers feed ArgMax/TopK outputs here, which
    # a jitted program holds as traced values (a NumPy copy would force the graph off the jit).
    out = xp.take(x, xp.reshape(y, (-1,)), axis=-1)
    return xp.reshape(out, (1, -1)) if x.ndim == 1 else out


@kernel("Binarizer", since=1, domain=ML)
def binarizer(x, *, threshold, xp):
    return xp.where(x > threshold, xp.ones_like(x), xp.zeros_like(x))


@kernel("Scaler", since=1, domain=ML)
def scaler(x, *, offset=None, scale=None, xp):
    x = _as_float32(x, xp)
    if offset:
        x = x - xp.asarray(np.asarray(offset, dtype=np.float32))
    if scale:
        x = x * xp.asarray(np.asarray(scale, dtype=np.float32))
    return x


@kernel("Normalizer", since=1, domain=ML)
def normalizer(x, *, norm, xp):
    x = _as_float32(_rows(x, xp), xp)
    if norm == "MAX":
        n = xp.max(x, axis=1, keepdims=True)
    elif norm == "L1":
        n = xp.sum(xp.abs(x), axis=1, keepdims=True)
    elif norm == "L2":
        n = xp.sqrt(xp.sum(x * x, axis=1, keepdims=True))
    else:
        raise ValueError(f"Normalizer norm {norm!r} is not MAX/L1/L2")
    return x / xp.where(n == 0, xp.ones_like(n), n)  # onnxruntime leaves a row whose norm is 0 as it is


@kernel("Imputer", since=1, domain=ML)
def imputer(x, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float,
            replaced_value_int64, xp):
    if np.issubdtype(x.dtype, np.floating):
        values = np.asarray(imputed_value_floats, dtype=x.dtype)
        missing = xp.isnan(x) if math.isnan(replaced_value_float) else x == replaced_value_float
    else:
        values = np.asarray(imputed_value_int64s, dtype=x.dtype)
        missing = x == replaced_value_int64
    fill = xp.asarray(values) if values.size > 1 else xp.asarray(values.reshape(()))
    return xp.where(missing, xp.broadcast_to(fill, x.shape), x)


@kernel("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(*inputs, inputdimensions=None, xp):
    n = inputs[0].shape[0] if inputs[0].ndim > 1 else 1
    parts = []
    for i, x in enumerate(inputs):
        x = _as_float32(xp.reshape(x, (n, -1)), xp)
        want = int(inputdimensions[i]) if inputdimensions else x.shape[1]
        if x.shape[1] >= want:
            parts.append(x[:, :want])
        else:  # too few columns: zero-padded up to inputdimensions
            parts.append(xp.concatenate([x, xp.zeros((n, want - x.shape[1]), dtype=np.float32)], axis=1))
    return xp.concatenate(parts, axis=1)


@kernel("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(x, *, cats_int64s=None, cats_strings=None, zeros, xp):
    if cats_strings:
        xs = _strings(x)
        cats = {c: i for i, c in enumerate(cats_strings)}
        index = np.array([cats.get(s, -1) for s in xs.reshape(-1)], dtype=np.int64).reshape(xs.shape)
        if not zeros and (index < 0).any():
            raise ValueError("OneHotEncoder: a category is not in cats_strings and zeros=0")
        return xp.asarray((index[..., None] == np.arange(len(cats_strings))).astype(np.float32))
    cats = xp.asarray(np.asarray(cats_int64s, dtype=np.int64))
    # onnxruntime truncates floating inputs to int64 before the lookup
    hot = (x.astype(np.int64) if np.issubdtype(x.dtype, np.floating) else x)[..., None] == cats
    if not zeros and not bool(_host(xp.all(xp.any(hot, axis=-1)))):
        raise ValueError("OneHotEncoder: a category is not in cats_int64s and zeros=0")
    return hot.astype(np.float32)


# -- label and category maps (strings on the host) ----------------------------------------------


def _lookup(x, keys: np.ndarray, values: np.ndarray, default, xp):
    """values[i] where x == keys[i], else default; NaN keys match NaN inputs."""
    if _is_strings(x) or keys.dtype == object or values.dtype == object:
        table = {}
        for k, v in zip(keys.tolist(), values.tolist()):
            table.setdefault(k, v)  # the first of repeated keys wins
        xs = _host(x)
        nan_value = next((v for k, v in table.items() if isinstance(k, float) and math.isnan(k)), default)
        flat = [table.get(k, default) if not (isinstance(k, float) and math.isnan(k)) else nan_value
                for k in xs.reshape(-1).tolist()]
        out = np.empty(len(flat), dtype=values.dtype)
        out[:] = flat
        out = out.reshape(xs.shape)
        return out if values.dtype == object else xp.asarray(out)
    kx = xp.asarray(keys.astype(x.dtype) if keys.dtype != x.dtype else keys)
    eq = x[..., None] == kx
    if np.issubdtype(keys.dtype, np.floating) and np.isnan(keys).any():
        eq = eq | (xp.isnan(x)[..., None] & xp.isnan(kx))
    found = xp.any(eq, axis=-1)
    first = xp.argmax(eq.astype(np.int32), axis=-1)  # torch has no argmax over bool
    picked = xp.take(xp.asarray(values), first)
    return xp.where(found, picked, xp.asarray(np.asarray(default, dtype=values.dtype)))


def _attr_array(tensor, strings, ints, floats):
    if tensor is not None:
        arr = np.asarray(tensor)
        if arr.dtype.kind in "OSU":  # string tensors may hold bytes
            flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1).tolist()]
            arr = np.empty(len(flat), dtype=object)
            arr[:] = flat
        return arr
    if strings:
        return np.asarray(list(strings), dtype=object)
    if ints:
        return np.asarray(ints, dtype=np.int64)
    if floats:
        return np.asarray(floats, dtype=np.float32)
    return None


@kernel("LabelEncoder", since=1, domain=ML, host_only=True)
def label_encoder_1(x, *, classes_strings=None, default_int64, default_string, xp):
    classes = np.asarray(list(classes_strings or ()), dtype=object)
    if _is_strings(x):
        return _lookup(x, classes, np.arange(len(classes), dtype=np.int64), default_int64, xp)
    index = _host(x).astype(np.int64)
    ok = (index >= 0) & (index < len(classes))
    out = np.full(index.shape, default_string, dtype=object)
    out[ok] = classes[index[ok]]
    return out


@kernel("LabelEncoder", since=2, domain=ML, host_only=True)
def label_encoder(x, *, keys_strings=None, keys_int64s=None, keys_floats=None, keys_tensor=None,
                  values_strings=None, values_int64s=None, values_floats=None, values_tensor=None,
                  default_float, default_int64, default_string, default_tensor=None, xp):
    keys = _attr_array(keys_tensor, keys_strings, keys_int64s, keys_floats)
    values = _attr_array(values_tensor, values_strings, values_int64s, values_floats)
    if keys is None or values is None:
        raise ValueError("LabelEncoder needs keys_* and values_* attributes")
    if default_tensor is not None:
        default = _attr_array(default_tensor, None, None, None).reshape(-1)[0]
        default = default.item() if values.dtype != object else default
    elif values.dtype == object:
        default = default_string
    elif np.issubdtype(values.dtype, np.floating):
        default = default_float
    else:
        default = default_int64
    if keys.dtype.kind == "U":
        keys = keys.astype(object)
    if values.dtype.kind == "U":
        values = values.astype(object)
    return _lookup(x, keys, values, default, xp)


@kernel("CategoryMapper", since=1, domain=ML, host_only=True)
def category_mapper(x, *, cats_int64s, cats_strings, default_int64, default_string, xp):
    ints = np.asarray(cats_int64s, dtype=np.int64)
    strs = np.asarray(list(cats_strings), dtype=object)
    if _is_strings(x):
        return _lookup(x, strs, ints, default_int64, xp)
    return _lookup(_host(x), ints.astype(object), strs, default_string, xp)


# -- maps ----------------------------------------------------------------------------------------


# Map inputs are Python dicts, which no jit traces: data_dependent_shape keeps these graphs eager.
@kernel("DictVectorizer", since=1, domain=ML, data_dependent_shape=True, host_only=True)
def dict_vectorizer(x, *, int64_vocabulary=None, string_vocabulary=None, node, xp):
    vocab = list(string_vocabulary) if string_vocabulary else list(int64_vocabulary)
    position = {k: i for i, k in enumerate(vocab)}
    maps = x if isinstance(x, (list, tuple)) else [x]
    values = [v for m in maps for v in m.values()]
    dtype = node.output_dtypes[0] if node.output_dtypes and node.output_dtypes[0] is not None else None
    if dtype is None:
        dtype = object if values and isinstance(values[0], str) else np.float32
    out = np.zeros((len(maps), len(vocab)), dtype=dtype)
    if dtype == object:
        out[:] = ""
    for row, m in enumerate(maps):
        for k, v in m.items():
            i = position.get(k)
            if i is not None:
                out[row, i] = v
    return out if dtype == object else xp.asarray(out)


@kernel("CastMap", since=1, domain=ML, data_dependent_shape=True, host_only=True)
def cast_map(x, *, cast_to, map_form, max_map, xp):
    to = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}[cast_to]

    def cast(v):  # onnxruntime's conversions: std::to_string, std::stof, std::stoll, truncation
        if to is object:
            return v if isinstance(v, str) else f"{float(np.float32(v)):f}"
        if isinstance(v, str):
            if to is np.float32:
                return np.float32(float(re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v).group(0)))
            return np.int64(int(re.match(r"\s*[-+]?\d+", v).group(0)))
        return np.float32(v) if to is np.float32 else np.int64(int(np.float32(v)))

    keys = sorted(x)
    if map_form == "DENSE":
        out = np.empty((1, len(keys)), dtype=to)
        for i, k in enumerate(keys):
            out[0, i] = cast(x[k])
    else:  # SPARSE: keys are column indices below max_map, the rest hold the pad value
        if keys and keys[0] < 0:
            raise ValueError(f"CastMap: negative key {keys[0]} in a SPARSE map")
        out = np.full((1, max_map), "0.f" if to is object else 0, dtype=to)
        for k in keys:
            if k < max_map:
                out[0, k] = cast(x[k])
    return out if to is object else xp.asarray(out)


@kernel("ZipMap", since=1, domain=ML, data_dependent_shape=True, host_only=True)
def zip_map(x, *, classlabels_int64s=None, classlabels_strings=None):
    # A sequence of maps has no array form on any backend: a Python list of dicts, as
    # onnxruntime's Python API returns it (data_dependent_shape keeps the graph off jit).
    labels = list(classlabels_strings) if classlabels_strings else [int(c) for c in classlabels_int64s]
    probs = _host(x).reshape(-1, len(labels))
    return [dict(zip(labels, row)) for row in probs.astype(np.float32).tolist()]


# -- linear models ---------------------------------------------------------------------------------


def _weights(coefficients, rows: int, x, what: str) -> np.ndarray:
    """[rows, features of x]: onnxruntime reads the coefficients row-major at the input's width, so
    a file declaring more of them than that uses the leading ones (onnxruntime's own logreg_iris)."""
    coef = np.asarray(coefficients, dtype=np.float32).reshape(-1)
    need = rows * int(x.shape[1])
    if coef.size < need:
        raise ValueError(f"{what}: {coef.size} coefficients for {rows} rows of {x.shape[1]} input features")
    return coef[:need].reshape(rows, -1)


@kernel("LinearRegressor", since=1, domain=ML)
def linear_regressor(x, *, coefficients=None, intercepts=None, targets=1, post_transform, xp):
    x = _as_float32(_rows(x, xp), xp)
    w = _weights(coefficients, targets, x, "LinearRegressor")
    y = xp.matmul(x, xp.asarray(np.ascontiguousarray(w.T)))
    if intercepts:
        y = y + xp.asarray(np.asarray(intercepts, dtype=np.float32))
    return _transform(y, post_transform, xp)


@kernel("LinearClassifier", since=1, domain=ML)
def linear_classifier(x, *, coefficients, intercepts=None, classlabels_ints=None, classlabels_strings=None,
                      multi_class, post_transform, xp):
    labels = list(classlabels_strings) if classlabels_strings else list(classlabels_ints or ())
    n_classes = len(intercepts) if intercepts else len(labels)
    x = _as_float32(_rows(x, xp), xp)
    w = _weights(coefficients, n_classes, x, "LinearClassifier")
    s = xp.matmul(x, xp.asarray(np.ascontiguousarray(w.T)))
    if intercepts:
        s = s + xp.asarray(np.asarray(intercepts, dtype=np.float32))
    if n_classes == 1:
        positive = s[:, 0] > 0
        if len(labels) == 2:
            label = _labels(positive.astype(np.int64), labels, xp)
            return label, _second_class(s[:, 0], post_transform, False, xp)
        pair = ["0", "1"] if classlabels_strings else [0, 1]
        return _labels(positive.astype(np.int64), pair, xp), _transform(s, post_transform, xp)
    return _labels(xp.argmax(s, axis=1), labels, xp), _transform(s, post_transform, xp)


# -- support vector machines -------------------------------------------------------------------------


def _svm_kernel(x, sv, kernel_type, params, xp):
    """[N, V] kernel values between the rows of x and the support vectors."""
    gamma, coef0, degree = (list(params) + [0.0, 0.0, 0.0])[:3] if params else (0.0, 0.0, 0.0)
    svx = xp.asarray(sv)
    if kernel_type == "RBF":
        d = x[:, None, :] - svx[None, :, :]
        return xp.exp(-gamma * xp.sum(d * d, axis=-1))
    dot = xp.matmul(x, xp.asarray(np.ascontiguousarray(sv.T)))
    if kernel_type == "LINEAR":
        return dot
    if kernel_type == "POLY":
        return (gamma * dot + coef0) ** int(degree)
    if kernel_type == "SIGMOID":
        return xp.tanh(gamma * dot + coef0)
    raise ValueError(f"unknown SVM kernel_type {kernel_type!r}")


def _converged(done) -> bool:
    """True when every row has converged, on a concrete array; False while a jit traces."""
    try:
        return bool(_host(done).all())
    except Exception:  # a tracer (jax.jit, mx.compile): keep iterating, masked
        return False


def python_loop(step, state, count: int):
    """Run ``state, done = step(state)`` up to ``count`` times, stopping once every row is done.
    A backend with a loop primitive passes its own (JAX: lax.while_loop, backends/jax/overrides.py)."""
    for _ in range(count):
        state, done = step(state)
        if _converged(done):
            break
    return state


def _multiclass_probability(r, k: int, xp, loop=python_loop):
    """Pairwise probabilities r[i][j] ([N] arrays) to class probabilities [N, k] (Wu, Lin and Weng's
    second method, libsvm's and onnxruntime's iteration: at most 100 sweeps, a row stops once its
    error is below 0.005/k; rows that stopped are held while the others go on)."""
    q = [[None] * k for _ in range(k)]
    for t in range(k):
        diag = 0
        for j in range(k):
            if j != t:
                diag = diag + r[j][t] * r[j][t]
        q[t][t] = diag
        for j in range(k):
            if j != t:
                q[t][j] = -r[j][t] * r[t][j]
    n = r[0][1].shape[0]
    eps = 0.005 / k

    def sweep(state):
        p, done = state
        qp = [sum(q[t][j] * p[j] for j in range(k)) for t in range(k)]
        pqp = sum(p[t] * qp[t] for t in range(k))
        err = xp.max(xp.stack([xp.abs(qp[t] - pqp) for t in range(k)], axis=1), axis=1)
        done = done | (err < eps)
        for t in range(k):
            diff = (-qp[t] + pqp) / q[t][t]
            pqp_new = (pqp + diff * (diff * q[t][t] + 2 * qp[t])) / (1 + diff) / (1 + diff)
            p_new = [((p[j] + diff) if j == t else p[j]) / (1 + diff) for j in range(k)]
            qp_new = [(qp[j] + diff * q[t][j]) / (1 + diff) for j in range(k)]
            p = [xp.where(done, p[j], p_new[j]) for j in range(k)]
            qp = [xp.where(done, qp[j], qp_new[j]) for j in range(k)]
            pqp = xp.where(done, pqp, pqp_new)
        return (p, done), done

    p0 = [xp.full((n,), 1.0 / k, dtype=np.float32) for _ in range(k)]
    p, _ = loop(sweep, (p0, xp.zeros((n,), dtype=bool)), 100)
    return xp.stack(p, axis=1)


@kernel("SVMClassifier", since=1, domain=ML)
def svm_classifier(x, *, classlabels_ints=None, classlabels_strings=None, coefficients, kernel_params=None,
                   kernel_type, post_transform, prob_a=None, prob_b=None, rho, support_vectors=None,
                   vectors_per_class=None, xp, loop=python_loop):
    labels = list(classlabels_strings) if classlabels_strings else list(classlabels_ints or ())
    k = len(labels) or 1
    x = _as_float32(_rows(x, xp), xp)
    coef = np.asarray(coefficients, dtype=np.float32)
    have_proba = bool(prob_a)
    all_positive = bool((coef >= 0).all())
    if vectors_per_class:  # SVC: one-vs-one classifiers over the support vectors
        sv = np.asarray(support_vectors, dtype=np.float32).reshape(int(sum(vectors_per_class)), -1)
        kern = _svm_kernel(x, sv, kernel_type, kernel_params, xp)
        coef = coef.reshape(k - 1, -1)
        starts = np.concatenate([[0], np.cumsum(vectors_per_class)]).astype(int)
        pair_scores, votes = [], [0] * k
        idx = 0
        for i in range(k - 1):
            for j in range(i + 1, k):
                si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
                s = (xp.matmul(kern[:, si], xp.asarray(coef[j - 1, si])) +
                     xp.matmul(kern[:, sj], xp.asarray(coef[i, sj])) + float(rho[idx]))
                idx += 1
                pair_scores.append(s)
                win = (s > 0).astype(np.int64)
                votes[i] = votes[i] + win
                votes[j] = votes[j] + (1 - win)
        maxclass = xp.argmax(xp.stack(votes, axis=1), axis=1)
        label = _labels(maxclass, labels, xp)
        if have_proba:
            r = [[None] * k for _ in range(k)]
            idx = 0
            for i in range(k - 1):
                for j in range(i + 1, k):
                    p = 1 - _logistic(pair_scores[idx] * float(prob_a[idx]) + float(prob_b[idx]), xp)
                    p = xp.clip(p, 1e-7, 1 - 1e-7)
                    r[i][j], r[j][i] = p, 1 - p
                    idx += 1
            scores = _multiclass_probability(r, k, xp, loop)
            return label, _transform(scores, post_transform, xp)
        scores = xp.stack(pair_scores, axis=1)
        if k <= 2:
            return label, _second_class(pair_scores[0], post_transform, post_transform == "NONE", xp)
        return label, _transform(scores, post_transform, xp)
    # Linear SVM: one score per class.
    w = coef.reshape(k, -1)
    scores = xp.matmul(x, xp.asarray(np.ascontiguousarray(w.T))) + float(rho[0])
    maxclass = xp.argmax(scores, axis=1)
    if k == 2 and not have_proba:
        top = xp.max(scores, axis=1)
        positive = (top >= 0.5) if all_positive else (top > 0)
        maxclass = xp.where(positive, xp.ones_like(maxclass), maxclass)
    return _labels(maxclass, labels, xp), _transform(scores, post_transform, xp)


@kernel("SVMRegressor", since=1, domain=ML)
def svm_regressor(x, *, coefficients, kernel_params=None, kernel_type, n_supports, one_class, post_transform,
                  rho, support_vectors=None, xp):
    x = _as_float32(_rows(x, xp), xp)
    coef = np.asarray(coefficients, dtype=np.float32)
    if n_supports > 0:
        sv = np.asarray(support_vectors, dtype=np.float32).reshape(n_supports, -1)
        s = xp.matmul(_svm_kernel(x, sv, kernel_type, kernel_params, xp), xp.asarray(coef))
    else:
        s = xp.matmul(x, xp.asarray(coef))
    s = (s + float(rho[0]))[:, None]
    if one_class:
        s = xp.where(s > 0, xp.ones_like(s), -xp.ones_like(s))
    return s  # onnxruntime applies no post_transform to an SVM regression (PROBIT included)


# -- tree ensembles ---------------------------------------------------------------------------------

_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5,
          "LEAF": 7}
_MEMBER, _LEAF = 6, 7


@dataclass
class _Forest:
    """Every node of every tree in flat arrays (leaves point at themselves)."""

    feature: np.ndarray  # int64 [G]
    value: np.ndarray  # float64 [G] thresholds
    mode: np.ndarray  # int64 [G]
    true: np.ndarray  # int64 [G]
    false: np.ndarray  # int64 [G]
    missing_true: np.ndarray | None  # bool [G], None when no node tracks missing values
    members: np.ndarray | None  # float64 [G, M] set members (NaN padded) of MEMBER nodes
    roots: np.ndarray  # int64 [T]
    depth: int
    weights: np.ndarray  # float64 [G, K]
    has_weight: np.ndarray  # bool [G, K]
    double: bool  # thresholds and weights given as double tensors
    # Each tree's one target when every tree scores a single target (gradient boosting writes a
    # tree per class): sums are then a [N, T] x [T, K] product instead of a [N, T, K] gather.
    tree_target: np.ndarray | None = None

    def __post_init__(self):
        self.tree_target = _single_target_trees(self)


def _single_target_trees(f: "_Forest") -> np.ndarray | None:
    if (f.has_weight.sum(axis=1) > 1).any():
        return None
    node_target = np.where(f.has_weight.any(axis=1), f.has_weight.argmax(axis=1), -1)
    tree_target = np.full(len(f.roots), -1, dtype=np.int64)
    level, tree = f.roots, np.arange(len(f.roots))
    for _ in range(f.depth + 1):
        scored = node_target[level] >= 0
        tree_target[tree[scored]] = node_target[level][scored]
        if (tree_target[tree[scored]] != node_target[level][scored]).any():
            return None  # a tree scoring two targets
        inner = f.mode[level] != _LEAF
        level = np.concatenate([f.true[level[inner]], f.false[level[inner]]])
        tree = np.concatenate([tree[inner], tree[inner]])
    return np.maximum(tree_target, 0)


def _depth(roots, true, false, leaf) -> int:
    level, depth = np.unique(roots), 0
    while True:
        inner = level[~leaf[level]]
        if inner.size == 0:
            return depth
        level = np.unique(np.concatenate([true[inner], false[inner]]))
        depth += 1
        if depth > len(true):
            raise ValueError("tree ensemble: the trees hold a cycle")


def _forest_v3(tree_ids, node_ids, feature_ids, modes, values, true_ids, false_ids, missing, w_tree_ids,
               w_node_ids, w_target_ids, w_weights, n_targets, double) -> _Forest:
    tree_ids = np.asarray(tree_ids, dtype=np.int64)
    node_ids = np.asarray(node_ids, dtype=np.int64)
    g = len(tree_ids)
    index = {(t, n): i for i, (t, n) in enumerate(zip(tree_ids.tolist(), node_ids.tolist()))}
    mode = np.array([_MODES[m] for m in modes], dtype=np.int64)
    leaf = mode == _LEAF
    own = np.arange(g, dtype=np.int64)
    trees = tree_ids.tolist()

    def children(ids):  # child node ids are per tree; a leaf points at itself
        ids = np.asarray(ids, dtype=np.int64).tolist()
        return np.array([i if leaf[i] else index[(t, c)] for i, (t, c) in enumerate(zip(trees, ids))], dtype=np.int64)

    true, false = children(true_ids), children(false_ids)
    # Roots: the nodes no branch points to, one per tree in a well-formed ensemble.
    referenced = np.zeros(g, dtype=bool)
    referenced[true[~leaf]] = True
    referenced[false[~leaf]] = True
    roots = own[~referenced]
    mt = np.asarray(missing, dtype=bool) if missing is not None and len(missing) else None
    if mt is not None and not mt.any():
        mt = None
    weights = np.zeros((g, n_targets), dtype=np.float64)
    has = np.zeros((g, n_targets), dtype=bool)
    rows = np.array([index[(t, n)] for t, n in zip(np.asarray(w_tree_ids).tolist(), np.asarray(w_node_ids).tolist())],
                    dtype=np.int64)
    cols = np.asarray(w_target_ids, dtype=np.int64)
    np.add.at(weights, (rows, cols), np.asarray(w_weights, dtype=np.float64))
    has[rows, cols] = True
    if n_targets == 1:  # onnxruntime's one-target path: a leaf without a weight scores 0 (MIN/MAX see it)
        has[leaf, 0] = True
    return _Forest(np.asarray(feature_ids, dtype=np.int64), np.asarray(values, dtype=np.float64), mode, true, false,
                   mt, None, roots, _depth(roots, true, false, leaf), weights, has, double)


def _thresholds(forest: _Forest, dtype) -> np.ndarray:
    """Thresholds in the comparison dtype. Double thresholds compared against float32 inputs are
    rounded in the direction that keeps each comparison exact (x <= t iff x <= the largest float32 <= t)."""
    t = forest.value
    if dtype == np.float64 or not forest.double:
        return t.astype(dtype)
    t32 = t.astype(np.float32)
    down = np.where(t32.astype(np.float64) > t, np.nextafter(t32, np.float32(-np.inf)), t32)
    up = np.where(t32.astype(np.float64) < t, np.nextafter(t32, np.float32(np.inf)), t32)
    return np.where(np.isin(forest.mode, (0, 3)), down, np.where(np.isin(forest.mode, (1, 2)), up, t32))


def _leaves(forest: _Forest, x, xp):
    """The leaf each row reaches in each tree: [N, T] global node indices."""
    n = x.shape[0]
    node = xp.zeros((n, len(forest.roots)), dtype=np.int64) + xp.asarray(forest.roots)
    if forest.depth == 0:
        return node
    feature = xp.asarray(forest.feature)
    threshold = xp.asarray(_thresholds(forest, np.dtype(x.dtype)))
    # Children interleaved (true, false): one gather per level picks the next node.
    children = xp.asarray(np.stack([forest.true, forest.false], axis=1).reshape(-1))
    inner = forest.mode[forest.mode != _LEAF]
    present = sorted(set(inner.tolist()))
    mode = xp.asarray(forest.mode) if len(present) > 1 else None
    missing = xp.asarray(forest.missing_true) if forest.missing_true is not None else None
    members = xp.asarray(forest.members.astype(np.dtype(x.dtype))) if forest.members is not None else None
    for _ in range(forest.depth):
        xv = xp.take_along_axis(x, xp.take(feature, node), axis=1)
        th = xp.take(threshold, node)
        cond = None
        for m in present:
            if m == 0:
                c = xv <= th
            elif m == 1:
                c = xv < th
            elif m == 2:
                c = xv >= th
            elif m == 3:
                c = xv > th
            elif m == 4:
                c = xv == th
            elif m == 5:
                c = xv != th
            else:
                c = xp.any(xv[..., None] == xp.take(members, node, axis=0), axis=-1)
            cond = c if cond is None else xp.where(xp.take(mode, node) == m, c, cond)
        if missing is not None:
            cond = cond | (xp.take(missing, node) & xp.isnan(xv))
        node = xp.take(children, 2 * node + (1 - cond.astype(np.int64)))
    return node


def _aggregate(forest: _Forest, leaves, aggregate, dtype, xp):
    """Per-row sums (or averages, minima, maxima) over the trees and whether any tree scored: [N, K] twice."""
    if forest.tree_target is not None and aggregate in ("SUM", "AVERAGE"):
        k = forest.weights.shape[1]
        per_tree = xp.asarray((forest.tree_target[:, None] == np.arange(k)).astype(dtype))  # [T, K]
        s = xp.matmul(xp.take(xp.asarray(forest.weights.sum(axis=1).astype(dtype)), leaves), per_tree)
        scored = xp.take(xp.asarray(forest.has_weight.any(axis=1).astype(dtype)), leaves)
        has = xp.matmul(scored, per_tree) > 0
        return (s / len(forest.roots) if aggregate == "AVERAGE" else s), has
    w = xp.asarray(forest.weights.astype(dtype))
    picked = xp.take(w, leaves, axis=0)  # [N, T, K]
    has_all = xp.take(xp.asarray(forest.has_weight), leaves, axis=0)
    has = xp.any(has_all, axis=1)
    if aggregate == "SUM":
        return xp.sum(picked, axis=1), has
    if aggregate == "AVERAGE":
        return xp.sum(picked, axis=1) / len(forest.roots), has
    if aggregate == "MIN":
        v = xp.min(xp.where(has_all, picked, xp.full_like(picked, np.inf)), axis=1)
    elif aggregate == "MAX":
        v = xp.max(xp.where(has_all, picked, xp.full_like(picked, -np.inf)), axis=1)
    else:
        raise ValueError(f"unknown aggregate_function {aggregate!r}")
    return xp.where(has, v, xp.zeros_like(v)), has


def _tree_input(x, forest: _Forest, xp):
    x = _rows(x, xp)
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        x = x.astype(np.float64 if forest.double else np.float32)
    return x


def _regressor_scores(forest, x, aggregate, base_values, post_transform, xp, out_dtype):
    dtype = np.float64 if np.dtype(x.dtype) == np.float64 else np.float32
    s, has = _aggregate(forest, _leaves(forest, x, xp), aggregate, dtype, xp)
    k = forest.weights.shape[1]
    base = None if base_values is None else np.asarray(base_values, dtype=dtype).reshape(-1)
    if base is not None and len(base) == k:
        s = s + xp.asarray(base)
    if k > 1:  # a target no tree scored is written as 0, base value or not (onnxruntime's ScoreValue)
        s = xp.where(has, s, xp.zeros_like(s))
    s = _transform(s, post_transform, xp)
    return s if np.dtype(s.dtype) == out_dtype else s.astype(out_dtype)


def _pick(tensor, values):
    return tensor if tensor is not None else values


@kernel("TreeEnsembleRegressor", since=1, domain=ML)
def tree_ensemble_regressor(x, *, aggregate_function, base_values=None, base_values_as_tensor=None, n_targets=None,
                            nodes_falsenodeids, nodes_featureids, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                            nodes_missing_value_tracks_true=None, nodes_modes, nodes_nodeids, nodes_treeids,
                            nodes_truenodeids, nodes_values=None, nodes_values_as_tensor=None, post_transform,
                            target_ids, target_nodeids, target_treeids, target_weights=None,
                            target_weights_as_tensor=None, xp):
    values = _pick(nodes_values_as_tensor, nodes_values)
    weights = _pick(target_weights_as_tensor, target_weights)
    double = nodes_values_as_tensor is not None
    forest = _CACHE.get(
        _forest_v3, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, values, nodes_truenodeids,
        nodes_falsenodeids, nodes_missing_value_tracks_true, target_treeids, target_nodeids, target_ids, weights,
        int(n_targets or (max(target_ids) + 1 if len(target_ids) else 1)), double)
    x = _tree_input(x, forest, xp)
    return _regressor_scores(forest, x, aggregate_function, _pick(base_values_as_tensor, base_values),
                             post_transform, xp, np.dtype(np.float32))


@kernel("TreeEnsembleClassifier", since=1, domain=ML)
def tree_ensemble_classifier(x, *, base_values=None, base_values_as_tensor=None, class_ids, class_nodeids,
                             class_treeids, class_weights=None, class_weights_as_tensor=None,
                             classlabels_int64s=None, classlabels_strings=None, nodes_falsenodeids,
                             nodes_featureids, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                             nodes_missing_value_tracks_true=None, nodes_modes, nodes_nodeids, nodes_treeids,
                             nodes_truenodeids, nodes_values=None, nodes_values_as_tensor=None, post_transform, xp):
    labels = list(classlabels_strings) if classlabels_strings else list(classlabels_int64s)
    k = len(labels)
    values = _pick(nodes_values_as_tensor, nodes_values)
    weights = _pick(class_weights_as_tensor, class_weights)
    double = nodes_values_as_tensor is not None
    forest = _CACHE.get(
        _forest_v3, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, values, nodes_truenodeids,
        nodes_falsenodeids, nodes_missing_value_tracks_true, class_treeids, class_nodeids, class_ids, weights, k,
        double)
    x = _tree_input(x, forest, xp)
    s, has = _aggregate(forest, _leaves(forest, x, xp), "SUM", np.float32, xp)
    base = _pick(base_values_as_tensor, base_values)
    base = np.asarray(base if base is not None else (), dtype=np.float32).reshape(-1)
    if k > 2:
        if len(base):
            s = s + xp.asarray(np.concatenate([base, np.zeros(k - len(base), np.float32)]))
            has = has | xp.asarray(np.arange(k) < len(base))
        top = xp.argmax(xp.where(has, s, xp.full_like(s, -np.inf)), axis=1)
        return _labels(top, labels, xp), _transform(s, post_transform, xp)
    # Two classes: onnxruntime's binary rules (tree_ensemble_aggregator.h). A class no tree scored
    # is written as 0 whatever base value it got; a row whose class 1 has no score keeps one score,
    # which becomes two columns by the rules of _second_class.
    ids = set(np.asarray(class_ids).tolist())
    binary = len(ids) == 1
    all_positive = bool((np.asarray(weights) >= 0).all())
    s0, s1, h0, h1 = s[:, 0], s[:, 1], has[:, 0], has[:, 1]
    zero = xp.zeros_like(s0)
    if len(base) == 2:
        t1 = s0 + float(base[1])  # onnxruntime pairs base_values[1] with class 0's score here
        s0, s1 = xp.where(h1, -t1, s0 + float(base[0])), xp.where(h1, t1, s1 + float(base[1]))
        two = xp.ones_like(h1)
    else:
        if len(base) == 1:
            s0 = s0 + float(base[0])
        two = h1
    v0, v1 = xp.where(h0, s0, zero), xp.where(h1, s1, zero)
    positive = xp.where(two & h1, s1, v0)
    if binary:
        win = positive > 0.5 if all_positive else positive > 0
        label = _labels(win.astype(np.int64), labels, xp)
        mixed = not all_positive
    else:  # onnxruntime answers 1 or 0 itself here (an index into string labels)
        win = (positive > 0).astype(np.int64)
        label = _labels(win, labels, xp) if classlabels_strings else win
        mixed = None if len(base) else True
    pair = _transform(xp.stack([v0, v1], axis=1), post_transform, xp)
    if post_transform == "PROBIT":
        single = xp.stack([_probit(v0, xp), zero], axis=1)
    elif mixed is None:
        single = xp.stack([v0, zero], axis=1)
    else:
        single = _second_class(v0, post_transform, mixed, xp)
    return label, xp.where(two[:, None], pair, single)


# Version 3 adds the *_as_tensor attributes (double thresholds and weights), which these kernels take.
kernel("TreeEnsembleRegressor", since=3, domain=ML)(tree_ensemble_regressor)
kernel("TreeEnsembleClassifier", since=3, domain=ML)(tree_ensemble_classifier)


def _forest_v5(tree_roots, modes, splits, features, true_ids, true_leafs, false_ids, false_leafs, missing,
               membership, leaf_targets, leaf_weights, n_targets) -> _Forest:
    n_nodes, n_leaves = len(features), len(leaf_targets)
    g = n_nodes + n_leaves
    mode = np.concatenate([np.asarray(modes, dtype=np.int64).reshape(-1), np.full(n_leaves, _LEAF, np.int64)])
    own = np.arange(g, dtype=np.int64)
    true = np.concatenate([np.asarray(true_ids, np.int64) + n_nodes * np.asarray(true_leafs, np.int64), own[n_nodes:]])
    false = np.concatenate([np.asarray(false_ids, np.int64) + n_nodes * np.asarray(false_leafs, np.int64),
                            own[n_nodes:]])
    value = np.concatenate([np.asarray(splits, dtype=np.float64).reshape(-1), np.zeros(n_leaves)])
    feature = np.concatenate([np.asarray(features, np.int64), np.zeros(n_leaves, np.int64)])
    members = None
    if membership is not None and (mode == _MEMBER).any():
        sets, current = [], []
        for v in np.asarray(membership, dtype=np.float64).reshape(-1).tolist():
            if math.isnan(v):
                sets.append(current)
                current = []
            else:
                current.append(v)
        if current:
            sets.append(current)
        width = max(1, max((len(s) for s in sets), default=1))
        members = np.full((g, width), np.nan)
        for node, s in zip(np.flatnonzero(mode == _MEMBER), sets):
            members[node, : len(s)] = s
    mt = None
    if missing is not None and len(missing) and np.asarray(missing).any():
        mt = np.concatenate([np.asarray(missing, dtype=bool), np.zeros(n_leaves, bool)])
    weights = np.zeros((g, n_targets), dtype=np.float64)
    has = np.zeros((g, n_targets), dtype=bool)
    rows = n_nodes + np.arange(n_leaves)
    np.add.at(weights, (rows, np.asarray(leaf_targets, np.int64)), np.asarray(leaf_weights, np.float64).reshape(-1))
    has[rows, np.asarray(leaf_targets, np.int64)] = True
    roots = np.asarray(tree_roots, dtype=np.int64)
    return _Forest(feature, value, mode, true, false, mt, members, roots, _depth(roots, true, false, mode == _LEAF),
                   weights, has, np.asarray(splits).dtype == np.float64)


@kernel("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(x, *, aggregate_function, leaf_targetids, leaf_weights, membership_values=None, n_targets=None,
                  nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes, nodes_splits, nodes_trueleafs,
                  nodes_truenodeids, post_transform, tree_roots, xp):
    forest = _CACHE.get(
        _forest_v5, tree_roots, nodes_modes, nodes_splits, nodes_featureids, nodes_truenodeids, nodes_trueleafs,
        nodes_falsenodeids, nodes_falseleafs, nodes_missing_value_tracks_true, membership_values, leaf_targetids,
        leaf_weights, int(n_targets or (max(leaf_targetids) + 1)))
    x = _tree_input(x, forest, xp)
    return _regressor_scores(forest, x, _AGGREGATES_V5[aggregate_function], None,
                             _POST_TRANSFORMS_V5[post_transform], xp, np.dtype(x.dtype))


_AGGREGATES_V5 = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
# The spec numbers post_transform NONE 0, SOFTMAX 1, LOGISTIC 2, SOFTMAX_ZERO 3, PROBIT 4;
# onnxruntime casts the number to its own enum (NONE, LOGISTIC, SOFTMAX, ...), so 1 is LOGISTIC
# and 2 SOFTMAX there. Files are written for and checked against onnxruntime: follow it.
_POST_TRANSFORMS_V5 = {0: "NONE", 1: "LOGISTIC", 2: "SOFTMAX", 3: "SOFTMAX_ZERO", 4: "PROBIT"}
