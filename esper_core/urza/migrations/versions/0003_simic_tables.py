"""Simic's tables: field reports, decisions and policy versions.

Before this revision Simic created these tables itself (``create_all`` on its own declarative
base, same columns and constraint names) in any registry it wrote to, outside the versioning.
Such registries are at ``0002`` and already hold the tables, with rows worth keeping: each table
is created only when it is missing, and an existing one is left as it is.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Frozen copies of the values the models derive from enums: a released revision must not change
# when ``Outcome`` gains a member (that change needs its own revision).
_OUTCOMES = "outcome IN ('success', 'neutral', 'regression')"
_POLICY_STATUSES = "status IN ('active', 'retired')"


def _create_field_reports() -> None:
    op.create_table(
        "simic_field_reports",
        sa.Column("report_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("command_id", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("issued_by", sa.String(128), nullable=False),
        sa.Column("slot_id", sa.String(128), nullable=True),
        sa.Column("blueprint_id", sa.String(128), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("observation_epochs", sa.Integer(), nullable=False),
        sa.Column("metric_deltas_json", sa.Text(), nullable=False),
        sa.Column("report_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("report_id", name="pk_simic_field_reports"),
        sa.CheckConstraint(_OUTCOMES, name="ck_simic_field_reports_outcome"),
        sa.CheckConstraint("observation_epochs >= 1", name="ck_simic_field_reports_observation_positive"),
    )
    op.create_index("ix_simic_field_reports_run", "simic_field_reports", ["run_id", "epoch"])


def _create_decisions() -> None:
    op.create_table(
        "simic_decisions",
        sa.Column("command_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(32), nullable=False),
        sa.Column("policy_version", sa.String(64), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("proposal_json", sa.Text(), nullable=False),
        sa.Column("command_json", sa.Text(), nullable=False),
        sa.Column("state_json", sa.Text(), nullable=False),
        sa.Column("val_accuracy", sa.Float(), nullable=False),
        sa.Column("val_loss", sa.Float(), nullable=False),
        sa.Column("host_params", sa.BigInteger(), nullable=False),
        sa.Column("seed_params", sa.BigInteger(), nullable=False),
        sa.Column("log_prob", sa.Float(), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("command_id", name="pk_simic_decisions"),
        sa.UniqueConstraint("run_id", "epoch", name="uq_simic_decisions_run_epoch"),
    )


def _create_policies() -> None:
    op.create_table(
        "simic_policies",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("gnn_config_json", sa.Text(), nullable=False),
        sa.Column("feature_dims_json", sa.Text(), nullable=False),
        sa.Column("provenance_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("version", name="pk_simic_policies"),
        sa.CheckConstraint(_POLICY_STATUSES, name="ck_simic_policies_status"),
        sa.CheckConstraint("version >= 1", name="ck_simic_policies_version_positive"),
    )


_TABLES: dict[str, Callable[[], None]] = {
    "simic_field_reports": _create_field_reports,
    "simic_decisions": _create_decisions,
    "simic_policies": _create_policies,
}


def upgrade() -> None:
    # Simic's old create_all made each table together with its index in one transaction, so a
    # table that exists is complete: only missing tables need creating.
    existing = set(sa.inspect(op.get_bind()).get_table_names())
    for name, create in _TABLES.items():
        if name not in existing:
            create()


def downgrade() -> None:
    op.drop_table("simic_policies")
    op.drop_table("simic_decisions")
    op.drop_index("ix_simic_field_reports_run", table_name="simic_field_reports")
    op.drop_table("simic_field_reports")
