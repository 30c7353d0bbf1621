"""com.microsoft::Tokenizer on every backend that holds strings, against onnxruntime.

(a) A hand-made graph per attribute combination: separators (one, several, regular expressions,
    one that matches the empty string), tokenexp (skl2onnx's pattern, word boundaries, ASCII-only
    classes on non-ASCII text), character tokenization both ways, mark, mincharnum, pad_value,
    [C] and [N, C] inputs, and the empty-result shapes. ``tokenexpsplit`` (an extension onnxruntime
    does not register) is compared with onnxruntime running the same pattern as a separator.
(b) scikit-learn's TfidfVectorizer exported by skl2onnx inside the test, with its token pattern and
    with separators, bigrams included.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril.errors import MithrilError

from tests.backends.test_parity import AVAILABLE, make_backend

ort = pytest.importorskip("onnxruntime")
# A Tokenizer's output width depends on its input's values: JAX runs such graphs un-jitted, and says so.
pytestmark = pytest.mark.filterwarnings("ignore::mithril.compile.JitFallbackWarning")

MS = "com.microsoft"
# Every backend keeps strings as NumPy object arrays on the host, where Tokenizer runs. C is left
# out: it compiles only graphs whose every shape is fixed, and a Tokenizer's output width depends
# on the text (the C refusal of symbolic shapes is tested in tests/backends/c/test_backend.py).
STRING_BACKENDS = [b for b in AVAILABLE if b != "c"]


def _tokenizer_model(rank: int, **attrs):
    node = helper.make_node("Tokenizer", ["X"], ["Y"], domain=MS, name="tokenizer", **attrs)
    graph = helper.make_graph(
        [node], "tokenizer",
        [helper.make_tensor_value_info("X", TensorProto.STRING, [None] * rank)],
        [helper.make_tensor_value_info("Y", TensorProto.STRING, None)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _strings(rows):
    return np.array(rows, dtype=object)


def _ort(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x})[0]


def _run(model, x, backend_name):
    pm = ml.compile(ml.load_onnx(model), make_backend(backend_name))
    return np.asarray(pm.evaluate(None, {"X": x})["Y"], dtype=object)


SENTENCES = ["Hello World", "I love computer science !", "", "  spaced   out  "]
PUNCTUATED = ["a,b;;c", "one, two; three", "x"]
# \w is ASCII-only in RE2: the accented letters and the CJK text split or vanish.
UNICODE = ["héllo wörld ça", "日本 語", "plain ascii"]

# name -> (attributes, input rows); every case runs on the rows as [C] and on two rows as [N, C].
CASES = {
    "space": (dict(mark=0, mincharnum=1, pad_value="#", separators=[" "]), SENTENCES),
    "space_marked": (dict(mark=1, mincharnum=1, pad_value="#", separators=[" "]), SENTENCES),
    "several_separators_mincharnum": (dict(mark=1, mincharnum=2, pad_value="<pad>", separators=[" ", ",", ";"]),
                                      PUNCTUATED),
    "regex_separators": (dict(mark=0, mincharnum=1, pad_value="", separators=[";", "[ ,]+"]), PUNCTUATED),
    "whitespace_run_separator": (dict(mark=0, mincharnum=1, pad_value="#", separators=[r"\s+"]), SENTENCES),
    "empty_matching_separator": (dict(mark=0, mincharnum=1, pad_value="#", separators=["a*"]),
                                 ["aaa", "banana", "xyz"]),
    "chars_by_empty_separator": (dict(mark=0, mincharnum=1, pad_value="#", separators=[""]), UNICODE),
    "chars_by_dot_marked": (dict(mark=1, mincharnum=1, pad_value="#", tokenexp="."), UNICODE),
    "skl2onnx_tokenexp": (dict(mark=0, mincharnum=1, pad_value="#", tokenexp="[a-zA-Z0-9_]+"), SENTENCES),
    "tokenexp_marked_mincharnum": (dict(mark=1, mincharnum=3, pad_value="#", tokenexp="[a-zA-Z0-9_]+"),
                                   SENTENCES),
    "word_boundaries_ascii": (dict(mark=0, mincharnum=1, pad_value="#", tokenexp=r"\b\w\w+\b"), UNICODE),
    "word_class_ascii": (dict(mark=1, mincharnum=1, pad_value="?", tokenexp=r"\w+"), UNICODE),
    # An empty match is too short for any mincharnum: the search steps one character on.
    "empty_matching_tokenexp": (dict(mark=0, mincharnum=2, pad_value="#", tokenexp="a*"), ["aaa", "banana", "a"]),
    "nothing_left": (dict(mark=1, mincharnum=1, pad_value="#", separators=[" "]), ["", "   ", " "]),
    "nothing_matches": (dict(mark=1, mincharnum=1, pad_value="#", tokenexp="[0-9]+"), ["abc", "", "def"]),
}


def _inputs(rows):
    yield _strings(rows)
    yield _strings([rows, rows[::-1]])


@pytest.mark.parametrize("backend_name", STRING_BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_tokenizer_matches_onnxruntime(case, backend_name):
    attrs, rows = CASES[case]
    for x in _inputs(rows):
        model = _tokenizer_model(x.ndim, **attrs)
        want = _ort(model, x)
        got = _run(model, x, backend_name)
        assert got.shape == want.shape, f"{case} {x.shape}: shape {got.shape}, onnxruntime {want.shape}"
        assert got.tolist() == want.tolist(), f"{case} {x.shape}"


def test_tokenizer_case_shapes():
    """The shape rules themselves, so the comparison above cannot pass by both sides being wrong."""
    attrs, rows = CASES["space_marked"]
    got = _run(_tokenizer_model(1, **attrs), _strings(rows), "numpy")
    assert got.shape == (4, 7)  # "I love computer science !": 5 tokens, 2 marks
    assert got[0].tolist() == ["\x02", "Hello", "World", "\x03", "#", "#", "#"]  # pads outside the marks
    assert got[2].tolist() == ["\x02", "\x03", "#", "#", "#", "#", "#"]
    attrs, rows = CASES["nothing_left"]
    assert _run(_tokenizer_model(2, **attrs), _strings([rows, rows]), "numpy").shape == (2, 3, 0)


@pytest.mark.parametrize("backend_name", STRING_BACKENDS)
@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 2)])
def test_tokenizer_empty_input(shape, backend_name):
    # [0] -> [0], [N, 0] -> [N, 0], [0, C] -> [0, 0]: no token axis is added.
    x = np.empty(shape, dtype=object)
    model = _tokenizer_model(len(shape), mark=1, mincharnum=1, pad_value="#", separators=[" "])
    want = _ort(model, x)
    got = _run(model, x, backend_name)
    assert got.shape == want.shape == shape[:-1] + (0,)


@pytest.mark.parametrize("backend_name", STRING_BACKENDS)
@pytest.mark.parametrize("pattern,mincharnum", [(" ", 1), ("[,; ]+", 1), ("[,;]", 2)])
def test_tokenexpsplit_is_tokenexp_as_separator(pattern, mincharnum, backend_name):
    x = _strings([PUNCTUATED, PUNCTUATED[::-1]])
    ours = _tokenizer_model(2, mark=1, mincharnum=mincharnum, pad_value="#", tokenexp=pattern, tokenexpsplit=1)
    theirs = _tokenizer_model(2, mark=1, mincharnum=mincharnum, pad_value="#", separators=[pattern])
    assert _run(ours, x, backend_name).tolist() == _ort(theirs, x).tolist()


@pytest.mark.parametrize(
    "attrs,message",
    [
        (dict(mark=0, mincharnum=2, pad_value="#", separators=[""]), "too big for character tokenization"),
        (dict(mark=0, mincharnum=2, pad_value="#", tokenexp="."), "too big for character tokenization"),
        (dict(mark=0, mincharnum=1, pad_value="#"), "one of separators or tokenexp"),
        (dict(mark=0, mincharnum=0, pad_value="#", separators=[" "]), "mincharnum must be positive"),
    ],
)
def test_tokenizer_refuses_what_onnxruntime_refuses(attrs, message):
    model = _tokenizer_model(1, **attrs)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
        _ort(model, _strings(["a b"]))
    with pytest.raises(MithrilError, match=message) as info:
        _run(model, _strings(["a b"]), "numpy")
    assert "tokenizer" in str(info.value)  # names the node


def test_tokenizer_refuses_rank_3():
    model = _tokenizer_model(3, mark=0, mincharnum=1, pad_value="#", separators=[" "])
    with pytest.raises(MithrilError, match=r"\[C\] or \[N, C\]"):
        _run(model, _strings([[["a b"]]]), "numpy")


@pytest.mark.parametrize("backend_name", STRING_BACKENDS)
@pytest.mark.parametrize("options", [None, {"separators": [" ", ",", ";", "[.!]"]}], ids=["tokenexp", "separators"])
def test_skl2onnx_tfidf_vectorizer(options, backend_name):
    """TfidfVectorizer exported by skl2onnx: StringNormalizer, Tokenizer, TfIdfVectorizer (uni- and bigrams).
    Separators are regular expressions: a bare "." would split at every character."""
    sklearn_text = pytest.importorskip("sklearn.feature_extraction.text")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import StringTensorType

    corpus = ["The cat sat on the mat.", "Dogs bark; cats purr!", "the dog sat, the cat ran", "cat mat cat mat"]
    vectorizer = sklearn_text.TfidfVectorizer(ngram_range=(1, 2)).fit(corpus)
    # locale "C": StringNormalizer's default en_US.UTF-8 may be missing, and onnxruntime then refuses it.
    model = skl2onnx.to_onnx(
        vectorizer, initial_types=[("text", StringTensorType([None, 1]))], target_opset=17,
        options={sklearn_text.TfidfVectorizer: {"locale": "C", **(options or {})}},
    )
    tokenizers = [n for n in model.graph.node if n.op_type == "Tokenizer"]
    assert len(tokenizers) == 1 and tokenizers[0].domain == MS
    assert {a.name for a in tokenizers[0].attribute} >= {"separators" if options else "tokenexp"}
    x = _strings([["The CAT sat on the red mat"], ["dogs bark, cats purr"], ["nothing known here"]])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"text": x})
    pm = ml.compile(ml.load_onnx(model), make_backend(backend_name))
    got = pm.evaluate(None, {"text": x})
    name = model.graph.output[0].name
    np.testing.assert_allclose(make_backend(backend_name).to_numpy(got[name]), want[0], rtol=1e-5, atol=1e-6)
    assert np.count_nonzero(want[0][0]) > 3  # the comparison sees real counts
