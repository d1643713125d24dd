"""Alembic's environment for the results store: runs on the connection :mod:`evalkube.store.migrate`
passes in ``config.attributes`` (inside its transaction and lock), never one of its own."""

from __future__ import annotations

from alembic import context

from evalkube.store import schema

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=schema.metadata,
    version_table=context.config.attributes["version_table"],
)
with context.begin_transaction():
    context.run_migrations()
