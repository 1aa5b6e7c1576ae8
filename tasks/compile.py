"""Tezzeret and Urza tasks: start a compile run, compile a blueprint kernel, publish it, finish.

No tags: Prefect 3.8 acquires a concurrency slot through the API for every run of a tagged task,
limit or not, and on the SQLite-backed local server that write collides with the server recording
task events (503, then a ~2 s client back-off; two or three of them on a cold ``esper run``).
Compiles are capped per flow run by the task runner and across workers by the deployment's
``concurrency_limit`` (README, Scale-out).

Retries: a task is retried on transient failures (a locked or unreachable database, a full or
flaky filesystem), never on a ``ValueError``: bad input (an unapproved blueprint, a refused
status) fails the same way every time, so it fails at once with its message (``tasks._retry``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from esper_core._capabilities import resolve_device
from esper_core.contracts import KernelArtifact, MetricPoint, TelemetryEvent, TelemetryLevel, TelemetryPacket
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import CompileJob, PublishPlan, find_published, new_compile_run, publish_staged
from esper_core.urza.service import Urza
from tasks._limits import in_child, limited
from tasks._retry import transient
from tasks._runtime import service_sink, settings

COMPILE_CONCURRENCY = 2
"""Compiles of one flow run in flight at once (the compile flows' task runner). Exports inside
one process take turns anyway (torch.export is not thread-safe); the limit keeps a large
catalogue from starting every compile at once. Across workers, the deployment's
``concurrency_limit`` caps how many catalogue compiles run at once."""


def compile_threads() -> int:
    """Torch threads of one compile's child process: this process's cores shared among the
    ``COMPILE_CONCURRENCY`` compiles in flight, so that they do not spin against each other."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // COMPILE_CONCURRENCY)


@dataclass(frozen=True, kw_only=True, slots=True)
class StagedKernel:
    """A compiled kernel whose blob is in the blob store; ``reused`` when Urza already had it."""

    job: CompileJob
    artifact_json: str
    reused: bool
    tags: tuple[str, ...] = ()


def _urza() -> Urza:
    s = settings()
    return Urza.open(s.home, s.registry_db_url)


# NO_CACHE throughout: the registry is the compile cache (a published artifact is never rebuilt);
# a Prefect result cache could outlive a wiped registry and hand back a kernel that no longer exists.
@task(name="begin-compile-run", retries=2, retry_delay_seconds=1, retry_condition_fn=transient, cache_policy=NO_CACHE)
def begin_compile_run(recipe: str, jobs: list[CompileJob], device: str = "auto", backend: str = "export") -> str:
    """Record the compile run (lineage of what it publishes); its id is the flow run's id."""
    run = new_compile_run(
        resolve_device(device),
        backend,
        run_id=flow_run.get_id(),
        detail={"recipe": recipe, "jobs": len(jobs), "blueprints": sorted({j.blueprint_id for j in jobs})},
    )
    urza = _urza()
    try:
        return urza.store.start_compile_run(run).run_id
    finally:
        urza.close()


@task(
    name="compile-blueprint",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
    **limited("compile"),
)
def compile_blueprint(job: CompileJob, device: str = "auto") -> StagedKernel:
    """Compile ``job`` unless Urza already holds its artifact here; stage the blob.

    The compile runs in a child process that the compile time limit stops (``in_child``): this
    task runs on a thread of the flow's task runner, where nothing can interrupt a C call. The
    child gets its share of the cores (``compile_threads``) and serves the flow's next compiles
    too: its interpreter and imports (1-2 s) are paid once, not per kernel.
    """
    urza = _urza()
    try:
        existing = find_published(urza, job, resolve_device(device))
    finally:
        urza.close()
    if existing is not None:  # asked here first: a child process costs seconds of imports
        return StagedKernel(job=job, artifact_json=existing.to_json(), reused=True)
    s = settings()
    artifact_json, tags, reused = in_child(
        "compile",
        "esper_core.pipeline:stage_job",
        job,
        device,
        s.home,
        s.registry_db_url,
        threads=compile_threads(),
        reuse=True,
    )
    if reused:
        return StagedKernel(job=job, artifact_json=artifact_json, reused=True)
    artifact = KernelArtifact.from_json(artifact_json)
    events = ()
    if artifact.fallback:
        events = (
            TelemetryEvent(
                name="tezzeret.compile.fallback",
                level=TelemetryLevel.WARNING,
                message=artifact.fallback_reason or "",
                attributes={"blueprint_id": job.blueprint_id, "profile": job.profile},
            ),
        )
    service_sink().emit(
        TelemetryPacket(
            source="tezzeret",
            metrics=(
                MetricPoint(
                    name="tezzeret.compile.duration_ms",
                    value=artifact.compile_ms,
                    unit="ms",
                    labels={"blueprint": job.blueprint_id},
                ),
            ),
            events=events,
        )
    )
    return StagedKernel(job=job, artifact_json=artifact_json, reused=False, tags=tags)


@task(
    name="publish-artifact",
    retries=3,
    retry_delay_seconds=1,
    retry_condition_fn=transient,
    cache_policy=NO_CACHE,
)
def publish_artifact(staged: StagedKernel, compile_run_id: str | None = None) -> KernelArtifact:
    """Record a staged kernel in Urza (idempotent, one transaction); returns the stored descriptor."""
    artifact = KernelArtifact.from_json(staged.artifact_json)
    if staged.reused:
        return artifact
    urza = _urza()
    start = time.perf_counter()
    try:
        stored = publish_staged(
            urza, default_catalog(), artifact, tags=staged.tags, plan=PublishPlan(compile_run_id=compile_run_id)
        )
    finally:
        urza.close()
    service_sink().emit(
        TelemetryPacket(
            source="urza",
            metrics=(
                MetricPoint(
                    name="urza.publish.duration_ms",
                    value=(time.perf_counter() - start) * 1e3,
                    unit="ms",
                    labels={"blueprint": artifact.blueprint_id},
                ),
                MetricPoint(name="urza.artifacts.published_total", value=1.0, labels={"status": stored.status.value}),
            ),
        )
    )
    return stored


@task(name="finish-compile-run", retries=2, retry_delay_seconds=1, retry_condition_fn=transient, cache_policy=NO_CACHE)
def finish_compile_run(compile_run_id: str, artifacts: list[KernelArtifact], reused: int) -> str:
    """Mark the compile run finished with what it published."""
    urza = _urza()
    try:
        statuses = [a.status.value for a in artifacts]
        detail = {
            "published": len(artifacts) - reused,
            "reused": reused,
            "quarantined": statuses.count("quarantined"),
            "fallbacks": sum(1 for a in artifacts if a.fallback),
        }
        return urza.store.finish_compile_run(compile_run_id, state="finished", detail=detail).state
    finally:
        urza.close()
