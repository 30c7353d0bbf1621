"""Expected failures of the image and attention conformance cases (Resize, Upsample, GridSample,
AffineGrid, RoiAlign, NonMaxSuppression, Attention, RotaryEmbedding, SwiGLU, LinearAttention,
CausalConvWithState), per backend."""

NUMPY: dict[str, str] = {}
