"""Read the alternated one-process self-checks of ``benchmarks/device/one_process.sh`` into one table.

The host's speed can drift between rounds, so beside each run's load CPU per chunk it prints the load's CPU over
the reference server's in the same run: the reference does the same work in every run, so that ratio compares
the two trees on one footing where the absolute figure cannot.

    python benchmarks/one_process.py OUT_FOLDER [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

RUN_NAME = re.compile(r"selfcheck-(?P<tree>\w+)-(?P<round>\d+)\.json$")


def read_runs(folder: Path) -> list[dict[str, object]]:
    runs: list[dict[str, object]] = []
    for path in sorted(folder.glob("selfcheck-*.json")):
        match = RUN_NAME.search(path.name)
        if match is None:
            continue
        result = json.loads(path.read_text())
        cpu = result["cpu"]
        runs.append({
            "tree": match["tree"], "round": int(match["round"]), "verdict": result["verdict"],
            "load_us_per_chunk": cpu["load_us_per_chunk"], "server_us_per_chunk": cpu["server_us_per_chunk"],
            "load_over_reference": cpu["load_us_per_chunk"] / cpu["server_us_per_chunk"],
            "chunks_per_s": result["chunks_per_s"], "worst_gap_error_p99_ms": result["worst_gap_error_ms"]["p99"],
            "worst_gap_error_max_ms": result["worst_gap_error_ms"]["max"],
            "schedule_lag_p99_ms": result["schedule_lag_ms"]["p99"],
        })  # fmt: skip
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, help="write the runs and the per-tree means here")
    args = parser.parse_args(argv)
    runs = read_runs(args.folder)
    if not runs:
        print(f"one_process: no selfcheck-TREE-ROUND.json in {args.folder}", file=sys.stderr)
        return 2
    print("| tree | round | load us/chunk | reference us/chunk | load/reference | chunks/s "
          "| worst-gap err p99 / max (ms) | verdict |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for run in sorted(runs, key=lambda r: (str(r["tree"]), int(r["round"]))):  # type: ignore[call-overload]
        print(f"| {run['tree']} | {run['round']} | {run['load_us_per_chunk']:.2f} | {run['server_us_per_chunk']:.2f} | "
              f"{run['load_over_reference']:.3f} | {run['chunks_per_s']:.0f} | {run['worst_gap_error_p99_ms']:.3f} / "
              f"{run['worst_gap_error_max_ms']:.3f} | {run['verdict']} |")  # fmt: skip
    means: dict[str, dict[str, float]] = {}
    for tree in sorted({str(r["tree"]) for r in runs}):
        mine = [r for r in runs if r["tree"] == tree]
        means[tree] = {
            key: statistics.fmean(float(r[key]) for r in mine)  # type: ignore[arg-type]
            for key in ("load_us_per_chunk", "load_over_reference")
        }
        print(f"{tree}: {len(mine)} runs, load {means[tree]['load_us_per_chunk']:.2f} us per chunk "
              f"(mean), load/reference {means[tree]['load_over_reference']:.3f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "means": means}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
