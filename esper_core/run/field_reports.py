"""Field reports: the outcome of a command, judged a fixed number of epochs after it was applied."""

from __future__ import annotations

from collections.abc import Sequence

from esper_core.contracts import AdaptationCommand, FieldReport, Outcome, SystemStatePacket
from esper_core.simic.records import report_id_for

FIELD_REPORT_WINDOW = 2
"""Epochs after a command before its outcome is judged."""
_NEUTRAL_BAND = 0.005
"""Relative validation-loss change inside which an outcome counts as neutral."""

Pending = tuple[AdaptationCommand, float, float]
"""An applied command with the validation loss and accuracy before it."""


def _total_params(packet: SystemStatePacket) -> int:
    return packet.host_params + sum(s.param_count for s in packet.seeds if s.stage.is_active)


def judge_pending(
    pending: Sequence[Pending], packet: SystemStatePacket, history: Sequence[SystemStatePacket], *, run_id: str
) -> tuple[list[FieldReport], list[Pending]]:
    """Reports for the commands whose window closed at ``packet``, and the commands still waiting.

    Args:
        pending: Applied commands not judged yet.
        packet: The epoch just trained.
        history: Every packet of the run (the one of each command's epoch gives the deltas).
        run_id: The run.
    """
    reports, keep = [], []
    for command, loss0, acc0 in pending:
        waited = packet.epoch - command.epoch
        if waited < FIELD_REPORT_WINDOW:
            keep.append((command, loss0, acc0))
            continue
        rel = (packet.val_loss - loss0) / max(loss0, 1e-12)
        outcome = Outcome.NEUTRAL if abs(rel) <= _NEUTRAL_BAND else (Outcome.SUCCESS if rel < 0 else Outcome.REGRESSION)
        deltas = {"val_loss": packet.val_loss - loss0, "val_accuracy": packet.val_accuracy - acc0}
        before = next((p for p in history if p.epoch == command.epoch), None)
        if before is not None:
            deltas["train_loss"] = packet.train_loss - before.train_loss
            deltas["params"] = float(_total_params(packet) - _total_params(before))
        reports.append(
            FieldReport(
                # Derived from the command: re-judging it after a retry gives the same report id.
                report_id=report_id_for(command),
                run_id=run_id,
                command=command,
                outcome=outcome,
                observation_epochs=waited,
                metric_deltas=deltas,
            )
        )
    return reports, keep
