"""The queues' throughput samples (`queue_samples`): the cumulative counters of `queue_usage`,
sampled per 5-second bucket (`core/throughput.py`)."""

from __future__ import annotations

from datetime import datetime

from ..tx import Stmt

# Each queue's latest sample is kept apart, in `queue_sample_heads` (one small row per queue,
# always in memory): the sampler compares the usage rows with the heads, moves the heads that
# need it, then copies the moved heads into `queue_samples`, all in one transaction. Finding
# a queue's latest sample in the samples themselves cost a page read per queue once the hour
# of history outgrew the buffer pool.
#
# A head moves to the current bucket when the queue has none, or when its head is from an
# earlier bucket and the counters moved since or the head is older than `stale_before` (a
# baseline). The usage rows and heads are read from a snapshot, without locks (READ COMMITTED:
# an INSERT ... SELECT reads its sources as a consistent read): the sampler never waits for, nor
# holds up, a dispatch. The snapshot may be older than a head another node committed meanwhile,
# so the move itself is decided again on the head as it is now, under its row lock (the upsert
# reads the latest version): only forward, to a later bucket and to counters no lower (they
# only grow; lower ones were read before the other node's). A head therefore passes through a
# bucket at most once, in one transaction, which writes that bucket's sample: one sample per
# queue and bucket, always the head's, and the head is always the queue's latest sample. (A head
# another node moved to an earlier bucket after the snapshot may be moved on to the same
# counters: a repeated sample, which counts nothing.)
#
# The totals are assigned before `at`, each under the same condition: it still holds after
# the totals took the new values, and `at` (which it compares) changes last.
_COUNTERS = ("started_total", "succeeded_total", "failed_total")
_HEAD_COLUMNS = "queue_id, at, started_total, succeeded_total, failed_total"


def _forward(new, head: str) -> str:
    """The new values (`new(column)`) are a later bucket and counters no lower than `head`'s."""
    return " AND ".join([f"{new('at')} > {head}.at", *(f"{new(c)} >= {head}.{c}" for c in _COUNTERS)])


_DUE = ("(h.queue_id IS NULL OR (" + _forward(lambda c: "?" if c == "at" else f"u.{c}", "h")
        + " AND (h.at < ? OR " + " OR ".join(f"u.{c} <> h.{c}" for c in _COUNTERS) + ")))")
_MOVE = (f"INSERT INTO queue_sample_heads ({_HEAD_COLUMNS}) "
         "SELECT u.queue_id, ?, u.started_total, u.succeeded_total, u.failed_total FROM queue_usage u "
         f"LEFT JOIN queue_sample_heads h ON h.queue_id = u.queue_id WHERE {_DUE}")
_MYSQL_FORWARD = _forward(lambda c: f"VALUES({c})", "queue_sample_heads")
_SQLITE_FORWARD = _forward(lambda c: f"excluded.{c}", "queue_sample_heads")


def move_heads(at: datetime, stale_before: datetime) -> Stmt:
    """Move to the bucket starting `at` the head of every queue that needs a sample there; the
    row count is nonzero when this statement moved (or created) any."""
    params = (at, at, stale_before)
    mysql = _MOVE + " ON DUPLICATE KEY UPDATE " + ", ".join(
        f"{c} = IF({_MYSQL_FORWARD}, VALUES({c}), queue_sample_heads.{c})" for c in (*_COUNTERS, "at"))
    sqlite = (_MOVE + " ON CONFLICT (queue_id) DO UPDATE SET "
              + ", ".join(f"{c} = excluded.{c}" for c in (*_COUNTERS, "at")) + f" WHERE {_SQLITE_FORWARD}")
    return Stmt(mysql, params, sqlite=sqlite)


# The heads in the bucket are this transaction's moves and those of transactions committed
# before this statement (whose samples are committed with them): the primary key keeps those,
# and their rows do nothing. On MySQL that is `ON DUPLICATE KEY UPDATE` with no change rather
# than `INSERT IGNORE`, which would also turn any other error into a warning, and whose
# duplicate warnings the driver fetches (a round trip) and logs, one line per row.
_SAMPLE = (f"INSERT{{OR_IGNORE}} INTO queue_samples ({_HEAD_COLUMNS}) "
           f"SELECT {_HEAD_COLUMNS} FROM queue_sample_heads h WHERE h.at = ?")


def sample_heads(at: datetime) -> Stmt:
    """A sample of every head in the bucket starting `at` (after `move_heads`); the row count is
    the number of samples written."""
    return Stmt(_SAMPLE.replace("{OR_IGNORE}", "") + " ON DUPLICATE KEY UPDATE at = queue_samples.at", (at,),
                sqlite=_SAMPLE.replace("{OR_IGNORE}", " OR IGNORE"))


def prune(cutoff: datetime, limit: int) -> Stmt:
    """Up to `limit` samples labelled before `cutoff` (by `ix_queue_samples_at`)."""
    return Stmt("DELETE FROM queue_samples WHERE at < ? LIMIT ?", (cutoff, limit),
                sqlite="DELETE FROM queue_samples WHERE rowid IN (SELECT rowid FROM queue_samples "
                       "WHERE at < ? LIMIT ?)")


def any_to_prune(cutoff: datetime) -> Stmt:
    return Stmt("SELECT 1 AS one FROM queue_samples WHERE at < ? LIMIT 1", (cutoff,))


def of_queue(queue_id: str, since: datetime, until: datetime) -> Stmt:
    """The queue's samples labelled from `since` to `until`, plus its latest one at or before
    `since` (the window's baseline), oldest first: ranges of the primary key."""
    return Stmt("SELECT at, started_total, succeeded_total, failed_total FROM queue_samples "
                "WHERE queue_id = ? AND at <= ? AND at >= COALESCE((SELECT MAX(b.at) FROM queue_samples b "
                "WHERE b.queue_id = ? AND b.at <= ?), ?) ORDER BY at",
                (queue_id, until, queue_id, since, since))


def queue_born(namespace_id: str, queue_id: str) -> Stmt:
    """The queue's creation time with the database clock (no row: no such queue here)."""
    return Stmt("SELECT created_at, {NOW} AS db_now FROM queues WHERE id = ? AND namespace_id = ?",
                (queue_id, namespace_id))
