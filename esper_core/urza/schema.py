"""Urza's schema version: detect it, create it, upgrade it (Alembic, run programmatically).

Policy when a registry is opened (``SqlRegistry``):

- an empty database gets the current schema (``create_all`` of the models, stamped at the head
  revision: the migrations produce the same schema, which a test checks on every dialect);
- a database at the head revision is used as is;
- an older one is upgraded automatically when it is SQLite (the embedded default: one file,
  no DBA, nothing else to coordinate), and refused with ``SchemaOutdatedError`` otherwise
  (PostgreSQL is shared: upgrade it deliberately with ``esper registry upgrade`` after a backup);
- one newer than this code knows is refused with ``SchemaTooNewError``.

A database made by the walking skeleton (tables, no ``alembic_version``) counts as revision
``0001``. Checks run inside the caller's write transaction, so concurrent openers take turns.
Alembic itself is imported only to upgrade: opening an up-to-date registry costs one SELECT.
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

from sqlalchemy import Column, Connection, MetaData, PrimaryKeyConstraint, String, Table, inspect, select

from esper_core.urza.errors import RegistryError
from esper_core.urza.models import Base

MODEL_MODULES: tuple[str, ...] = ("esper_core.urza.models", "esper_core.simic.models")
"""Modules declaring tables on ``Base``; add yours (and a revision) to put a table in Urza's DB."""

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
BASELINE_REVISION = "0001"
"""The schema the walking skeleton created with ``create_all``, before Alembic."""

_VERSION_TABLE = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)
_REVISION_RE = re.compile(r"^revision\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_DOWN_RE = re.compile(r"^down_revision\s*=\s*(?:['\"]([^'\"]+)['\"]|None)", re.MULTILINE)


class SchemaOutdatedError(RegistryError):
    """The database's schema is older than this code and was not upgraded automatically."""


class SchemaTooNewError(RegistryError):
    """The database's schema was written by a newer Esper."""


def target_metadata() -> MetaData:
    """``Base.metadata`` after importing every module of ``MODEL_MODULES``."""
    for module in MODEL_MODULES:
        importlib.import_module(module)
    return Base.metadata


@functools.cache
def revisions() -> tuple[str, ...]:
    """Revision ids from oldest to head, read from the migration files without importing Alembic.

    Raises:
        RuntimeError: The revisions do not form one linear chain (a merge is needed).
    """
    parents: dict[str, str | None] = {}
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        text = path.read_text()
        rev, down = _REVISION_RE.search(text), _DOWN_RE.search(text)
        if rev is None or down is None:
            raise RuntimeError(f"migration {path} lacks a 'revision = ...' or 'down_revision = ...' line")
        parents[rev.group(1)] = down.group(1)
    chain: list[str] = []
    child_of = {parent: child for child, parent in parents.items()}
    current = child_of.get(None)
    while current is not None:
        chain.append(current)
        current = child_of.get(current)
    if len(chain) != len(parents):
        raise RuntimeError(
            f"Urza's migrations {sorted(parents)} do not form one chain: give each new revision "
            "the previous head as down_revision"
        )
    return tuple(chain)


def head_revision() -> str:
    """The newest revision this code knows."""
    return revisions()[-1]


def current_revision(conn: Connection) -> str | None:
    """The database's revision: ``None`` when empty, ``BASELINE_REVISION`` for a pre-Alembic one."""
    tables = set(inspect(conn).get_table_names())
    if _VERSION_TABLE.name in tables:
        return conn.execute(select(_VERSION_TABLE.c.version_num)).scalar_one_or_none()
    if {"blueprints", "artifacts"} <= tables:
        return BASELINE_REVISION
    return None


def read_revision(conn: Connection) -> str | None:
    """The revision of an Alembic-managed database, else None (no write lock needed)."""
    if not inspect(conn).has_table(_VERSION_TABLE.name):
        return None
    return conn.execute(select(_VERSION_TABLE.c.version_num)).scalar_one_or_none()


def ensure_schema(conn: Connection, *, auto_upgrade: bool, where: str) -> str | None:
    """Bring an empty or (if allowed) older database to the head revision; call in a write txn.

    Args:
        conn: A connection inside the caller's write transaction.
        auto_upgrade: Upgrade an older schema instead of raising.
        where: The database, for messages (password hidden).

    Returns:
        The revision found before (``None`` when the database was empty).

    Raises:
        SchemaOutdatedError: Older schema and ``auto_upgrade`` is False.
        SchemaTooNewError: The database is at a revision this code does not know.
    """
    found = current_revision(conn)
    head = head_revision()
    if found == head:
        return found
    if found is None:
        target_metadata().create_all(conn)
        _VERSION_TABLE.create(conn)
        conn.execute(_VERSION_TABLE.insert().values(version_num=head))
        return None
    if found not in revisions():
        raise SchemaTooNewError(
            f"registry {where} is at schema revision {found!r}, which this Esper does not know (its "
            f"newest is {head!r}): upgrade Esper, or point ESPER_REGISTRY_URL at another registry"
        )
    if not auto_upgrade:
        raise SchemaOutdatedError(
            f"registry {where} is at schema revision {found}, this Esper needs {head}: back up the "
            "database, then run `esper registry upgrade`"
        )
    upgrade(conn, found)
    return found


def upgrade(conn: Connection, found: str | None = None, target: str = "head") -> None:
    """Run the Alembic migrations from ``found`` to ``target`` on ``conn`` (inside its transaction).

    Args:
        conn: A connection inside the caller's write transaction.
        found: The revision the database is at (``current_revision``).
        target: Revision to stop at (tests build old databases with it).
    """
    # Imported here: only an upgrade pays for Alembic (~0.3 s), not every registry open.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    if found == BASELINE_REVISION and _VERSION_TABLE.name not in inspect(conn).get_table_names():
        command.stamp(config, BASELINE_REVISION)
    command.upgrade(config, target)
