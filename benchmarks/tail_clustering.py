"""How clustered is a latency tail, by threshold, and what does charging that clustering do to a probe's verdicts?

The search decides "p99 <= L" from the share of requests over L, shrunk by the design effect of time blocks
(:func:`tailgate.tailbounds.design_effect`). With few requests over the limit the rule charges the larger of the
limit's design effect and that of the exceedances of the probe's own 97th percentile
(:data:`tailgate.tailbounds.REFERENCE_QUANTILE`), on the view that a queue puts its slow requests together
whatever the threshold. That view is testable on the kept long runs: if the design effect of 1{v > t} grows as t
moves into the tail, the q97 figure is right or even optimistic; if it shrinks, it over-charges probes whose
exceedances at the limit are spread out.

For each long run (a ``tailgate slo`` folder of one long probe) and each SLO percentile metric this prints:

1. thresholds at the run's own quantiles 0.50 ... 0.995 and the limit: the exceedances, their design effect with
   the verdict's groups (workload, one of 20 blocks of the run) and with fixed 3-s blocks (what a 60-s probe's 20
   blocks are), and the events they came in (over-threshold moments within 1 s are one event, as
   ``slo_truth_real.py`` counts them): requests per event is a direct reading of clustering;
2. the same exceedances' design effect with fixed blocks of 3 to 48 s: a grouping finer than the clustering's
   own span (a stall sets the worst gap of every stream alive, sent over the stream lifetime before it) reads it
   low;
3. a window experiment: the run cut by intended send into consecutive 60-s windows (one probe) and 180-s windows
   (a probe extended twice: three attempts pooled, each its own blocks), each decided by the verdict's own
   anytime-valid ``check_tail`` under three rules for the design effect: (a) the current one, max of the limit's
   and the q97 exceedances'; (b) the limit's exceedances' only; (c) the limit's and that of the highest of
   q90/q95/q97/q99 with at least 10 exceedances. Verdicts that contradict the long run's truth
   (``slo_truth_real.py``'s reading, from its ``truth.json``) are counted; runs with an undecided truth are shown,
   not scored.

Run: ``python benchmarks/tail_clustering.py RUN [RUN ...] --truth truth.json [--truth ...] [--json out.json]``
(RUN: a folder with ``slo.json``, e.g. ``truth8/r8`` of ``cpu-search-and-truth-2026-12-05.tar.gz``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slo_reread import probe_attempts
from slo_truth_real import event_share

from tailgate import slo, tailbounds
from tailgate.records import RequestRecord
from tailgate.slo.plan import SloPlan
from tailgate.slo.probe import SloRunner
from tailgate.slo.spec import Limit
from tailgate.slo.verdict import BLOCKS, METRIC_FIELDS, steady_part
from tailgate.tailbounds import FAIL, NOT_ENOUGH, PASS, check_tail, design_effect

QUANTILES = (0.50, 0.75, 0.90, 0.95, 0.97, 0.99, 0.995)
RULE_C_QUANTILES = (0.90, 0.95, 0.97, 0.99)
RULE_C_MIN_OVER = 10
PROBE_S = 60.0
"""One probe's length: a 180-s window is three of them pooled, as a probe extended twice is."""
FIXED_BLOCK_S = PROBE_S / BLOCKS
RULES = ("a", "b", "c")
RULE_NAMES = {
    "a": "current: max(limit, q97)",
    "b": "limit's own only",
    "c": f"limit's and highest q90-q99 with >= {RULE_C_MIN_OVER} over",
}
CONFIDENCE = 0.95
"""The search's per-look confidence (``SloPlan.look_confidence`` is the plan's confidence, 95% by default)."""


@dataclass
class LongRun:
    folder: str
    config: str
    rate: float
    limits: list[Limit]
    attempt: slo.ProbeAttempt
    stopped: bool
    truth: str = "unknown"
    metric_truth: dict[str, str] = field(default_factory=dict)
    share_over: dict[str, float] = field(default_factory=dict)
    """metric -> the whole run's (steady part's) share over the limit: the point reading, whatever the truth."""

    def point_over(self, check: str) -> bool:
        """Is the long run's point share over the allowance (``probe``: for either limit)?"""
        lims = [lim for lim in self.limits if check in (lim.metric, "probe")]
        return any(self.share_over.get(lim.metric, 0.0) > 1.0 - (lim.p or 99.0) / 100.0 for lim in lims)


@dataclass
class ThresholdRow:
    label: str
    threshold: float
    over: int
    deff_blocks20: float
    deff_fixed3s: float
    ceiling_3s: float
    """The 3-s figure were every exceedance packed into as few blocks as possible: a handful of exceedances cannot
    show more clustering than this, so a tail figure near it is a floor, not a measurement."""
    events: int
    per_event: float | None


@dataclass
class WindowRow:
    length_s: float
    index: int
    n: dict[str, int]
    over: dict[str, int]
    verdicts: dict[str, dict[str, str]]
    """rule -> metric (and ``probe``: both tails together) -> verdict."""
    deff: dict[str, dict[str, float]]
    """rule -> metric -> the design effect charged (n / n_effective)."""


def die(msg: str) -> None:
    raise SystemExit(f"tail_clustering: {msg}")


# ------------------------------------------------------------------------------------------------ loading


def load_run(folder: Path) -> LongRun:
    """The one long probe of a ``tailgate slo`` folder, read as the verdict reads it."""
    path = folder / slo.SLO_FILE
    if not path.exists():
        die(f"{folder}: no {slo.SLO_FILE}")
    state = json.loads(path.read_text())
    limits = [lim for lim in slo.parse_slo(state["plan"]["slo"]) if lim.p is not None]
    plan = SloPlan(limits=limits, configs=[], n=state["plan"]["n"], warmup=state["plan"]["warmup"])
    reader = SloRunner(plan, None, folder, log=lambda _line: None)
    probes = [(c["name"], pr) for c in state["configs"] for pr in c["probes"]]
    if len(probes) != 1:
        die(f"{folder}: {len(probes)} probes; a long run is one probe")
    name, pr = probes[0]
    attempts = probe_attempts(reader, folder, pr)
    if len(attempts) != 1:
        die(f"{folder}: {len(attempts)} attempts; a long run is one")
    a = attempts[0]
    return LongRun(str(folder), name, float(pr["rate"]), limits, a, bool(a.stopped_early))


def counted(r: RequestRecord, metric: str) -> bool:
    """Does a verdict count this record for ``metric``: a finite value, and no client-coalesced stream for gaps."""
    v = getattr(r, METRIC_FIELDS[metric])
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return False
    return not (metric == "gap" and r.client_coalesced)


def metric_values(recs: Sequence[RequestRecord], metric: str) -> list[RequestRecord]:
    """The records a verdict counts for ``metric``, in their order."""
    return [r for r in recs if counted(r, metric)]


def _p99(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def metric_truth(m: Mapping[str, Any], allowance: float) -> str:
    """One limit's truth by ``slo_truth_real.bootstrap_verdict``'s criteria, applied to that limit alone."""
    if (m.get("bootstrap_low") is not None and m["bootstrap_low"] > m["limit"]) or (
        m.get("share_low") is not None and m["share_low"] > allowance
    ):
        return FAIL
    if (
        m.get("bootstrap_high") is not None
        and m["bootstrap_high"] <= m["limit"]
        and (m.get("events", 0) == 0 or (m.get("share_high") or 0.0) <= allowance)
    ):
        return PASS
    return "undecided"


def attach_truth(run: LongRun, truths: Sequence[Mapping[str, Any]]) -> None:
    """Find the run in the truth files: same config, rate and last two folder names; the TTFT p99 point breaks
    ties (two 5 req/s runs were kept under one name)."""
    tail2 = Path(run.folder).parts[-2:]
    cands = [
        r
        for t in truths
        for cname, c in t.get("configs", {}).items()
        if cname == run.config
        for r in c.get("rates", [])
        if float(r["rate"]) == run.rate and Path(r["folder"]).parts[-2:] == tail2
    ]
    if len(cands) > 1:
        steady, _ = steady_part(run.attempt)
        points = {}
        for lim in run.limits:
            rows = metric_values(steady, lim.metric)
            points[lim.key] = round(_p99([getattr(r, METRIC_FIELDS[lim.metric]) for r in rows], lim.p / 100.0), 1)
        cands = [r for r in cands if all(abs((m["point"] or 0) - points.get(m["key"], -1)) < 0.15
                                         for m in r["metrics"] if m["key"] in points)]  # fmt: skip
    if len(cands) != 1:
        return
    r = cands[0]
    run.truth = r["truth"]
    allowance = 1.0 - max(lim.p or 99.0 for lim in run.limits) / 100.0
    for m in r["metrics"]:
        key = next((lim.metric for lim in run.limits if lim.key == m["key"]), None)
        if key is None:
            continue
        # a run stopped for a queue without bound fails; the limit its point is over is the one that failed
        stopped_over = bool(r.get("stopped")) and (m.get("point") or 0.0) > m["limit"]
        run.metric_truth[key] = FAIL if stopped_over else metric_truth(m, allowance)


# --------------------------------------------------------------------------------------- by threshold


def fixed_blocks(recs: Sequence[RequestRecord], t0: float, block_s: float) -> list[int]:
    return [int((r.intended_s - t0) // block_s) for r in recs]


def packed(flags: Sequence[bool], groups: Sequence[Any]) -> float:
    """The design effect of as many exceedances as ``flags`` holds, packed into the largest blocks (near the most
    a grouping can show with that many)."""
    k = sum(flags)
    size: dict[Any, int] = {}
    for g in groups:
        size[g] = size.get(g, 0) + 1
    order = sorted(range(len(groups)), key=lambda i: (-size[groups[i]], groups[i]))
    moved = [False] * len(flags)
    for i in order[:k]:
        moved[i] = True
    return design_effect(moved, groups)


def sample_quantile(srt: Sequence[float], q: float) -> float:
    """The threshold ``check_tail`` takes as its reference at ``q``."""
    return srt[int(q * (len(srt) - 1))]


def threshold_table(run: LongRun, lim: Limit) -> list[ThresholdRow]:
    steady, _ = steady_part(run.attempt)
    span_recs = list(run.attempt.measured)
    rows = metric_values(steady, lim.metric)
    fld = METRIC_FIELDS[lim.metric]
    values = [float(getattr(r, fld)) for r in rows]
    # the verdict's 20 blocks span the attempt's measured sends, not only the steady part's
    lo, hi = min(r.intended_s for r in span_recs), max(r.intended_s for r in span_recs)
    g20 = [(0, min(BLOCKS - 1, int((r.intended_s - lo) / (hi - lo) * BLOCKS))) if hi > lo else (0, 0) for r in rows]
    g3 = fixed_blocks(rows, lo, FIXED_BLOCK_S)
    srt = sorted(values)
    cuts = [(f"q{q * 100:g}", sample_quantile(srt, q)) for q in QUANTILES] + [("limit", lim.limit)]
    out = []
    for label, t in cuts:
        flags = [v > t for v in values]
        over, events, _, _ = event_share(rows, lim.metric, t, len(rows))
        out.append(ThresholdRow(label, round(t, 1), sum(flags), round(design_effect(flags, g20), 2),
                                round(design_effect(flags, g3), 2), round(packed(flags, g3), 2), events,
                                round(over / events, 2) if events else None))  # fmt: skip
    return out


BLOCK_LENGTHS_S = (3.0, 6.0, 12.0, 24.0, 48.0)
"""Fixed block lengths tried: a 60-s probe's 20 blocks are 3 s, a 240-s attempt's 12 s."""


def block_length_table(run: LongRun, lim: Limit) -> list[dict[str, Any]]:
    """The design effect of 1{v > t} at q90, q97, q99 and the limit with fixed blocks of each of
    :data:`BLOCK_LENGTHS_S`: a grouping finer than the clustering's own span splits its clusters and reads it low,
    which is what a short probe's 20 blocks risk."""
    steady, _ = steady_part(run.attempt)
    rows = metric_values(steady, lim.metric)
    fld = METRIC_FIELDS[lim.metric]
    values = [float(getattr(r, fld)) for r in rows]
    lo = min(r.intended_s for r in run.attempt.measured)
    srt = sorted(values)
    cuts = [(f"q{q * 100:g}", sample_quantile(srt, q)) for q in (0.90, 0.97, 0.99)] + [("limit", lim.limit)]
    out = []
    for label, t in cuts:
        flags = [v > t for v in values]
        row: dict[str, Any] = {"threshold": label, "ms": round(t, 1), "over": sum(flags)}
        for b in BLOCK_LENGTHS_S:
            row[f"{b:g}s"] = round(design_effect(flags, fixed_blocks(rows, lo, b)), 2)
        out.append(row)
    return out


def print_block_lengths(run: LongRun, lim: Limit, rows: Sequence[Mapping[str, Any]]) -> None:
    print(f"\n{label(run)}, {lim.key}\n")
    print("| threshold | ms | over | " + " | ".join(f"{b:g}-s blocks" for b in BLOCK_LENGTHS_S) + " |")
    print("|---|---:|---:|" + "---:|" * len(BLOCK_LENGTHS_S))
    for r in rows:
        print(f"| {r['threshold']} | {r['ms']:g} | {r['over']} | "
              + " | ".join(f"{r[f'{b:g}s']:.2f}" for b in BLOCK_LENGTHS_S) + " |")  # fmt: skip


# ------------------------------------------------------------------------------------------- windows


@contextlib.contextmanager
def reference_quantile(q: float) -> Iterator[None]:
    """``check_tail`` with its reference threshold at ``q`` (1.0: the maximum, over which nothing lies, so only
    the limit's own exceedances measure clustering)."""
    old = tailbounds.REFERENCE_QUANTILE
    tailbounds.REFERENCE_QUANTILE = q
    try:
        yield
    finally:
        tailbounds.REFERENCE_QUANTILE = old


def rule_quantile(rule: str, values: Sequence[float]) -> float:
    if rule == "a":
        return tailbounds.REFERENCE_QUANTILE
    if rule == "b":
        return 1.0
    srt = sorted(values)
    best = 1.0
    for q in RULE_C_QUANTILES:
        t = sample_quantile(srt, q)
        if sum(1 for v in values if v > t) >= RULE_C_MIN_OVER:
            best = q
    return best


def windows(run: LongRun, length_s: float, stride_s: float) -> Iterator[list[slo.ProbeAttempt]]:
    """Windows of ``length_s`` by intended send, each cut into PROBE_S attempts of their own workload (a probe
    extended with new samples pools them as blocks of their own)."""
    recs = sorted(run.attempt.measured, key=lambda r: r.intended_s)
    if not recs:
        return
    t0, t_end = recs[0].intended_s, recs[-1].intended_s
    parts = max(1, round(length_s / PROBE_S))
    start = t0
    while start + length_s <= t_end + 1e-9:
        attempts = []
        for i in range(parts):
            lo, hi = start + i * PROBE_S, start + (i + 1) * PROBE_S
            part = [r for r in recs if lo <= r.intended_s < hi]
            attempts.append(replace(run.attempt, measured=part, workload=i, stopped_early=None))
        yield attempts
        start += stride_s


def decide_window(run: LongRun, attempts: Sequence[slo.ProbeAttempt], length_s: float, index: int) -> WindowRow:
    """The window's tail checks as ``check_probe`` forms them (steady part of each attempt, groups of workload and
    block), decided by each rule."""
    steady: list[tuple[int, RequestRecord]] = []
    for a in attempts:
        part, _ = steady_part(a)
        steady += [(a.workload, r) for r in part]
    spans = {a.workload: (min(r.intended_s for r in a.measured), max(r.intended_s for r in a.measured))
             for a in attempts if a.measured}  # fmt: skip
    verdicts: dict[str, dict[str, str]] = {rule: {} for rule in RULES}
    deffs: dict[str, dict[str, float]] = {rule: {} for rule in RULES}
    ns: dict[str, int] = {}
    overs: dict[str, int] = {}
    for lim in run.limits:
        assert lim.p is not None
        fld = METRIC_FIELDS[lim.metric]
        kept = [(w, r) for w, r in steady if counted(r, lim.metric)]
        values = [float(getattr(r, fld)) for _, r in kept]
        groups = []
        for w, r in kept:
            lo, hi = spans[w]
            groups.append((w, 0 if hi <= lo else min(BLOCKS - 1, int((r.intended_s - lo) / (hi - lo) * BLOCKS))))
        ns[lim.metric] = len(values)
        overs[lim.metric] = sum(1 for v in values if v > lim.limit)
        for rule in RULES:
            with reference_quantile(rule_quantile(rule, values)):
                c = check_tail(values, lim.p / 100.0, lim.limit, confidence=CONFIDENCE, groups=groups,
                               key=lim.key, sequential=True)  # fmt: skip
            verdicts[rule][lim.metric] = c.verdict
            deffs[rule][lim.metric] = round(c.n / c.n_effective, 2) if c.n_effective else math.inf
    for rule in RULES:
        vs = set(verdicts[rule].values())
        verdicts[rule]["probe"] = FAIL if FAIL in vs else (NOT_ENOUGH if NOT_ENOUGH in vs else PASS)
    return WindowRow(length_s, index, ns, overs, verdicts, deffs)


def wrong(verdict: str, truth: str) -> bool:
    return (truth == PASS and verdict == FAIL) or (truth == FAIL and verdict == PASS)


def summarize(run: LongRun, rows: Sequence[WindowRow], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """Per rule and check (each metric, and the probe's tails together): pass / fail / undecided and wrong."""
    out = []
    for rule in RULES:
        for m in [*metrics, "probe"]:
            truth = run.truth if m == "probe" else run.metric_truth.get(m, "unknown")
            vs = [r.verdicts[rule][m] for r in rows]
            scored = truth in (PASS, FAIL)
            charged = [r.deff[rule][m] for r in rows] if m != "probe" else []
            over = run.point_over(m)
            out.append({
                "rule": rule, "check": m, "truth": truth, "point_over": over, "windows": len(vs),
                "pass": vs.count(PASS), "fail": vs.count(FAIL), "not_enough": vs.count(NOT_ENOUGH),
                "wrong": sum(wrong(v, truth) for v in vs) if scored else None,
                "against_point": vs.count(PASS) if over else vs.count(FAIL),
                "deff_median": round(statistics.median(charged), 2) if charged else None,
            })  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------- printing


def label(run: LongRun) -> str:
    return f"{run.config} {run.rate:g} req/s ({Path(run.folder).parent.name}/{Path(run.folder).name})"


def print_thresholds(run: LongRun, lim: Limit, rows: Sequence[ThresholdRow], n: int) -> None:
    print(f"\n**{label(run)}, {lim.key} <= {lim.limit:g} ms** (n {n}, {run.share_over[lim.metric]:.2%} over the "
          f"limit, truth of this limit: {run.metric_truth.get(lim.metric, 'unknown')})\n")  # fmt: skip
    print(
        "| threshold | ms | over | deff, 20 blocks of the run | deff, 3-s blocks | 3-s, all packed | events "
        "| requests per event |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        per = "" if r.per_event is None else f"{r.per_event:.2f}"
        print(f"| {r.label} | {r.threshold:g} | {r.over} | {r.deff_blocks20:.2f} | {r.deff_fixed3s:.2f} "
              f"| {r.ceiling_3s:.2f} | {r.events} | {per} |")  # fmt: skip


def print_compact(runs: Sequence[LongRun], entries: Sequence[Mapping[str, Any]]) -> None:
    """One line per run and limit: the 3-s design effect (and requests per event) at every threshold."""
    labels = [f"q{q * 100:g}" for q in QUANTILES] + ["limit"]
    print("\n### In brief: design effect with 3-s blocks (requests per event) by threshold\n")
    print("| run | check | " + " | ".join(labels) + " |")
    print("|---|---|" + "---:|" * len(labels))
    for run, entry in zip(runs, entries, strict=True):
        for metric, rows in entry["thresholds"].items():
            cells = []
            for r in rows:
                per = f" ({r['per_event']:.1f})" if r["per_event"] is not None else ""
                cells.append(f"{r['deff_fixed3s']:.1f}{per}" if r["over"] else "no exceedance")
            print(f"| {label(run)} | {metric} | " + " | ".join(cells) + " |")


def print_windows(title: str, table: Sequence[tuple[LongRun, float, list[dict[str, Any]]]]) -> None:
    print(f"\n{title}\n")
    print(
        "| run | window s | truth | long-run point | check | rule | windows | pass | fail | not enough | wrong "
        "| against the point | median deff |"
    )
    print("|---|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for run, length, summary in table:
        for s in summary:
            w = "not scored" if s["wrong"] is None else str(s["wrong"])
            d = "" if s["deff_median"] is None else f"{s['deff_median']:g}"
            point = "over" if s["point_over"] else "under"
            print(f"| {label(run)} | {length:g} | {s['truth']} | {point} | {s['check']} | {s['rule']} | {s['windows']} "
                  f"| {s['pass']} | {s['fail']} | {s['not_enough']} | {w} | {s['against_point']} | {d} |")  # fmt: skip


def print_totals(title: str, table: Sequence[tuple[LongRun, float, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per window length, rule and check, summed over every run; wrong verdicts over the runs whose truth is known
    (``scored`` of the windows), verdicts against the long run's point share over every run."""
    totals: dict[tuple[float, str, str], dict[str, int]] = {}
    for _run, length, summary in table:
        for s in summary:
            t = totals.setdefault((length, s["check"], s["rule"]), dict.fromkeys(
                ("windows", "pass", "fail", "not_enough", "scored", "wrong", "against_point"), 0))  # fmt: skip
            for k in ("windows", "pass", "fail", "not_enough", "against_point"):
                t[k] += s[k]
            if s["wrong"] is not None:
                t["scored"] += s["windows"]
                t["wrong"] += s["wrong"]
    print(f"\n{title}\n")
    print(
        "| window s | check | rule | windows | pass | fail | not enough | decided | wrong (of scored) "
        "| against the long run's point |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---|---:|")
    out = []
    for (length, check, rule), t in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[0][1] != "probe", kv[0])):
        print(f"| {length:g} | {check} | {rule} | {t['windows']} | {t['pass']} | {t['fail']} | {t['not_enough']} "
              f"| {t['pass'] + t['fail']} | {t['wrong']} (of {t['scored']}) | {t['against_point']} |")  # fmt: skip
        out.append({"length_s": length, "check": check, "rule": rule, **t})
    return out


# ------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="long-run folders (each with slo.json and one probe)")
    p.add_argument("--truth", action="append", default=[], help="a truth.json of slo_truth_real.py (repeatable)")
    p.add_argument("--lengths", default="60,180", help="window lengths in s, multiples of 60 (default 60,180)")
    p.add_argument(
        "--stride-s",
        type=float,
        default=0.0,
        help="also cut overlapping windows starting every this many s (0: only non-overlapping)",
    )
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    try:
        lengths = [float(x) for x in args.lengths.split(",")]
    except ValueError:
        die(f"--lengths {args.lengths!r}: expected numbers separated by commas")
    if any(x <= 0 or abs(x / PROBE_S - round(x / PROBE_S)) > 1e-9 for x in lengths):
        die(f"--lengths {args.lengths!r}: each must be a positive multiple of {PROBE_S:g} s")
    truths = []
    for t in args.truth:
        try:
            truths.append(json.loads(Path(t).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            die(f"--truth {t}: {e}")
    runs = [load_run(Path(f)) for f in args.runs]
    for run in runs:
        attach_truth(run, truths)
    doc: dict[str, Any] = {"runs": []}

    print("## Design effect of 1{v > t} by threshold\n")
    print(f"deff: `tailgate.tailbounds.design_effect` (1 where the blocks show no overdispersion at 5%); 20 blocks: "
          f"the verdict's groups over the whole run; 3-s blocks: what a {PROBE_S:g}-s probe's {BLOCKS} blocks are. "
          f"Events: over-threshold moments (first chunk for TTFT, end of the worst gap for gaps) within "
          f"1 s of each other. '3-s, all packed': the 3-s figure with as many exceedances packed into the largest "
          f"blocks, about the most that many can show (a figure near it is a floor).")  # fmt: skip
    for run in runs:
        entry: dict[str, Any] = {"folder": run.folder, "config": run.config, "rate": run.rate, "truth": run.truth,
                                 "metric_truth": run.metric_truth, "stopped": run.stopped, "thresholds": {},
                                 "share_over": run.share_over}  # fmt: skip
        steady, _ = steady_part(run.attempt)
        for lim in run.limits:
            counted_recs = metric_values(steady, lim.metric)
            vals = [getattr(r, METRIC_FIELDS[lim.metric]) for r in counted_recs]
            run.share_over[lim.metric] = sum(1 for v in vals if v > lim.limit) / max(1, len(vals))
            rows = threshold_table(run, lim)
            print_thresholds(run, lim, rows, len(metric_values(steady, lim.metric)))
            entry["thresholds"][lim.metric] = [asdict(r) for r in rows]
        doc["runs"].append(entry)

    print_compact(runs, doc["runs"])

    print("\n## Design effect by block length\n")
    print("The same exceedances grouped in fixed blocks of 3 to 48 s of intended sends (`design_effect`, 1 where the "
          "blocks show no overdispersion at 5%).")  # fmt: skip
    for run, entry in zip(runs, doc["runs"], strict=True):
        for lim in run.limits:
            by_length = block_length_table(run, lim)
            print_block_lengths(run, lim, by_length)
            entry.setdefault("block_lengths", {})[lim.metric] = by_length

    strides = [("non-overlapping", None)] + ([("overlapping", args.stride_s)] if args.stride_s > 0 else [])
    doc["windows"] = {}
    for kind, stride in strides:
        table: list[tuple[LongRun, float, list[dict[str, Any]]]] = []
        per_window: list[dict[str, Any]] = []
        for run, entry in zip(runs, doc["runs"], strict=True):
            for length in lengths:
                rows = [decide_window(run, atts, length, i)
                        for i, atts in enumerate(windows(run, length, stride or length))]  # fmt: skip
                table.append((run, length, summarize(run, rows, [lim.metric for lim in run.limits])))
                per_window += [{"folder": run.folder, **asdict(r)} for r in rows]
                entry.setdefault("windows", {})[f"{kind} {length:g}"] = table[-1][2]
        how = "consecutive, non-overlapping" if stride is None else f"starting every {stride:g} s (overlapping)"
        print(f"\n## Windows ({how}) decided by the anytime-valid check at {CONFIDENCE:.0%}\n")
        print("Rules: " + "; ".join(f"({k}) {v}" for k, v in RULE_NAMES.items()) + ". `probe`: both tails "
              "together (fail if either fails, else not enough if either is), the sustained check left out. Wrong: a "
              "fail where the long run passes, a pass where it fails (runs with an undecided truth not scored). "
              "Against the point: a pass where the whole run's share over the limit exceeds the allowance, a fail "
              "where it does not.")  # fmt: skip
        print_windows("### Per run", table)
        totals = print_totals("### Totals over the runs", table)
        doc["windows"][kind] = {"stride_s": stride, "totals": totals, "windows": per_window}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
