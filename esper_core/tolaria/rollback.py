"""Two rollback tiers: the last commit kept in memory (fast) and every commit on disk (full).

A restore tries the fast tier when it holds the requested tag, falls back to disk, reports which
tier served it and how long it took against the deadline, and counts failures.

The fast tier holds the very bytes the commit wrote, so it is trusted; but it must not hide a
damaged disk copy of the same commit (a resume would meet it later, with more lost): a restore
from memory also checks the disk copy, and replaces a damaged one from memory, keeping it aside.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from esper_core.tolaria.checkpoint import CheckpointStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoreReport:
    """How a restore went."""

    tag: str
    tier: str
    """``memory`` or ``disk``."""
    latency_ms: float
    deadline_exceeded: bool
    failures: int
    """Tiers that failed before one succeeded."""


class RollbackTiers:
    """Commits go to disk and to memory; restores come from memory when they can."""

    def __init__(self, store: CheckpointStore, *, keep_in_memory: bool = True, persist: bool = True) -> None:
        """``persist``: False keeps commits in memory only, and reads the store for a resume (the
        other ranks of a data-parallel run: rank 0 writes the run's checkpoints)."""
        if not (persist or keep_in_memory):
            raise ValueError("a commit must go somewhere: persist, keep_in_memory, or both")
        self.store = store
        self.keep_in_memory = keep_in_memory
        self.persist = persist
        self._fast: tuple[str, bytes] | None = None

    def commit(self, tag: str, state: dict[str, Any]) -> None:
        """Persist ``state`` under ``tag`` (atomic on disk) and keep it for a fast restore."""
        if self.persist:
            data = self.store.save(tag, state)
        else:
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getvalue()
        self._fast = (tag, data) if self.keep_in_memory else None

    def drop_fast_tier(self) -> None:
        """Forget the in-memory copy (drills use this to exercise the disk tier)."""
        self._fast = None

    def restore(self, tag: str, *, deadline_ms: float) -> tuple[dict[str, Any], RestoreReport]:
        """State committed under ``tag`` and a report of the restore.

        Raises:
            CheckpointNotFoundError: neither tier holds ``tag``.
            CheckpointCorruptError: only the disk holds ``tag``, and its copy is damaged.
        """
        start = time.perf_counter()
        failures = 0
        state: dict[str, Any] | None = None
        tier = "disk"
        if self._fast is not None and self._fast[0] == tag:
            try:
                state = torch.load(io.BytesIO(self._fast[1]), map_location="cpu", weights_only=True)
                tier = "memory"
            except (RuntimeError, ValueError, EOFError):
                failures += 1
                self._fast = None
        if state is None:
            state = self.store.load(tag)
        latency = (time.perf_counter() - start) * 1e3
        if tier == "memory" and self.persist:
            # Outside the timed restore: an audit of the disk (one read and hash, rare: rollbacks only).
            self._repair_disk_copy(tag)
        return state, RestoreReport(
            tag=tag, tier=tier, latency_ms=latency, deadline_exceeded=latency > deadline_ms, failures=failures
        )

    def _repair_disk_copy(self, tag: str) -> None:
        """Replace a damaged disk copy of the commit the fast tier holds, keeping the damaged file aside."""
        assert self._fast is not None and self._fast[0] == tag
        check = self.store.verify(tag)
        if check.status != "damaged":
            return
        aside = self.store.set_aside(tag)
        self.store.write(tag, self._fast[1])
        log.warning(
            "checkpoint %s was damaged on disk (%s); kept at %s and written again from the run's in-memory copy "
            "of the same commit",
            check.path,
            check.problem,
            aside,
        )
