"""Expected failures of the nn kernels (convolution, pooling, matmul family), per backend."""

NUMPY: dict[str, str] = {}
