"""Tezzeret and Urza tasks: compile a blueprint kernel, publish it."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from esper_core._capabilities import resolve_device
from esper_core.contracts import KernelArtifact, MetricPoint, TelemetryEvent, TelemetryLevel, TelemetryPacket
from esper_core.karn.catalog import default_catalog
from esper_core.pipeline import CompileJob, compile_job, find_published, publish_staged
from esper_core.urza.service import Urza
from tasks._runtime import service_sink, settings


@dataclass(frozen=True, kw_only=True, slots=True)
class StagedKernel:
    """A compiled kernel whose blob is in the blob store; ``reused`` when Urza already had it."""

    job: CompileJob
    artifact_json: str
    reused: bool


def _urza() -> Urza:
    s = settings()
    return Urza.open(s.home, s.registry_db_url)


# NO_CACHE: the registry is the compile cache (a published artifact is never rebuilt); a Prefect
# result cache could outlive a wiped registry and hand back a kernel that no longer exists.
@task(name="compile-blueprint", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE, tags=["tezzeret"])
def compile_blueprint(job: CompileJob, device: str = "auto") -> StagedKernel:
    """Compile ``job`` unless Urza already holds an active artifact for it here."""
    target = resolve_device(device)
    urza = _urza()
    try:
        existing = find_published(urza, job, target)
        if existing is not None:
            return StagedKernel(job=job, artifact_json=existing.to_json(), reused=True)
        kernel = compile_job(default_catalog(), job, target)
        # Blob first: content-addressed and atomic, so a crash here leaves at most an orphan blob.
        urza.blobs.put(kernel.blob)
    finally:
        urza.close()
    artifact = kernel.artifact
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
    return StagedKernel(job=job, artifact_json=artifact.to_json(), reused=False)


# NO_CACHE: publishing is idempotent in Urza itself (same key and hash -> same row).
@task(name="publish-artifact", retries=3, retry_delay_seconds=1, cache_policy=NO_CACHE, tags=["urza"])
def publish_artifact(staged: StagedKernel) -> KernelArtifact:
    """Record a staged kernel in Urza (idempotent); returns the stored descriptor."""
    artifact = KernelArtifact.from_json(staged.artifact_json)
    if staged.reused:
        return artifact
    urza = _urza()
    try:
        return publish_staged(urza, default_catalog(), artifact)
    finally:
        urza.close()
