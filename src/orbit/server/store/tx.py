"""One open transaction: named statements in, rows out, the database clock read once.

Statements come from the query modules as `Stmt`s written once for both backends:
`?` placeholders plus a few dialect tokens that are resolved here —

- `{FOR_UPDATE}`, `{SKIP_LOCKED}`, `{SHARE}`: row locks (SQLite's single writer needs none);
- `{NOW}`: the database clock (MySQL `NOW(6)`; SQLite: the transaction's clock).

A statement whose text must differ between the backends carries its SQLite text in `sqlite`.

On MySQL a transaction runs on a driver connection opened with multi-statements:
writes whose row count nobody needs wait (`defer`) and travel with the next statement
or the COMMIT, so a transaction costs a few round trips however many tables it writes.
Statements go straight to the driver: SQLAlchemy Core costs several times its CPU per statement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

from .dialect import BAD_NULL, DUPLICATE_KEY, MYSQL, mysql_error_code
from .literals import Literals


class Stmt(NamedTuple):
    """A named query's statement: text with `?` placeholders and tokens, its parameters, and
    the SQLite text where it must differ."""

    sql: str
    params: Sequence[Any] = ()
    sqlite: str | None = None


# What one round trip to MySQL carries at most, where it can be split: a quarter of the smallest
# max_allowed_packet Orbit supports (16 MiB, MariaDB's default). Past that limit the server refuses
# the statement and drops the connection, which may reach the client as a lost connection.
ROUND_TRIP_BYTES = 4 * 1024 * 1024


def text_bytes(text: str) -> int:
    """A statement's size on the wire, at most (a character takes up to four bytes)."""
    return len(text) if text.isascii() else 4 * len(text)


def sqlite_timestamp(value: datetime) -> str:
    """How SQLite stores a timestamp: `YYYY-MM-DD HH:MM:SS.ffffff` text, so that text order is time
    order (isoformat, not strftime: `%Y` does not zero-pad years before 1000 on glibc)."""
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def is_timestamp_column(name: str) -> bool:
    """Timestamp columns are named `…_at`, `…_start`, `at` or `time` (checked against the schema by
    tests/integration/test_store_columns.py); on SQLite they are read back from text."""
    return name.endswith(("_at", "_start")) or name in ("at", "time", "db_now")
_MYSQL_TOKENS = {"{FOR_UPDATE}": " FOR UPDATE", "{SKIP_LOCKED}": " FOR UPDATE SKIP LOCKED",
                 "{SHARE}": " LOCK IN SHARE MODE", "{NOW}": "NOW(6)"}
_SQLITE_TOKENS = {"{FOR_UPDATE}": "", "{SKIP_LOCKED}": "", "{SHARE}": ""}
_resolved: dict[tuple[str, str], str] = {}


def placeholders(n: int) -> str:
    """`?, ?, ?` for an IN list of n values."""
    return ", ".join("?" * n)


def _resolve(sql: str, dialect: str) -> str:
    key = (sql, dialect)
    text = _resolved.get(key)
    if text is None:
        text = sql
        for token, value in (_MYSQL_TOKENS if dialect == MYSQL else _SQLITE_TOKENS).items():
            text = text.replace(token, value)
        if dialect == MYSQL:
            text = text.replace("?", "%s")
        _resolved[key] = text
    return text


def _sqlite_param(value: Any) -> Any:
    if isinstance(value, datetime):
        return sqlite_timestamp(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _sqlite_rows(names: list[str], raw: list[Any]) -> list[dict[str, Any]]:
    rows = [dict(zip(names, r)) for r in raw]
    stamps = [n for n in names if is_timestamp_column(n)]
    if stamps:
        for r in rows:
            for col in stamps:
                v = r[col]
                if isinstance(v, str):
                    r[col] = datetime.fromisoformat(v)
    return rows


class ReadAhead:
    """Reads queued by `Tx.read_ahead`: their rows once the round trip that carried them is back."""

    __slots__ = ("results", "stmts", "texts")

    def __init__(self, stmts: list[Stmt]) -> None:
        self.stmts = stmts
        self.texts: list[str] = []
        self.results: list[list[dict[str, Any]]] | None = None


class Revisable:
    """A deferred statement that may still be replaced until its round trip goes (`Tx.revise`)."""

    __slots__ = ("bytes", "index", "round")

    def __init__(self, round_: list[str], index: int, size: int) -> None:
        self.round = round_  # the deferred list it waits in: a round trip starts a new one
        self.index = index
        self.bytes = size


_HOISTED = "@orbit_v"  # the session variables `_render_rows` names, numbered
_HOISTED_SET = f"SET {_HOISTED}"  # how its statements that set them begin


class Tx:
    """An open transaction (or, for reads, an autocommit connection).

    `conn` is a SQLAlchemy connection (SQLite, and Core statements in tests and tools);
    `driver` a MySQL driver connection; `multi` whether it accepts several statements per
    round trip, which is what lets `defer` wait; `multi_reads` (an autocommit read, whose
    writes must never wait for a COMMIT that does not come) only joins `rows_multi`'s reads.
    """

    def __init__(self, dialect: str, *, conn: Any = None, driver: Any = None, multi: bool = False,
                 multi_reads: bool = False) -> None:
        self.dialect = dialect
        self.conn = conn
        self._driver = driver
        self._multi = multi
        self._multi_reads = multi or multi_reads
        self._now: datetime | None = None
        self._deferred: list[str] = []
        self._deferred_bytes = 0
        self._hoisted = 0  # session variables this transaction's multi-row INSERTs have named
        self._literals = Literals()
        # MySQL error code -> exception to raise instead, for errors a deferred write may cause:
        # they surface with whichever later round trip (or the COMMIT) carries that write.
        self._meanings: dict[int, Callable[[], Exception]] = {}
        # Resource keys this transaction gave permits back to: once it commits, the node takes
        # tasks parked on them back to the claimable part (`Database.on_keys_freed`).
        self.keys_freed: set[str] = set()
        # Per queue, how many waiting claims this transaction gave work to (tasks that became due,
        # permits given back that a waiting task may take): once it commits, the node wakes that
        # many claims of each (`Database.on_claimable`).
        self.claimable: dict[str, int] = {}
        # Namespaces this transaction wrote events to: numbered by the node's sequencer after it commits.
        self.events_written: set[str] = set()
        # Reads that travel with the COMMIT, after every deferred write, and what takes their rows.
        self._at_commit: list[tuple[list[str], Callable[[list[list[dict[str, Any]]]], None]]] = []
        # Reads that travel with the next round trip, after its own statements (`read_ahead`).
        self._ahead: list[ReadAhead] = []
        # Run as the COMMIT is sent, before its answer (`as_commit_goes`).
        self._as_commit_goes: list[Callable[[], None]] = []
        # Deferred statements that lead the COMMIT's round trip, by their first words (`lead_commit`).
        self._leading: tuple[str, ...] = ()
        # The event batch rows this transaction deferred last, while later events may join them
        # (`queries.events.insert`): one row per namespace and write, however many steps emit.
        self.open_events: Any = None
        # Usage-row UPDATEs still waiting, per (table, key), that a later write of the same row
        # may join (`queries.usage`): one statement per row instead of one per step.
        self.open_usage: dict[tuple[str, str], Any] = {}

    # ---------------------------------------------------------------- clock

    async def now(self) -> datetime:
        """The database clock (naive UTC), read once per transaction."""
        if self._now is None:
            if self.dialect == MYSQL:
                self._now = (await self.rows(Stmt("SELECT NOW(6) AS db_now")))[0]["db_now"]
            else:
                self._now = datetime.now(timezone.utc).replace(tzinfo=None)
        return self._now

    async def refresh_now(self) -> datetime:
        """Read the clock again, for a decision that must come after a lock was taken."""
        self._now = None
        return await self.now()

    def adopt_clock(self, row: dict[str, Any] | None) -> None:
        """Take the transaction's clock from a row that selected `{NOW} AS db_now` (removed from it)."""
        value = row.pop("db_now", None) if row is not None else None
        if self._now is None:
            self._now = value
        if self._now is None:
            self._now = datetime.now(timezone.utc).replace(tzinfo=None)

    def _sqlite_clock(self) -> str:
        if self._now is None:
            self._now = datetime.now(timezone.utc).replace(tzinfo=None)
        return "'" + sqlite_timestamp(self._now) + "'"

    # ---------------------------------------------------------------- statements

    def _text(self, stmt: Stmt) -> str:
        if self.dialect == MYSQL:
            return _resolve(stmt.sql, MYSQL)
        text = _resolve(stmt.sqlite or stmt.sql, self.dialect)
        return text.replace("{NOW}", self._sqlite_clock()) if "{NOW}" in text else text

    def _mogrify(self, stmt: Stmt) -> str:
        return self._literals.mogrify(self._text(stmt), stmt.params)

    async def _driver_conn(self) -> Any:
        if self._driver is None:
            raw = await self.conn.get_raw_connection()
            self._driver = raw.driver_connection
        return self._driver

    def work_in(self, queue_id: str, count: int) -> None:
        """Once this transaction commits, `count` more waiting claims of `queue_id` may find work
        (nothing when `count` is not positive)."""
        if count > 0:
            self.claimable[queue_id] = self.claimable.get(queue_id, 0) + count

    def means(self, code: int, exception: Callable[[], Exception]) -> None:
        """From now on in this transaction, MySQL error `code` raises `exception()` instead."""
        self._meanings[code] = exception

    def guard_refusal_means(self, exception: Callable[[], Exception]) -> None:
        """A guarded write that refuses (a NULL into a NOT NULL column) raises `exception()`."""
        self.means(BAD_NULL, exception)

    def duplicate_key_means(self, exception: Callable[[], Exception]) -> None:
        self.means(DUPLICATE_KEY, exception)

    def meaning_of(self, exc: BaseException) -> Exception | None:
        code = mysql_error_code(exc) if self._meanings else None
        factory = self._meanings.get(code) if code is not None else None
        return factory() if factory is not None else None

    @property
    def deferring(self) -> bool:
        """Whether `defer` really waits for the next round trip (a multi-statement connection)."""
        return self._multi

    async def _run_mysql(self, statements: list[str]) -> list[tuple[int, list[dict[str, Any]]]]:
        """The deferred writes plus `statements` in one round trip; per statement of
        `statements`, its row count and rows (the deferred writes' results are skipped)."""
        if statements and self._deferred and \
                self._deferred_bytes + sum(map(text_bytes, statements)) > ROUND_TRIP_BYTES:
            await self._run_mysql([])  # the deferred writes first, in a round trip of their own
        d = await self._driver_conn()
        skip = len(self._deferred)
        # Reads ahead never ride with the COMMIT: they belong to the transaction.
        riding = self._ahead if not statements or statements[-1] != "COMMIT" else []
        if riding:
            self._ahead = []
            statements = [*statements, *(t for a in riding for t in a.texts)]
        text = ";\n".join([*self._deferred, *statements])
        self._deferred = []
        self._deferred_bytes = 0
        out: list[tuple[int, list[dict[str, Any]]]] = []
        async with d.cursor() as cur:
            await cur.execute(text)
            i = 0
            while True:
                if i >= skip:
                    rows: list[dict[str, Any]] = []
                    if cur.description:
                        names = [c[0] for c in cur.description]
                        rows = [dict(zip(names, r)) for r in await cur.fetchall()]
                    out.append((cur.rowcount, rows))
                i += 1
                if not await cur.nextset():
                    break
            # The driver keeps the first statement's status flags; the pool would take the
            # stale "in transaction" bit for an unfinished transaction and drop the connection.
            status = getattr(cur._result, "server_status", None)
            if status is not None:
                d.server_status = status
        for a in reversed(riding):
            a.results = [rows for _, rows in out[len(out) - len(a.texts):]]
            del out[len(out) - len(a.texts):]
        return out

    async def _one_statement(self, stmt: Stmt) -> tuple[int, list[dict[str, Any]]]:
        if self._multi:
            return (await self._run_mysql([self._mogrify(stmt)]))[-1]
        d = await self._driver_conn()
        if self.dialect == MYSQL:
            async with d.cursor() as cur:
                await cur.execute(self._text(stmt), tuple(stmt.params))
                rows = []
                if cur.description:
                    names = [c[0] for c in cur.description]
                    rows = [dict(zip(names, r)) for r in await cur.fetchall()]
                return cur.rowcount, rows
        cur = await d.execute(self._text(stmt), [_sqlite_param(p) for p in stmt.params])
        rows = []
        if cur.description:
            rows = _sqlite_rows([c[0] for c in cur.description], await cur.fetchall())
        count = cur.rowcount
        await cur.close()
        return count, rows

    async def rows(self, stmt: Stmt) -> list[dict[str, Any]]:
        """The rows of one statement, as dicts."""
        return (await self._one_statement(stmt))[1]

    async def one(self, stmt: Stmt) -> dict[str, Any] | None:
        rows = await self.rows(stmt)
        return rows[0] if rows else None

    async def count(self, stmt: Stmt) -> int:
        """Run one write; its affected row count."""
        return (await self._one_statement(stmt))[0]

    async def rows_multi(self, stmts: Sequence[Stmt]) -> list[list[dict[str, Any]]]:
        """Several independent statements' rows, in one round trip where the connection allows it."""
        if self._multi_reads and len(stmts) > 1:
            return [rows for _, rows in await self._run_mysql([self._mogrify(s) for s in stmts])]
        return [await self.rows(s) for s in stmts]

    def read_ahead(self, stmts: Sequence[Stmt]) -> ReadAhead:
        """Reads whose rows this transaction wants later: on a multi-statement connection they
        travel with its next round trip (after that trip's own statements), so that a later step
        costs no round trip of its own; elsewhere they run when asked for (`rows_ahead`)."""
        ahead = ReadAhead(list(stmts))
        if self._multi:
            ahead.texts = [self._mogrify(s) for s in ahead.stmts]
            self._ahead.append(ahead)
        return ahead

    async def rows_ahead(self, ahead: ReadAhead) -> list[list[dict[str, Any]]]:
        """The rows of reads queued by `read_ahead`, read now if no round trip carried them yet."""
        if ahead.results is None:
            if ahead in self._ahead:
                self._ahead.remove(ahead)
            ahead.results = await self.rows_multi(ahead.stmts)
        return ahead.results

    async def counts(self, stmts: Sequence[Stmt]) -> list[int]:
        """Several writes in one round trip where the connection allows it; their row counts.
        All of them run even when an earlier one matched nothing: roll back if that matters."""
        if self._multi:
            return [n for n, _ in await self._run_mysql([self._mogrify(s) for s in stmts])]
        return [await self.count(s) for s in stmts]

    async def defer(self, stmt: Stmt) -> None:
        """A write whose row count is not needed: sent with the next statement or the commit."""
        if self._multi:
            await self._defer_text(self._mogrify(stmt))
        else:
            await self.count(stmt)

    async def defer_revisable(self, stmt: Stmt) -> Revisable | None:
        """`defer`, keeping a handle that replaces the statement while it still waits (`revise`);
        None where writes do not wait (the statement ran)."""
        if not self._multi:
            await self.count(stmt)
            return None
        text = self._mogrify(stmt)
        await self._defer_text(text)
        return Revisable(self._deferred, len(self._deferred) - 1, text_bytes(text))

    def revise(self, handle: Revisable | None, stmt: Stmt) -> bool:
        """Put `stmt` in the place of the deferred statement `handle` names, if that one still
        waits and the round trip keeps within its size; False otherwise (nothing changes)."""
        if handle is None or handle.round is not self._deferred:
            return False
        text = self._mogrify(stmt)
        n = text_bytes(text)
        if self._deferred_bytes - handle.bytes + n > ROUND_TRIP_BYTES:
            return False
        self._deferred[handle.index] = text
        self._deferred_bytes += n - handle.bytes
        handle.bytes = n
        return True

    async def defer_split(self, build: Callable[[Sequence[Any]], Stmt], items: Sequence[Any]) -> None:
        """Defer `build(items)`, cut into statements of at most a round trip each (halving `items`
        until each fits; one item alone goes as it is)."""
        if not self._multi:
            await self.count(build(items))
            return
        await self._defer_halves(lambda part: [self._mogrify(build(part))], items)

    async def _defer_halves(self, render: Callable[[Sequence[Any]], list[str]], items: Sequence[Any]) -> None:
        """Defer the statements of `render(items)` in their order, or (past a round trip's size)
        those of the halves of `items`, recursively."""
        texts = render(items)
        if len(items) > 1 and sum(map(text_bytes, texts)) > ROUND_TRIP_BYTES:
            half = len(items) // 2
            await self._defer_halves(render, items[:half])
            await self._defer_halves(render, items[half:])
            return
        for text in texts:
            await self._defer_text(text)

    async def _defer_text(self, text: str) -> None:
        """Defer one statement's text; the deferred writes go at once when they fill a round trip."""
        n = text_bytes(text)
        if self._deferred and self._deferred_bytes + n > ROUND_TRIP_BYTES:
            await self._run_mysql([])
        self._deferred.append(text)
        self._deferred_bytes += n

    async def defer_rows(self, stmt: Stmt, rows: Sequence[Sequence[Any]]) -> None:
        """A multi-row `INSERT … VALUES (?, …)` for `rows`, deferred like `defer`."""
        if not rows:
            return
        if not self._multi:
            await self.insert_rows(stmt, rows)
            return
        head = self._text(stmt).partition(" VALUES ")[0]
        await self._defer_halves(lambda part: self._render_rows(head, part), rows)

    def _render_rows(self, head: str, rows: Sequence[Sequence[Any]]) -> list[str]:
        """The INSERT of `rows`, after the `SET` of the session variables that stand for the
        values all of them share, if any. The `SET` may go in an earlier round trip than its
        INSERT: the variables last as long as the connection."""
        sets: list[str] = []

        def hoist(text: str) -> str:
            name = f"{_HOISTED}{self._hoisted}"  # never reused in the transaction: see `_lead`
            self._hoisted += 1
            sets.append(f"{name} = {text}")
            return name

        insert = f"{head} VALUES {self._literals.values_list(rows, hoist)}"
        return ["SET " + ", ".join(sets), insert] if sets else [insert]

    async def insert_rows(self, stmt: Stmt, rows: Sequence[Sequence[Any]]) -> None:
        """A multi-row `INSERT … VALUES (?, …)` for `rows`, now."""
        if not rows:
            return
        if self._multi:
            await self.defer_rows(stmt, rows)
            await self._run_mysql([])
            return
        d = await self._driver_conn()
        if self.dialect == MYSQL:
            async with d.cursor() as cur:
                await cur.executemany(self._text(stmt), [tuple(r) for r in rows])
            return
        await d.executemany(self._text(stmt), [[_sqlite_param(p) for p in r] for r in rows])

    def at_commit(self, stmts: Sequence[Stmt], then: Callable[[list[list[dict[str, Any]]]], None]) -> None:
        """Run `stmts` in the COMMIT's round trip, after every deferred write (a multi-statement
        connection only); once committed, `then` gets their rows."""
        self._at_commit.append(([self._mogrify(s) for s in stmts], then))

    async def read_after_writes(self, stmts: Sequence[Stmt], then: Callable[[list[list[dict[str, Any]]]], None]) -> None:
        """`then` gets the rows of `stmts` read after every write of this transaction so far: in
        the COMMIT's round trip where writes wait for it (`at_commit`), at once elsewhere."""
        if self._multi:
            self.at_commit(stmts, then)
        else:
            then([await self.rows(s) for s in stmts])

    def as_commit_goes(self, fn: Callable[[], None]) -> None:
        """Run `fn` once every write of this transaction has been made, each guard held and its
        rows locked, as the COMMIT goes out, before it is known to be durable (a multi-statement
        connection only): for work that overlaps the commit's flush. The writes then travel in
        a round trip of their own, and the COMMIT alone after them."""
        self._as_commit_goes.append(fn)

    def lead_commit(self, *heads: str) -> None:
        """Put the deferred statements that begin with these `heads` first in the round trip that
        carries the writes, in this order (the others keep theirs): new rows before the UPDATEs
        of hot usage rows deferred earlier, which are then locked last and held the shortest."""
        self._leading = heads

    def _lead(self) -> None:
        heads = self._leading
        if heads and self._deferred:
            rank = {h: i for i, h in enumerate(heads)}
            ranks = [next((rank[h] for h in heads if t.startswith(h)), len(heads)) for t in self._deferred]
            # The SET of an INSERT's session variables keeps its place just before that INSERT
            # (the sort is stable, and no two INSERTs of a transaction share a variable).
            for i in range(len(ranks) - 2, -1, -1):
                if self._deferred[i].startswith(_HOISTED_SET):
                    ranks[i] = ranks[i + 1]
            order = sorted(range(len(ranks)), key=ranks.__getitem__)
            self._deferred[:] = [self._deferred[i] for i in order]

    async def commit_deferred(self) -> bool:
        """Send the deferred writes (and the `at_commit` reads) together with COMMIT, or before a
        COMMIT of its own when work runs as the commit goes; False when there were none."""
        self._lead()
        hooks, self._as_commit_goes = self._as_commit_goes, []
        if not self._deferred and not self._at_commit:
            for fn in hooks:
                fn()
            return False
        reads = [text for texts, _ in self._at_commit for text in texts]
        results = await self._run_mysql(reads if hooks else [*reads, "COMMIT"])
        rows = iter([r for _, r in results[:len(reads)]])
        for texts, then in self._at_commit:
            then([next(rows) for _ in texts])
        if hooks:
            for fn in hooks:
                fn()
            await self._run_mysql(["COMMIT"])
        return True

    # ---------------------------------------------------------------- SQLAlchemy Core (tests, tools)

    async def execute(self, statement: Any, params: Any = None):
        if params is None:
            return await self.conn.execute(statement)
        return await self.conn.execute(statement, params)

    async def one_or_none(self, statement: Any):
        return (await self.conn.execute(statement)).mappings().one_or_none()

    async def all(self, statement: Any):
        return (await self.conn.execute(statement)).mappings().all()

    async def scalar(self, statement: Any):
        return (await self.conn.execute(statement)).scalar()
