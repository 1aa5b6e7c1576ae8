"""Benchmark-sweep tasks: plan the cases, time one case, keep the snapshot, check for regressions.

Only ``bench-case`` is fanned out (``.map``): on the distributed runner it runs on Dask
workers, while planning, writing and comparing run in the flow's own process (called directly),
so the snapshot lands where the flow runs even when the workers are elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from esper_core.benchmarks.registry import BenchCase, SweepConfig, get_sweep, get_workload, plan_cases
from esper_core.benchmarks.sweep import (
    CaseResult,
    SweepReport,
    compare,
    previous_sweep,
    sweep_directory,
    write_snapshot,
)
from esper_core.studies.growth import GrowthBenchConfig, save_baseline
from esper_core.studies.growth import run as run_growth
from tasks._limits import in_child, limited
from tasks._retry import transient
from tasks._runtime import settings


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepPlan:
    """The cases of one sweep and where its snapshot goes."""

    config: SweepConfig
    cases: list[BenchCase]
    directory: str
    growth_directory: str
    """Where the growth benchmark's results go (beside the sweep's root, in ``growth/``)."""


class BenchmarkRegression(RuntimeError):
    """A gated figure grew by more than the sweep allows; the message names workload and figure."""


# NO_CACHE: a plan depends on the clock (the snapshot's name) and on the devices present.
@task(name="plan-sweep", cache_policy=NO_CACHE)
def plan_sweep(
    sweep: str, workloads: list[str] | None, max_regression: float | None, baselines_dir: str | None
) -> SweepPlan:
    """The named sweep's cases on every device present, and its snapshot directory.

    Outputs go under ``ESPER_HOME`` unless ``baselines_dir`` names a folder: a sweep scheduled
    from a deployment must not write into the project's source checkout.
    """
    config = get_sweep(sweep)
    if max_regression is not None:
        config = dataclasses.replace(config, max_regression=max_regression)
    cases = plan_cases(config, workloads=workloads)
    # Resolved here, in the flow's process: a relative path means the deployment's project dir.
    root = Path(baselines_dir).resolve() if baselines_dir is not None else settings().home / "baselines" / "perf"
    directory = sweep_directory(root, config)
    get_run_logger().info("sweep %s: %d cases -> %s", directory.name, len(cases), directory)
    return SweepPlan(config=config, cases=cases, directory=str(directory), growth_directory=str(root.parent / "growth"))


# NO_CACHE: a timing is only worth anything fresh. One retry covers a worker lost mid-case.
@task(
    name="bench-case",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("bench"),
)
def bench_case(case: BenchCase) -> CaseResult:
    """Time one (workload, device, seeds) case: Esper and bare PyTorch, interleaved.

    In a child process that the benchmark time limit stops (``in_child``): this task runs on a
    thread of the flow's task runner, where nothing can interrupt a C call.
    """
    return in_child("bench", "esper_core.benchmarks.sweep:run_case", case, get_workload(case.workload))


# NO_CACHE: writing a snapshot is a side effect; a second write of the same sweep is refused.
@task(name="write-sweep", cache_policy=NO_CACHE)
def write_sweep(plan: SweepPlan, results: list[CaseResult]) -> SweepReport:
    """Write the snapshot and compare it with the previous sweep of the same name."""
    directory = write_snapshot(Path(plan.directory), plan.config, results)
    previous = previous_sweep(directory.parent, plan.config, before=directory)
    return compare(directory, plan.config, previous)


# NO_CACHE: a check must look at this sweep's report, never a remembered verdict.
@task(name="check-regressions", cache_policy=NO_CACHE)
def check_regressions(report: SweepReport) -> None:
    """Fail (and so fail the flow run) when a gated figure regressed beyond the threshold."""
    regressions = report.regressions()
    if regressions:
        raise BenchmarkRegression(
            f"benchmark regression in sweep {report.name}: "
            + "; ".join(regressions)
            + ". If the change is intended, this sweep becomes the new reference for the next one."
        )


# NO_CACHE: a benchmark result is only worth anything fresh.
@task(name="growth-benchmark", cache_policy=NO_CACHE)
def growth_benchmark(plan: str, baselines_dir: str) -> dict:
    """Run the growth benchmark's ``plan`` on its default recipes; keep its JSON and plot in ``baselines_dir/plan``."""
    result = run_growth(GrowthBenchConfig(plan=plan))
    directory = Path(baselines_dir) / plan
    save_baseline(result, directory)
    get_run_logger().info("growth benchmark (plan %s) -> %s", plan, directory)
    return result
