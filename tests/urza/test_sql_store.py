"""Urza's stores: RegistryStore semantics, then what only SQL has.

The Protocol tests run against SqlRegistry (a real SQLite file and, when installed, a real
PostgreSQL database) and InMemoryRegistry; the SQL-only tests cover WAL, BEGIN IMMEDIATE,
concurrent writer and opener processes on both dialects, and error translation.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError

import esper_core.urza
from esper_core.contracts import (
    ArtifactKind,
    ArtifactStatus,
    BlueprintDescriptor,
    BlueprintTier,
    EnvironmentKey,
    KernelArtifact,
)
from esper_core.urza.base import RegistryStore
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    RegistryError,
    UnknownBlueprintInRegistryError,
)
from esper_core.urza.sql import SqlRegistry

MakeArtifact = Callable[..., KernelArtifact]


def test_implements_the_protocol(registry_store: RegistryStore) -> None:
    assert isinstance(registry_store, RegistryStore)


def test_register_blueprint_is_an_idempotent_upsert(
    registry_store: RegistryStore, descriptor: BlueprintDescriptor
) -> None:
    registry_store.register_blueprint(descriptor)
    assert registry_store.list_blueprints() == [descriptor]
    changed = descriptor.model_copy(update={"tier": BlueprintTier.EXPERIMENTAL, "risk": 0.5})
    registry_store.register_blueprint(changed)
    assert registry_store.list_blueprints() == [changed]


def test_publish_assigns_id_and_version_and_round_trips(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    original = make_artifact()
    stored = registry_store.publish(original)
    assert stored.artifact_id is not None and stored.version == 1
    assert stored.model_copy(update={"artifact_id": None, "version": 0}) == original
    assert registry_store.get(stored.artifact_id) == stored


def test_publish_is_idempotent(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    first = registry_store.publish(make_artifact())
    again = registry_store.publish(make_artifact(compile_ms=1.0))
    assert again == first
    assert len(registry_store.list_artifacts()) == 1


def test_new_sha_for_the_same_key_is_the_next_version(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    v1 = registry_store.publish(make_artifact("v1"))
    v2 = registry_store.publish(make_artifact("v2"))
    assert (v1.version, v2.version) == (1, 2)
    # Re-publishing an older blob returns its existing row; it does not become v3.
    assert registry_store.publish(make_artifact("v1")) == v1
    # Another key starts its own sequence.
    other = registry_store.publish(make_artifact("v1", shape_profile="f32-b64"))
    assert other.version == 1
    other_params = registry_store.publish(make_artifact("v1", params={"expansion": 3.0}))
    assert other_params.version == 1


def test_find_active_returns_the_newest_active_version(
    registry_store: RegistryStore, make_artifact: MakeArtifact, env: EnvironmentKey
) -> None:
    assert registry_store.find_active("residual_mlp", "f16-b64", env) is None
    v1 = registry_store.publish(make_artifact("v1"))
    v2 = registry_store.publish(make_artifact("v2"))
    assert registry_store.find_active("residual_mlp", "f16-b64", env) == v2
    assert registry_store.find_active("residual_mlp", "f16-b64", env, {"expansion": 2}) == v2
    assert registry_store.find_active("residual_mlp", "f16-b64", env, {"expansion": 3}) is None
    assert registry_store.find_active("residual_mlp", "f32-b64", env) is None
    cuda = EnvironmentKey(torch_version="2.13.0", device_kind="cuda", compiler="torch.export")
    assert registry_store.find_active("residual_mlp", "f16-b64", cuda) is None

    quarantined = registry_store.set_status(v2.artifact_id or 0, ArtifactStatus.QUARANTINED, "G4 failed")
    assert quarantined.status is ArtifactStatus.QUARANTINED
    assert quarantined.status_reason == "G4 failed"
    # Quarantining the newest version rolls lookups back to the previous one.
    assert registry_store.find_active("residual_mlp", "f16-b64", env) == v1
    registry_store.set_status(v1.artifact_id or 0, ArtifactStatus.RETIRED, "superseded")
    assert registry_store.find_active("residual_mlp", "f16-b64", env) is None
    assert registry_store.get(v2.artifact_id or 0).status is ArtifactStatus.QUARANTINED


def test_list_artifacts_filters(
    registry_store: RegistryStore, make_artifact: MakeArtifact, descriptor: BlueprintDescriptor
) -> None:
    registry_store.register_blueprint(descriptor.model_copy(update={"blueprint_id": "norm_gate"}))
    a = registry_store.publish(make_artifact("a"))
    b = registry_store.publish(make_artifact("b", blueprint_id="norm_gate", params={}))
    c = registry_store.publish(make_artifact("c"))
    registry_store.set_status(c.artifact_id or 0, ArtifactStatus.QUARANTINED, "bad numerics")
    assert [x.sha256 for x in registry_store.list_artifacts()] == [a.sha256, b.sha256, c.sha256]
    assert [x.sha256 for x in registry_store.list_artifacts(blueprint_id="norm_gate")] == [b.sha256]
    active = registry_store.list_artifacts(blueprint_id="residual_mlp", status=ArtifactStatus.ACTIVE)
    assert [x.sha256 for x in active] == [a.sha256]


def test_fallback_artifacts_round_trip(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    eager = make_artifact("eager", kind=ArtifactKind.EAGER, fallback=True, fallback_reason="UserError: cannot export")
    stored = registry_store.publish(eager)
    assert registry_store.get(stored.artifact_id or 0).fallback_reason == "UserError: cannot export"


def test_missing_artifact_error_names_the_id_and_the_fix(registry_store: RegistryStore) -> None:
    with pytest.raises(ArtifactNotFoundError, match=r"no artifact with id 999 .*esper catalog compile"):
        registry_store.get(999)
    with pytest.raises(ArtifactNotFoundError, match="999"):
        registry_store.set_status(999, ArtifactStatus.RETIRED, "cleanup")


def test_publishing_an_unregistered_blueprint_fails_clearly(
    registry_store: RegistryStore, make_artifact: MakeArtifact
) -> None:
    with pytest.raises(UnknownBlueprintInRegistryError, match="'wide_mlp' is not registered"):
        registry_store.publish(make_artifact(blueprint_id="wide_mlp"))
    assert registry_store.list_artifacts() == []


def test_status_change_needs_a_reason(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    stored = registry_store.publish(make_artifact())
    with pytest.raises(ValueError, match="non-empty reason"):
        registry_store.set_status(stored.artifact_id or 0, ArtifactStatus.RETIRED, " ")


def test_signatures_are_stored_with_their_key_id(registry_store: RegistryStore, make_artifact: MakeArtifact) -> None:
    signed = registry_store.publish(make_artifact(signature="a" * 64, signature_key_id="k1"))
    assert (signed.signature, signed.signature_key_id) == ("a" * 64, "k1")
    resigned = registry_store.set_signature(signed.artifact_id or 0, signature="b" * 64, key_id="k2")
    assert registry_store.get(signed.artifact_id or 0) == resigned
    assert (resigned.signature, resigned.signature_key_id, resigned.version) == ("b" * 64, "k2", signed.version)
    with pytest.raises(ArtifactNotFoundError):
        registry_store.set_signature(999, signature="b" * 64, key_id="k2")


# --------------------------------------------------------------------------- SQL only


@pytest.fixture
def sql_registry(tmp_path: Path, descriptor: BlueprintDescriptor) -> Iterator[SqlRegistry]:
    registry = SqlRegistry(f"sqlite:///{tmp_path / 'registry.db'}")
    registry.register_blueprint(descriptor)
    yield registry
    registry.close()


def test_sqlite_connections_use_wal_and_foreign_keys(sql_registry: SqlRegistry) -> None:
    with sql_registry.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000


def test_writes_take_the_lock_up_front(sql_registry: SqlRegistry, make_artifact: MakeArtifact) -> None:
    statements: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(sql_registry.engine, "before_cursor_execute", record)
    stored = sql_registry.publish(make_artifact())
    assert statements[0] == "BEGIN IMMEDIATE"
    statements.clear()
    sql_registry.get(stored.artifact_id or 0)
    assert statements[0] == "BEGIN"


def test_data_survives_reopening(
    registry_url: str, make_artifact: MakeArtifact, descriptor: BlueprintDescriptor
) -> None:
    url = registry_url
    first = SqlRegistry(url)
    first.register_blueprint(descriptor)
    stored = first.publish(make_artifact())
    first.close()
    second = SqlRegistry(url)
    assert second.get(stored.artifact_id or 0) == stored
    assert second.list_blueprints() == [descriptor]
    second.close()


_WRITER = textwrap.dedent(
    """
    import hashlib
    import sys
    from esper_core.contracts import KernelArtifact
    from esper_core.urza.sql import SqlRegistry

    url, template, tag, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    registry = SqlRegistry(url)
    base = KernelArtifact.from_json(template)
    for i in range(count):
        sha = hashlib.sha256(f"{tag}-{i}".encode()).hexdigest()
        registry.publish(base.model_copy(update={"sha256": sha}))
    registry.close()
    """
)


def test_two_writer_processes_never_hit_database_is_locked(
    registry_url: str, make_artifact: MakeArtifact, descriptor: BlueprintDescriptor
) -> None:
    sql_registry = SqlRegistry(registry_url)
    sql_registry.register_blueprint(descriptor)
    count = 30
    root = Path(esper_core.urza.__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    args = [registry_url, make_artifact().to_json()]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, *args, tag, str(count)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
    versions = sorted(a.version for a in sql_registry.list_artifacts())
    assert versions == list(range(1, 2 * count + 1))
    sql_registry.close()


_OPENER = textwrap.dedent(
    """
    import sys
    from esper_core.urza.sql import SqlRegistry

    SqlRegistry(sys.argv[1]).close()
    """
)


def test_processes_opening_a_new_database_at_once_all_succeed(registry_url: str) -> None:
    # Regression: concurrent openers of a fresh file raced on WAL setup and CREATE TABLE
    # ("database is locked" from the compile tasks of one flow run).
    url = registry_url
    root = Path(esper_core.urza.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _OPENER, url], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
    registry = SqlRegistry(url)
    assert registry.list_artifacts() == []
    registry.close()


def test_threads_opening_a_new_database_at_once_all_succeed(tmp_path: Path) -> None:
    # Ten fresh files: the race (switching a new file to WAL) lost about once in 13 files before
    # the switch was retried, so a single file would rarely catch it.
    for attempt in range(10):
        url = f"sqlite:///{tmp_path / f'fresh-{attempt}.db'}"
        with ThreadPoolExecutor(max_workers=6) as pool:
            registries = list(pool.map(SqlRegistry, [url] * 6))
        for registry in registries:
            registry.close()


def test_database_errors_are_translated_and_chained(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="could not open the registry") as info:
        SqlRegistry(f"sqlite:///{tmp_path / 'no-such-dir' / 'registry.db'}")
    assert isinstance(info.value.__cause__, SQLAlchemyError)


def test_url_hides_the_password() -> None:
    registry = SqlRegistry("sqlite://")
    assert registry.url == "sqlite://"
    registry.close()
