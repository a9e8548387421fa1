"""One cell: one Locust run of one arm at one stage value into one results folder.

Every command measures in cells: the suite's ramp and its gated cells, each attempt of an SLO probe, each
stage warm-up round, the self-check's run. They differ in which cell they run next, never in how a cell
runs, so that lives here once: the folder of an interrupted attempt is set aside before the run (its
records never mix into the new one's), the child is run by the caller's :class:`~tailgate.runner.ChildRunner`
(the one holder of its handle, so a signal stops it), its exit code is read by the one rule of
:mod:`tailgate.exitcodes`, and the stage summaries it wrote come back typed. Whether a cell that did not
finish is an error is the caller's decision (a probe the search stopped on purpose is not), but the message
for it is written here, the same for every command.

Standard library only beyond the project's own contracts: no gevent, Locust or pandas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tailgate.contracts import StageSummary
from tailgate.exitcodes import Ending, child_ending
from tailgate.resultfiles import RUN_META, SUMMARY_GLOB
from tailgate.runmeta import RunMeta
from tailgate.runner import ChildResult, ChildRunner, LocustRun, prepare_results

TAIL_LINES = 15
"""Lines of the child's output quoted when a cell fails."""


@dataclass(frozen=True)
class CellSpec:
    """What to run and how to name it: the Locust run (arm, stage, options, results folder)."""

    run: LocustRun
    name: str
    """How the console and an error name the cell: ``cell chunked_continuous_r8``, ``probe ...``."""
    aside_root: Path | None = None
    """Where an earlier, interrupted attempt's folder is kept (``.incomplete/``); None removes it."""
    output: Path | None = None
    """A file that keeps the child's whole output (the self-check's ``locust.log``)."""

    @property
    def folder(self) -> Path:
        return self.run.results


@dataclass(frozen=True)
class CellResult:
    spec: CellSpec
    child: ChildResult
    ending: Ending
    summaries: tuple[StageSummary, ...]
    """Every stage summary the run wrote, in file-name order (one per stage)."""
    meta: RunMeta | None = None
    """``run.json`` as the run left it (None: not written, or unreadable)."""

    @property
    def folder(self) -> Path:
        return self.spec.folder

    @property
    def seconds(self) -> float:
        return self.child.seconds

    @property
    def stopped_early(self) -> str | None:
        """Why the caller's watch stopped the run (None: it ran to its end)."""
        return self.child.stopped_early

    @property
    def complete(self) -> bool:
        """The run finished (every load process to its end, or the rule's "incomplete") and wrote a summary."""
        return self.ending.finished and bool(self.summaries)

    @property
    def summary(self) -> StageSummary | None:
        """The first stage's summary: a cell of the suite or a probe has one stage."""
        return self.summaries[0] if self.summaries else None

    def failure(self) -> str:
        """The one-paragraph error for a cell that did not complete: its ending and the child's last output."""
        detail = "\n".join(self.child.tail[-TAIL_LINES:])
        return f"{self.spec.name} failed ({self.ending.describe()}); last output:\n{detail}"


def read_summaries(folder: Path) -> tuple[StageSummary, ...]:
    return tuple(StageSummary.read(path) for path in sorted(folder.glob(SUMMARY_GLOB)))


def run_cell(
    spec: CellSpec,
    runner: ChildRunner,
    *,
    on_line: Callable[[str], None] | None = None,
    watch: Callable[[], str | None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> CellResult:
    """Run one cell to its end (or until ``watch`` gives a reason to stop it) and read what it wrote.

    ``on_line`` sees each output line, ``on_start`` the child's pid (a CPU sampler); see
    :meth:`~tailgate.runner.ChildRunner.run`."""
    prepare_results(spec.folder, spec.aside_root)
    spec.folder.parent.mkdir(parents=True, exist_ok=True)
    done = runner.run(spec.run.command(), on_line=on_line, output=spec.output, watch=watch, on_start=on_start)
    meta = RunMeta.read_or_none(spec.folder / RUN_META)
    return CellResult(spec, done, child_ending(done.exit_code), read_summaries(spec.folder), meta)


__all__ = ["CellResult", "CellSpec", "read_summaries", "run_cell"]
