"""Urza: the artifact registry (SQL descriptors + content-addressed blobs)."""

from esper_core.urza.base import RegistryStore, canonical_params, params_key
from esper_core.urza.blobs import BlobStore
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    CorruptBlobError,
    MissingBlobError,
    RegistryConflictError,
    RegistryError,
    UnknownBlueprintInRegistryError,
)
from esper_core.urza.memory import InMemoryRegistry
from esper_core.urza.service import Urza
from esper_core.urza.sql import SqlRegistry

__all__ = [
    "ArtifactNotFoundError",
    "BlobStore",
    "CorruptBlobError",
    "InMemoryRegistry",
    "MissingBlobError",
    "RegistryConflictError",
    "RegistryError",
    "RegistryStore",
    "SqlRegistry",
    "UnknownBlueprintInRegistryError",
    "Urza",
    "canonical_params",
    "params_key",
]
