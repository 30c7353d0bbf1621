"""Weight formats for the GGML backend: which type each weight is stored in, and the conversion.

llama.cpp's rules: a weight is quantized when it is a matrix that a matmul reads (MatMul, Gemm)
or an embedding table (Gather's rows). ggml quantizes whole rows of blocks (32 values; 256 for the
k-quants): a matmul weight whose rows (the reduction dim) are not a whole number of blocks is
padded with zeros to the next block, and the matmul pads its activation's rows the same way (the
zeros add nothing to the products), so every matmul weight is quantized, LeNet's 400-wide layer
included. An embedding table whose rows do not fit keeps the backend's float type (named in
``kept_float``). Everything else stays float32: 1-D tensors (biases, norms' scales) and
convolution kernels (ggml's im2col reads float kernels only).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ...errors import BackendOptionError

# Quantized types: name -> (ggml type constant name, values per block).
QUANT_TYPES = {
    "q8_0": ("GGML_TYPE_Q8_0", 32),
    "q4_0": ("GGML_TYPE_Q4_0", 32),
    "q4_1": ("GGML_TYPE_Q4_1", 32),
    "q5_0": ("GGML_TYPE_Q5_0", 32),
    "q5_1": ("GGML_TYPE_Q5_1", 32),
    "q4_K": ("GGML_TYPE_Q4_K", 256),
    "q6_K": ("GGML_TYPE_Q6_K", 256),
}
FLOAT_TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16"}
ALIASES = {"int8": "q8_0"}  # the design's word for 8-bit weights
# Layouts a rule asks weights in: "t" (a matmul operand, [K, N] stored as [N, K]) and "rows"
# (a matrix read by rows: a table, or Gemm's transposed B) may be quantized or half precision;
# "conv" (a kernel) and "plain" (anything else) stay float32.
QUANTIZABLE = ("t", "rows")
HALF_OK = ("t", "rows")


def quant_name(quantize: str | None) -> str | None:
    """The canonical quantized type name for ``quantize`` (None: no quantization)."""
    if quantize is None:
        return None
    name = ALIASES.get(quantize, quantize)
    if name not in QUANT_TYPES:
        raise BackendOptionError(f"GGMLBackend: quantize must be None, 'int8' or one of {', '.join(QUANT_TYPES)}, "
                                 f"got {quantize!r}")
    return name


class WeightFormat:
    """The types weights are stored in: ``weight_type`` (f32, f16, bf16) for float weights and
    ``quantize`` (a key of :data:`QUANT_TYPES`, or None) for those llama.cpp's rules quantize."""

    def __init__(self, weight_type: str = "f32", quantize: str | None = None):
        self.weight_type = weight_type
        self.quantize = quant_name(quantize)
        self.kept_float: list[tuple[str, str]] = []  # (weight, why) for matrices left unquantized

    def type_for(self, v, layout: str, shape: tuple, matmul: bool = False) -> str:
        """The type name of weight ``v`` (NumPy ``shape``) read in ``layout`` (``matmul``: by a
        matmul, which pads its rows to whole blocks)."""
        if layout not in HALF_OK or len(shape) < 2:
            return "f32"
        if self.quantize is not None and layout in QUANTIZABLE:
            block = QUANT_TYPES[self.quantize][1]
            row = shape[0] if layout == "t" else shape[-1]  # ggml's ne[0] after the layout
            if row % block == 0 or matmul:
                return self.quantize
            self.kept_float.append((v.name, f"rows of {row} values are not whole {block}-value blocks"))
        return self.weight_type

    def padded_row(self, type_name: str, row: int) -> int:
        """The stored row length of a matmul weight: ``row`` rounded up to whole blocks."""
        block = QUANT_TYPES[type_name][1] if type_name in QUANT_TYPES else 1
        return -(-row // block) * block

    @staticmethod
    def ggml_type(name: str) -> int:
        import ggml

        return getattr(ggml, QUANT_TYPES[name][0] if name in QUANT_TYPES else FLOAT_TYPES[name])

    def convert(self, array: np.ndarray | None, layout: str, type_name: str, shape: tuple):
        """(buffer, logical shape): ``array`` (NumPy ``shape``; None: an empty buffer of the right
        size, filled when the parameter arrives) in ``layout`` and type ``type_name``."""
        if layout == "t" and len(shape) != 2:
            raise ValueError(f"layout 't' takes a matrix, not shape {shape}")
        logical = (shape[1], shape[0]) if layout == "t" else (tuple(shape) or (1,))
        row = self.padded_row(type_name, logical[-1])
        pad = row - logical[-1]
        logical = logical[:-1] + (row,)
        nbytes = row_bytes(type_name, logical[-1]) * int(np.prod(logical[:-1], dtype=np.int64))
        if array is None:
            return np.empty(max(nbytes, 1), np.uint8), logical
        a = np.asarray(array, dtype=np.float32).reshape(shape)
        if layout == "t":
            a = a.T
        if pad:
            a = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)])
        a = np.ascontiguousarray(a)
        if type_name == "f32":
            return a, logical
        if type_name == "f16":
            return a.astype(np.float16), logical
        if type_name == "bf16":
            import ml_dtypes

            return a.astype(ml_dtypes.bfloat16), logical
        return quantize_rows(a.reshape(-1, logical[-1]), type_name), logical


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` values in ``type_name``."""
    import ggml

    return int(ggml.ggml_row_size(WeightFormat.ggml_type(type_name), n))


def quantize_rows(rows: np.ndarray, type_name: str) -> np.ndarray:
    """``rows`` (float32, [nrows, n]) quantized by ggml into a byte buffer."""
    import ggml

    rows = np.ascontiguousarray(rows, dtype=np.float32)
    nrows, n = rows.shape
    out = np.empty(row_bytes(type_name, n) * nrows, np.uint8)
    qtype = WeightFormat.ggml_type(type_name)
    ggml.ggml_quantize_init(qtype)
    written = ggml.ggml_quantize_chunk(qtype, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                       out.ctypes.data_as(ctypes.c_void_p), 0, nrows, n, None)
    assert written == out.nbytes, (written, out.nbytes)
    return out


def dequantize_rows(buffer: np.ndarray, type_name: str, nrows: int, n: int) -> np.ndarray:
    """The float32 values of ``nrows`` rows of ``n`` values stored as ``type_name``."""
    import ggml

    if type_name == "f32":
        return np.frombuffer(buffer, np.float32).reshape(nrows, n).copy()
    if type_name == "f16":
        return np.frombuffer(buffer, np.float16).reshape(nrows, n).astype(np.float32)
    if type_name == "bf16":
        import ml_dtypes

        return np.frombuffer(buffer, ml_dtypes.bfloat16).reshape(nrows, n).astype(np.float32)
    traits = ggml.ggml_get_type_traits(WeightFormat.ggml_type(type_name))
    out = np.empty((nrows, n), np.float32)
    buffer = np.ascontiguousarray(buffer)
    traits.contents.to_float(buffer.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                             nrows * n)
    return out


__all__ = ["QUANT_TYPES", "WeightFormat", "dequantize_rows", "quant_name", "quantize_rows", "row_bytes"]
