"""The JAX backend: its class (``backend.py``), kernel overrides (``overrides.py``), the split of
parameter-only work out of the jitted program (``hoist.py``) and JAX array helpers (``arrays.py``).

Nothing here imports jax until a module of this folder is imported.
"""
