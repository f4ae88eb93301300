"""Alembic environment: always driven programmatically with an open connection."""

from alembic import context

from orbit.server.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
