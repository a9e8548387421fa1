"""Would the fitted probes' own windows, matched in capacity terms, tell a model that misses from one that holds?

The replay check compares each probe's p99 with the model's on the same requests, inside the probe's
distribution-free interval. Where the p99 crosses its limit slowly with the rate (a chunked GPU engine's TTFT),
a model 7-12% low on every p99 passes that check yet puts its capacity 26% too high (the lent H100's refit of
2026-12-07, ``h100-chunked-stop67``). Window matching (:mod:`tailgate.slo.windowmatch`) states the same
disagreement as a capacity ratio, the unit the answer is in. This script matches every fitted probe of every kept
real search against its own fitted engine and counts the windows whose ratio interval lies wholly under, or wholly
over, the least claim a model makes (``1 -+ FLOOR``), beside whether the scored answer held
(``results/slo-coverage-real.json``). A rule built on those counts is worth having only if it separates the
misses from the answers that held.

Run: ``python benchmarks/slo_insample_windows.py [--only NAME,...] [--engine H100|H200|CPU] [--json out.json]``
(the fit alone, no simulation: 5-60 s per search on two cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.slo_coverage_real import catalogued, kind, selected  # noqa: E402
from benchmarks.slo_refit import load_search  # noqa: E402
from tailgate.slo.replay import FLOOR  # noqa: E402
from tailgate.slo.servicefit import fit_service  # noqa: E402
from tailgate.slo.windowmatch import WindowMatch, matches_at  # noqa: E402

SCORED = ROOT / "benchmarks" / "results" / "slo-coverage-real.json"


def side(m: WindowMatch) -> str:
    """``under`` / ``over``: the window's ratio lies wholly outside the least claim; ``-``: it does not."""
    if m.high < 1.0 - FLOOR:
        return "under"
    if m.low > 1.0 + FLOOR:
        return "over"
    return "-"


def windows_of(entry: dict[str, Any], scratch: Path) -> dict[str, Any] | str:
    found = catalogued(entry, scratch)
    if isinstance(found, str):
        return found
    folder, state, config = found
    search = load_search(folder, config, state["plan"])
    if search is None:
        return "no fittable configuration"
    fit = fit_service(search.probes, search.q, list(search.limits), search.limits, search.chunks)
    if fit is None:
        return "no fit"
    rows = []
    for probe in sorted(search.probes, key=lambda p: p.rate):
        for m in matches_at(fit.engine, [probe], search.q, list(search.limits), search.limits):
            rows.append({"rate": probe.rate, "side": side(m), **m.to_json()})
    under, over = sum(r["side"] == "under" for r in rows), sum(r["side"] == "over" for r in rows)
    return {"name": entry["name"], "engine": kind(entry["engine"]), "windows": rows, "under": under, "over": over}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated search names from the catalogue")
    p.add_argument("--engine", default="", help="H100, H200 or CPU: that engine's searches only")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    scored = {row["name"]: row for row in json.loads(SCORED.read_text())} if SCORED.is_file() else {}
    entries = [e for e in selected(p, args.only, args.engine) if e["name"] in scored]
    out = []
    print("| search | answer (scored) | windows | wholly under 0.96 | wholly over 1.04 | those windows |")
    print("|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="insample-") as scratch:
        for e in entries:
            t0 = time.monotonic()
            got = windows_of(e, Path(scratch))
            row = scored[e["name"]]
            verdict = ("holds" if row["holds"] else "MISSES") + ("" if row["closed"] else ", open")
            answer = f"{row['source']}, {verdict}"
            if isinstance(got, str):
                print(f"| {e['name']} | {answer} | skipped: {got} | | | |", flush=True)
                continue
            got.update(answer=answer, seconds=round(time.monotonic() - t0, 1))
            out.append(got)
            off = "; ".join(f"{w['rate']:g} {w['metric']} {w['ratio']:.3f} [{w['interval'][0]:.3f}, "
                            f"{w['interval'][1]:.3f}]" for w in got["windows"] if w["side"] != "-")  # fmt: skip
            print(f"| {e['name']} | {answer} | {len(got['windows'])} | {got['under']} | {got['over']} | {off} |",
                  flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
