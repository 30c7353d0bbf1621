"""Expected failures of the nn family (Conv, ConvTranspose, DeformConv, Col2Im, the pools,
MaxUnpool, MaxRoiPool, Gemm, MatMul, Einsum, Det): none today.

Every node case of these ops passes on NumPy; add ``"test_case": "reason"`` entries here when
a backend cannot pass one.
"""

NUMPY: dict[str, str] = {}
