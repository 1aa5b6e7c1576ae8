"""Fault-drill tasks: inject a fault into Tolaria and check that its telemetry tells the story.

The drills themselves live in the library (``esper_core.studies.drills``: ``run_timeout_drill()``
and ``run_rollback_drill()``, each returning a result dict); a task only runs one and reports.
A drill's dict says whether it passed under ``passed`` and which checks held under ``checks``
(a missing ``passed`` counts as passed: a drill raises when it fails hard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core.studies.drills import run_rollback_drill, run_timeout_drill

DrillName = Literal["rollback", "timeout"]
"""The drills' names, for the flow's ``drills`` parameter (a test keeps it equal to ``DRILLS``)."""

DRILLS: dict[str, Callable[[], dict[str, Any]]] = {"timeout": run_timeout_drill, "rollback": run_rollback_drill}
"""Drill name -> drill; each runs in a temporary ESPER_HOME of its own."""


class DrillFailed(RuntimeError):
    """A drill ran but its checks did not hold."""


# NO_CACHE: validation is instant and must see the current drill list.
@task(name="plan-drills", cache_policy=NO_CACHE)
def plan_drills(drills: list[str] | None) -> list[str]:
    """The drills to run (default: all), checked against the known names."""
    names = list(drills) if drills else list(DRILLS)
    unknown = sorted(set(names) - set(DRILLS))
    if unknown:
        raise ValueError(f"unknown drills {unknown}; choose from {sorted(DRILLS)}")
    return names


# NO_CACHE: a drill is an experiment on the live code; a cached verdict would hide a regression.
@task(name="run-drill", cache_policy=NO_CACHE)
def run_drill(name: str) -> dict[str, Any]:
    """Run drill ``name``; returns its result dict with ``drill`` set to the name."""
    result = dict(DRILLS[name]())
    result.setdefault("drill", name)
    return result


# NO_CACHE: the verdict is about these results.
@task(name="check-drills", cache_policy=NO_CACHE)
def check_drills(results: list[dict[str, Any]]) -> None:
    """Fail when any drill reports ``passed: False``."""
    failed = [r for r in results if r.get("passed") is False]
    if failed:
        details = "; ".join(
            f"{r['drill']}: " + (", ".join(k for k, ok in r.get("checks", {}).items() if not ok) or str(r))
            for r in failed
        )
        raise DrillFailed(f"fault drills failed: {details}")
