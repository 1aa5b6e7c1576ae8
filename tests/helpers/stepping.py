"""A run driven epoch by epoch the way the morphogenesis flow drives it, and stopped on request."""

from __future__ import annotations

from esper_core.run.commits import epoch_tag
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec
from esper_core.settings import EsperSettings


def flow_epoch(session: Run) -> str:
    """One epoch as the flow runs it: train, commit, decide, apply, commit. Returns the outcome."""
    epoch = session.epoch
    session.train_epoch()
    session.commit(epoch_tag(epoch, "trained"))
    command = session.decide()
    outcome = session.apply(command)
    session.commit(epoch_tag(epoch, "applied"))
    return f"{command.seed_operation or command.command_type}: {outcome}"


def run_to_the_end(settings: EsperSettings, run_id: str, *, recipe: str, stop_after: int | None = None) -> Run:
    """Run ``recipe`` to its last epoch; with ``stop_after``, close the run after that epoch's
    commit and go on in a new ``Run`` from the run folder (a kill and resume). Returns the open run."""
    session = Run.start(RunSpec(recipe=recipe, device="cpu", run_id=run_id), settings=settings)
    while session.epoch < session.config.epochs:
        flow_epoch(session)
        if stop_after is not None and session.epoch == stop_after + 1:
            session.close()
            session = Run.start(RunSpec(recipe=recipe, device="cpu", run_id=run_id), settings=settings)
            stop_after = None
    return session
