"""The orchestration benchmark's accounting, and one real measurement on the smallest recipe."""

from __future__ import annotations

import pytest

from bench.orchestration import OrchestrationConfig, covered, run


def test_covered_counts_overlapping_work_once() -> None:
    assert covered([]) == 0.0
    assert covered([(0.0, 1.0), (2.0, 3.0)]) == pytest.approx(2.0)
    assert covered([(0.0, 2.0), (1.0, 3.0), (1.5, 1.8)]) == pytest.approx(3.0)  # two threads at once
    assert covered([(5.0, 6.0), (0.0, 1.0), (0.5, 5.5)]) == pytest.approx(6.0)


def test_config_refuses_zero_runs() -> None:
    with pytest.raises(ValueError, match="runs must be >= 1"):
        OrchestrationConfig(runs=0)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_benchmark_splits_a_real_run_into_work_and_overhead() -> None:
    result = run(OrchestrationConfig(recipe="seed-reference", runs=1))
    # kernels-ready, start-run, finish-run, publish-run-artifacts and the grow tasks: one, or more
    # when a loaded machine makes the epochs outlast a grow task's ESPER_GROW_TASK_SECONDS.
    assert result["tasks"] >= 5
    assert 0.0 < result["esper_work_s"] < result["wall_s"]
    assert 0.0 < result["prefect_overhead_share"] < 1.0
    # The fixed cost is the wall not spent in task bodies; the artifacts and log records are in it.
    assert result["prefect_fixed_cost_s"] > 0.0 and result["goal_fixed_cost_s"] == 0.25
    assert result["goal_per_epoch_ms"] == 0.5 and result["goal_share"] == 0.02
    assert 0.0 < result["artifacts_s"] < result["overhead_s"] and result["logs_s"] > 0.0
    assert result["artifact_uploads_s"] > 0.0  # on their own thread, beside the task's drawing
    # Log records: the epochs that changed something, and one summary per grow task.
    assert result["epochs"] == 6 and result["prefect_per_epoch_ms"] > 0.0
    assert 0.0 < result["cold_registry_share"] < 1.0  # concurrent compiles are not counted twice
    assert result["empty_flow_s"] > 0.0 and result["heartbeat_frequency_s"] is None
    assert {"grow", "finish-run", "publish-run-artifacts"} <= set(result["work_by_task_s"])
