"""What the server is told to do (settings) and what it saw (the chunk log a client's stamps are compared to)."""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, cast

from tailgate.jsontypes import JsonMapping, JsonObject, as_object, json_int, json_list, json_str

from .engine import EngineModel
from .faults import Fault
from .wire import DEFAULT_GAP_MS, DEFAULT_MODEL, DEFAULT_TTFT_MS, KV_CAPACITY_TOKENS


@dataclass(slots=True)
class Settings:
    """What new requests are served with. A change reaches requests that arrive after it."""

    ttft_ms: float = DEFAULT_TTFT_MS
    gap_ms: float = DEFAULT_GAP_MS
    model: str = DEFAULT_MODEL
    accept_any_model: bool = False
    """vLLM answers 404 for an unknown model name; this lets any name through."""
    preemptions_total: float = 0.0
    """The value ``/metrics`` reports for ``vllm:num_preemptions_total``; set it to test deltas and resets."""
    healthy: bool = True
    """False makes ``/health`` answer 503, as vLLM does when its engine died."""
    kv_capacity_tokens: int = KV_CAPACITY_TOKENS
    prefix_caching: bool = False
    """Count prefix-cache hits (whole blocks of ``PREFIX_BLOCK_TOKENS`` words seen before), as vLLM's
    ``vllm:prefix_cache_*`` counters do, and say so in ``vllm:cache_config_info``. Off: queries only."""
    faults: list[Fault] = field(default_factory=list)
    schedules: dict[int, list[int]] = field(default_factory=dict)
    pause: tuple[int, int] | None = None
    """``(request number, ns)``: when that request arrives, every stream's next chunk waits out the pause."""
    engine: EngineModel | None = None
    """When set, streaming completions are served by the simulated engine (see :mod:`.engine`) instead of
    the fixed ``ttft_ms``/``gap_ms`` schedule, and the vLLM gauges report the engine's state."""
    write_delay_us: float = 0.0
    """After each write the event loop sleeps this long (no CPU used): a server whose every write costs that
    much, which falls behind its schedule once chunks per second times the delay pass one second per
    second. Only for testing what notices a late reference (the self-check's lateness bound)."""

    def describe(self) -> JsonObject:
        return {
            "ttft_ms": self.ttft_ms,
            "gap_ms": self.gap_ms,
            "model": self.model,
            "accept_any_model": self.accept_any_model,
            "preemptions_total": self.preemptions_total,
            "healthy": self.healthy,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "prefix_caching": self.prefix_caching,
            "faults": [f.describe() for f in self.faults],
            "scripted_requests": sorted(self.schedules),
            "pause": None if self.pause is None else {"at_seq": self.pause[0], "ms": self.pause[1] / 1e6},
            "engine": None if self.engine is None else self.engine.describe(),
            "write_delay_us": self.write_delay_us,
        }


# ------------------------------------------------------------------------------------------- logging


class ChunkLogColumns(TypedDict):
    """One worker's log as flat lists (:meth:`ChunkLog.columns`), left for the parent to merge."""

    pid: int
    seq: list[int]
    idx: list[int]
    t_ns: list[int]
    begin_ns: list[int]
    target_ns: list[int]
    requests: list[list[int]]
    """``[seq, body received ns, first write ns or -1]``."""
    backpressured: int


class ChunkLogDump(TypedDict):
    """The chunk log as one document (:meth:`ChunkLog.dump`, or the workers' logs merged): what the self-check's
    join reads. The worker keys are in a merged log only; the other optional ones are absent from older logs."""

    clock: str
    pid: int
    workers: NotRequired[int]
    worker_pids: NotRequired[list[int]]
    worker_chunks: NotRequired[list[int]]
    workers_lost: NotRequired[list[JsonObject]]
    """``{"worker", "pid", "exit"}`` of each worker that ended before the server was stopped."""
    chunks: list[list[int]]
    """``[seq, chunk index, write-returned ns]`` in write order."""
    chunk_targets: NotRequired[list[int]]
    chunk_write_begin: NotRequired[list[int]]
    requests: NotRequired[list[list[int | None]]]
    """``[seq, body received ns, first write ns or None]``."""
    backpressured_writes: NotRequired[int]


def _checked_top(doc: JsonMapping, ints: tuple[str, ...], lists: tuple[str, ...], where: str) -> None:
    for key in ints:
        json_int(doc, key, where=where)
    for key in lists:
        json_list(doc, key, where=where)


def read_columns(data: bytes, where: str) -> ChunkLogColumns:
    """A worker's columns as written; the keys and their kinds are checked, the rows (millions of integers this
    server wrote) are taken as written."""
    doc = as_object(json.loads(data), where=where)
    _checked_top(doc, ("pid", "backpressured"), ("seq", "idx", "t_ns", "begin_ns", "target_ns", "requests"), where)
    return cast(ChunkLogColumns, doc)


def read_chunk_log(data: bytes, where: str) -> ChunkLogDump:
    """A chunk-log document as written, checked as :func:`read_columns` checks a worker's."""
    doc = as_object(json.loads(data), where=where)
    json_str(doc, "clock", where=where)
    _checked_top(doc, ("pid",), ("chunks",), where)
    for key in ("chunk_targets", "chunk_write_begin", "requests", "workers_lost"):
        json_list(doc, key, (), where=where)
    return cast(ChunkLogDump, doc)


class ChunkLog:
    """Per-chunk write times in flat integer arrays.

    Appending five machine integers per chunk costs a fraction of a microsecond and allocates no
    Python objects, so logging every chunk does not perturb the timing it records. The response id
    of a row is ``cmpl-<seq>``. The dump keeps ``chunks`` as ``[seq, index, written ns]`` rows and puts
    the targets and the before-write stamps in lists parallel to it.
    """

    __slots__ = ("backpressured", "begin_ns", "idx", "requests", "seq", "t_ns", "target_ns")

    def __init__(self) -> None:
        self.seq = array("q")
        self.idx = array("q")
        self.t_ns = array("q")
        """Right after the write call returned: the time the comparison uses."""
        self.begin_ns = array("q")
        """Right before the write call: the bytes left between this and ``t_ns``. A reader on another
        core can receive them before ``t_ns`` (by the syscall's duration, or by much more if this
        process was preempted in between), never before ``begin_ns``."""
        self.target_ns = array("q")
        self.requests: dict[int, list[int]] = {}
        """seq -> [body received ns, first write ns or -1]."""
        self.backpressured = 0
        """Writes that left bytes in the transport's buffer: their logged time is a hand-off to
        asyncio, not to the kernel (the client was not reading fast enough)."""

    def __len__(self) -> int:
        return len(self.seq)

    def columns(self) -> ChunkLogColumns:
        """The log as flat lists (a worker's part of a merged log: cheap to write and read back)."""
        return {
            "pid": os.getpid(),
            "seq": self.seq.tolist(),
            "idx": self.idx.tolist(),
            "t_ns": self.t_ns.tolist(),
            "begin_ns": self.begin_ns.tolist(),
            "target_ns": self.target_ns.tolist(),
            "requests": [[s, r[0], r[1]] for s, r in self.requests.items()],
            "backpressured": self.backpressured,
        }

    def dump(self) -> ChunkLogDump:
        return {
            "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
            "pid": os.getpid(),
            "chunks": [list(r) for r in zip(self.seq, self.idx, self.t_ns, strict=True)],
            "chunk_targets": list(self.target_ns),
            "chunk_write_begin": list(self.begin_ns),
            "requests": [[s, r[0], r[1] if r[1] >= 0 else None] for s, r in self.requests.items()],
            "backpressured_writes": self.backpressured,
        }
