"""Which failures Prefect retries: transient ones, never bad input, a timeout or a halted run."""

from __future__ import annotations

import errno
import importlib
import pkgutil

from prefect import Task
from prefect.states import Failed
from prefect.task_engine import TaskRunTimeoutError

import tasks
from esper_core.child import ChildTimeoutError
from esper_core.tolaria.safety import TrainingHalted
from tasks._limits import TimeLimitExceeded
from tasks._retry import transient
from tasks.train import _retry_unless_halted, start_run


def test_halt_is_final_other_failures_retry() -> None:
    assert _retry_unless_halted(None, None, Failed(data=TrainingHalted("halted after 3 failed epochs"))) is False
    assert _retry_unless_halted(None, None, Failed(data=RuntimeError("worker lost"))) is True


def test_a_timed_out_task_is_not_retried() -> None:
    # The same work would run out of time again; a transient failure is still retried, a network
    # or file system timeout among them (Python raises OSError(ETIMEDOUT) as a TimeoutError).
    limits = (
        TaskRunTimeoutError("Scope timed out after 1 second(s)."),
        ChildTimeoutError("ran past its time limit"),
        TimeLimitExceeded("task 'grow' ran past its time limit"),
    )
    for condition in (_retry_unless_halted, transient):
        for error in limits:
            assert condition(None, None, Failed(data=error)) is False, error
        assert condition(None, None, Failed(data=OSError("database is locked"))) is True
        network = OSError(errno.ETIMEDOUT, "Connection timed out")
        assert isinstance(network, TimeoutError)
        assert condition(None, None, Failed(data=network)) is True


def _retried_tasks() -> dict[str, Task]:
    found: dict[str, Task] = {}
    for module in pkgutil.iter_modules(tasks.__path__, "tasks."):
        for value in vars(importlib.import_module(module.name)).values():
            if isinstance(value, Task) and value.retries:
                found[value.name] = value
    return found


def test_no_retried_task_retries_bad_input() -> None:
    # Bad input (a ValueError: a refused recipe, a resume whose controller changed) fails the same
    # way again: a retry would only double the time to the error and log it twice.
    retried = _retried_tasks()
    assert {"start-run", "kernels-ready", "finish-run", "grow", "grow-parallel", "publish-artifact"} <= set(retried)
    assert retried["start-run"] is start_run
    bad_input = Failed(data=ValueError("run older was decided by heuristic=..., but its recipe now resolves to ..."))
    for name, task in sorted(retried.items()):
        condition = task.retry_condition_fn
        assert condition is not None, f"task {name!r} retries every failure: give it retry_condition_fn=transient"
        assert condition(task, None, bad_input) is False, f"task {name!r} retries a ValueError (bad input)"
        assert condition(task, None, Failed(data=OSError("database is locked"))) is True, name
