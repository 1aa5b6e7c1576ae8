"""The registry store interface; ``SqlRegistry`` and ``InMemoryRegistry`` implement it.

An artifact's *key* is (blueprint_id, shape_profile, params, environment). Each key has a
sequence of versions 1, 2, ...; publishing a new blob (sha256) for a key appends a version,
publishing a blob the key already holds returns that version unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, EnvironmentKey, KernelArtifact


@runtime_checkable
class RegistryStore(Protocol):
    """Where blueprint descriptors and artifact descriptors are kept (not the blobs)."""

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a blueprint descriptor (idempotent)."""
        ...

    def list_blueprints(self) -> list[BlueprintDescriptor]:
        """Every registered descriptor, sorted by id."""
        ...

    def publish(self, artifact: KernelArtifact) -> KernelArtifact:
        """Store an artifact descriptor; return it with ``artifact_id`` and ``version`` set.

        Raises:
            UnknownBlueprintInRegistryError: Its blueprint is not registered.
        """
        ...

    def get(self, artifact_id: int) -> KernelArtifact:
        """The artifact with ``artifact_id``.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        ...

    def find_active(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
    ) -> KernelArtifact | None:
        """The newest ACTIVE artifact for the key; any params when ``params`` is None."""
        ...

    def list_artifacts(
        self, *, blueprint_id: str | None = None, status: ArtifactStatus | None = None
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered, oldest first."""
        ...

    def set_status(self, artifact_id: int, status: ArtifactStatus, reason: str) -> KernelArtifact:
        """Change an artifact's status (e.g. quarantine it) and return the updated artifact.

        Raises:
            ArtifactNotFoundError: No such id.
            ValueError: ``reason`` is empty.
        """
        ...


def canonical_params(params: Mapping[str, float]) -> str:
    """Canonical JSON of parameters: sorted keys, float values, no whitespace."""
    return json.dumps({k: float(params[k]) for k in sorted(params)}, separators=(",", ":"))


def params_key(params: Mapping[str, float]) -> str:
    """SHA-256 of ``canonical_params``: equal parameter sets give equal keys."""
    return hashlib.sha256(canonical_params(params).encode()).hexdigest()


def check_reason(reason: str) -> None:
    """Reject an empty status reason (every status change must say why)."""
    if not reason or not reason.strip():
        raise ValueError("set_status needs a non-empty reason, e.g. 'G4 regression in run <id>'")
