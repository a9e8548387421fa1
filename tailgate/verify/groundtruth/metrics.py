"""vLLM's metric names in the Prometheus text format, from the ground-truth server's counts (``GET /metrics``)."""

from __future__ import annotations

from typing import Protocol

from .bodies import PREFIX_BLOCK_TOKENS
from .engine import Engine
from .settings import Settings
from .stream import Stream


class Counted(Protocol):
    """What the metrics are read from (the ``GroundTruthServer``)."""

    settings: Settings
    engine: Engine | None
    active: set[Stream]
    running: int
    waiting: int
    generation_tokens_done: int
    prompt_tokens_total: int
    requests_total: int
    prefix_queries: int
    prefix_hits: int
    started_wall: float


def metrics_text(server: Counted) -> str:
    """vLLM's metric names in the Prometheus text format, as prometheus_client renders them.

    Counters come with their ``_created`` series in a separate gauge family, as vLLM serves them,
    so a scraper that matches on prefixes is caught mistaking one for the other.
    """
    labels = f'{{engine="0",model_name="{_escape_label(server.settings.model)}"}}'
    generated = server.generation_tokens_done + sum(s.k for s in server.active)
    kv = sum(s.kv_tokens for s in server.active) / server.settings.kv_capacity_tokens
    out: list[str] = []

    def counter(name: str, help_text: str, value: float) -> None:
        out.append(f"# HELP vllm:{name}_total {help_text}")
        out.append(f"# TYPE vllm:{name}_total counter")
        out.append(f"vllm:{name}_total{labels} {float(value)!r}")
        out.append(f"# HELP vllm:{name}_created {help_text}")
        out.append(f"# TYPE vllm:{name}_created gauge")
        out.append(f"vllm:{name}_created{labels} {server.started_wall!r}")

    def gauge(name: str, help_text: str, value: float) -> None:
        out.append(f"# HELP vllm:{name} {help_text}")
        out.append(f"# TYPE vllm:{name} gauge")
        out.append(f"vllm:{name}{labels} {float(value)!r}")

    running, waiting, preemptions = server.running, server.waiting, server.settings.preemptions_total
    engine = server.engine
    pool = server.settings.kv_capacity_tokens
    if engine is not None:
        # the fixed-schedule streams (non-streaming requests) count beside the engine's own
        in_engine = {id(r.owner) for r in engine.running} | {id(r.owner) for r in engine.waiting}
        fixed = [st for st in server.active if id(st) not in in_engine]
        running = len(engine.running) + sum(1 for st in fixed if st.running)
        waiting = len(engine.waiting) + sum(1 for st in fixed if not st.running)
        preemptions += engine.preemptions
        pool = engine.model.kv_capacity_tokens or server.settings.kv_capacity_tokens
        kv = engine.kv_used() / pool
    gauge("num_requests_running", "Number of requests in model execution batches.", running)
    gauge("num_requests_waiting", "Number of requests waiting to be processed.", waiting)
    gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", min(kv, 1.0))
    counter("num_preemptions", "Cumulative number of preemption from the engine.", preemptions)
    counter("prompt_tokens", "Number of prefill tokens processed.", server.prompt_tokens_total)
    counter("generation_tokens", "Number of generation tokens processed.", generated)
    counter("request_success", "Count of successfully processed requests.", server.requests_total)
    queries = server.prefix_queries
    counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", queries)
    counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", server.prefix_hits)
    out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
    out.append("# TYPE vllm:cache_config_info gauge")
    out.append(f'vllm:cache_config_info{{block_size="{PREFIX_BLOCK_TOKENS}",'
               f'enable_prefix_caching="{server.settings.prefix_caching}",engine="0",'
               f'kv_cache_size_tokens="{pool}"}} 1.0')  # fmt: skip
    return "\n".join(out) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
