"""Tolaria, Tamiyo and Kasmina tasks of a morphogenesis run.

Every task takes the run's ``RunHandle`` and the epoch it works on, and first brings the live
session to the commit that step starts from; a retry therefore restores and reproduces the
original exactly. Training is never cached (``NO_CACHE``): an epoch is a side effect on the run.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.contracts import AdaptationCommand
from esper_core.reports import RunSummary, finish_run
from esper_core.session import START_TAG, RunHandle, RunSession, epoch_tag
from tasks._runtime import forget, prometheus, remember, session_for, settings


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStart:
    """Where a (new or resumed) run stands."""

    handle: RunHandle
    epochs: int
    next_epoch: int


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochReport:
    """Headline numbers of one trained epoch."""

    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    train_ms: float
    seeds: dict[str, str]


def _before(epoch: int) -> str:
    return START_TAG if epoch == 0 else epoch_tag(epoch - 1, "applied")


@task(name="start-run", retries=1, cache_policy=NO_CACHE, tags=["tolaria"])
def start_run(recipe: str, epochs: int | None, device: str, seed: int | None, run_id: str | None) -> RunStart:
    """Create the run (or reopen ``run_id``) and report which epoch comes next."""
    session = RunSession.create(
        recipe=recipe,
        settings=settings(),
        epochs=epochs,
        device=device,
        seed=seed,
        run_id=run_id,
        extra_sink=prometheus(),
    )
    remember(session)
    # A run reopened after an 'applied' commit resumes at the following epoch.
    return RunStart(handle=session.handle, epochs=session.config.epochs, next_epoch=session.epoch)


@task(name="train-epoch", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE, tags=["tolaria"])
def train_epoch(handle: RunHandle, epoch: int) -> EpochReport:
    """Train epoch ``epoch`` from the commit before it, then commit it."""
    session = session_for(handle)
    session.ensure_at(_before(epoch))
    packet = session.train_epoch()
    session.commit(epoch_tag(epoch, "trained"))
    return EpochReport(
        epoch=packet.epoch,
        train_loss=packet.train_loss,
        val_loss=packet.val_loss,
        val_accuracy=packet.val_accuracy,
        train_ms=packet.epoch_latency_ms,
        seeds={s.slot_id: s.stage.value for s in packet.seeds},
    )


@task(name="evaluate-epoch", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE, tags=["tamiyo"])
def evaluate_epoch(handle: RunHandle, epoch: int) -> AdaptationCommand:
    """Tamiyo's decision on the state after epoch ``epoch``."""
    session = session_for(handle)
    session.ensure_at(epoch_tag(epoch, "trained"))
    return session.decide()


@task(name="apply-command", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE, tags=["kasmina"])
def apply_command(handle: RunHandle, epoch: int, command: AdaptationCommand) -> str:
    """Carry out Tamiyo's command and commit the result."""
    session = session_for(handle)
    session.ensure_at(epoch_tag(epoch, "trained"))
    outcome = session.apply(command)
    session.commit(epoch_tag(epoch, "applied"))
    return outcome


@task(name="finish-run", retries=1, cache_policy=NO_CACHE, tags=["tolaria"])
def finish(handle: RunHandle) -> RunSummary:
    """Test accuracy, summary, baseline and report; closes the live session."""
    session = session_for(handle)
    session.ensure_at(session.checkpoints.latest() or START_TAG)
    summary = finish_run(session)
    forget(handle)
    return summary
