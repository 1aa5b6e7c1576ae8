"""Prefect artifacts a person looks at in the UI: tables and the run report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from esper_core.reports import RunSummary


@task(name="publish-run-artifacts", cache_policy=NO_CACHE, tags=["nissa"])
def publish_run_artifacts(summary: RunSummary, epochs: list[dict[str, Any]]) -> None:
    """Publish the per-epoch table, the seed table and the markdown report of a run."""
    key = summary.recipe.replace("_", "-")
    create_table_artifact(key=f"{key}-epochs", table=epochs, description=f"Epochs of run {summary.run_id}")
    create_table_artifact(
        key=f"{key}-seeds",
        table=[{"slot": slot, "final stage": stage} for slot, stage in summary.seeds.items()],
        description=f"Seeds of run {summary.run_id}",
    )
    create_markdown_artifact(
        key=f"{key}-report",
        markdown=(Path(summary.run_dir) / "report.md").read_text(),
        description=f"Report of run {summary.run_id}",
    )
