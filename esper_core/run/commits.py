"""Names and order of a run's commits: ``start``, then each epoch's ``trained`` and ``applied``.

A retried or resumed task finds where the run stands from the last commit's tag alone, so older
checkpoints can be pruned (``CheckpointConfig``) without losing the way back.
"""

from __future__ import annotations

START_TAG = "start"


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
