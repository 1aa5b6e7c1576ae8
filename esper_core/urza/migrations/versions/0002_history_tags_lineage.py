"""Status history, tags, compile runs and lineage.

Every existing artifact gets one history row recording its current status, so "history" is
complete from this revision on for old and new artifacts alike.

Revision ID: 0002
Revises: 0001
Create Date: 2026-05-20
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_STATUSES = "status IN ('active', 'quarantined', 'retired')"


def upgrade() -> None:
    op.create_table(
        "artifact_status_history",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_artifact_status_history"),
        sa.CheckConstraint(_STATUSES, name="ck_artifact_status_history_status"),
        sa.ForeignKeyConstraint(
            ["artifact_id"],
            ["artifacts.id"],
            name="fk_artifact_status_history_artifact_id_artifacts",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_artifact_status_history_artifact_id", "artifact_status_history", ["artifact_id"])
    op.create_table(
        "artifact_tags",
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("artifact_id", "tag", name="pk_artifact_tags"),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"], name="fk_artifact_tags_artifact_id_artifacts", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_artifact_tags_tag", "artifact_tags", ["tag"])
    op.create_table(
        "compile_runs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("compiler", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("hostname", sa.String(256), nullable=False),
        sa.Column("detail_json", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_compile_runs"),
        sa.CheckConstraint("state IN ('running', 'finished', 'failed')", name="ck_compile_runs_state"),
    )
    op.create_table(
        "artifact_lineage",
        sa.Column("artifact_id", sa.Integer(), nullable=False),
        sa.Column("compile_run_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("artifact_id", name="pk_artifact_lineage"),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"], name="fk_artifact_lineage_artifact_id_artifacts", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["compile_run_id"],
            ["compile_runs.id"],
            name="fk_artifact_lineage_compile_run_id_compile_runs",
            ondelete="RESTRICT",
        ),
    )
    op.create_index("ix_artifact_lineage_compile_run_id", "artifact_lineage", ["compile_run_id"])

    # Backfill: one history row per existing artifact, recording the status it has now.
    artifacts = sa.table("artifacts", sa.column("id", sa.Integer()), sa.column("status"), sa.column("status_reason"))
    history = sa.table(
        "artifact_status_history",
        sa.column("artifact_id", sa.Integer()),
        sa.column("status"),
        sa.column("reason"),
        sa.column("actor"),
        sa.column("changed_at", sa.DateTime(timezone=True)),
    )
    reason = sa.func.coalesce(artifacts.c.status_reason, sa.literal("status before history was recorded"))
    op.execute(
        history.insert().from_select(
            ["artifact_id", "status", "reason", "actor", "changed_at"],
            sa.select(
                artifacts.c.id,
                artifacts.c.status,
                reason,
                sa.literal("migration 0002"),
                sa.literal(dt.datetime.now(dt.UTC), sa.DateTime(timezone=True)),
            ),
        )
    )


def downgrade() -> None:
    op.drop_index("ix_artifact_lineage_compile_run_id", table_name="artifact_lineage")
    op.drop_table("artifact_lineage")
    op.drop_table("compile_runs")
    op.drop_index("ix_artifact_tags_tag", table_name="artifact_tags")
    op.drop_table("artifact_tags")
    op.drop_index("ix_artifact_status_history_artifact_id", table_name="artifact_status_history")
    op.drop_table("artifact_status_history")
