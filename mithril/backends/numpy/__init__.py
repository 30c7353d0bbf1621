"""The NumPy backend: its class (``backend.py``), kernel overrides for speed and accuracy
(``overrides.py``; the depthwise convolution in ``conv.py``) and NumPy array helpers (``arrays.py``)."""
