"""The question a run asks only when it measured another prompt source on the seed's schedule: do
realistic prompts change the answer? Apart from the five checklist questions because it exists only for
such runs and compares prompt sources, not server configurations.
"""

from __future__ import annotations

import pandas as pd

from tailgate.arms import OPEN_LOOP
from tailgate.serverconfigs import CHUNKED_PAIR

from .cellstats import (
    Cells,
    ci_resolved,
    ci_text,
    compare_cells,
    finite,
    ms_text,
    safe_ratio,
    times_text,
)
from .diagnosistypes import Answer, ChunkedFlip, PromptPair
from .runfolders import rate_text

PROMPT_AB_QUESTION = "Do realistic prompts change the answer? (the same arrival schedule, seed vs other prompts)"


def prompt_ab(table: pd.DataFrame, cells: Cells, resamples: int, seed: int) -> Answer | None:
    """Each cell measured with the seed's prompts and with another source at the same config and rate
    (one seed, so one arrival schedule and one length sequence), compared with the bootstrap intervals
    question 3 uses for chunked prefill on vs off; None when no such pair exists."""
    if "prompts" not in table.columns:
        return None
    d = table.loc[table["arm"].isin(OPEN_LOOP) & ~table["cell"].astype(str).str.contains("~")]
    prompts = d["prompts"].fillna("seed").astype(str)
    pairs = []
    for (config, rate), g in d.groupby(["config", "rate_or_batch"], sort=True):
        gp = prompts.loc[g.index]
        if not (gp == "seed").any():
            continue
        a = g.loc[gp == "seed"].iloc[0]
        for _, b in g.loc[gp != "seed"].iterrows():
            pairs.append((str(config), float(rate), a, b))
    if not pairs:
        return None
    items: list[PromptPair] = []
    lines: list[str] = []
    for config, rate, a, b in pairs:
        boot = compare_cells(cells, a, b, resamples, seed)
        ratio = safe_ratio(b["gap_p99"], a["gap_p99"])
        item: PromptPair = {
            "config": config, "rate": rate, "seed": a["cell"], "other": b["cell"], "other_prompts": b["prompts"],
            "gap_p99": [a["gap_p99"], b["gap_p99"]], "gap_p99_ratio": ratio,
            "ttft_p99": [a["ttft_p99"], b["ttft_p99"]], "ttft_p99_ratio": safe_ratio(b["ttft_p99"], a["ttft_p99"]),
            "prefix_hit_rate": [finite(a.get("prefix_hit_rate")), finite(b.get("prefix_hit_rate"))],
            "bootstrap": boot, "interval": ci_resolved(boot["gap_p99"]),
        }  # fmt: skip
        items.append(item)
        hit = item["prefix_hit_rate"]
        hits = (
            ""
            if hit[0] is None and hit[1] is None
            else (
                " (prefix-cache hit rate " + " vs ".join("n/a" if h is None else f"{100 * h:.0f}%" for h in hit) + ")"
            )
        )
        lines.append(
            f"{config} at {rate_text(rate)} req/s: worst-gap p99 {ms_text(a['gap_p99'])} seed "
            f"vs {ms_text(b['gap_p99'])} {b['prompts']} ({times_text(ratio)}; {ci_text(boot['gap_p99'])}); "
            f"TTFT p99 {times_text(item['ttft_p99_ratio'])} "
            f"({ci_text(boot['ttft_p99'])}){hits}."
        )
    resolved = [i for i in items if i["interval"]]
    if resolved:
        verdict = "yes: " + "; ".join(
            f"{i['config']} {rate_text(i['rate'])} req/s worst-gap p99 ×{i['gap_p99_ratio']:.2f} with "
            f"{i['other_prompts']} prompts" for i in resolved)  # fmt: skip
    elif any(i["interval"] is None for i in items):
        verdict = "not enough data: at least one pair has no interval (too few requests per cell)"
    else:
        verdict = "no difference resolved: every interval of the worst-gap p99 difference includes 0"
    # does chunked on/off keep its direction under the other prompts?
    by = {(i["config"], i["rate"]): i for i in items}
    flips: list[ChunkedFlip] = []
    on, off = CHUNKED_PAIR
    for (config, rate), i in by.items():
        if config == on.name and (off.name, rate) in by:
            j = by[off.name, rate]
            seed_r, other_r = safe_ratio(j["gap_p99"][0], i["gap_p99"][0]), safe_ratio(j["gap_p99"][1], i["gap_p99"][1])
            flips.append({"rate": rate, "off_on_seed": seed_r, "off_on_other": other_r})
            lines.append(f"Chunked off/on worst-gap p99 at {rate_text(rate)} req/s: "
                         f"{times_text(seed_r)} with seed prompts, "
                         f"{times_text(other_r)} with {i['other_prompts']} prompts.")  # fmt: skip
    return Answer({"pairs": items, "chunked_off_on": flips}, verdict, lines)
