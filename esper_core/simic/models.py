"""Simic's SQL tables, in the registry database next to Urza's (SQLAlchemy 2 typed ORM).

- ``simic_field_reports``: one row per ``FieldReport`` (outcome of a command once its window
  closed), keyed by ``report_id``.
- ``simic_decisions``: one row per applied decision (unique per run and epoch): the state Tamiyo
  saw (the last ``TREND_WINDOW`` packets and the candidates, so the graph can be rebuilt with any
  later feature set), the proposal, the executed command, and what the GNN said about it.
- ``simic_policies``: one row per trained policy version; the weights are a blob in Urza's
  content-addressed blob store, the row carries the network size and the training provenance.

They are part of Urza's schema: declared on ``esper_core.urza.models.Base``, listed in
``esper_core.urza.schema.MODEL_MODULES`` and created by revision ``0003`` (which keeps the
tables of registries where an older Simic had already created them with its own ``create_all``).
A change here needs a new revision (see ``esper_core/urza/migrations/MIGRATION-NOTES.md``).
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
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from esper_core.contracts import Outcome
from esper_core.urza.models import Base

POLICY_STATUSES = ("active", "retired")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _one_of(column: str, values: list[str] | tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class FieldReportRow(Base):
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


class DecisionRow(Base):
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
    # Revision 0004: the two-branch outcome of a forked decision (``CounterfactualOutcome``);
    # NULL for decisions that were not forked and for every row written before.
    counterfactual_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class PolicyRow(Base):
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
    # NULL on versions published before signing (revision 0005): refused until `esper registry resign`.
    signature: Mapped[str | None] = mapped_column(String(64))
    signature_key_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
