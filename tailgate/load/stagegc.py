"""No garbage collection while a stage's streams are being timed.

CPython's collector walks every tracked object of the process in a full (generation 2) collection:
Locust, gevent, Flask and the suite leave about 50,000 of them alive in a load process, and a full
collection over them stopped the event loop for 20-30 ms on the 16-core host. The collector decides
when to run from allocation counts, so with the same trace the pause came at the same moment of every
run (about 0.9 s into the stage) and every stream in flight then had its chunks stamped late and merged.

During a stage the objects alive before it are frozen (``gc.freeze``: they move to a generation the
collector never walks) and automatic collection is off altogether. Young collections were the next pause:
a young generation holds everything allocated since the last collection and still alive, which in a
stage is every stream in flight with its chunk stamps and every record written since; the count that
triggers a collection is net of frees, so it comes seconds apart and, with the same trace, at the same
moment of every run, and walks thousands of containers (1.8-5.8 ms at 80 req/s on 2 cores, with the
chunk lists of ``--record-chunks``; 8-12 ms at 250 req/s on the 16-core host, 6.8 s into a 10-s stage).
A stage leaves next to no cyclic garbage (the young collections of a 800-request stage reclaimed none,
the full collection after it 0-351 objects), so nothing is lost by waiting: when the stage's streams
have all ended, collection is switched back on, the freeze undone and one full collection reclaims what
the stage left, while nothing is being timed; :meth:`QuietCollector.end` returns what it reclaimed.

``TAILGATE_STAGE_GC=off`` keeps CPython's default behaviour (to measure what this changes).
"""

from __future__ import annotations

import gc
import os

STAGE_GC_ENV = "TAILGATE_STAGE_GC"


def enabled() -> bool:
    return os.environ.get(STAGE_GC_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


class QuietCollector:
    """Brackets one order's dispatch and streams in one load process: ``start`` before the first send,
    ``end`` once every stream has ended (in a ``finally``, so a cancelled order ends it too)."""

    __slots__ = ("_active", "_quiet")

    def __init__(self) -> None:
        self._active = enabled()
        self._quiet = False

    def start(self) -> None:
        if self._active and gc.isenabled() and not self._quiet:
            self._quiet = True
            gc.freeze()
            gc.disable()

    def end(self) -> int:
        """Collection back on; the number of unreachable objects the stage left (0 when it was not quiet)."""
        if not self._quiet:
            return 0
        self._quiet = False
        gc.enable()
        gc.unfreeze()
        return gc.collect()
