"""``SqlRegistry``: the ``RegistryStore`` on SQLAlchemy 2 (SQLite by default, PostgreSQL at scale).

One code path serves both dialects; ``sql_engine`` holds what differs (SQLite's BEGIN IMMEDIATE,
PostgreSQL's row and advisory locks, upserts). Every write is one transaction: a publish writes
the artifact row, its first history entry, its tags and its lineage together or not at all, so a
reader never sees a half-published artifact. Opening a registry checks its schema revision
(``schema.ensure_schema``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import cast

from sqlalchemy import Connection, Engine, Select, bindparam, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from esper_core.contracts import ArtifactStatus, BlueprintDescriptor, BlueprintTier, EnvironmentKey, KernelArtifact
from esper_core.urza import schema
from esper_core.urza.base import (
    ACTIVE_ONLY,
    DEFAULT_ACTOR,
    check_new_status,
    check_reason,
    check_transition,
    params_key,
)
from esper_core.urza.errors import (
    ArtifactNotFoundError,
    CompileRunNotFoundError,
    RegistryConflictError,
    UnknownBlueprintInRegistryError,
)
from esper_core.urza.models import (
    ArtifactLineageRow,
    ArtifactRow,
    ArtifactTagRow,
    BlueprintRow,
    CompileRunRow,
    StatusHistoryRow,
)
from esper_core.urza.records import ArtifactRecord, CompileRun, check_tags
from esper_core.urza.sql_engine import (
    WRITE_OPTION,
    create_registry_engine,
    is_sqlite,
    lock_schema,
    translate_errors,
    upsert,
)
from esper_core.urza.sql_rows import to_artifact, to_compile_run, to_row, to_status_change

_PUBLISH_ATTEMPTS = 5
_ARTIFACTS = ArtifactRow.__table__
_TAGS = ArtifactTagRow.__table__
_HISTORY = StatusHistoryRow.__table__

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
    """Artifact and blueprint descriptors, history, tags and lineage in a SQL database.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:////abs/path/registry.db`` or
            ``postgresql+psycopg://user@host/esper``.
        auto_upgrade: Upgrade an older schema on open; default: True for SQLite (the embedded
            default), False otherwise (``esper registry upgrade`` upgrades deliberately).

    Raises:
        SchemaOutdatedError: The schema is older and ``auto_upgrade`` is False.
        SchemaTooNewError: The schema is newer than this code.
        RegistryError: The database cannot be reached or written.
    """

    def __init__(self, url: str, *, auto_upgrade: bool | None = None) -> None:
        self._url = make_url(url)
        self._engine = create_registry_engine(url)
        self._dialect = self._engine.dialect.name
        if auto_upgrade is None:
            auto_upgrade = is_sqlite(self._engine)
        try:
            with self._translate("open the registry"), self._engine.connect() as conn:
                current = schema.read_revision(conn)
            if current != schema.head_revision():
                # Empty, outdated or pre-Alembic: decide under the write lock, so concurrent
                # openers of a new database take turns instead of racing to create it.
                with self._write_connection("create or upgrade the schema") as conn:
                    schema.ensure_schema(conn, auto_upgrade=auto_upgrade, where=self.url)
        except BaseException:
            self._engine.dispose()
            raise

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

    def revision(self) -> str | None:
        """The database's schema revision."""
        with self._read("read the schema revision") as conn:
            return schema.current_revision(conn)

    # ------------------------------------------------------------------ blueprints

    def register_blueprint(self, descriptor: BlueprintDescriptor) -> None:
        """Insert or update a blueprint descriptor (idempotent, safe under concurrent callers)."""
        values = {
            "blueprint_id": descriptor.blueprint_id,
            "name": descriptor.name,
            "tier": descriptor.tier.value,
            "descriptor_json": descriptor.to_json(),
            "created_at": dt.datetime.now(dt.UTC),
        }
        stmt = upsert(
            BlueprintRow.__table__,
            values,
            keys=["blueprint_id"],
            update=["name", "tier", "descriptor_json"],
            dialect=self._dialect,
        )
        with self._session("register a blueprint") as session:
            session.execute(stmt)

    def list_blueprints(self) -> list[BlueprintDescriptor]:
        """Every registered descriptor, sorted by id."""
        stmt = select(BlueprintRow.descriptor_json).order_by(BlueprintRow.blueprint_id)
        with self._read("list blueprints") as conn:
            texts = conn.execute(stmt).scalars().all()
        return [BlueprintDescriptor.from_json(text) for text in texts]

    # ------------------------------------------------------------------ publishing

    def publish(
        self,
        artifact: KernelArtifact,
        *,
        compile_run_id: str | None = None,
        tags: Sequence[str] = (),
        actor: str = DEFAULT_ACTOR,
    ) -> KernelArtifact:
        """Store an artifact descriptor in one transaction; idempotent per (key, sha256).

        Args:
            artifact: The descriptor; its ``artifact_id`` and ``version`` are ignored, its
                ``status`` (ACTIVE or QUARANTINED) and ``status_reason`` are kept.
            compile_run_id: The compile run that produced it (lineage), if any.
            tags: Tags to attach.
            actor: Who publishes (first history entry).

        Returns:
            The stored artifact (``artifact_id`` and ``version`` set). An artifact whose key
            already holds the same sha256 is returned unchanged (``tags`` are added to it); a
            new sha256 becomes the key's next version.

        Raises:
            UnknownBlueprintInRegistryError: Its blueprint is not registered.
            CompileRunNotFoundError: ``compile_run_id`` names no compile run.
            InvalidStatusTransitionError: RETIRED, or ACTIVE for a high-risk blueprint.
            ValueError: Invalid tags.
        """
        checked_tags = check_tags(tags)
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                return self._publish_once(artifact, compile_run_id, checked_tags, actor)
            except RegistryConflictError:
                # Writers serialise on the blueprint row, so this is rare: e.g. a tag added by
                # another process between our read and write. The loser re-reads and retries.
                if attempt == _PUBLISH_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _publish_once(
        self, artifact: KernelArtifact, compile_run_id: str | None, tags: tuple[str, ...], actor: str
    ) -> KernelArtifact:
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
            # FOR UPDATE serialises publishers of one blueprint on PostgreSQL (SQLite already
            # holds the database's write lock), so two never pick the same next version.
            blueprint = session.get(BlueprintRow, artifact.blueprint_id, with_for_update=True)
            if blueprint is None:
                raise UnknownBlueprintInRegistryError(artifact.blueprint_id, self.url)
            existing = session.scalars(
                select(ArtifactRow)
                .where(*key, ArtifactRow.sha256 == artifact.sha256)
                .order_by(ArtifactRow.version)
                .limit(1)
            ).first()
            if existing is not None:
                self._insert_tags(session, existing.id, tags)
                return to_artifact(existing)
            check_new_status(artifact.status, BlueprintTier(blueprint.tier), artifact.blueprint_id)
            if compile_run_id is not None and session.get(CompileRunRow, compile_run_id) is None:
                raise CompileRunNotFoundError(compile_run_id, self.url)
            latest = session.scalar(select(func.max(ArtifactRow.version)).where(*key)) or 0
            row = to_row(artifact, version=latest + 1)
            session.add(row)
            session.flush()
            session.add(
                StatusHistoryRow(
                    artifact_id=row.id,
                    status=row.status,
                    reason=artifact.status_reason or f"published {artifact.status.value}",
                    actor=actor,
                )
            )
            if compile_run_id is not None:
                session.add(ArtifactLineageRow(artifact_id=row.id, compile_run_id=compile_run_id))
            self._insert_tags(session, row.id, tags)
            session.flush()
            return to_artifact(row)

    def _insert_tags(self, session: Session, artifact_id: int, tags: Sequence[str]) -> None:
        for tag in tags:
            session.execute(
                upsert(
                    _TAGS,
                    {"artifact_id": artifact_id, "tag": tag, "created_at": dt.datetime.now(dt.UTC)},
                    keys=["artifact_id", "tag"],
                    update=[],
                    dialect=self._dialect,
                )
            )

    # ------------------------------------------------------------------ lookups

    def get(self, artifact_id: int) -> KernelArtifact:
        """The artifact with ``artifact_id``.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        with self._read("get an artifact") as conn:
            row = conn.execute(_GET, {"artifact_id": artifact_id}).first()
        if row is None:
            raise ArtifactNotFoundError.for_id(artifact_id, self.url)
        return to_artifact(row)

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
        return None if row is None else to_artifact(row)

    def find(
        self,
        blueprint_id: str,
        shape_profile: str,
        environment: EnvironmentKey,
        params: Mapping[str, float] | None = None,
        *,
        statuses: Collection[ArtifactStatus] = ACTIVE_ONLY,
        compiled_only: bool = False,
    ) -> KernelArtifact | None:
        """The newest artifact for the key in one of ``statuses`` (not a fallback if ``compiled_only``)."""
        stmt = (
            select(_ARTIFACTS)
            .where(
                ArtifactRow.blueprint_id == blueprint_id,
                ArtifactRow.shape_profile == shape_profile,
                ArtifactRow.torch_version == environment.torch_version,
                ArtifactRow.device_kind == environment.device_kind,
                ArtifactRow.compiler == environment.compiler,
                ArtifactRow.status.in_([s.value for s in statuses]),
            )
            .order_by(ArtifactRow.id.desc())
            .limit(1)
        )
        if params is not None:
            stmt = stmt.where(ArtifactRow.params_key == params_key(params))
        if compiled_only:
            stmt = stmt.where(ArtifactRow.fallback.is_(False))
        with self._read("find an artifact") as conn:
            row = conn.execute(stmt).first()
        return None if row is None else to_artifact(row)

    def list_artifacts(
        self,
        *,
        blueprint_id: str | None = None,
        status: ArtifactStatus | None = None,
        tag: str | None = None,
    ) -> list[KernelArtifact]:
        """Artifacts, optionally filtered by blueprint, status and tag, oldest first."""
        stmt: Select = select(_ARTIFACTS).order_by(ArtifactRow.id)
        if blueprint_id is not None:
            stmt = stmt.where(ArtifactRow.blueprint_id == blueprint_id)
        if status is not None:
            stmt = stmt.where(ArtifactRow.status == status.value)
        if tag is not None:
            tagged = select(ArtifactTagRow.artifact_id).where(ArtifactTagRow.tag == tag)
            stmt = stmt.where(ArtifactRow.id.in_(tagged))
        with self._read("list artifacts") as conn:
            rows = conn.execute(stmt).all()
        return [to_artifact(row) for row in rows]

    def record(self, artifact_id: int) -> ArtifactRecord:
        """The artifact with its tags, lineage and status history.

        Raises:
            ArtifactNotFoundError: No such id.
        """
        tags_stmt = select(ArtifactTagRow.tag).where(ArtifactTagRow.artifact_id == artifact_id).order_by("tag")
        run_stmt = (
            select(CompileRunRow.__table__)
            .join(ArtifactLineageRow, ArtifactLineageRow.compile_run_id == CompileRunRow.id)
            .where(ArtifactLineageRow.artifact_id == artifact_id)
        )
        history_stmt = select(_HISTORY).where(StatusHistoryRow.artifact_id == artifact_id).order_by(StatusHistoryRow.id)
        with self._read("read an artifact's record") as conn:
            row = conn.execute(_GET, {"artifact_id": artifact_id}).first()
            if row is None:
                raise ArtifactNotFoundError.for_id(artifact_id, self.url)
            tags = tuple(conn.execute(tags_stmt).scalars())
            run = conn.execute(run_stmt).first()
            history = tuple(to_status_change(h) for h in conn.execute(history_stmt))
        return ArtifactRecord(
            artifact=to_artifact(row),
            tags=tags,
            compile_run=None if run is None else to_compile_run(run),
            history=history,
        )

    def referenced_sha256s(self) -> set[str]:
        """The blob hashes any artifact row points at (garbage collection keeps these)."""
        with self._read("list referenced blobs") as conn:
            return set(conn.execute(select(ArtifactRow.sha256).distinct()).scalars())

    # ------------------------------------------------------------------ changes

    def set_status(
        self, artifact_id: int, status: ArtifactStatus, reason: str, *, actor: str = DEFAULT_ACTOR
    ) -> KernelArtifact:
        """Change an artifact's status and append it to the history.

        Raises:
            ArtifactNotFoundError: No such id.
            InvalidStatusTransitionError: Same status, out of RETIRED, high-risk to ACTIVE.
            ValueError: ``reason`` is empty.
        """
        check_reason(reason)
        with self._session("set an artifact's status") as session:
            row = session.get(ArtifactRow, artifact_id, with_for_update=True)
            if row is None:
                raise ArtifactNotFoundError.for_id(artifact_id, self.url)
            # Never None: the artifact's foreign key (ON DELETE RESTRICT) keeps its blueprint row.
            tier = cast(
                str, session.scalar(select(BlueprintRow.tier).where(BlueprintRow.blueprint_id == row.blueprint_id))
            )
            check_transition(artifact_id, ArtifactStatus(row.status), status, BlueprintTier(tier))
            row.status = status.value
            row.status_reason = reason
            session.add(StatusHistoryRow(artifact_id=artifact_id, status=status.value, reason=reason, actor=actor))
            session.flush()
            return to_artifact(row)

    def set_signature(self, artifact_id: int, *, signature: str, key_id: str) -> KernelArtifact:
        """Store an artifact's signature and its key id (``Urza`` signs; ``esper registry resign``).

        Raises:
            ArtifactNotFoundError: No such id.
        """
        with self._session("store an artifact's signature") as session:
            row = session.get(ArtifactRow, artifact_id, with_for_update=True)
            if row is None:
                raise ArtifactNotFoundError.for_id(artifact_id, self.url)
            row.signature = signature
            row.signature_key_id = key_id
            session.flush()
            return to_artifact(row)

    def add_tags(self, artifact_id: int, tags: Sequence[str]) -> tuple[str, ...]:
        """Add tags (idempotent) and return all of the artifact's tags, sorted.

        Raises:
            ArtifactNotFoundError: No such id.
            ValueError: Invalid tags.
        """
        checked = check_tags(tags)
        with self._session("tag an artifact") as session:
            if session.get(ArtifactRow, artifact_id) is None:
                raise ArtifactNotFoundError.for_id(artifact_id, self.url)
            self._insert_tags(session, artifact_id, checked)
            stmt = select(ArtifactTagRow.tag).where(ArtifactTagRow.artifact_id == artifact_id).order_by("tag")
            return tuple(session.scalars(stmt))

    # ------------------------------------------------------------------ compile runs

    def start_compile_run(self, run: CompileRun) -> CompileRun:
        """Record a compile run as running (idempotent per ``run_id``: a retried start is fine)."""
        values = {
            "id": run.run_id,
            "state": "running",
            "compiler": run.compiler,
            "torch_version": run.torch_version,
            "device_kind": run.device_kind,
            "hostname": run.hostname,
            "detail_json": json.dumps(run.detail, sort_keys=True),
            "started_at": dt.datetime.now(dt.UTC),
        }
        stmt = upsert(CompileRunRow.__table__, values, keys=["id"], update=[], dialect=self._dialect)
        with self._session("start a compile run") as session:
            session.execute(stmt)
            return to_compile_run(session.get_one(CompileRunRow, run.run_id))

    def finish_compile_run(self, run_id: str, *, state: str, detail: Mapping[str, object]) -> CompileRun:
        """Mark a compile run finished or failed and merge ``detail`` into its facts.

        Raises:
            CompileRunNotFoundError: No such run.
            ValueError: ``state`` is not ``finished`` or ``failed``.
        """
        if state not in ("finished", "failed"):
            raise ValueError(f"a compile run ends 'finished' or 'failed', got {state!r}")
        with self._session("finish a compile run") as session:
            row = session.get(CompileRunRow, run_id, with_for_update=True)
            if row is None:
                raise CompileRunNotFoundError(run_id, self.url)
            row.state = state
            row.finished_at = dt.datetime.now(dt.UTC)
            row.detail_json = json.dumps({**json.loads(row.detail_json), **detail}, sort_keys=True)
            session.flush()
            return to_compile_run(row)

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write_connection(self, operation: str) -> Iterator[Connection]:
        """A Core connection in one write transaction, holding the schema lock."""
        with self._translate(operation), self._engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                lock_schema(conn)
                yield conn

    @contextmanager
    def _session(self, operation: str) -> Iterator[Session]:
        """One write transaction; on SQLite it takes the write lock up front (BEGIN IMMEDIATE)."""
        with self._translate(operation), self._engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
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

    def _translate(self, operation: str) -> AbstractContextManager[None]:
        return translate_errors(self.url, operation)


def upgrade_schema(url: str) -> tuple[str | None, str]:
    """Upgrade the registry at ``url`` to this code's head revision (``esper registry upgrade``).

    Works on any backend and any older revision, including a pre-Alembic database; an empty
    database gets the current schema. The upgrade is one transaction under the schema lock.

    Returns:
        The revision before (None for an empty database) and after.

    Raises:
        SchemaTooNewError: The database is newer than this code.
        RegistryError: The database cannot be reached or the upgrade failed (nothing changed).
    """
    engine = create_registry_engine(url)
    where = make_url(url).render_as_string(hide_password=True)
    try:
        with translate_errors(where, "upgrade the schema"), engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                lock_schema(conn)
                before = schema.ensure_schema(conn, auto_upgrade=True, where=where)
    finally:
        engine.dispose()
    return before, schema.head_revision()
