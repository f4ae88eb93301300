"""Why a waiting task is not running now: every layer's control that holds it.

Pure: the caller reads the task, its queue's and application's controls and usage
rows, its resource keys and the worker nodes active on the queue, at one database
time, and passes them here. The same rules as dispatch (`core.limits`,
`core.rate_window`, `core.dispatch_order`), asked the other way round.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from .dispatch_order import fair_share, is_active, is_waiting
from .rate_window import WINDOW, RateWindow, claim_room
from .timefmt import format_ts


class Layer(NamedTuple):
    """A queue's or an application's controls and usage."""

    paused: bool
    retired: bool
    max_concurrency: int
    rate_per_second: int
    in_use: int
    window: RateWindow


class Key(NamedTuple):
    name: str
    max_concurrency: int
    in_use: int
    retired: bool


class NodeUse(NamedTuple):
    node_id: str
    in_flight: int
    last_claim_at: datetime
    wanting_at: datetime | None


def active(nodes: list[NodeUse], now: datetime) -> list[NodeUse]:
    """The nodes active on a queue: one of their sessions claimed on it within the last 10 s."""
    return [n for n in nodes if is_active(n.last_claim_at, now)]


def _layer(name: str, layer: Layer, now: datetime) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if layer.retired:
        out.append({"layer": name, "control": "retired"})
    if layer.paused:
        out.append({"layer": name, "control": "paused"})
    if layer.in_use >= layer.max_concurrency:
        out.append({"layer": name, "control": "max_concurrency", "limit": layer.max_concurrency,
                    "in_use": str(layer.in_use)})
    if claim_room(layer.window, layer.rate_per_second, now) <= 0:
        entry = {"layer": name, "control": "rate_per_second", "limit": layer.rate_per_second,
                 "used": str(layer.window.used_now(now) + layer.window.reserved)}
        if layer.window.is_open(now):
            assert layer.window.start is not None
            entry["until"] = format_ts(layer.window.start + WINDOW)
        out.append(entry)
    return out


def blockers(*, state: str, available_at: datetime, now: datetime, queue: Layer, application: Layer,
             keys: list[Key], nodes: list[NodeUse]) -> list[dict[str, Any]]:
    """Every control holding a `WAITING` task, in layer order; empty for any other state, and
    empty for a due waiting task that the next claim on its queue can take."""
    if state != "WAITING":
        return []
    out: list[dict[str, Any]] = []
    if available_at > now:
        out.append({"layer": "time", "control": "available_at", "until": format_ts(available_at)})
    out += _layer("queue", queue, now)
    out += _layer("application", application, now)
    for k in sorted(keys, key=lambda k: k.name):
        if k.retired:
            out.append({"layer": "resource_key", "name": k.name, "control": "retired"})
        if k.in_use >= k.max_concurrency:
            out.append({"layer": "resource_key", "name": k.name, "control": "max_concurrency",
                        "limit": k.max_concurrency, "in_use": str(k.in_use)})
    live = active(nodes, now)
    if not live:
        out.append({"layer": "workers", "control": "no_active_workers"})
    elif len(live) >= 2:
        share = fair_share(queue.max_concurrency, len(live))
        waiting = [n for n in live if is_waiting(n.wanting_at, now)]
        # Every node that wants work holds its fair share while another one waits too.
        if len(waiting) >= 2 and all(n.in_flight >= share for n in waiting):
            out.append({"layer": "fairness", "control": "max_concurrency", "limit": share,
                        "in_use": str(min(n.in_flight for n in waiting))})
    return out
