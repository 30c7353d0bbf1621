"""The C backend overrides no shared kernel: nodes without a C kernel run the NumPy ones."""
