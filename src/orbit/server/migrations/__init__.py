"""Alembic migrations, numbered 000001, 000002, … and applied by `orbit-admin migrate`."""
