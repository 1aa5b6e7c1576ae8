"""Simic's decisions carry the outcome of a counterfactual fork (``simic_decisions.counterfactual_json``).

Nullable: decisions that were not forked, and every decision recorded before this revision,
have none, and Simic reads them as before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("simic_decisions", sa.Column("counterfactual_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("simic_decisions") as batch:
        batch.drop_column("counterfactual_json")
