"""Tolaria, Tamiyo and Kasmina tasks of a morphogenesis run.

Every task takes the run's ``RunHandle`` and first brings the live session to the commit its
work starts from; a retry therefore restores and reproduces the original exactly. Training is
never cached (``NO_CACHE``): an epoch is a side effect on the run.

Granularity: one ``grow`` task runs whole epochs (train, decide, apply, each committed) until it
has worked ``task_seconds``, then hands back to the flow. Prefect costs ~5 ms and three events a
task run here (``esper bench orchestration``), so a task per step on a 50 ms epoch would spend a
quarter of the run on orchestration, while a long epoch still gets a task of its own. Commits stay
per epoch: how epochs are grouped into tasks never changes what a retry or a resume restores.

No tags: Prefect 3.8 makes one concurrency-slot API call for every run of a task that has tags
(limits or not), which cost 0.4-0.9 s a task against the temporary server on our 2 busy cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run

from esper_core._capabilities import resolve_device
from esper_core.interrupts import noted_interrupts
from esper_core.pipeline import find_published
from esper_core.run.commits import START_TAG, epochs_applied
from esper_core.run.ranks import launch, record_launch
from esper_core.run.reports import RunSummary, finish_run
from esper_core.run.scores import describe, token_targets
from esper_core.run.session import Run, RunHandle
from esper_core.run.spec import PlannedRun, RunSpec
from esper_core.run.steps import EpochReport, grow_epoch
from esper_core.run.stops import record_stop
from esper_core.tolaria.safety import TrainingHalted
from esper_core.urza.service import Urza
from tasks._limits import TimeLimitExceeded, limited, time_limit, timeout_message
from tasks._retry import transient
from tasks._runtime import forget, prometheus, remember, run_sink, session_for, settings


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStart:
    """Where a (new or resumed) run stands."""

    handle: RunHandle
    epochs: int
    next_epoch: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Growth:
    """What one ``grow`` task did: the epochs it completed and where the run goes on."""

    epochs: tuple[EpochReport, ...]
    next_epoch: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """A finished run: its summary and one row per epoch for the artifacts."""

    summary: RunSummary
    history: list[dict[str, Any]]


def flow_run_id_default() -> str | None:
    """The run id of the Prefect flow run this task belongs to: ``<flow run name>-<id[:8]>``.

    E.g. ``crimson-tortoise-3fa2b1c4``, the name the UI shows. Stable across re-executions of
    the same flow run (a retry, or a rescheduled run whose worker died), so such a re-execution
    reopens the run and resumes from its last committed epoch instead of starting over.
    ``None`` outside a flow run.
    """
    run_uuid = flow_run.get_id()
    if run_uuid is None:
        return None
    return f"{flow_run.get_name()}-{str(run_uuid).replace('-', '')[:8]}"


@contextlib.contextmanager
def stop_recorded(run_id: str | None) -> Iterator[None]:
    """Within the block, a stop by signal is written into run ``run_id``'s folder (``stopped.json``).

    SIGTERM reaches a flow run as Prefect's ``TerminationSignal`` (Cancel in the UI, a worker or
    ``esper server`` stopping) and ``esper run`` turns it and Ctrl-C into ``KeyboardInterrupt``;
    either unwinds from wherever training was, the run's last commit intact (commits hold the
    signal until they are complete: ``esper_core.interrupts``). The record names the commands
    that continue the run; the exception goes on, so Prefect ends the flow run as it would.
    """
    resume: list[str] = []
    sigterm = "SIGTERM to `esper run`"
    if run_id is not None:
        resume.append(f"esper run --run-id {run_id}")
        # Read now, not while a signal unwinds: the context has it without an API call.
        context = FlowRunContext.get()
        if context is not None and context.flow_run is not None and context.flow_run.deployment_id is not None:
            resume.append(f"prefect flow-run retry {context.flow_run.id}")
            sigterm = "SIGTERM to the flow run (Cancel in the Prefect UI, or its worker or server stopping)"

    recorded: list[str] = []

    def record(reason: str) -> None:
        if run_id is not None:
            record_stop(settings().runs_dir / run_id, reason=reason, resume=tuple(resume))
        recorded.append(reason)

    # Written when the signal arrives: the process may be killed before it unwinds (CI saw a
    # server's SIGTERM leave no record). The signal also names the stop better than the
    # exception, which `esper run` makes a KeyboardInterrupt for SIGTERM too.
    with noted_interrupts(lambda signum: record("Ctrl-C" if signum == signal.SIGINT else sigterm)):
        try:
            yield
        except (KeyboardInterrupt, TerminationSignal) as stop:
            if not recorded:  # raised without a signal this block saw
                record("Ctrl-C" if isinstance(stop, KeyboardInterrupt) else sigterm)
            raise


# NO_CACHE: the registry changes under us (another worker may publish or retire kernels).
# Retried on a transient failure (a locked or unreachable registry), not on bad input (``transient``).
@task(name="kernels-ready", retries=1, retry_condition_fn=transient, cache_policy=NO_CACHE)
def kernels_ready(spec: RunSpec) -> bool:
    """Whether Urza holds an active kernel here for every job of ``spec``: each (blueprint, slot
    profile) the session may germinate, the recipe's approved blueprints included.

    When it does, the morphogenesis flow skips its ``compile_catalog`` subflow, which would only
    confirm what is published at the cost of a whole flow run (~1-5 s of Prefect overhead here).
    """
    s = settings()
    urza = Urza.open(s.home, s.registry_db_url)
    try:
        return all(find_published(urza, job, resolve_device(spec.device)) is not None for job in spec.jobs)
    finally:
        urza.close()


# Retried on a transient failure, not on bad input (``transient``): a run whose controller changed
# since it started (``check_same_controller``) or a configuration refused would be refused again.
@task(name="start-run", retries=1, retry_condition_fn=transient, cache_policy=NO_CACHE)
def start_run(planned: PlannedRun) -> RunStart:
    """Create the run from ``planned`` (or reopen it) and report which epoch comes next.

    Without ``planned.spec.run_id`` the run is named after the flow run (``flow_run_id_default``),
    so a flow run executed again after a crash continues its own run.
    """
    spec = planned.spec
    run_id = spec.run_id or flow_run_id_default()
    session = Run.start(spec, settings=settings(), run_id=run_id, extra_sink=prometheus(), planned=planned)
    remember(session)
    record_launch(session, nproc=1, backend="none", pids=[os.getpid()])
    if session.epoch > 0:
        get_run_logger().info(
            "resuming run %s at epoch %d (last commit %s)", session.run_id, session.epoch, session.committed_tag
        )
    # A run reopened after an 'applied' commit resumes at the following epoch.
    return RunStart(handle=session.handle, epochs=session.config.epochs, next_epoch=session.epoch)


def _retry_unless_halted(task: Task, task_run: TaskRun, state: State) -> bool:
    # A halt is the run's own verdict after repeated failed epochs: a retry would repeat it. Nor
    # is bad input or a timeout retried (``transient``): a retry restores and reproduces the run
    # exactly, so it would fail the same way (a resume refused, a recipe refused by the ranks).
    return transient(task, task_run, state) and not isinstance(state.result(raise_on_failure=False), TrainingHalted)


@task(
    name="grow",
    task_run_name="grow-from-epoch-{first}",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_halted,
    cache_policy=NO_CACHE,
    # The live session stays in this process, so no child process: Prefect's signal on the main
    # thread, and the check between epochs below, which holds even when that signal is lost.
    timeout_seconds=time_limit("train"),
    **limited("train"),
)
def grow(handle: RunHandle, first: int, stop: int, task_seconds: float) -> Growth:
    """Run epochs ``first``, ``first + 1``, ... before ``stop`` until this task has worked ``task_seconds``.

    Each epoch trains, decides and applies, with a commit after training and after applying. A
    retry starts again at ``first``: epochs already applied are skipped, a trained one resumes at
    its decision, so nothing is trained twice.
    """
    log = get_run_logger()
    session = session_for(handle)
    start = time.perf_counter()
    reports = []
    tokens = token_targets(session.trainer.data)
    epoch = first
    # Epochs an earlier attempt of this task already applied are skipped (the last commit says
    # how far the run got; older checkpoints may have been pruned).
    epoch = max(epoch, epochs_applied(session.checkpoints.latest()))
    while epoch < stop:
        report = grow_epoch(session, epoch)
        reports.append(report)
        # A Prefect log record costs ~0.7 ms (API queue and console): one per epoch that changed
        # something, and one summary per task, keep Prefect's per-epoch share under 0.5 ms.
        if report.action != "wait" or not report.outcome.startswith("applied"):
            log.info(
                "epoch %d: train loss %.4f, %s; %s (%s); seeds %s",
                report.epoch,
                report.train_loss,
                describe("val", loss=report.val_loss, accuracy=report.val_accuracy, tokens=tokens),
                report.action,
                report.outcome,
                report.seeds,
            )
        epoch += 1
        elapsed = time.perf_counter() - start
        # Prefect's own limit interrupts with SIGALRM, which it may defer while one of its shielded
        # calls (the log line above) runs, and then lose: checking between epochs as well makes
        # the limit hold whatever the timing. Everything up to here is committed.
        limit = grow.timeout_seconds
        if limit is not None and elapsed > limit and epoch < stop:
            raise TimeLimitExceeded(timeout_message("grow", limit, "train"))
        if elapsed >= task_seconds:
            break
    if reports:
        last = reports[-1]
        log.info(
            "epochs %d-%d in %.1f s: train loss %.4f, %s; seeds %s",
            reports[0].epoch,
            last.epoch,
            time.perf_counter() - start,
            last.train_loss,
            describe("val", loss=last.val_loss, accuracy=last.val_accuracy, tokens=tokens),
            last.seeds,
        )
    return Growth(epochs=tuple(reports), next_epoch=epoch)


@task(
    name="grow-parallel",
    retries=2,
    retry_delay_seconds=1,
    retry_condition_fn=_retry_unless_halted,
    cache_policy=NO_CACHE,
    # Prefect's signal interrupts the wait for the ranks, and the launch stops them.
    timeout_seconds=time_limit("train"),
    **limited("train"),
)
def grow_parallel(planned: PlannedRun) -> RunHandle:
    """Train the whole run on ``spec.nproc`` data-parallel processes (``esper_core.run.ranks``).

    Without ``spec.run_id`` the run is named after the flow run, as ``start_run`` names it. A retry
    (a rank died, the machine ran out of memory) launches the ranks again, and they resume from the
    run's last commit; so does a later ``esper run --run-id ... --nproc N`` with any N.
    """
    spec = planned.spec
    run_id = spec.run_id or flow_run_id_default()
    if run_id is None:
        raise ValueError("grow_parallel runs inside the morphogenesis flow, or needs a spec with a run_id")
    get_run_logger().info("training run %s on %d data-parallel processes", run_id, spec.nproc)
    return launch(dataclasses.replace(spec, run_id=run_id), settings(), sink_factory=run_sink, planned=planned)


def history_rows(session: Run) -> list[dict[str, Any]]:
    """One row per committed epoch (all of them, also those before a resume): curves, command, seeds."""
    commands = {c.epoch: c for c in session.commands}
    rows = []
    for packet in session.history:
        command = commands.get(packet.epoch)
        rows.append(
            {
                "epoch": packet.epoch,
                "train_loss": round(packet.train_loss, 4),
                "val_loss": round(packet.val_loss, 4),
                "val_accuracy": round(packet.val_accuracy, 4),
                "action": command.action if command is not None else "",
                "slot": (command.slot_id or "") if command is not None else "",
                "blueprint": (command.blueprint_id or "") if command is not None else "",
                "seeds": {s.slot_id: s.stage.value for s in packet.seeds},
            }
        )
    return rows


# Retried on a transient failure, not on bad input (``transient``).
@task(name="finish-run", retries=1, retry_condition_fn=transient, cache_policy=NO_CACHE)
def finish(handle: RunHandle) -> RunResult:
    """Test accuracy, summary, baseline, report and the per-epoch history; closes the live session."""
    session = session_for(handle)
    session.ensure_at(session.checkpoints.latest() or START_TAG)
    history = history_rows(session)
    summary = finish_run(session)
    forget(handle)
    return RunResult(summary=summary, history=history)
