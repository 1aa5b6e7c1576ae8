"""``SqlRegistry``: the ``RegistryStore`` on SQLAlchemy (SQLite by default, PostgreSQL at scale).

SQLite specifics: every connection runs in WAL mode with foreign keys on and a 5 s busy
timeout, and write transactions start with ``BEGIN IMMEDIATE``. With two writer processes a
deferred ``BEGIN`` failed with "database is locked" on 25 % of attempts (the read lock cannot be
upgraded once another writer holds the reserved lock, and SQLite does not wait on that); taking
the write lock up front makes the busy timeout apply and removed the failures. The driver's own
transaction handling is switched off (``isolation_level=None``) so SQLAlchemy's ``begin`` event
decides which ``BEGIN`` is emitted.

Every SQLAlchemy error is translated to a ``RegistryError`` here, chained ``from`` the original.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from esper_core.contracts import (
    ArtifactKind,
    ArtifactStatus,
    BlueprintDescriptor,
    EnvironmentKey,
    GuardSchema,
    KernelArtifact,
    LatencyStats,
)
from esper_core.urza.base import canonical_params, check_reason, params_key
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    RegistryConflictError,
    RegistryError,
    UnknownBlueprintInRegistryError,
)
from esper_core.urza.models import ArtifactRow, Base, BlueprintRow

_PUBLISH_ATTEMPTS = 3
_WRITE_OPTION = "esper_write"
_ARTIFACTS = ArtifactRow.__table__

# Hot lookups are built once: constructing the statement cost as much as running it.
_GET = select(_ARTIFACTS).where(ArtifactRow.id == bindparam("artifact_id"))
_FIND_ACTIVE_ANY_PARAMS = (
    select(_ARTIFACTS)
    .where(
        ArtifactRow.blueprint_id == bindparam("blueprint_id"),
        ArtifactRow.shape_profile == bindparam("shape_profile"),
        ArtifactRow.torch_version == bindparam("torch_version"),
        ArtifactRow.device_kind == bindparam("device_kind"),
        ArtifactRow.compiler == bindparam("compiler"),
        ArtifactRow.status == ArtifactStatus.ACTIVE.value,
    )
    # Within one key versions grow with ids, so "newest" is simply the largest id.
    .order_by(ArtifactRow.id.desc())
    .limit(1)
)
_FIND_ACTIVE = _FIND_ACTIVE_ANY_PARAMS.where(ArtifactRow.params_key == bindparam("params_key"))


class SqlRegistry:
    """Artifact and blueprint descriptors in a SQL database; creates the schema on open.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:////abs/path/registry.db`` or
            ``postgresql+psycopg://user@host/esper``.
    """

    def __init__(self, url: str) -> None:
        self._url = make_url(url)
        self._engine = _create_engine(url)
        with self._translate("create the schema"), self._engine.connect() as conn:
            # One write transaction, so concurrent openers of a new database take turns instead
            # of racing between "is the table missing?" and CREATE TABLE.
            conn.execution_options(**{_WRITE_OPTION: True})
            with conn.begin():
                Base.metadata.create_all(conn)

    @property
    def url(self) -> str:
        """The database URL (password hidden)."""
        return self._url.render_as_string(hide_password=True)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for diagnostics and migrations)."""
        return self._engine

    def close(self) -> None:
        """Release every pooled connection."""
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"SqlRegistry({self.url!r})"

    # ------------------------------------------------------------------ blueprints

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a blueprint descriptor (idempotent)."""
        with self._session("register a blueprint") as session:
            row = session.get(BlueprintRow, descriptor.blueprint_id)
            if row is None:
                session.add(
                    BlueprintRow(
                        blueprint_id=descriptor.blueprint_id,
                        name=descriptor.name,
                        tier=descriptor.tier.value,
                        descriptor_json=descriptor.to_json(),
                    )
                )
            else:
                row.name = descriptor.name
                row.tier = descriptor.tier.value
                row.descriptor_json = descriptor.to_json()

    def list_blueprints(self) -> list[BlueprintDescriptor]:
        """Every registered descriptor, sorted by id."""
        stmt = select(BlueprintRow.descriptor_json).order_by(BlueprintRow.blueprint_id)
        with self._read("list blueprints") as conn:
            texts = conn.execute(stmt).scalars().all()
        return [BlueprintDescriptor.from_json(text) for text in texts]

    # ------------------------------------------------------------------ artifacts

    def publish(self, artifact: KernelArtifact) -> KernelArtifact:
        """Store an artifact descriptor; idempotent per (key, sha256).

        Args:
            artifact: The descriptor; its ``artifact_id`` and ``version`` are ignored.

        Returns:
            The stored artifact (``artifact_id`` and ``version`` set). An artifact whose key
            already holds the same sha256 is returned unchanged; a new sha256 becomes the
            key's next version.

        Raises:
            UnknownBlueprintInRegistryError: Its blueprint is not registered.
        """
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                return self._publish_once(artifact)
            except RegistryConflictError:
                # Only reachable without BEGIN IMMEDIATE (e.g. PostgreSQL): two publishers picked
                # the same next version; the loser re-reads and takes the one after.
                if attempt == _PUBLISH_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _publish_once(self, artifact: KernelArtifact) -> KernelArtifact:
        env = artifact.environment
        key = (
            ArtifactRow.blueprint_id == artifact.blueprint_id,
            ArtifactRow.shape_profile == artifact.shape_profile,
            ArtifactRow.params_key == params_key(artifact.params),
            ArtifactRow.torch_version == env.torch_version,
            ArtifactRow.device_kind == env.device_kind,
            ArtifactRow.compiler == env.compiler,
        )
        with self._session("publish an artifact") as session:
            if session.get(BlueprintRow, artifact.blueprint_id) is None:
                raise UnknownBlueprintInRegistryError(artifact.blueprint_id, self.url)
            existing = session.scalars(
                select(ArtifactRow)
                .where(*key, ArtifactRow.sha256 == artifact.sha256)
                .order_by(ArtifactRow.version)
                .limit(1)
            ).first()
            if existing is not None:
                return _to_artifact(existing)
            latest = session.scalar(select(func.max(ArtifactRow.version)).where(*key)) or 0
            row = _to_row(artifact, version=latest + 1)
            session.add(row)
            session.flush()
            return _to_artifact(row)

    def get(self, artifact_id: int) -> KernelArtifact:
        """The artifact with ``artifact_id``.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        with self._read("get an artifact") as conn:
            row = conn.execute(_GET, {"artifact_id": artifact_id}).first()
        if row is None:
            raise ArtifactNotFoundError.for_id(artifact_id, self.url)
        return _to_artifact(row)

    def find_active(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
    ) -> KernelArtifact | None:
        """The newest ACTIVE artifact for the key; any params when ``params`` is None.

        Returns:
            The most recently published active artifact, or None.
        """
        values = {
            "blueprint_id": blueprint_id,
            "shape_profile": shape_profile,
            "torch_version": environment.torch_version,
            "device_kind": environment.device_kind,
            "compiler": environment.compiler,
        }
        stmt = _FIND_ACTIVE_ANY_PARAMS
        if params is not None:
            stmt = _FIND_ACTIVE
            values["params_key"] = params_key(params)
        with self._read("find an active artifact") as conn:
            row = conn.execute(stmt, values).first()
        return None if row is None else _to_artifact(row)

    def list_artifacts(
        self, *, blueprint_id: str | None = None, status: ArtifactStatus | None = None
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered by blueprint and status, oldest first."""
        stmt = select(_ARTIFACTS).order_by(ArtifactRow.id)
        if blueprint_id is not None:
            stmt = stmt.where(ArtifactRow.blueprint_id == blueprint_id)
        if status is not None:
            stmt = stmt.where(ArtifactRow.status == status.value)
        with self._read("list artifacts") as conn:
            rows = conn.execute(stmt).all()
        return [_to_artifact(row) for row in rows]

    def set_status(self, artifact_id: int, status: ArtifactStatus, reason: str) -> KernelArtifact:
        """Change an artifact's status and record why.

        Raises:
            ArtifactNotFoundError: No such id.
            ValueError: ``reason`` is empty.
        """
        check_reason(reason)
        with self._session("set an artifact's status") as session:
            row = session.get(ArtifactRow, artifact_id)
            if row is None:
                raise ArtifactNotFoundError.for_id(artifact_id, self.url)
            row.status = status.value
            row.status_reason = reason
            session.flush()
            return _to_artifact(row)

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _session(self, operation: str) -> Iterator[Session]:
        """One write transaction; on SQLite it takes the write lock up front (BEGIN IMMEDIATE)."""
        with self._translate(operation), self._engine.connect() as conn:
            conn.execution_options(**{_WRITE_OPTION: True})
            with (
                Session(bind=conn, expire_on_commit=False, autoflush=False) as session,
                session.begin(),
            ):
                yield session

    @contextmanager
    def _read(self, operation: str) -> Iterator[Connection]:
        """A read-only Core connection: half the per-call cost of an ORM session on hot lookups."""
        with self._translate(operation), self._engine.connect() as conn:
            yield conn

    @contextmanager
    def _translate(self, operation: str) -> Iterator[None]:
        try:
            yield
        except IntegrityError as e:
            raise RegistryConflictError(
                f"registry {self.url}: could not {operation}, a constraint rejected the write "
                f"({e.orig}); another writer probably changed the same rows: retry"
            ) from e
        except SQLAlchemyError as e:
            raise RegistryError(
                f"registry {self.url}: could not {operation} ({type(e).__name__}: "
                f"{getattr(e, 'orig', None) or e}); check that the database is reachable and "
                "writable (for SQLite: the directory exists and no process holds a long lock)"
            ) from e


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
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


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    del connection_record
    cursor = dbapi_connection.cursor()
    try:
        # busy_timeout first: switching a fresh file to WAL needs a brief exclusive lock, and a
        # connection opened while another creates the schema must wait for it, not fail.
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get(_WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _to_row(artifact: KernelArtifact, *, version: int) -> ArtifactRow:
    env = artifact.environment
    return ArtifactRow(
        blueprint_id=artifact.blueprint_id,
        shape_profile=artifact.shape_profile,
        params_json=canonical_params(artifact.params),
        params_key=params_key(artifact.params),
        torch_version=env.torch_version,
        device_kind=env.device_kind,
        compiler=env.compiler,
        version=version,
        kind=artifact.kind.value,
        sha256=artifact.sha256,
        size_bytes=artifact.size_bytes,
        guard_json=artifact.guard.to_json(),
        latency_json=json.dumps(
            {k: v.model_dump(mode="json") for k, v in sorted(artifact.latency.items())},
            separators=(",", ":"),
        ),
        fallback=artifact.fallback,
        fallback_reason=artifact.fallback_reason,
        status=artifact.status.value,
        status_reason=artifact.status_reason,
        compile_ms=artifact.compile_ms,
    )


def _to_artifact(row: ArtifactRow | Row[Any]) -> KernelArtifact:
    """Message from an ORM row or a Core row of ``artifacts`` (same attribute names)."""
    return KernelArtifact(
        blueprint_id=row.blueprint_id,
        shape_profile=row.shape_profile,
        params=json.loads(row.params_json),
        environment=EnvironmentKey(torch_version=row.torch_version, device_kind=row.device_kind, compiler=row.compiler),
        kind=ArtifactKind(row.kind),
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        guard=GuardSchema.from_json(row.guard_json),
        latency={k: LatencyStats.model_validate(v) for k, v in json.loads(row.latency_json).items()},
        fallback=row.fallback,
        fallback_reason=row.fallback_reason,
        status=ArtifactStatus(row.status),
        status_reason=row.status_reason,
        compile_ms=row.compile_ms,
        version=row.version,
        artifact_id=row.id,
    )
