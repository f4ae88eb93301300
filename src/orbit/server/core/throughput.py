"""A queue's throughput history: Starts, successes and failures per 5-second bucket.

Each queue's usage row keeps cumulative counters (`started_total`, `succeeded_total`,
`failed_total`), counted in the transactions that start attempts and end tasks. Every node
samples them once per bucket into `queue_samples`, labelled with the bucket's start (the
database clock), when they changed since the queue's latest sample, when it has none, or
when that one is older than `BASELINE_EVERY` (so that a baseline exists within retention);
samples older than `RETENTION` are pruned.

The history is a step function of the samples: the totals at an instant are those of the
latest sample at or before it, and the live counters at the end of the current bucket. A
bucket counts the difference between its end and its start. Where no sample lies at or
before an instant, a queue younger than the retention counts from zero there (none of its
samples can have been pruned: what it counted before its first sample shows in the bucket
before that sample), and any other queue's totals are unknown: a bucket starting at an
unknown instant counts 0, never the queue's whole history. The points of a
window therefore add up to the live totals minus those at its first known boundary.

A sample is read at some moment inside its bucket, so counts can show up to one bucket early
or late; their sum over the window is exact.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

INTERVAL = timedelta(seconds=5)
RETENTION = timedelta(hours=1)
BASELINE_EVERY = timedelta(minutes=30)
MIN_MINUTES, MAX_MINUTES, DEFAULT_MINUTES = 1, 60, 10
_EPOCH = datetime(1970, 1, 1)


class Totals(NamedTuple):
    """Cumulative counters of a queue (or the counts of one bucket)."""

    started: int
    succeeded: int
    failed: int

    def minus(self, earlier: Totals) -> Totals:
        """What was counted since `earlier` (never below zero: counters only grow)."""
        return Totals(max(0, self.started - earlier.started), max(0, self.succeeded - earlier.succeeded),
                      max(0, self.failed - earlier.failed))


ZERO = Totals(0, 0, 0)


class Sample(NamedTuple):
    at: datetime  # the start of the bucket it was read in
    totals: Totals


class Point(NamedTuple):
    at: datetime  # the bucket's start
    counts: Totals


def bucket_start(t: datetime, interval: timedelta = INTERVAL) -> datetime:
    """The start of the bucket holding `t` (buckets are aligned on the epoch)."""
    return t - (t - _EPOCH) % interval


def window(now: datetime, minutes: int, interval: timedelta = INTERVAL) -> list[datetime]:
    """The starts of the `minutes` worth of buckets ending with the current one, oldest first."""
    n = int(timedelta(minutes=minutes) / interval)
    current = bucket_start(now, interval)
    return [current - interval * (n - 1 - i) for i in range(n)]


def sample_cutoffs(now: datetime) -> tuple[datetime, datetime]:
    """For a sampling pass at `now`: the bucket its samples are labelled with, and the instant
    before which a queue's latest sample is too old to go without a new baseline."""
    return bucket_start(now), now - BASELINE_EVERY


def prune_before(now: datetime) -> datetime:
    """Samples labelled before this instant are no longer kept."""
    return now - RETENTION


def is_young(born_at: datetime | None, now: datetime, *, retention: timedelta = RETENTION,
             interval: timedelta = INTERVAL) -> bool:
    """Whether every sample the queue ever had is still kept: created less than the retention
    ago (a sample is labelled at most one bucket before the instant it was read)."""
    return born_at is not None and born_at - interval >= now - retention


def points(samples: Sequence[Sample], live: Totals, now: datetime, minutes: int, *, young: bool,
           interval: timedelta = INTERVAL) -> list[Point]:
    """One point per bucket of the window (`window`), oldest first, zero-filled.

    `samples` must hold the queue's samples of the window and the latest one at or before its
    first bucket's start (when there is one), in any order; samples after `now` are ignored.
    `live` are the counters read after the samples. `young`: the queue's samples were never
    pruned (`is_young`), so an instant before its first sample had counted nothing."""
    ordered = sorted((s for s in samples if s.at <= now), key=lambda s: s.at)
    ats = [s.at for s in ordered]

    def at_instant(t: datetime) -> Totals | None:
        i = bisect_right(ats, t)
        if i:
            return ordered[i - 1].totals
        return ZERO if young else None

    buckets = window(now, minutes, interval)
    out: list[Point] = []
    start = at_instant(buckets[0])
    for i, b in enumerate(buckets):
        end = live if i == len(buckets) - 1 else at_instant(buckets[i + 1])
        counts = ZERO if start is None or end is None else end.minus(start)
        out.append(Point(b, counts))
        start = end
    return out
