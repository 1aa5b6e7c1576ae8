"""One epoch of a run as the flow runs it: train, commit, decide, apply, commit.

The single-process ``grow`` task and every rank of a data-parallel run step through these, so
a run's epochs are committed the same way however they are executed.
"""

from __future__ import annotations

from dataclasses import dataclass

from esper_core.contracts import SystemStatePacket
from esper_core.run.commits import START_TAG, epoch_tag
from esper_core.run.session import Run


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochReport:
    """Headline numbers of one epoch and the command that followed it."""

    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    train_ms: float
    seeds: dict[str, str]
    action: str
    outcome: str


def before(epoch: int) -> str:
    """The commit epoch ``epoch`` starts from."""
    return START_TAG if epoch == 0 else epoch_tag(epoch - 1, "applied")


def trained(session: Run, epoch: int) -> SystemStatePacket:
    """Epoch ``epoch`` trained and committed as ``trained``.

    An epoch already committed (by an execution that died before its decision was applied) is
    restored, not trained again, so its telemetry and field reports are not written twice.
    Single process only: it reads the run's latest commit on disk, which rank 0 of a
    data-parallel run may have moved on while another rank reads it (ranks resume through
    ``Run.rewind_partial_epoch`` instead).
    """
    tag = epoch_tag(epoch, "trained")
    if session.checkpoints.latest() == tag:
        session.ensure_at(tag)
        return session.history[-1]
    session.ensure_at(before(epoch))
    packet = session.train_epoch()
    session.commit(tag)
    return packet


def decide_and_apply(session: Run, packet: SystemStatePacket) -> EpochReport:
    """Ask Tamiyo about the trained epoch ``packet``, have Kasmina apply her command, commit."""
    command = session.decide()
    outcome = session.apply(command)
    session.commit(epoch_tag(packet.epoch, "applied"))
    return EpochReport(
        epoch=packet.epoch,
        train_loss=packet.train_loss,
        val_loss=packet.val_loss,
        val_accuracy=packet.val_accuracy,
        train_ms=packet.epoch_latency_ms,
        seeds={s.slot_id: s.stage.value for s in packet.seeds},
        action=command.action,
        outcome=outcome,
    )


def grow_epoch(session: Run, epoch: int) -> EpochReport:
    """Train epoch ``epoch``, ask Tamiyo, have Kasmina apply her command; commit after each half."""
    return decide_and_apply(session, trained(session, epoch))
