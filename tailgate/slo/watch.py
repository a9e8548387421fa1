"""Following a running probe's files: the server's waiting queue and the error records so far, so that the
search can stop a probe the queue or the errors have already decided."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from tailgate.jsonl import Follower
from tailgate.load.metrics import CACHE_CONFIG_INFO, kv_pool_tokens
from tailgate.resultfiles import RECORDS_GLOB, SERVER_METRICS

_NULL_CLASS = re.compile(rb'"error_class":\s*null')


class ProbeWatch:
    """Follows a running probe's files: the server's waiting queue and the error records so far."""

    def __init__(self, out: Path, metrics_url: str | None = None) -> None:
        self.out = out
        self.metrics_url = metrics_url
        self._metrics = Follower(out, SERVER_METRICS)
        self._records = Follower(out, RECORDS_GLOB)
        self.errors = 0
        self.waiting: float | None = None
        self.waiting_max = 0.0
        self.waiting_series: list[float] = []
        """Every sample, in time order: the steady-state check tests it for an upward trend."""
        self.from_file = False
        self.kv_capacity_tokens: int | None = None
        """The server's KV pool in tokens, as its cache-config gauge states it (None: not stated)."""

    def _sample_direct(self) -> None:
        """Read ``vllm:num_requests_waiting`` from the server itself: with a live Prometheus the load generator
        writes no ``server-metrics.jsonl``, and the queue stop must still be able to fire."""
        if not self.metrics_url:
            return
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=1.0) as resp:
                text = resp.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return
        total, seen = 0.0, False
        for line in text.splitlines():
            if line.startswith(CACHE_CONFIG_INFO + "{"):
                self.kv_capacity_tokens = kv_pool_tokens(line) or self.kv_capacity_tokens
            if line.startswith("vllm:num_requests_waiting") and not line.startswith("#"):
                try:
                    total += float(line.rsplit(" ", 1)[1])
                    seen = True
                except ValueError:
                    continue
        if seen:
            self._record(total)

    def _record(self, w: float) -> None:
        self.waiting = w
        self.waiting_max = max(self.waiting_max, w)
        self.waiting_series.append(w)

    def poll(self) -> None:
        samples, _ = self._metrics.new_objects()
        for sample in samples:
            kv = sample.get("kv_capacity_tokens")
            if isinstance(kv, int) and kv > 0:
                self.kv_capacity_tokens = kv
            w = sample.get("waiting")
            if isinstance(w, (int, float)):
                self.from_file = True
                self._record(float(w))
        if not self.from_file:
            self._sample_direct()
        for line in self._records.new_lines():  # a byte search, not a parse: probes can be large
            if b'"error_class"' in line and not _NULL_CLASS.search(line):
                self.errors += 1
