"""The NumPy backend: its class (``backend.py``), SciPy-backed kernel overrides (``overrides.py``)
and NumPy array helpers (``arrays.py``)."""
