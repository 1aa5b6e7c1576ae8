"""Scale-out: the catalogue compile and the sweep fanned out on a local two-worker Dask cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from esper_core.settings import EsperSettings
from esper_core.urza.service import Urza

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_compile_and_sweep_fan_out_over_two_worker_processes(compiled_home: EsperSettings, tmp_path: Path) -> None:
    from distributed import Client, LocalCluster, get_task_stream
    from prefect_dask import DaskTaskRunner

    from flows.scale_out import benchmark_sweep_dask, compile_catalog_dask

    # Processes, not threads: torch.export is not thread-safe, and this is how remote workers run.
    with (
        LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        runner = DaskTaskRunner(address=cluster.scheduler_address)
        with get_task_stream(client) as stream:
            artifacts = compile_catalog_dask.with_options(task_runner=runner)(recipe="digits-mlp", device="cpu")
            report = benchmark_sweep_dask.with_options(task_runner=runner)(
                sweep="smoke", baselines_dir=str(tmp_path / "perf")
            )
        workers = {task["worker"] for task in stream.data}
        assert workers <= set(cluster.scheduler_info["workers"])
    assert len(workers) == 2, f"tasks ran on {workers} only"
    # The workers shared ESPER_HOME: what they published is in the registry the flow reads.
    urza = Urza.open(compiled_home.home)
    stored = {a.artifact_id for a in urza.store.list_artifacts()}
    urza.close()
    assert artifacts and {a.artifact_id for a in artifacts} <= stored
    assert {r.case for r in report.rows} == {"seed-reference-cpu-s0", "seed-reference-cpu-s1"}
    assert (Path(report.directory) / "sweep.json").exists()
