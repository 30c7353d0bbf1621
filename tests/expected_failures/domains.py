"""Expected failures of conformance cases in operator domains Mithril does not implement, per backend."""

_ML = "ai.onnx.ml domain is out of scope: unsupported-domain error by design"

NUMPY: dict[str, str] = {
    "test_ai_onnx_ml_array_feature_extractor": _ML,
    "test_ai_onnx_ml_binarizer": _ML,
    "test_ai_onnx_ml_label_encoder_string_int": _ML,
    "test_ai_onnx_ml_label_encoder_string_int_no_default": _ML,
    "test_ai_onnx_ml_label_encoder_tensor_mapping": _ML,
    "test_ai_onnx_ml_label_encoder_tensor_value_only_mapping": _ML,
    "test_ai_onnx_ml_tree_ensemble_single_tree": _ML,
    "test_ai_onnx_ml_tree_ensemble_set_membership": _ML,
}
