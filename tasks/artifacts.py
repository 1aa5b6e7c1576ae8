"""Prefect artifacts a person looks at in the UI: tables, markdown reports and plots.

Plots are PNGs embedded as ``data:`` URIs in an image artifact, so the UI shows them without a
file server; the same PNG is also written next to the run's or the sweep's other outputs. A run's
markdown report names its curves artifact rather than embedding the PNG a second time: each
upload of it cost a run ~15 ms of Prefect API time (``esper bench orchestration``).

A run's four artifacts go up on one background thread (``_uploads``) while the task renders its
curves: each API call is a round trip to the Prefect server (~17 ms here), time the task can
spend drawing instead of waiting. The task still waits for every upload before it returns, so
a failed upload fails the task (and its retry publishes them all again).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from esper_core.benchmarks.sweep import SweepReport, render_markdown
from esper_core.run.reports import RunSummary
from esper_core.studies.growth_report import format_table, frontier_png
from esper_core.telemetry.plots import EpochPoint, SeedMark, data_uri, latency_png, run_curves_png

_QUIET_ACTIONS = frozenset({"wait", "pause"})


def _key(text: str) -> str:
    """An artifact key: lower-case letters, digits and dashes only (Prefect's rule)."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def seed_marks(epochs: list[dict[str, Any]]) -> list[SeedMark]:
    """One mark per epoch with a seed event: a command other than wait, or a stage change."""
    marks = []
    stages: dict[str, str] = {}
    for row in epochs:
        parts = []
        if row["action"] not in _QUIET_ACTIONS:
            parts.append(" ".join(p for p in (row["action"], row.get("slot", ""), row.get("blueprint", "")) if p))
        for slot, stage in row.get("seeds", {}).items():
            if stages.get(slot, "dormant") != stage:
                parts.append(f"{slot}->{stage}")
            stages[slot] = stage
        if parts:
            marks.append(SeedMark(epoch=row["epoch"], label="; ".join(parts)))
    return marks


def seed_table(summary: RunSummary, epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per slot: final stage, when it first left DORMANT, and its stage history."""
    history: dict[str, list[str]] = {slot: [] for slot in summary.seeds}
    first_active: dict[str, int] = {}
    last: dict[str, str] = {}
    for row in epochs:
        # Packets show the stage at the end of training; a germination happens after it (when
        # the epoch's command is applied), so it comes from the command.
        for slot, stage in row.get("seeds", {}).items():
            if last.get(slot, "dormant") != stage:
                history.setdefault(slot, []).append(f"{stage}@{row['epoch']}")
                if stage != "dormant":
                    first_active.setdefault(slot, row["epoch"])
            last[slot] = stage
        if row["action"] == "germinate" and row.get("slot"):
            history.setdefault(row["slot"], []).append(f"germinated@{row['epoch']}")
            first_active.setdefault(row["slot"], row["epoch"])
            last[row["slot"]] = "germinated"
    return [
        {
            "slot": slot,
            "final stage": final,
            "first active epoch": first_active.get(slot, ""),
            "stages": " -> ".join(history.get(slot, [])) or "dormant throughout",
        }
        for slot, final in summary.seeds.items()
    ]


def await_uploads(uploads: list[Future[Any]]) -> None:
    """Wait for every background upload; the first failure is raised here, in the task."""
    for upload in uploads:
        upload.result()


@contextlib.contextmanager
def _uploads() -> Iterator[Callable[..., None]]:
    """``upload(create, **kwargs)`` runs a ``create_*_artifact`` call on a background thread, in
    a copy of the caller's context (Prefect finds the task run, and so the flow run, the artifact
    belongs to there). Calls go up in order on one thread; the block waits for them all."""
    uploads: list[Future[Any]] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="artifact-upload") as pool:

        def upload(create: Callable[..., Any], **kwargs: Any) -> None:
            uploads.append(pool.submit(contextvars.copy_context().run, create, **kwargs))

        yield upload
        await_uploads(uploads)


# NO_CACHE: artifacts describe this run; a cached no-op would leave the UI without them.
@task(name="publish-run-artifacts", cache_policy=NO_CACHE)
def publish_run_artifacts(summary: RunSummary, epochs: list[dict[str, Any]]) -> None:
    """Publish the run's curves (with seed events marked), epoch and seed tables, and report."""
    key = _key(summary.recipe)
    table = [
        {k: (v if k != "seeds" else ", ".join(f"{s}:{g}" for s, g in v.items())) for k, v in r.items()} for r in epochs
    ]
    with _uploads() as upload:
        upload(create_table_artifact, key=f"{key}-epochs", table=table, description=f"Epochs of run {summary.run_id}")
        upload(
            create_table_artifact,
            key=f"{key}-seeds",
            table=seed_table(summary, epochs),
            description=f"Seeds of run {summary.run_id}",
        )
        report = (Path(summary.run_dir) / "report.md").read_text()
        if epochs:
            report += (
                f"\n## Curves\n\nLoss and accuracy, seed events marked: artifact `{key}-curves`, file `curves.png`.\n"
            )
        # Up before the curves are drawn: its text only names them.
        upload(
            create_markdown_artifact,
            key=f"{key}-report",
            markdown=report,
            description=f"Report of run {summary.run_id}",
        )
        if epochs:
            points = [
                EpochPoint(
                    epoch=r["epoch"], train_loss=r["train_loss"], val_loss=r["val_loss"], val_accuracy=r["val_accuracy"]
                )
                for r in epochs
            ]
            png = run_curves_png(
                points,
                seed_marks(epochs),
                title=f"{summary.run_id} ({summary.recipe})",
                accuracy=not summary.token_targets,
            )
            (Path(summary.run_dir) / "curves.png").write_bytes(png)
            upload(
                create_image_artifact,
                image_url=data_uri(png),
                key=f"{key}-curves",
                description=f"Loss{'' if summary.token_targets else ' and accuracy'} of run {summary.run_id}, "
                "seed events marked",
            )


# NO_CACHE: the sweep's artifacts must always be this sweep's.
@task(name="publish-sweep-artifacts", cache_policy=NO_CACHE)
def publish_sweep_artifacts(report: SweepReport) -> None:
    """Publish the results table with ratios, the latency plot and the markdown report."""
    key = _key(f"sweep-{report.sweep}")
    create_table_artifact(
        key=f"{key}-results",
        table=report.table(),
        description=f"Sweep {report.name} against {report.previous or 'nothing (first sweep)'}",
    )
    png = latency_png(report.distributions, title=f"sweep {report.name}: ms per epoch")
    (Path(report.directory) / "latency.png").write_bytes(png)
    uri = data_uri(png)
    create_image_artifact(
        image_url=uri, key=f"{key}-latency", description=f"Latency distributions of sweep {report.name}"
    )
    create_markdown_artifact(
        key=f"{key}-report", markdown=render_markdown(report, plot_uri=uri), description=f"Sweep {report.name}"
    )


# NO_CACHE: drill results are only meaningful for this run of the drills.
@task(name="publish-drill-artifacts", cache_policy=NO_CACHE)
def publish_drill_artifacts(results: list[dict[str, Any]]) -> None:
    """A table of every check of every drill (held or not), and one of the numbers they saw."""
    checks = [
        {"drill": r["drill"], "check": check, "held": bool(held)}
        for r in results
        for check, held in r.get("checks", {"passed": r.get("passed", True)}).items()
    ]
    create_table_artifact(key="fault-drills", table=checks, description="Fault drills: the checks each drill made")
    numbers = [
        {"drill": r["drill"], "metric": name, "value": value if isinstance(value, int | float) else str(value)}
        for r in results
        for name, value in r.get("metrics", {}).items()
    ]
    if numbers:
        create_table_artifact(
            key="fault-drills-telemetry", table=numbers, description="What telemetry reported during the drills"
        )


# NO_CACHE: the growth artifacts must be this benchmark run's.
@task(name="publish-growth-artifacts", cache_policy=NO_CACHE)
def publish_growth_artifacts(result: dict[str, Any]) -> None:
    """The growth benchmark's frontier plot (every arm on it) and its table of paired differences."""
    uri = data_uri(frontier_png(result))
    create_image_artifact(image_url=uri, key="growth-frontier", description="Growth: every arm on the static frontier")
    create_markdown_artifact(
        key="growth-report",
        markdown=f"{format_table(result)}\n\n![frontier]({uri})\n",
        description=f"Growth benchmark, plan {result['plan']}",
    )
