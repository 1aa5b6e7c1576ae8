"""Prefect's share of a morphogenesis run: flow wall time minus the time inside Esper's own work.

What counts:

- **flow wall time**: from calling ``morphogenesis()`` to its return, in this process, against a
  Prefect API that is already up. The API is the temporary server Prefect starts for the first
  flow of a process (``esper run``); its start-up (4-8 s here) is a one-off per process that a
  deployment against a long-lived server never pays, so a warm-up flow absorbs it and it is
  reported apart as ``server_startup_s``.
- **Esper's work**: the wall time during which a task body ran (the library calls: compile or
  look up kernels, train, decide, apply, finish, render the plot), measured by wrapping each
  task's function, minus the Prefect calls a task body waits for: its artifact uploads (which
  run on a background thread while the task draws its curves, so what counts is the wait for
  them, ``tasks.artifacts.await_uploads``) and the run logger's records (their Prefect handlers: API log queue and console). Task bodies
  running side by side (the cold run's compiles) count once.
- **Prefect's fixed cost of a flow run** (``prefect_fixed_cost_s``) = wall - work of a warm
  run: creating the flow run and its states (the empty-flow floor, ``empty_flow_s``), the task
  runs (~5 ms and three events each), the wait for the artifact uploads (``artifacts_s``; the
  uploads' own time on their thread is ``artifact_uploads_s``), the log records,
  logging; plus the ``compile_catalog`` subflow on a cold registry only. ``prefect_overhead_share``
  is that cost as a share of the wall. The part that grows with the run is the log records
  (one per epoch): ``prefect_per_epoch_ms``; the task runs do not grow with it, since a ``grow``
  task holds ``ESPER_GROW_TASK_SECONDS`` of epochs.

The flow-run heartbeat is off and clients fetch no CSRF token, as ``esper run`` has it on the
temporary server (``esper_cli.args.local_flow_settings``). ``--heartbeat`` keeps it, as a deployment run does;
Prefect then joins the heartbeat thread when the flow returns, which waits up to 1 s after the
run is already Completed.

Runs use a temporary ``ESPER_HOME``. The first run compiles the kernels (``cold``); the headline
``prefect_overhead_share`` is the median over the following runs, whose kernels are already in
Urza: the steady state of a deployment run again and again, and the least favourable case for
the share, since compilation is Esper's work. Between runs the benchmark waits until the server
has recorded the previous run's task runs: a flow run created while the server's SQLite database
is busy recording them gets a 503 and Prefect's client sleeps ~2 s before retrying, a stall that
back-to-back runs in one process provoke and a user's runs, seconds apart, do not.
``empty_flow_s`` is the same flow machinery with no work at all: the floor of any flow run here.
``run_time_share`` is the same split of the run time Prefect records (Running to Completed, the
duration the UI shows), which leaves out creating the flow run and the heartbeat's join.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

_TASK_MODULES = ("tasks.plan", "tasks.compile", "tasks.train", "tasks.artifacts")
_ARTIFACT_CALLS = ("create_table_artifact", "create_markdown_artifact", "create_image_artifact")
_ARTIFACT_WAIT = "await_uploads"
_PREFECT_SPANS = ("prefect:artifacts", "prefect:logs")


GOAL_FIXED_COST_S = 0.25
"""The team's ceiling on Prefect's fixed cost of one flow run."""
GOAL_PER_EPOCH_MS = 0.5
"""The team's ceiling on Prefect's cost per epoch (the part that grows with the run)."""
GOAL_SHARE = 0.02
"""The team's ceiling on Prefect's share of a default ``mnist1d-cnn`` run (60 epochs)."""
SHARE_RECIPE = "mnist1d-cnn"
"""The recipe whose default run ``GOAL_SHARE`` is about (the benchmark's default recipe)."""


@dataclass(kw_only=True, slots=True)
class OrchestrationConfig:
    """Options of the orchestration benchmark."""

    recipe: str = SHARE_RECIPE
    runs: int = 3
    """Measured runs after the cold one (median reported)."""
    device: str = "cpu"
    heartbeat: bool = False
    """Keep Prefect's flow-run heartbeat, which ``esper run`` switches off on the temporary server."""

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"runs must be >= 1, got {self.runs}")


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: time during which any of them ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class _Clock:
    """Accumulates the time spent inside wrapped callables, per name, and when each call ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # functools.wraps keeps the signature: Prefect binds task parameters by inspecting it.
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.seconds[name] += end - start
                self.calls[name] += 1
                self.intervals[name].append((start, end))

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.intervals.clear()

    def task_spans(self) -> list[tuple[float, float]]:
        return [i for name, spans in self.intervals.items() if name.startswith("task:") for i in spans]

    def prefect_in_tasks_s(self, name: str) -> float:
        """Time in the wrapped Prefect calls ``name`` made inside a task body (not the flow's own)."""
        tasks = self.task_spans()
        inside = [(a, b) for a, b in self.intervals.get(name, []) if any(s <= a and b <= e for s, e in tasks)]
        return covered(inside)

    def work_s(self) -> float:
        """Wall time during which any task body ran, less the Prefect calls inside them.

        A union, not a sum: a cold run compiles on two threads at once, and two tasks working
        side by side do not make the flow's wall time any longer.
        """
        tasks = self.task_spans()
        prefect = [
            (a, b)
            for name in _PREFECT_SPANS
            for a, b in self.intervals.get(name, [])
            if any(s <= a and b <= e for s, e in tasks)
        ]
        return covered(tasks) - covered(prefect)


@contextlib.contextmanager
def _instrumented(clock: _Clock) -> Iterator[None]:
    """Time every task body of the morphogenesis flow, and the artifact API calls inside them."""
    import importlib

    from prefect import Task
    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    patched: list[tuple[Any, str, Any]] = []
    # A log record costs Prefect a model, a queue entry (sent in batches by a thread) and a line.
    for handler in (APILogHandler, PrefectConsoleHandler):
        patched.append((handler, "emit", handler.emit))
        handler.emit = clock.wrap("prefect:logs", handler.emit)
    for module_name in _TASK_MODULES:
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, Task):
                patched.append((value, "fn", value.fn))
                value.fn = clock.wrap(f"task:{value.name}", value.fn)
        if module_name == "tasks.artifacts":
            # The task waits in await_uploads; the API calls themselves run beside its work.
            patched.append((module, _ARTIFACT_WAIT, getattr(module, _ARTIFACT_WAIT)))
            setattr(module, _ARTIFACT_WAIT, clock.wrap("prefect:artifacts", getattr(module, _ARTIFACT_WAIT)))
            for call in _ARTIFACT_CALLS:
                patched.append((module, call, getattr(module, call)))
                setattr(module, call, clock.wrap("prefect:artifact-uploads", getattr(module, call)))
    try:
        yield
    finally:
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)


def _settle(flow_run_id: Any, tasks: int, timeout_s: float = 30.0) -> float:
    """Wait until the server has recorded ``tasks`` task runs of ``flow_run_id`` (from their events).

    Returns:
        The flow run's run time as Prefect records it (Running to Completed; what the UI shows).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if len(runs) >= tasks and all(r.state is not None and r.state.is_final() for r in runs):
                break
            time.sleep(0.1)
        return client.read_flow_run(flow_run_id).total_run_time.total_seconds()


def _measure(clock: _Clock, flow: Callable[..., Any], config: OrchestrationConfig) -> dict[str, Any]:
    clock.reset()
    start = time.perf_counter()
    state = flow(recipe=config.recipe, device=config.device, return_state=True)
    wall = time.perf_counter() - start
    summary = state.result()  # a failed run raises here rather than being timed as a fast one
    work = clock.work_s()
    tasks = sum(n for name, n in clock.calls.items() if name.startswith("task:"))
    run_time = _settle(state.state_details.flow_run_id, tasks)
    return {
        "run_time_s": run_time,
        "run_time_share": (run_time - work) / run_time,
        "wall_s": wall,
        "esper_work_s": work,
        "overhead_s": wall - work,
        "share": (wall - work) / wall,
        "tasks": tasks,
        "epochs": summary.epochs,
        "artifacts_s": clock.prefect_in_tasks_s("prefect:artifacts"),
        "artifact_uploads_s": covered(clock.intervals.get("prefect:artifact-uploads", [])),
        "logs_s": clock.prefect_in_tasks_s("prefect:logs"),
        "work_by_task_s": {k.removeprefix("task:"): round(v, 4) for k, v in sorted(clock.seconds.items())},
    }


def run(config: OrchestrationConfig) -> dict[str, Any]:
    """Run the benchmark; returns the headline numbers and the per-run details."""
    with tempfile.TemporaryDirectory(prefix="esper-orchestration-") as home, _env(ESPER_HOME=home):
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        from prefect import flow
        from prefect.settings import (
            PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
            get_current_settings,
            temporary_settings,
        )

        from flows.morphogenesis import morphogenesis

        @flow(name="orchestration-empty")
        def empty() -> None:
            """No work: the first call brings up the temporary API server, later ones time the floor."""

        start = time.perf_counter()
        empty()
        startup = time.perf_counter() - start
        clock = _Clock()
        # As `esper run` has them (esper_cli.args.local_flow_settings): no CSRF token fetch on a
        # temporary server that does not check them, and no heartbeat unless asked for (it can
        # only be switched off in-process: its setting takes None, not "").
        updates: dict[Any, Any] = {}
        if not get_current_settings().server.api.csrf_protection_enabled:
            updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
        if not config.heartbeat:
            updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
        with _instrumented(clock), temporary_settings(updates=updates):
            frequency = get_current_settings().flows.heartbeat_frequency
            floor = []
            for _ in range(3):
                start = time.perf_counter()
                empty()
                floor.append(time.perf_counter() - start)
            cold = _measure(clock, morphogenesis, config)
            warm = [_measure(clock, morphogenesis, config) for _ in range(config.runs)]
        median = statistics.median(r["share"] for r in warm)
        typical = min(warm, key=lambda r: abs(r["share"] - median))
        return {
            "workload": config.recipe,
            "device": config.device,
            "prefect_fixed_cost_s": round(statistics.median(r["overhead_s"] for r in warm), 3),
            "goal_fixed_cost_s": GOAL_FIXED_COST_S,
            "prefect_overhead_share": round(median, 4),
            "goal_share": GOAL_SHARE,
            "prefect_per_epoch_ms": round(1e3 * typical["logs_s"] / max(typical["epochs"], 1), 3),
            "goal_per_epoch_ms": GOAL_PER_EPOCH_MS,
            "goal_share_recipe": SHARE_RECIPE,
            "wall_s": round(typical["wall_s"], 3),
            "esper_work_s": round(typical["esper_work_s"], 3),
            "overhead_s": round(typical["overhead_s"], 3),
            "artifacts_s": round(typical["artifacts_s"], 3),
            "artifact_uploads_s": round(typical["artifact_uploads_s"], 3),
            "logs_s": round(typical["logs_s"], 4),
            "epochs": typical["epochs"],
            "tasks": typical["tasks"],
            "overhead_per_task_ms": round(1e3 * typical["overhead_s"] / typical["tasks"], 2),
            "empty_flow_s": round(statistics.median(floor), 3),
            "shares": [round(r["share"], 4) for r in warm],
            "run_time_s": round(typical["run_time_s"], 3),
            "run_time_share": round(statistics.median(r["run_time_share"] for r in warm), 4),
            "cold_registry_share": round(cold["share"], 4),
            "cold_registry_wall_s": round(cold["wall_s"], 3),
            "cold_registry_work_by_task_s": cold["work_by_task_s"],
            "server_startup_s": round(startup, 3),
            "heartbeat_frequency_s": frequency,
            "work_by_task_s": typical["work_by_task_s"],
        }
