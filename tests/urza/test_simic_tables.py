"""Revision 0003 puts Simic's tables under Urza's versioning, keeping those an older Simic made.

Before 0003, ``SimicStore`` created its tables itself (``create_all`` on its own metadata with
Urza's naming convention) in registries at revision 0002; ``_create_simic_tables_the_old_way``
does the same here. That a fresh registry gets them at head is checked with Urza's other tables
in ``test_schema.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, inspect, select, text

from esper_core.urza import schema
from esper_core.urza.models import NAMING_CONVENTION
from esper_core.urza.sql import SqlRegistry, upgrade_schema
from esper_core.urza.sql_engine import create_registry_engine
from tests.urza.revisions import migrate

SIMIC_TABLES = ("simic_field_reports", "simic_decisions", "simic_policies")
_WHEN = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
# One row per table, as Simic wrote them before 0003 (created_at left out of comparisons:
# SQLite hands datetimes back without their time zone).
_ROWS: dict[str, dict[str, Any]] = {
    "simic_field_reports": {
        "report_id": "r" * 32,
        "run_id": "run-a",
        "command_id": "c1",
        "epoch": 3,
        "action": "seed.germinate",
        "issued_by": "heuristic",
        "slot_id": "slot0",
        "blueprint_id": None,
        "outcome": "success",
        "observation_epochs": 2,
        "metric_deltas_json": '{"val_loss": -0.1}',
        "report_json": "{}",
    },
    "simic_decisions": {
        "command_id": "c1",
        "run_id": "run-a",
        "epoch": 3,
        "policy": "heuristic",
        "policy_version": None,
        "action": "seed.germinate",
        "proposal_json": "{}",
        "command_json": "{}",
        "state_json": "{}",
        "val_accuracy": 0.75,
        "val_loss": 0.5,
        "host_params": 12_345_678_901,
        "seed_params": 576,
        "log_prob": -1.25,
        "value": None,
    },
    "simic_policies": {
        "version": 1,
        "parent_version": None,
        "method": "imitation",
        "sha256": "b" * 64,
        "size_bytes": 2048,
        "gnn_config_json": '{"hidden_dim": 8}',
        "feature_dims_json": "{}",
        "provenance_json": '{"runs": ["run-a"]}',
        "status": "active",
    },
}


# Columns later revisions added (0004: a decision's counterfactual outcome; 0005: a policy's
# signature): an older Simic's tables lack them, and its rows read NULL there after the upgrade.
_ADDED_LATER: dict[str, dict[str, Any]] = {
    "simic_decisions": {"counterfactual_json": None},
    "simic_policies": {"signature": None, "signature_key_id": None},
}
_ROWS_AT_HEAD = {name: [{**row, **_ADDED_LATER.get(name, {})}] for name, row in _ROWS.items()}


def _create_simic_tables_the_old_way(url: str) -> None:
    old = MetaData(naming_convention=NAMING_CONVENTION)
    for name in SIMIC_TABLES:
        schema.target_metadata().tables[name].to_metadata(old)
    engine = create_registry_engine(url)
    with engine.begin() as conn:
        old.create_all(conn, checkfirst=True)
        for name, columns in _ADDED_LATER.items():
            for column in columns:
                conn.execute(text(f"ALTER TABLE {name} DROP COLUMN {column}"))
        for name, row in _ROWS.items():
            conn.execute(old.tables[name].insert().values(**row, created_at=_WHEN))
    engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_registry_engine(url)
    with engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
    engine.dispose()
    return names


def _schema_diff(url: str) -> list[Any]:
    engine = create_registry_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.target_metadata())
    engine.dispose()
    return diff


def _rows(url: str) -> dict[str, list[dict[str, Any]]]:
    metadata = schema.target_metadata()
    engine = create_registry_engine(url)
    with engine.connect() as conn:
        found = {name: [dict(r._mapping) for r in conn.execute(select(metadata.tables[name]))] for name in SIMIC_TABLES}
    engine.dispose()
    for rows in found.values():
        for row in rows:
            row.pop("created_at")
    return found


def test_0003_keeps_the_simic_tables_and_rows_an_older_simic_created(registry_url: str) -> None:
    migrate(registry_url, "0002")
    _create_simic_tables_the_old_way(registry_url)
    assert upgrade_schema(registry_url) == ("0002", schema.head_revision())
    assert _rows(registry_url) == _ROWS_AT_HEAD
    assert _schema_diff(registry_url) == []  # the kept tables are exactly what the models declare


def test_0003_creates_the_simic_tables_where_simic_never_ran(registry_url: str) -> None:
    migrate(registry_url, "0002")
    assert not _tables(registry_url) & set(SIMIC_TABLES)
    assert upgrade_schema(registry_url) == ("0002", schema.head_revision())
    assert set(SIMIC_TABLES) <= _tables(registry_url)
    assert _schema_diff(registry_url) == []


def test_an_old_sqlite_registry_with_simic_tables_is_upgraded_on_open(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/registry.db"
    migrate(url, "0002")
    _create_simic_tables_the_old_way(url)
    registry = SqlRegistry(url)  # SQLite: upgraded automatically when opened
    assert registry.revision() == schema.head_revision()
    registry.close()
    assert _rows(url) == _ROWS_AT_HEAD


def test_0004_adds_the_counterfactual_column_and_old_decisions_read_without_one(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/registry.db"
    migrate(url, "0002")
    _create_simic_tables_the_old_way(url)
    migrate(url, "0003")
    assert upgrade_schema(url) == ("0003", schema.head_revision())
    assert _rows(url) == _ROWS_AT_HEAD and _schema_diff(url) == []


def test_downgrading_0003_drops_the_simic_tables(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/registry.db"
    migrate(url, "0003")
    engine = create_registry_engine(url)
    with engine.connect() as conn, conn.begin():
        config = Config()
        config.set_main_option("script_location", str(schema.MIGRATIONS_DIR))
        config.attributes["connection"] = conn
        command.downgrade(config, "0002")
    engine.dispose()
    assert not _tables(url) & set(SIMIC_TABLES)
    assert "artifact_lineage" in _tables(url)  # 0002's tables stay
