"""``esper bench compile`` runs end to end and reports every number (values are not judged here:
timings belong to the benchmark, not to tests)."""

from __future__ import annotations

import pytest

from bench.compile import GOALS, CompileBenchConfig, run

pytestmark = pytest.mark.slow

KEYS = {
    "compile_cold_s",
    "compile_warm_s",
    "kasmina_load_ms",
    "kasmina_first_load_in_process_ms",
    "kasmina_first_use_ms",
    "first_use_over_compile",
    "registry_lookup_p95_ms",
    "publish_per_s",
}


def test_bench_compile_reports_every_number() -> None:
    result = run(CompileBenchConfig(backend="export", lookups=20, publishes=10, load_repeats=1))
    assert set(result) >= KEYS
    assert all(result[k] > 0 for k in KEYS)
    assert result["first_use_over_compile"] == pytest.approx(
        result["kasmina_first_use_ms"] / (result["compile_cold_s"] * 1e3)
    )
    assert result["environment"]["compiler"] == "torch.export" and result["artifact_status"] == "active"
    assert result["registry_artifacts"] == 10 and result["goals"] == GOALS


def test_bench_config_validation() -> None:
    with pytest.raises(ValueError, match="backend"):
        CompileBenchConfig(backend="tvm")
    with pytest.raises(ValueError, match="lookups >= 20"):
        CompileBenchConfig(lookups=5)
