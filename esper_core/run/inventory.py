"""The runs in a runs folder, read from their files: what each is, how far it got, whether its checkpoints are intact.

What ``esper runs list|show|verify`` prints. Nothing here builds a run or loads a checkpoint into
one: a check reads each file's bytes against the digest its commit recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from esper_core.run.commits import CHECKPOINTS_DIR, epochs_applied, tag_order
from esper_core.run.spec_file import SPEC_FILE, read_spec_file
from esper_core.run.stops import StopRecord, read_stop
from esper_core.tolaria.checkpoint import DAMAGED_DIR, CheckpointCheck, CheckpointStore


class UnknownRunError(LookupError):
    """No run of that id in the runs folder."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunInfo:
    """One run as its folder records it."""

    run_id: str
    recipe: str
    epochs: int | None
    """Epochs the run was asked for (None: its recipe cannot be loaded here to say)."""
    epochs_done: int
    """Epochs trained, decided and applied at its last commit."""
    last_commit: str | None
    status: Literal["finished", "stopped", "unfinished", "not started"]
    """``finished``: every epoch applied and its summary written (``finish_run``); ``stopped``: a
    signal stopped it (``stop`` says why and how to continue); ``unfinished``: neither (it is
    running, or its process died without a word)."""
    run_dir: Path
    stop: StopRecord | None = None
    """Why and where a signal stopped the run, if one did and it has not gone on since."""


def run_info(runs_dir: Path, run_id: str) -> RunInfo:
    """What run ``run_id``'s folder says about it.

    Raises:
        UnknownRunError: no run of that id under ``runs_dir``.
    """
    run_dir = _run_dir(runs_dir, run_id)
    saved = read_spec_file(run_dir)
    epochs: int | None = saved.get("total_epochs", saved.get("epochs"))
    if epochs is None:
        # A run.json written before it recorded ``total_epochs``, without an epochs override: only
        # its recipe knows, and resolving it imports the run layer (torch among it).
        from esper_core.run.spec import RunSpec

        try:
            epochs = RunSpec.load(run_dir).config().epochs
        except ValueError:  # a user's recipe not importable here: the count is unknown, not an error
            epochs = None
    checkpoints = run_dir / CHECKPOINTS_DIR
    latest = CheckpointStore(checkpoints).latest() if checkpoints.exists() else None
    done = epochs_applied(latest)
    stop = read_stop(run_dir)
    status: Literal["finished", "stopped", "unfinished", "not started"] = "unfinished"
    if done == epochs and (run_dir / "summary.json").exists():
        status = "finished"
    elif stop is not None:
        status = "stopped"
    elif latest is None:
        status = "not started"
    return RunInfo(
        run_id=run_id,
        recipe=saved["recipe"],
        epochs=epochs,
        epochs_done=done,
        last_commit=latest,
        status=status,
        run_dir=run_dir,
        stop=stop,
    )


def list_runs(runs_dir: Path) -> list[RunInfo]:
    """Every run under ``runs_dir`` (folders with a ``run.json``), by id."""
    if not runs_dir.exists():
        return []
    return [run_info(runs_dir, d.name) for d in sorted(runs_dir.iterdir()) if (d / SPEC_FILE).exists()]


def verify_run(runs_dir: Path, run_id: str) -> list[CheckpointCheck]:
    """Check every checkpoint of run ``run_id`` against its recorded digest, in commit order.

    Raises:
        UnknownRunError: no run of that id under ``runs_dir``.
    """
    checkpoints = _run_dir(runs_dir, run_id) / CHECKPOINTS_DIR
    if not checkpoints.exists():
        return []
    store = CheckpointStore(checkpoints)
    return [store.verify(tag) for tag in sorted(store.tags(), key=tag_order)]


def set_aside(runs_dir: Path, run_id: str) -> list[Path]:
    """Checkpoints of run ``run_id`` found damaged earlier and kept aside (``checkpoints/damaged/``)."""
    aside = _run_dir(runs_dir, run_id) / CHECKPOINTS_DIR / DAMAGED_DIR
    return sorted(aside.glob("*.pt")) if aside.exists() else []


def _run_dir(runs_dir: Path, run_id: str) -> Path:
    run_dir = runs_dir / run_id
    if not (run_dir / SPEC_FILE).exists():
        raise UnknownRunError(f"no run {run_id!r} under {runs_dir}; list the runs there with `esper runs list`")
    return run_dir
