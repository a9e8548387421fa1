"""Schedule lag p99 and client-coalesced streams per cell of an embedded suite, placement against placement.

Runs the embedded suite (CPU vLLM and Locust on this machine) scaled down, once per placement:
``shared`` (the server in its own session at nice 10, nothing else: the former default) and
``isolated`` (the server off the first core with its OpenMP threads bound there and its autogroup
niced, Locust at SCHED_FIFO where allowed: the default). Prints per cell the schedule lag p99 and
max, the streams a late read coalesced, and the read-delay p99 the records carry.

    python benchmarks/embedded_cells.py [--placements shared,isolated] [--n 24] [--rates 2,4] [--out DIR]
    python benchmarks/embedded_cells.py --show RESULTS_DIR [RESULTS_DIR ...]   # figures of finished suites
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEYS = ("n", "errors", "schedule_lag_p99", "schedule_lag_max", "client_coalesced_streams",
        "max_read_delay_p99", "ttft_p99", "gap_p99")  # fmt: skip


def cells(root: Path) -> list[dict[str, Any]]:
    out = []
    for summary in sorted(root.glob("*/summary-*.json")):
        s = json.loads(summary.read_text())
        out.append({"cell": summary.parent.name, **{k: s.get(k) for k in KEYS}})
    return out


def show(root: Path, label: str) -> None:
    print(f"{label} ({root})")
    print(f"  {'cell':<26}" + "".join(f"{k:>26}" for k in KEYS))
    for c in cells(root):
        print(f"  {c['cell']:<26}" + "".join(f"{'-' if c[k] is None else c[k]!s:>26}" for k in KEYS))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--placements", default="shared,isolated")
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--rates", default="2,4")
    p.add_argument("--out", default=f"results/embedded-cells-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--show", nargs="*", default=None)
    args = p.parse_args()
    if args.show:
        for d in args.show:
            show(Path(d), Path(d).name)
        return 0
    out = Path(args.out)
    for placement in args.placements.split(","):
        root = out / placement
        cmd = [sys.executable, "-m", "tailgate.cli", "suite", "--embedded", "--results", str(root),
               "--placement", placement, "--rates", args.rates, "--nochunk-rates", "none", "--preempt-rate", "none",
               "--n", str(args.n), "--warmup", "4", "--no-report"]  # fmt: skip
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True)
        print(f"[{placement}] suite exit {done.returncode} after {time.monotonic() - t0:.0f} s", flush=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
        show(root, placement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
