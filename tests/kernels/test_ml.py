"""The ai.onnx.ml kernels (mithril/backends/kernels/ml.py) against onnxruntime on every backend.

Models come from scikit-learn estimators fitted here on small data (iris, diabetes) and converted
with skl2onnx, plus hand-made graphs for what the converters never write (tree node modes other than
BRANCH_LEQ, TreeEnsemble 5 with set membership, MIN/MAX/AVERAGE aggregation, SVM kernels, label
maps, CastMap, FeatureVectorizer). Outputs must match onnxruntime's: labels, strings and integers
exactly, float32 scores within 1e-4 relative plus 1e-5 absolute (measured over every case and
backend: at most 1.3e-6 relative on regressions (SVR's outputs near 150: 1.1e-4 absolute, sums in
another order), 6e-6 absolute on SVC probabilities, whose pairwise coupling iterates in float32).

MLX has no float64: cases that need it are refused at compile with that reason, which the test
checks before it skips. Strings stay NumPy object arrays on the host on every backend, MLX included.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import mithril as ml
from mithril import errors
from mithril.compile import JitFallbackWarning

from tests.backends.test_parity import AVAILABLE, make_backend

sklearn = pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")

from skl2onnx import to_onnx  # noqa: E402
from skl2onnx.common import tree_ensemble as _skl2onnx_trees  # noqa: E402
from sklearn import ensemble, impute, linear_model, pipeline, preprocessing, svm, tree  # noqa: E402
from sklearn.datasets import load_diabetes, load_iris  # noqa: E402
from sklearn.feature_extraction import DictVectorizer  # noqa: E402

# scikit-learn 1.9 deprecates SVC(probability=True); the converted model is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:The `probability` parameter:FutureWarning")

ML = "ai.onnx.ml"
FLOAT64 = "MLX has no float64 on its default CPU path"


# -- data and models -------------------------------------------------------------------------------
def _iris():
    x, y = load_iris(return_X_y=True)
    return x.astype(np.float32), y


def _diabetes():
    x, y = load_diabetes(return_X_y=True)
    return x[:160].astype(np.float32), y[:160]


def _sk(estimator, x, options=None, ml_opset=3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(estimator, x[:1], options=options, target_opset={"": 17, ML: ml_opset})


def _no_zipmap(estimator):
    return {id(estimator): {"zipmap": False}}


def _hist_gradient_boosting(estimator, x):
    # skl2onnx 1.20 hands onnx.helper numpy uint32 child ids and Python bools for leaves'
    # missing-value flags, which onnx's make_attribute now refuses: pass them on as ints.
    original = _skl2onnx_trees.add_node

    def as_int(v):
        return int(v) if isinstance(v, (bool, np.bool_, np.integer)) else v

    _skl2onnx_trees.add_node = lambda *a, **k: original(*map(as_int, a), **{n: as_int(v) for n, v in k.items()})
    try:
        return _sk(estimator, x, _no_zipmap(estimator) if hasattr(estimator, "classes_") else None)
    finally:
        _skl2onnx_trees.add_node = original


def random_forest_classifier():
    x, y = _iris()
    m = ensemble.RandomForestClassifier(n_estimators=8, max_depth=5, random_state=0).fit(x, y)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def random_forest_binary():
    x, y = _iris()
    m = ensemble.RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0).fit(x, y == 1)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def random_forest_regressor():
    x, y = _diabetes()
    m = ensemble.RandomForestRegressor(n_estimators=8, max_depth=5, random_state=0).fit(x, y)
    return _sk(m, x), {"X": x}


def random_forest_classifier_float64():
    x, y = _iris()
    x = x.astype(np.float64)  # thresholds and weights as double tensors (*_as_tensor)
    m = ensemble.RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(x, y)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def gradient_boosting_classifier():
    x, y = _iris()
    m = ensemble.GradientBoostingClassifier(n_estimators=8, random_state=0).fit(x, y)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def gradient_boosting_binary():
    x, y = _iris()
    m = ensemble.GradientBoostingClassifier(n_estimators=8, random_state=0).fit(x, y == 2)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def gradient_boosting_regressor():
    x, y = _diabetes()
    m = ensemble.GradientBoostingRegressor(n_estimators=8, random_state=0).fit(x, y)
    return _sk(m, x), {"X": x}


def hist_gradient_boosting_classifier():
    x, y = _iris()
    x[::5, 1] = np.nan  # missing values: each split sends them left or right
    m = ensemble.HistGradientBoostingClassifier(max_iter=8, random_state=0).fit(x, y)
    return _hist_gradient_boosting(m, x), {"X": x}


def hist_gradient_boosting_regressor():
    x, y = _diabetes()
    x[::7, 2] = np.nan
    m = ensemble.HistGradientBoostingRegressor(max_iter=8, random_state=0).fit(x, y)
    return _hist_gradient_boosting(m, x), {"X": x}


def string_label_tree():
    x, y = _iris()
    names = np.array(["setosa", "versicolor", "virginica"])
    m = tree.DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, names[y])
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def knn_string_labels():
    """String class labels held in an initializer (gathered by ArrayFeatureExtractor), not in an
    attribute: onnx_ir reads STRING tensors as bytes, onnxruntime returns str."""
    from sklearn.neighbors import KNeighborsClassifier

    x, y = _iris()
    names = np.array(["setosa", "versicolor", "virginica"])
    m = KNeighborsClassifier(n_neighbors=3).fit(x, names[y])
    return _sk(m, x, _no_zipmap(m)), {"X": x[::7]}


def logistic_regression_zipmap():
    x, y = _iris()
    m = linear_model.LogisticRegression(max_iter=500).fit(x, y)
    return _sk(m, x), {"X": x}  # ZipMap: a list of {class: probability}


def logistic_regression_binary():
    x, y = _iris()
    m = linear_model.LogisticRegression(max_iter=500).fit(x, y == 1)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def linear_svc():
    x, y = _iris()
    m = svm.LinearSVC(random_state=0).fit(x, y)
    return _sk(m, x), {"X": x}


def linear_regression():
    x, y = _diabetes()
    return _sk(linear_model.LinearRegression().fit(x, y), x), {"X": x}


def scaler_svc_probability():
    x, y = _iris()
    m = pipeline.make_pipeline(preprocessing.StandardScaler(), svm.SVC(probability=True, random_state=0)).fit(x, y)
    return _sk(m, x, {svm.SVC: {"zipmap": False}}), {"X": x}


def svc_binary_probability():
    x, y = _iris()
    m = svm.SVC(probability=True, random_state=0).fit(x, y == 1)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def svc_decision_votes():
    x, y = _iris()
    m = svm.SVC(kernel="poly", degree=2).fit(x, y)
    return _sk(m, x, _no_zipmap(m)), {"X": x}


def svr():
    x, y = _diabetes()
    return _sk(svm.SVR(C=50.0).fit(x, y), x), {"X": x}


def normalizer(norm):
    def build():
        x, _ = _iris()
        return _sk(preprocessing.Normalizer(norm).fit(x), x), {"X": x}
    build.__name__ = f"normalizer_{norm}"
    return build


def normalizer_edge_rows():
    # A row whose norm is 0 stays as it is; MAX divides by the (signed) largest value.
    nodes = [helper.make_node("Normalizer", ["X"], [f"Y{n}"], domain=ML, norm=n) for n in ("MAX", "L1", "L2")]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 3])],
                   [(f"Y{n}", TensorProto.FLOAT, [None, 3]) for n in ("MAX", "L1", "L2")], 1)
    x = np.array([[0, 0, 0], [-1, -2, -3], [0, -2, -0.5], [1, -1, 0]], np.float32)
    return model, {"X": x}


def binarizer():
    x, _ = _iris()
    return _sk(preprocessing.Binarizer(threshold=3.0).fit(x), x), {"X": x}


def simple_imputer():
    x, _ = _iris()
    fit_x = np.where(x > 6, np.nan, x)
    run_x = np.where(x > 6.5, np.nan, x).astype(np.float32)
    return _sk(impute.SimpleImputer(strategy="median").fit(fit_x), run_x), {"X": run_x}


def standard_scaler():
    x, _ = _iris()
    return _sk(preprocessing.StandardScaler().fit(x), x), {"X": x}


def one_hot_int64():
    fit_x = np.array([[1, 2], [3, 4], [1, 5]], np.int64)
    run_x = np.array([[1, 4], [3, 9], [7, 5], [3, 2]], np.int64)
    return _sk(preprocessing.OneHotEncoder(handle_unknown="ignore").fit(fit_x), run_x), {"X": run_x}


def one_hot_strings():
    fit_x = np.array([["a", "x"], ["b", "y"], ["a", "z"]])
    run_x = np.array([["a", "y"], ["c", "z"], ["b", "q"]], dtype=object)
    return _sk(preprocessing.OneHotEncoder(handle_unknown="ignore").fit(fit_x), run_x), {"X": run_x}


DICT_ROWS = [{"a": 1.0, "b": 2.0}, {"a": 3.0, "c": 1.0}, {"b": 5.0, "c": 2.0, "zz": 7.0}, {"a": 0.5}]


def dict_vectorizer_pipeline():
    from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType

    m = pipeline.make_pipeline(DictVectorizer(sparse=False), linear_model.LogisticRegression())
    m.fit(DICT_ROWS, [0, 1, 1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = to_onnx(m, initial_types=[("input", DictionaryType(StringTensorType([]), FloatTensorType([])))],
                      options={"zipmap": False}, target_opset={"": 17, ML: 3})
    return onx, [{"input": row} for row in DICT_ROWS]  # a map input: one dict per run


# -- hand-made graphs --------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, ml_opset):
    graph = helper.make_graph(nodes, "ml", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)],
                             ir_version=10)


def array_feature_extractor_computed_indices():
    # skl2onnx's classifiers pick labels by ArgMax/TopK outputs: the indices are computed values,
    # traced under jit. 1-D labels give one row; a [N, K] table keeps its rows.
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("ArgMax", ["scores"], ["best"], axis=1, keepdims=1),
        helper.make_node("TopK", ["scores", "k"], ["_", "top"], axis=1),
        helper.make_node("Constant", [], ["labels"], value=helper.make_tensor("l", i64, [4], [10, 20, 30, 40])),
        helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", i64, [1], [2])),
        helper.make_node("ArrayFeatureExtractor", ["labels", "best"], ["label"], domain=ML),
        helper.make_node("ArrayFeatureExtractor", ["scores", "top"], ["picked"], domain=ML),
    ]
    model = _model(nodes, [("scores", f32, [None, 4])], [("label", i64, None), ("picked", f32, None)], 1)
    return model, {"scores": np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)}


def category_and_label_maps():
    nodes = [
        helper.make_node("CategoryMapper", ["X"], ["ids"], domain=ML, cats_strings=["cat", "dog", "eel"],
                         cats_int64s=[7, 3, 5], default_int64=-9),
        helper.make_node("LabelEncoder", ["ids"], ["names"], domain=ML, keys_int64s=[3, 5, 7],
                         values_strings=["three", "five", "seven"], default_string="none"),
        helper.make_node("LabelEncoder", ["X"], ["weights"], domain=ML, keys_strings=["dog", "cat"],
                         values_floats=[0.25, 1.5], default_float=-1.0),
        helper.make_node("CategoryMapper", ["ids"], ["back"], domain=ML, cats_strings=["cat", "dog", "eel"],
                         cats_int64s=[7, 3, 5], default_string="?"),
    ]
    model = _model(nodes, [("X", TensorProto.STRING, [None])],
                   [("ids", TensorProto.INT64, [None]), ("names", TensorProto.STRING, [None]),
                    ("weights", TensorProto.FLOAT, [None]), ("back", TensorProto.STRING, [None])], 2)
    return model, {"X": np.array(["dog", "cat", "fox", "eel", "dog"], dtype=object)}


def label_encoder_tensors():
    keys = helper.make_tensor("keys", TensorProto.FLOAT, [4], [0.5, 1.5, float("nan"), -2.0])
    values = helper.make_tensor("values", TensorProto.INT64, [4], [10, 20, 30, 40])
    default = helper.make_tensor("default", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("LabelEncoder", ["X"], ["Y"], domain=ML, keys_tensor=keys, values_tensor=values,
                              default_tensor=default)]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 3])], [("Y", TensorProto.INT64, [None, 3])], 4)
    x = np.array([[0.5, 1.5, np.nan], [-2.0, 3.0, 0.5]], np.float32)
    return model, {"X": x}


def label_encoder_int_to_float():
    nodes = [helper.make_node("LabelEncoder", ["X"], ["Y"], domain=ML, keys_int64s=[1, 2, 4],
                              values_floats=[0.1, 0.2, 0.4], default_float=9.0)]
    model = _model(nodes, [("X", TensorProto.INT64, [None])], [("Y", TensorProto.FLOAT, [None])], 2)
    return model, {"X": np.array([4, 1, 3, 2, 2], np.int64)}


def features_and_imputer():
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    nodes = [
        helper.make_node("ArrayFeatureExtractor", ["X", "idx"], ["A"], domain=ML),
        helper.make_node("FeatureVectorizer", ["X", "A"], ["F"], domain=ML, inputdimensions=[4, 2]),
        helper.make_node("Imputer", ["I"], ["J"], domain=ML, replaced_value_int64=0, imputed_value_int64s=[7, 8, 9]),
        helper.make_node("Scaler", ["X"], ["S"], domain=ML, offset=[0.5, 0.0, 1.0, -1.0], scale=[2.0, 1.0, -1.0, 0.5]),
    ]
    graph = helper.make_graph(
        nodes, "ml",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4]),
         helper.make_tensor_value_info("I", TensorProto.INT64, [None, 3])],
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, 2]),
         helper.make_tensor_value_info("F", TensorProto.FLOAT, [None, 6]),
         helper.make_tensor_value_info("J", TensorProto.INT64, [None, 3]),
         helper.make_tensor_value_info("S", TensorProto.FLOAT, [None, 4])],
        initializer=[helper.make_tensor("idx", TensorProto.INT64, [2], [3, 0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)],
                              ir_version=10)
    ints = np.array([[0, 1, 2], [3, 0, 0], [5, 6, 0], [0, 0, 0], [1, 1, 1]], np.int64)
    return model, {"X": x, "I": ints}


def cast_map_and_zipmap():
    nodes = [
        helper.make_node("CastMap", ["M"], ["dense"], domain=ML, cast_to="TO_FLOAT", map_form="DENSE"),
        helper.make_node("CastMap", ["M"], ["sparse"], domain=ML, cast_to="TO_INT64", map_form="SPARSE", max_map=6),
        helper.make_node("ZipMap", ["P"], ["Z"], domain=ML, classlabels_strings=["x", "y", "z"]),
    ]
    m_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    z_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.STRING, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    graph = helper.make_graph(
        nodes, "ml",
        [helper.make_value_info("M", m_type), helper.make_tensor_value_info("P", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("sparse", TensorProto.INT64, None), helper.make_value_info("Z", z_type)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)],
                              ir_version=10)
    probs = np.array([[0.2, 0.3, 0.5], [0.9, 0.05, 0.05]], np.float32)
    return model, {"M": {4: 2.5, 1: 7.0, 2: -1.25}, "P": probs}


def cast_map_to_string():
    # Floats become std::to_string's "%f" text; keys missing below max_map hold "0.f".
    nodes = [helper.make_node("CastMap", ["M"], ["S"], domain=ML, cast_to="TO_STRING", map_form="SPARSE", max_map=5)]
    m_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "ml", [helper.make_value_info("M", m_type)],
                              [helper.make_tensor_value_info("S", TensorProto.STRING, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)],
                              ir_version=10)
    return model, {"M": {0: 1.5, 3: -0.125, 9: 2.0}}


def _tree_nodes():
    """Two trees over 3 features using every comparison mode, some tracking missing values."""
    return dict(
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2, 3, 4],
        nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 2, 2, 2],
        nodes_modes=["BRANCH_LT", "BRANCH_GTE", "LEAF", "LEAF", "LEAF",
                     "BRANCH_EQ", "LEAF", "BRANCH_NEQ", "LEAF", "LEAF"],
        nodes_values=[0.25, -0.5, 0, 0, 0, 1.0, 0, 2.0, 0, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 0, 3, 0, 0],
        nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 0, 4, 0, 0],
        nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 1, 0, 0],
    )


TREE_X = np.array([[0.1, 0.0, 1.0], [0.3, -1.0, 2.0], [np.nan, 0.5, 3.0], [0.0, np.nan, np.nan], [1.0, 2.0, 2.0],
                   [-3.0, -0.5, 1.0]], np.float32)


def tree_regressor_modes(aggregate):
    def build():
        nodes = [helper.make_node(
            "TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, n_targets=2, aggregate_function=aggregate,
            base_values=[0.5, -1.0], post_transform="NONE",
            target_treeids=[0, 0, 0, 0, 1, 1, 1], target_nodeids=[2, 3, 4, 4, 1, 3, 4],
            target_ids=[0, 1, 0, 1, 0, 1, 1], target_weights=[1.0, 2.0, 3.0, -4.0, 5.0, 6.0, -7.0],
            **_tree_nodes())]
        return _model(nodes, [("X", TensorProto.FLOAT, [None, 3])], [("Y", TensorProto.FLOAT, [None, 2])], 3), \
            {"X": TREE_X}
    build.__name__ = f"tree_regressor_{aggregate.lower()}"
    return build


def tree_regressor_one_target(aggregate):
    # One target: a leaf without a weight scores 0, which MIN and MAX take into account.
    def build():
        nodes = [helper.make_node(
            "TreeEnsembleRegressor", ["X"], ["Y"], domain=ML, n_targets=1, aggregate_function=aggregate,
            base_values=[0.5], target_treeids=[0, 0, 1], target_nodeids=[2, 3, 1], target_ids=[0, 0, 0],
            target_weights=[0.1, 0.2, 0.05], **_tree_nodes())]
        return _model(nodes, [("X", TensorProto.FLOAT, [None, 3])], [("Y", TensorProto.FLOAT, [None, 1])], 3), \
            {"X": TREE_X}
    build.__name__ = f"tree_regressor_one_target_{aggregate.lower()}"
    return build


def tree_classifier_modes(post_transform):
    def build():
        nodes = [helper.make_node(
            "TreeEnsembleClassifier", ["X"], ["label", "scores"], domain=ML, classlabels_int64s=[4, 5, 6],
            post_transform=post_transform, base_values=[0.1, 0.0, -0.1],
            class_treeids=[0, 0, 0, 1, 1, 1], class_nodeids=[2, 3, 4, 1, 3, 4], class_ids=[0, 1, 2, 2, 1, 0],
            class_weights=[0.5, 1.5, 0.25, 2.0, -1.0, 0.75], **_tree_nodes())]
        return _model(nodes, [("X", TensorProto.FLOAT, [None, 3])],
                      [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 3])], 3), \
            {"X": TREE_X}
    build.__name__ = f"tree_classifier_{post_transform.lower()}"
    return build


# Two-class tree classifiers: which classes the leaves score, base values and post_transform pick
# among onnxruntime's binary rules (one score made two columns, or two scores).
BINARY_LEAVES = {
    "both_classes": ([2, 3, 4, 2, 4], [0, 0, 0, 1, 1], [0.7, 0.2, 0.4, 0.3, 0.6]),
    "class1_on_some_leaves": ([2, 3, 4, 2], [0, 0, 0, 1], [0.7, 0.2, 0.4, 0.3]),
    "class0_only": ([2, 3, 4], [0, 0, 0], [0.7, 0.2, 0.6]),
    "class1_only_mixed_signs": ([2, 3, 4], [1, 1, 1], [0.7, -0.2, 0.1]),
}


def tree_binary(leaves, base_values, post_transform):
    def build():
        nodes, ids, weights = BINARY_LEAVES[leaves]
        extra = {"base_values": base_values} if base_values else {}
        node = helper.make_node(
            "TreeEnsembleClassifier", ["X"], ["label", "scores"], domain=ML, classlabels_int64s=[3, 8],
            post_transform=post_transform, class_treeids=[0] * len(nodes), class_nodeids=nodes, class_ids=ids,
            class_weights=weights, nodes_treeids=[0] * 5, nodes_nodeids=[0, 1, 2, 3, 4],
            nodes_featureids=[0, 1, 0, 0, 0],
            nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF", "LEAF", "LEAF"], nodes_values=[0.25, 0.5, 0, 0, 0],
            nodes_truenodeids=[1, 2, 0, 0, 0], nodes_falsenodeids=[4, 3, 0, 0, 0], **extra)
        return _model([node], [("X", TensorProto.FLOAT, [None, 3])],
                      [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 2])], 3), \
            {"X": TREE_X}
    build.__name__ = f"tree_binary_{leaves}_{len(base_values or ())}base_{post_transform.lower()}"
    return build


def tree_ensemble_v5(aggregate, post_transform):
    def build():
        f32 = TensorProto.FLOAT
        # Tree 0: node0 x0 <= 0.25 ? node1 : leaf2; node1 x1 in {-1, 2} ? leaf0 : leaf1 (onnxruntime
        # takes integer set members only).
        # Tree 1: node2 x2 > 1.5 ? leaf3 : node3; node3 x0 != 1 (missing -> true) ? leaf4 : leaf5.
        nodes = [helper.make_node(
            "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=2, aggregate_function=aggregate,
            post_transform=post_transform, tree_roots=[0, 2],
            nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [4], [0, 6, 3, 5]),
            nodes_featureids=[0, 1, 2, 0],
            nodes_splits=helper.make_tensor("s", f32, [4], [0.25, 0.0, 1.5, 1.0]),
            nodes_truenodeids=[1, 0, 3, 4], nodes_trueleafs=[0, 1, 1, 1],
            nodes_falsenodeids=[2, 1, 3, 5], nodes_falseleafs=[1, 1, 0, 1],
            nodes_missing_value_tracks_true=[0, 0, 0, 1],
            membership_values=helper.make_tensor("mv", f32, [3], [-1.0, 2.0, np.nan]),
            leaf_targetids=[0, 1, 0, 1, 0, 1],
            leaf_weights=helper.make_tensor("w", f32, [6], [1.0, -2.0, 0.5, 3.0, -1.5, 2.5]))]
        return _model(nodes, [("X", f32, [None, 3])], [("Y", f32, [None, 2])], 5), {"X": TREE_X}
    build.__name__ = f"tree_ensemble5_agg{aggregate}_post{post_transform}"
    return build


def linear_classifier_softmax_zero():
    nodes = [helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML,
                              coefficients=[1.0, 0.0, -1.0, 0.5, 0.0, 0.0], intercepts=[0.0, 0.5, 0.0],
                              classlabels_strings=["p", "q", "r"], post_transform="SOFTMAX_ZERO")]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 2])],
                   [("label", TensorProto.STRING, [None]), ("scores", TensorProto.FLOAT, [None, 3])], 1)
    return model, {"X": np.array([[1.0, 2.0], [0.0, 0.0], [-1.0, 3.0]], np.float32)}


def linear_models_narrow_input():
    # More coefficients than classes x input features (onnxruntime's own datasets/logreg_iris.onnx
    # declares a [3, 2] input for 12 coefficients): onnxruntime reads the leading ones row-major.
    coef = np.arange(12, dtype=np.float32).tolist()
    nodes = [
        helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML, coefficients=coef,
                         intercepts=[0.1, 0.2, -0.3], classlabels_ints=[0, 1, 2], post_transform="LOGISTIC"),
        helper.make_node("LinearRegressor", ["X"], ["Y"], domain=ML, coefficients=coef[:6], intercepts=[1.0, 2.0],
                         targets=2),
    ]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 2])],
                   [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 3]),
                    ("Y", TensorProto.FLOAT, [None, 2])], 1)
    return model, {"X": np.array([[0.5, -1.0], [0.1, 0.2], [-0.3, 0.05]], np.float32)}


def svm_kernels(kernel_type):
    def build():
        rng = np.random.default_rng(1)
        sv = rng.standard_normal((5, 3)).astype(np.float32)
        nodes = [
            helper.make_node("SVMClassifier", ["X"], ["label", "scores"], domain=ML, classlabels_ints=[0, 1, 2],
                             vectors_per_class=[2, 2, 1], support_vectors=sv.reshape(-1).tolist(),
                             coefficients=rng.standard_normal(10).round(3).tolist(), rho=[0.1, -0.2, 0.3],
                             kernel_type=kernel_type, kernel_params=[0.3, 0.5, 3.0]),
            helper.make_node("SVMRegressor", ["X"], ["reg"], domain=ML, n_supports=5,
                             support_vectors=sv.reshape(-1).tolist(),
                             coefficients=rng.standard_normal(5).round(3).tolist(),
                             rho=[0.25], kernel_type=kernel_type, kernel_params=[0.3, 0.5, 3.0],
                             post_transform="PROBIT"),  # which onnxruntime does not apply to a regression
            helper.make_node("SVMRegressor", ["X"], ["one"], domain=ML, coefficients=[0.5, -1.0, 0.25], rho=[0.1],
                             one_class=1, kernel_params=[0.0, 0.0, 0.0]),
        ]
        model = _model(nodes, [("X", TensorProto.FLOAT, [None, 3])],
                       [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 3]),
                        ("reg", TensorProto.FLOAT, [None, 1]), ("one", TensorProto.FLOAT, [None, 1])], 1)
        return model, {"X": rng.standard_normal((7, 3)).astype(np.float32)}
    build.__name__ = f"svm_{kernel_type.lower()}"
    return build


def linear_classifier_one_score():
    # One row of coefficients for two labels: onnxruntime writes [1 - p, p], p = logistic(score).
    nodes = [helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML, coefficients=[0.75, -1.5],
                              intercepts=[0.05], classlabels_ints=[4, 9], post_transform="LOGISTIC")]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 2])],
                   [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 2])], 1)
    return model, {"X": np.random.default_rng(3).uniform(-1, 1, (6, 2)).astype(np.float32)}


def linear_regressor_probit():
    # PROBIT is onnxruntime's closed-form erfinv approximation, not the exact inverse: one target
    # and three (scores kept inside (0, 1), where the probit is finite).
    nodes = [
        helper.make_node("LinearRegressor", ["X"], ["one"], domain=ML, coefficients=[0.2, -0.1], intercepts=[0.5],
                         post_transform="PROBIT"),
        helper.make_node("LinearRegressor", ["X"], ["three"], domain=ML, targets=3,
                         coefficients=[0.2, -0.1, 0.05, 0.15, -0.2, 0.1], intercepts=[0.5, 0.3, 0.7],
                         post_transform="PROBIT"),
    ]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 2])],
                   [("one", TensorProto.FLOAT, [None, 1]), ("three", TensorProto.FLOAT, [None, 3])], 1)
    return model, {"X": np.random.default_rng(4).uniform(-1, 1, (6, 2)).astype(np.float32)}


def svc_binary_scores(post_transform):
    # Two classes without probabilities: the one decision value written as two columns.
    def build():
        rng = np.random.default_rng(1)
        sv = rng.standard_normal((4, 3)).astype(np.float32)
        nodes = [helper.make_node("SVMClassifier", ["X"], ["label", "scores"], domain=ML, classlabels_ints=[0, 1],
                                  vectors_per_class=[2, 2], support_vectors=sv.ravel().tolist(),
                                  coefficients=[0.5, -0.3, 0.8, -1.0], rho=[0.1], kernel_type="RBF",
                                  kernel_params=[0.4, 0.0, 0.0], post_transform=post_transform)]
        model = _model(nodes, [("X", TensorProto.FLOAT, [None, 3])],
                       [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 2])], 1)
        return model, {"X": rng.standard_normal((6, 3)).astype(np.float32)}
    build.__name__ = f"svc_binary_scores_{post_transform.lower()}"
    return build


def svm_without_support_vectors():
    # No vectors_per_class: a linear SVM, one score per class (coefficients [classes, features]);
    # with two classes a positive top score picks the second label.
    nodes = [helper.make_node("SVMClassifier", ["X"], ["label", "scores"], domain=ML, classlabels_ints=[10, 11],
                              coefficients=[0.5, -1.25, 0.75, -0.5, 1.0, 0.25], rho=[0.1], post_transform="LOGISTIC",
                              kernel_params=[0.0, 0.0, 0.0])]
    model = _model(nodes, [("X", TensorProto.FLOAT, [None, 3])],
                   [("label", TensorProto.INT64, [None]), ("scores", TensorProto.FLOAT, [None, 2])], 1)
    return model, {"X": np.random.default_rng(2).standard_normal((8, 3)).astype(np.float32)}


# case -> (builder, what MLX lacks for it or None)
CASES = {f.__name__: (f, need) for f, need in [
    (random_forest_classifier, None), (random_forest_binary, None), (random_forest_regressor, None),
    (random_forest_classifier_float64, FLOAT64), (gradient_boosting_classifier, None),
    (gradient_boosting_binary, None), (gradient_boosting_regressor, None), (hist_gradient_boosting_classifier, None),
    (hist_gradient_boosting_regressor, None), (string_label_tree, None), (knn_string_labels, None),
    (logistic_regression_zipmap, None),
    (logistic_regression_binary, None), (linear_svc, None), (linear_regression, None),
    (scaler_svc_probability, None), (svc_binary_probability, None), (svc_decision_votes, None), (svr, None),
    (normalizer_edge_rows, None), (binarizer, None), (simple_imputer, None), (standard_scaler, None), (one_hot_int64, None),
    (one_hot_strings, None), (dict_vectorizer_pipeline, None), (category_and_label_maps, None),
    (label_encoder_tensors, None), (label_encoder_int_to_float, None), (features_and_imputer, None),
    (cast_map_and_zipmap, None), (cast_map_to_string, None), (linear_classifier_softmax_zero, None),
    (array_feature_extractor_computed_indices, None),
    (linear_models_narrow_input, None),
    *[(tree_regressor_modes(a), None) for a in ("SUM", "AVERAGE", "MIN", "MAX")],
    *[(tree_regressor_one_target(a), None) for a in ("MIN", "AVERAGE")],
    *[(tree_classifier_modes(p), None) for p in ("NONE", "SOFTMAX", "LOGISTIC")],
    *[(tree_binary(*c), None) for c in (("both_classes", [0.1, -0.2], "LOGISTIC"),
                                          ("class1_on_some_leaves", None, "SOFTMAX"),
                                          ("class0_only", None, "LOGISTIC"),
                                          ("class1_only_mixed_signs", [0.5], "NONE"))],
    *[(tree_ensemble_v5(a, p), None) for a, p in ((0, 0), (1, 1), (2, 2), (3, 3))],
    *[(normalizer(n), None) for n in ("l1", "l2", "max")],
    (svm_without_support_vectors, None), (linear_classifier_one_score, None),
    *[(svc_binary_scores(p), None) for p in ("NONE", "LOGISTIC")], (linear_regressor_probit, None),
    *[(svm_kernels(k), None) for k in ("LINEAR", "POLY", "RBF", "SIGMOID")],
]}

_BUILT: dict = {}


def _built(case):
    if case not in _BUILT:
        model, feeds = CASES[case][0]()
        runs = feeds if isinstance(feeds, list) else [feeds]
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in model.graph.output]
        _BUILT[case] = (model, runs, [dict(zip(names, session.run(None, run))) for run in runs])
    return _BUILT[case]


def _assert_same(name, got, want, backend):
    if isinstance(want, list):  # ZipMap: a list of {label: probability}, as onnxruntime's Python API gives it
        assert isinstance(got, list) and len(got) == len(want), name
        for g, w in zip(got, want):
            assert list(g) == list(w), name
            np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], rtol=1e-4, atol=1e-5, err_msg=name)
        return
    got = backend.to_numpy(got) if not isinstance(got, np.ndarray) else got
    assert got.shape == want.shape, f"{name}: shape {got.shape} != onnxruntime's {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != onnxruntime's {want.dtype}"
    if want.dtype.kind in "OUSbiu":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("backend_name", AVAILABLE)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_onnxruntime(case, backend_name):
    model, runs, expected = _built(case)
    backend = make_backend(backend_name)
    lacks = CASES[case][1]
    if backend_name == "mlx" and lacks:
        with pytest.raises(errors.UnsupportedDTypeError, match=lacks):
            ml.compile(ml.load_onnx(model), backend)
        pytest.skip(f"{lacks}: the backend refuses the graph at compile (checked)")
    with warnings.catch_warnings():
        # ZipMap's list of dicts cannot be traced: such graphs run un-jitted, with this warning.
        warnings.simplefilter("ignore", JitFallbackWarning)
        pm = ml.compile(ml.load_onnx(model), backend) if not backend.needs_static_shapes else None
        for run, want in zip(runs, expected):
            if backend.needs_static_shapes:
                # C and GGML compile fixed shapes only: one program per run's shapes (the refusal
                # of a symbolic dim is tested in tests/backends/c/test_backend.py and tests/backends/ggml/test_backend.py).
                shapes = {k: list(v.shape) for k, v in run.items() if isinstance(v, np.ndarray)}
                pm = ml.compile(ml.load_onnx(model), backend, shapes=shapes)
            got = pm.evaluate(None, run)
            for name, value in want.items():
                _assert_same(name, got[name], value, backend)


def test_trees_are_walked_level_by_level():
    """A forest is evaluated with one gather per tree level, not per sample: its depth bounds the
    program (the deepest tree), and every row reaches a leaf."""
    from mithril.backends.kernels import ml as ml_kernels

    model, runs, _ = _built("random_forest_regressor")
    attrs = {a.name: helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    modes = [m.decode() for m in attrs["nodes_modes"]]
    forest = ml_kernels._forest_v3(attrs["nodes_treeids"], attrs["nodes_nodeids"], attrs["nodes_featureids"], modes,
                                   attrs["nodes_values"], attrs["nodes_truenodeids"], attrs["nodes_falsenodeids"],
                                   None, attrs["target_treeids"], attrs["target_nodeids"], attrs["target_ids"],
                                   attrs["target_weights"], 1, False)
    assert len(forest.roots) == 8 and forest.depth == 5
    leaves = ml_kernels._leaves(forest, runs[0]["X"], np)
    assert leaves.shape == (runs[0]["X"].shape[0], 8)
    assert (forest.mode[leaves] == ml_kernels._LEAF).all()


def test_validate_compares_zipmap_outputs():
    """`ml.validate` compares a sequence of maps key by key, then its values at float32 tolerance."""
    from mithril.validate import compare

    model, runs, _ = _built("logistic_regression_zipmap")
    report = ml.validate(model, make_backend("numpy"), inputs=runs[0])
    assert report.passed
    probabilities = next(o for o in report.outputs if o.name == "output_probability")
    assert list(probabilities.shape) == [150, 3]
    ref = [{0: 0.25, 1: 0.75}]
    assert compare("p", "numpy", [{0: 0.25, 1: 0.75}], ref).passed
    assert not compare("p", "numpy", [{0: 0.25, 1: 0.7}], ref).passed
    assert not compare("p", "numpy", [{0: 0.25, 2: 0.75}], ref).passed


def test_single_target_trees_sum_by_matmul():
    """Gradient boosting writes one tree per class: such forests sum as [N, T] x [T, K] (no [N, T, K]
    gather); a random forest's leaves score every class and keep the gather."""
    from mithril.backends.kernels import ml as ml_kernels

    def forest(case):
        model, _, _ = _built(case)
        node = next(n for n in model.graph.node if n.op_type == "TreeEnsembleClassifier")
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        return ml_kernels._forest_v3(
            a["nodes_treeids"], a["nodes_nodeids"], a["nodes_featureids"], [m.decode() for m in a["nodes_modes"]],
            a["nodes_values"], a["nodes_truenodeids"], a["nodes_falsenodeids"], None, a["class_treeids"],
            a["class_nodeids"], a["class_ids"], a["class_weights"], len(a["classlabels_int64s"]), False)

    boosted = forest("gradient_boosting_classifier")
    assert boosted.tree_target is not None and sorted(set(boosted.tree_target.tolist())) == [0, 1, 2]
    assert forest("random_forest_classifier").tree_target is None


def test_array_feature_extractor_bytes_labels_gather_on_host():
    """String initializers load as NumPy bytes (|S) today: such labels gather on the host, with the
    backend's indices copied there, instead of reaching a framework that has no string dtype."""
    from mithril.backends.kernels import ml as ml_kernels

    jnp = pytest.importorskip("jax.numpy")
    labels = np.array([b"ant", b"bee", b"cat"])
    out = ml_kernels.array_feature_extractor(labels, jnp.array([[2], [0]]), xp=jnp)
    assert isinstance(out, np.ndarray) and out.tolist() == [[b"cat", b"ant"]]
