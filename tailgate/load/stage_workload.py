"""What workload produced a stage, as its orders carry it and its summary reports it.

Kept apart from the run coordinator: the prefix cache's share of a stage's prompt tokens and the server's
prompt-token counts against the plan are facts about the workload, not about coordinating processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tailgate.arms import arm
from tailgate.contracts import OrderItem
from tailgate.load.metrics import Snapshot
from tailgate.load.options import Settings
from tailgate.load.plan import Arrival, Stage
from tailgate.load.promptsources import prompt_source
from tailgate.records import RequestRecord


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


@dataclass(frozen=True)
class SlowGaps:
    """The engine's own count of a stage's inter-token gaps longer than its histogram's slow edge: many
    streams' stalls in one pause each count, so this says how much of the stage's tail was the server's."""

    server_slow_gaps_delta: float | None
    """None when the histogram is not exposed or its counter was reset."""
    server_slow_gap_edge_s: float | None


@dataclass(frozen=True)
class StageWorkload:
    """Which workload produced a stage, the prefix cache's share of its prompt tokens, and how far the server's
    prompt token counts were from the plan; named as the stage summary names them."""

    prompts: str
    endpoint: str
    arrivals: str
    prefix_cache_queries_delta: float | None
    prefix_cache_hits_delta: float | None
    prefix_cache_hit_rate: float | None
    prefix_caching: bool | None
    slow: SlowGaps
    prefix_cache_warning: str | None
    """Set only when the seed's repeated filler met a prefix cache: the measured stalls shrink."""
    prompt_tokens_checked: int
    prompt_tokens_exact: int
    prompt_tokens_diff_max: int | None
    prompt_tokens_diff_mean: float | None


def slow_gaps(before: Snapshot | None, after: Snapshot | None) -> SlowGaps:
    """Both reads must see the same slow edge and a counter that did not go backwards, or there is no count."""
    b = None if before is None or after is None or before.itl_slow_edge_s != after.itl_slow_edge_s else before
    slow = None
    if b is not None and after is not None and b.itl_slow is not None and after.itl_slow is not None:
        slow = after.itl_slow - b.itl_slow if after.itl_slow >= b.itl_slow else None
    edge = None if after is None else after.itl_slow_edge_s
    return SlowGaps(server_slow_gaps_delta=slow, server_slow_gap_edge_s=edge if slow is not None else None)


def workload_summary(
    s: Settings, stage: Stage, records: Sequence[RequestRecord], before: Snapshot | None, after: Snapshot | None
) -> StageWorkload:
    """Counter deltas count only across two reads of a counter that did not go backwards (a restart resets it)."""
    q0, q1 = (None if x is None else x.prefix_cache_queries_total for x in (before, after))
    h0, h1 = (None if x is None else x.prefix_cache_hits_total for x in (before, after))
    queries = q1 - q0 if q0 is not None and q1 is not None and q1 >= q0 else None
    hits = h1 - h0 if h0 is not None and h1 is not None and h1 >= h0 else None
    caching = next((x.prefix_caching for x in (before, after) if x is not None and x.prefix_caching is not None), None)
    cached_filler = prompt_source(s.prompts).same_text and (caching or (hits or 0) > 0)
    diffs = [r.prompt_tokens - r.prompt_tokens_planned for r in records if r.prompt_tokens is not None]
    return StageWorkload(
        prompts=s.prompts, endpoint=s.endpoint, arrivals=stage_arrivals(s, stage),
        prefix_cache_queries_delta=queries, prefix_cache_hits_delta=hits,
        prefix_cache_hit_rate=round(hits / queries, 4) if queries and hits is not None else None,
        prefix_caching=caching, slow=slow_gaps(before, after),
        prefix_cache_warning=SEED_CACHE_WARNING if cached_filler else None,
        prompt_tokens_checked=len(diffs), prompt_tokens_exact=sum(1 for d in diffs if d == 0),
        prompt_tokens_diff_max=max((abs(d) for d in diffs), default=None),
        prompt_tokens_diff_mean=round(sum(diffs) / len(diffs), 3) if diffs else None,
    )  # fmt: skip
