"""SQL literals for MySQL statements that travel as text (multi-statement round trips).

Security-relevant: every value that reaches such a statement goes through `literal`,
never string formatting of its own. Escaping matches the driver's
(`asyncmy.converters.escape_item`) except for `"`, which needs nothing between single
quotes (tests/unit/test_sql_literals.py, and a round trip through MariaDB in
tests/integration/test_sql_literals_roundtrip.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from asyncmy.converters import escape_item

# A literal at least this long, the same in every row of a multi-row INSERT, goes into a session
# variable (`values_list`): shorter ones cost MariaDB no more to parse than the variable.
HOISTED_LENGTH = 12

# What must be escaped inside a single-quoted string; the backslash first, since the others add one.
_ESCAPES = (("\\", "\\\\"), ("'", "\\'"), ("\0", "\\0"), ("\n", "\\n"), ("\r", "\\r"), ("\032", "\\Z"))


def escape_string(value: str) -> str:
    """Escaping for a single-quoted literal (without NO_BACKSLASH_ESCAPES, as the driver assumes).
    Only the replaces whose character occurs run, which is much cheaper than str.translate."""
    for char, escaped in _ESCAPES:
        if char in value:
            value = value.replace(char, escaped)
    return value


class Literals:
    """Builds literals; remembers the last timestamp, which a transaction stamps on many rows."""

    __slots__ = ("_last_time", "_last_time_sql")

    def __init__(self) -> None:
        self._last_time: datetime | None = None
        self._last_time_sql = ""

    def literal(self, value: Any) -> str:
        t = type(value)
        if t is str:
            return "'" + escape_string(value) + "'"
        if t is int:
            return str(value)
        if value is None:
            return "NULL"
        if t is bool:
            return "1" if value else "0"
        if t is datetime:
            if value is not self._last_time:
                self._last_time, self._last_time_sql = value, "'" + value.isoformat(" ") + "'"
            return self._last_time_sql
        return escape_item(value, "utf8mb4")

    def memo_literal(self) -> Callable[[Any], str]:
        """`literal` remembering each value's text, for one statement of many rows: ids, states and
        timestamps repeat from row to row. Equal values have interchangeable literals (`True == 1`)."""
        memo: dict[Any, str] = {}
        lit = self.literal
        get = memo.get

        def literal(value: Any) -> str:
            # get, not [] and KeyError: most values are new (ids), and a raised KeyError costs more.
            try:
                text = get(value)
            except TypeError:  # unhashable
                return lit(value)
            if text is None:
                text = memo[value] = lit(value)
            return text

        return literal

    def mogrify(self, sql: str, params: Sequence[Any]) -> str:
        """`sql` with `%s` placeholders (already converted from `?`) filled with literals."""
        if not params:
            return sql
        lit = self.memo_literal() if len(params) > 16 else self.literal
        return sql % tuple(map(lit, params))

    def values_list(self, rows: Sequence[Sequence[Any]], hoist: Callable[[str], str] | None = None) -> str:
        """`(…),(…),…` built column by column: a column with the same value in every row is
        escaped once into a row template, and only the varying columns are escaped per row.
        With `hoist`, such a column's long literal (an id, a timestamp) is given to it, and the
        session variable it names stands in every row instead: MariaDB parses the literal once."""
        columns = list(zip(*rows))
        n = len(rows)
        parts: list[str] = []
        varying: list[list[str]] = []
        for col in columns:
            if n == 1 or col.count(col[0]) == n:
                text = self.literal(col[0])
                if hoist is not None and n > 1 and len(text) >= HOISTED_LENGTH:
                    text = hoist(text)
                parts.append(text.replace("%", "%%"))
            else:
                parts.append("%s")
                varying.append(list(map(self.memo_literal(), col)))
        template = "(" + ",".join(parts) + ")"
        if not varying:
            return ",".join([template.replace("%%", "%")] * n)
        return ",".join([template % values for values in zip(*varying)])

