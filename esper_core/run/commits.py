"""Names and order of a run's commits: ``start``, then each epoch's ``trained`` and ``applied``.

A retried or resumed task finds where the run stands from the last commit's tag alone, so older
checkpoints can be pruned (``CheckpointConfig``) without losing the way back.
"""

from __future__ import annotations

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


def lost_epochs(kept: str, damaged: str) -> str:
    """In words, what going back from commit ``damaged`` to the older commit ``kept`` undoes.

    ``damaged`` is an epoch's commit (nothing is older than ``start`` to go back to).
    """
    first, last = epochs_applied(kept), int(damaged.split("-")[1])
    epochs = f"epoch {first}" if first == last else f"epochs {first}-{last}"
    return f"{epochs} will be run again from {kept}"
