"""The answers about the engine's memory and the workload: preemption (question 4) and the trace's mix (5).

A module of their own, apart from the scheduling answers, because they read other evidence: question 4 the
server's preemption counter and its time series, placed against the requests in flight, and question 5 the
run's trace metadata; neither compares latencies between cells.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from tailgate.jsontypes import JsonMapping, json_int
from tailgate.resultfiles import RUN_META

from .cellstats import Cells, finite
from .diagnosistypes import Answer, CellPreemptions, MixEvidence, PreemptionEvidence
from .timeline import increment_windows, overlaps

STALL_FACTOR = 2.0
"""A worst gap this many times its stage's median worst gap counts as a stall (question 4)."""
MAX_LISTED = 100


def _worst_first(ids: np.ndarray, gap: np.ndarray, mask: np.ndarray) -> tuple[list[int], list[float]]:
    """Trace ids and worst gaps of the selected requests, largest gap first, capped for display."""
    order = np.argsort(-gap[mask])
    return (
        [int(i) for i in ids[mask][order][:MAX_LISTED]],
        [round(float(g), 1) for g in gap[mask][order][:MAX_LISTED]],
    )


def preemption_answer(table: pd.DataFrame, cells: Cells, series: pd.DataFrame | None) -> Answer:
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


def mix_answer(records: pd.DataFrame, run_meta: Mapping[str, JsonMapping] | None, cells: Cells) -> Answer:
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
