"""Urza fixtures: the same Protocol suite runs against SQLite, PostgreSQL and the in-memory store.

PostgreSQL runs when its server binaries are installed (or ``ESPER_TEST_DB_URL`` names a
server): one private server per session, one fresh database per test.
"""

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
from tests.urza import postgres

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


_PG_SKIP = postgres.unavailable_reason()
SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.skipif(_PG_SKIP is not None, reason=_PG_SKIP or "")),
]


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """Admin URL of the session's PostgreSQL server (started on first use)."""
    with postgres.local_server() as url:
        yield url


@pytest.fixture(params=SQL_BACKENDS)
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty registry database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    admin = request.getfixturevalue("postgres_admin_url")
    with postgres.fresh_database(admin) as url:
        yield url


@pytest.fixture(params=[*SQL_BACKENDS, pytest.param("memory", id="memory")])
def registry_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryStore]:
    """A fresh store with ``residual_mlp`` registered: SQLite, PostgreSQL, or in memory."""
    if request.param == "memory":
        store = InMemoryRegistry()
        store.register_blueprint(DESCRIPTOR)
        yield store
        return
    if request.param == "sqlite":
        sql = SqlRegistry(f"sqlite:///{tmp_path / 'registry.db'}")
        sql.register_blueprint(DESCRIPTOR)
        yield sql
        sql.close()
        return
    with postgres.fresh_database(request.getfixturevalue("postgres_admin_url")) as url:
        sql = SqlRegistry(url)
        sql.register_blueprint(DESCRIPTOR)
        yield sql
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
