"""Task time limits: a training task over its limit fails its flow run and says which setting to raise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import psutil
import pytest

from esper_core.child import stop_idle
from esper_core.settings import EsperSettings
from tests.helpers.processes import command_line
from tests.helpers.waiting import poll

ROOT = Path(__file__).resolve().parents[2]


def flow_run_logs(flow_run_id: UUID, expected: str, timeout: float = 30.0) -> list[str]:
    """The flow run's log messages once ``expected`` is among them (logs reach the API in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        return poll(
            lambda: [log.message for log in client.read_logs(log_filter=log_filter, limit=200)],
            lambda messages: expected in messages,
            timeout_s=timeout,
            interval_s=0.2,
        )


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


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_simic_task_over_its_limit_is_stopped(compiled_home: EsperSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.train_policy import train_policy

    # The smoke plan's demonstrations on digits-mlp take seconds; the limit stops them first.
    monkeypatch.setenv("ESPER_TRAIN_TIMEOUT_S", "0.5")
    state = train_policy(recipes=["digits-mlp"], plan="smoke", return_state=True)
    assert state.is_failed()
    expected = (
        "task 'collect-demonstrations' ran past its time limit of 0.5 s and was stopped; if this work needs "
        "longer, raise ESPER_TRAIN_TIMEOUT_S (seconds) in the worker's environment"
    )
    logs = flow_run_logs(state.state_details.flow_run_id, expected)
    assert sum(m == expected for m in logs) == 1, logs
    assert _no_child_left()


def _no_child_left() -> bool:
    """No child process of ``esper_core.child`` is left (call ``stop_idle`` before the work: an
    earlier test's compiles may have left reusable ones idle)."""
    return not any("esper_core.child" in command_line(p) for p in psutil.Process().children(recursive=True))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_compile_over_its_limit_is_stopped_in_its_child_process(
    esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.compile_catalog import compile_catalog
    from tasks._limits import time_limit

    # A real compile into an empty registry: starting its child process alone takes longer.
    stop_idle()
    monkeypatch.setenv("ESPER_COMPILE_TIMEOUT_S", "0.2")
    assert time_limit("compile") == 0.2
    state = compile_catalog(
        recipe="seed-reference", blueprints=["lowrank_adapter"], device="cpu", backend="export", return_state=True
    )
    assert state.is_failed()
    expected = (
        "task 'compile-blueprint' ran past its time limit of 0.2 s and was stopped; if this work needs "
        "longer, raise ESPER_COMPILE_TIMEOUT_S (seconds) in the worker's environment"
    )
    logs = flow_run_logs(state.state_details.flow_run_id, expected)
    assert sum(m == expected for m in logs) == 1, logs  # not retried: it would run out of time again
    assert _no_child_left()
    assert not [p for p in (esper_home.home / "artifacts").rglob("*") if p.is_file()]  # no blob was stored


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_benchmark_case_over_its_limit_is_stopped_in_its_child_process(
    esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.benchmark_sweep import benchmark_sweep

    stop_idle()
    monkeypatch.setenv("ESPER_BENCH_TIMEOUT_S", "0.2")
    state = benchmark_sweep(sweep="smoke", baselines_dir=str(tmp_path), return_state=True)
    assert state.is_failed()
    expected = (
        "task 'bench-case' ran past its time limit of 0.2 s and was stopped; if this work needs "
        "longer, raise ESPER_BENCH_TIMEOUT_S (seconds) in the worker's environment"
    )
    logs = flow_run_logs(state.state_details.flow_run_id, expected)
    assert expected in logs, logs
    assert _no_child_left()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_normal_run_logs_no_time_limit_warning(esper_home: EsperSettings) -> None:
    """Prefect warns, once per task run, about a timeout it cannot enforce on a worker thread."""
    from flows.morphogenesis import morphogenesis

    # An empty registry: the run compiles its kernels (mapped onto threads), then trains.
    state = morphogenesis(recipe="seed-reference", epochs=2, device="cpu", seed=0, run_id="plain", return_state=True)
    assert state.is_completed()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        (compiles,) = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
        )
    logs = flow_run_logs(flow_run_id, "Finished in state Completed()")
    assert any(m.startswith("epochs 0-1 in ") for m in logs), logs  # the run's own lines are there
    compile_logs = flow_run_logs(compiles.id, "Finished in state Completed()")
    assert compiles.name and compile_logs, "the compile_catalog subflow logged nothing"
    warnings = [m for m in logs + compile_logs if "Timeout of" in m or "worker thread" in m]
    assert not warnings, warnings


def test_limits_come_from_the_environment_of_the_flow_run_process() -> None:
    code = (
        "from tasks._limits import time_limit; from tasks.compile import compile_blueprint; "
        "from tasks.sweep import bench_case; from tasks.train import grow; from tasks.policy import collect; "
        "print(time_limit('compile'), time_limit('bench'), grow.timeout_seconds, collect.timeout_seconds, "
        "compile_blueprint.timeout_seconds, bench_case.timeout_seconds)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ESPER_COMPILE_TIMEOUT_S": "12", "ESPER_BENCH_TIMEOUT_S": "34"}
    env.pop("ESPER_TRAIN_TIMEOUT_S", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    # Only grow has Prefect's timeout; the others' child processes are stopped at the limit (on
    # the task runner's threads Prefect's timeout cannot interrupt anything, and it warns).
    assert out.stdout.split() == ["12.0", "34.0", "7200.0", "None", "None", "None"]


def test_a_limit_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("ESPER_TRAIN_TIMEOUT_S", "0")
    with pytest.raises(ValidationError, match="train_timeout_s"):
        EsperSettings()
