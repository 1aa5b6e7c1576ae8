"""``Urza``: the registry facade that keeps descriptors (a ``RegistryStore``) and blobs together.

Ordering guarantee: a blob is written before the row that points at it, so a reader that finds a
row always finds its blob (unless the store was damaged, which ``MissingBlobError`` reports).
Garbage collection therefore only removes blobs that no row references *and* that are older than
a grace period: a blob staged for a publish that has not committed yet is young, so it is kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_core.contracts import BlueprintDescriptor, EnvironmentKey, KernelArtifact
from esper_core.urza.base import DEFAULT_ACTOR, RegistryStore
from esper_core.urza.blobs import BlobStore, StoredFile, sha256_hex
from esper_core.urza.errors import ArtifactNotFoundError
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


class Urza:
    """Artifact registry: descriptors in ``store``, blob bytes in ``blobs``.

    Args:
        store: Where blueprint and artifact descriptors live.
        blobs: Where artifact blobs live.
    """

    def __init__(self, store: RegistryStore, blobs: BlobStore) -> None:
        self.store = store
        self.blobs = blobs

    @classmethod
    def open(cls, home: Path, url: str | None = None, *, auto_upgrade: bool | None = None) -> Urza:
        """Open (creating if needed) a registry rooted at ``home``.

        Args:
            home: Directory for the default SQLite database and the blob store
                (``<home>/registry.db``, ``<home>/artifacts``).
            url: Database URL overriding the default SQLite file (e.g. PostgreSQL).
            auto_upgrade: Upgrade an older schema on open (default: SQLite yes, others no).

        Returns:
            The registry.

        Raises:
            SchemaOutdatedError: The schema is older and may not be upgraded automatically.
        """
        home = Path(home).resolve()
        home.mkdir(parents=True, exist_ok=True)
        store = SqlRegistry(url or f"sqlite:///{home / REGISTRY_DB_NAME}", auto_upgrade=auto_upgrade)
        return cls(store, BlobStore(home / BLOB_DIR_NAME))

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
        return self.store.publish(kernel.artifact, compile_run_id=compile_run_id, tags=tags, actor=actor)

    def fetch_blob(self, artifact: KernelArtifact) -> bytes:
        """The artifact's blob, verified against its SHA-256.

        Raises:
            MissingBlobError: The blob is not in the blob store.
            CorruptBlobError: The stored blob fails verification.
        """
        return self.blobs.get(artifact.sha256)

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
