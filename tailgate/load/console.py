"""The one line a finished stage prints on the console, and the warning it carries when the client fell behind.

Apart from the coordinator so the line can be tested, and reused, without starting a run.
"""

from __future__ import annotations

from typing import Any

from tailgate.clientbound import merged_breached
from tailgate.contracts import StageSummary
from tailgate.hoststeal import NOTABLE_SHARE

NONE = "–"
"""What the console prints for a figure that does not exist (no successful request, no counter read)."""


def shown(value: Any) -> str:
    """A figure as the console prints it: never ``None``."""
    return NONE if value is None else str(value)


def summary_line(s: StageSummary) -> str:
    """Named as the cell is everywhere else (its suite folder, the report): configuration, then stage label."""
    head = f"{s.config}_{s.stage_label}: n={s.n} errors={s.errors} "
    tail = f"preemptions {shown(s.preemptions_delta)}, schedule lag p99 {shown(s.schedule_lag_p99)} ms"
    if s.ttft_p50 is None:  # no measured successful request: there is no latency to print
        return head + f"no successful request, no latency figures; {tail}" + client_behind(s)
    return (
        head + f"TTFT p50/p99 {shown(s.ttft_p50)}/{shown(s.ttft_p99)} ms, "
        f"worst gap p50/p99 {shown(s.gap_p50)}/{shown(s.gap_p99)} ms, total p99 {shown(s.total_p99)} ms, " + tail
    ) + client_behind(s)


def client_behind(s: StageSummary) -> str:
    """The console's warning that a cell measured the client too: '' when no stream was merged by a late read.

    When the hypervisor stole a notable share of the machine's CPU meanwhile, the line says so: more load
    processes cannot help with a host that pauses all of them."""
    merged = s.client_coalesced_streams or 0
    if not merged_breached(merged):
        return ""
    steal = s.host_steal_share
    if steal is not None and steal >= NOTABLE_SHARE:
        cure = f"the host stole {steal:.0%} of this machine's CPU time meanwhile: a quieter host, not more processes"
    else:
        cure = "more --processes, or a quieter machine"
    return (
        f"; CLIENT BEHIND: {merged} of {s.n} streams merged chunks in late reads (client_coalesced); "
        f"their gaps describe the load generator, not the server ({cure})"
    )
