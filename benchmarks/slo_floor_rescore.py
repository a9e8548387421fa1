"""The fitted model's coverage and width under another least half-width, from a coverage run's verbose output.

The fitted model's interval is ``max(jackknife half-width, floor x capacity)`` around its capacity, intersected
with the measured bracket; both the logged interval and the measured bracket are printed per search by
``benchmarks/slo_coverage.py --verbose``, so a larger floor's answer follows exactly from the log:
``max(max(a, f0 c), f1 c) = max(a, f1 c)`` for ``f1 >= f0``. Used to report what the floor chosen after a run
(the fit's error measured by that run) gives, beside what the run itself gave.

Run: ``python benchmarks/slo_floor_rescore.py LOG [LOG ...] [--floor 0.025 --floor 0.04]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

TRUTH = re.compile(r"\[(\w+)\] engine .*true capacity ([\d.]+) req/s")
FITTED = re.compile(r"\[(\w+)\] search (\d+): fitted ([\d.]+) interval \[([\d.]+), ([\d.]+)\]")
BRACKET = re.compile(r"\[(\w+)\] search (\d+): \[([\d.]+|None), ([\d.]+|None)\]")


def rescore(logs: list[Path], floor: float) -> list[str]:
    truth: dict[str, float] = {}
    fitted: dict[tuple[str, int], tuple[float, float, float, bool]] = {}
    measured: dict[tuple[str, int], tuple[float | None, float | None]] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            if m := TRUTH.search(line):
                truth[m.group(1)] = float(m.group(2))
            elif m := FITTED.search(line):
                key = (m.group(1), int(m.group(2)))
                fitted[key] = (float(m.group(3)), float(m.group(4)), float(m.group(5)), "every check held" in line)
            elif m := BRACKET.search(line):
                lo, hi = (None if g == "None" else float(g) for g in m.group(3, 4))
                measured[(m.group(1), int(m.group(2)))] = (lo, hi)
    out = []
    for shape in sorted({k[0] for k in measured}):
        n = sum(1 for k in measured if k[0] == shape)
        usable = held = met = 0
        widths: list[float] = []
        for key, (cap, low, high, ok) in fitted.items():
            if key[0] != shape or not ok:
                continue
            half = max((high - low) / 2, floor * cap)
            m_lo, m_hi = measured[key]
            lo, hi = max(cap - half, m_lo or 0.0), min(cap + half, m_hi if m_hi is not None else float("inf"))
            t = truth[shape]
            holds, width = lo <= t <= hi, (hi - lo) / t
            usable, held, met = usable + 1, held + holds, met + (holds and width <= 0.15)
            widths.append(width)
        if usable:
            out.append(f"floor {floor:g}: {shape}: {n} searches, usable {usable}, coverage {held}/{usable} "
                       f"({held / usable:.0%}), width median {statistics.median(widths):.1%}, max {max(widths):.1%}, "
                       f"holds and within 15% {met}/{n} ({met / n:.0%})")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", type=Path, nargs="+")
    p.add_argument("--floor", type=float, action="append", default=[])
    args = p.parse_args(argv)
    for floor in args.floor or [0.025, 0.04]:
        for line in rescore(args.logs, floor):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
