"""Long-run truth of a real server's capacity under an SLO: one long probe per rate, read with fixed-n bounds.

A simulated engine's truth follows from its model; a real engine's can only be measured. At each rate this runs
one ``tailgate slo`` probe of at least ``--n`` measured requests (4,000 by default: enough that a p99 rests on
~40 requests over it, so a run-to-run spread of a few percent) on a workload seed the searches do not use, and
reads it three ways:

- the point p99 of each limited metric over the steady part of the probe;
- a time-block bootstrap 95% interval of that p99 (blocks of ``--block-s`` seconds of arrivals resampled whole, so
  one engine stall that hits many streams moves a whole block, not single requests);
- the suite's own fixed-n verdict at 95% (distribution-free bounds with the design effect over 20 time blocks),
  which says "not enough data" where the rate sits too close to the limit for this n.

- the share of requests over each limit counted in events (a stall or a queue episode that put many streams over
  at once counts once), with a Poisson 95% bound on the event count: a p99 near its limit may rest on two or three
  rare events (two long prompts prefilled in one step), which a run of 4,000 requests sees or misses by chance and
  a bootstrap cannot invent when it missed them.

The truth's verdict at a rate: it passes when every limited p99's bootstrap interval lies under its limit and the
events' bound keeps the share over it within the allowance, fails when an interval lies over its limit, the
events' lower bound exceeds the allowance, or the run was stopped for a queue without bound, and is undecided
otherwise. The
suite's fixed-n rule is stricter (a queue that builds for a minute makes its 20 blocks few and lumpy: on the CPU
vLLM at 5 req/s its design effect reached 51, an effective n of 78 out of 4,000) and is printed beside it. The
capacity lies between the highest rate that passes and the lowest that fails; both sides are needed for a claim.
``truth.json`` keeps every rate's figures and the bracket, and ``score`` holds finished searches to it.

    # the CPU vLLM of this machine, started and stopped by tailgate slo (a quiet machine: ~15 min per rate)
    python benchmarks/slo_truth_real.py run --embedded --slo "ttft_p99<=4s,gap_p99<=2s" --rates 3,4 \\
        --out benchmarks/results/slo-truth-cpu
    # a server already running (the H200: benchmarks/h200/truth.sh)
    python benchmarks/slo_truth_real.py run --host http://127.0.0.1:8000 --config nochunk --ignore-eos \\
        --slo "ttft_p99<=300ms,gap_p99<=200ms" --rates 10 --out /tmp/w/truth-nochunk
    # a rate whose requests outlast one call, in parts (own folder and workload seed each), read as one truth
    python benchmarks/slo_truth_real.py run --host http://127.0.0.1:8000 ... --rates 7 --n 2000 --part 1 --out OUT
    # read any folders run made (no request sent), merge their rates (the parts of one rate pooled)
    python benchmarks/slo_truth_real.py read OUT [OUT ...] --json truth.json
    # score finished searches against it: does each answer's interval hold the truth, how wide, how long
    python benchmarks/slo_truth_real.py score truth.json SEARCH [SEARCH ...] [--config-as nochunk]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slo_reread import probe_attempts

from tailgate import slo
from tailgate.records import RequestRecord
from tailgate.slo.plan import SloPlan
from tailgate.slo.probe import SloRunner
from tailgate.slo.spec import Limit
from tailgate.slo.verdict import METRIC_FIELDS, steady_part

TRUTH_SEED = 11
"""Not the searches' seed (7): the truth must not be the sample the search measured."""


@dataclass(frozen=True)
class MetricTruth:
    key: str
    limit: float
    point: float | None
    bootstrap_low: float | None
    bootstrap_high: float | None
    verdict: str
    """The suite's fixed-n verdict at 95% on this check alone."""
    n: int
    n_effective: float | None
    over: int = 0
    """Requests over the limit."""
    events: int = 0
    """Distinct events they came in (:data:`EVENT_GAP_S` apart or more)."""
    share_low: float | None = None
    share_high: float | None = None
    """95% bounds of the long-run share over the limit from the event count (Poisson) and the events' sizes."""


EVENT_GAP_S = 1.0
"""Over-limit moments closer than this are one event (one step's stall hits its streams within milliseconds; a
queue episode delays its requests' first tokens back to back)."""
WHEN = {"gap": "worst_gap_end_s", "ttft": "first_chunk_s", "total": "end_s"}
"""When a request's limited figure went over: the moment one event's victims share."""


def poisson_bounds(k: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) two-sided bounds of a Poisson mean with ``k`` observed, by bisection on its tails."""

    def cdf(k_: int, mu: float) -> float:
        term = total = math.exp(-mu)
        for i in range(1, k_ + 1):
            term *= mu / i
            total += term
        return total

    alpha = (1.0 - level) / 2.0

    def solve(f: Any, lo: float, hi: float) -> float:
        for _ in range(100):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2.0

    low = 0.0 if k == 0 else solve(lambda mu: 1.0 - cdf(k - 1, mu) < alpha, 0.0, k + 10.0)
    high = solve(lambda mu: cdf(k, mu) > alpha, 0.0, 3.0 * k + 20.0)
    return low, high


def event_share(records: Sequence[RequestRecord], metric: str, limit: float, n: int) -> tuple[int, int, float, float]:
    """(over, events, share low, share high): the requests over ``limit``, the events they came in, and the 95%
    bounds of the share over it when events are a Poisson count and each hits as many requests as the largest
    seen. With none seen the high bound is for events that hit as many requests as were in flight on average (what
    one stall of every stream would do): reported, not used, since a run cannot bound a kind of event it never
    saw; the fitted model's windows speak to that (``odds``)."""
    fld = METRIC_FIELDS[metric]
    when = WHEN[metric]
    moments = sorted(at for r in records if (v := getattr(r, fld)) is not None and v > limit
                     and (at := getattr(r, when)) is not None)  # fmt: skip
    sizes: list[int] = []
    last = None
    for t in moments:
        if last is None or t - last >= EVENT_GAP_S:
            sizes.append(0)
        sizes[-1] += 1
        last = t
    spans = [(r.intended_s, r.end_s) for r in records if r.end_s is not None]
    in_flight = 1.0
    if spans:
        wall = max(e for _, e in spans) - min(t for t, _ in spans)
        in_flight = max(1.0, sum(e - t for t, e in spans) / wall) if wall > 0 else 1.0
    low, high = poisson_bounds(len(sizes))
    biggest = max(sizes) if sizes else in_flight
    mean = len(moments) / len(sizes) if sizes else in_flight
    return len(moments), len(sizes), low * mean / max(1, n), high * biggest / max(1, n)


@dataclass(frozen=True)
class RateTruth:
    config: str
    rate: float
    sent: int
    measured: int
    errors: int
    duration_s: float
    verdict: str
    """The suite's own fixed-n verdict on the whole probe."""
    metrics: list[MetricTruth]
    folder: str
    truth: str = "undecided"
    """The bootstrap's verdict (pass, fail, undecided): what the bracket is built from."""
    stopped: bool = False
    """The probe was stopped early because its waiting queue ran away (a fail however few it measured)."""


def _p99(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def block_bootstrap(
    rows: Sequence[tuple[float, float]], q: float, block_s: float, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | tuple[None, None]:
    """95% percentile interval of the q-quantile, resampling whole blocks of arrival time.

    ``rows``: (intended send in s, value). Blocks keep what one stall did to many streams together."""
    if len(rows) < 50:
        return None, None
    t0 = min(t for t, _ in rows)
    blocks: dict[int, list[float]] = {}
    for t, v in rows:
        blocks.setdefault(int((t - t0) // block_s), []).append(v)
    groups = list(blocks.values())
    if len(groups) < 5:
        return None, None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        sample: list[float] = []
        for _ in groups:
            sample += groups[rng.randrange(len(groups))]
        stats.append(_p99(sample, q))
    stats.sort()
    return stats[int(0.025 * resamples)], stats[int(0.975 * resamples) - 1]


def read_truth(roots: Sequence[Path], block_s: float) -> list[RateTruth]:
    """Every probe of the ``tailgate slo`` folders, read as truth (fixed-n bounds, block bootstrap). Probes of one
    configuration at one rate in several folders (the parts of ``run --part``, each on its own workload seed) are
    one truth: their attempts pooled, their time blocks resampled together, their events counted together."""
    parts: dict[tuple[str, float], list[tuple[Path, list[slo.ProbeAttempt]]]] = {}
    limits: tuple[Limit, ...] = ()
    for root in roots:
        state = json.loads((root / slo.SLO_FILE).read_text())
        limits = slo.parse_slo(state["plan"]["slo"])
        plan = SloPlan(limits=limits, configs=[], n=state["plan"]["n"], warmup=state["plan"]["warmup"])
        reader = SloRunner(plan, None, root, log=lambda _line: None)
        for c in state["configs"]:
            for pr in c["probes"]:
                parts.setdefault((c["name"], float(pr["rate"])), []).append((root, probe_attempts(reader, root, pr)))
    out: list[RateTruth] = []
    for (config, rate), found in sorted(parts.items()):
        attempts = [a for _, part in found for a in part]
        verdict, checks = slo.check_probe(attempts, limits, level=0.95, rate=rate, sequential=False)
        steady = [r for a in attempts for r in steady_part(a)[0]]
        metrics = []
        by_key = {ch.key: ch for ch in checks}
        for lim in limits:
            ch = by_key.get(lim.key)
            if lim.p is None or ch is None:
                continue
            fld = METRIC_FIELDS[lim.metric]
            rows = [(r.intended_s, v) for r in steady if (v := getattr(r, fld)) is not None
                    and not (lim.metric == "gap" and r.client_coalesced)]  # fmt: skip
            lo, hi = block_bootstrap(rows, lim.p / 100.0, block_s)
            point = _p99([v for _, v in rows], lim.p / 100.0) if rows else None
            over, events, share_lo, share_hi = event_share(steady, lim.metric, lim.limit, len(rows))
            metrics.append(MetricTruth(lim.key, lim.limit, _r(point), _r(lo), _r(hi), ch.verdict, ch.n,
                                       ch.n_effective, over, events, round(share_lo, 5),
                                       round(share_hi, 5)))  # fmt: skip
        durations = []
        for _, part in found:
            sends = [r.intended_s for a in part for r in a.measured]
            durations.append(max(sends) - min(sends) if sends else 0.0)
        stopped = any(a.stopped_early for a in attempts)
        out.append(RateTruth(
            config=config, rate=rate, sent=sum(a.sent for a in attempts),
            measured=sum(len(a.measured) for a in attempts), errors=sum(a.errors for a in attempts),
            duration_s=round(sum(durations), 1), verdict=verdict, metrics=metrics,
            folder=", ".join(str(root) for root, _ in found),
            truth=bootstrap_verdict(metrics, stopped, max(lim.p or 99.0 for lim in limits) / 100),
            stopped=stopped,
        ))  # fmt: skip
    return out


def bootstrap_verdict(metrics: Sequence[MetricTruth], stopped: bool, q: float = 0.99) -> str:
    """Pass, fail or undecided from the bootstrap intervals and the events' bounds on the share over each limit."""
    allowance = 1.0 - q
    if stopped or any(m.bootstrap_low is not None and m.bootstrap_low > m.limit for m in metrics):
        return "fail"
    if any(m.share_low is not None and m.share_low > allowance for m in metrics):
        return "fail"
    if metrics and all(
        m.bootstrap_high is not None
        and m.bootstrap_high <= m.limit
        and (m.events == 0 or (m.share_high or 0.0) <= allowance)
        for m in metrics
    ):
        return "pass"
    return "undecided"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def bracket(rates: Sequence[RateTruth], min_n: int) -> dict[str, Any]:
    """The highest passing and the lowest failing rate among the long runs; a claim needs both. A run stopped
    because its queue ran away counts as long: the server fell hundreds of requests behind and would only fall
    further (at 9 req/s the CPU vLLM's TTFT p99 reached 92 s after 2,162 sends), so running it to 4,000 only
    measures the queue."""
    long = [r for r in rates if r.measured >= min_n or (r.stopped and r.truth == "fail")]
    passed = [r.rate for r in long if r.truth == "pass"]
    failed = [r.rate for r in long if r.truth == "fail"]
    low = max(passed) if passed else None
    high = min(failed) if failed else None
    if low is not None and high is not None and low >= high:
        return {"low": low, "high": high, "claim": "contradictory: a rate passed above one that failed"}
    claim = "both sides measured" if low is not None and high is not None else "one side only: no claim"
    return {"low": low, "high": high, "claim": claim, "min_n": min_n}


def print_table(rates: Sequence[RateTruth]) -> None:
    print(
        "| configuration | rate | measured (sent) | arrivals s | check | p99 | block bootstrap 95% | over (events) "
        "| share over, events' 95% | fixed-n 95% | n eff | suite's verdict | truth |"
    )
    print("|---|---:|---:|---:|---|---:|---|---:|---|---|---:|---|---|")
    for r in rates:
        for m in r.metrics:
            boot = f"[{m.bootstrap_low}, {m.bootstrap_high}]" if m.bootstrap_low is not None else "n/a"
            eff = f"{m.n_effective:.0f}" if m.n_effective is not None else "n/a"
            share = f"[{m.share_low:.2%}, {m.share_high:.2%}]" if m.share_high is not None else "n/a"
            print(
                f"| {r.config} | {r.rate:g} | {r.measured} ({r.sent}) | {r.duration_s:.0f} | {m.key} <= {m.limit:g} "
                f"| {m.point} | {boot} | {m.over} ({m.events}) | {share} | {m.verdict} | {eff} | {r.verdict} "
                f"| {r.truth} |"
            )


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for rate in args.rates:
        folder = out / (f"r{rate:g}".replace(".", "p") + (f"-part{args.part}" if args.part else ""))
        if (folder / slo.SLO_FILE).exists() and any(read_truth([folder], args.block_s)):
            print(f"[truth] {rate:g} req/s: already in {folder}", flush=True)
            continue
        cmd = [sys.executable, "-m", "tailgate.cli", "slo", "--slo", args.slo, "--results", str(folder),
               "--start-rate", f"{rate:g}", "--max-rate", f"{rate:g}", "--min-rate", f"{rate:g}",
               "--max-probes", "1", "--reruns", "0", "--extend", "0", "--n", str(args.n), "--duration", "0",
               "--warmup", str(args.warmup), "--seed", str(args.seed + args.part), "--model-replicates", "0",
               "--no-confirm",
               "--no-report", "--time-budget", "0", "--config", args.config]  # fmt: skip
        cmd += ["--embedded"] if args.embedded else ["--server", "url", "--host", args.host]
        if args.ignore_eos:
            cmd.append("--ignore-eos")
        if args.stage_warmup is not None:
            cmd += ["--stage-warmup", str(args.stage_warmup)]
        cmd += [f"--locust-arg={a}" for a in args.locust_arg]
        print(f"[truth] {rate:g} req/s, {args.n} measured requests: {' '.join(cmd[2:])}", flush=True)
        rc = subprocess.call(cmd)
        if rc not in (0, 3, 5):  # 3: failed, 5: undecided: both are a truth run's outcome
            print(f"[truth] tailgate slo exited {rc} at {rate:g} req/s", file=sys.stderr)
            return rc
    return report([out / p.name for p in sorted(out.iterdir()) if (p / slo.SLO_FILE).exists()], args)


def report(folders: Sequence[Path], args: argparse.Namespace) -> int:
    rates = read_truth(folders, args.block_s)
    if not rates:
        print("truth: no probe in the folders given", file=sys.stderr)
        return 2
    print_table(rates)
    by_config: dict[str, list[RateTruth]] = {}
    for t in rates:
        by_config.setdefault(t.config, []).append(t)
    doc: dict[str, Any] = {"block_s": args.block_s, "configs": {}}
    for name, ts in by_config.items():
        b = bracket(ts, args.min_n)
        print(f"{name}: truth in [{b['low']}, {b['high']}] req/s ({b['claim']})")
        doc["configs"][name] = {"bracket": b, "rates": [asdict(t) for t in ts]}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


@dataclass(frozen=True)
class Scored:
    search: str
    config: str
    measured: tuple[float, float | None]
    answer: tuple[float, float | None]
    answer_kind: str
    holds: str
    """holds (the truth's whole bracket inside the answer), misses (disjoint), or undetermined (they overlap)."""
    width: float | None
    """Of the answer, relative to its midpoint."""
    probing_min: float
    fitted: tuple[float, float] | None = None
    """The fitted model's own interval, used or not."""
    fitted_holds: str = "n/a"


def holds(answer: tuple[float, float | None], truth: tuple[float, float]) -> str:
    lo, hi = answer[0], math.inf if answer[1] is None else answer[1]
    if lo <= truth[0] and truth[1] <= hi:
        return "holds"
    if truth[1] < lo or truth[0] >= hi:  # the upper end is a rate that failed: a long-run pass there contradicts it
        return "misses"
    return "undetermined"


def score_search(folder: Path, truth: Mapping[str, Any], config_as: str | None) -> list[Scored]:
    """Each configuration of a finished search against the truth of the configuration it names."""
    state = json.loads((folder / slo.SLO_FILE).read_text())
    out = []
    for c in state["configs"]:
        t = truth["configs"].get(config_as or c["name"])
        r = c.get("result") or {}
        if t is None or t["bracket"].get("low") is None or t["bracket"].get("high") is None:
            continue
        measured = (float(r.get("best_rate") or 0.0), r.get("first_fail_rate"))
        fitted = r.get("fitted") or {}
        if fitted.get("usable") and fitted.get("bracket"):
            answer, kind = (float(fitted["bracket"][0]), float(fitted["bracket"][1])), "fitted, checked"
        else:
            answer, kind = measured, "measured bracket"
        hi = answer[1]
        width = None if hi is None else (hi - answer[0]) / ((hi + answer[0]) / 2)
        seconds = sum(float(a.get("seconds") or 0) for pr in c["probes"] for a in pr["attempts"])
        truth_bracket = (t["bracket"]["low"], t["bracket"]["high"])
        own = fitted.get("interval")
        model = (float(own[0]), float(own[1])) if own else None
        out.append(Scored(str(folder), c["name"], measured, answer, kind, holds(answer, truth_bracket), width,
                          seconds / 60, model, holds(model, truth_bracket) if model else "n/a"))  # fmt: skip
    return out


def score(args: argparse.Namespace) -> int:
    truth = json.loads(Path(args.truth).read_text())
    rows = [s for f in args.searches for s in score_search(Path(f), truth, args.config_as)]
    if not rows:
        print("score: no search configuration has a two-sided truth in the file given", file=sys.stderr)
        return 2
    print(
        "| search | configuration | truth | measured bracket | answer | kind | holds | width | probing min "
        "| fitted model's own interval | it holds |"
    )
    print("|---|---|---|---|---|---|---|---:|---:|---|---|")
    for s in rows:
        b = truth["configs"][args.config_as or s.config]["bracket"]
        w = "open" if s.width is None else f"{s.width:.1%}"
        print(
            f"| {s.search} | {s.config} | [{b['low']:g}, {b['high']:g}] | [{s.measured[0]:g}, {s.measured[1]}] "
            f"| [{s.answer[0]:g}, {s.answer[1]}] | {s.answer_kind} | {s.holds} | {w} | {s.probing_min:.1f} "
            f"| {list(s.fitted) if s.fitted else 'none'} | {s.fitted_holds} |"
        )
    held = sum(s.holds == "holds" for s in rows)
    print(
        f"{held} of {len(rows)} answers hold the truth; "
        f"{sum(s.holds == 'misses' for s in rows)} miss; {sum(s.holds == 'undetermined' for s in rows)} undetermined"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one long probe per rate, then the table")
    r.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], required=True)
    r.add_argument("--slo", required=True)
    r.add_argument("--n", type=int, default=4000)
    r.add_argument("--warmup", type=int, default=25)
    r.add_argument("--seed", type=int, default=TRUTH_SEED)
    r.add_argument(
        "--part",
        type=int,
        default=0,
        help="one more part of a rate's truth (its own folder, workload seed --seed + PART): where the "
        "requests a rate needs take longer than one call may run, the parts are read as one",
    )
    r.add_argument("--config", default="chunked: chunked=on")
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--embedded", action="store_true")
    where.add_argument("--host")
    r.add_argument("--ignore-eos", action="store_true")
    r.add_argument("--stage-warmup", type=int)
    r.add_argument("--locust-arg", action="append", default=[])
    r.add_argument("--out", required=True)
    rd = sub.add_parser("read", help="the table and truth.json from folders run made")
    rd.add_argument("folders", nargs="+")
    for q in (r, rd):
        q.add_argument("--block-s", type=float, default=30.0, help="bootstrap block length, s of arrivals")
        q.add_argument("--min-n", type=int, default=4000, help="measured requests a rate needs to count as truth")
        q.add_argument("--json", help="write the truth here")
    sc = sub.add_parser("score", help="finished searches against a truth.json")
    sc.add_argument("truth")
    sc.add_argument("searches", nargs="+", help="tailgate slo folders (with slo.json)")
    sc.add_argument("--config-as", help="score every configuration against this truth configuration")
    args = p.parse_args(argv)
    if args.command == "score":
        return score(args)
    if args.command == "run":
        return run(args)
    folders = [Path(f) for f in args.folders]
    expanded = [c for f in folders for c in ([f] if (f / slo.SLO_FILE).exists() else sorted(f.iterdir()))
                if (c / slo.SLO_FILE).exists()]  # fmt: skip
    return report(expanded, args)


if __name__ == "__main__":
    sys.exit(main())
