"""The store reads timestamps back from SQLite's text by column name (`store/tx.py`): every
timestamp column of the migrated schema is named as one, and no other column is."""

import pytest
from sqlalchemy import DateTime, inspect

from orbit.server.store.tx import is_timestamp_column

pytestmark = pytest.mark.anyio


async def test_timestamp_columns_are_named_as_such_and_only_they(db):
    def columns(conn):
        insp = inspect(conn)
        return [(t, c["name"], c["type"]) for t in insp.get_table_names() if t != "alembic_version"
                for c in insp.get_columns(t)]

    found = await db.core_read(lambda tx: tx.conn.run_sync(columns))
    assert len(found) > 100
    wrong = [f"{t}.{name}" for t, name, kind in found if is_timestamp_column(name) != isinstance(kind, DateTime)]
    assert not wrong
