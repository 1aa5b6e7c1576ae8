"""Urza fixtures: the same Protocol suite runs against SQLite and the in-memory store."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from esper_core.contracts import (
    ArtifactKind,
    BlueprintDescriptor,
    BlueprintTier,
    EnvironmentKey,
    GuardSchema,
    KernelArtifact,
    LatencyStats,
)
from esper_core.urza.base import RegistryStore
from esper_core.urza.memory import InMemoryRegistry
from esper_core.urza.sql import SqlRegistry

ENV = EnvironmentKey(torch_version="2.13.0", device_kind="cpu", compiler="torch.export")
DESCRIPTOR = BlueprintDescriptor(
    blueprint_id="residual_mlp",
    name="Residual MLP",
    tier=BlueprintTier.SAFE,
    host_kinds=("mlp",),
    description="two-layer MLP",
    risk=0.2,
)

MakeArtifact = Callable[..., KernelArtifact]


def fake_sha(content: str) -> str:
    """A valid sha256 hex digest derived from ``content``."""
    return hashlib.sha256(content.encode()).hexdigest()


@pytest.fixture(params=["sql", "memory"])
def registry_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryStore]:
    """A fresh store with ``residual_mlp`` registered: a real SQLite file, or in memory."""
    store: RegistryStore
    if request.param == "sql":
        sql = SqlRegistry(f"sqlite:///{tmp_path / 'registry.db'}")
        store = sql
    else:
        store = InMemoryRegistry()
    store.register_blueprint(DESCRIPTOR)
    yield store
    if request.param == "sql":
        sql.close()


@pytest.fixture
def env() -> EnvironmentKey:
    """The environment key of ``make_artifact``'s artifacts."""
    return ENV


@pytest.fixture
def descriptor() -> BlueprintDescriptor:
    """The descriptor ``registry_store`` registers."""
    return DESCRIPTOR


@pytest.fixture
def make_artifact() -> MakeArtifact:
    """Builds a valid artifact; keyword overrides replace any field."""

    def make(content: str = "v1", **overrides: object) -> KernelArtifact:
        fields: dict[str, object] = {
            "blueprint_id": "residual_mlp",
            "shape_profile": "f16-b64",
            "params": {"expansion": 2.0},
            "environment": ENV,
            "kind": ArtifactKind.EXPORTED,
            "sha256": fake_sha(content),
            "size_bytes": 1234,
            "guard": GuardSchema(feature_shape=(16,), output_feature_shape=(16,), batch_max=64),
            "latency": {"b8": LatencyStats(p50_ms=0.1, p95_ms=0.2, max_ms=0.3, samples=20)},
            "compile_ms": 850.0,
        }
        fields.update(overrides)
        return KernelArtifact.model_validate(fields)

    return make
