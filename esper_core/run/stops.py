"""What a run stopped from outside left behind: why it stopped, where it stands, how to go on.

A run stopped by a signal (SIGTERM from a service manager or ``esper server``'s shutdown, Cancel
in the Prefect UI, Ctrl-C) keeps its last commit; the epoch it was training is discarded and
trained again from that commit when the run goes on, so the resumed run reproduces the
uninterrupted one. ``stopped.json`` in the run folder says so for ``esper runs list|show``: the
reason, the commit the run will go on from, and the commands that continue it. Starting or
resuming the run removes it.

Why not commit the half-trained epoch instead: a mid-epoch commit would have to hold the data
position, the optimizer's and every random generator's state, the epoch's partial statistics and
the seeds' blending, and a resume from it would have to match the uninterrupted run bit for bit.
Epochs here take milliseconds to minutes, and every process must be gone within seconds of the
signal, so the stop costs at most the epoch in progress.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from esper_core.run.commits import CHECKPOINTS_DIR, epochs_applied
from esper_core.telemetry.atomic import atomic_write_text
from esper_core.tolaria.checkpoint import CheckpointStore

STOP_FILE = "stopped.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class StopRecord:
    """Why and where a run stopped, and how to continue it."""

    reason: str
    """What stopped it, in words (e.g. "SIGTERM or Cancel (Prefect flow run)")."""
    last_commit: str | None
    """The commit the run goes on from (None: it stopped before its first)."""
    epochs_done: int
    """Epochs applied at ``last_commit``."""
    resume: tuple[str, ...]
    """Commands that continue the run from ``last_commit``."""
    stopped_at: str
    """When, UTC ISO 8601: for the operator only, nothing reads it back to decide."""


def record_stop(run_dir: Path, *, reason: str, resume: tuple[str, ...]) -> StopRecord | None:
    """Write ``stopped.json`` for the run in ``run_dir``, from its last commit on disk.

    Safe to call while a signal unwinds: it reads the commit pointer and writes one small file
    atomically, nothing else.

    Returns:
        The record written, or None when ``run_dir`` does not hold a run (it stopped before
        its folder existed: there is nothing to continue).
    """
    if not run_dir.is_dir():
        return None
    checkpoints = run_dir / CHECKPOINTS_DIR
    latest = CheckpointStore(checkpoints).latest() if checkpoints.exists() else None
    record = StopRecord(
        reason=reason,
        last_commit=latest,
        epochs_done=epochs_applied(latest),
        resume=resume,
        stopped_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    atomic_write_text(run_dir / STOP_FILE, json.dumps(asdict(record), indent=2) + "\n")
    return record


def read_stop(run_dir: Path) -> StopRecord | None:
    """The run's stop record, or None if it was not stopped (or has gone on since)."""
    path = run_dir / STOP_FILE
    if not path.exists():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    return StopRecord(**{**raw, "resume": tuple(raw["resume"])})


def clear_stop(run_dir: Path) -> None:
    """Forget the stop: the run is going on."""
    (run_dir / STOP_FILE).unlink(missing_ok=True)
