"""Expected failures of the elementwise family (Abs ... Swish, Cast/CastLike/BitCast): none today.

Every node case of these ops passes on NumPy; add ``"test_case": "reason"`` entries here when
a backend cannot pass one.
"""

NUMPY: dict[str, str] = {}
