"""The ONNX backend suite's cases each backend is known to fail, with the reason: one module per op
family (``nn.py``, ``reduce.py`` ...) or backend (``jax.py``), each setting ``BACKEND = {case: reason}``
(``NUMPY = {...}``, ``TORCH = {...}``). ``mithril conformance`` reads them
(:func:`mithril.conformance.expected_failures`); a case failing without an entry fails the run."""
