"""Backend-specific kernels (`@override(backend, op, since=...)`), a module per backend.

Each backend imports its own module when it is created, so `import mithril` never imports a
framework it does not need.
"""
