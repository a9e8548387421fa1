"""One wall-clock anchor per process: every instant the load path records is anchor + monotonic delta.

Wall time read per event would jump with NTP; the monotonic clock alone cannot be compared across
processes. Anchoring once per process gives both: timestamps that never step backwards inside a run,
and a wall-clock scale the master can align across workers. Its own module (no gevent), because the
worker and the distributed protocol both need it and neither should import the other for it.
"""

from __future__ import annotations

import time

_ANCHOR_NS = time.perf_counter_ns()
_ANCHOR_WALL = time.time()


def wall(ns: int) -> float:
    """Wall-clock seconds of a ``perf_counter_ns`` reading of this process."""
    return _ANCHOR_WALL + (ns - _ANCHOR_NS) / 1e9


def mono_ns(wall_s: float) -> int:
    """The ``perf_counter_ns`` reading of this process at wall-clock second ``wall_s``."""
    return _ANCHOR_NS + int((wall_s - _ANCHOR_WALL) * 1e9)


__all__ = ["mono_ns", "wall"]
