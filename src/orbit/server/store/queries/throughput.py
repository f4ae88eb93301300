"""The queues' throughput samples (`queue_samples`): the cumulative counters of `queue_usage`,
sampled per 5-second bucket (`core/throughput.py`)."""

from __future__ import annotations

from datetime import datetime

from ..tx import Stmt

# One sample per queue whose counters moved since its latest sample, that has none, or whose
# latest one is older than `stale_before`; a queue already sampled in this bucket (by another
# node) is left alone. The latest sample is one backward step into the primary key per queue.
# Under READ COMMITTED the usage rows are read from a snapshot, without locks: the sampler never
# waits for, nor holds up, a dispatch.
#
# Two nodes sampling at the same instant may still both pick a queue: the primary key keeps the
# first, and the second row does nothing. On MySQL that is `ON DUPLICATE KEY UPDATE` with no
# change rather than `INSERT IGNORE`, which would also turn any other error into a warning, and
# whose duplicate warnings the driver fetches (a round trip) and logs, one line per row.
_SAMPLE = ("INSERT{OR_IGNORE} INTO queue_samples (queue_id, at, started_total, succeeded_total, failed_total) "
           "SELECT u.queue_id, ?, u.started_total, u.succeeded_total, u.failed_total FROM queue_usage u "
           "WHERE COALESCE((SELECT l.at >= ? OR (l.at >= ? AND l.started_total = u.started_total "
           "AND l.succeeded_total = u.succeeded_total AND l.failed_total = u.failed_total) "
           "FROM queue_samples l WHERE l.queue_id = u.queue_id ORDER BY l.at DESC LIMIT 1), 0) = 0")


def sample_queues(at: datetime, stale_before: datetime) -> Stmt:
    """Sample every queue that needs one into the bucket starting `at`; the row count is the
    number of samples written."""
    return Stmt(_SAMPLE.replace("{OR_IGNORE}", "") + " ON DUPLICATE KEY UPDATE at = at",
                (at, at, stale_before), sqlite=_SAMPLE.replace("{OR_IGNORE}", " OR IGNORE"))


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
