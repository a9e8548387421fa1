"""What a search answers, in words and in ``slo.json``: both ends of the bracket, its width, why each
undecided rate could not decide (with its effective n), and what more probing time would buy.

The terminal and the report read the same figures from here, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailgate.contracts import StageSummary
from tailgate.jsontypes import (
    JsonMapping,
    json_float,
    json_floats,
    json_list,
    json_objects,
    json_opt_number,
    json_opt_object,
    json_opt_str,
    json_str,
)
from tailgate.slo.attempt import ProbeAttempt, ProbeMark
from tailgate.slo.busy import busy_line
from tailgate.slo.result import SearchResult, Undecided
from tailgate.slo.search import SearchOutcome
from tailgate.slo.spec import Log
from tailgate.slo.state import AttemptRow, ProbeEntry, SloState
from tailgate.slo.verdict import KEEP_UP, Check
from tailgate.tailbounds import NOT_ENOUGH, seq_above, seq_below

STATUS_WORDS = {
    "bracketed": "bracketed to the resolution",
    "settled": "the fitted model, checked against every probe, met the resolution first (model estimate)",
    "max_rate": "met at the highest rate allowed (the capacity may be higher)",
    "below_min": "not met even at the lowest rate allowed",
    "probe_limit": "probe count spent before the bracket met the resolution: the bracket so far",
    "time_budget": "time budget spent before the bracket met the resolution: the bracket so far",
    "unresolved": "the bracket is wider than the resolution: the rates inside it had not enough data",
}
"""Every status in words (``unresolved``: written by searches before the current rules, read on a resume)."""
MORE_DATA_CAP = 64
"""The most times a rate's data are scaled when estimating what would decide it."""


def figure_text(key: str, v: float | None) -> str:
    """A limit's figure as the verdict lines print it: a share, a percentage of errors, or ms; no bound is n/a."""
    if v is None:
        return "n/a"
    if key == "sustained":
        return f"{v:.0%}"
    return f"{v * 100:.2f}%" if key == "errors" else f"{v:.1f} ms"


def check_text(c: Check | JsonMapping) -> str:
    """One check as a line reads it: the figure, its bounds where they exist, the limit and its direction.

    The report passes a check as ``slo.json`` holds it: only the keys the line shows are read."""
    d = c.to_json() if isinstance(c, Check) else c
    key, verdict = json_str(d, "key"), json_str(d, "verdict").replace("_", " ")
    point = json_opt_number(d, "point")
    if key == "sustained":
        if point is None:  # stopped early, or too few timed requests: the reason says which
            return f"sustained: {json_opt_str(d, 'reason') or 'no completion figure'}: {verdict}"
        return f"sustained: {figure_text(key, point)} completed in the window (at least {KEEP_UP:.0%}): {verdict}"
    low, high = json_opt_number(d, "low"), json_opt_number(d, "high")
    bounds = "" if low is None and high is None else f" [{figure_text(key, low)}, {figure_text(key, high)}]"
    neff = json_opt_number(d, "n_effective")
    eff = f", effective n {neff:g} of {json_opt_number(d, 'n')}" if neff is not None else ""
    limit = json_opt_number(d, "limit")
    return f"{key} {figure_text(key, point)}{bounds} <= {figure_text(key, limit)}{eff}: {verdict}"


def verdict_line(verdict: str, checks: Sequence[Check]) -> str:
    return f"{verdict.upper()}: " + "; ".join(check_text(c) for c in checks)


def undecided_reason(verdict: str, checks: Sequence[Check]) -> str | None:
    """Why a probe ended without a verdict: every undecided check's reason (None when it decided)."""
    if verdict != NOT_ENOUGH:
        return None
    return "; ".join(f"{c.key}: {c.reason or 'undecided'}" for c in checks if c.verdict == NOT_ENOUGH)


def data_to_decide(check: Check, level: float) -> float | None:
    """How many times the rate's data would decide this check if more came at the same share over the limit
    (None: not even 64 times; or not a percentile check). An estimate from the point share, labelled so."""
    n, neff, over, limit_key = check.n, check.n_effective, check.over, check.key
    if not n or neff is None or over is None:
        return None
    p = 100 - float(limit_key.rsplit("_p", 1)[-1]) if "_p" in limit_key else None
    if p is None:
        return None
    tail, alpha = p / 100.0, 1.0 - level
    k, m = over * neff / n, float(neff)
    f = 1.0
    while f <= MORE_DATA_CAP:
        if seq_below(k * f, m * f, tail, alpha) or seq_above(k * f, m * f, tail, alpha):
            return f
        f *= 1.25
    return None


def seconds_to_decide(checks: Sequence[Check], seconds: float, level: float) -> float | None:
    """About how many more seconds at a rate would decide every one of its undecided percentile checks, if more
    data came at the measured share over each limit and at the pace of the ``seconds`` spent there so far (None:
    some check would not decide with :data:`MORE_DATA_CAP` times the data; 0 when no percentile check lacks data,
    as when only the keep-up test could not tell)."""
    factors = [data_to_decide(c, level) for c in checks if c.verdict == NOT_ENOUGH and c.n_effective is not None]
    if not factors:
        return 0.0
    if any(f is None for f in factors):
        return None
    return (max(f for f in factors if f is not None) - 1.0) * seconds


def result_of(outcome: SearchOutcome, probes: Sequence[ProbeEntry], plan: Any) -> SearchResult:
    """The configuration's ``result`` in ``slo.json``: both ends, the width, every undecided rate with why."""
    latest = {float(pr.rate): pr for pr in probes}
    best = latest.get(outcome.best) if outcome.best is not None else None
    fail = latest.get(outcome.first_fail) if outcome.first_fail is not None else None
    undecided = []
    for rate in sorted(r for r, v in outcome.verdicts.items() if v == NOT_ENOUGH):
        pr = latest[rate]
        pct = [c for c in pr.checks if c.verdict == NOT_ENOUGH and c.n_effective is not None]
        factor = max((f for f in (data_to_decide(c, plan.confidence) for c in pct) if f), default=None)
        seconds = sum(a.seconds or 0.0 for a in _attempts_at(probes, rate))
        undecided.append(Undecided(
            rate, pr.undecided_reason,
            n_effective=min((c.n_effective for c in pct if c.n_effective is not None), default=None),
            n=max((c.n for c in pct), default=None),
            more_data_factor=None if factor is None else round(factor, 2),
            more_seconds_estimate=None if factor is None else round((factor - 1) * seconds),
        ))  # fmt: skip
    width = outcome.width
    others = [a.others_busy_cores for pr in probes for a in pr.attempts if a.others_busy_cores is not None]
    return SearchResult(
        best_rate=outcome.best, first_fail_rate=outcome.first_fail, status=outcome.status,
        width=None if width is None else round(width, 3),
        width_relative=None if width is None or not outcome.best else round(width / outcome.best, 4),
        resolution=str(plan.resolution), binding=binding_at_capacity(best, fail),
        at_best={c.key: c for c in best.checks} if best else None, p99_at_best=best.p99 if best else None,
        verdicts=dict(sorted(outcome.verdicts.items())),
        pooled_decided=sorted(r for r, v in outcome.verdicts.items() if latest[r].verdict != v),
        undecided=undecided, probes=len(probes), attempts=sum(len(pr.attempts) for pr in probes),
        busy_attempts=sum(1 for c in others if busy_line(c)), others_busy_cores_max=max(others, default=None),
    )  # fmt: skip


def binding_at_capacity(best: ProbeEntry | None, fail: ProbeEntry | None) -> str | None:
    """The limit that binds at the capacity, from the probes on both sides of it: the one failing at the upper
    end when only one does; when several do (past the capacity every tail grows, and a queue inflates TTFT
    fastest), the one nearest its limit at the lower end, where the first to cross is still in sight."""
    if fail is None:
        return None
    failing = [c for c in fail.checks if c.verdict == "fail" and c.key != "sustained"]
    if len(failing) <= 1 or best is None:
        return failing[0].key if len(failing) == 1 else fail.binding
    keys = {c.key for c in failing}
    ratios = {c.key: c.point / c.limit for c in best.checks if c.key in keys and c.point is not None and c.limit}
    return max(ratios, key=lambda k: ratios[k]) if ratios else fail.binding


def _attempts_at(probes: Sequence[ProbeEntry], rate: float) -> list[AttemptRow]:
    return [a for pr in probes if float(pr.rate) == rate for a in pr.attempts]


def bracket_text(result: SearchResult | None) -> str:
    """[lower, upper] req/s with its width, or which end is open."""
    if result is None:
        return "[none passed, open: nothing above it failed] req/s"
    lo, hi, status = result.best_rate, result.first_fail_rate, result.status
    low = "none passed" if lo is None else f"{lo:g}"
    if hi is None:
        high = "open: nothing above it failed" if status != "max_rate" else "above the highest rate allowed"
        return f"[{low}, {high}] req/s"
    if lo is None:
        return f"[0, {hi:g}] req/s (nothing passed)"
    rel = result.width_relative
    wide = f"{hi - lo:g} req/s wide" + (f", {rel:.0%} of the lower end" if isinstance(rel, (int, float)) else "")
    return f"[{lo:g}, {hi:g}] req/s ({wide})"


def answer_line(result: SearchResult) -> str:
    """The answer of one configuration in one line: both ends, the width, the status, the undecided rates."""
    status = result.status
    words = STATUS_WORDS.get(status, status.replace("_", " "))
    text = f"capacity {bracket_text(result)}; {words} ({result.resolution} asked)"
    if result.binding:
        text += f"; binding limit at the upper end: {result.binding}"
    model = result.model
    if model and model.get("capacity") is not None:
        text += (f"\n[slo]     model estimate (not a measurement): capacity ~{model['capacity']:.3g} req/s, saturation "
                 f"~{model['mu']:.3g} req/s; its p99 lies inside {model['consistent']} of {model['checked']} measured "
                 "probes' intervals")  # fmt: skip
    text += fitted_text(result.fitted)
    text += "".join(f"\n[slo]     {line}" for line in rate_picture(result))
    for u in result.undecided:
        neff = u.n_effective
        eff = f"effective n {neff:g} of {u.n}" if isinstance(neff, (int, float)) else "no effective n"
        more = (f"; about {u.more_data_factor:g}x its data (~{u.more_seconds_estimate or 0:g} s more, an estimate "
                "at the measured share) would decide it" if u.more_data_factor else
                f"; not even {MORE_DATA_CAP}x its data at the measured share would decide it: the capacity is "
                "about here")  # fmt: skip
        text += f"\n[slo]     not enough data at {u.rate:g} req/s ({eff}): {u.reason}{more}"
    if result.busy_attempts:
        text += (f"\n[slo]     the machine was busy during {result.busy_attempts} attempt(s): other processes "
                 f"took up to {result.others_busy_cores_max or 0:.1f} core(s) beside the server and the load; a "
                 "server on this machine has only what they leave it, so this answer may be low: search again on "
                 "a quiet machine")  # fmt: skip
    for miss in result.not_run:
        text += (f"\n[slo]     a probe at {miss.rate:g} req/s could not run (tried twice): {miss.why}; "
                 "the search went on without it")  # fmt: skip
    return text


PICTURE_WIDTH = 60
VERDICT_MARKS = {"pass": "o", "fail": "x"}
"""A probe's mark on the rate picture ('?' for a rate that had not enough data)."""


def rate_picture(result: SearchResult, width: int = PICTURE_WIDTH) -> list[str]:
    """The answer as a picture on a log rate axis: each rate's verdict, the confirmation probes, the model's
    interval and capacity; a few lines a terminal shows as they are ([] when fewer than two rates were probed)."""
    verdicts = result.verdicts
    fitted = result.fitted or {}
    confirmation = json_opt_object(fitted, "confirmation") or {}
    confirm = {json_float(c, "rate") for c in json_objects(confirmation, "probes")}
    interval = json_list(fitted, "interval") if fitted.get("interval") else ()
    model = [float(v) for v in (*interval, fitted.get("capacity")) if isinstance(v, (int, float)) and v > 0]
    rates = sorted(verdicts)
    if len(rates) < 2:
        return []
    lo, hi = min([*rates, *model]), max([*rates, *model])
    span = math.log(hi / lo) or 1.0

    def col(rate: float) -> int:
        return round((width - 1) * math.log(rate / lo) / span)

    marks, under = [" "] * width, [" "] * width
    for rate in rates:
        marks[col(rate)] = VERDICT_MARKS.get(verdicts[rate], "?")
        if rate in confirm:
            under[col(rate)] = "^"
    lines = ["measured |" + "".join(marks) + "|  o pass  x fail  ? not enough data  ^ confirmation probe"]
    if "^" in under:
        lines.append("         |" + "".join(under) + "|")
    if len(model) == 3:
        band = [" "] * width
        a, b = col(model[0]), col(model[1])
        for k in range(a, b + 1):
            band[k] = "="
        band[a], band[b], band[col(model[2])] = "[", "]", "|"
        state = "stands" if fitted.get("usable") else "not used"
        lines.append("model    |" + "".join(band) + f"|  fitted interval, capacity | ({state})")
    axis = [" "] * (width + 2)
    for text, at in ((f"{lo:g}", 0), (f"{hi:g}", width + 2 - len(f"{hi:g}"))):
        axis[at : at + len(text)] = text
    lines.append("req/s     " + "".join(axis).rstrip() + "  (log scale)")
    return lines


def fitted_text(fitted: JsonMapping | None) -> str:
    """The fitted step loop's answer, labelled: its interval, the bracket it narrows, or why it narrows nothing."""
    if not fitted:
        return ""
    cap = json_opt_number(fitted, "capacity")
    if cap is None:
        return f"\n[slo]     fitted step loop (model estimate): no capacity: {fitted.get('why')}"
    low, high = json_list(fitted, "interval") if fitted.get("interval") else (None, None)
    rows = json_objects(fitted, "replay") if fitted.get("replay") else []
    held = sum(1 for r in rows if r.get("inside"))
    text = (
        f"\n[slo]     fitted step loop (model estimate, not a measurement): capacity {cap:.3g} req/s, 95% "
        f"interval [{low:.3g}, {high:.3g}]; its replay of {held} of {len(rows)} probes agrees with what was measured"
    )
    runs = json_opt_object(fitted, "single_runs") or {}
    if runs.get("middle_95"):
        lo_r, hi_r = json_floats(runs, "middle_95")
        text += (f"\n[slo]     one run of {json_opt_number(runs, 'requests') or 0:,.0f} requests alone crosses at "
                 f"{lo_r:.3g}-{hi_r:.3g} req/s in the model (95% of {json_opt_number(runs, 'runs') or 0:.0f} simulated "
                 "runs): the spread a finite run's p99 adds to that long-run interval")  # fmt: skip
    confirmation = json_opt_object(fitted, "confirmation") or {}
    if confirmation:
        text += f"\n[slo]     confirmation probes (not used to fit it): {confirmation.get('summary')}"
    br = json_floats(fitted, "bracket") if fitted.get("bracket") else []
    if fitted.get("usable") and br:
        rel = (br[1] - br[0]) / br[0] if br[0] else math.inf
        text += f"\n[slo]     bracket narrowed by the model: [{br[0]:.3g}, {br[1]:.3g}] req/s ({rel:.0%} wide)"
    else:
        text += f"\n[slo]     the model narrows nothing: {fitted.get('why')}"
    return text


def print_table(state: SloState, log: Log) -> None:
    """The answer in the terminal: per configuration both ends of the bracket, its width, and the p99s at
    the lower end (the same figures as the report's table)."""
    log(f"[slo] SLO {(state.plan or {}).get('slo')}: highest Poisson rate meeting it, per configuration")
    for c in state.configs:
        r = c.result
        p99 = (r.p99_at_best if r is not None else None) or {}
        shown = " ".join(f"{k} p99 {v:.1f} ms" for k, v in p99.items() if isinstance(v, (int, float)))
        status = r.status if r is not None else None
        log(f"[slo]   {c.name:<28} {bracket_text(r)}  {shown}  binding: {(r.binding if r else None) or '-'}  "
            f"({STATUS_WORDS.get(str(status), status)})")  # fmt: skip


def attempt_row(folder: str, seed: int, mark: ProbeMark, data: ProbeAttempt) -> AttemptRow:
    """One attempt as ``slo.json`` keeps it: what the report's mechanism and tables read."""
    s = data.summary or StageSummary()
    waits = data.waiting_series
    return AttemptRow(
        dir=Path(folder).name, seed=seed, seconds=mark.seconds,
        stopped_early=mark.stopped_early, waiting_max=mark.waiting_max,
        sent=data.sent, cancelled=data.cancelled, errors=data.errors,
        n_measured=len(data.measured), achieved_rate=s.achieved_rate,
        ttft_p99_from_send=s.ttft_p99, preemptions_delta=s.preemptions_delta,
        schedule_lag_p99=s.schedule_lag_p99,
        waiting_samples=len(waits),
        waiting_share=round(sum(1 for w in waits if w > 0) / len(waits), 3) if waits else None,
        client_coalesced=sum(1 for r in data.measured if r.client_coalesced),
        queue_slope_per_s=queue_slope(waits, mark.seconds), others_busy_cores=mark.others_busy_cores,
    )  # fmt: skip


def queue_slope(waits: Sequence[float], seconds: Any) -> float | None:
    """Least-squares slope of the waiting queue over the attempt, requests per second (None: too few samples)."""
    if len(waits) < 5 or not isinstance(seconds, (int, float)) or seconds <= 0:
        return None
    n = len(waits)
    xs = [i * float(seconds) / (n - 1) for i in range(n)]
    mx, my = sum(xs) / n, sum(waits) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0 or not math.isfinite(sxx):
        return None
    return round(sum((x - mx) * (w - my) for x, w in zip(xs, waits, strict=True)) / sxx, 4)
