"""Expected failures of the reduce, normalization and loss conformance cases, per backend."""

NUMPY: dict[str, str] = {}
