"""Urza: the artifact registry (SQL descriptors, history, tags and lineage + content-addressed blobs)."""

from typing import TYPE_CHECKING

from esper_core._lazy import lazy_exports

if TYPE_CHECKING:
    from esper_core.urza.base import RegistryStore, canonical_params, params_key
    from esper_core.urza.blobs import BlobStore
    from esper_core.urza.errors import (
        ArtifactNotFoundError,
        ArtifactSignatureError,
        CompileRunNotFoundError,
        CorruptBlobError,
        InvalidStatusTransitionError,
        MissingBlobError,
        RegistryConflictError,
        RegistryError,
        RegistryUnavailableError,
        UnknownBlueprintInRegistryError,
        UnsignedArtifactError,
    )
    from esper_core.urza.memory import InMemoryRegistry
    from esper_core.urza.records import ArtifactRecord, CompileRun, StatusChange
    from esper_core.urza.schema import SchemaOutdatedError, SchemaTooNewError
    from esper_core.urza.service import GcReport, ResignReport, Urza
    from esper_core.urza.signing import ArtifactSigner, SigningKey
    from esper_core.urza.sql import SqlRegistry, upgrade_schema

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "esper_core.urza.base": ("RegistryStore", "canonical_params", "params_key"),
        "esper_core.urza.blobs": ("BlobStore",),
        "esper_core.urza.errors": (
            "ArtifactNotFoundError",
            "ArtifactSignatureError",
            "CompileRunNotFoundError",
            "CorruptBlobError",
            "InvalidStatusTransitionError",
            "MissingBlobError",
            "RegistryConflictError",
            "RegistryError",
            "RegistryUnavailableError",
            "UnknownBlueprintInRegistryError",
            "UnsignedArtifactError",
        ),
        "esper_core.urza.memory": ("InMemoryRegistry",),
        "esper_core.urza.records": ("ArtifactRecord", "CompileRun", "StatusChange"),
        "esper_core.urza.schema": ("SchemaOutdatedError", "SchemaTooNewError"),
        "esper_core.urza.service": ("GcReport", "ResignReport", "Urza"),
        "esper_core.urza.signing": ("ArtifactSigner", "SigningKey"),
        "esper_core.urza.sql": ("SqlRegistry", "upgrade_schema"),
    },
)

__all__ = [
    "ArtifactNotFoundError",
    "ArtifactRecord",
    "ArtifactSignatureError",
    "ArtifactSigner",
    "BlobStore",
    "CompileRun",
    "CompileRunNotFoundError",
    "CorruptBlobError",
    "GcReport",
    "InMemoryRegistry",
    "InvalidStatusTransitionError",
    "MissingBlobError",
    "RegistryConflictError",
    "RegistryError",
    "RegistryStore",
    "RegistryUnavailableError",
    "ResignReport",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "SigningKey",
    "SqlRegistry",
    "StatusChange",
    "UnknownBlueprintInRegistryError",
    "UnsignedArtifactError",
    "Urza",
    "canonical_params",
    "params_key",
    "upgrade_schema",
]
