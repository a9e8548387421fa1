"""What workload produced a stage, as its orders carry it and its summary reports it.

Kept apart from the run coordinator: the prefix cache's share of a stage's prompt tokens and the server's
prompt-token counts against the plan are facts about the workload, not about coordinating processes.
"""

from __future__ import annotations

from typing import Any

from tailgate.arms import arm
from tailgate.contracts import OrderItem
from tailgate.load.metrics import Snapshot
from tailgate.load.options import Settings
from tailgate.load.plan import Arrival, Stage
from tailgate.load.promptsources import prompt_source


def order_item(a: Arrival) -> OrderItem:
    """One arrival as the order carries it; a built prompt rides along as a sixth element."""
    prompt = None if a.prompt is None else a.prompt.to_order()
    return OrderItem(a.item.id, a.item.prompt_tokens, a.item.max_tokens, a.offset_s, a.batch, prompt)


def stage_arrivals(s: Settings, stage: Stage) -> str:
    """The arrival process of a stage: the option's for the open loop; a gated stage arrives in batches."""
    return s.arrivals if arm(stage.arm).open_loop else "batches"


SEED_CACHE_WARNING = (
    "seed prompts (one filler word repeated) against a server with prefix caching on: "
    "long prompts are largely served from cache, so the prefill stalls this suite measures "
    "shrink; use --prompts unique, or start the server with --no-enable-prefix-caching"
)


def slow_gaps(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """The engine's own count of the stage's inter-token gaps longer than its histogram's slow edge: many
    streams' stalls in one pause each count, so this says how much of the stage's tail was the server's.
    None when the histogram is not exposed or its counter was reset."""
    b = None if before is None or after is None or before.itl_slow_edge_s != after.itl_slow_edge_s else before
    slow = None
    if b is not None and after is not None and b.itl_slow is not None and after.itl_slow is not None:
        slow = after.itl_slow - b.itl_slow if after.itl_slow >= b.itl_slow else None
    edge = None if after is None else after.itl_slow_edge_s
    return {"server_slow_gaps_delta": slow, "server_slow_gap_edge_s": edge if slow is not None else None}


def workload_summary(
    s: Settings, stage: Stage, records: list[dict[str, Any]], before: Snapshot | None, after: Snapshot | None
) -> dict[str, Any]:
    """Which workload produced the stage, the prefix cache's share of its prompt tokens, and how far the
    server's prompt token counts were from the plan."""
    out: dict[str, Any] = {"prompts": s.prompts, "endpoint": s.endpoint, "arrivals": stage_arrivals(s, stage)}
    q0, q1 = (None if x is None else x.prefix_cache_queries_total for x in (before, after))
    h0, h1 = (None if x is None else x.prefix_cache_hits_total for x in (before, after))
    queries = q1 - q0 if q0 is not None and q1 is not None and q1 >= q0 else None
    hits = h1 - h0 if h0 is not None and h1 is not None and h1 >= h0 else None
    out["prefix_cache_queries_delta"] = queries
    out["prefix_cache_hits_delta"] = hits
    out["prefix_cache_hit_rate"] = round(hits / queries, 4) if queries and hits is not None else None
    caching = next((x.prefix_caching for x in (before, after) if x is not None and x.prefix_caching is not None), None)
    out["prefix_caching"] = caching
    out.update(slow_gaps(before, after))
    if prompt_source(s.prompts).same_text and (caching or (hits or 0) > 0):
        out["prefix_cache_warning"] = SEED_CACHE_WARNING
    diffs = [int(r["prompt_tokens"]) - int(r["prompt_tokens_planned"]) for r in records
             if r.get("prompt_tokens") is not None and r.get("prompt_tokens_planned") is not None]  # fmt: skip
    out["prompt_tokens_checked"] = len(diffs)
    out["prompt_tokens_exact"] = sum(1 for d in diffs if d == 0)
    out["prompt_tokens_diff_max"] = max((abs(d) for d in diffs), default=None)
    out["prompt_tokens_diff_mean"] = round(sum(diffs) / len(diffs), 3) if diffs else None
    return out
