"""Set-based row updates: one UPDATE per shape instead of one per row.

Group commits change many rows with mostly equal values; columns whose values
differ between rows become `CASE key WHEN … THEN … END`. The result is the same
as updating each row on its own, in a handful of round trips.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Column, Table, case, update

from .db import Tx

_MAX_ROWS_PER_STATEMENT = 500


async def update_many(tx: Tx, table: Table, key: Column, rows: dict[Any, dict[str, Any]]) -> None:
    shapes: dict[tuple[str, ...], list[Any]] = defaultdict(list)
    for k, values in rows.items():
        if values:
            shapes[tuple(sorted(values))].append(k)
    for cols, keys in shapes.items():
        keys.sort()
        for i in range(0, len(keys), _MAX_ROWS_PER_STATEMENT):
            chunk = keys[i : i + _MAX_ROWS_PER_STATEMENT]
            values: dict[str, Any] = {}
            for col in cols:
                first = rows[chunk[0]][col]
                if all(rows[k][col] == first for k in chunk[1:]):
                    values[col] = first
                else:
                    values[col] = case({k: rows[k][col] for k in chunk}, value=key, else_=table.c[col])
            await tx.execute(update(table).where(key.in_(chunk)).values(**values))
