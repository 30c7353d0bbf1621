"""Expected failures of the recurrent and quantization kernels: none."""

NUMPY: dict[str, str] = {}
