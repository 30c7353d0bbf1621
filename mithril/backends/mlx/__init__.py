"""The MLX backend: its class (``backend.py``), kernel overrides (``overrides.py``), the
NumPy-compatible facade over ``mlx.core`` arrays the shared kernels run on (``xp.py``) and MLX
array helpers (``arrays.py``).

Nothing here imports mlx until a module of this folder is imported.
"""
