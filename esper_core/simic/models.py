"""Simic's SQL tables, in the registry database next to Urza's (SQLAlchemy 2 typed ORM).

- ``simic_field_reports``: one row per ``FieldReport`` (outcome of a command once its window
  closed), keyed by ``report_id``.
- ``simic_decisions``: one row per applied decision (unique per run and epoch): the state Tamiyo
  saw (the last ``TREND_WINDOW`` packets and the candidates, so the graph can be rebuilt with any
  later feature set), the proposal, the executed command, and what the GNN said about it.
- ``simic_policies``: one row per trained policy version; the weights are a blob in Urza's
  content-addressed blob store, the row carries the network size and the training provenance.

Why ``SimicBase`` and not ``esper_core.urza.models.Base``: Urza's schema is now versioned with
Alembic, and ``Base.metadata`` is what its migrations must reproduce exactly. Declaring these
tables on ``Base`` before a revision creates them would (a) fail Urza's schema test in any
process that imports this module and (b) make ``ensure_schema`` create them in new registries
stamped at the current head, so the later revision that adds them would fail on "table exists".
Same naming convention, same database and engine; moving them onto ``Base`` means deriving the
three row classes from it instead, listing this module in ``MODEL_MODULES`` and adding the
revision (see ``MIGRATION-NOTES.md``). Until then
``SimicStore`` creates them with ``create_all(checkfirst=True)``.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from esper_core.contracts import Outcome
from esper_core.urza.models import NAMING_CONVENTION

POLICY_STATUSES = ("active", "retired")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _one_of(column: str, values: list[str] | tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class SimicBase(DeclarativeBase):
    """Declarative base of Simic's tables (Urza's naming convention; see the module docstring)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class FieldReportRow(SimicBase):
    """The outcome of one command after its observation window."""

    __tablename__ = "simic_field_reports"
    __table_args__ = (
        CheckConstraint(_one_of("outcome", [o.value for o in Outcome]), name="outcome"),
        CheckConstraint("observation_epochs >= 1", name="observation_positive"),
        Index("ix_simic_field_reports_run", "run_id", "epoch"),
    )

    report_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128))
    command_id: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32))
    issued_by: Mapped[str] = mapped_column(String(128))
    slot_id: Mapped[str | None] = mapped_column(String(128))
    blueprint_id: Mapped[str | None] = mapped_column(String(128))
    outcome: Mapped[str] = mapped_column(String(16))
    observation_epochs: Mapped[int] = mapped_column(Integer)
    metric_deltas_json: Mapped[str] = mapped_column(Text)
    report_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class DecisionRow(SimicBase):
    """One applied decision with the state it was made in."""

    __tablename__ = "simic_decisions"
    # One applied decision per run and epoch: a retried epoch's new decision replaces the old.
    __table_args__ = (UniqueConstraint("run_id", "epoch", name="uq_simic_decisions_run_epoch"),)

    command_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128))
    epoch: Mapped[int] = mapped_column(Integer)
    policy: Mapped[str] = mapped_column(String(32))
    policy_version: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))
    proposal_json: Mapped[str] = mapped_column(Text)
    command_json: Mapped[str] = mapped_column(Text)
    state_json: Mapped[str] = mapped_column(Text)
    val_accuracy: Mapped[float] = mapped_column(Float)
    val_loss: Mapped[float] = mapped_column(Float)
    host_params: Mapped[int] = mapped_column(BigInteger)
    seed_params: Mapped[int] = mapped_column(BigInteger)
    log_prob: Mapped[float | None] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class PolicyRow(SimicBase):
    """One trained version of Tamiyo's GNN policy."""

    __tablename__ = "simic_policies"
    __table_args__ = (
        CheckConstraint(_one_of("status", POLICY_STATUSES), name="status"),
        CheckConstraint("version >= 1", name="version_positive"),
    )

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    parent_version: Mapped[int | None] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    gnn_config_json: Mapped[str] = mapped_column(Text)
    feature_dims_json: Mapped[str] = mapped_column(Text)
    provenance_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


SIMIC_TABLES = (FieldReportRow.__table__, DecisionRow.__table__, PolicyRow.__table__)
