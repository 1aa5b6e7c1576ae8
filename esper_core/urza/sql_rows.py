"""Conversions between Urza's SQL rows and its messages / records."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import Row

from esper_core.contracts import (
    ArtifactKind,
    ArtifactStatus,
    EnvironmentKey,
    GuardSchema,
    KernelArtifact,
    LatencyStats,
)
from esper_core.urza.base import canonical_params, params_key
from esper_core.urza.models import ArtifactRow, CompileRunRow
from esper_core.urza.records import CompileRun, StatusChange


def utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` as an aware UTC datetime (SQLite returns naive ones)."""
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def to_row(artifact: KernelArtifact, *, version: int) -> ArtifactRow:
    """A new ``artifacts`` row for ``artifact`` at ``version``."""
    env = artifact.environment
    return ArtifactRow(
        blueprint_id=artifact.blueprint_id,
        shape_profile=artifact.shape_profile,
        params_json=canonical_params(artifact.params),
        params_key=params_key(artifact.params),
        torch_version=env.torch_version,
        device_kind=env.device_kind,
        compiler=env.compiler,
        version=version,
        kind=artifact.kind.value,
        sha256=artifact.sha256,
        size_bytes=artifact.size_bytes,
        guard_json=artifact.guard.to_json(),
        latency_json=json.dumps(
            {k: v.model_dump(mode="json") for k, v in sorted(artifact.latency.items())},
            separators=(",", ":"),
        ),
        fallback=artifact.fallback,
        fallback_reason=artifact.fallback_reason,
        status=artifact.status.value,
        status_reason=artifact.status_reason,
        compile_ms=artifact.compile_ms,
        signature=artifact.signature,
        signature_key_id=artifact.signature_key_id,
    )


def to_artifact(row: ArtifactRow | Row[Any]) -> KernelArtifact:
    """Message from an ORM row or a Core row of ``artifacts`` (same attribute names)."""
    return KernelArtifact(
        blueprint_id=row.blueprint_id,
        shape_profile=row.shape_profile,
        params=json.loads(row.params_json),
        environment=EnvironmentKey(torch_version=row.torch_version, device_kind=row.device_kind, compiler=row.compiler),
        kind=ArtifactKind(row.kind),
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        guard=GuardSchema.from_json(row.guard_json),
        latency={k: LatencyStats.model_validate(v) for k, v in json.loads(row.latency_json).items()},
        fallback=row.fallback,
        fallback_reason=row.fallback_reason,
        status=ArtifactStatus(row.status),
        status_reason=row.status_reason,
        compile_ms=row.compile_ms,
        version=row.version,
        artifact_id=row.id,
        signature=row.signature,
        signature_key_id=row.signature_key_id,
    )


def to_compile_run(row: CompileRunRow | Row[Any]) -> CompileRun:
    """Record from a ``compile_runs`` row."""
    return CompileRun(
        run_id=row.id,
        state=row.state,
        compiler=row.compiler,
        torch_version=row.torch_version,
        device_kind=row.device_kind,
        hostname=row.hostname,
        detail=json.loads(row.detail_json),
        started_at=utc(row.started_at),
        finished_at=None if row.finished_at is None else utc(row.finished_at),
    )


def to_status_change(row: Row[Any]) -> StatusChange:
    """Record from an ``artifact_status_history`` row."""
    return StatusChange(
        status=ArtifactStatus(row.status), reason=row.reason, actor=row.actor, changed_at=utc(row.changed_at)
    )
