"""Time limits of the long-running tasks (compile, benchmark, training) and what a timeout says.

Each limit is read from ``EsperSettings``, i.e. from the flow-run process's environment: set
``ESPER_COMPILE_TIMEOUT_S``, ``ESPER_BENCH_TIMEOUT_S`` or ``ESPER_TRAIN_TIMEOUT_S`` in the
worker's environment. A task over its limit fails (it is not retried, ``tasks._retry``: the same
work would run out of time again) and logs which setting to raise.

A limit must stop the work, wherever it runs:
- Compiles, benchmark cases and Simic's steps run in a child process (``in_child``) that is
  killed, with its own children, when the limit passes. Compiles and benchmark cases are mapped
  onto the task runner's threads, where Prefect's ``timeout_seconds`` cannot interrupt anything
  (it only warns, once per task run, that it will not bite), so these tasks have none.
- ``grow`` keeps the run's live session in its process, so it stays in the flow's process: it
  checks the limit between epochs (everything up to there is committed) and has Prefect's
  ``timeout_seconds`` as well, which interrupts a long epoch with a signal on the main thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from prefect import Task, get_run_logger
from prefect.client.schemas.objects import State, TaskRun
from prefect.task_engine import TaskRunTimeoutError

from esper_core.child import ChildTimeoutError, run_in_child
from esper_core.settings import EsperSettings

LimitKind = Literal["compile", "bench", "train"]

_SETTINGS: dict[str, str] = {"compile": "compile_timeout_s", "bench": "bench_timeout_s", "train": "train_timeout_s"}


def setting_name(kind: LimitKind) -> str:
    """The environment variable that sets the limit of ``kind`` tasks, e.g. ``ESPER_COMPILE_TIMEOUT_S``."""
    return "ESPER_" + _SETTINGS[kind].upper()


def time_limit(kind: LimitKind) -> float:
    """The configured limit of ``kind`` tasks in seconds."""
    return float(getattr(EsperSettings(), _SETTINGS[kind]))


class TimeLimitExceeded(TimeoutError):
    """A task ran past its time limit, found by its own check (``grow`` checks between epochs)."""


def timed_out(state: State) -> bool:
    """Whether a failed task state is a time limit's: Prefect's (``TaskRunTimeoutError``), a child
    process's (``ChildTimeoutError``) or a task's own check (``TimeLimitExceeded``). Not any
    ``TimeoutError``: a network or file system timeout (``OSError(ETIMEDOUT)`` is one) may pass."""
    return isinstance(state.result(raise_on_failure=False), TaskRunTimeoutError | ChildTimeoutError | TimeLimitExceeded)


def timeout_message(task_name: str, limit_s: float, kind: LimitKind) -> str:
    """What a task over its limit reports: the task, the limit and the setting that raises it."""
    return (
        f"task {task_name!r} ran past its time limit of {limit_s:g} s and was stopped; if this work "
        f"needs longer, raise {setting_name(kind)} (seconds) in the worker's environment"
    )


def explain_timeout(kind: LimitKind) -> Callable[[Task, TaskRun, State], None]:
    """An ``on_failure`` hook that logs ``timeout_message`` to the task run when it timed out."""

    def hook(task: Task, task_run: TaskRun, state: State) -> None:
        del task_run
        if timed_out(state):
            get_run_logger().error(timeout_message(task.name, task.timeout_seconds or time_limit(kind), kind))

    return hook


def limited(kind: LimitKind) -> dict[str, Any]:
    """The ``@task`` options of a ``kind`` task: the hook that explains a timeout.

    No Prefect ``timeout_seconds``: the task's work runs in ``in_child``, which the limit stops.
    (``grow`` adds Prefect's timeout itself and checks the limit between epochs.)
    """
    return {"on_failure": [explain_timeout(kind)]}


def in_child(kind: LimitKind, target: str, /, *args: Any, threads: int | None = None, reuse: bool = False) -> Any:  # noqa: ANN401 - whatever target returns
    """Run ``target(*args)`` (``module:function``) in a child process stopped at the ``kind`` limit,
    on ``threads`` torch threads, in a reused child if ``reuse`` (``run_in_child``).

    Raises:
        TimeoutError: The limit passed; the child and its children were killed.
    """
    return run_in_child(target, *args, limit_s=time_limit(kind), threads=threads, reuse=reuse)
