"""Finds what pauses a load process: every garbage collection timed, every long greenlet turn named.

A load process that stops for 20 ms stamps every chunk that arrived meanwhile 20 ms late and merges
streams, so when a run shows such a pause the question is who held the loop. Set
``TAILGATE_STALL_LOG=<path>`` and each load process appends one JSON line per event to ``<path>.<pid>``:

- ``gc``: one per collection, with its generation, duration, objects collected and how many objects
  the collector tracked when it started (a full collection walks all of them);
- ``turn``: a greenlet (not the hub) that ran longer than ``TAILGATE_STALL_MS`` (default 5) without switching, with
  what it was running when it switched out (function, file, line).

Off by default: the switch hook costs a little on every greenlet switch.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any, TextIO

from tailgate.jsontypes import JsonObject

STALL_LOG_ENV = "TAILGATE_STALL_LOG"
STALL_MS_ENV = "TAILGATE_STALL_MS"
DEFAULT_STALL_MS = 5.0


class StallWatch:
    """Writes ``gc`` and ``turn`` events as they happen; instants are ``perf_counter_ns``."""

    def __init__(self, out: TextIO, turn_ns: int) -> None:
        self._out = out
        self._turn_ns = turn_ns
        self._gc_start = 0
        self._gc_tracked = 0
        self._switched_ns = time.perf_counter_ns()

    def _emit(self, event: JsonObject) -> None:
        self._out.write(json.dumps(event) + "\n")
        self._out.flush()

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` entry: ``info`` is gc's own (``generation``, ``collected``, ``uncollectable``)."""
        if phase == "start":
            self._gc_start = time.perf_counter_ns()
            self._gc_tracked = len(gc.get_objects(info["generation"])) if info["generation"] == 2 else -1
            return
        end = time.perf_counter_ns()
        self._emit({
            "kind": "gc", "at_ns": self._gc_start, "ms": round((end - self._gc_start) / 1e6, 3),
            "generation": info["generation"], "collected": info["collected"], "tracked": self._gc_tracked,
        })  # fmt: skip

    def on_switch(self, what: str, args: tuple[Any, Any]) -> None:
        now = time.perf_counter_ns()
        ran = now - self._switched_ns
        self._switched_ns = now
        origin = args[0]
        # the hub's time between switches is mostly its wait for events (idle, not a stall); what it runs
        # that pauses the loop shows up as a collection here or as the turn of the greenlet it ran. The
        # streams' reads are parsed in the hub's own I/O callbacks (reads.py), microseconds each: a loop
        # held there shows as late reads in the records (max_read_delay_ms), not as a turn
        if ran < self._turn_ns or what not in ("switch", "throw") or type(origin).__name__ == "Hub":
            return
        frame = getattr(origin, "gr_frame", None) or sys._getframe(1)
        where = [f"{f.f_code.co_name} {os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" for f in _stack(frame)]
        self._emit({"kind": "turn", "at_ns": now - ran, "ms": round(ran / 1e6, 3), "greenlet": repr(origin)[:120],
                    "stack": where})  # fmt: skip


def _stack(frame: Any, depth: int = 8) -> list[Any]:
    frames: list[Any] = []
    while frame is not None and len(frames) < depth:
        frames.append(frame)
        frame = frame.f_back
    return frames


def install_from_env() -> StallWatch | None:
    """Install the watch when ``TAILGATE_STALL_LOG`` names a path; None (and no cost) otherwise."""
    path = os.environ.get(STALL_LOG_ENV)
    if not path:
        return None
    try:
        turn_ms = float(os.environ.get(STALL_MS_ENV, DEFAULT_STALL_MS))
    except ValueError:
        turn_ms = DEFAULT_STALL_MS
    import greenlet

    watch = StallWatch(open(f"{path}.{os.getpid()}", "a", encoding="utf-8"), int(turn_ms * 1e6))
    gc.callbacks.append(watch.on_gc)
    greenlet.settrace(watch.on_switch)
    return watch
