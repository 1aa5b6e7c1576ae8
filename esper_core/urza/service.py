"""``Urza``: the registry facade that keeps descriptors (a ``RegistryStore``) and blobs together.

Ordering guarantee: a blob is written before the row that points at it, so a reader that finds a
row always finds its blob (unless the store was damaged, which ``MissingBlobError`` reports).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from esper_core.contracts import BlueprintDescriptor, EnvironmentKey, KernelArtifact
from esper_core.urza.base import RegistryStore
from esper_core.urza.blobs import BlobStore, sha256_hex
from esper_core.urza.errors import ArtifactNotFoundError
from esper_core.urza.sql import SqlRegistry

if TYPE_CHECKING:
    # Type-only: listing or fetching artifacts must not pay for importing torch.
    from esper_core.tezzeret.compiler import CompiledKernel

REGISTRY_DB_NAME = "registry.db"
BLOB_DIR_NAME = "artifacts"


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
    def open(cls, home: Path, url: str | None = None) -> Urza:
        """Open (creating if needed) a registry rooted at ``home``.

        Args:
            home: Directory for the default SQLite database and the blob store
                (``<home>/registry.db``, ``<home>/artifacts``).
            url: Database URL overriding the default SQLite file (e.g. PostgreSQL).

        Returns:
            The registry.
        """
        home = Path(home).resolve()
        home.mkdir(parents=True, exist_ok=True)
        store = SqlRegistry(url or f"sqlite:///{home / REGISTRY_DB_NAME}")
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

    def publish(self, kernel: CompiledKernel) -> KernelArtifact:
        """Store a compiled kernel: blob first, then its row; idempotent.

        Args:
            kernel: Tezzeret's output.

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
        return self.store.publish(kernel.artifact)

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
