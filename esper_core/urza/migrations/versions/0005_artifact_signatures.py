"""Artifacts and Simic policies carry a signature (``signature``, ``signature_key_id`` on ``artifacts`` and ``simic_policies``).

Both nullable, and existing rows are left unsigned on purpose: a migration that signed them would
vouch for whatever the database and blob store hold at upgrade time (tampered rows included),
and migrations run without the signing key (``esper registry upgrade`` on a shared PostgreSQL is
a DBA's job). Unsigned rows are refused at load with a message naming `esper registry resign`,
which an operator who trusts the registry's contents runs with the key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


_SIGNED = ("artifacts", "simic_policies")


def upgrade() -> None:
    for table in _SIGNED:
        op.add_column(table, sa.Column("signature", sa.String(length=64), nullable=True))
        op.add_column(table, sa.Column("signature_key_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    for table in _SIGNED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("signature_key_id")
            batch.drop_column("signature")
