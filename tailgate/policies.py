"""Which cell runs next, apart from how a cell runs (:mod:`tailgate.cell`): the one loop of every command.

A command that measures is a loop of two questions: which cell next, and what did it show. The second is
answered once for every command (``run_cell``); the first is a policy, and :func:`drive` is the loop. The
suite has two policies: the chunked ramp, which doubles its rate until the tail knees (a decision on each
cell's summary), and the fixed list of the remaining cells. The SLO search is a third, over rates, deciding on
each probe's verdict (:class:`tailgate.slo.search.RateSearch`). Keeping a policy apart from the runner means a
new order of cells (say, a ramp that halves back on a knee) is one class, tested on results alone, without
a server or a Locust child.

Standard library only beyond the project's own contracts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from tailgate.contracts import StageSummary

CellT = TypeVar("CellT")
ResultT = TypeVar("ResultT")
ResultT_contra = TypeVar("ResultT_contra", contravariant=True)


class CellPolicy(Protocol[CellT, ResultT_contra]):
    """Hands out cells one at a time and hears each one's result before choosing the next (the suite's: a
    stage summary; the SLO search's: a probe's verdict)."""

    def next_cell(self) -> CellT | None:
        """The cell to run now; None: this policy has no more."""
        ...

    def record(self, cell: CellT, result: ResultT_contra) -> None:
        """What ``cell`` measured (a cell run now or one found done on disk)."""
        ...


def drive(policy: CellPolicy[CellT, ResultT], measure: Callable[[CellT], ResultT]) -> list[CellT]:
    """Run ``policy``'s cells through ``measure`` until it has no more; the cells run, in order.

    An exception from ``measure`` ends the loop with the policy as it stood (the cell it was running not
    recorded): a command that stops mid-way keeps what its policy heard so far."""
    ran: list[CellT] = []
    while (cell := policy.next_cell()) is not None:
        result = measure(cell)
        ran.append(cell)
        policy.record(cell, result)
    return ran


class FixedCells(Generic[CellT]):
    """Cells in a set order, whatever they show."""

    def __init__(self, cells: Sequence[CellT]) -> None:
        self._pending = list(cells)

    def next_cell(self) -> CellT | None:
        return self._pending.pop(0) if self._pending else None

    def record(self, cell: CellT, result: object) -> None:
        pass


def kneed(previous: StageSummary | None, current: StageSummary, factor: float) -> str | None:
    """Why a ramp should stop at ``current``, or None: errors, or a TTFT or worst-gap p99 that grew past
    ``factor`` times the stage before's. A p99 that could not be measured (None) never knees."""
    rate = f"{current.rate_or_batch:g} req/s"
    if current.errors:
        return f"{current.errors} errors at {rate}"
    if previous is None:
        return None
    for key in ("ttft_p99", "gap_p99"):
        before, now = getattr(previous, key), getattr(current, key)
        if before and now and now > factor * before:
            return f"{key} grew x{now / before:.1f} ({before} -> {now} ms) at {rate}"
    return None


class KneeRamp(Generic[CellT]):
    """Open-loop rates in order; with ``until_knee``, doubled past the last until the tail knees or the next
    doubling would pass ``max_rate``. A knee ends the ramp only when it was asked to run until one."""

    def __init__(
        self,
        cells: Sequence[CellT],
        rate_of: Callable[[CellT], float],
        at_rate: Callable[[float], CellT],
        *,
        until_knee: bool,
        factor: float,
        max_rate: float,
    ) -> None:
        self._pending = list(cells)
        self._rate = rate_of(cells[-1]) if cells else 0.0
        self._at_rate = at_rate
        self.until_knee = until_knee
        self.factor = factor
        self.max_rate = max_rate
        self._previous: StageSummary | None = None
        self.knee: str | None = None
        """Why the ramp stopped at a knee (None: it did not)."""
        self.added = 0
        """Cells the doubling added beyond the ones given."""

    def next_cell(self) -> CellT | None:
        if self.knee is not None:
            return None
        if not self._pending and self.until_knee and self._rate and self._rate * 2 <= self.max_rate:
            self._rate *= 2
            self._pending.append(self._at_rate(self._rate))
            self.added += 1
        return self._pending.pop(0) if self._pending else None

    def record(self, cell: CellT, summary: StageSummary) -> None:
        why = kneed(self._previous, summary, self.factor)
        self._previous = summary
        if why and self.until_knee:
            self.knee = why


__all__ = ["CellPolicy", "FixedCells", "KneeRamp", "drive", "kneed"]
