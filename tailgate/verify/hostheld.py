"""CPUs the host held back: one sleeper per CPU, each pinned to it, timing its own 1-ms sleeps.

On a virtual machine the host may hold a CPU for milliseconds without the guest counting it as stolen
(on the 16-core GPU host the kernel's steal counter read 0% while sleepers overslept by up to 25 ms,
``benchmarks/results/stamp-matrix-h200/README.md``). A load process on a held CPU reads late and its
kernel-stamped chunks merge, which looks like the client's own fault. A sleeper that wakes late on the
same CPU at the same moment says whose it was. The self-check runs the sleepers during its stage and
says when the client's lateness coincides with held CPUs.

Each sleeper is ``python -m tailgate.verify.hostheld --cpu N``: it prints one line per oversleep over
``--report-ms`` (wall-clock seconds, milliseconds) and ends on SIGTERM. About 1% of a CPU each.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tailgate.jsontypes import JsonMapping, JsonObject, json_float, json_int

HELD_MS = 5.0
"""An oversleep this long can alone put a read past the self-check's bound on the largest worst-gap
error (5 ms): listed and counted."""
SLEEP_S = 0.001


def sleep_and_report(report_ms: float) -> None:
    """Sleep 1 ms at a time until SIGTERM; print every oversleep longer than ``report_ms``."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    clock = time.perf_counter
    while not stop:
        before = clock()
        time.sleep(SLEEP_S)
        over_ms = (clock() - before - SLEEP_S) * 1000
        if over_ms > report_ms:
            print(f"{time.time():.4f} {over_ms:.3f}", flush=True)


@dataclass
class HostHeldWatch:
    """The sleepers of one stage, one per CPU this process may run on."""

    report_ms: float = HELD_MS
    procs: dict[int, subprocess.Popen[str]] = field(default_factory=dict)

    def start(self) -> HostHeldWatch:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        for cpu in cpus:
            cmd = [sys.executable, "-m", "tailgate.verify.hostheld", "--cpu", str(cpu)]
            self.procs[cpu] = subprocess.Popen(
                [*cmd, "--report-ms", str(self.report_ms)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
            )
        return self

    def stop(self, window: tuple[float, float] | None) -> JsonObject | None:
        """End the sleepers; their oversleeps inside ``window`` (wall-clock seconds), or None when none ran."""
        if not self.procs:
            return None
        late: dict[int, list[tuple[float, float]]] = {}
        for cpu, proc in self.procs.items():
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            late[cpu] = parse_lines(out)
        self.procs.clear()
        return held_summary(late, window, self.report_ms)


def parse_lines(out: str) -> list[tuple[float, float]]:
    found = []
    for line in out.splitlines():
        parts = line.split()
        try:
            found.append((float(parts[0]), float(parts[1])))
        except (IndexError, ValueError):
            continue
    return found


def held_summary(
    late: dict[int, list[tuple[float, float]]], window: tuple[float, float] | None, report_ms: float
) -> JsonObject:
    """How often and how long the CPUs were held during the stage (the whole watch when no window)."""
    inside = {
        cpu: [(t, ms) for t, ms in events if window is None or window[0] <= t <= window[1]]
        for cpu, events in late.items()
    }
    held = [ms for events in inside.values() for _, ms in events]
    return {
        "cpus": len(late),
        "over_ms": report_ms,
        "oversleeps": len(held),
        "cpus_held": sum(1 for events in inside.values() if events),
        "worst_ms": round(max(held), 3) if held else 0.0,
    }


def held_line(held: JsonMapping | None, client_late: bool) -> str | None:
    """The self-check's line when CPUs were held during a stage in which the client read late; ``held`` is
    :func:`held_summary`'s document (the self-check's ``host_held``)."""
    if not held or not client_late:
        return None
    oversleeps = json_int(held, "oversleeps", where="host_held")
    if not oversleeps:
        return None
    cpus_held, cpus = json_int(held, "cpus_held", where="host_held"), json_int(held, "cpus", where="host_held")
    over_ms, worst_ms = json_float(held, "over_ms", where="host_held"), json_float(held, "worst_ms", where="host_held")
    return (
        f"HOST HELD CPUS: sleepers pinned to {cpus_held} of {cpus} CPUs overslept "
        f"{oversleeps} time(s) by more than {over_ms:g} ms during the stage, up to "
        f"{worst_ms:g} ms, with no steal counted: late reads at those moments are the host's; "
        "packet-capture stamps (--chunk-stamp capture) do not depend on them"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tailgate.verify.hostheld")
    p.add_argument("--cpu", type=int, required=True, help="the CPU to pin this sleeper to")
    p.add_argument("--report-ms", type=float, default=HELD_MS, help="oversleeps longer than this are printed")
    args = p.parse_args(argv)
    try:
        os.sched_setaffinity(0, {args.cpu})
    except OSError as e:
        sys.stderr.write(f"hostheld: error: cannot pin to CPU {args.cpu}: {e}\n")
        return 2
    sleep_and_report(args.report_ms)
    return 0


__all__ = ["HELD_MS", "HostHeldWatch", "held_line", "held_summary", "main", "parse_lines"]

if __name__ == "__main__":
    sys.exit(main())
