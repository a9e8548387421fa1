"""The answers about the server's scheduling: admission (question 1), prefill insertion (2) and chunked prefill (3).

A module of their own because these three read the cells the same way, comparing latencies across a ramp or
between two configurations, and the SLO report's mechanism (:mod:`.slomechanism`) judges by their thresholds
without asking the whole checklist.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tailgate.arms import STARTS_TOGETHER
from tailgate.serverconfigs import CHUNKED_PAIR, DEFAULT

from .cellstats import (
    MIN_N_P99_CI,
    Cells,
    cell_at,
    ci_resolved,
    ci_text,
    compare_cells,
    continuous_cells,
    ms_text,
    safe_ratio,
    span_text,
    times_text,
)
from .diagnosistypes import (
    AdmissionEvidence,
    AdmissionRamp,
    Answer,
    ChunkedAtRate,
    ChunkedEvidence,
    GatedVsContinuous,
    PrefillEvidence,
    PrefillRamp,
)
from .pauses import pause_evidence, pause_lines
from .runfolders import rate_text
from .timeline import prefill_attribution

SMALL_RATIO = 1.1
"""Below this p99 ratio an effect is called small whatever its interval says."""
ADMISSION_TTFT_RATIO = 2.0
"""Gated TTFT p50 this many times continuous's is admission delay..."""
FLAT_GAP_RATIO = 1.25
"""...when the gated worst-gap p99 is at most this many times continuous's."""
OVERLOAD_TTFT_GROWTH = 3.0
"""Across the ramp, TTFT p99 growing this much while the gap p99 grows under
:data:`OVERLOAD_FLAT_GAP_GROWTH` means requests queue before their first token."""
OVERLOAD_FLAT_GAP_GROWTH = 1.5
GAP_GROWTH = 2.0
"""Across the ramp, a median worst gap growing this much while TTFT p50 grows under
:data:`TTFT_FLAT_GROWTH` is prefill insertion."""
TTFT_FLAT_GROWTH = 1.5


def admission_answer(table: pd.DataFrame, cells: Cells, rate: float | None, resamples: int, seed: int) -> Answer:
    ev: AdmissionEvidence = {"gated_vs_continuous": [], "ramp": []}
    lines = []
    gated_hit = overload_hit = False
    gated = table.loc[table["arm"].isin(STARTS_TOGETHER) & ~table["cell"].astype(str).str.contains("~")]
    for _, g in gated.iterrows():
        ref = None
        cont = (
            continuous_cells(table, g["config"])
            if len(continuous_cells(table, g["config"]))
            else continuous_cells(table)
        )
        if len(cont):
            if rate is not None and np.isclose(cont["rate_or_batch"].astype(float), rate).any():
                ref = cont.loc[np.isclose(cont["rate_or_batch"].astype(float), rate)].iloc[0]
            else:
                ref = cont.iloc[-1]
        if ref is None:
            continue
        item: GatedVsContinuous = {
            "gated": g["cell"],
            "continuous": ref["cell"],
            "ttft_p50": [g["ttft_p50"], ref["ttft_p50"]],
            "ttft_p99": [g["ttft_p99"], ref["ttft_p99"]],
            "gap_p99": [g["gap_p99"], ref["gap_p99"]],
            "ttft_p50_ratio": safe_ratio(g["ttft_p50"], ref["ttft_p50"]),
            "ttft_p99_ratio": safe_ratio(g["ttft_p99"], ref["ttft_p99"]),
            "gap_p99_ratio": safe_ratio(g["gap_p99"], ref["gap_p99"]),
            "bootstrap": compare_cells(cells, ref, g, resamples, seed),
        }
        ev["gated_vs_continuous"].append(item)
        hit = (item["ttft_p50_ratio"] or 0) >= ADMISSION_TTFT_RATIO and (item["gap_p99_ratio"] or 9) <= FLAT_GAP_RATIO
        gated_hit |= hit
        lines.append(
            f"{g['cell']} vs {ref['cell']}: TTFT p50 {ms_text(g['ttft_p50'])} vs {ms_text(ref['ttft_p50'])} "
            f"({times_text(item['ttft_p50_ratio'])}), TTFT p99 {times_text(item['ttft_p99_ratio'])} "
            f"({ci_text(item['bootstrap']['ttft_p99'])}), worst-gap p99 {ms_text(g['gap_p99'])} vs "
            f"{ms_text(ref['gap_p99'])} ({times_text(item['gap_p99_ratio'])}; {ci_text(item['bootstrap']['gap_p99'])})."
        )
    for config, d in continuous_cells(table).groupby("config", sort=False):
        if len(d) < 2:
            continue
        lo, hi = d.iloc[0], d.iloc[-1]
        ramp: AdmissionRamp = {
            "config": str(config),
            "from": lo["cell"],
            "to": hi["cell"],
            "ttft_p50_growth": safe_ratio(hi["ttft_p50"], lo["ttft_p50"]),
            "ttft_p99_growth": safe_ratio(hi["ttft_p99"], lo["ttft_p99"]),
            "gap_p99_growth": safe_ratio(hi["gap_p99"], lo["gap_p99"]),
            "ttft_from_intended_p99": [lo.get("ttft_from_intended_p99"), hi.get("ttft_from_intended_p99")],
        }
        ev["ramp"].append(ramp)
        overload = (ramp["ttft_p99_growth"] or 0) >= OVERLOAD_TTFT_GROWTH and (
            ramp["gap_p99_growth"] or 9
        ) < OVERLOAD_FLAT_GAP_GROWTH
        overload_hit |= overload
        lines.append(
            f"{config} ramp {span_text(lo, hi)}: TTFT p50 {times_text(ramp['ttft_p50_growth'])}, TTFT p99 "
            f"{times_text(ramp['ttft_p99_growth'])}, worst-gap p99 {times_text(ramp['gap_p99_growth'])}."
        )
    said = []
    if gated_hit:
        g = next(
            i
            for i in ev["gated_vs_continuous"]
            if (i["ttft_p50_ratio"] or 0) >= ADMISSION_TTFT_RATIO and (i["gap_p99_ratio"] or 9) <= FLAT_GAP_RATIO
        )
        said.append(f"{g['gated']} TTFT p50 {times_text(g['ttft_p50_ratio'])} {g['continuous']}'s, worst-gap p99 "
                    f"{times_text(g['gap_p99_ratio'])}")  # fmt: skip
    if overload_hit:
        r = next(i for i in ev["ramp"] if (i["ttft_p99_growth"] or 0) >= OVERLOAD_TTFT_GROWTH
                 and (i["gap_p99_growth"] or 9) < OVERLOAD_FLAT_GAP_GROWTH)  # fmt: skip
        said.append(
            f"{r['config']} ramp TTFT p99 {times_text(r['ttft_p99_growth'])}, "
            f"worst-gap p99 {times_text(r['gap_p99_growth'])}"
        )
    if said:
        verdict = (
            "yes: "
            + "; ".join(said)
            + (
                f" (thresholds: TTFT ≥ {ADMISSION_TTFT_RATIO:g}× gated or ≥ {OVERLOAD_TTFT_GROWTH:g}× over the ramp, "
                f"gap ≤ {FLAT_GAP_RATIO:g}× / < {OVERLOAD_FLAT_GAP_GROWTH:g}×)"
            )
        )
    elif not ev["gated_vs_continuous"] and not ev["ramp"]:
        verdict = "unknown: no gated cell and no rate ramp to compare"
    else:
        seen = [f"gated TTFT p50 was {times_text(i['ttft_p50_ratio'])} continuous's" for i in ev["gated_vs_continuous"]]
        seen += [f"over the {i['config']} ramp TTFT p99 grew {times_text(i['ttft_p99_growth'])} and the worst-gap p99 "
                 f"{times_text(i['gap_p99_growth'])}" for i in ev["ramp"]]  # fmt: skip
        verdict = (f"no: {'; '.join(seen)}. Admission delay needs TTFT ≥ {ADMISSION_TTFT_RATIO:g}× continuous's "
                   f"(gated) or ≥ {OVERLOAD_TTFT_GROWTH:g}× over the ramp, with flat gaps")  # fmt: skip
    return Answer(ev, verdict, lines)


def prefill_answer(table: pd.DataFrame, cells: Cells, rate: float | None) -> Answer:
    ev: PrefillEvidence = {"ramp": [], "attribution": None}
    lines = []
    hit = False
    for config, d in continuous_cells(table).groupby("config", sort=False):
        if len(d) < 2:
            continue
        lo, hi = d.iloc[0], d.iloc[-1]
        item: PrefillRamp = {
            "config": str(config),
            "from": lo["cell"],
            "to": hi["cell"],
            "gap_p50": [lo["gap_p50"], hi["gap_p50"]],
            "gap_p99": [lo["gap_p99"], hi["gap_p99"]],
            "ttft_p50": [lo["ttft_p50"], hi["ttft_p50"]],
            "gap_p50_growth": safe_ratio(hi["gap_p50"], lo["gap_p50"]),
            "gap_p99_growth": safe_ratio(hi["gap_p99"], lo["gap_p99"]),
            "ttft_p50_growth": safe_ratio(hi["ttft_p50"], lo["ttft_p50"]),
        }
        ev["ramp"].append(item)
        gap_grew = (item["gap_p50_growth"] or 0) >= GAP_GROWTH
        hit |= gap_grew and (item["ttft_p50_growth"] or 9) < TTFT_FLAT_GROWTH
        lines.append(
            f"{config} ramp {span_text(lo, hi)}: worst-gap p50 {ms_text(lo['gap_p50'])}→{ms_text(hi['gap_p50'])} "
            f"({times_text(item['gap_p50_growth'])}) while TTFT p50 "
            f"{ms_text(lo['ttft_p50'])}→{ms_text(hi['ttft_p50'])} "
            f"({times_text(item['ttft_p50_growth'])})."
        )
    row = cell_at(table, DEFAULT.name, rate) if rate is not None else None
    if row is None and len(continuous_cells(table)):
        row = continuous_cells(table).iloc[-1]
    attributed = False
    att = None
    if row is not None and not cells.records.empty:
        att = prefill_attribution(cells.frame(row))
        if att is not None and att["share"] is not None:
            att["cell"] = row["cell"]
            ev["attribution"] = att
            share, chance = att["share"], att["share_by_chance"] or 0.0
            inside, other = att["median_worst_gap_inside_ms"], att["median_worst_gap_other_ms"]
            shorter = inside is not None and other is not None and inside < other
            att["inside_shorter"] = bool(shorter)
            attributed = share >= 0.5 and share >= 3 * chance and not shorter
            lines.append(
                f"In {row['cell']}, {att['worst_gap_inside_big_prefill']} of "
                f"{att['streams_live_during_big_prefill']} streams that were producing while another "
                f"request's ≥ {att['big_prompt_min_tokens']}-token prompt prefilled had their worst gap "
                f"inside that prefill ({share:.0%}; the share of their lifetime covered by such prefills, "
                f"what chance alone would give, is {chance:.0%})."
            )
            if inside is not None and other is not None:
                lines.append(
                    f"Median worst gap: {ms_text(inside)} for those inside a long prefill, "
                    f"{ms_text(other)} for the rest"
                    + (" — shorter inside, so these prefills did not lengthen the worst gaps they overlapped."
                       if shorter else ".")
                )  # fmt: skip
    ramp = next((i for i in ev["ramp"] if (i["gap_p50_growth"] or 0) >= GAP_GROWTH
                 and (i["ttft_p50_growth"] or 9) < TTFT_FLAT_GROWTH), None)  # fmt: skip
    att = ev["attribution"]
    ramp_text = (f"{ramp['config']} ramp worst-gap p50 {times_text(ramp['gap_p50_growth'])}, TTFT p50 "
                 f"{times_text(ramp['ttft_p50_growth'])}") if ramp else ""  # fmt: skip
    att_text = (f"{att['share']:.0%} of live streams had their worst gap inside a long prefill vs "
                f"{(att['share_by_chance'] or 0):.0%} by chance") if att and attributed else ""  # fmt: skip
    if hit and attributed:
        verdict = f"yes: {ramp_text}; {att_text}"
    elif hit:
        verdict = f"yes: {ramp_text} (thresholds {GAP_GROWTH:g}× and < {TTFT_FLAT_GROWTH:g}×)"
    elif attributed:
        verdict = f"partly: {att_text}, but the worst-gap p50 grew less than {GAP_GROWTH:g}× over the ramp"
    elif not ev["ramp"]:
        verdict = "unknown: no rate ramp to compare"
    else:
        verdict = "no: " + "; ".join(_q2_no(i) for i in ev["ramp"])
        if att and att.get("inside_shorter"):
            verdict += "; worst gaps inside long prefills were shorter than the rest"
    if pause_lines(table):  # the server paused many streams at once: part of what the gaps show
        lines += pause_lines(table)
        ev["server_pauses"] = pause_evidence(table)["server_pauses"]
    return Answer(ev, verdict, lines)


def _q2_no(item: PrefillRamp) -> str:
    """Why one ramp does not show prefill insertion, in the order a reader checks it."""
    head = f"over the {item['config']} ramp the median worst gap grew {times_text(item['gap_p50_growth'])}"
    if item["gap_p50_growth"] is None:
        return f"over the {item['config']} ramp the median worst gaps cannot be compared (a cell has none)"
    if item["gap_p50_growth"] < GAP_GROWTH:
        return f"{head}, under the {GAP_GROWTH:g}× that prefill insertion needs"
    return (f"{head}, but TTFT p50 grew {times_text(item['ttft_p50_growth'])} too (prefill insertion keeps it under "
            f"{TTFT_FLAT_GROWTH:g}×): the first tokens were delayed as well")  # fmt: skip


def chunked_answer(table: pd.DataFrame, cells: Cells, resamples: int, seed: int) -> Answer:
    on_config, off_config = CHUNKED_PAIR
    on = {float(r): row for r, row in continuous_cells(table, on_config.name).set_index("rate_or_batch").iterrows()}
    off = {float(r): row for r, row in continuous_cells(table, off_config.name).set_index("rate_or_batch").iterrows()}
    rates = sorted(set(on) & set(off))
    ev: ChunkedEvidence = {"by_rate": []}
    lines = []
    clear: list[ChunkedAtRate] = []
    for r in rates:
        a, b = on[r].copy(), off[r].copy()
        a["rate_or_batch"] = b["rate_or_batch"] = r
        ratio = safe_ratio(b["gap_p99"], a["gap_p99"])
        boot = compare_cells(cells, a, b, resamples, seed)
        gap = boot["gap_p99"]
        resolved = ci_resolved(gap)
        small = ratio is None or ratio < SMALL_RATIO or resolved is False
        item: ChunkedAtRate = {
            "rate": r,
            "chunked": a["cell"],
            "nochunk": b["cell"],
            "gap_p99": [a["gap_p99"], b["gap_p99"]],
            "gap_p99_ratio": ratio,
            "ttft_p99": [a["ttft_p99"], b["ttft_p99"]],
            "ttft_p99_ratio": safe_ratio(b["ttft_p99"], a["ttft_p99"]),
            "bootstrap": boot,
            "small": bool(small),
            "interval": resolved,
        }
        ev["by_rate"].append(item)
        if not small:
            clear.append(item)
        why = ""
        if small:
            why = " — not counted: " + (
                f"the ratio is under {SMALL_RATIO:g}"
                if ratio is not None and ratio < SMALL_RATIO
                else "the interval includes 0"
            )
        lines.append(
            f"{rate_text(r)} req/s: worst-gap p99 {ms_text(a['gap_p99'])} on vs {ms_text(b['gap_p99'])} off "
            f"({times_text(ratio)}; {ci_text(gap)}){why}; TTFT p99 {times_text(item['ttft_p99_ratio'])} "
            f"({ci_text(boot['ttft_p99'])})."
        )
    if not rates:
        verdict = "not measured: no rate has both chunked prefill on and off"
    elif clear:

        def one(i: ChunkedAtRate) -> str:
            g = i["bootstrap"]["gap_p99"]
            if i["interval"] and g and "why_no_ci" not in g:
                return (f"{i['gap_p99_ratio']:.2f}× at {rate_text(i['rate'])} req/s (95% CI of the difference "
                        f"[{g['ci_low']:+.1f}, {g['ci_high']:+.1f}] ms)")  # fmt: skip
            n_a, n_b = (g["n_a"], g["n_b"]) if g else (None, None)
            return f"{i['gap_p99_ratio']:.2f}× at {rate_text(i['rate'])} req/s (n = {n_a}, {n_b})"

        lead = (
            "yes"
            if any(i["interval"] for i in clear)
            else (f"yes by the point values only (fewer than {MIN_N_P99_CI} requests per cell: no interval)")
        )
        verdict = f"{lead}: chunked prefill off multiplies the worst-gap p99 by " + "; ".join(one(i) for i in clear)
        if len(clear) < len(rates):
            verdict += "; not at " + ", ".join(rate_text(i["rate"]) for i in ev["by_rate"] if i["small"]) + " req/s"
    else:
        ratios = ", ".join(f"{times_text(i['gap_p99_ratio'])} at {rate_text(i['rate'])} req/s" for i in ev["by_rate"])
        verdict = (f"no difference resolved: worst-gap p99 off/on {ratios} (under {SMALL_RATIO:g}× or an "
                   "interval that includes 0)")  # fmt: skip
    return Answer(ev, verdict, lines)
