"""The printed table: results, Orbit/peer ratios, the database ceiling fraction and the performance targets."""

from __future__ import annotations

import math
from typing import Any

PEERS = ("celery+redis", "procrastinate")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else str(v)


def _find(rows: list[dict], scenario: str, system: str, case_prefix: str = "") -> dict | None:
    for r in rows:
        if r["scenario"] == scenario and r["system"] == system and r["case"].startswith(case_prefix) \
                and r["status"] in ("ok", "partial") and r["case"] != "calibration drain":
            return r
    return None


def _find_case(rows: list[dict], scenario: str, system: str, suffix: str) -> dict | None:
    for r in rows:
        if r["scenario"] == scenario and r["system"] == system and r["case"].endswith(suffix) \
                and r["status"] in ("ok", "partial"):
            return r
    return None


def _rate(row: dict | None) -> str:
    v = _metric(row, "rate_per_s")
    return f"{v:.0f}" if v is not None else "fixed"


def _metric(row: dict | None, name: str) -> float | None:
    if row is None:
        return None
    v = row["metrics"].get(name)
    return v if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else None


def render(data: dict[str, Any], order: list[str]) -> str:
    rows = data["results"]
    out: list[str] = []
    mach = data.get("machine", {})
    out.append(f"Orbit benchmark suite, mode {data['mode']}, {data['seconds']:.0f}s, "
               f"{mach.get('cpus')} CPUs (shared by the database, the servers, the workers, the peers and this "
               f"client; other work on the machine may run at the same time), load average at the end "
               f"{mach.get('loadavg_at_end')}")
    db = mach.get("mariadb")
    if isinstance(db, dict):
        out.append(f"MariaDB {db['version']}, innodb_flush_log_at_trx_commit={db['innodb_flush_log_at_trx_commit']}, "
                   f"sync_binlog={db['sync_binlog']}, log_bin={db['log_bin']}, "
                   f"buffer pool {int(db['innodb_buffer_pool_size']) // 2**20} MiB")
    out.append("")
    w_s, w_sys, w_case, w_st = 12, 14, 36, 12
    out.append(f"{'scenario':<{w_s}} {'system':<{w_sys}} {'case':<{w_case}} {'status':<{w_st}} results")
    out.append("-" * 140)
    rank = {name: i for i, name in enumerate(order)}
    for r in sorted(rows, key=lambda r: rank.get(r["scenario"], 99)):
        metrics = " | ".join(f"{k} {_fmt(v)}" for k, v in r["metrics"].items())
        note = f"  ({r['note']})" if r["note"] else ""
        out.append(f"{r['scenario']:<{w_s}} {r['system']:<{w_sys}} {r['case'][:w_case]:<{w_case}} "
                   f"{r['status']:<{w_st}} {metrics}{note}")

    # ---- Orbit / peer
    comp: list[tuple[str, float | None, float | None, str]] = []
    orbit_drain = _find(rows, "drain", "orbit", "1 node")
    orbit_lat = _find_case(rows, "latency", "orbit", "(50% of max)")
    orbit_fixed = _find_case(rows, "latency", "orbit", "(fixed)")
    for peer in PEERS:
        pd = _find(rows, "drain", peer)
        if orbit_drain or pd:
            comp.append((f"drain tasks/s, orbit 1 node vs {peer}", _metric(orbit_drain, "tasks_per_s"),
                         _metric(pd, "tasks_per_s"), "higher is better"))
        for label, mine, theirs in (
            ("50% load", orbit_lat, _find_case(rows, "latency", peer, "(50% of max)")),
            (f"{_rate(orbit_fixed)}/s each", orbit_fixed, _find_case(rows, "latency", peer, "(fixed)")),
        ):
            for m in ("p50_ms", "p99_ms"):
                if mine or theirs:
                    comp.append((f"submit->start {m[:3]} ms at {label} vs {peer}", _metric(mine, m),
                                 _metric(theirs, m), "lower is better"))
    if comp:
        out.append("")
        out.append(f"{'Orbit vs peer (same run)':<52} {'orbit':>10} {'peer':>10} {'orbit/peer':>11}")
        out.append("-" * 100)
        for label, o, p, how in comp:
            ratio = f"{o / p:.2f}x" if o is not None and p else "n/a"
            out.append(f"{label:<52} {_fmt(o):>10} {_fmt(p):>10} {ratio:>11}  ({how} for Orbit)")

    # ---- database ceiling
    facts = data.get("facts", {})
    ceiling = facts.get("ceiling_single_commits_per_s")
    batch_ceiling = facts.get("ceiling_batch_rows_per_s")
    drain = _metric(orbit_drain, "tasks_per_s")
    if ceiling or batch_ceiling:
        out.append("")
        out.append("Database ceiling (same run)")
        out.append("-" * 100)
        if ceiling:
            out.append(f"durable 1-row commits/s (many connections)          {_fmt(ceiling):>10}")
        if batch_ceiling:
            out.append(f"rows/s in 500-row INSERTs                           {_fmt(batch_ceiling):>10}")
        if ceiling and drain:
            out.append(f"orbit drain (1 node) / 1-row commit ceiling        {drain / ceiling:>10.3f}")
        batch = facts.get("batch_submit_per_s")
        if batch_ceiling and batch:
            out.append(f"orbit batch submit / 500-row INSERT ceiling        {batch / batch_ceiling:>10.3f}")

    # ---- where a drain's CPU goes
    cpu_rows = [r for r in rows if r["scenario"] == "drain" and r["system"] == "orbit"
                and _metric(r, "server_cpu_us_per_task") is not None]
    if cpu_rows:
        out.append("")
        out.append("CPU per drained task, us (from the first lease; all share the machine's cores)")
        out.append("-" * 100)
        out.append(f"{'drain':<52} {'server':>10} {'mariadb':>10} {'workers':>10} {'total':>10}")
        for r in cpu_rows:
            parts = [_metric(r, f"{k}_cpu_us_per_task") or 0 for k in ("server", "mariadb", "workers")]
            out.append(f"{r['case']:<52} " + " ".join(f"{_fmt(v):>10}" for v in [*parts, sum(parts)]))

    # ---- performance targets
    tg: list[tuple[str, float | None, str, bool | None]] = []
    if drain is not None:
        tg.append(("end-to-end drain, 1 node (tasks/s)", drain, ">= 5,000", drain >= 5000))
    b = _metric(_find(rows, "submit", "orbit", "batch"), "tasks_per_s")
    if b is not None:
        tg.append(("batch submit (tasks/s)", b, ">= 20,000", b >= 20000))
    p50, p99 = _metric(orbit_lat, "p50_ms"), _metric(orbit_lat, "p99_ms")
    if p50 is not None:
        tg.append(("submit->Start p50 at half load (ms)", p50, "<= 5", p50 <= 5))
    if p99 is not None:
        tg.append(("submit->Start p99 at half load (ms)", p99, "<= 50", p99 <= 50))
    sus = _find_case(rows, "latency", "orbit", "(50% of sustained)")
    s50, s99 = _metric(sus, "p50_ms"), _metric(sus, "p99_ms")
    if s50 is not None:
        tg.append(("  same, half of sustained submit+drain: p50 (ms)", s50, "<= 5", s50 <= 5))
    if s99 is not None:
        tg.append(("  same, half of sustained submit+drain: p99 (ms)", s99, "<= 50", s99 <= 50))
    backlog_rows = [r for r in rows if r["scenario"] == "backlog" and r["status"] in ("ok", "partial")]
    if len(backlog_rows) > 1:
        last = backlog_rows[-1]
        x = _metric(last, "claim_x_empty")
        if x is not None:
            tg.append((f"claim p50 at {last['case']} / empty queue", x, "<= 1.5x", x <= 1.5))
    for peer in PEERS:
        pr = _metric(_find(rows, "drain", peer), "tasks_per_s")
        if drain is not None and pr is not None:
            tg.append((f"drain ahead of {peer} (orbit/peer)", drain / pr, "> 1", drain > pr))
    # Ratios within this run, so that they hold on any machine. The SDK rows against the mean of
    # the lean drains run before and after them (one when the second is missing).
    lean = [v for v in (drain, _metric(_find_case(rows, "drain", "orbit", ", again"), "tasks_per_s"))
            if v]
    lean_mean = sum(lean) / len(lean) if lean else None
    for handler in ("async", "sync"):
        sdk = _metric(_find(rows, "drain", "orbit", f"1 node, SDK {handler}"), "tasks_per_s")
        if sdk is not None and lean_mean:
            label = f"SDK drain, {handler} handler / lean drain" + (" (mean of 2)" if len(lean) > 1 else "")
            tg.append((label, sdk / lean_mean, ">= 0.9", sdk / lean_mean >= 0.9))
            # The lean sessions hold 800 tasks, the SDK rows 128: their transactions are larger.
            alike = _metric(_find_case(rows, "drain", "orbit", "(the SDK's in flight)"), "tasks_per_s")
            if alike:
                tg.append(("  same, lean sessions with its tasks in flight", sdk / alike, ">= 0.9", sdk / alike >= 0.9))
    light = _metric(orbit_fixed, "p50_ms")
    light99 = _metric(orbit_fixed, "p99_ms")
    peer_light = _metric(_find_case(rows, "latency", "procrastinate", "(fixed)"), "p50_ms")
    if light is not None and peer_light:
        tg.append((f"light load ({_rate(orbit_fixed)}/s) p50 / procrastinate's", light / peer_light, "<= 1",
                   light <= peer_light))
    if light and light99 is not None:
        tg.append(("light load p99 / its own p50", light99 / light, "<= 2", light99 <= 2 * light))
    if light and p50 is not None:
        tg.append(("half load p50 / light load p50", p50 / light, "<= 3", p50 <= 3 * light))
    # Half of the drain alone asks more than half of what the machine sustains when it must also
    # accept the tasks (often 80% of it): the same ratio at half of the sustained rate.
    if light and s50 is not None:
        tg.append(("  same, half of sustained submit+drain", s50 / light, "<= 3", s50 <= 3 * light))
    if ceiling and drain:
        tg.append(("drain / durable 1-row commit ceiling", drain / ceiling, ">= 0.35", drain / ceiling >= 0.35))
    if batch_ceiling and b is not None:
        tg.append(("batch submit / 500-row INSERT ceiling", b / batch_ceiling, ">= 0.2", b / batch_ceiling >= 0.2))
    if tg:
        out.append("")
        out.append(f"{'Target':<52} {'measured':>10} {'target':>10}  met")
        out.append("-" * 100)
        for label, v, target, met in tg:
            out.append(f"{label:<52} {_fmt(round(v, 2)):>10} {target:>10}  {'yes' if met else 'NO'}")
    if data["mode"] == "quick":
        out.append("")
        out.append("(--quick sizes: the targets' figures are for --full; a quick backlog stops at "
                   f"{max(data['sizes']['backlogs']):,} waiting tasks)")
    return "\n".join(out)
