"""``InMemoryRegistry``: the ``RegistryStore`` in process memory, for tests and dry runs.

It follows ``SqlRegistry``'s semantics exactly (versions, idempotency, errors); the shared
Protocol test suite runs against both.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, EnvironmentKey, KernelArtifact
from esper_core.urza.base import check_reason, params_key
from esper_core.urza.errors import ArtifactNotFoundError, UnknownBlueprintInRegistryError

_WHERE = "the in-memory registry"


def _key(artifact: KernelArtifact) -> tuple[str, str, str, EnvironmentKey]:
    return (
        artifact.blueprint_id,
        artifact.shape_profile,
        params_key(artifact.params),
        artifact.environment,
    )


class InMemoryRegistry:
    """A ``RegistryStore`` backed by dicts; thread-safe, lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blueprints: dict[str, BlueprintDescriptor] = {}
        self._artifacts: dict[int, KernelArtifact] = {}

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

    def publish(self, artifact: KernelArtifact) -> KernelArtifact:
        """Store an artifact descriptor; idempotent per (key, sha256). See ``RegistryStore``."""
        key = _key(artifact)
        with self._lock:
            if artifact.blueprint_id not in self._blueprints:
                raise UnknownBlueprintInRegistryError(artifact.blueprint_id, _WHERE)
            same_key = [a for a in self._artifacts.values() if _key(a) == key]
            for stored in sorted(same_key, key=lambda a: a.version):
                if stored.sha256 == artifact.sha256:
                    return stored
            artifact_id = len(self._artifacts) + 1
            stored = artifact.model_copy(
                update={
                    "artifact_id": artifact_id,
                    "version": 1 + max((a.version for a in same_key), default=0),
                    "params": {k: float(artifact.params[k]) for k in sorted(artifact.params)},
                }
            )
            self._artifacts[artifact_id] = stored
            return stored

    def get(self, artifact_id: int) -> KernelArtifact:
        """The artifact with ``artifact_id``; ``ArtifactNotFoundError`` if absent."""
        with self._lock:
            artifact = self._artifacts.get(artifact_id)
        if artifact is None:
            raise ArtifactNotFoundError.for_id(artifact_id, _WHERE)
        return artifact

    def find_active(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
    ) -> KernelArtifact | None:
        """The newest ACTIVE artifact for the key; any params when ``params`` is None."""
        wanted = None if params is None else params_key(params)
        with self._lock:
            candidates = [
                a
                for a in self._artifacts.values()
                if a.blueprint_id == blueprint_id
                and a.shape_profile == shape_profile
                and a.environment == environment
                and a.status is ArtifactStatus.ACTIVE
                and (wanted is None or params_key(a.params) == wanted)
            ]
        return max(candidates, key=lambda a: a.artifact_id or 0, default=None)

    def list_artifacts(
        self, *, blueprint_id: str | None = None, status: ArtifactStatus | None = None
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered by blueprint and status, oldest first."""
        with self._lock:
            return [
                self._artifacts[i]
                for i in sorted(self._artifacts)
                if (blueprint_id is None or self._artifacts[i].blueprint_id == blueprint_id)
                and (status is None or self._artifacts[i].status is status)
            ]

    def set_status(self, artifact_id: int, status: ArtifactStatus, reason: str) -> KernelArtifact:
        """Change an artifact's status and record why."""
        check_reason(reason)
        with self._lock:
            artifact = self._artifacts.get(artifact_id)
            if artifact is None:
                raise ArtifactNotFoundError.for_id(artifact_id, _WHERE)
            updated = artifact.model_copy(update={"status": status, "status_reason": reason})
            self._artifacts[artifact_id] = updated
            return updated
