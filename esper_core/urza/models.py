"""Urza's SQL schema (SQLAlchemy 2 typed ORM).

Tables: ``blueprints`` (Karn descriptors), ``artifacts`` (one row per artifact version),
``artifact_status_history`` (every status an artifact has had, with why and who),
``artifact_tags``, ``compile_runs`` (one row per Tezzeret compile run) and ``artifact_lineage``
(which compile run produced an artifact). The schema is versioned by the Alembic migrations in
``esper_core/urza/migrations``: a change here needs a revision there (see its
``MIGRATION-NOTES.md``). Other subsystems may add tables on ``Base``; list their module in
``esper_core.urza.schema.MODEL_MODULES``. Enums are stored as their string values with CHECK constraints, which reads well in SQL and
ports between SQLite and PostgreSQL. JSON payloads are text columns holding the contracts' own
JSON so a row round-trips to an equal message.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from esper_core.contracts import ArtifactKind, ArtifactStatus, BlueprintTier

# Stable constraint names make future Alembic migrations deterministic across dialects.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _one_of(column: str, values: list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base carrying the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    if TYPE_CHECKING:
        # Every row class maps one Table; DeclarativeBase types __table__ as any FromClause.
        __table__: ClassVar[Table]


class BlueprintRow(Base):
    """A registered Karn blueprint descriptor."""

    __tablename__ = "blueprints"
    __table_args__ = (CheckConstraint(_one_of("tier", [t.value for t in BlueprintTier]), name="tier"),)

    blueprint_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    tier: Mapped[str] = mapped_column(String(32))
    descriptor_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)

    artifacts: Mapped[list[ArtifactRow]] = relationship(back_populates="blueprint", lazy="raise")


class ArtifactRow(Base):
    """One version of a compiled (or fallback) kernel for one key."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint(
            "blueprint_id",
            "shape_profile",
            "params_key",
            "torch_version",
            "device_kind",
            "compiler",
            "version",
            name="uq_artifacts_key_version",
        ),
        # find_active: equality on the key, newest first.
        Index(
            "ix_artifacts_lookup",
            "blueprint_id",
            "shape_profile",
            "torch_version",
            "device_kind",
            "compiler",
            "status",
        ),
        Index("ix_artifacts_sha256", "sha256"),
        CheckConstraint(_one_of("kind", [k.value for k in ArtifactKind]), name="kind"),
        CheckConstraint(_one_of("status", [s.value for s in ArtifactStatus]), name="status"),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint("size_bytes >= 1", name="size_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    blueprint_id: Mapped[str] = mapped_column(ForeignKey("blueprints.blueprint_id", ondelete="RESTRICT"))
    shape_profile: Mapped[str] = mapped_column(String(128))
    params_json: Mapped[str] = mapped_column(Text)
    params_key: Mapped[str] = mapped_column(String(64))
    torch_version: Mapped[str] = mapped_column(String(64))
    device_kind: Mapped[str] = mapped_column(String(16))
    compiler: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    guard_json: Mapped[str] = mapped_column(Text)
    latency_json: Mapped[str] = mapped_column(Text)
    fallback: Mapped[bool] = mapped_column(Boolean)
    fallback_reason: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    compile_ms: Mapped[float] = mapped_column(Float)
    # NULL on rows published before signing (revision 0005): refused until `esper registry resign`.
    signature: Mapped[str | None] = mapped_column(String(64))
    signature_key_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)

    blueprint: Mapped[BlueprintRow] = relationship(back_populates="artifacts", lazy="raise")


class StatusHistoryRow(Base):
    """One status an artifact entered: at publication, then at every change."""

    __tablename__ = "artifact_status_history"
    __table_args__ = (
        CheckConstraint(_one_of("status", [s.value for s in ArtifactStatus]), name="status"),
        Index("ix_artifact_status_history_artifact_id", "artifact_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(128))
    changed_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class ArtifactTagRow(Base):
    """A free-form label on an artifact (``approved``, ``baseline``, ``aoti-unavailable``...)."""

    __tablename__ = "artifact_tags"
    __table_args__ = (Index("ix_artifact_tags_tag", "tag"),)

    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class CompileRunRow(Base):
    """One Tezzeret compile run (a ``compile_catalog`` flow run, a CLI compile, a benchmark)."""

    __tablename__ = "compile_runs"
    __table_args__ = (CheckConstraint(_one_of("state", ["running", "finished", "failed"]), name="state"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    compiler: Mapped[str] = mapped_column(String(64))
    torch_version: Mapped[str] = mapped_column(String(64))
    device_kind: Mapped[str] = mapped_column(String(16))
    hostname: Mapped[str] = mapped_column(String(256))
    detail_json: Mapped[str] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class ArtifactLineageRow(Base):
    """Which compile run first produced an artifact (re-publishing the same blob keeps it)."""

    __tablename__ = "artifact_lineage"
    __table_args__ = (Index("ix_artifact_lineage_compile_run_id", "compile_run_id"),)

    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    compile_run_id: Mapped[str] = mapped_column(ForeignKey("compile_runs.id", ondelete="RESTRICT"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
