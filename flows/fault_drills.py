"""fault_drills: inject Tolaria's faults (timeouts, rollbacks) and check what telemetry reports."""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.artifacts import publish_drill_artifacts
from tasks.drills import DrillName, check_drills, plan_drills, run_drill


@flow(name="fault_drills", log_prints=True)
def fault_drills(drills: list[DrillName] | None = None) -> list[dict[str, Any]]:
    """Run the fault drills one after the other, publish their results, fail if one failed.

    Args:
        drills: Drill names (``timeout``, ``rollback``); default: all of them.
    """
    names = plan_drills(drills)
    results = [run_drill(name) for name in names]
    publish_drill_artifacts(results)
    check_drills(results)
    return results
