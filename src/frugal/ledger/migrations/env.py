"""Alembic's entry point for the ledger: migrations run on the connection `frugal.ledger.db`
hands over (`config.attributes["connection"]`), or on `sqlalchemy.url` from the command line
(`alembic -x` is not needed: `FRUGAL_DB_URL` is read by frugal.ledger.db)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from frugal.ledger.schema import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is not None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    url = context.config.get_main_option("sqlalchemy.url")
    with create_engine(url).connect() as conn:  # type: ignore[arg-type]
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
