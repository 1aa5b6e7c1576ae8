"""The fan-out flows on a Dask cluster: the benchmark sweep and the catalogue compile.

Same flow names and parameters, same bodies (``.fn``), another task runner: the cluster at
``ESPER_DASK_ADDRESS`` (a temporary local one when unset). prefect.yaml deploys them as
``benchmark_sweep/dask`` and ``compile_catalog/dask``. They are written out as functions, not
``flow.with_options(...)``, because ``prefect deploy`` finds entrypoints by reading the source.

The module is not called ``distributed.py``: ``prefect deploy`` puts ``flows/`` on ``sys.path``,
where such a name would shadow Dask's ``distributed`` package.
"""

from __future__ import annotations

from prefect import flow

from esper_core._capabilities import Device
from esper_core.benchmarks.registry import SweepName
from esper_core.benchmarks.sweep import SweepReport
from esper_core.contracts import KernelArtifact
from esper_core.run.recipes import RecipeRef
from esper_core.tezzeret.config import BackendName
from flows.benchmark_sweep import benchmark_sweep
from flows.compile_catalog import compile_catalog
from tasks._distributed import dask_task_runner
from tasks.notify import notify_failure


@flow(
    name="benchmark_sweep",
    log_prints=True,
    task_runner=dask_task_runner(),
    on_failure=[notify_failure],
    on_crashed=[notify_failure],
)
def benchmark_sweep_dask(
    sweep: SweepName = "nightly",
    workloads: list[str] | None = None,
    max_regression: float | None = None,
    baselines_dir: str | None = None,
) -> SweepReport:
    """``benchmark_sweep`` with one case per Dask worker process (same parameters)."""
    return benchmark_sweep.fn(
        sweep=sweep, workloads=workloads, max_regression=max_regression, baselines_dir=baselines_dir
    )


@flow(name="compile_catalog", log_prints=True, task_runner=dask_task_runner())
def compile_catalog_dask(
    recipe: RecipeRef = "digits-mlp",
    blueprints: list[str] | None = None,
    device: Device = "auto",
    backend: BackendName = "export",
    approve: list[str] | None = None,
) -> list[KernelArtifact]:
    """``compile_catalog`` with its compiles fanned out on Dask worker processes (same parameters)."""
    return compile_catalog.fn(recipe=recipe, blueprints=blueprints, device=device, backend=backend, approve=approve)
