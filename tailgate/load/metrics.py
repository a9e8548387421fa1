"""Direct reads of the server's Prometheus ``/metrics`` text.

The load path brackets every stage with two reads of ``vllm:num_preemptions_total`` (the
reference harness's method) and, when asked, samples a few gauges once a second from a
separate process, so that parsing a large exposition never stalls the arrival loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

from tailgate.optiondecl import add_option

#: snapshot field -> exposed series names (current first, older spellings after)
SERIES: dict[str, tuple[str, ...]] = {
    "preemptions_total": ("vllm:num_preemptions_total",),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    # V1 counts prefix-cache lookups and hits in tokens; before 0.10 they were called gpu_prefix_cache_*
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}
ITL_HISTOGRAMS: tuple[str, ...] = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
"""The engine's own histogram of the gaps between a stream's tokens (current spelling first)."""
SLOW_GAP_S = 0.25
"""A gap this long is a pause a user sees. The histogram counts gaps above its bucket edges only, so the
first edge at or above this is used (0.3 s on vLLM's buckets, which jump from 0.2 to 0.3) and named."""
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""An info gauge whose labels carry the engine's cache configuration, ``enable_prefix_caching`` among them."""


@dataclass(slots=True)
class Snapshot:
    t: float
    preemptions_total: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_caching: bool | None = None
    """The server's ``enable_prefix_caching`` as its cache-config info gauge states it; None: not exposed."""
    kv_capacity_tokens: int | None = None
    """Tokens the KV-cache pool holds, from the cache-config info gauge (``kv_cache_size_tokens``, or
    ``num_gpu_blocks`` times ``block_size``); None: not exposed. What the fitted step loop admits and preempts by."""
    itl_count: float | None = None
    """Inter-token gaps the engine has observed (its histogram's count)."""
    itl_slow: float | None = None
    """Of them, those longer than :attr:`itl_slow_edge_s`."""
    itl_slow_edge_s: float | None = None


def parse_exposition(text: str, t: float | None = None) -> Snapshot:
    """Sum each wanted series over its labels (``engine``, ``model_name``).

    Exact-name matching matters: a counter also exposes ``…_created``, which is a timestamp.
    """
    wanted = {name: field for field, names in SERIES.items() for name in names}
    buckets = {name + "_bucket": name for name in ITL_HISTOGRAMS}
    sums: dict[str, float] = {}
    itl: dict[str, dict[float, float]] = {}
    caching: bool | None = None
    kv_tokens: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        if line.startswith(tuple(b + "{" for b in buckets)):
            _add_bucket(itl.setdefault(buckets[line[: line.find("{")]], {}), line)
            continue
        if line.startswith(CACHE_CONFIG_INFO + "{"):
            found = _label(line, "enable_prefix_caching")
            if found is not None:
                caching = found.lower() == "true"
            kv_tokens = kv_pool_tokens(line)
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space else space
        name = line[:end]
        field = wanted.get(name)
        if field is None:
            continue
        rest = line[line.rfind("}") + 1 :] if end == brace else line[end:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        # prefer the current spelling when both are exposed
        key = f"{field}|{SERIES[field].index(name)}"
        sums[key] = sums.get(key, 0.0) + value
    snap = Snapshot(time.time() if t is None else t, prefix_caching=caching, kv_capacity_tokens=kv_tokens)
    for field, names in SERIES.items():
        for i in range(len(names)):
            if f"{field}|{i}" in sums:
                setattr(snap, field, sums[f"{field}|{i}"])
                break
    family = next((itl[name] for name in ITL_HISTOGRAMS if name in itl), None)
    if family and math.inf in family:
        edges = sorted(e for e in family if SLOW_GAP_S <= e < math.inf)
        if edges:
            snap.itl_count = family[math.inf]
            snap.itl_slow_edge_s = edges[0]
            snap.itl_slow = family[math.inf] - family[edges[0]]
    return snap


def _add_bucket(family: dict[float, float], line: str) -> None:
    """One cumulative bucket line, summed over the other labels (engine, model)."""
    le = _label(line, "le")
    try:
        edge = math.inf if le in ("+Inf", "Inf") else float(le or "")
        value = float(line[line.rfind("}") + 1 :].split()[0])
    except (IndexError, ValueError):
        return
    family[edge] = family.get(edge, 0.0) + value


def kv_pool_tokens(line: str) -> int | None:
    """The KV pool's size in tokens from a cache-config info line: vLLM states it directly in recent versions,
    as blocks of a size in older ones; None when neither is there or the blocks are not counted yet."""
    text = _label(line, "kv_cache_size_tokens")
    if text is not None and text.isdigit() and int(text) > 0:
        return int(text)
    blocks, size = _label(line, "num_gpu_blocks"), _label(line, "block_size")
    if blocks is not None and size is not None and blocks.isdigit() and size.isdigit() and int(blocks) > 0:
        return int(blocks) * int(size)
    return None


def _label(line: str, name: str) -> str | None:
    start = line.find(f'{name}="')
    if start < 0:
        return None
    start += len(name) + 2
    end = line.find('"', start)
    return line[start:end] if end >= 0 else None


def scrape(url: str, timeout: float = 5.0) -> Snapshot | None:
    """One read of ``url``; None when the server cannot be read (the caller records that)."""
    t = time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except Exception:
        return None
    return parse_exposition(text, t)


def poll(url: str, out_path: str, interval: float = 1.0) -> None:
    """Append one snapshot per interval to a JSONL file until SIGTERM/SIGINT or its parent is gone.

    A load generator killed with SIGKILL cannot stop its sampler, so the sampler notices it was
    orphaned (its parent pid changed) instead of scraping the server forever.
    """
    stop = False
    parent = os.getppid()

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    next_t = time.monotonic()
    with open(out_path, "a", encoding="utf-8", buffering=1) as f:
        while not stop and os.getppid() == parent:
            snap = scrape(url, timeout=max(0.5, interval))
            if snap is not None:
                f.write(json.dumps(asdict(snap)) + "\n")
            next_t += interval
            time.sleep(max(0.0, next_t - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tailgate.load.metrics", description="sample /metrics to JSONL")
    ap.add_argument("--url", required=True)
    add_option(ap, "out")
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args(argv)
    poll(args.url, args.out, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
