"""A halted run is not retried by Prefect; any other epoch failure is."""

from __future__ import annotations

from prefect.states import Failed

from esper_core.tolaria.safety import TrainingHalted
from tasks.train import _retry_unless_halted


def test_halt_is_final_other_failures_retry() -> None:
    assert _retry_unless_halted(None, None, Failed(data=TrainingHalted("halted after 3 failed epochs"))) is False
    assert _retry_unless_halted(None, None, Failed(data=RuntimeError("worker lost"))) is True


def test_a_timed_out_task_is_not_retried() -> None:
    # The same work would run out of time again; a transient failure is still retried.
    from tasks._limits import retry_unless_timed_out
    from tasks.compile import transient

    for condition in (_retry_unless_halted, transient, retry_unless_timed_out):
        assert condition(None, None, Failed(data=TimeoutError("Scope timed out after 1 second(s)."))) is False
        assert condition(None, None, Failed(data=OSError("database is locked"))) is True
