"""How often the SLO capacity search's bracket holds the true capacity, and how wide it is.

The simulated engine (``tailgate/verify/groundtruth/engine.py``) has a known answer: its steady-state
p99s at a Poisson rate follow from its model by a long simulation, so its capacity under an SLO is known
to a fraction of a percent. This script:

1. computes that true capacity (bisection over long simulations with common random numbers);
2. runs the search of ``tailgate slo`` (:func:`tailgate.slo.search`, the verdicts of
   :func:`tailgate.slo.check_probe`) many times, once per seed, each probe a fresh simulated run of the
   seeded workload from an empty server lasting ``--duration`` seconds (at least ``--min-n`` requests);
3. prints coverage (the share of searches whose bracket [highest pass, lowest fail] holds the true
   capacity), the bracket's width relative to the capacity, and how often the answer was unresolved.

Targets: coverage at least the stated confidence; width within 15% of the capacity.

``--e2e`` also runs one real search end to end: the ground-truth server with the engine on, driven by
``tailgate slo --server url`` through Locust, and reports whether its bracket holds the truth computed for
that workload (the same engine settings and the trace file it replays).

Run: ``python benchmarks/slo_coverage.py [--seeds 100] [--chunked] [--e2e]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate import slo
from tailgate.load.workload import make_trace
from tailgate.verify.groundtruth import start_server_process
from tailgate.verify.groundtruth.engine import EngineModel, poisson_arrivals, simulate, true_capacity


def lengths_of(count: int, seed: int) -> list[tuple[int, int]]:
    return [(t.prompt_tokens, t.max_tokens) for t in make_trace(count, seed)]


def simulated_probe(
    model: EngineModel, rate: float, *, seed: int, duration: float, min_n: int, warmup: int
) -> dict[str, Any]:
    """One probe as ``tailgate slo`` runs it, in virtual time: an attempt's data for the verdict."""
    n = max(min_n, math.ceil(rate * duration))
    arrivals = poisson_arrivals(rate, lengths_of(n + warmup, seed), seed + 1)
    outs = simulate(model, arrivals)
    recs = [
        {
            "intended_s": o.arrival_ns / 1e9,
            "end_s": o.arrival_ns / 1e9 + o.total_ms / 1e3,
            "ttft_from_intended_ms": o.ttft_ms,
            "worst_gap_ms": o.worst_gap_ms,
            "total_from_intended_ms": o.total_ms,
        }
        for o in outs
    ]
    measured = sorted(recs, key=lambda r: r["end_s"])[warmup:]  # the completion-order warm-up rule
    return {"measured": measured, "sent": len(recs), "errors": 0, "stopped_early": None}


probe_seconds = [0.0]
"""Seconds of arrivals every search so far would have taken on a real server."""


def one_search(
    model: EngineModel, limits: Sequence[slo.Limit], seed: int, args: argparse.Namespace
) -> slo.SearchOutcome:
    looks = 1 + args.extend
    level = 1.0 - (1.0 - args.confidence) / looks  # as ``tailgate slo`` shares its error across the looks

    def probe(rate: float, phase: str) -> str:
        # A re-run of the same workload on this deterministic engine would repeat itself exactly (and the
        # verdicts cluster it as such); the extensions draw new samples of the workload, as the command does.
        attempts: list[dict[str, Any]] = []
        verdict = "not_enough_data"
        for k in range(looks):
            s = seed + 1000 * k
            attempt = simulated_probe(model, rate, seed=s, duration=args.duration, min_n=args.min_n,
                                      warmup=args.warmup)  # fmt: skip
            attempts.append({**attempt, "workload": s})
            probe_seconds[0] += attempt["sent"] / rate
            verdict = slo.check_probe(attempts, limits, level=level, rate=rate)[0]
            if verdict != "not_enough_data":
                break
        return verdict

    return slo.search(probe, start=args.start, max_rate=args.max_rate, min_rate=args.start / 8,
                      resolution=slo.Resolution.parse(args.resolution), max_probes=args.max_probes)  # fmt: skip


def holds(out: slo.SearchOutcome, capacity: float) -> bool:
    lo = out.best if out.best is not None else 0.0
    hi = out.first_fail if out.first_fail is not None else math.inf
    return lo <= capacity < hi


def slowed(model: EngineModel, factor: float) -> EngineModel:
    """The same engine with every duration ``factor`` times longer: its capacity is the original's / factor
    at every latency limit times factor (the model is linear in time), so the truth carries over exactly."""
    return replace(model, step_ms=model.step_ms * factor, step_ms_per_seq=model.step_ms_per_seq * factor,
                   prefill_ms_per_token=model.prefill_ms_per_token * factor)  # fmt: skip


def e2e(model: EngineModel, limits_text: str, args: argparse.Namespace) -> dict[str, Any]:
    """One real search through Locust against the ground-truth server with the engine on."""
    out = Path(tempfile.mkdtemp(prefix="slo-e2e-"))
    with start_server_process(engine=model.describe()) as server:
        cmd = [
            sys.executable, "-m", "tailgate.cli", "slo", "--server", "url", "--host", server.base_url,
            "--config", "engine", "--slo", limits_text, "--results", str(out / "slo"), "--no-report",
            "--start-rate", f"{args.start:g}", "--max-rate", f"{args.max_rate:g}", "--resolution", args.resolution,
            "--duration", f"{args.e2e_duration:g}", "--n", str(args.e2e_min_n), "--warmup", str(args.warmup),
            "--seed", str(args.e2e_seed), "--max-probes", str(args.max_probes), "--reruns", "0",
            "--extend", str(args.extend), "--confidence", f"{args.confidence:g}",
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        seconds = time.monotonic() - t0
    state = json.loads((out / "slo" / "slo.json").read_text())
    result = state["configs"][0].get("result") or {}
    return {
        "exit": proc.returncode, "seconds": round(seconds), "best": result.get("best_rate"),
        "first_fail": result.get("first_fail_rate"), "status": result.get("status"),
        "probes": [(p["rate"], p["verdict"]) for p in state["configs"][0]["probes"]], "folder": str(out),
        "tail": proc.stdout.splitlines()[-12:],
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--first-seed", type=int, default=1000)
    p.add_argument("--slo", default="ttft_p99<=1000ms")
    p.add_argument("--chunked", action="store_true", help="the engine's chunked prefill on")
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--step-ms-per-seq", type=float, default=0.1)
    p.add_argument("--prefill-ms-per-token", type=float, default=0.01)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of arrivals per probe")
    p.add_argument("--min-n", type=int, default=300, help="measured requests per probe at least")
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--start", type=float, default=2.0)
    p.add_argument("--max-rate", type=float, default=64.0)
    p.add_argument("--resolution", default="10%")
    p.add_argument("--max-probes", type=int, default=10)
    p.add_argument("--extend", type=int, default=1, help="extensions of an undecided probe (tailgate slo --extend)")
    p.add_argument("--truth-requests", type=int, default=40000)
    p.add_argument("--truth", type=float, default=0.0, help="the true capacity, when computed before (req/s)")
    p.add_argument("--e2e", action="store_true", help="also one real search through Locust")
    p.add_argument("--e2e-duration", type=float, default=75.0)
    p.add_argument(
        "--e2e-slowdown",
        type=float,
        default=4.0,
        help="the end-to-end engine runs this many times slower (capacity / this), to suit one machine",
    )
    p.add_argument("--e2e-only", action="store_true", help="skip the many-seed part")
    p.add_argument("--e2e-min-n", type=int, default=300)
    p.add_argument("--e2e-seed", type=int, default=7)
    args = p.parse_args(argv)

    model = EngineModel(slots=args.slots, step_ms=args.step_ms, step_ms_per_seq=args.step_ms_per_seq,
                        prefill_ms_per_token=args.prefill_ms_per_token, chunked=args.chunked)  # fmt: skip
    limits = slo.parse_slo(args.slo)
    limit_ms = {lim.metric: lim.limit for lim in limits if lim.metric != "errors"}
    qs = {lim.p for lim in limits if lim.p is not None}
    assert len(qs) == 1, "one percentile for every limit (the truth is computed at one quantile)"
    q = qs.pop() / 100.0
    t0 = time.monotonic()
    if args.truth:
        capacity = args.truth
    else:
        capacity = true_capacity(model, limit_ms, lengths_of(args.truth_requests, 99), q=q, tolerance=0.002)
    print(f"engine {model.describe()}")
    print(f"SLO {args.slo}: true capacity {capacity:.3f} req/s "
          f"({args.truth_requests} simulated requests per rate; {time.monotonic() - t0:.0f} s)")  # fmt: skip
    if args.e2e_only:
        args.seeds = 0
    rng = random.Random(args.first_seed)
    covered = 0
    widths: list[float] = []
    unresolved = 0
    statuses: dict[str, int] = {}
    t0 = time.monotonic()
    for _ in range(args.seeds):
        seed = rng.randrange(1, 2**31)
        out = one_search(model, limits, seed, args)
        ok = holds(out, capacity)
        covered += ok
        statuses[out.status] = statuses.get(out.status, 0) + 1
        if out.best is not None and out.first_fail is not None:
            widths.append((out.first_fail - out.best) / capacity)
        else:
            unresolved += 1
        print(
            f"  search {sum(statuses.values())}/{args.seeds}: [{out.best}, {out.first_fail}] "
            f"{'holds' if ok else 'MISSES'}",
            flush=True,
        )
        if not ok:
            print(f"  seed {seed}: bracket [{out.best}, {out.first_fail}] misses {capacity:.3f}; "
                  f"steps {[(s.rate, s.verdict) for s in out.steps]}")  # fmt: skip
    widths.sort()
    med = widths[len(widths) // 2] if widths else math.nan
    p90 = widths[min(len(widths) - 1, int(0.9 * len(widths)))] if widths else math.nan
    if args.seeds:
        print(f"{args.seeds} searches ({time.monotonic() - t0:.0f} s): coverage {covered / args.seeds:.1%} "
              f"(target >= {args.confidence:.0%}); bracket width / capacity: median {med:.1%}, 90th pct "
              f"{p90:.1%} (target <= 15%); no closed bracket in {unresolved}; statuses {statuses}; "
              f"probing time per search {probe_seconds[0] / args.seeds / 60:.0f} min")  # fmt: skip
    print(f"probe: {args.duration:g} s of Poisson arrivals, at least {args.min_n} measured (+{args.warmup} warm-up); "
          f"resolution {args.resolution}; {args.extend} extension(s) of an undecided probe")  # fmt: skip
    if args.e2e:
        f = args.e2e_slowdown
        e2e_model = slowed(model, f)
        e2e_slo = ",".join(f"{lim.key}<={lim.limit * f:g}ms" for lim in limits if lim.metric != "errors")
        e2e_capacity = capacity / f
        r = e2e(e2e_model, e2e_slo, args)
        ok = holds(slo.SearchOutcome(r["best"], r["first_fail"], r["status"]), e2e_capacity)
        print(f"end to end (Locust -> ground-truth server, engine {f:g}x slower, SLO {e2e_slo}, true capacity "
              f"{e2e_capacity:.3f} req/s, seed {args.e2e_seed}): exit {r['exit']}, {r['seconds']} s, bracket "
              f"[{r['best']}, {r['first_fail']}] ({r['status']}), holds the truth: {ok}; probes {r['probes']}; "
              f"results in {r['folder']}")  # fmt: skip
        for line in r["tail"]:
            print("   ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
