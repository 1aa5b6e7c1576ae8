"""Committed training state on disk: one file per tag, written atomically, plus a LATEST pointer.

A retried Prefect task restores the last committed tag, so nothing half-done is ever read back.
Only a few commits stay on disk (``CheckpointConfig``): the last ``keep_last`` and the best one;
a 200-epoch run of a large model would otherwise keep hundreds of full copies of its weights.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Which committed checkpoints a run keeps on disk.

    Every step commits a checkpoint (that is what makes retries exact); only the last
    ``keep_last`` and, with ``keep_best``, the one after the epoch of the best validation loss
    stay on disk. The one ``LATEST`` points to is never deleted, nor a file being written.
    """

    keep_last: int = 3
    """Most recent commits kept. At least 2: resuming a run whose last commit is a trained but
    not yet applied epoch goes back to the commit before it."""
    keep_best: bool = True
    """Also keep the commit after the epoch with the lowest validation loss."""

    def __post_init__(self) -> None:
        if self.keep_last < 2:
            raise ValueError(
                f"keep_last must be >= 2 (a resume may go back one commit before the latest), got {self.keep_last}"
            )


def retained(
    tags: Collection[str], *, latest: str | None, best: str | None, keep_last: int, order: Callable[[str], int]
) -> set[str]:
    """The tags to keep: the ``keep_last`` newest by ``order``, LATEST, and ``best``."""
    newest = sorted(tags, key=order)[-keep_last:]
    return {*newest, *(t for t in (latest, best) if t is not None)}


class CheckpointNotFoundError(FileNotFoundError):
    """No committed checkpoint under the requested tag."""


class CheckpointStore:
    """Checkpoints of one run under ``root``."""

    def __init__(self, root: Path, retention: CheckpointConfig | None = None) -> None:
        """``retention``: which commits to keep when ``prune`` runs; None keeps every one."""
        self.root = root
        self.retention = retention
        root.mkdir(parents=True, exist_ok=True)

    def tags(self) -> list[str]:
        """Tags of the checkpoints on disk (complete files only; never one being written)."""
        return [p.stem for p in self.root.glob("*.pt")]

    def prune(self, *, best: str | None, order: Callable[[str], int]) -> list[str]:
        """Delete the checkpoints the retention policy does not keep.

        Args:
            best: The tag of the best commit so far (kept when ``keep_best``).
            order: Sort key of tags in commit order.

        Returns:
            The deleted tags.
        """
        if self.retention is None:
            return []
        tags = self.tags()
        keep = retained(
            tags,
            latest=self.latest(),
            best=best if self.retention.keep_best else None,
            keep_last=self.retention.keep_last,
            order=order,
        )
        dropped = sorted(set(tags) - keep, key=order)
        for tag in dropped:
            self.path(tag).unlink(missing_ok=True)
        return dropped

    def size_bytes(self) -> int:
        """Bytes of the checkpoints on disk."""
        return sum(p.stat().st_size for p in self.root.glob("*.pt"))

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
