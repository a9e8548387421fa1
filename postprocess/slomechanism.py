"""Which mechanism sets an SLO search's capacity, judged at the probe where the SLO broke: the same evidence the
diagnosis reads for the seed's questions (the preemption counter, the server's waiting queue and TTFT growing
faster than the gaps, worst gaps lining up with other requests' long prefills), from ``slo.json`` and the probes'
records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from .schedulinganswers import (
    FLAT_GAP_RATIO,
    GAP_GROWTH,
    OVERLOAD_TTFT_GROWTH,
    TTFT_FLAT_GROWTH,
)
from .timeline import Attribution, prefill_attribution

LAG_WARN_MS = 10.0
"""Schedule lag p99 above which the report already says the generator lacked CPU (``report.LAG_WARN_MS``)."""
METRICS = ("ttft", "gap", "total")


def num(x: Any) -> float | None:
    """A finite number, or None for anything else (a missing field, a string, NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def rate_text(x: Any) -> str:
    v = num(x)
    return "–" if v is None else f"{v:g}"


def probe_at(config: Mapping[str, Any], rate: Any) -> Mapping[str, Any] | None:
    if rate is None:
        return None
    found = [p for p in config.get("probes", []) if num(p.get("rate")) == num(rate)]
    return found[-1] if found else None


PREEMPT_EXCESS = 2.0
"""Preemptions per request at the failing rate must exceed this multiple of those at the passing rate for
preemption to be named: a counter that rose alike where the SLO held and where it broke explains neither."""


def _per_request_preemptions(probe: Mapping[str, Any]) -> float | None:
    attempts = probe.get("attempts", [])
    counts = [num(a.get("preemptions_delta")) for a in attempts]
    n = sum(num(a.get("n_measured")) or 0 for a in attempts)
    if not attempts or any(c is None for c in counts) or n <= 0:
        return None
    return sum(c or 0 for c in counts) / n


QUEUED_SHARE = 0.2
"""A queue counts as evidence of admission queueing when it is non-empty in at least this share of the
samples of every attempt: one sample with one request waiting is a moment, not a mechanism."""


def _growth(a: Any, b: Any) -> float | None:
    a, b = num(a), num(b)
    return round(b / a, 2) if a and b is not None and a > 0 else None


class MechanismEvidence(TypedDict, total=False):
    """What the mechanism was judged on, at the failing probe (none of it where no limit was reached); the
    growths are from the lowest probe, when there is one below it."""

    probe_rate: float
    binding: str | None
    preemptions: float
    preemptions_by_attempt: list[float]
    waiting_max: float
    waiting_share_by_attempt: list[float | None]
    stopped_early: str | None
    sustained: str | None
    from_rate: float
    ttft_p99_growth: float | None
    gap_p99_growth: float | None
    total_p99_growth: float | None
    prefill_attribution: Attribution | None
    schedule_lag_p99: float


class Mechanism(TypedDict):
    """Which mechanism sets a configuration's limit, in words, with its evidence (``slo_analysis.json``)."""

    mechanism: str
    text: str
    evidence: MechanismEvidence


def mechanism(config: Mapping[str, Any], records: pd.DataFrame) -> Mechanism:
    """Which mechanism sets this configuration's limit, judged at the probe where the SLO broke.

    The evidence is the diagnosis's: the counter of preemptions, the waiting queue and TTFT outgrowing
    the gaps from the lowest probe (admission), and worst gaps inside others' long prefills well above
    chance (prefill insertion). The binding limit decides between admission and prefill when both show.
    """
    result = config.get("result") or {}
    at = probe_at(config, result.get("first_fail_rate"))
    if at is None:
        probes = config.get("probes", [])
        if any(p.get("verdict") == "pass" for p in probes):
            text = "the SLO held at every rate decided; no limit was reached"
        else:  # nothing passed and nothing failed: the data said nothing about a limit
            text = "no rate was decided (not enough data at this n): no limit, and no mechanism, can be named"
        return {"mechanism": "none", "text": text, "evidence": {}}
    probes = sorted(config.get("probes", []), key=lambda p: p["rate"])
    base = probes[0] if probes and probes[0] is not at else None
    passing = probe_at(config, result.get("best_rate"))
    attempts = at.get("attempts", [])
    per_attempt = [num(a.get("preemptions_delta")) or 0 for a in attempts]
    preempted = sum(per_attempt)
    # evidence that differs between the passing and the failing rate: a counter that rose as much where the
    # SLO held does not explain where it broke
    at_pass = _per_request_preemptions(passing) if passing is not None else None
    at_fail = _per_request_preemptions(at)
    preempts_more = at_pass is None or (at_fail or 0) > PREEMPT_EXCESS * (at_pass or 0)
    preempts_all = bool(attempts) and all(x > 0 for x in per_attempt) and preempts_more
    waiting = max((num(a.get("waiting_max")) or 0 for a in attempts), default=0)
    shares = [num(a.get("waiting_share")) for a in attempts]
    stopped = next((a.get("stopped_early") for a in attempts if a.get("stopped_early")), None)
    queue_stop = bool(stopped and "waiting" in stopped)
    pass_shares = [num(a.get("waiting_share")) for a in (passing or {}).get("attempts", [])]
    pass_share = max((x for x in pass_shares if x is not None), default=0.0)
    queued_all = bool(attempts) and all(s is not None and s >= max(QUEUED_SHARE, pass_share + QUEUED_SHARE / 2)
                                        for s in shares)  # fmt: skip
    sustain = next((c for c in at.get("checks", []) if c.get("key") == "sustained"), None)
    not_sustained = bool(sustain and sustain.get("verdict") == "fail")
    ev: MechanismEvidence = {"probe_rate": at["rate"], "binding": at.get("binding"), "preemptions": preempted,
                          "preemptions_by_attempt": per_attempt, "waiting_max": waiting,
                          "waiting_share_by_attempt": shares, "stopped_early": stopped,
                          "sustained": (sustain or {}).get("reason")}  # fmt: skip
    if base is not None:
        low, high = base.get("p99", {}), at.get("p99", {})
        ev["from_rate"] = base["rate"]
        ev["ttft_p99_growth"] = _growth(low.get("ttft"), high.get("ttft"))
        ev["gap_p99_growth"] = _growth(low.get("gap"), high.get("gap"))
        ev["total_p99_growth"] = _growth(low.get("total"), high.get("total"))
    att = None
    if len(records) and "run_dir" in records.columns and attempts:
        stage = records.loc[records["run_dir"].astype(str) == str(attempts[0]["dir"])]
        if len(stage):
            att = prefill_attribution(stage)
    ev["prefill_attribution"] = att
    share, chance = (att["share"], att["share_by_chance"] or 0.0) if att else (None, 0.0)
    prefill = share is not None and share >= 0.5 and share >= 3 * chance
    tg, gg = ev.get("ttft_p99_growth"), ev.get("gap_p99_growth")
    admission = (
        queued_all
        or queue_stop
        or not_sustained
        or (tg is not None and tg >= OVERLOAD_TTFT_GROWTH and (gg or 0) < FLAT_GAP_RATIO * TTFT_FLAT_GROWTH)
    )
    gaps_grew = gg is not None and gg >= GAP_GROWTH and (tg or 0) < OVERLOAD_TTFT_GROWTH
    binding = str(at.get("binding") or "")
    parts = []
    if preempted > 0:
        then = ""
        if passing is not None and at_pass is not None:
            then = (f" ({at_pass * 1000:.1f} per 1000 requests at the passing {rate_text(passing['rate'])} req/s, "
                    f"{(at_fail or 0) * 1000:.1f} here)")  # fmt: skip
        parts.append(f"vllm:num_preemptions_total rose by {' / '.join(f'{x:g}' for x in per_attempt)} "
                     f"in the {len(attempts)} attempt(s){then}")  # fmt: skip
    if waiting > 0:
        shown = " / ".join("?" if s is None else f"{s:.0%}" for s in shares)
        then = f"; {pass_share:.0%} at the passing {rate_text(passing['rate'])} req/s" if passing is not None else ""
        parts.append(f"the waiting queue reached {waiting:g} (non-empty in {shown} of the samples per attempt{then})")
    if not_sustained:
        parts.append(f"not sustained: {sustain.get('reason')}")  # type: ignore[union-attr]
    if stopped:
        parts.append(f"the probe was stopped early ({stopped})")
    lag = max((num(a.get("schedule_lag_p99")) or 0 for a in attempts), default=0)
    ev["schedule_lag_p99"] = lag
    if lag > LAG_WARN_MS:
        parts.append(f"caution: the load generator fell behind (schedule lag p99 {lag:.0f} ms), so part of "
                     "the TTFT from the intended send is the client's")  # fmt: skip
    if tg is not None and gg is not None:
        parts.append(f"from {rate_text(ev['from_rate'])} to {rate_text(at['rate'])} req/s TTFT p99 grew ×{tg:g} and "
                     f"worst-gap p99 ×{gg:g}")  # fmt: skip
    if att and att.get("share") is not None:
        parts.append(f"{att['worst_gap_inside_big_prefill']} of {att['streams_live_during_big_prefill']} streams "
                     f"had their worst gap inside another request's ≥{att['big_prompt_min_tokens']}-token prefill "
                     f"({att['share']:.0%}; chance {att.get('share_by_chance') or 0:.0%})")  # fmt: skip
    if preempts_all:
        name = "preemption"
    elif binding.startswith("gap"):
        fallback = "admission queueing" if admission else "unattributed"
        name = "prefill insertion" if (prefill or gaps_grew) else fallback
    elif binding.startswith(("ttft", "total", "errors", "sustained")):
        name = "admission queueing" if admission else ("prefill insertion" if prefill else "unattributed")
    else:
        name = "unattributed"
    how = "was exceeded" if at.get("verdict") == "fail" else "could not be shown to hold"
    text = f"at {rate_text(at['rate'])} req/s the {binding or 'SLO'} limit {how}: " + (
        "; ".join(parts) or "no evidence"
    )
    return {"mechanism": name, "text": text, "evidence": ev}


# ---------------------------------------------------------------------------------------------- table


__all__ = ["LAG_WARN_MS", "METRICS", "mechanism", "num", "probe_at", "rate_text"]
