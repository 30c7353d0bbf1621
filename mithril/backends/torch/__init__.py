"""The PyTorch backend: its class (``backend.py``), kernel overrides (``overrides.py``), the
NumPy-compatible facade over tensors the shared kernels run on (``xp.py``) and tensor helpers
(``arrays.py``).

Nothing here imports torch until a module of this folder is imported.
"""
