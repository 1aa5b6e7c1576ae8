"""Names and order of a run's commits: ``start``, then each epoch's ``trained`` and ``applied``.

A retried or resumed task finds where the run stands from the last commit's tag alone, so older
checkpoints can be pruned (``CheckpointConfig``) without losing the way back. A damaged
checkpoint is set aside and the run falls back to the commit before it (``fall_back``).
"""

from __future__ import annotations

import logging

from esper_core.tolaria.checkpoint import CheckpointCorruptError, CheckpointStore

log = logging.getLogger(__name__)

START_TAG = "start"

CHECKPOINTS_DIR = "checkpoints"
"""The folder of a run's commits inside its run folder."""


def epoch_tag(epoch: int, phase: str) -> str:
    """Checkpoint tag of ``phase`` (``trained`` / ``applied``) of ``epoch``."""
    return f"epoch-{epoch:04d}-{phase}"


_PHASES = ("trained", "applied")


def tag_order(tag: str) -> int:
    """Position of a commit in a run: ``start`` first, then each epoch's trained and applied."""
    if tag == START_TAG:
        return -1
    _, epoch, phase = tag.split("-")
    return 2 * int(epoch) + _PHASES.index(phase)


def epochs_applied(tag: str | None) -> int:
    """How many epochs are fully done (trained, decided, applied) at commit ``tag``."""
    return 0 if tag is None else (tag_order(tag) + 1) // 2


def fall_back(checkpoints: CheckpointStore, damaged: CheckpointCorruptError, *, run_id: str) -> str:
    """Set a damaged checkpoint aside and make the newest commit before it the run's last.

    That commit's own bytes are checked when it is loaded (a restore goes on falling back).

    Returns:
        The commit to go on from.

    Raises:
        CheckpointCorruptError: no commit before the damaged one is left.
    """
    aside = checkpoints.set_aside(damaged.tag)
    older = [t for t in checkpoints.tags() if tag_order(t) < tag_order(damaged.tag)]
    if not older:
        raise CheckpointCorruptError(
            tag=damaged.tag,
            path=aside,
            problem=f"{damaged.problem}. It is kept there, and run {run_id} has no older commit left "
            "to go back to: start the run again under a new id",
        ) from damaged
    kept = max(older, key=tag_order)
    checkpoints.point_latest(kept)
    log.warning(
        "run %s: checkpoint %s is damaged (%s); kept at %s. Going back to commit %s: %s "
        "(a run is deterministic given its commit)",
        run_id,
        damaged.path.name,
        damaged.problem,
        aside,
        kept,
        lost_epochs(kept, damaged.tag),
    )
    return kept


def lost_epochs(kept: str, damaged: str) -> str:
    """In words, what going back from commit ``damaged`` to the older commit ``kept`` undoes.

    ``damaged`` is an epoch's commit (nothing is older than ``start`` to go back to).
    """
    first, last = epochs_applied(kept), int(damaged.split("-")[1])
    epochs = f"epoch {first}" if first == last else f"epochs {first}-{last}"
    return f"{epochs} will be run again from {kept}"
