"""Alembic environment: always runs on a connection handed in by `gateway.store.engine`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gateway.store.tables import metadata


def run() -> None:
    """Run the migrations on the connection in `config.attributes['connection']`."""
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("run migrations through `herald db upgrade`, not the alembic CLI")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=False,
    )
    context.run_migrations()


run()
