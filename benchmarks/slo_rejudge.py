"""A finished search's first confirmation probes, judged again by this tree's rules against the model they tested.

A confirmation rule is right when it refuses models that are off and keeps the ones that hold the truth; a real
search kept with its records, and a truth measured the same day, is a case whose answer is known. This refits the
model a search's confirmation probes tested (every probe run before the first of them, as the search had them)
and judges each of those probes as the search's confirmation does now, every window it matched printed, so a
change to the rule shows on real data beside its truth.

Run: ``python benchmarks/slo_rejudge.py RESULTS [--replicates 8] [--requests 40000]`` (the search kept in
``benchmarks/results/slo-truth-real/``: ``tar xzf benchmarks/results/slo-truth-real/cpu-search-2026-12-06-stop60.tar.gz
-C /tmp`` then ``python benchmarks/slo_rejudge.py /tmp/cpu-search-stop60``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.slo_refit import load_search, read_state
from tailgate.slo.confirm import ConfirmationRecord, Pooled, Side, confirmation_rates, judge, settle_confirmed
from tailgate.slo.replay import model_answer
from tailgate.slo.windowmatch import matches_at


def first_round(config: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The index of the first confirmation probe, and the confirmation probes run before the next search probe
    (one round: a refit's probes come after it)."""
    probes = sorted(config.get("probes", []), key=lambda p: int(p.get("index", 0)))
    start = next((k for k, p in enumerate(probes) if p.get("phase") == "confirm"), None)
    if start is None:
        return 0, []
    run = []
    for p in probes[start:]:
        if p.get("phase") != "confirm":
            break
        run.append(p)
    return int(probes[start]["index"]), run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--replicates", type=int, default=8)
    p.add_argument("--requests", type=int, default=40000, help="simulated requests per replicate (the final size)")
    args = p.parse_args(argv)
    state = read_state(p, args.results)
    plan = state["plan"]
    for config in state.get("configs", []):
        first, round_ = first_round(config)
        if not round_:
            print(f"{config['name']}: no confirmation probe")
            continue
        fitted_on = load_search(args.results, config, plan, before=first)
        tested = load_search(args.results, config, plan)
        if fitted_on is None or tested is None:
            print(f"{config['name']}: no model can be fitted")
            continue
        t0 = time.monotonic()
        before = [pr for pr in config.get("probes", []) if int(pr.get("index", 0)) < first]
        passed = [float(pr["rate"]) for pr in before if pr.get("verdict") == "pass"]
        failed = [float(pr["rate"]) for pr in before if pr.get("verdict") == "fail"]
        measured = (max(passed, default=None), min(failed, default=None))
        answer = model_answer(fitted_on.probes, fitted_on.limits, fitted_on.q, measured,
                              workload=fitted_on.workload, requests=args.requests // 4, replicates=args.replicates,
                              seed=fitted_on.seed, chunks=fitted_on.chunks)  # fmt: skip
        if answer.fit is None or answer.low is None or answer.high is None or not answer.capacity:
            print(f"{config['name']}: the refit gives no interval ({answer.why})")
            continue
        print(f"{config['name']}: fitted on the probes before #{first} ({time.monotonic() - t0:.0f} s): capacity "
              f"{answer.capacity:.3f} [{answer.low:.3f}, {answer.high:.3f}]")  # fmt: skip
        below, above = confirmation_rates(answer.low, answer.high)
        claimed = (answer.low / answer.capacity, answer.high / answer.capacity)
        by_rate = {pr.rate: pr for pr in tested.probes}
        record, windows = ConfirmationRecord(), []
        for entry in round_:
            rate = float(entry["rate"])
            probe = by_rate.get(rate)
            if probe is None:
                continue
            side: Side = "above" if rate > answer.high else "below"
            verdict = str(entry.get("verdict") or "not_enough_data")
            matches = matches_at(answer.fit.engine, [probe], fitted_on.q, list(fitted_on.limits), fitted_on.limits)
            c = judge(rate, side, verdict, matches, claimed)
            record.confirmations.append(c)
            windows.append(probe)
            passed += [rate] if verdict == "pass" else []
            failed += [rate] if verdict == "fail" else []
            print(f"  {rate:g} req/s ({side}; this refit would test {above:g} and {below:g}): measured "
                  f"{verdict.replace('_', ' ')}; {c.outcome.replace('_', ' ')}: {c.why}")  # fmt: skip
            for m in matches:
                print(f"    window: {m.text()} (its p99 rises {m.load_spread:.2f}x across the scan)")
        if len(windows) > 1:
            pooled = matches_at(answer.fit.engine, windows, fitted_on.q, list(fitted_on.limits), fitted_on.limits)
            record.pooled.append(Pooled(1, claimed, pooled))
            print(f"  both windows: {record.pooled[-1].text()}")
        settled = settle_confirmed(answer, record, (max(passed, default=None), min(failed, default=None)))
        said = f"[{settled.low:.3f}, {settled.high:.3f}]" if settled.usable else "the measured bracket"
        print(f"  the answer from this round: {said} ({settled.why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
