"""Which instant should stamp a chunk: when ``recv`` returned, or when the kernel received the bytes?

Runs ``tailgate selfcheck`` (the ground-truth server, a real Locust run, the chunk-by-chunk join).
Each record keeps every chunk's read delay, so one run yields both stamps of every chunk, from the
same reads on the same machine at the same moment: the comparison needs no luck with a shared
machine's load. Prints the client-added error per chunk and the TTFT and worst-gap errors under each
stamp, per run, then the median over repeats.

    python benchmarks/chunk_stamp.py [--rates 20,80] [--repeats 3] [--n 400] [--tokens 50] [--json out.json]
    python benchmarks/chunk_stamp.py --from-dir DIR     # summarise runs saved as DIR/<mode>-r<rate>-<k>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from tailgate.load.client import CHUNK_STAMPS
from tailgate.verify.selfcheck import SelfCheckConfig, run_selfcheck

KEYS = (("chunk_error_ms", "p50"), ("chunk_error_ms", "p99"), ("chunk_error_ms", "max"),
        ("ttft_error_ms", "p99"), ("worst_gap_error_ms", "p99"))  # fmt: skip


BY_STAMP = {"chunk_error_ms": "chunk_error_ms", "ttft_error_ms": "ttft_error_ms", "worst_gap_error_ms": "gap_error_ms"}


def rows_of(result: dict[str, Any], rate: float, repeat: int) -> list[dict[str, Any]]:
    """One row per stamp; the run's own stamp from its figures, the other rebuilt from the read delays."""
    cpu = result.get("cpu") or {}
    out = []
    for mode in CHUNK_STAMPS:
        figures = (result.get("by_stamp") or {}).get(mode)
        if figures is None or not figures["chunk_error_ms"]["n"]:
            if mode != result.get("chunk_stamp", "recv"):
                continue
            figures = {BY_STAMP[k]: result[k] for k, _ in KEYS}
        out.append({
            "mode": mode, "rate": rate, "repeat": repeat, "exact": result["join"]["exact"],
            **{f"{k}_{q}": figures[BY_STAMP[k]][q] for k, q in KEYS},
            "others_busy_cores": cpu.get("others_busy_cores"),
        })  # fmt: skip
    return out


def run(rates: list[float], repeats: int, n: int, tokens: int) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        for k in range(repeats):
            result = run_selfcheck(SelfCheckConfig(rate=rate, n=n, tokens=tokens))
            for r in rows_of(result, rate, k + 1):
                rows.append(r)
                print(json.dumps(r), flush=True)
    return rows


def from_dir(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("*-r*-*.json")):
        _, rate, k = path.stem.split("-")
        rows += rows_of(json.loads(path.read_text()), float(rate[1:]), int(k))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    cols = [f"{k}_{q}" for k, q in KEYS]
    head = "| rate | stamp | run | " + " | ".join(c.replace("_ms_", " ") for c in cols) + " | other load, cores |"
    lines = [head, "|" + "---|" * (len(cols) + 4)]
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for r in sorted(rows, key=lambda r: (r["rate"], r["repeat"], r["mode"])):
        lines.append(f"| {r['rate']:g} | {r['mode']} | {r['repeat']} | " + " | ".join(fmt(r[c]) for c in cols)
                     + f" | {fmt(r['others_busy_cores'])} |")  # fmt: skip
    lines.append("")
    lines.append("| rate | stamp | runs | " + " | ".join("median " + c.replace("_ms_", " ") for c in cols) + " |")
    lines.append("|" + "---|" * (len(cols) + 3))
    for rate in sorted({r["rate"] for r in rows}):
        for mode in CHUNK_STAMPS:
            mine = [r for r in rows if r["rate"] == rate and r["mode"] == mode]
            if mine:
                meds = [statistics.median(r[c] for r in mine) for c in cols]
                lines.append(f"| {rate:g} | {mode} | {len(mine)} | " + " | ".join(fmt(m) for m in meds) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="20,80")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--from-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.from_dir:
        rows = from_dir(Path(args.from_dir))
    else:
        rows = run([float(r) for r in args.rates.split(",")], args.repeats, args.n, args.tokens)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
