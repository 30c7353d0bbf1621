"""The GGML backend overrides no shared kernel: nodes without a ggml rule run the NumPy ones."""
