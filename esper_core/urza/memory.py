"""``InMemoryRegistry``: the ``RegistryStore`` in process memory, for tests and dry runs.

It follows ``SqlRegistry``'s semantics exactly (versions, idempotency, statuses and history,
tags, lineage, errors); the shared Protocol test suite runs against both.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Collection, Mapping, Sequence

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, EnvironmentKey, KernelArtifact
from esper_core.urza.base import (
    ACTIVE_ONLY,
    DEFAULT_ACTOR,
    check_new_status,
    check_reason,
    check_transition,
    params_key,
)
from esper_core.urza.errors import ArtifactNotFoundError, CompileRunNotFoundError, UnknownBlueprintInRegistryError
from esper_core.urza.records import ArtifactRecord, CompileRun, StatusChange, check_tags

_WHERE = "the in-memory registry"


def _key(artifact: KernelArtifact) -> tuple[str, str, str, EnvironmentKey]:
    return (
        artifact.blueprint_id,
        artifact.shape_profile,
        params_key(artifact.params),
        artifact.environment,
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class InMemoryRegistry:
    """A ``RegistryStore`` backed by dicts; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blueprints: dict[str, BlueprintDescriptor] = {}
        self._artifacts: dict[int, KernelArtifact] = {}
        self._tags: dict[int, set[str]] = {}
        self._history: dict[int, list[StatusChange]] = {}
        self._lineage: dict[int, str] = {}
        self._runs: dict[str, CompileRun] = {}

    def __repr__(self) -> str:
        return "InMemoryRegistry()"

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a blueprint descriptor (idempotent)."""
        with self._lock:
            self._blueprints[descriptor.blueprint_id] = descriptor

    def list_blueprints(self) -> list[BlueprintDescriptor]:
        """Every registered descriptor, sorted by id."""
        with self._lock:
            return [self._blueprints[k] for k in sorted(self._blueprints)]

    def publish(
        self,
        artifact: KernelArtifact,
        *,
        compile_run_id: str | None = None,
        tags: Sequence[str] = (),
        actor: str = DEFAULT_ACTOR,
    ) -> KernelArtifact:
        """Store an artifact descriptor; idempotent per (key, sha256). See ``RegistryStore``."""
        checked = check_tags(tags)
        key = _key(artifact)
        with self._lock:
            descriptor = self._blueprints.get(artifact.blueprint_id)
            if descriptor is None:
                raise UnknownBlueprintInRegistryError(artifact.blueprint_id, _WHERE)
            same_key = [a for a in self._artifacts.values() if _key(a) == key]
            for stored in sorted(same_key, key=lambda a: a.version):
                if stored.sha256 == artifact.sha256:
                    self._tags[stored.artifact_id or 0].update(checked)
                    return stored
            check_new_status(artifact.status, descriptor.tier, artifact.blueprint_id)
            if compile_run_id is not None and compile_run_id not in self._runs:
                raise CompileRunNotFoundError(compile_run_id, _WHERE)
            artifact_id = len(self._artifacts) + 1
            stored = artifact.model_copy(
                update={
                    "artifact_id": artifact_id,
                    "version": 1 + max((a.version for a in same_key), default=0),
                    "params": {k: float(artifact.params[k]) for k in sorted(artifact.params)},
                }
            )
            self._artifacts[artifact_id] = stored
            reason = artifact.status_reason or f"published {artifact.status.value}"
            self._history[artifact_id] = [
                StatusChange(status=artifact.status, reason=reason, actor=actor, changed_at=_now())
            ]
            self._tags[artifact_id] = set(checked)
            if compile_run_id is not None:
                self._lineage[artifact_id] = compile_run_id
            return stored

    def get(self, artifact_id: int) -> KernelArtifact:
        """The artifact with ``artifact_id``; ``ArtifactNotFoundError`` if absent."""
        with self._lock:
            return self._require(artifact_id)

    def find_active(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
    ) -> KernelArtifact | None:
        """The newest ACTIVE artifact for the key; any params when ``params`` is None."""
        return self.find(blueprint_id, shape_profile, environment, params)

    def find(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
        *,
        statuses: Collection[ArtifactStatus] = ACTIVE_ONLY,
        compiled_only: bool = False,
    ) -> KernelArtifact | None:
        """The newest artifact for the key in one of ``statuses`` (not a fallback if ``compiled_only``)."""
        wanted = None if params is None else params_key(params)
        with self._lock:
            candidates = [
                a
                for a in self._artifacts.values()
                if a.blueprint_id == blueprint_id
                and a.shape_profile == shape_profile
                and a.environment == environment
                and a.status in statuses
                and not (compiled_only and a.fallback)
                and (wanted is None or params_key(a.params) == wanted)
            ]
        return max(candidates, key=lambda a: a.artifact_id or 0, default=None)

    def list_artifacts(
        self,
        *,
        blueprint_id: str | None = None,
        status: ArtifactStatus | None = None,
        tag: str | None = None,
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered by blueprint, status and tag, oldest first."""
        with self._lock:
            return [
                self._artifacts[i]
                for i in sorted(self._artifacts)
                if (blueprint_id is None or self._artifacts[i].blueprint_id == blueprint_id)
                and (status is None or self._artifacts[i].status is status)
                and (tag is None or tag in self._tags[i])
            ]

    def set_status(
        self, artifact_id: int, status: ArtifactStatus, reason: str, *, actor: str = DEFAULT_ACTOR
    ) -> KernelArtifact:
        """Change an artifact's status and append it to the history."""
        check_reason(reason)
        with self._lock:
            artifact = self._require(artifact_id)
            check_transition(artifact_id, artifact.status, status, self._blueprints[artifact.blueprint_id].tier)
            updated = artifact.model_copy(update={"status": status, "status_reason": reason})
            self._artifacts[artifact_id] = updated
            self._history[artifact_id].append(
                StatusChange(status=status, reason=reason, actor=actor, changed_at=_now())
            )
            return updated

    def set_signature(self, artifact_id: int, *, signature: str, key_id: str) -> KernelArtifact:
        """Store an artifact's signature and its key id."""
        with self._lock:
            updated = self._require(artifact_id).model_copy(update={"signature": signature, "signature_key_id": key_id})
            self._artifacts[artifact_id] = updated
            return updated

    def add_tags(self, artifact_id: int, tags: Sequence[str]) -> tuple[str, ...]:
        """Add tags (idempotent) and return all of the artifact's tags, sorted."""
        checked = check_tags(tags)
        with self._lock:
            self._require(artifact_id)
            self._tags[artifact_id].update(checked)
            return tuple(sorted(self._tags[artifact_id]))

    def record(self, artifact_id: int) -> ArtifactRecord:
        """The artifact with its tags, lineage and status history."""
        with self._lock:
            artifact = self._require(artifact_id)
            run_id = self._lineage.get(artifact_id)
            return ArtifactRecord(
                artifact=artifact,
                tags=tuple(sorted(self._tags[artifact_id])),
                compile_run=None if run_id is None else self._runs[run_id],
                history=tuple(self._history[artifact_id]),
            )

    def start_compile_run(self, run: CompileRun) -> CompileRun:
        """Record a compile run as running (idempotent per ``run_id``)."""
        with self._lock:
            if run.run_id not in self._runs:
                self._runs[run.run_id] = dataclasses.replace(run, state="running", started_at=_now())
            return self._runs[run.run_id]

    def finish_compile_run(self, run_id: str, *, state: str, detail: Mapping[str, object]) -> CompileRun:
        """Mark a compile run finished or failed and merge ``detail`` into its facts."""
        if state not in ("finished", "failed"):
            raise ValueError(f"a compile run ends 'finished' or 'failed', got {state!r}")
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                raise CompileRunNotFoundError(run_id, _WHERE)
            done = dataclasses.replace(run, state=state, finished_at=_now(), detail={**run.detail, **detail})
            self._runs[run_id] = done
            return done

    def referenced_sha256s(self) -> set[str]:
        """The blob hashes any artifact points at."""
        with self._lock:
            return {a.sha256 for a in self._artifacts.values()}

    def _require(self, artifact_id: int) -> KernelArtifact:
        artifact = self._artifacts.get(artifact_id)
        if artifact is None:
            raise ArtifactNotFoundError.for_id(artifact_id, _WHERE)
        return artifact
