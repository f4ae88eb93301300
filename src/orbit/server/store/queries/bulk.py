"""Set-based row changes: one statement per shape instead of one per row.

Group commits change many rows with mostly equal values; columns whose values
differ between rows become `CASE id WHEN … THEN … END`. The result is the same
as updating each row on its own, in a handful of round trips.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..tx import Stmt, Tx, placeholders

_MAX_ROWS_PER_STATEMENT = 500


async def update_many(tx: Tx, table: str, rows: dict[str, dict[str, Any]]) -> None:
    """Update rows of `table` keyed by `id`; `rows` maps id -> {column: value}."""
    shapes: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for k, values in rows.items():
        if values:
            shapes[tuple(sorted(values))].append(k)
    for cols, keys in shapes.items():
        keys.sort()
        for i in range(0, len(keys), _MAX_ROWS_PER_STATEMENT):
            chunk = keys[i : i + _MAX_ROWS_PER_STATEMENT]
            sets: list[str] = []
            params: list[Any] = []
            for col in cols:
                first = rows[chunk[0]][col]
                if all(rows[k][col] == first for k in chunk[1:]):
                    sets.append(f"{col} = ?")
                    params.append(first)
                else:
                    sets.append(f"{col} = CASE id " + " ".join("WHEN ? THEN ?" for _ in chunk) + " END")
                    for k in chunk:
                        params.extend((k, rows[k][col]))
            params.extend(chunk)
            await tx.defer(Stmt(f"UPDATE {table} SET {', '.join(sets)} WHERE id IN ({placeholders(len(chunk))})",
                                params))
