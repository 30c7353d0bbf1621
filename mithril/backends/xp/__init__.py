"""NumPy-compatible facades over other frameworks' arrays, so the shared kernels (written against
NumPy's array methods and dtypes) run unchanged on them: a module per framework.
"""
