"""Expected failures of conformance cases in operator domains Mithril does not implement, per backend.

None today: ai.onnx.ml has its kernels (mithril/backends/kernels/ml.py)."""

NUMPY: dict[str, str] = {}
