"""An ``.npz`` cache of generated arrays: atomic writes, corrupt files rebuilt with a warning.

Several processes may ask for the same data set at once (parallel runs, Dask workers). Each one
that finds no file builds the arrays itself and publishes them with ``os.replace`` from a
temporary file in the same directory, so a reader sees no file or a whole one, never a part.
Two builders of one key write the same bytes (generation is deterministic), so the last rename
winning is harmless; a lock would only save the duplicate build, a few seconds once.
"""

from __future__ import annotations

import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

Arrays = dict[str, np.ndarray]

# What a truncated, overwritten or bit-flipped .npz raises from np.load or from reading an array
# (zipfile checks each member's CRC-32 when it is read whole).
_CORRUPT_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)


class CorruptCacheWarning(UserWarning):
    """A cache file could not be read or did not hold what its key promises; it is rebuilt."""


def load_or_build(
    path: Path,
    build: Callable[[], Mapping[str, np.ndarray]],
    *,
    check: Callable[[Arrays], None],
) -> tuple[Arrays, bool]:
    """Read the arrays cached at ``path``, or build, cache and return them.

    Args:
        path: The ``.npz`` file; its name should carry a hash of everything ``build`` depends on.
        build: Makes the arrays when the file is missing or unreadable.
        check: Raises ``ValueError`` if arrays read back are not what this key must hold
            (names, shapes, dtypes); such a file is treated as corrupt.

    Returns:
        ``(arrays, from_cache)``: the arrays, and whether they were read from an existing file.
    """
    if path.exists():
        try:
            arrays = _read(path)
            check(arrays)
            return arrays, True
        except _CORRUPT_ERRORS as e:
            warnings.warn(
                f"cache file {path} is unreadable or wrong ({type(e).__name__}: {e}); rebuilding it",
                CorruptCacheWarning,
                stacklevel=2,
            )
    arrays = {name: np.ascontiguousarray(a) for name, a in build().items()}
    check(arrays)
    write_atomic(path, arrays)
    return arrays, False


def write_atomic(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as an uncompressed ``.npz`` at ``path`` so readers never see a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as ``path``: os.replace is atomic only within one file system.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            # The stub types **kwds as also filling allow_pickle (a bool); the names are array names.
            np.savez(f, **arrays)  # type: ignore[arg-type]
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _read(path: Path) -> Arrays:
    # allow_pickle=False: a cache file is data, never code; object arrays are refused.
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def split_tensors(arrays: Arrays, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``name``'s ``x_<name>`` and ``y_<name>`` arrays as CPU tensors (sharing their memory)."""
    return torch.from_numpy(arrays[f"x_{name}"]), torch.from_numpy(arrays[f"y_{name}"])
