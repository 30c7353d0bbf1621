"""Named arrays on disk: one ``.npz`` file, or a folder of ``NAME.npy`` files.

``validate`` saves and loads the inputs it ran and the reference's outputs with these, so a run on
one machine can be checked on another. A path ending in ``.npz`` is one file; any other path is a
folder (created when saving). ONNX value names may hold ``/`` or ``:`` (``encoder/layer.0/out:0``),
which a file name cannot: a name is stored percent-encoded (``encoder%2Flayer.0%2Fout%3A0.npy``),
in a folder and as an ``.npz`` key alike, and decoded on loading.

>>> import numpy as np, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "inputs.npz")
>>> save_arrays(path, {"a/b:0": np.ones(2, np.float32)})
>>> sorted(load_arrays(path))
['a/b:0']
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np

from .errors import InputError


def file_name(name: str) -> str:
    """``name`` as a file name (or ``.npz`` key): every character but letters, digits and ``_.-~``
    percent-encoded, so ``/``, ``:`` and ``%`` round-trip."""
    return quote(name, safe="")


def is_npz(path) -> bool:
    return str(path).lower().endswith(".npz")


def save_arrays(path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path``: one ``.npz`` file, or a folder of ``NAME.npy`` files (created,
    files of the same names replaced)."""
    path = Path(path)
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    try:
        if is_npz(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:  # a file object: np.savez would append .npz to another suffix
                np.savez(f, **{file_name(k): v for k, v in arrays.items()})
            return
        if path.exists() and not path.is_dir():
            raise InputError(f"{path}: a file, not a folder; save arrays to a folder or a .npz file")
        path.mkdir(parents=True, exist_ok=True)
        for name, arr in arrays.items():
            np.save(path / f"{file_name(name)}.npy", arr, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot write arrays to {path}: {exc}") from exc


def load_arrays(path, what: str | None = None) -> dict[str, np.ndarray]:
    """The arrays :func:`save_arrays` wrote to ``path`` (a ``.npz`` file or a folder of ``.npy``
    files), by decoded name; a missing or unreadable path is an :class:`~mithril.errors.InputError`
    naming it (``what``: how messages name it, default the path)."""
    path = Path(path)
    what = what or str(path)
    if not path.exists():
        raise InputError(f"{what}: no such {'file' if is_npz(path) else 'folder'}")
    try:
        if is_npz(path):
            with np.load(path, allow_pickle=False) as npz:
                return {unquote(k): npz[k] for k in npz.files}
        if not path.is_dir():
            raise InputError(f"{what}: neither a .npz file nor a folder of .npy files")
        return {unquote(f.name[:-len(".npy")]): np.load(f, allow_pickle=False)
                for f in sorted(path.iterdir()) if f.name.endswith(".npy") and f.is_file()}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{what}: cannot read the arrays: {exc}") from exc


__all__ = ["file_name", "load_arrays", "save_arrays"]
