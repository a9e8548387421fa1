"""Where a long run's p99 falls among the fitted model's own runs of the same length: a check of the model by the
long runs, and of the long runs by the model.

A p99 near its limit may rest on a few rare events (on the H200 without chunked prefill, two long prompts
prefilled in one step stall ~20 streams at once; a 4,000-request run sees two or three). One long run per rate is
then one draw of a lumpy figure: it can pass a rate whose long-run share over the limit exceeds the allowance, and
a bootstrap of it cannot invent the events it missed. This fits the step loop to a finished search (as
``slo_refit.py`` does), simulates ``--windows`` runs of each long run's length and rate with fresh arrivals and
requests, and prints, per rate and limit, the model's windows (median and 95% range), the long run's figure and
its rank among them, and the share of the model's windows that pass every limit. A figure outside the windows'
95% range contradicts the model; one inside says the run could have come from it, whatever its own verdict.

Run: ``python benchmarks/slo_window_odds.py SEARCH TRUTH.json [--config nochunk] [--run 8.6:4200:gap=149.3]
[--linear-at 6000]`` (``--run`` adds a long run kept elsewhere: rate, measured requests, and its p99s in ms;
``--linear-at`` also checks the model with its square prefill terms made flat at that prompt length).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slo_refit import Search, load_search

from tailgate.slo.servicefit import METRIC_OF_OUTCOME, fit_service
from tailgate.verify.groundtruth.engine import EngineModel, poisson_arrivals, quantile, simulate

WARMUP = 25


@dataclass
class LongRun:
    rate: float
    n: int
    p99: dict[str, float]
    """metric -> measured ms."""
    source: str


def long_runs(truth: dict[str, Any], config: str, extra: list[str]) -> list[LongRun]:
    out = []
    for r in truth.get("configs", {}).get(config, {}).get("rates", []):
        p99 = {m["key"].split("_p")[0]: float(m["point"]) for m in r["metrics"] if m.get("point") is not None}
        out.append(LongRun(float(r["rate"]), int(r["measured"]), p99, "truth.json"))
    for spec in extra:
        try:
            rate, n, figures = spec.split(":", 2)
            p99 = {k: float(v) for k, v in (f.split("=") for f in figures.split(","))}
            out.append(LongRun(float(rate), int(n), p99, "--run"))
        except ValueError:
            raise SystemExit(f"--run {spec!r}: expected RATE:N:METRIC=MS[,METRIC=MS]") from None
    return sorted(out, key=lambda r: r.rate)


def linear_at(engine: EngineModel, tokens: int) -> EngineModel:
    """The engine with its square prefill terms folded into a flat cost per token, their average over a prompt of
    ``tokens`` alone in its step: alike there, cheaper for larger steps. Probes that measured no step above
    ``tokens`` cannot tell the two apart, and a chunked server's p99 of worst gaps near its capacity is set by
    full-budget steps: the fitted square and this flat cost are the two ends of that extrapolation."""
    square = (engine.prefill_ms_per_token_ctx + engine.prefill_ms_per_token_step) * tokens / 2000.0
    return replace(engine, prefill_ms_per_token=engine.prefill_ms_per_token + square, prefill_ms_per_token_ctx=0.0,
                   prefill_ms_per_token_step=0.0)  # fmt: skip


def check_run(engine: EngineModel, search: Search, run: LongRun, count: int, seed: int) -> None:
    """Print where the long run falls among ``count`` simulated runs of its length and rate."""
    windows: dict[str, list[float]] = {m: [] for m in search.limits}
    passed = 0
    for k in range(count):
        lengths = search.workload.draw(k, run.n + WARMUP, seed + k)
        outs = simulate(engine, poisson_arrivals(run.rate, lengths, seed * 7919 + k))[WARMUP:]
        ok = True
        for m, limit in search.limits.items():
            value = quantile([getattr(o, METRIC_OF_OUTCOME[m]) for o in outs], search.q)
            windows[m].append(value)
            ok = ok and value <= limit
        passed += ok
    print(f"  {run.rate:g} req/s, {run.n} requests ({run.source}): {passed}/{count} of the model's runs "
          f"pass every limit")  # fmt: skip
    for m, values in windows.items():
        values.sort()
        lo, hi = values[int(0.025 * len(values))], values[max(0, int(0.975 * len(values)) - 1)]
        measured = run.p99.get(m)
        if measured is None:
            continue
        rank = sum(1 for v in values if v < measured) / len(values)
        inside = lo <= measured <= hi
        print(f"    {m} p{search.q * 100:g}: model's runs {statistics.median(values):.1f} ms [{lo:.1f}, {hi:.1f}]"
              f" (limit {search.limits[m]:g}); the long run {measured:.1f} ms, above {rank:.0%} of them: "
              f"{'could come from the model' if inside else 'CONTRADICTS the model'}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("search", type=Path, help="a finished tailgate slo folder (the model is fitted to its probes)")
    p.add_argument("truth", type=Path, help="truth.json of slo_truth_real.py read")
    p.add_argument("--config", default=None, help="the configuration to check (default: the search's first)")
    p.add_argument("--run", action="append", default=[], help="another long run, RATE:N:METRIC=MS[,METRIC=MS]")
    p.add_argument("--windows", type=int, default=40)
    p.add_argument("--seed", type=int, default=101)
    p.add_argument(
        "--linear-at",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also the model with its square prefill terms made flat at a prompt of TOKENS (linear_at)",
    )
    args = p.parse_args(argv)
    state_file = args.search / "slo.json"
    if not state_file.is_file() or not args.truth.is_file():
        p.error("give a tailgate slo results folder and a truth.json")
    state = json.loads(state_file.read_text())
    config = next((c for c in state["configs"] if args.config in (None, c["name"])), None)
    if config is None:
        p.error(f"no configuration {args.config!r} in {state_file}")
    search = load_search(args.search, config, state["plan"])
    if search is None:
        p.error("no model can be fitted to this search (no workload, or limits at different percentiles)")
    fit = fit_service(search.probes, search.q, list(search.limits), search.limits, search.chunks)
    if fit is None:
        p.error("too few streams to fit")
    print(f"{config['name']}: fitted engine {fit.engine}")
    runs = long_runs(json.loads(args.truth.read_text()), config["name"], args.run)
    if not runs:
        p.error(f"truth.json has no long run of {config['name']!r} and no --run was given")
    engines = [("the model", fit.engine)]
    if args.linear_at:
        engines.append((f"the model, linear at {args.linear_at} tokens", linear_at(fit.engine, args.linear_at)))
    for name, engine in engines:
        if len(engines) > 1:
            print(f"{name}:")
        for run in runs:
            check_run(engine, search, run, args.windows, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
