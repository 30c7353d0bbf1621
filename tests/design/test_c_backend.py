"""The design documents' C backend examples, typed in as a user would.

The documents construct the backend (``ml.CBackend(dtype=ml.float32)``, float64 in the list of
types) and leave the rest to the reader: the tests add a small model, compile it with its shapes
fixed (C compiles static shapes) and check the values against NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import mithril as ml

from .test_compile_and_train import reference_forward, small_model


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MITHRIL_CACHE_DIR", str(tmp_path / "c-cache"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_c_backend_initialization_reference(dtype):
    """000 backend comparison, "Backend Initialization Reference / C Backend": ``ml.CBackend(
    dtype=ml.float32)`` (float32 or float64) compiles a model to C whose outputs equal NumPy's."""
    backend = ml.CBackend(dtype=getattr(ml, dtype))
    assert backend.dtype == getattr(ml, dtype)
    pm = ml.compile(small_model(), backend, shapes={"input": [3, 8]}, static_shapes=True, inference=True)
    params = pm.get_parameters()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(dtype)
    out = pm.evaluate(params, {"input": x})["output"]
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(out, reference_forward(params, x), rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-5 if dtype == "float32" else 1e-12)
    assert "int seg0(" in pm.program.source  # it ran as generated C


def test_experimental_backends_c():
    """001 backends, "Experimental Backends / C/GGML Backend": ``backend = ml.CBackend(dtype=
    ml.float32)``; a dtype C does not compute in is refused with the ones it does."""
    backend = ml.CBackend(dtype=ml.float32)
    x = backend.ones(2, 3)
    assert isinstance(x, np.ndarray) and x.dtype == np.float32
    with pytest.raises(ml.MithrilError, match="float32 or float64"):
        ml.CBackend(dtype=ml.float16)
