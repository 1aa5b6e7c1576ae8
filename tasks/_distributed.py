"""The distributed task runner of the scale-out deployments (Dask through prefect-dask).

Kept apart from ``tasks._runtime`` so that only the flows that fan out on Dask pay for
importing it (~0.3 s).
"""

from __future__ import annotations

from prefect_dask import DaskTaskRunner

from tasks._runtime import settings


def dask_task_runner() -> DaskTaskRunner:
    """The cluster at ``ESPER_DASK_ADDRESS``, or a temporary local one per flow run.

    Workers are processes with one thread each: ``torch.export`` is not thread-safe (Tezzeret
    serialises exports per process) and a benchmark must not share its cores with another. Each
    task opens the registry and ``ESPER_HOME`` itself, so workers on other machines need the
    same ``ESPER_REGISTRY_URL`` (PostgreSQL) and ``ESPER_HOME`` on a shared path.
    """
    address = settings().dask_address
    if address:
        return DaskTaskRunner(address=address)
    # The scheduler always serves HTTP (status, metrics); on loopback and a free port.
    return DaskTaskRunner(
        cluster_kwargs={
            "processes": True,
            "threads_per_worker": 1,
            "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0",
        }
    )
