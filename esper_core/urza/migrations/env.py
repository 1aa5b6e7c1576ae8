"""Alembic environment: runs on the connection Urza hands it (``config.attributes["connection"]``).

Urza opens a write transaction (SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock) before
calling Alembic, so the whole upgrade is one transaction that concurrent openers wait on, and a
failure leaves the previous schema intact. ``target_metadata`` is ``Base.metadata`` after
importing every module of ``MODEL_MODULES``, so autogenerate sees tables other subsystems add.
"""

from __future__ import annotations

from alembic import context

from esper_core.urza.schema import target_metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "Urza's migrations run on a connection Urza provides: use `esper registry upgrade` or "
        "`python -m esper_core.urza.migrations`, not the alembic command line"
    )
context.configure(
    connection=connection,
    target_metadata=target_metadata(),
    # Batch mode lets a revision alter SQLite tables (copy-and-move); it is plain ALTER elsewhere.
    render_as_batch=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
