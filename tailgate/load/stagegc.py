"""No full garbage collection while a stage's streams are being timed.

CPython's collector walks every tracked object of the process in a full (generation 2) collection:
Locust, gevent, Flask and the suite leave about 50,000 of them alive in a load process, and a full
collection over them stopped the event loop for 20-30 ms on the 16-core host. The collector decides
when to run from allocation counts, so with the same trace the pause came at the same moment of every
run (about 0.9 s into the stage) and every stream in flight then had its chunks stamped late and merged.

During a stage the objects alive before it are frozen (``gc.freeze``: they move to a generation the
collector never walks) and automatic full collections are put off; the young generations are still
collected as usual, so short-lived cycles are reclaimed as the stage runs, and each young collection
walks at most a few thousand objects. When the stage's streams have all ended, the freeze is undone
and one full collection reclaims whatever cycles survived, while nothing is being timed.

``TAILGATE_STAGE_GC=off`` keeps CPython's default behaviour (to measure what this changes).
"""

from __future__ import annotations

import gc
import os

STAGE_GC_ENV = "TAILGATE_STAGE_GC"
FULL_THRESHOLD_IN_STAGE = 1_000_000
"""Generation-1 collections before a full one while a stage runs: in practice never (a stage ends first)."""


def enabled() -> bool:
    return os.environ.get(STAGE_GC_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


class QuietCollector:
    """Brackets one order's dispatch and streams in one load process: ``start`` before the first send,
    ``end`` once every stream has ended (in a ``finally``, so a cancelled order ends it too)."""

    __slots__ = ("_active", "_saved")

    def __init__(self) -> None:
        self._active = enabled()
        self._saved: tuple[int, int, int] | None = None

    def start(self) -> None:
        if self._active and gc.isenabled() and self._saved is None:
            self._saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(self._saved[0], self._saved[1], FULL_THRESHOLD_IN_STAGE)

    def end(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        self._saved = None
        gc.unfreeze()
        gc.collect()
