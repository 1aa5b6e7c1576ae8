"""benchmark_sweep: time every workload x configuration, keep a snapshot, fail on a regression."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from esper_core.benchmarks.registry import SweepName
from esper_core.benchmarks.sweep import SweepReport
from tasks.artifacts import publish_growth_artifacts, publish_sweep_artifacts
from tasks.notify import notify_failure
from tasks.sweep import bench_case, check_regressions, growth_benchmark, plan_sweep, write_sweep


# One case at a time: two benchmarks sharing the cores would time each other. The distributed
# deployment (flows/scale_out.py) swaps in Dask, one case per worker process.
# A failed or crashed sweep posts to ESPER_ALERT_WEBHOOK_URL when it is set.
@flow(
    name="benchmark_sweep",
    log_prints=True,
    task_runner=ThreadPoolTaskRunner(max_workers=1),
    on_failure=[notify_failure],
    on_crashed=[notify_failure],
)
def benchmark_sweep(
    sweep: SweepName = "nightly",
    workloads: list[str] | None = None,
    max_regression: float | None = None,
    baselines_dir: str | None = None,
) -> SweepReport:
    """Time the named sweep's workloads on every device present and compare with the last sweep.

    Args:
        sweep: Named sweep in ``esper_core/benchmarks/registry.py`` (``nightly``, ``smoke``, ``growth``: also the
            growth benchmark, its results and frontier plot in ``growth/<plan>`` beside ``baselines_dir``).
        workloads: Narrow the sweep to these workloads (default: the sweep's own list).
        max_regression: Override the sweep's threshold (``0.25``: fail when a gated figure is
            more than 25 % above the previous sweep's).
        baselines_dir: Root of the snapshots (default ``$ESPER_HOME/baselines/perf``, never the
            source tree unless named: ``baselines/perf`` updates the committed baselines, for a
            relative path starts at the project directory).
    """
    plan = plan_sweep(sweep, workloads, max_regression, baselines_dir)
    # .result(): a case that failed fails the sweep with its own error, before anything is written.
    results = bench_case.map(plan.cases).result()
    report = write_sweep(plan, results)
    publish_sweep_artifacts(report)
    if plan.config.growth_plan is not None:
        publish_growth_artifacts(growth_benchmark(plan.config.growth_plan, plan.growth_directory))
    check_regressions(report)
    print(f"sweep {report.name}: {len(report.rows)} figures, compared with {report.previous or 'nothing'}")
    return report
