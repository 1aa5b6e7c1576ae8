"""The registry store interface; ``SqlRegistry`` and ``InMemoryRegistry`` implement it.

An artifact's *key* is (blueprint_id, shape_profile, params, environment). Each key has a
sequence of versions 1, 2, ...; publishing a new blob (sha256) for a key appends a version,
publishing a blob the key already holds returns that version unchanged.

Statuses: an artifact is published ACTIVE or QUARANTINED; ACTIVE and QUARANTINED may move to
each other and to RETIRED; RETIRED is final (publish a new version instead). Artifacts of a
high-risk blueprint are quarantine-only: they are never ACTIVE. Every status an artifact enters
is appended to its history with a reason and an actor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol, runtime_checkable

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, BlueprintTier, EnvironmentKey, KernelArtifact
from esper_core.urza.errors import InvalidStatusTransitionError
from esper_core.urza.records import ArtifactRecord, CompileRun

DEFAULT_ACTOR = "esper"
ACTIVE_ONLY: tuple[ArtifactStatus, ...] = (ArtifactStatus.ACTIVE,)


@runtime_checkable
class RegistryStore(Protocol):
    """Where blueprint descriptors, artifact descriptors and their history are kept (not the blobs)."""

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a blueprint descriptor (idempotent)."""
        ...

    def list_blueprints(self) -> list[BlueprintDescriptor]:
        """Every registered descriptor, sorted by id."""
        ...

    def publish(
        self,
        artifact: KernelArtifact,
        *,
        compile_run_id: str | None = None,
        tags: Sequence[str] = (),
        actor: str = DEFAULT_ACTOR,
    ) -> KernelArtifact:
        """Store an artifact descriptor in one transaction; return it with ``artifact_id`` and ``version``.

        A new row also gets its first history entry, its tags and its lineage. Publishing a blob
        the key already holds returns the stored row unchanged (tags are added to it).

        Raises:
            UnknownBlueprintInRegistryError: Its blueprint is not registered.
            CompileRunNotFoundError: ``compile_run_id`` names no compile run.
            InvalidStatusTransitionError: An ACTIVE artifact of a high-risk blueprint.
            ValueError: Invalid tags.
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
        ...

    def list_artifacts(
        self,
        *,
        blueprint_id: str | None = None,
        status: ArtifactStatus | None = None,
        tag: str | None = None,
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered, oldest first."""
        ...

    def set_status(
        self, artifact_id: int, status: ArtifactStatus, reason: str, *, actor: str = DEFAULT_ACTOR
    ) -> KernelArtifact:
        """Change an artifact's status, append it to the history, return the updated artifact.

        Raises:
            ArtifactNotFoundError: No such id.
            InvalidStatusTransitionError: Not allowed (see the module docstring).
            ValueError: ``reason`` is empty.
        """
        ...

    def set_signature(self, artifact_id: int, *, signature: str, key_id: str) -> KernelArtifact:
        """Store an artifact's signature and the id of its key; return the updated artifact.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        ...

    def add_tags(self, artifact_id: int, tags: Sequence[str]) -> tuple[str, ...]:
        """Add tags (idempotent) and return all of the artifact's tags, sorted.

        Raises:
            ArtifactNotFoundError: No such id.
            ValueError: Invalid tags.
        """
        ...

    def record(self, artifact_id: int) -> ArtifactRecord:
        """The artifact with its tags, lineage and status history.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        ...

    def start_compile_run(self, run: CompileRun) -> CompileRun:
        """Record a compile run as running (idempotent per ``run_id``: a retried start is fine)."""
        ...

    def finish_compile_run(self, run_id: str, *, state: str, detail: Mapping[str, object]) -> CompileRun:
        """Mark a compile run finished or failed and merge ``detail`` into its facts.

        Raises:
            CompileRunNotFoundError: No such run.
            ValueError: ``state`` is not ``finished`` or ``failed``.
        """
        ...

    def referenced_sha256s(self) -> set[str]:
        """The blob hashes any artifact row points at (garbage collection keeps these)."""
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


def check_transition(artifact_id: int, current: ArtifactStatus, new: ArtifactStatus, tier: BlueprintTier) -> None:
    """Refuse a status change the registry does not allow.

    Raises:
        InvalidStatusTransitionError: Same status, out of RETIRED, or a high-risk artifact to ACTIVE.
    """
    if new is current:
        raise InvalidStatusTransitionError(f"artifact {artifact_id} is already {current.value}: nothing to change")
    if current is ArtifactStatus.RETIRED:
        raise InvalidStatusTransitionError(
            f"artifact {artifact_id} is retired, which is final: publish a new version instead "
            "(`esper catalog compile <blueprint>`)"
        )
    check_publish_status(new, tier, f"artifact {artifact_id}")


def check_publish_status(status: ArtifactStatus, tier: BlueprintTier, what: str) -> None:
    """Refuse a status an artifact may not be published with or moved to.

    Raises:
        InvalidStatusTransitionError: ACTIVE for a high-risk (quarantine-only) blueprint.
    """
    if status is ArtifactStatus.ACTIVE and tier is BlueprintTier.HIGH_RISK:
        raise InvalidStatusTransitionError(
            f"{what} belongs to a high_risk blueprint, which is quarantine-only: it can be published "
            "and evaluated as quarantined but never made active; use a safe or experimental blueprint"
        )


def check_new_status(status: ArtifactStatus, tier: BlueprintTier, blueprint_id: str) -> None:
    """Refuse the status of a new artifact: RETIRED, or ACTIVE for a high-risk blueprint.

    Raises:
        InvalidStatusTransitionError: The message says what to publish instead.
    """
    if status is ArtifactStatus.RETIRED:
        raise InvalidStatusTransitionError(
            f"a new {blueprint_id} artifact cannot be published retired: publish it active or quarantined"
        )
    check_publish_status(status, tier, f"the new {blueprint_id} artifact")
