"""CPU time the hypervisor stole from this machine: a pause every process here suffers at once.

On a virtual machine the host can run something else instead of its CPUs. The load generator cannot
see that coming or make up for it: its reads come late, streams get merged, and the error looks like
the client's own. Reading the kernel's ``steal`` counter at a stage's start and end tells the two apart.
Linux only (``/proc/stat``); elsewhere there is nothing to read and the share is None. No gevent, no
pandas: the coordinator, the self-check and the report all read it.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
NOTABLE_SHARE = 0.05
"""Share of the machine's CPU time stolen during a stage from which the suite says so."""


def cpu_counters(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(stolen, total) CPU time over all CPUs since boot, in clock ticks; None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    values = [int(v) for v in first[1:] if v.isdigit()]
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user
    return values[7], sum(values[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time stolen between two readings (None if either is missing)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 4)


__all__ = ["NOTABLE_SHARE", "cpu_counters", "steal_share"]
