"""The one line a finished stage prints on the console, and the warning it carries when the client fell behind.

Apart from the coordinator so the line can be tested, and reused, without starting a run.
"""

from __future__ import annotations

from typing import Any

from tailgate.clientbound import merged_breached
from tailgate.hoststeal import NOTABLE_SHARE


def summary_line(s: dict[str, Any]) -> str:
    return (
        f"{s['stage_label']} [{s['config']}]: n={s['n']} errors={s['errors']} "
        f"TTFT p50/p99 {s['ttft_p50']}/{s['ttft_p99']} ms, worst gap p50/p99 {s['gap_p50']}/{s['gap_p99']} ms, "
        f"total p99 {s['total_p99']} ms, preemptions {s['preemptions_delta']}, "
        f"schedule lag p99 {s['schedule_lag_p99']} ms"
    ) + client_behind(s)


def client_behind(s: dict[str, Any]) -> str:
    """The console's warning that a cell measured the client too: '' when no stream was merged by a late read.

    When the hypervisor stole a notable share of the machine's CPU meanwhile, the line says so: more load
    processes cannot help with a host that pauses all of them."""
    merged = s.get("client_coalesced_streams") or 0
    if not merged_breached(merged):
        return ""
    steal = s.get("host_steal_share")
    if steal is not None and steal >= NOTABLE_SHARE:
        cure = f"the host stole {steal:.0%} of this machine's CPU time meanwhile: a quieter host, not more processes"
    else:
        cure = "more --processes, or a quieter machine"
    return (
        f"; CLIENT BEHIND: {merged} of {s['n']} streams merged chunks in late reads (client_coalesced); "
        f"their gaps describe the load generator, not the server ({cure})"
    )
