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
import threading
from dataclasses import dataclass, field

import numpy as np

from ...errors import BackendOptionError
from ..host_memory import page_buffer, release_mapped_pages
from .threads import import_ggml

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

    def __init__(self, weight_type: str = "f32", quantize: str | None = None, threads: int = 1):
        self.weight_type = weight_type
        self.threads = threads  # what converts a matrix (:func:`parallel_map`)
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

    @staticmethod
    def ggml_type(name: str) -> int:
        ggml = import_ggml()

        return getattr(ggml, QUANT_TYPES[name][0] if name in QUANT_TYPES else FLOAT_TYPES[name])

    def convert(self, array: np.ndarray | None, layout: str, type_name: str, shape: tuple):
        """(buffer, logical shape): ``array`` (NumPy ``shape``; None: an empty buffer of the right
        size, filled when the parameter arrives) in ``layout`` and type ``type_name``. A float32
        array that needs no transpose or padding is the buffer itself (no copy); otherwise the
        buffer is made block by block (:func:`transpose_into`, :data:`CHUNK_BYTES` of rows), on
        ``threads`` threads, with no whole-matrix temporary beside it but a quantized or half
        precision matrix's float32 transpose."""
        buffer, stored, _ = self._convert(array, layout, type_name, shape, None)
        return buffer, stored

    def convert_measured(self, name: str, array: np.ndarray, layout: str, type_name: str, shape: tuple):
        """(buffer, logical shape, report row): :meth:`convert`, and for a weight stored in a type
        other than float32 its :class:`QuantizedWeight` (None for float32), the error measured
        block by block as the rows are converted (what :func:`measure` computes, without reading
        the array again or making whole-matrix temporaries)."""
        return self._convert(array, layout, type_name, shape, name)

    def _convert(self, array, layout: str, type_name: str, shape: tuple, name: str | None):
        if layout == "t" and len(shape) != 2:
            raise ValueError(f"layout 't' takes a matrix, not shape {shape}")
        stored = stored_shape(layout, type_name, shape)
        n_rows, width = int(np.prod(stored[:-1], dtype=np.int64)), stored[-1]
        nbytes = row_bytes(type_name, width) * n_rows
        if array is None:
            return np.empty(max(nbytes, 1), np.uint8), stored, None
        a = np.asarray(array).reshape(shape)
        logical = (shape[1], shape[0]) if layout == "t" else (tuple(shape) or (1,))
        if type_name == "f32" and layout != "t" and tuple(logical) == tuple(stored):
            return np.ascontiguousarray(a, dtype=np.float32).reshape(stored), stored, None
        out = page_buffer(nbytes)
        rows = out[:nbytes].reshape(n_rows, row_bytes(type_name, width))
        if layout == "t" and type_name == "f32":  # transposed straight into the buffer
            n, k = logical
            t = rows.view(np.float32)
            transpose_into(t[:n, :k], a, self.threads)
            t[n:] = 0
            t[:n, k:] = 0
            return t.reshape(stored), stored, None
        # Stored rows, block by block (:data:`CHUNK_BYTES`): the matrix's, or for "t" its float32
        # transpose's, made a slab of rows at a time (:data:`SLAB_BYTES`); zero rows after them
        # up to stored[0], each row zero-padded to ``width``.
        src = None if layout == "t" else a.reshape(-1, logical[-1])
        n_src, k = logical[0] if src is None else src.shape[0], logical[-1]
        dtype = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}.get(type_name)
        if type_name == "bf16":
            import ml_dtypes

            dtype = np.dtype(ml_dtypes.bfloat16)
        step = max(1, min(n_rows, CHUNK_BYTES // max(4 * width, 1)))
        slab = n_rows
        if layout == "t":  # whole blocks
            slab = min(n_rows, max(step, SLAB_BYTES // max(4 * k, 1) // step * step))
            size = 4 * slab * k
            slab_rows = page_buffer(size)[:size].view(np.float32).reshape(slab, k)
        measured = name is not None and type_name != "f32"
        local = threading.local()

        def block_of(r0: int, base: int):
            r1 = min(r0 + step, n_rows)
            real = max(0, min(r1, n_src) - r0)  # rows of the matrix in this block; the rest are zeros
            dst = rows[r0:r1]
            if type_name == "f32":
                b = dst.view(np.float32)  # made in place
            else:
                if getattr(local, "block", None) is None:
                    local.block = np.empty((step, width), np.float32)
                b = local.block[:r1 - r0]
            if real:
                if layout == "t":
                    b[:real, :k] = slab_rows[r0 - base:r0 - base + real]
                else:
                    b[:real, :k] = src[r0:r0 + real]
                    release_mapped_pages(src[r0:r0 + real])
            b[real:] = 0
            b[:real, k:] = 0
            if type_name in QUANT_TYPES:
                quantize_rows(b, type_name, out=dst)
            elif type_name != "f32":
                dst.view(dtype)[...] = b
            if not (measured and real):
                return 0.0, 0.0, 0.0
            values = b[:real, :k]  # read no more once the rows are stored: squared in place
            err = np.subtract(dequantize_rows(dst[:real], type_name, real, width)[:, :k], values)
            peak = max(float(err.max()), -float(err.min())) if err.size else 0.0
            return (float(np.square(values, out=values).sum(dtype=np.float64)),
                    float(np.square(err, out=err).sum(dtype=np.float64)), peak)

        sums = []
        for base in range(0, n_rows, slab):
            if layout == "t":
                real = max(0, min(base + slab, n_src) - base)
                if real:
                    transpose_into(slab_rows[:real], a[:, base:base + real], self.threads)
            sums += parallel_map(lambda r0, base=base: block_of(r0, base), range(base, min(base + slab, n_rows), step),
                                 self.threads)
        report = None
        if measured:
            sum_a, sum_e = sum(x[0] for x in sums), sum(x[1] for x in sums)
            rel = float(np.sqrt(sum_e / sum_a)) if sum_a else 0.0
            report = QuantizedWeight(name, type_name, layout, tuple(a.shape), int(nbytes), a.size * 4, rel,
                                     max((x[2] for x in sums), default=0.0))
        if dtype is not None:
            return out[:nbytes].view(dtype).reshape(stored), stored, report
        return out, stored, report


# Rows converted at a time (about this many float32 bytes): a block is padded, converted and
# measured while it is in cache, and no float32 copy of a whole matrix is made.
CHUNK_BYTES = 1 << 18
# Rows of a quantized or half-precision "t" weight transposed at a time, in float32 bytes (one
# buffer of this size beside the converted weight).
SLAB_BYTES = 32 << 20
# transpose_into's bands (bytes of the source's rows) and tiles (columns). NumPy's strided copy
# of a whole 8192 x 8192 float32 matrix takes ~2 s (every read a cache and TLB miss). By bands
# the inner loops are a band's rows long: 64-row bands (2 MiB of an 8192-wide matrix) of
# 1024-column tiles (256 KiB read, 256 KiB written: within an L2) copy it in 0.11 s on two Xeon
# cores, 16-row bands in 0.28 s (NumPy's per-loop cost dominates short inner loops).
BAND_BYTES = 1 << 21
TILE = 1024


def transpose_into(dst: np.ndarray, src: np.ndarray, threads: int = 1) -> None:
    """``dst[...] = src.T`` (``dst`` [n, k], ``src`` [k, n]): ``src`` read in order by bands of
    rows (a memory-mapped one's pages handed back after each band, :func:`release_mapped_pages`),
    each copied tile by tile, the bands shared among ``threads`` threads."""
    k, n = src.shape
    band = max(1, min(k, BAND_BYTES // max(n * src.itemsize, 1)))

    def copy(k0: int) -> None:
        rows = src[k0:k0 + band]
        target = dst[:, k0:k0 + band]
        for r0 in range(0, n, TILE):
            target[r0:r0 + TILE] = rows[:, r0:r0 + TILE].T
        release_mapped_pages(rows)

    parallel_map(copy, range(0, k, band), threads)


def parallel_map(fn, items, threads: int = 1) -> list:
    """``[fn(x) for x in items]``, on up to ``threads`` threads (NumPy's copies and ggml's
    quantization release the GIL)."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


def row_bytes(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` values in ``type_name``."""
    ggml = import_ggml()

    return int(ggml.ggml_row_size(WeightFormat.ggml_type(type_name), n))


def quantize_rows(rows: np.ndarray, type_name: str, out: np.ndarray | None = None) -> np.ndarray:
    """``rows`` (float32, [nrows, n]) quantized by ggml into a byte buffer (``out``: a contiguous
    uint8 array of exactly their bytes, written in place)."""
    ggml = import_ggml()

    rows = np.ascontiguousarray(rows, dtype=np.float32)
    nrows, n = rows.shape
    size = row_bytes(type_name, n) * nrows
    if out is None:
        out = np.empty(size, np.uint8)
    elif out.nbytes != size or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"quantize_rows: out must be {size} contiguous bytes, not {out.dtype} {out.shape}")
    qtype = WeightFormat.ggml_type(type_name)
    ggml.ggml_quantize_init(qtype)
    written = ggml.ggml_quantize_chunk(qtype, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                       out.ctypes.data_as(ctypes.c_void_p), 0, nrows, n, None)
    assert written == out.nbytes, (written, out.nbytes)
    return out


def dequantize_rows(buffer: np.ndarray, type_name: str, nrows: int, n: int) -> np.ndarray:
    """The float32 values of ``nrows`` rows of ``n`` values stored as ``type_name``."""
    ggml = import_ggml()

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


# A matrix a matmul reads ("t", "rows") is stored with a multiple of ROW_MULTIPLE rows: ggml's
# fast matmul (llamafile's sgemm) takes only multiples of 4, and otherwise falls back to a kernel
# 3-4x slower (GPT-2's 50,257-row LM head: 21 GFLOP/s instead of 67 at one thread); its repacked
# q4_0 and q4_K kernels (CPU_REPACK, AVX2) only multiples of 8 (that LM head at q4_K on one Zen 3
# thread: 126 ms on the plain kernel, 52 repacked; float32 82). The matmul rules drop the padded
# rows' results (Builder.linear).
ROW_MULTIPLE = 8


def stored_shape(layout: str, type_name: str, shape: tuple) -> tuple:
    """The NumPy-order shape ggml sees for a weight of NumPy ``shape`` stored in ``layout`` and
    ``type_name``: transposed for ``"t"``, each row padded to whole blocks when quantized, and a
    matrix read by a matmul (``"t"``, ``"rows"``) given zero rows up to a multiple of
    :data:`ROW_MULTIPLE`."""
    logical = (shape[1], shape[0]) if layout == "t" else (tuple(shape) or (1,))
    block = QUANT_TYPES[type_name][1] if type_name in QUANT_TYPES else 1
    stored = logical[:-1] + (-(-logical[-1] // block) * block,)
    if layout in ("t", "rows") and len(stored) == 2:
        stored = (-(-stored[0] // ROW_MULTIPLE) * ROW_MULTIPLE, stored[1])
    return stored


def restore(buffer: np.ndarray, layout: str, type_name: str, shape: tuple) -> np.ndarray:
    """The float32 array of NumPy ``shape`` that ``buffer`` (``type_name`` in ``layout``, as
    :meth:`WeightFormat.convert` made it) holds: dequantized, padding dropped, transposed back."""
    stored = stored_shape(layout, type_name, shape)
    raw = np.ascontiguousarray(buffer).reshape(-1).view(np.uint8)
    rows = dequantize_rows(raw, type_name, int(np.prod(stored[:-1], dtype=np.int64)), stored[-1])
    logical = (shape[1], shape[0]) if layout == "t" else (tuple(shape) or (1,))
    a = rows.reshape(stored)[tuple(slice(0, n) for n in logical)]
    if layout == "t":
        a = a.T
    return np.ascontiguousarray(a).reshape(shape)


@dataclass(eq=False)
class QuantizedTensor:
    """A weight as GGMLBackend stores it: ``data`` holds the raw bytes of ggml type ``type_name``
    in ``layout`` (``"t"``: a matmul operand stored transposed; ``"rows"``, ``"plain"``: as is),
    rows padded to whole blocks; ``shape`` is the parameter's own (ONNX) shape.

    :func:`mithril.load_gguf` returns these for weights stored in a ggml type other than float32.
    GGMLBackend reads the bytes as they are when the weight's type and layout match (no
    re-quantization); ``dequantize()`` (or ``np.asarray``) gives the float32 array any backend takes.

    >>> import numpy as np
    >>> q = QuantizedTensor.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), "q8_0")
    >>> q.type_name, q.shape, q.stored_shape, q.data.nbytes  # 6 zero rows: a multiple of ROW_MULTIPLE
    ('q8_0', (2, 32), (8, 32), 272)
    >>> bool(np.abs(q.dequantize() - np.linspace(-1, 1, 64).reshape(2, 32)).max() < 0.01)
    True
    """

    type_name: str
    layout: str
    shape: tuple
    data: np.ndarray = field(repr=False)
    _dense: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.data = np.ascontiguousarray(self.data).reshape(-1).view(np.uint8)
        stored = self.stored_shape
        per_row = row_bytes(self.type_name, stored[-1])
        want = per_row * int(np.prod(stored[:-1], dtype=np.int64))
        rows = self.data.nbytes // per_row if per_row else 0
        logical = self.shape[1] if self.layout == "t" else (self.shape or (1,))[0]
        if self.data.nbytes != want and len(stored) == 2 and self.data.nbytes == rows * per_row \
                and logical <= rows < stored[0]:
            # fewer zero rows than stored_shape pads to (a file written with ROW_MULTIPLE 4, or
            # another writer's exact rows): padded here
            self.data = np.concatenate([self.data, np.zeros(want - self.data.nbytes, np.uint8)])
        if self.data.nbytes != want:
            raise ValueError(f"a {self.type_name} tensor of shape {self.shape} in layout {self.layout!r} takes "
                             f"{want} bytes, not {self.data.nbytes}")

    @classmethod
    def from_array(cls, array, type_name: str, layout: str = "rows") -> "QuantizedTensor":
        """``array`` (float) stored as ``type_name`` (a ggml type name: ``"q8_0"``, ``"f16"``...)
        by rows (``layout="rows"``) or transposed (``"t"``), rows zero-padded to whole blocks."""
        array = np.asarray(array, dtype=np.float32)
        data, _ = WeightFormat().convert(array, layout, type_name, array.shape)
        return cls(type_name, layout, array.shape, data)

    @property
    def stored_shape(self) -> tuple:
        """The NumPy-order shape of the stored rows (after the layout and the block padding)."""
        return stored_shape(self.layout, self.type_name, self.shape)

    dtype = np.dtype(np.float32)  # what it stands for: compile's parameter checks see a float32 array

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dequantize(self) -> np.ndarray:
        """The float32 values in the parameter's own shape (computed once, then kept)."""
        if self._dense is None:
            self._dense = restore(self.data, self.layout, self.type_name, self.shape)
        return self._dense

    def __array__(self, dtype=None, copy=None):
        a = self.dequantize()
        return a if dtype is None else a.astype(dtype)


@dataclass
class QuantizedWeight:
    """One row of :class:`QuantizationReport`: a weight stored in a type other than float32 and
    its error against the float32 values it was made from (None when it came stored, as from a
    GGUF file)."""

    name: str
    type_name: str
    layout: str
    shape: tuple
    nbytes: int
    float_bytes: int
    rel_rms: float | None
    max_abs: float | None


@dataclass
class QuantizationReport:
    """What ``GGMLBackend(quantize=..., dtype=...)`` stored: each converted weight with its bytes
    and error (``rows``), and the matrices kept float with why (``kept_float``). ``str()`` is a table."""

    rows: list[QuantizedWeight]
    kept_float: list[tuple[str, str]]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        width = min(max([len(r.name) for r in self.rows] + [6]), 60)
        lines = [f"{'weight':{width}} {'type':5} {'shape':>14} {'bytes':>10} {'of f32':>7} "
                 f"{'rel rms':>9} {'max abs':>9}"]
        for r in self.rows:
            err = (f"{r.rel_rms:9.2e} {r.max_abs:9.2e}" if r.rel_rms is not None else f"{'stored':>9} {'':>9}")
            name = r.name if len(r.name) <= width else "..." + r.name[3 - width:]
            lines.append(f"{name:{width}} {r.type_name:5} {'x'.join(map(str, r.shape)):>14} {r.nbytes:>10,} "
                         f"{r.nbytes / max(r.float_bytes, 1):7.1%} {err}")
        total, f32 = sum(r.nbytes for r in self.rows), sum(r.float_bytes for r in self.rows)
        lines.append(f"{len(self.rows)} weights: {total:,} bytes, {total / max(f32, 1):.1%} of float32")
        for name, why in self.kept_float:
            lines.append(f"kept float: {name} ({why})")
        return "\n".join(lines)


def measure(name: str, array: np.ndarray, buffer: np.ndarray, layout: str, type_name: str) -> QuantizedWeight:
    """The report row of ``array`` stored as ``buffer``: relative RMS and largest absolute error
    of the stored values (dequantized by ggml) against the float32 ones."""
    a = np.asarray(array, dtype=np.float32)
    err = restore(buffer, layout, type_name, a.shape) - a
    rms = float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))
    rel = float(np.sqrt(np.mean(np.square(err, dtype=np.float64)))) / rms if rms else 0.0
    return QuantizedWeight(name, type_name, layout, tuple(a.shape), int(buffer.nbytes), a.size * 4, rel,
                           float(np.abs(err).max()) if err.size else 0.0)


__all__ = ["QUANT_TYPES", "QuantizationReport", "QuantizedTensor", "QuantizedWeight", "WeightFormat",
           "dequantize_rows", "measure", "quant_name", "quantize_rows", "restore", "row_bytes", "stored_shape"]
