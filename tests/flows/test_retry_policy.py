"""A halted run is not retried by Prefect; any other epoch failure is."""

from __future__ import annotations

from prefect.states import Failed

from esper_core.tolaria.safety import TrainingHalted
from tasks.train import _retry_unless_halted


def test_halt_is_final_other_failures_retry() -> None:
    assert _retry_unless_halted(None, None, Failed(data=TrainingHalted("halted after 3 failed epochs"))) is False
    assert _retry_unless_halted(None, None, Failed(data=RuntimeError("worker lost"))) is True
