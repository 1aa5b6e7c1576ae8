"""Safety rails (seed 001 acceptance criteria): deadlines on Tamiyo and Kasmina calls, failed
epoch detection, emergency levels up to a halt.

Budgets apply to the part they name: the Tamiyo deadline covers the controller's decision only,
the Kasmina deadline the application of one command only, the rollback deadline one restore.

A deadline reads the wall clock, so acting on one makes a run's results depend on the machine's
load: on a busy machine a 40-epoch run undid a germination that took 11.95 s against Kasmina's
10 s, and differed from its twin from that epoch on. So by default deadlines are observed only:
every overrun is measured and reported (``tolaria.deadline.*_overrun_total``, a WARNING event),
and nothing changes. ``SafetyConfig.enforce_deadlines`` acts on them (``deadlines.call_with_deadline``
then bounds a decision, an overrun becomes a WAIT or an undone command), and the run's summary says
its results depend on the machine (``RunSummary.reproducible``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class EmergencyLevel(IntEnum):
    """How far the run has escalated; reported as ``tolaria.emergency.level``."""

    NORMAL = 0
    CONSERVATIVE = 1
    """After a timeout or a failed epoch: only WAIT and CULL commands are carried out."""
    ROLLBACK = 2
    """The last epoch failed and was rolled back; training continues from the last commit."""
    HALT = 3
    """Too many consecutive failed epochs: training stops (``TrainingHalted``)."""


class TrainingHalted(RuntimeError):
    """Raised when repeated failed epochs exhaust the emergency budget."""


class EpochFailed(RuntimeError):
    """An epoch produced non-finite or exploding losses; its state must not be committed."""


@dataclass(kw_only=True, slots=True)
class SafetyConfig:
    """Deadlines and failure thresholds."""

    tamiyo_deadline_ms: float = 5_000.0
    """Longest a decision should take; enforced, past it the epoch's command is WAIT (conservative mode)."""
    kasmina_deadline_ms: float = 10_000.0
    """Longest applying one command should take; enforced, past it the command is undone by a rollback."""
    enforce_deadlines: bool = False
    """Act on the Tamiyo and Kasmina deadlines. Off, an overrun is reported and nothing else
    happens, so the run's numbers depend on its recipe and seed only; on, they also depend on the
    machine's load, and the run's summary says so."""
    rollback_deadline_ms: float = 1_000.0
    """Budget of one restore; exceeding it is counted, the restore still completes."""
    loss_spike_ratio: float = 4.0
    """An epoch fails when its validation loss exceeds this multiple of the best so far."""
    max_failed_epochs: int = 3
    """Consecutive failed epochs before the run halts."""
    conservative_epochs: int = 2
    """Epochs of conservative mode after a timeout or failure."""

    def __post_init__(self) -> None:
        for name in ("tamiyo_deadline_ms", "kasmina_deadline_ms", "rollback_deadline_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 ms, got {getattr(self, name)}")
        if self.loss_spike_ratio <= 1.0:
            raise ValueError(f"loss_spike_ratio must be > 1, got {self.loss_spike_ratio}")
        if self.max_failed_epochs < 1 or self.conservative_epochs < 0:
            raise ValueError("max_failed_epochs must be >= 1 and conservative_epochs >= 0")


def epoch_failure(*, train_loss: float, val_loss: float, best_val_loss: float | None, ratio: float) -> str | None:
    """Why an epoch counts as failed, or None when it is healthy."""
    if not math.isfinite(train_loss) or not math.isfinite(val_loss):
        return f"non-finite loss (train {train_loss}, validation {val_loss})"
    if best_val_loss is not None and val_loss > ratio * best_val_loss:
        return f"validation loss {val_loss:.4f} exceeds {ratio}x the best {best_val_loss:.4f}"
    return None


class EmergencyState:
    """Escalation bookkeeping of one run (checkpointed with it)."""

    def __init__(self, config: SafetyConfig) -> None:
        self.config = config
        self.level = EmergencyLevel.NORMAL
        self.failed_epochs = 0
        self.conservative_left = 0

    def on_timeout(self) -> None:
        """A deadline was missed: be conservative for a while."""
        self.conservative_left = self.config.conservative_epochs
        self.level = max(self.level, EmergencyLevel.CONSERVATIVE)

    def on_epoch_failed(self) -> EmergencyLevel:
        """Count a failed epoch; returns the new level (HALT past the budget)."""
        self.failed_epochs += 1
        self.conservative_left = self.config.conservative_epochs
        self.level = (
            EmergencyLevel.HALT if self.failed_epochs >= self.config.max_failed_epochs else EmergencyLevel.ROLLBACK
        )
        return self.level

    def on_epoch_ok(self) -> None:
        """A healthy epoch: reset the failure streak and count down conservative mode."""
        self.failed_epochs = 0
        if self.conservative_left > 0:
            self.conservative_left -= 1
        self.level = EmergencyLevel.CONSERVATIVE if self.conservative_left > 0 else EmergencyLevel.NORMAL

    @property
    def conservative(self) -> bool:
        """True while only safe commands (WAIT, CULL) may be carried out."""
        return self.level >= EmergencyLevel.CONSERVATIVE

    def state_dict(self) -> dict[str, int]:
        """For checkpoints."""
        return {
            "level": int(self.level),
            "failed_epochs": self.failed_epochs,
            "conservative_left": self.conservative_left,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Inverse of ``state_dict``."""
        self.level = EmergencyLevel(state["level"])
        self.failed_epochs = int(state["failed_epochs"])
        self.conservative_left = int(state["conservative_left"])
