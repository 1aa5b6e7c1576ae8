"""Baseline: blueprints and artifacts, as the walking skeleton created them before Alembic.

A registry created by that version (tables present, no ``alembic_version``) is treated as being
at this revision and upgraded from here.

Revision ID: 0001
Revises:
Create Date: 2026-05-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blueprints",
        sa.Column("blueprint_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("tier", sa.String(32), nullable=False),
        sa.Column("descriptor_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("blueprint_id", name="pk_blueprints"),
        sa.CheckConstraint("tier IN ('safe', 'experimental', 'high_risk')", name="ck_blueprints_tier"),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("blueprint_id", sa.String(128), nullable=False),
        sa.Column("shape_profile", sa.String(128), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("params_key", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("device_kind", sa.String(16), nullable=False),
        sa.Column("compiler", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("guard_json", sa.Text(), nullable=False),
        sa.Column("latency_json", sa.Text(), nullable=False),
        sa.Column("fallback", sa.Boolean(), nullable=False),
        sa.Column("fallback_reason", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("compile_ms", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.UniqueConstraint(
            "blueprint_id",
            "shape_profile",
            "params_key",
            "torch_version",
            "device_kind",
            "compiler",
            "version",
            name="uq_artifacts_key_version",
        ),
        sa.CheckConstraint("kind IN ('exported', 'eager')", name="ck_artifacts_kind"),
        sa.CheckConstraint("status IN ('active', 'quarantined', 'retired')", name="ck_artifacts_status"),
        sa.CheckConstraint("version >= 1", name="ck_artifacts_version_positive"),
        sa.CheckConstraint("size_bytes >= 1", name="ck_artifacts_size_positive"),
        sa.ForeignKeyConstraint(
            ["blueprint_id"],
            ["blueprints.blueprint_id"],
            name="fk_artifacts_blueprint_id_blueprints",
            ondelete="RESTRICT",
        ),
    )
    op.create_index("ix_artifacts_sha256", "artifacts", ["sha256"])
    op.create_index(
        "ix_artifacts_lookup",
        "artifacts",
        ["blueprint_id", "shape_profile", "torch_version", "device_kind", "compiler", "status"],
    )


def downgrade() -> None:
    op.drop_index("ix_artifacts_lookup", table_name="artifacts")
    op.drop_index("ix_artifacts_sha256", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_table("blueprints")
