"""Build registry databases at a chosen schema revision, as older Esper versions left them."""

from __future__ import annotations

from sqlalchemy import text

from esper_core.urza import schema
from esper_core.urza.sql_engine import create_registry_engine


def migrate(url: str, target: str, *, pre_alembic: bool = False) -> None:
    """Build a database at ``target`` with the migrations; ``pre_alembic`` drops the version table."""
    engine = create_registry_engine(url)
    with engine.connect() as conn, conn.begin():
        schema.upgrade(conn, None, target)
        if pre_alembic:
            conn.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
