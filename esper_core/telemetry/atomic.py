"""Files replaced atomically: a reader sees the old file or the new one, never a part.

Apart from ``baseline`` (which needs torch for the environment it records) so that what writes
small records beside a run, such as ``run.stops``, imports no more than the standard library.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` so readers see the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file must be on the same file system as ``path`` for os.replace to be atomic.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (readers see the old file or the new one, never a part)."""
    atomic_write(Path(path), text)
