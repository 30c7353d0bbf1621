"""Expected failures of shape-family conformance cases, per backend, each with its reason."""

NUMPY: dict[str, str] = {}
