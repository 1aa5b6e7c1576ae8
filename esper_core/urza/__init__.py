"""Urza: the artifact registry (SQL descriptors, history, tags and lineage + content-addressed blobs)."""

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
