"""The seed's five-question checklist, answered from the data with the numbers behind each answer.

Each answer is a dict: ``number``, ``question``, ``verdict`` (one short line), ``evidence`` (the
numbers, JSON-ready) and ``text`` (a paragraph). Where two configurations are compared, the p99
difference carries a seeded 95% bootstrap interval, because a p99 of a few hundred requests
rests on a handful of them and a difference that the interval straddles is not a finding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tailgate.arms import STARTS_TOGETHER
from tailgate.jsontypes import JsonMapping, json_int
from tailgate.resultfiles import RUN_META
from tailgate.serverconfigs import CHUNKED_PAIR, DEFAULT

from .bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED
from .cellstats import (
    MIN_N_P99_CI,
    Cells,
    cell_at,
    ci_resolved,
    ci_text,
    compare_cells,
    continuous_cells,
    finite,
    ms_text,
    safe_ratio,
    span_text,
    times_text,
)
from .diagnosistypes import (
    AdmissionEvidence,
    AdmissionRamp,
    Answer,
    CellPreemptions,
    ChunkedAtRate,
    ChunkedEvidence,
    Finding,
    GatedVsContinuous,
    MixEvidence,
    PreemptionEvidence,
    PrefillEvidence,
    PrefillRamp,
    evidence_json,
)
from .pauses import pause_evidence, pause_lines
from .prompt_ab import PROMPT_AB_QUESTION, prompt_ab
from .runfolders import rate_text
from .table import choose_decision_rate, summary_table
from .tableview import IN_SHORT, NOT_A_MEASUREMENT, cell_marks, not_measured
from .timeline import increment_windows, overlaps, prefill_attribution

QUESTIONS: tuple[str, ...] = (
    "Did TTFT explode while the gaps stayed flat? (admission: gated, or overloaded before the first token)",
    "Did the gaps explode while median TTFT looks fine? (prefill insertion)",
    "Does turning chunked prefill off widen the gap p99, and by how much?",
    "Did vllm:num_preemptions_total move, and which requests stalled across the increments?",
    "Is the trace mixed-length?",
)
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
STALL_FACTOR = 2.0
"""A worst gap this many times its stage's median worst gap counts as a stall (question 4)."""
MAX_LISTED = 100
LATENCY_QUESTIONS = frozenset({1, 2, 3, 6})
"""Answers built on cells' latencies: a cell marked not a measurement or partial weakens them (not 4's counter)."""


# ---------------------------------------------------------------------------------------------
# the five questions


def _q1_admission(table: pd.DataFrame, cells: Cells, rate: float | None, resamples: int, seed: int) -> Answer:
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


def _q2_prefill(table: pd.DataFrame, cells: Cells, rate: float | None) -> Answer:
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


def _q3_chunked(table: pd.DataFrame, cells: Cells, resamples: int, seed: int) -> Answer:
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


def _worst_first(ids: np.ndarray, gap: np.ndarray, mask: np.ndarray) -> tuple[list[int], list[float]]:
    """Trace ids and worst gaps of the selected requests, largest gap first, capped for display."""
    order = np.argsort(-gap[mask])
    return (
        [int(i) for i in ids[mask][order][:MAX_LISTED]],
        [round(float(g), 1) for g in gap[mask][order][:MAX_LISTED]],
    )


def _q4_preemption(table: pd.DataFrame, cells: Cells, series: pd.DataFrame | None) -> Answer:
    ev: PreemptionEvidence = {"cells": []}
    lines = []
    moved_any, unknown_all = False, True
    for _, row in table.iterrows():
        prom, direct = finite(row.get("preemptions_prometheus")), finite(row.get("preemptions_direct"))
        value = prom if prom is not None else direct
        item: CellPreemptions = {
            "cell": row["cell"],
            "prometheus": prom,
            "direct": direct,
            "source": row.get("preemptions_source"),
            "disagree": bool(row.get("preemptions_disagree") or False),
            "moved": None if value is None else value > 0,
        }
        if value is not None:
            unknown_all = False
        if value is not None and value > 0:
            moved_any = True
            start, end = finite(row.get("window_start_s")), finite(row.get("window_end_s"))
            stage = cells.frame(row, measured=False) if not cells.records.empty else None
            windows = (
                increment_windows(series, str(row["run_dir"]), start, end)
                if series is not None and start is not None and end is not None
                else np.empty((0, 3))
            )
            item["increments_seen"] = int(windows[:, 2].sum()) if windows.size else 0
            if stage is not None and len(stage) and windows.size:
                sent = stage["sent_s"].to_numpy(dtype=float)
                done = stage["end_s"].to_numpy(dtype=float)
                gap = stage["worst_gap_ms"].to_numpy(dtype=float)
                g_end = stage["worst_gap_end_s"].to_numpy(dtype=float)
                in_flight = overlaps(sent, done, windows[:, :2])
                med = float(np.nanmedian(gap)) if np.isfinite(gap).any() else float("nan")
                big = in_flight & np.isfinite(gap) & (gap >= STALL_FACTOR * med)
                # stricter: the worst gap itself spans an interval in which the counter rose
                across = big & overlaps(g_end - gap / 1000.0, g_end, windows[:, :2])
                tids = stage["trace_id"].to_numpy()
                big_ids, big_gaps = _worst_first(tids, gap, big)
                across_ids, across_gaps = _worst_first(tids, gap, across)
                threshold = round(STALL_FACTOR * med, 1) if np.isfinite(med) else None
                item["requests_in_flight_during_increments"] = int(in_flight.sum())
                item["stall_threshold_ms"] = threshold
                item["requests_stalled_during_increments"] = int(big.sum())
                item["stalled_trace_ids"] = big_ids
                item["stalled_worst_gap_ms"] = big_gaps
                item["requests_whose_worst_gap_spans_an_increment"] = int(across.sum())
                item["spanning_trace_ids"] = across_ids
                item["spanning_worst_gap_ms"] = across_gaps
                shown = ", ".join(str(i) for i in across_ids[:20])
                more = " …" if across.sum() > 20 else ""
                lines.append(
                    f"{row['cell']}: counter +{value:g} ({item['source']}); {int(in_flight.sum())} requests "
                    f"were in flight while it rose, {int(big.sum())} of them with a worst gap ≥ "
                    f"{threshold} ms ({STALL_FACTOR:g}× the stage median), and for "
                    f"{int(across.sum())} that worst gap spans an increment: trace ids "
                    f"{shown or 'none'}{more}."
                )
            else:
                lines.append(
                    f"{row['cell']}: counter +{value:g} ({item['source']}); no server series to place the "
                    "increments in time, so stalled requests cannot be named."
                )
        if item["disagree"]:
            lines.append(f"{row['cell']}: Prometheus says {prom:g} but the direct reads say {direct:g}.")
        ev["cells"].append(item)
    zero = [i["cell"] for i in ev["cells"] if i["moved"] is False]
    if zero:
        lines.append("Counter flat (0) in: " + ", ".join(zero) + ".")
    unknown = [i["cell"] for i in ev["cells"] if i["moved"] is None]
    if unknown:
        lines.append("No counter reading for: " + ", ".join(unknown) + ".")
    if moved_any:
        moved = [
            f"{i['cell']} (+{(i['prometheus'] if i['prometheus'] is not None else i['direct']):g})"
            for i in ev["cells"]
            if i["moved"]
        ]
        verdict = (
            "yes: the counter rose in "
            + ", ".join(moved)
            + "; preemption is fixed with KV headroom or max_num_seqs, not batching"
        )
    elif unknown_all:
        verdict = "unknown: no preemption counter reading (neither Prometheus nor direct /metrics reads)"
    else:
        verdict = "no: the preemption counter never moved"
    return Answer(ev, verdict, lines)


def _q5_mix(records: pd.DataFrame, run_meta: Mapping[str, JsonMapping] | None, cells: Cells) -> Answer:
    ev: MixEvidence = {"runs": {}}
    mixes = []
    for name, meta in (run_meta or {}).items():
        trace = meta.get("trace") if isinstance(meta, Mapping) else None
        mix = trace.get("mix") if isinstance(trace, Mapping) else None
        if isinstance(trace, Mapping) and isinstance(mix, Mapping) and mix:
            counts = {str(k): json_int(mix, k, where=f"{name} {RUN_META} trace.mix") for k in mix}
            ev["runs"][name] = {"mix": counts, "from": RUN_META, "seed": trace.get("seed")}
            mixes.append(dict(counts))
    source = RUN_META
    if not mixes and not cells.measured.empty:
        counts = cells.measured.groupby(["prompt_tokens_planned", "max_tokens"]).size()
        mix = {f"{int(p)}→{int(o)}": int(n) for (p, o), n in counts.items()}
        ev["runs"]["records"] = {"mix": mix, "from": "records (measured requests)"}
        mixes.append(mix)
        source = "records"
    if not mixes:
        return Answer(ev, "unknown: no trace metadata and no records", [])
    total: dict[str, int] = {}
    for m in mixes:
        for k, v in m.items():
            total[k] = total.get(k, 0) + v
    prompts = sorted({int(k.split("→")[0]) for k in total})
    n = sum(total.values())
    shares = ", ".join(f"{k} {v / n:.0%}" for k, v in sorted(total.items(), key=lambda kv: int(kv[0].split("→")[0])))
    ev["prompt_classes"] = prompts
    ev["combined"] = total
    distinct = len({tuple(sorted(m.items())) for m in mixes})
    line = f"Prompt→max-token classes ({source}, all runs): {shares}."
    if len(mixes) > 1:
        line += " " + ("Every run used the same mix." if distinct == 1 else f"{distinct} different mixes across runs.")
    if len(prompts) >= 2 and prompts[-1] >= 5 * prompts[0]:
        verdict = f"yes: mixed-length ({len(prompts)} prompt classes, {prompts[0]}–{prompts[-1]} tokens)"
    elif len(prompts) >= 2:
        span = f"{prompts[0]}–{prompts[-1]}"
        verdict = f"narrowly: prompt lengths {span} tokens may be too close to expose prefill stalls"
    else:
        verdict = "no: one prompt length; a homogeneous trace hides both mechanisms"
    return Answer(ev, verdict, [line])


def diagnose(
    summaries: pd.DataFrame,
    records: pd.DataFrame,
    series: pd.DataFrame | None = None,
    *,
    preemptions: pd.DataFrame | None = None,
    run_meta: Mapping[str, JsonMapping] | None = None,
    decision_rate: float | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[Finding]:
    """Answer the five checklist questions; one dict per question, in the seed's order."""
    table = summary_table(summaries, preemptions)
    for col in ("window_start_s", "window_end_s"):
        table[col] = summaries[col].to_numpy() if col in summaries.columns else np.nan
    rate = choose_decision_rate(table, decision_rate)
    answers = _answers(table, Cells(table, records, summaries), rate, records, run_meta, series, resamples, seed)
    marked = {str(r["cell"]): cell_marks(r) for r in table.to_dict("records") if not_measured(r)}
    unmeasured = [c for c, marks in marked.items() if NOT_A_MEASUREMENT in marks]
    without: dict[str, Answer] | None = None  # the answers with those cells left out, when one needs them
    out = []
    for i, (q, p) in enumerate(answers.items(), 1):
        ev = evidence_json(p.evidence)
        said = json.dumps(ev)
        used = [c for c in marked if i in LATENCY_QUESTIONS and json.dumps(c) in said]
        named = [f"{c} is {m} ({IN_SHORT[m]})" for c in used for m in marked[c] if m in IN_SHORT]
        if i in (1, 3, 6):
            ev["bootstrap"] = {"resamples": resamples, "seed": seed, "level": 0.95, "percentile": 99}
        if i == 2 and rate is not None:
            ev["decision_rate"] = rate
        finding: Finding = {
            "number": i,
            "question": q,
            "verdict": p.verdict,
            "evidence": ev,
            "text": " ".join(p.lines),
            "caveat": f"Read with care: {'; '.join(named)}." if named else "",
        }
        rests_on = [c for c in used if c in unmeasured]
        if rests_on:
            if without is None:
                kept = table.loc[~table["cell"].astype(str).isin(unmeasured)].reset_index(drop=True)
                cells = Cells(kept, records, summaries)
                without = _answers(kept, cells, rate, records, run_meta, series, resamples, seed)
            alt = without.get(q)
            finding["without_unmeasured"] = {"cells": unmeasured, "verdict": alt.verdict if alt else None}
            finding["caveat"] += " " + _without_text(unmeasured, p.verdict, alt.verdict if alt else None)
        out.append(finding)
    return out


def _answers(
    table: pd.DataFrame,
    cells: Cells,
    rate: float | None,
    records: pd.DataFrame,
    run_meta: Mapping[str, JsonMapping] | None,
    series: pd.DataFrame | None,
    resamples: int,
    seed: int,
) -> dict[str, Answer]:
    """Each question's answer over ``table``, keyed by the question: run once over every cell, and again without
    the cells that are not a measurement, to say what an answer that used one would be without it."""
    parts = [
        _q1_admission(table, cells, rate, resamples, seed),
        _q2_prefill(table, cells, rate),
        _q3_chunked(table, cells, resamples, seed),
        _q4_preemption(table, cells, series),
        _q5_mix(records, run_meta, cells),
    ]
    questions = list(QUESTIONS)
    ab = prompt_ab(table, cells, resamples, seed)
    if ab is not None:  # only when a run measured another prompt source on the same schedule
        questions.append(PROMPT_AB_QUESTION)
        parts.append(ab)
    return dict(zip(questions, parts, strict=True))


NO_ANSWER = ("unknown", "not measured", "not enough data")
"""Verdicts that say the data could not answer."""


def _without_text(cells: Sequence[str], verdict: str, alt: str | None) -> str:
    """What the answer is once the cells that are not a measurement are left out: a reader must not have to
    guess whether the answer stands on a cell the page itself says describes the load generator."""
    who = " and ".join(cells)
    if alt is None or alt.lower().startswith(NO_ANSWER):
        why = f" ({alt.split(':', 1)[1].strip()})" if alt and ":" in alt else ""
        return f"Without {who} there is no answer{why}."
    if alt == verdict:
        return f"Without {who} the answer is the same."
    return f"Without {who}: {alt}."
