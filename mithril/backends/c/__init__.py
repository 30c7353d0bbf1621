"""The C backend: its class (``backend.py``), the renderer (``render.py``), the build and cache
(``build.py``), the kernel library (``lib/``) and NumPy's array helpers (``arrays.py``)."""
