"""When a failed task is worth Prefect's retry: every retried task's ``retry_condition_fn``.

A retry is for a failure that may pass: a locked or unreachable database, a full or flaky
filesystem, a lost worker or child process. Bad input fails the same way every time (a
``ValueError``: an unknown recipe, an unapproved blueprint, a run whose controller changed since
it started), so a retry only doubles the time to the error and logs it twice; so does a task over
its time limit (``tasks._limits.timed_out``: the same work would run out of time again). Any other
``TimeoutError`` (a network or file system timeout) is transient.
"""

from __future__ import annotations

from prefect import Task
from prefect.client.schemas.objects import State, TaskRun

from tasks._limits import timed_out


def transient(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry condition: retry anything but a ``ValueError`` (bad input fails the same way again)
    or a time limit (``timed_out``: the same work would run out of time again)."""
    del task, task_run
    return not (isinstance(state.result(raise_on_failure=False), ValueError) or timed_out(state))
