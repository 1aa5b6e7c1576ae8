"""benchmark_sweep and fault_drills as real flow runs under the session's Prefect harness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esper_core.benchmarks import registry
from esper_core.benchmarks.registry import BenchCase, SweepConfig, Workload
from esper_core.settings import EsperSettings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def _artifacts(key_prefix: str) -> dict[str, object]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        artifacts = sorted(client.read_artifacts(), key=lambda a: a.created)
        # Later versions of a key replace earlier ones: the dict keeps the latest.
        return {a.key: a for a in artifacts if a.key and a.key.startswith(key_prefix)}


def test_smoke_sweep_writes_snapshots_and_compares_with_the_previous_one(
    esper_home: EsperSettings, tmp_path: Path
) -> None:
    from flows.benchmark_sweep import benchmark_sweep

    root = tmp_path / "perf"
    first = benchmark_sweep(sweep="smoke", baselines_dir=str(root))
    second = benchmark_sweep(sweep="smoke", baselines_dir=str(root))
    assert first.previous is None and second.previous == first.name
    directory = Path(second.directory)
    assert sorted(p.name for p in directory.iterdir()) == [
        "latency.png",
        "seed-reference-cpu-s0.json",
        "seed-reference-cpu-s1.json",
        "sweep.json",
    ]
    index = json.loads((directory / "sweep.json").read_text())
    assert index["sweep"] == "smoke" and index["cases"] == ["seed-reference-cpu-s0", "seed-reference-cpu-s1"]
    figures = {(r.case, r.series, r.figure) for r in second.rows}
    assert ("seed-reference-cpu-s1", "chosen", "ratio_p50") in figures
    assert all(r.previous is not None for r in second.rows)
    assert set(_artifacts("sweep-smoke")) == {"sweep-smoke-results", "sweep-smoke-latency", "sweep-smoke-report"}


def _constant(ms: float):  # noqa: ANN202
    def run(case: BenchCase) -> dict:
        return {"samples_ms": {"chosen": [ms] * case.epochs, "bare": [1.0] * case.epochs}}

    return run


def test_a_regression_fails_the_flow_naming_workload_and_figure(
    esper_home: EsperSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.benchmark_sweep import benchmark_sweep

    # The sweep parameter takes the named sweeps only: the test's sweep stands in for `smoke`.
    monkeypatch.setitem(registry.SWEEPS, "smoke", SweepConfig(name="gate-test", workloads=("fake",), epochs=5))
    monkeypatch.setitem(registry.WORKLOADS, "fake", Workload(name="fake", description="", run=_constant(2.0)))
    # No baselines_dir, as the nightly deployment runs it: snapshots under ESPER_HOME, none in the checkout.
    checkout = Path(__file__).resolve().parents[2] / "baselines" / "perf"
    before = set(checkout.iterdir())
    first = benchmark_sweep(sweep="smoke")
    assert first.regressions() == [] and Path(first.directory).parent == esper_home.home / "baselines" / "perf"
    monkeypatch.setitem(registry.WORKLOADS, "fake", Workload(name="fake", description="", run=_constant(3.0)))
    state = benchmark_sweep(sweep="smoke", return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert "fake-cpu-s0 chosen p50_ms 3.000 ms vs 2.000 ms" in message and "+50%" in message, message
    assert "ratio_p50" in message
    # The artifacts were published before the check failed the run.
    report = _artifacts("sweep-gate-test")["sweep-gate-test-report"]
    assert "Regressions" in str(report.data)
    assert set(checkout.iterdir()) == before, "a sweep wrote into the source checkout without being asked"


def test_fault_drills_run_and_publish_their_checks(esper_home: EsperSettings) -> None:
    from flows.fault_drills import fault_drills

    results = fault_drills()
    assert [r["drill"] for r in results] == ["timeout", "rollback"]
    assert all(r["passed"] for r in results), results
    assert {"fault-drills", "fault-drills-telemetry"} <= set(_artifacts("fault-drills"))


def test_unknown_drill_is_refused_with_the_known_names(esper_home: EsperSettings) -> None:
    from flows.fault_drills import fault_drills

    state = fault_drills(drills=["flood"], return_state=True)
    assert state.is_failed() and "'rollback' or 'timeout'" in (state.message or ""), state.message
