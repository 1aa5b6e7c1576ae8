"""Urza's schema: migrations equal the models, old registries upgrade, newer ones are refused.

HOW TO FIX a failure of ``test_migrations_build_exactly_the_models_schema``: you changed
``esper_core/urza/models.py`` (or another module of ``MODEL_MODULES``) without a migration. Run
``python -m esper_core.urza.migrations revision -m "what changed"``, review the generated file in
``esper_core/urza/migrations/versions/`` and commit it (see ``MIGRATION-NOTES.md``).
"""

from __future__ import annotations

import json

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from esper_core.contracts import ArtifactStatus
from esper_core.urza import schema
from esper_core.urza.schema import SchemaOutdatedError, SchemaTooNewError
from esper_core.urza.sql import SqlRegistry, upgrade_schema
from esper_core.urza.sql_engine import create_registry_engine
from tests.urza.revisions import migrate

_ARTIFACT_ROW = {
    "blueprint_id": "residual_mlp",
    "shape_profile": "f16-b64",
    "params_json": '{"expansion":2.0}',
    "params_key": "0" * 64,
    "torch_version": "2.13.0",
    "device_kind": "cpu",
    "compiler": "torch.export",
    "version": 1,
    "kind": "exported",
    "sha256": "a" * 64,
    "size_bytes": 10,
    "guard_json": json.dumps({"feature_shape": [16], "output_feature_shape": [16], "batch_max": 64}),
    "latency_json": "{}",
    "fallback": False,
    "fallback_reason": None,
    "status": "quarantined",
    "status_reason": "G4 regression",
    "compile_ms": 1.0,
}


def _insert_old_rows(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO blueprints (blueprint_id, name, tier, descriptor_json, created_at) VALUES "
                "('residual_mlp', 'Residual MLP', 'safe', :d, CURRENT_TIMESTAMP)"
            ),
            {
                "d": json.dumps(
                    {
                        "blueprint_id": "residual_mlp",
                        "name": "Residual MLP",
                        "tier": "safe",
                        "host_kinds": ["mlp"],
                        "description": "d",
                        "risk": 0.2,
                    }
                )
            },
        )
        columns = ", ".join(_ARTIFACT_ROW)
        values = ", ".join(f":{k}" for k in _ARTIFACT_ROW)
        conn.execute(
            text(f"INSERT INTO artifacts ({columns}, created_at) VALUES ({values}, CURRENT_TIMESTAMP)"), _ARTIFACT_ROW
        )
    engine.dispose()


def test_revision_chain_matches_alembic() -> None:
    config = Config()
    config.set_main_option("script_location", str(schema.MIGRATIONS_DIR))
    script = ScriptDirectory.from_config(config)
    assert script.get_heads() == [schema.head_revision()]
    walked = [rev.revision for rev in script.walk_revisions()]
    assert tuple(reversed(walked)) == schema.revisions()
    assert schema.revisions()[0] == schema.BASELINE_REVISION


def test_migrations_build_exactly_the_models_schema(registry_url: str) -> None:
    migrate(registry_url, "head")
    engine = create_registry_engine(registry_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.target_metadata())
    engine.dispose()
    assert diff == [], (
        "models and migrations differ: add a revision with "
        f'`python -m esper_core.urza.migrations revision -m "..."` (see {schema.MIGRATIONS_DIR}/MIGRATION-NOTES.md)'
    )


def test_a_fresh_registry_is_created_at_head(registry_url: str) -> None:
    registry = SqlRegistry(registry_url)
    assert registry.revision() == schema.head_revision()
    with registry.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) >= {
            "blueprints",
            "artifacts",
            "artifact_status_history",
            "artifact_tags",
            "compile_runs",
            "artifact_lineage",
            "simic_field_reports",
            "simic_decisions",
            "simic_policies",
            "alembic_version",
        }
    registry.close()


def test_a_pre_alembic_sqlite_registry_is_upgraded_in_place(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    migrate(url, schema.BASELINE_REVISION, pre_alembic=True)
    _insert_old_rows(url)
    registry = SqlRegistry(url)  # SQLite: upgraded automatically
    assert registry.revision() == schema.head_revision()
    [artifact] = registry.list_artifacts()
    assert artifact.status is ArtifactStatus.QUARANTINED
    [entry] = registry.record(artifact.artifact_id or 0).history
    assert (entry.status, entry.reason, entry.actor) == (ArtifactStatus.QUARANTINED, "G4 regression", "migration 0002")
    registry.close()


def test_an_outdated_registry_is_refused_until_upgraded(registry_url: str) -> None:
    migrate(registry_url, schema.BASELINE_REVISION)
    _insert_old_rows(registry_url)
    # PostgreSQL never upgrades on open; SQLite does unless told not to.
    with pytest.raises(SchemaOutdatedError, match=r"revision 0001, this Esper needs .*esper registry upgrade"):
        SqlRegistry(registry_url, auto_upgrade=False)
    assert upgrade_schema(registry_url) == (schema.BASELINE_REVISION, schema.head_revision())
    assert upgrade_schema(registry_url) == (schema.head_revision(), schema.head_revision())
    registry = SqlRegistry(registry_url, auto_upgrade=False)
    assert [a.sha256 for a in registry.list_artifacts()] == ["a" * 64]
    registry.close()


def test_open_upgrades_sqlite_but_never_postgresql(registry_url: str) -> None:
    migrate(registry_url, schema.BASELINE_REVISION)
    if registry_url.startswith("sqlite"):
        registry = SqlRegistry(registry_url)
        assert registry.revision() == schema.head_revision()
        registry.close()
        return
    # A shared server is upgraded deliberately (after a backup), never by a job that opens it.
    with pytest.raises(SchemaOutdatedError, match="esper registry upgrade"):
        SqlRegistry(registry_url)


def test_a_newer_schema_is_refused(registry_url: str) -> None:
    SqlRegistry(registry_url).close()
    engine = create_engine(registry_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(SchemaTooNewError, match="'9999', which this Esper does not know"):
        SqlRegistry(registry_url)
    with pytest.raises(SchemaTooNewError):
        upgrade_schema(registry_url)
