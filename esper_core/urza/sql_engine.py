"""Engines, transactions and error translation for ``SqlRegistry`` (SQLite and PostgreSQL).

SQLite specifics: every connection runs in WAL mode with foreign keys on and a 5 s busy
timeout, and write transactions start with ``BEGIN IMMEDIATE``. With two writer processes a
deferred ``BEGIN`` failed with "database is locked" on 25 % of attempts (the read lock cannot be
upgraded once another writer holds the reserved lock, and SQLite does not wait on that); taking
the write lock up front makes the busy timeout apply and removed the failures. The driver's own
transaction handling is switched off (``isolation_level=None``) so SQLAlchemy's ``begin`` event
decides which ``BEGIN`` is emitted.

PostgreSQL specifics: writers serialise per blueprint with ``SELECT ... FOR UPDATE`` on the
blueprint row, and schema changes take a transaction-scoped advisory lock, so concurrent
publishers and openers wait for each other instead of failing.

Every SQLAlchemy error is translated to a ``RegistryError`` at this boundary, chained ``from``
the original.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from esper_core.urza.errors import RegistryConflictError, RegistryError, RegistryUnavailableError

_CONNECT_TIMEOUT_S = 5
WRITE_OPTION = "esper_write"
"""Execution option marking a connection whose transactions write (SQLite: BEGIN IMMEDIATE)."""
_SCHEMA_LOCK_KEY = 0x45535052  # "ESPR": PostgreSQL advisory lock id held while checking the schema


def create_registry_engine(url: str) -> Engine:
    """An engine for ``url`` with Urza's SQLite settings (WAL, busy timeout, BEGIN IMMEDIATE)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # A bounded connect: behind a dropped network route libpq would otherwise wait for ever, and
        # a run riding out an outage must get its answer (and go on training) in seconds.
        return create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": _CONNECT_TIMEOUT_S})
    connect_args: dict[str, Any] = {"isolation_level": None}
    if parsed.database in (None, "", ":memory:"):
        # One shared connection, or every pooled connection would see its own empty database.
        connect_args["check_same_thread"] = False
        engine = create_engine(parsed, connect_args=connect_args, poolclass=StaticPool)
    else:
        engine = create_engine(parsed, connect_args=connect_args)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def is_sqlite(engine: Engine) -> bool:
    """Whether ``engine`` talks to SQLite."""
    return engine.dialect.name == "sqlite"


def lock_schema(conn: Connection) -> None:
    """Serialise schema checks and upgrades across processes (inside a write transaction).

    SQLite's ``BEGIN IMMEDIATE`` already holds the database's write lock; PostgreSQL takes a
    transaction-scoped advisory lock, released at commit or rollback.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK_KEY})")


def upsert(
    table: Table, values: Mapping[str, Any], *, keys: Sequence[str], update: Sequence[str], dialect: str
) -> Insert:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE SET update`` (``DO NOTHING`` when ``update`` is empty)."""
    stmt: Any
    if dialect == "postgresql":
        stmt = postgresql.insert(table).values(**values)
    elif dialect == "sqlite":
        stmt = sqlite.insert(table).values(**values)
    else:
        raise RegistryError(
            f"Urza supports SQLite and PostgreSQL, not {dialect!r}: set ESPER_REGISTRY_URL to a "
            "sqlite:/// or postgresql+psycopg:// URL"
        )
    if update:
        return stmt.on_conflict_do_update(index_elements=list(keys), set_={c: stmt.excluded[c] for c in update})
    return stmt.on_conflict_do_nothing(index_elements=list(keys))


@contextmanager
def translate_errors(url: str, operation: str) -> Iterator[None]:
    """Translate SQLAlchemy errors raised inside into ``RegistryError`` naming ``operation``."""
    try:
        yield
    except IntegrityError as e:
        raise RegistryConflictError(
            f"registry {url}: could not {operation}, a constraint rejected the write "
            f"({e.orig}); another writer probably changed the same rows: retry"
        ) from e
    except DBAPIError as e:
        if _unavailable(e):
            raise RegistryUnavailableError(_message(url, operation, e)) from e
        raise RegistryError(_message(url, operation, e)) from e
    except SQLAlchemyError as e:
        raise RegistryError(_message(url, operation, e)) from e


# SQLite reports a bad statement ("no such table") as OperationalError too; only these are transient.
_SQLITE_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o")


def _unavailable(e: DBAPIError) -> bool:
    """Whether the database could not be reached (a condition to wait out), not a rejected statement.

    PostgreSQL drivers report refused, lost and timed-out connections as OperationalError or
    InterfaceError (SQLAlchemy also marks a dropped pooled connection ``connection_invalidated``);
    SQLite's transient ones are a locked, busy or unreadable file.
    """
    if e.connection_invalidated:
        return True
    if not isinstance(e, (OperationalError, InterfaceError)):
        return False
    if isinstance(e.orig, sqlite3.Error):
        return any(word in str(e.orig).lower() for word in _SQLITE_TRANSIENT)
    return True


def _message(url: str, operation: str, e: SQLAlchemyError) -> str:
    return (
        f"registry {url}: could not {operation} ({type(e).__name__}: "
        f"{getattr(e, 'orig', None) or e}); check that the database is reachable and "
        "writable (for SQLite: the directory exists and no process holds a long lock)"
    )


_BUSY_TIMEOUT_MS = 5000


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Put the database file in WAL mode (a property of the file: later connections find it set).

    Switching takes an exclusive lock, and while another connection switches or creates the schema
    of the same fresh file SQLite may answer "database is locked" at once, without running the busy
    handler (4 threads opening one new file failed ~1 time in 13). So retry for as long as the busy
    timeout would have waited.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1e3
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    del connection_record
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: a connection opened while another creates the schema must wait
        # for it, not fail.
        cursor.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        _use_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
