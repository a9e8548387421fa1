"""Does the host hold whole CPUs back? One sleeper per CPU, each pinned, each timing its own 1-ms sleeps.

A load process that reads late with no collection and no long greenlet turn of its own was either not run
or not handed its packets in time. A sleeper that wakes late on the same CPU at the same moment says the
CPU itself was held (the hypervisor, an interrupt storm); quiet sleepers say the cause is in the process.
Prints, per CPU, the oversleeps over ``--report-ms`` with their wall-clock time, so they can be laid beside
a run's lag timeline (``benchmarks/lag_timeline.py``, whose bins start at the stage's first intended send).

    python benchmarks/sched_canary.py --seconds 40 --json canary.json &
    tailgate selfcheck --rate 200 --n 6000 --tokens 100 --keep /tmp/sc
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path


def sleeper(cpu: int, seconds: float, report_ms: float, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.sched_setaffinity(0, {cpu})
    late: list[tuple[float, float]] = []
    end = time.monotonic() + seconds
    worst = 0.0
    while time.monotonic() < end:
        before = time.perf_counter()
        time.sleep(0.001)
        over_ms = (time.perf_counter() - before) * 1000 - 1.0
        worst = max(worst, over_ms)
        if over_ms > report_ms:
            late.append((round(time.time(), 3), round(over_ms, 2)))
    queue.put({"cpu": cpu, "worst_ms": round(worst, 2), "late": late})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--report-ms", type=float, default=5.0, help="oversleeps longer than this are listed")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.report_ms <= 0:
        sys.stderr.write("sched_canary: error: --seconds and --report-ms must be positive\n")
        return 2
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    cpus = sorted(os.sched_getaffinity(0))
    procs = [multiprocessing.Process(target=sleeper, args=(c, args.seconds, args.report_ms, queue)) for c in cpus]
    for proc in procs:
        proc.start()
    results = sorted((queue.get() for _ in procs), key=lambda r: r["cpu"])
    for proc in procs:
        proc.join()
    for r in results:
        shown = ", ".join(f"{t:.3f}:{ms:g}ms" for t, ms in r["late"][:8])
        count = len(r["late"])
        print(f"cpu {r['cpu']:>3}: worst oversleep {r['worst_ms']:g} ms; {count} over {args.report_ms:g} ms {shown}")
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
