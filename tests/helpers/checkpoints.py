"""Damage a checkpoint as a disk would: bytes inverted in place, or a write that runs out of space."""

from __future__ import annotations

import errno
import io
from pathlib import Path
from typing import Any


def flip(path: Path, *, at: float = 0.5, n: int = 64) -> None:
    """Invert ``n`` bytes of ``path`` starting at fraction ``at`` of its length (the middle: weights)."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    data[start : start + n] = bytes(b ^ 0xFF for b in data[start : start + n])
    path.write_bytes(bytes(data))


class _FullDisk:
    """A file on a disk with ``room`` bytes left: the write that needs more fails with ENOSPC."""

    room = 1000

    def __init__(self, f: io.BufferedWriter) -> None:
        self._f = f

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self._f.write(data[: self.room])  # what fitted stays in the temporary file
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - flush, fileno: the real file's
        return getattr(self._f, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def open_on_a_full_disk(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
    """``open`` as the checkpoint store sees it on a full disk (patched in as its module's ``open``)."""
    f = open(path, mode, *args, **kwargs)  # noqa: SIM115 - closed by the wrapper's __exit__
    return _FullDisk(f) if "w" in mode else f
