"""How often one probe's verdict is wrong, on a simulated server whose capacity is known.

A search's bracket is [highest pass, lowest fail]: it holds the truth only if no probe above the capacity
passed and none under it failed. Each verdict is an anytime-valid one-sided bound at the stated confidence, so
on any server a probe just over the capacity should pass at most 5% of the time (at 95%) — but the bound rests
on the design effect read from the probe's own blocks, and a queue that builds up rarely and clusters its
exceedances (FIFO slots near saturation, two long prompts prefilled in one step) can hide from a window of a few
hundred requests. This runs many probes, each a fresh sample of the workload, the arrivals and (for FIFO slots)
the servers' speeds, at rates around the truth of one shape of ``benchmarks/slo_coverage.py``, and prints the
share of each verdict: the wrong ones must stay under 1 - confidence, the right ones say how much a probe of
that length can decide.

    python benchmarks/verdict_odds.py --shape fifo4 --truth 2.177 --probes 1000 --n 500,750
    python benchmarks/verdict_odds.py --shape nochunk64 --truth 8.038 --probes 400 --fractions 0.9,1.02,1.05
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import slo_coverage as coverage

from tailgate import slo
from tailgate.verify.groundtruth.engine import EngineModel

VERDICTS = ("pass", "fail", "not_enough_data")


def shape_server(name: str) -> tuple[coverage.Server, str]:
    if name in coverage.FIFO_SHAPES:
        settings, text = coverage.FIFO_SHAPES[name]
        return coverage.FifoSlots(**settings), text
    if name in coverage.SHAPES:
        settings, text = coverage.SHAPES[name]
        return EngineModel(**settings), text
    known = ", ".join([*coverage.SHAPES, *coverage.FIFO_SHAPES])
    raise SystemExit(f"verdict_odds: unknown shape {name!r} (one of {known})")


def odds(server: coverage.Server, limits: tuple[slo.Limit, ...], rate: float, n: int, probes: int, warmup: int,
         confidence: float, first_seed: int) -> collections.Counter[str]:  # fmt: skip
    """Verdicts of ``probes`` independent probes of ``n`` measured requests at ``rate``."""
    counts: collections.Counter[str] = collections.Counter()
    for k in range(probes):
        seed = first_seed + 7919 * k
        attempt = coverage.simulated_probe(server, rate, seed=seed, duration=0, min_n=n, warmup=warmup)
        verdict, _ = slo.check_probe([attempt], limits, level=confidence, rate=rate, sequential=True)
        counts[verdict] += 1
    return counts


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    """Upper end of the Wilson 95% interval of a share: how high the wrong-verdict rate may really be."""
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True)
    parser.add_argument("--truth", type=float, required=True, help="the shape's true capacity, req/s")
    parser.add_argument("--fractions", default="0.85,0.95,0.98,1.006,1.02,1.05,1.1",
                        help="rates to probe, as fractions of the truth")  # fmt: skip
    parser.add_argument("--n", default="500,750", help="measured requests per probe (a search probe, a confirmation)")
    parser.add_argument("--probes", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=25)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=100_000)
    args = parser.parse_args(argv)
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
        sizes = [int(n) for n in args.n.split(",")]
    except ValueError:
        print("verdict_odds: --fractions and --n take comma-separated numbers", file=sys.stderr)
        return 2
    server, text = shape_server(args.shape)
    limits = slo.parse_slo(text)
    allowed = 1.0 - args.confidence
    print(f"# {args.shape}, SLO {text}, true capacity {args.truth:g} req/s; {args.probes} probes per cell, each a "
          f"fresh sample; verdicts at {args.confidence:.0%}, anytime-valid")  # fmt: skip
    print("| n | rate (x truth) | pass | fail | not enough data | wrong verdicts (95% upper) | within the allowance |")
    print("|---:|---|---:|---:|---:|---|---|")
    worst_ok = True
    started = time.monotonic()
    for n in sizes:
        for fraction in fractions:
            rate = round(args.truth * fraction, 4)
            counts = odds(server, limits, rate, n, args.probes, args.warmup, args.confidence, args.seed)
            wrong_kind = "pass" if fraction > 1 else "fail"
            wrong = counts[wrong_kind] if fraction != 1 else 0
            share = wrong / args.probes
            ok = share <= allowed
            worst_ok &= ok
            shares = " | ".join(f"{counts[v] / args.probes:.1%}" for v in VERDICTS)
            print(f"| {n} | {rate:g} ({fraction:g}x) | {shares} | {share:.1%} {wrong_kind} "
                  f"(<= {wilson_upper(wrong, args.probes):.1%}) | {'yes' if ok else 'NO'} |", flush=True)  # fmt: skip
    print(f"# {time.monotonic() - started:.0f} s; every wrong-verdict share within {allowed:.0%}: {worst_ok}")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main())
