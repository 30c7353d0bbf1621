"""The GGML backend: its class (``backend.py``), the graph builder and runner (``program.py``),
the ggml call for each ONNX op (``ops/``), weight quantization (``quantize.py``) and NumPy's
array helpers (``arrays.py``)."""
