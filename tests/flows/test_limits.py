"""Task time limits: a training task over its limit fails its flow run and says which setting to raise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest

from esper_core.settings import EsperSettings

ROOT = Path(__file__).resolve().parents[2]


def flow_run_logs(flow_run_id: UUID, expected: str, timeout: float = 30.0) -> list[str]:
    """The flow run's log messages once ``expected`` is among them (logs reach the API in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)
            messages = [log.message for log in logs]
            if expected in messages or time.monotonic() > deadline:
                return messages
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_task_over_its_limit_fails_naming_task_limit_and_setting(
    compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.morphogenesis import morphogenesis
    from tasks.train import grow

    # One grow task would train all 500 epochs (tens of seconds); its limit stops it after 1 s.
    monkeypatch.setenv("ESPER_GROW_TASK_SECONDS", "600")
    monkeypatch.setattr(grow, "timeout_seconds", 1.0)
    state = morphogenesis(recipe="seed-reference", epochs=500, device="cpu", seed=0, run_id="slow", return_state=True)
    assert state.is_failed()
    with pytest.raises(TimeoutError):
        state.result()
    expected = (
        "task 'grow' ran past its time limit of 1 s and was stopped; if this work needs longer, "
        "raise ESPER_TRAIN_TIMEOUT_S (seconds) in the worker's environment"
    )
    logs = flow_run_logs(state.state_details.flow_run_id, expected)
    # Not retried (the same epochs would run out of time again): the failure is explained once,
    # whether Prefect's alarm or the check between epochs stopped the task.
    assert sum(m == expected for m in logs) == 1, logs
    assert sum(m.startswith("Task run exceeded timeout") for m in logs) <= 1, logs


def test_limits_come_from_the_environment_of_the_flow_run_process() -> None:
    code = (
        "from tasks.compile import compile_blueprint; from tasks.sweep import bench_case; from tasks.train import grow; "
        "from tasks.policy import collect; "
        "print(compile_blueprint.timeout_seconds, bench_case.timeout_seconds, grow.timeout_seconds, "
        "collect.timeout_seconds)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ESPER_COMPILE_TIMEOUT_S": "12", "ESPER_BENCH_TIMEOUT_S": "34"}
    env.pop("ESPER_TRAIN_TIMEOUT_S", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["12.0", "34.0", "7200.0", "7200.0"]


def test_a_limit_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("ESPER_TRAIN_TIMEOUT_S", "0")
    with pytest.raises(ValidationError, match="train_timeout_s"):
        EsperSettings()
