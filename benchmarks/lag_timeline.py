"""When in a stage the load process fell behind: schedule lag and late reads second by second.

A pause (a collection, a long greenlet turn) shows as one second where lag jumps and many streams merge at
once, after which the process catches up; an overload shows as lag that builds over seconds while the
streams in flight are many, and drains when they are fewer. Reads the records of a kept self-check (or any
results folder):

    tailgate selfcheck --rate 250 --n 7500 --tokens 100 --keep /tmp/sc
    python benchmarks/lag_timeline.py /tmp/sc/results [--bin-s 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailgate.records import RequestRecord, read_records  # noqa: E402


def timeline(records: list[RequestRecord], bin_s: float) -> list[dict[str, Any]]:
    """Per bin of intended send time: arrivals, streams in flight at the bin's start, the largest schedule
    lag and read delay of the streams sent in it, and how many of them merged chunks in late reads."""
    timed = [r for r in records if r.intended_s and r.sent_s]
    if not timed:
        return []
    t0 = min(r.intended_s for r in timed)
    end = max((r.end_s or r.sent_s) for r in timed)
    bins: list[dict[str, Any]] = []
    k = 0
    while t0 + k * bin_s <= end:
        lo, hi = t0 + k * bin_s, t0 + (k + 1) * bin_s
        sent = [r for r in timed if lo <= r.intended_s < hi]
        flying = sum(1 for r in timed if r.sent_s <= lo < (r.end_s or r.sent_s))
        bins.append({
            "t_s": round(k * bin_s, 3), "arrivals": len(sent), "in_flight": flying,
            "lag_max_ms": max((r.schedule_lag_ms for r in sent), default=None),
            "read_delay_max_ms": max((r.max_read_delay_ms or 0.0 for r in sent), default=None),
            "merged": sum(1 for r in sent if r.client_coalesced),
        })  # fmt: skip
        k += 1
    return bins


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a results folder (records-*.jsonl)")
    p.add_argument("--bin-s", type=float, default=1.0, help="bin width, seconds of intended send time")
    p.add_argument("--json", default=None, help="also write the bins here")
    args = p.parse_args(argv)
    if args.bin_s <= 0:
        sys.stderr.write("lag_timeline: error: --bin-s must be positive\n")
        return 2
    folder = Path(args.results)
    if not folder.is_dir():
        sys.stderr.write(f"lag_timeline: error: {folder} is not a folder\n")
        return 2
    bins = timeline(read_records(folder).records, args.bin_s)
    if not bins:
        sys.stderr.write(f"lag_timeline: error: no timed records in {folder}\n")
        return 2
    t0 = min(r.intended_s for r in read_records(folder).records if r.intended_s)
    print(f"t = 0 at {t0:.3f} (epoch s, the first intended send)")
    print(f"{'t s':>6} {'arrivals':>8} {'in flight':>9} {'lag max ms':>10} {'read delay max ms':>17} {'merged':>6}")
    for b in bins:
        lag = "-" if b["lag_max_ms"] is None else f"{b['lag_max_ms']:.2f}"
        delay = "-" if b["read_delay_max_ms"] is None else f"{b['read_delay_max_ms']:.2f}"
        print(f"{b['t_s']:>6g} {b['arrivals']:>8} {b['in_flight']:>9} {lag:>10} {delay:>17} {b['merged']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps(bins, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
