"""Committed training state on disk: one file per tag, written atomically, plus a LATEST pointer.

A retried Prefect task restores the last committed tag, so nothing half-done is ever read back.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch


class CheckpointNotFoundError(FileNotFoundError):
    """No committed checkpoint under the requested tag."""


class CheckpointStore:
    """Checkpoints of one run under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, tag: str) -> Path:
        """File of checkpoint ``tag``."""
        return self.root / f"{tag}.pt"

    def save(self, tag: str, state: dict[str, Any]) -> bytes:
        """Write ``state`` under ``tag`` atomically, then point LATEST at it.

        Returns:
            The serialised checkpoint (the fast rollback tier keeps it in memory).
        """
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        _atomic_write(self.path(tag), data)
        _atomic_write(self.root / "LATEST", tag.encode())
        return data

    def latest(self) -> str | None:
        """Tag of the last committed checkpoint, or None before the first commit."""
        pointer = self.root / "LATEST"
        return pointer.read_text().strip() if pointer.exists() else None

    def load(self, tag: str | None = None) -> dict[str, Any]:
        """State saved under ``tag`` (default: LATEST)."""
        tag = tag or self.latest()
        if tag is None or not self.path(tag).exists():
            raise CheckpointNotFoundError(
                f"no checkpoint {tag!r} under {self.root}; the run has not committed an epoch yet"
            )
        # weights_only: a checkpoint is data, never code to execute.
        return torch.load(self.path(tag), map_location="cpu", weights_only=True)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
