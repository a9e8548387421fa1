"""The self-check over rates x stamp sources, three repeats per cell: the table of timing error, merged
streams, CPU per chunk and capture drops that says whether one load process measures exactly.

Each cell is ``tailgate selfcheck`` (the ground-truth server in its own process, one real Locust run of
the continuous arm, joined chunk by chunk), with ``--stage-seconds`` of arrivals at each rate. Repeats
are interleaved (every cell once, then every cell again) so a bad minute of a shared machine does not
land on one cell. Needs only the load path: no vLLM, no GPU.

    python benchmarks/stamp_matrix.py --rates 100 --stamps capture,kernel --stage-seconds 30
    python benchmarks/stamp_matrix.py --rates 50,100,200,400 --stamps capture,kernel --stage-seconds 30 \\
        --json benchmarks/results/stamp-matrix-h200.json --report benchmarks/results/stamp-matrix-h200.md
    python benchmarks/stamp_matrix.py --rates 100 --stamps capture --stress-cpu 2     # under stress-ng --cpu 2

Prints one row per cell: worst-gap error p99 and max (against the server's write returns, and the part
beyond what its write calls leave open, which the verdict judges), TTFT error p99, merged streams, CPU per chunk
(the whole Locust process tree, capture process included), capture drops and the self-check's verdict,
each repeat's figure side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tailgate.optiontable import STAMP_SOURCES  # noqa: E402
from tailgate.verify.selfcheck import SelfCheckConfig, run_selfcheck  # noqa: E402


def cell_figures(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run that the table shows."""
    cpu = result.get("cpu") or {}
    cap = result.get("capture") or {}
    return {
        "gap_p99": result["worst_gap_error_ms"]["p99"],
        "gap_max": result["worst_gap_error_ms"]["max"],
        "beyond_p99": result["worst_gap_beyond_write_ms"]["p99"],
        "beyond_max": result["worst_gap_beyond_write_ms"]["max"],
        "ttft_p99": result["ttft_error_ms"]["p99"],
        "merged": result["client_coalesced_streams"],
        "us_per_chunk": cpu.get("load_us_per_chunk"),
        "lag_p50": result["schedule_lag_ms"]["p50"],
        "lag_p99": result["schedule_lag_ms"]["p99"],
        "others_busy_cores": cpu.get("others_busy_cores"),
        "drops": cap.get("drops"),
        "missed": cap.get("missed_streams"),
        "stamps": result.get("chunk_stamps"),
        "host_held": result.get("host_held"),
        "ok": result["ok"],
        "exact": result["join"]["exact"],
        "problems": result["join"]["problems"][:3],
    }


def _cell(values: list[Any], fmt: str) -> str:
    return " / ".join("-" if v is None else format(v, fmt) for v in values)


def table(cells: dict[tuple[str, float], list[dict[str, Any]]]) -> str:
    head = (
        "| stamp | req/s | worst-gap error p99, ms | worst-gap error max, ms | beyond the server's writes p99 / max, "
        "ms | TTFT error p99, ms | merged streams | CPU per chunk, us | capture drops | others busy, cores | verdict |"
    )
    lines = [head, "|---|---:|---|---|---|---|---|---|---|---|---|"]
    for (stamp, rate), runs in cells.items():
        lines.append(
            f"| {stamp} | {rate:g} | {_cell([r['gap_p99'] for r in runs], '.3f')} "
            f"| {_cell([r['gap_max'] for r in runs], '.3f')} "
            f"| {' ; '.join(_cell([r['beyond_p99'], r['beyond_max']], '.3f') for r in runs)} "
            f"| {_cell([r['ttft_p99'] for r in runs], '.3f')} "
            f"| {_cell([r['merged'] for r in runs], 'd')} | {_cell([r['us_per_chunk'] for r in runs], '.1f')} "
            f"| {_cell([r['drops'] for r in runs], 'd')} | {_cell([r['others_busy_cores'] for r in runs], '.2f')} "
            f"| {' / '.join('OK' if r['ok'] else 'FAIL' for r in runs)} |"
        )
    return "\n".join(lines)


def start_stress(cpus: int) -> subprocess.Popen[bytes] | None:
    if not cpus:
        return None
    exe = shutil.which("stress-ng")
    if exe is None:
        raise SystemExit("stamp_matrix: --stress-cpu needs stress-ng on PATH")
    return subprocess.Popen([exe, "--cpu", str(cpus), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="50,100,200", help="comma-separated arrival rates, req/s")
    p.add_argument(
        "--stamps", default="capture,kernel", help=f"comma-separated stamp sources ({', '.join(STAMP_SOURCES)})"
    )
    p.add_argument("--stage-seconds", type=float, default=10.0, help="seconds of arrivals per run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tokens", type=int, default=100, help="chunks per stream")
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--stress-cpu", type=int, default=0, help="run stress-ng --cpu N for the whole benchmark")
    p.add_argument("--json", default=None)
    p.add_argument("--report", default=None, help="also write the table, command and machine to this Markdown file")
    args = p.parse_args()
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--rates: not a list of numbers: {args.rates!r}")
    stamps = [s.strip() for s in args.stamps.split(",") if s.strip()]
    bad = [s for s in stamps if s not in STAMP_SOURCES]
    if bad or not rates or args.repeat < 1 or not args.stage_seconds > 0:
        p.error(f"--stamps: one of {', '.join(STAMP_SOURCES)}; --rates, --repeat and --stage-seconds positive")
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {(s, r): [] for s in stamps for r in rates}
    raw: list[dict[str, Any]] = []
    stress = start_stress(args.stress_cpu)
    started = time.time()
    try:
        for rep in range(args.repeat):
            for stamp in stamps:
                for rate in rates:
                    cfg = SelfCheckConfig(
                        rate=rate, n=max(2, round(rate * args.stage_seconds)), tokens=args.tokens,
                        gap_ms=args.gap_ms, processes=args.processes, chunk_stamp=stamp,
                    )  # fmt: skip
                    result = run_selfcheck(cfg)
                    fig = cell_figures(result)
                    cells[(stamp, rate)].append(fig)
                    raw.append({"stamp": stamp, "rate": rate, "repeat": rep, **fig})
                    print(f"[{stamp} {rate:g} req/s, run {rep + 1}] {json.dumps(fig)}", file=sys.stderr, flush=True)
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait()
    out = table(cells)
    machine = f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}"
    command = " ".join(["python", "benchmarks/stamp_matrix.py", *sys.argv[1:]])
    print(out)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "machine": machine, "started": started,
                                               "runs": raw}, indent=1) + "\n")  # fmt: skip
    if args.report:
        Path(args.report).write_text(f"# Stamp matrix\n\n`{command}`\n\n{machine}; load average at the end "
                                     f"{os.getloadavg()[0]:.2f}\n\n{out}\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
