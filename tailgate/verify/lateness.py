"""Whether either side of a self-check fell behind its own schedule, and the verdict that says which.

The self-check's error figures compare the client's stamps with the server's actual writes, so they stay
exact when the server is late; what a late side breaks is the load itself. Both are judged from their own
logs, at the 99th percentile:

- **The reference server**: write lateness, each content write's return minus the absolute target it was
  scheduled for (its chunk log). Bound: **a quarter of the gap** at p99 (2.5 ms at the default 10-ms gap).
  Writes that late still leave consecutive chunks at least half a gap apart, each in its own slot, so the
  streams have the shape and the chunk rate asked for; the client's errors are measured against the actual
  writes either way. A server that falls behind misses it by orders of magnitude (1,000 req/s on one core of
  the 16-core host: p50 7.2 s, and the verdict said OK), while a server that keeps up is well inside it at the
  median: its writes wake on a ``timerfd`` at their target (:mod:`tailgate.verify.groundtruth.timers`), 0.05 to
  0.09 ms late at the median on a 2-core host. Its tail is its host's: 0.8 to 5 ms at p99 on that 2-core VM
  shared with other work, so there the verdict may say the reference was late in its tail, which it was.
  Half the gap would already let a chunk drift to the middle between two slots.
- **The client**: schedule lag, each request's actual send minus its intended send (its records). Bound:
  **10 ms** at p99, the threshold above which the report says the generator was starved. Every client figure
  is taken from the actual send, so a small lag moves no error; a large one means the open loop became a
  queue at the client, and the requests went out later than the load asked for.

A side that fell behind makes the verdict not OK (exit 1, :mod:`tailgate.exitcodes`) whatever the other
bounds say, and the verdict names the side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tailgate.clientbound import Bound, Finding, breached

SERVER_LATE_GAP_SHARE = 0.25
"""The reference's write lateness p99 bound, as a share of the gap between chunks."""
SERVER_LATE = Bound("server_write_lateness_p99_ms", "reference server write lateness p99", 2.5, "ms")
CLIENT_LAG = Bound("schedule_lag_p99_ms", "client schedule lag p99", 10.0, "ms")
CLIENT_LAG_P99_MS = CLIENT_LAG.limit


def server_late_bound(gap_ms: float, override: float | None = None) -> float:
    """The write lateness p99 bound for streams with this gap (``override``: the user's own)."""
    return SERVER_LATE_GAP_SHARE * gap_ms if override is None else override


def schedule_findings(
    server_p99: float | None, lag_p99: float | None, server_limit: float, lag_limit: float = CLIENT_LAG_P99_MS
) -> list[Finding]:
    """The two sides' lateness against their bounds (a figure that could not be measured is not judged)."""
    return [
        Finding(Bound(SERVER_LATE.key, SERVER_LATE.label, server_limit, "ms"), server_p99),
        Finding(Bound(CLIENT_LAG.key, CLIENT_LAG.label, lag_limit, "ms"), lag_p99),
    ]


def late_sides(schedule: Sequence[Finding]) -> dict[str, bool]:
    """``{"server": ..., "client": ...}``: which side fell behind its schedule."""
    late = {f.bound.key for f in breached(schedule)}
    return {"server": SERVER_LATE.key in late, "client": CLIENT_LAG.key in late}


def late_text(finding: Finding, p50: float | None = None) -> str:
    """What a breached lateness bound means, in the verdict's words; ``p50`` (the same figure's median) tells a
    side that fell behind (late at the median too: a queue) from one that was late only in its tail."""
    assert finding.value is not None
    figures = f"{finding.value:.3f} ms > bound {finding.bound.limit:.3f} ms"
    queue = p50 is None or p50 > finding.bound.limit
    median = "" if p50 is None else f" (p50 {p50:.3f} ms)"
    if finding.bound.key == SERVER_LATE.key:
        if queue:
            return (
                f"the reference server fell behind: write lateness p99 {figures}{median}; the client's figures were "
                "measured against a queue, not the load asked for"
            )
        return (
            f"the reference server was late in its tail: write lateness p99 {figures}{median}; its streams were "
            "not the schedule asked for (a machine too busy for it: fewer load processes, a quieter host, or "
            "--truth-realtime)"
        )
    if queue:
        return (
            f"the client fell behind its schedule: schedule lag p99 {figures}{median}; its requests went out later "
            "than the load asked for"
        )
    return (
        f"the client was late in its tail: schedule lag p99 {figures}{median}; some requests went out later than "
        "the load asked for"
    )


def verdict_of(
    exact: bool,
    findings: Sequence[Finding],
    schedule: Sequence[Finding] = (),
    p50s: Mapping[str, float | None] = {},
    accounting: str | None = None,
) -> tuple[str, bool]:
    """The one-line verdict and whether the check passed: an exact join, every planned request accounted for,
    neither side behind its schedule, and no bound on the client's error breached. ``p50s``: each schedule
    figure's median, by bound key; ``accounting``: how the run's own accounting disagrees with its records."""
    if not exact:
        return "FAIL: the join is not exact, so the error figures cannot be trusted", False
    parts = [f"the run's accounting is not exact: {accounting}"] if accounting else []
    parts += [late_text(f, p50s.get(f.bound.key)) for f in breached(schedule)] + [f.text() for f in breached(findings)]
    if parts:
        return "FAIL: " + "; ".join(parts), False
    return f"OK: all {len(findings) + len(schedule)} bounds held", True


__all__ = [
    "CLIENT_LAG", "CLIENT_LAG_P99_MS", "SERVER_LATE", "SERVER_LATE_GAP_SHARE", "late_sides", "late_text",
    "schedule_findings", "server_late_bound", "verdict_of",
]  # fmt: skip
