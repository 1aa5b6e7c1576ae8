"""``Urza``: the registry facade that keeps descriptors (a ``RegistryStore``) and blobs together.

Ordering guarantee: a blob is written before the row that points at it, so a reader that finds a
row always finds its blob (unless the store was damaged, which ``MissingBlobError`` reports).
Garbage collection therefore only removes blobs that no row references *and* that are older than
a grace period: a blob staged for a publish that has not committed yet is young, so it is kept.

Signing: every artifact is signed when published (``signing.ArtifactSigner``) and verified in
``fetch_blob``, the one way kernels leave Urza, so an unsigned or mis-signed artifact is refused
before any deserialiser or native loader sees its bytes. A refusal is also kept as a
``urza.signature.refused`` event for the caller's telemetry (``drain_events``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_core.contracts import BlueprintDescriptor, EnvironmentKey, KernelArtifact, TelemetryEvent, TelemetryLevel
from esper_core.settings import EsperSettings
from esper_core.urza.base import DEFAULT_ACTOR, RegistryStore
from esper_core.urza.blobs import BlobStore, StoredFile, sha256_hex
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    ArtifactSignatureError,
    CorruptBlobError,
    MissingBlobError,
    UnsignedArtifactError,
)
from esper_core.urza.signing import ArtifactSigner, signed_descriptor
from esper_core.urza.sql import SqlRegistry

if TYPE_CHECKING:
    # Type-only: listing or fetching artifacts must not pay for importing torch.
    from esper_core.tezzeret.compiler import CompiledKernel

REGISTRY_DB_NAME = "registry.db"
BLOB_DIR_NAME = "artifacts"
GC_MIN_AGE_S = 3600.0
"""Default grace period of garbage collection: younger unreferenced blobs may be mid-publish."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GcReport:
    """What a garbage collection removed (or, in a dry run, would remove).

    Attributes:
        dry_run: Nothing was deleted.
        removed: Unreferenced blobs and leftover temp files past the grace period.
        referenced: Blobs kept because an artifact row points at them.
        too_young: Unreferenced files kept because they are younger than the grace period.
    """

    dry_run: bool
    removed: tuple[StoredFile, ...]
    referenced: int
    too_young: int

    @property
    def removed_bytes(self) -> int:
        """Bytes freed (or that would be)."""
        return sum(f.size_bytes for f in self.removed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "dry_run": self.dry_run,
            "removed": [{"path": str(f.path), "sha256": f.sha256, "size_bytes": f.size_bytes} for f in self.removed],
            "removed_bytes": self.removed_bytes,
            "referenced": self.referenced,
            "too_young": self.too_young,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ResignReport:
    """What ``Urza.resign`` did.

    Attributes:
        key_id: The key that signs now.
        resigned: Ids of artifacts (re-)signed: unsigned ones and those of an older key.
        current: Ids already signed with the current key and verified (left alone).
        refused: Ids whose signature or blob does not verify, with why (left alone: re-publish them).
        dry_run: Nothing was written.
    """

    key_id: str
    resigned: tuple[int, ...]
    current: tuple[int, ...]
    refused: tuple[tuple[int, str], ...]
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "key_id": self.key_id,
            "resigned": list(self.resigned),
            "current": list(self.current),
            "refused": [{"artifact_id": i, "why": why} for i, why in self.refused],
            "dry_run": self.dry_run,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyReport:
    """What ``Urza.verify_all`` found.

    Attributes:
        verified: Ids whose blob and signature check out.
        refused: Ids that do not, with why.
    """

    verified: tuple[int, ...]
    refused: tuple[tuple[int, str], ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "verified": list(self.verified),
            "refused": [{"artifact_id": i, "why": why} for i, why in self.refused],
        }


class Urza:
    """Artifact registry: descriptors in ``store``, blob bytes in ``blobs``.

    Args:
        store: Where blueprint and artifact descriptors live.
        blobs: Where artifact blobs live.
        signer: Signs and verifies artifacts; default: the keys of ``EsperSettings`` (from
            ``ESPER_*``), with the local key file in the blob store's parent directory (the
            registry's home), made on first use.
    """

    def __init__(self, store: RegistryStore, blobs: BlobStore, *, signer: ArtifactSigner | None = None) -> None:
        self.store = store
        self.blobs = blobs
        self._signer = signer
        self._events: list[TelemetryEvent] = []

    @property
    def signer(self) -> ArtifactSigner:
        """The artifact signer (created on first use: that may generate the local key)."""
        if self._signer is None:
            self._signer = ArtifactSigner.from_settings(EsperSettings(), home=self.blobs.root.parent)
        return self._signer

    def drain_events(self) -> list[TelemetryEvent]:
        """Telemetry events since the last call (signature refusals), for the caller to emit."""
        events, self._events = self._events, []
        return events

    @classmethod
    def open(
        cls,
        home: Path,
        url: str | None = None,
        *,
        auto_upgrade: bool | None = None,
        signer: ArtifactSigner | None = None,
    ) -> Urza:
        """Open (creating if needed) a registry rooted at ``home``.

        Args:
            home: Directory for the default SQLite database and the blob store
                (``<home>/registry.db``, ``<home>/artifacts``).
            url: Database URL overriding the default SQLite file (e.g. PostgreSQL).
            auto_upgrade: Upgrade an older schema on open (default: SQLite yes, others no).
            signer: Signs and verifies artifacts (default: see the class).

        Returns:
            The registry.

        Raises:
            SchemaOutdatedError: The schema is older and may not be upgraded automatically.
        """
        home = Path(home).resolve()
        home.mkdir(parents=True, exist_ok=True)
        store = SqlRegistry(url or f"sqlite:///{home / REGISTRY_DB_NAME}", auto_upgrade=auto_upgrade)
        return cls(store, BlobStore(home / BLOB_DIR_NAME), signer=signer)

    def close(self) -> None:
        """Release database connections (a no-op for stores that hold none)."""
        close = getattr(self.store, "close", None)
        if callable(close):
            close()

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a Karn descriptor (idempotent)."""
        self.store.register_blueprint(descriptor)

    def register_blueprints(self, descriptors: Iterable[BlueprintDescriptor]) -> None:
        """Register several descriptors, e.g. ``default_catalog().list()``."""
        for descriptor in descriptors:
            self.store.register_blueprint(descriptor)

    def publish(
        self,
        kernel: CompiledKernel,
        *,
        compile_run_id: str | None = None,
        tags: Sequence[str] = (),
        actor: str = DEFAULT_ACTOR,
    ) -> KernelArtifact:
        """Store a compiled kernel: blob first, then its row; idempotent.

        Args:
            kernel: Tezzeret's output.
            compile_run_id: The compile run that produced it (lineage).
            tags: Tags to attach.
            actor: Who publishes (recorded in the status history).

        Returns:
            The stored artifact, with ``artifact_id`` and ``version``.

        Raises:
            ValueError: The blob does not match ``kernel.artifact.sha256``.
            UnknownBlueprintInRegistryError: The blueprint is not registered.
        """
        actual = sha256_hex(kernel.blob)
        if actual != kernel.artifact.sha256:
            raise ValueError(
                f"kernel blob hashes to {actual} but its artifact says {kernel.artifact.sha256}: "
                "the blob was altered after compilation; recompile it with Tezzeret"
            )
        self.blobs.put(kernel.blob)
        return self.publish_artifact(
            kernel.artifact, blob=kernel.blob, compile_run_id=compile_run_id, tags=tags, actor=actor
        )

    def publish_artifact(
        self,
        artifact: KernelArtifact,
        *,
        blob: bytes | None = None,
        compile_run_id: str | None = None,
        tags: Sequence[str] = (),
        actor: str = DEFAULT_ACTOR,
    ) -> KernelArtifact:
        """Sign and publish a descriptor whose blob is already in the blob store.

        Args:
            artifact: The descriptor.
            blob: Its bytes when the caller holds them (else read back, SHA-256 verified).
            compile_run_id: The compile run that produced it (lineage).
            tags: Tags to attach.
            actor: Who publishes.

        Returns:
            The stored artifact, signed with the current key (a row the key already held
            unsigned, or signed with an older key, is re-signed).

        Raises:
            MissingBlobError: The blob is not in the blob store.
        """
        blob = self.blobs.get(artifact.sha256) if blob is None else blob
        signer = self.signer
        stored = self.store.publish(signer.sign(artifact, blob), compile_run_id=compile_run_id, tags=tags, actor=actor)
        if signer.is_current(stored):
            return stored
        resigned = signer.sign(stored, blob)
        return self.store.set_signature(
            stored.artifact_id or 0, signature=resigned.signature or "", key_id=signer.active.key_id
        )

    def fetch_blob(self, artifact: KernelArtifact) -> bytes:
        """The artifact's blob, its SHA-256 and signature verified (nothing is deserialised here).

        Raises:
            UnsignedArtifactError: The artifact has no signature (`esper registry resign`).
            ArtifactSignatureError: Its signature does not match its blob and descriptor, or
                its key is not held here.
            MissingBlobError: The blob is not in the blob store.
            CorruptBlobError: The stored blob fails verification.
        """
        if artifact.signature is None and artifact.artifact_id is not None:
            artifact = self._signed_row(artifact)
        try:
            self.signer.check_signed(artifact)
            blob = self.blobs.get(artifact.sha256)
            self.signer.verify(artifact, blob)
        except (UnsignedArtifactError, ArtifactSignatureError) as e:
            self._events.append(
                TelemetryEvent(
                    name="urza.signature.refused",
                    level=TelemetryLevel.ERROR,
                    message=str(e),
                    attributes={
                        "artifact_id": artifact.artifact_id or 0,
                        "blueprint_id": artifact.blueprint_id,
                        "key_id": artifact.signature_key_id or "",
                        "reason": "unsigned" if isinstance(e, UnsignedArtifactError) else "mismatch",
                    },
                )
            )
            raise
        return blob

    def _signed_row(self, copy: KernelArtifact) -> KernelArtifact:
        """The registry's row for an unsigned copy made before signing (e.g. in an old checkpoint).

        The row is used only if it describes exactly the same kernel; it may have been signed
        since by ``esper registry resign``. Otherwise the copy is returned (and refused).
        """
        try:
            row = self.store.get(copy.artifact_id or 0)
        except ArtifactNotFoundError:
            return copy
        return row if signed_descriptor(row) == signed_descriptor(copy) else copy

    def resign(self, *, dry_run: bool = False) -> ResignReport:
        """Sign every artifact that is unsigned or signed with an older key with the current key.

        An artifact signed with a key held here is re-signed only if that signature verifies, so
        rotating keys never launders a tampered artifact; unsigned (legacy) rows are signed as they
        are, which is the operator's statement that the registry's contents are trusted. Blobs
        are SHA-256 checked first either way.

        Args:
            dry_run: Report only.

        Returns:
            The report (refused artifacts are left alone: quarantine and re-publish them).
        """
        signer = self.signer
        resigned: list[int] = []
        current: list[int] = []
        refused: list[tuple[int, str]] = []
        for artifact in self.store.list_artifacts():
            artifact_id = artifact.artifact_id or 0
            try:
                blob = self.blobs.get(artifact.sha256)
                if artifact.signature is not None:
                    signer.verify(artifact, blob)
            except (ArtifactSignatureError, MissingBlobError, CorruptBlobError) as e:
                refused.append((artifact_id, str(e)))
                continue
            if signer.is_current(artifact):
                # Verified above like every other: "already signed" never vouches for a row
                # whose descriptor or blob changed after it was signed.
                current.append(artifact_id)
                continue
            if not dry_run:
                signed = signer.sign(artifact, blob)
                self.store.set_signature(artifact_id, signature=signed.signature or "", key_id=signer.active.key_id)
            resigned.append(artifact_id)
        return ResignReport(
            key_id=signer.active.key_id,
            resigned=tuple(resigned),
            current=tuple(current),
            refused=tuple(refused),
            dry_run=dry_run,
        )

    def verify_all(self) -> VerifyReport:
        """Check every artifact's blob (SHA-256) and signature, whatever its status.

        Returns:
            The ids that verify, and those that do not with why (quarantine and re-publish them).
        """
        verified: list[int] = []
        refused: list[tuple[int, str]] = []
        for artifact in self.store.list_artifacts():
            artifact_id = artifact.artifact_id or 0
            try:
                self.signer.verify(artifact, self.blobs.get(artifact.sha256))
            except (UnsignedArtifactError, ArtifactSignatureError, MissingBlobError, CorruptBlobError) as e:
                refused.append((artifact_id, str(e)))
                continue
            verified.append(artifact_id)
        return VerifyReport(verified=tuple(verified), refused=tuple(refused))

    def require_active(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
    ) -> tuple[KernelArtifact, bytes]:
        """The newest active artifact for the key and its verified blob.

        Raises:
            ArtifactNotFoundError: No active artifact; the message says how to publish one.
            MissingBlobError: The row exists but its blob does not.
            CorruptBlobError: The blob fails verification.
        """
        artifact = self.store.find_active(blueprint_id, shape_profile, environment, params)
        if artifact is None:
            env = environment
            env_text = f"{env.device_kind}/torch {env.torch_version}/{env.compiler}"
            raise ArtifactNotFoundError.for_key(blueprint_id, shape_profile, env_text, repr(self.store))
        return artifact, self.fetch_blob(artifact)

    def gc(self, *, dry_run: bool, min_age_s: float = GC_MIN_AGE_S) -> GcReport:
        """Remove blobs no artifact references, and leftover temp files, older than ``min_age_s``.

        Args:
            dry_run: Only report what would be removed.
            min_age_s: Grace period; younger files may belong to a publish in progress.

        Returns:
            The report.

        Raises:
            ValueError: ``min_age_s`` is negative.
        """
        if min_age_s < 0:
            raise ValueError(f"min_age_s must be >= 0, got {min_age_s}: it is the grace period in seconds")
        now = time.time()
        referenced = self.store.referenced_sha256s()
        kept = too_young = 0
        doomed: list[StoredFile] = []
        for stored in self.blobs.files():
            if stored.sha256 is not None and stored.sha256 in referenced:
                kept += 1
            elif now - stored.mtime < min_age_s:
                too_young += 1
            else:
                doomed.append(stored)
        if not dry_run and doomed:
            # Re-read right before deleting: a publish may have committed a row for one of them.
            referenced = self.store.referenced_sha256s()
            doomed = [f for f in doomed if f.sha256 not in referenced and self.blobs.remove(f)]
        return GcReport(dry_run=dry_run, removed=tuple(doomed), referenced=kept, too_young=too_young)
