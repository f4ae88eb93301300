"""Set-based writes shared by the query modules: many rows in a handful of statements."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..dialect import RetryTransaction, is_duplicate_key
from ..tx import Stmt, Tx, placeholders

_MAX_ROWS_PER_STATEMENT = 500


async def update_many(tx: Tx, table: str, rows: dict[str, dict[str, Any]]) -> None:
    """Update rows of `table` keyed by `id`; `rows` maps id -> {column: value}. Group commits
    change many rows with mostly equal values: columns whose values differ between rows become
    `CASE id WHEN … THEN … END`, the same as updating each row on its own."""
    shapes: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for k, values in rows.items():
        if values:
            shapes[tuple(sorted(values))].append(k)
    for cols, keys in shapes.items():
        keys.sort()
        for i in range(0, len(keys), _MAX_ROWS_PER_STATEMENT):
            await tx.defer_split(lambda chunk, cols=cols: _update_statement(table, rows, cols, chunk),
                                 keys[i : i + _MAX_ROWS_PER_STATEMENT])


def _update_statement(table: str, rows: dict[str, dict[str, Any]], cols: tuple[str, ...], chunk: Sequence[str]) -> Stmt:
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
    return Stmt(f"UPDATE {table} SET {', '.join(sets)} WHERE id IN ({placeholders(len(chunk))})", params)


async def insert_named(tx: Tx, table: str, row: dict[str, Any]) -> bool:
    """Insert a named resource (every column of `row`) now; False when its name is taken in the
    namespace (a concurrent create: the unique name index refused it)."""
    try:
        await tx.count(Stmt(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({placeholders(len(row))})",
                            list(row.values())))
    except Exception as exc:
        if is_duplicate_key(exc):
            return False
        raise
    return True


async def insert_once(tx: Tx, stmt: Stmt, rows: Sequence[Sequence[Any]], *, deferred: bool) -> None:
    """Insert rows whose keys were found free earlier in the transaction, now or (`deferred`) with
    the next round trip. A concurrent transaction that took a key meanwhile fails the insert on
    the primary key (here, or with the round trip that carries it): the transaction then runs
    again and finds what that one committed."""
    tx.duplicate_key_means(RetryTransaction)
    try:
        await (tx.defer_rows if deferred else tx.insert_rows)(stmt, rows)
    except Exception as exc:
        if is_duplicate_key(exc):
            raise RetryTransaction() from exc
        raise
