"""Can a confirmation probe fail a model that is 10% off, and does it leave a right one standing? The window rule
(:mod:`tailgate.slo.windowmatch`) and the judgement (:func:`tailgate.slo.confirm.judge`) against engines whose
answer is known.

For a step-loop shape of ``benchmarks/slo_coverage.py`` (the engine is the truth) and each ``--factors`` value f,
the model is the same engine with every cost f times longer: f = 1 is a right model, 1.1 one whose capacity is
~10% low, 1/1.1 one ~10% high. Both capacities come from long pooled simulations (cached beside the coverage
truths), so the true ratio (true capacity / model's) each window should find is known. Each trial runs two
confirmation windows on the true engine, each a fresh sample of the mix at the rate the search would choose for a
model claiming +-``--claim`` around its capacity (``confirmation_rates``: 3% outside the claim), of
``--length`` measured requests (default 1.5 times the coverage benchmark's search probe at the true capacity), and
judges them as the search does: each window alone, then both pooled. Per factor it prints how often the trial
**contradicts** the model, how often the model **stands** (the pooled windows bound it, or both verdicts came out
as the model says), how often a bounding window's interval holds the true ratio, and how often a standing
answer's interval (the hull of the claim and what the windows allow) holds the true capacity.

Run: ``python benchmarks/confirm_power.py --shape slots8 [--factors 1,1.05,1.1,0.952,0.909] [--trials 20]
[--length N] [--claim 0.04]`` (a few seconds of two cores per trial; each new factor's capacity takes 1-2 minutes
once).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.slo_coverage import SHAPES, pooled_truth, simulated_probe, slowed
from tailgate import slo
from tailgate.slo.confirm import ConfirmationRecord, Pooled, Side, confirmation_rates, judge
from tailgate.slo.servicefit import Probe, probes_of
from tailgate.slo.windowmatch import WindowMatch, matches_at
from tailgate.verify.groundtruth.engine import EngineModel

WARMUP = 25
TRUTH_REQUESTS, TRUTH_REPLICATES = 100_000, 4
"""As ``slo_coverage.py`` computes its truths, so that the cached ones are shared."""


@dataclass(frozen=True)
class Trial:
    contradicted: bool
    stands: bool
    windows: tuple[tuple[bool, bool], ...]
    """Per window and metric: (bounds the ratio, its interval holds the true ratio)."""
    pooled_holds: bool | None
    """The pooled windows' span holds the true ratio (None: it bounds nothing)."""
    answer_holds: bool | None
    """A standing answer's interval holds the true capacity (None: it does not stand)."""


def window(engine: EngineModel, slo_text: str, rate: float, seed: int, n: int) -> tuple[str, Probe]:
    attempt = simulated_probe(engine, rate, seed=seed, duration=0.0, min_n=n, warmup=WARMUP)
    verdict, checks = slo.check_probe([attempt], slo.parse_slo(slo_text), rate=rate)
    return verdict, probes_of({rate: [attempt]}, {rate: list(checks)})[0]


SLACK = 0.003
"""How near an interval's end the true ratio counts as held: each capacity is bisected to 0.2%."""


def _covers(m: WindowMatch, ratio: float) -> bool:
    return (m.open_low or m.low <= ratio * (1 + SLACK)) and (m.open_high or ratio * (1 - SLACK) <= m.high)


def trial(job: tuple[EngineModel, EngineModel, str, float, float, float, int, int]) -> Trial:
    """Two confirmation windows of ``model`` (capacity ``model_cap``) on ``truth`` (capacity ``true_cap``)."""
    truth, model, slo_text, true_cap, model_cap, claim, n, seed = job
    limits = {lim.metric: lim.limit for lim in slo.parse_slo(slo_text) if lim.metric != "errors"}
    low, high = model_cap * (1 - claim), model_cap * (1 + claim)
    below, above = confirmation_rates(low, high)
    ratio = true_cap / model_cap
    record, probes, windows = ConfirmationRecord(), [], []
    sides: tuple[tuple[float, Side], ...] = ((above, "above"), (below, "below"))
    for k, (rate, side) in enumerate(sides):
        verdict, probe = window(truth, slo_text, rate, seed + 7919 * k, n)
        matches = matches_at(model, [probe], 0.99, list(limits), limits)
        record.confirmations.append(judge(rate, side, verdict, matches, (1 - claim, 1 + claim)))
        windows += [(not (m.open_low and m.open_high), _covers(m, ratio)) for m in matches]
        probes.append(probe)
    pooled = matches_at(model, probes, 0.99, list(limits), limits)
    record.pooled.append(Pooled(1, (1 - claim, 1 + claim), pooled))
    span = record.pooled[-1].span
    answer_holds = None
    if record.stands:
        lo, hi = low, high
        if span is not None:
            lo, hi = min(lo, model_cap * span[0]), max(hi, model_cap * span[1])
        answer_holds = lo <= true_cap * (1 + SLACK) and true_cap * (1 - SLACK) <= hi
    pooled_holds = None if span is None else span[0] <= ratio * (1 + SLACK) and ratio * (1 - SLACK) <= span[1]
    return Trial(bool(record.contradicted), record.stands, tuple(windows), pooled_holds, answer_holds)


def _share(values: Sequence[bool]) -> str:
    return f"{sum(values)}/{len(values)}" if values else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steploop = [name for name, (settings, _) in SHAPES.items() if "ms_per_token" not in settings]
    p.add_argument("--shape", default="slots8", choices=steploop)
    p.add_argument("--factors", default="1,1.05,1.1,0.952,0.909", help="comma-separated cost factors of the model")
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--length", type=int, default=0, help="measured requests per window (0: 1.5 x a search probe)")
    p.add_argument("--claim", type=float, default=0.04, help="the model's claimed half-width, relative")
    p.add_argument("--first-seed", type=int, default=500)
    args = p.parse_args(argv)
    settings, slo_text = SHAPES[args.shape]
    truth = EngineModel(**settings)
    limits = {lim.metric: lim.limit for lim in slo.parse_slo(slo_text) if lim.metric != "errors"}
    true_cap = pooled_truth(truth, limits, 0.99, TRUTH_REQUESTS, TRUTH_REPLICATES)
    n = args.length or math.ceil(1.5 * max(500, 120 * true_cap))
    print(f"# python benchmarks/confirm_power.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"{args.shape}: {slo_text}, true capacity {true_cap:.3f} req/s; windows of {n} measured requests; "
          f"claim +-{args.claim:.0%}; {args.trials} trials per factor\n")  # fmt: skip
    print(
        "| model costs x | model capacity | true / model's | contradicted | stands | window bounds | "
        "bounding window holds the ratio | pooled span holds it | standing answer holds the truth |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with multiprocessing.get_context("fork").Pool() as pool:
        for factor in (float(f) for f in args.factors.split(",")):
            model = slowed(truth, factor)
            model_cap = pooled_truth(model, limits, 0.99, TRUTH_REQUESTS, TRUTH_REPLICATES)
            jobs = [(truth, model, slo_text, true_cap, model_cap, args.claim, n, args.first_seed + 104729 * t)
                    for t in range(args.trials)]  # fmt: skip
            trials = pool.map(trial, jobs)
            bounds = [b for t in trials for b, _ in t.windows]
            holds = [c for t in trials for b, c in t.windows if b]
            pooled = [t.pooled_holds for t in trials if t.pooled_holds is not None]
            answers = [t.answer_holds for t in trials if t.answer_holds is not None]
            said = [_share([t.contradicted for t in trials]), _share([t.stands for t in trials]), _share(bounds),
                    _share(holds), _share(pooled), _share(answers)]  # fmt: skip
            print(f"| {factor:g} | {model_cap:.3f} | {true_cap / model_cap:.3f} | {' | '.join(said)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
