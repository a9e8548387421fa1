"""The one exit-code rule of ``locust`` (with the suite's locustfiles), ``tailgate suite``, ``tailgate slo`` and
``tailgate selfcheck``.

A script reads one number, so each number means one ending, whichever of the commands ends:

====  =======================================================================================================
code  ending
====  =======================================================================================================
0     done: the whole plan ran, every load process to its end. Requests the server failed are measurements
      (error records, counted in each summary's ``errors``), not a failure of the run.
      ``tailgate slo``: searched, and some configuration met the SLO.
3     ``tailgate slo`` only: searched, and every configuration was shown to fail the SLO at the lowest rate
      the search could reach (a decided failure, not a lack of data).
5     ``tailgate slo`` only: searched, and no configuration was shown to meet the SLO, but neither was every
      one shown to fail: the probes could not decide (undecided is not "fails"; more probing time may).
4     done, but part of the plan was not measured: a load process was lost (its in-flight requests are
      ``worker_lost`` records, its unsent arrivals never sent), or the run was stopped before its end
      (Stop in the web UI).
1     failed: the run could not do what was asked: the server, a child run, a defect, or a run that ended
      itself early (``--stop-on-errors``, ``--on-worker-loss stop``, every load process lost).
      ``tailgate selfcheck``: the check did not show the client exact at the load asked for: a bound on its
      error breached, the reference server or the client behind its own schedule, or the join not exact.
2     bad input, before anything was sent.
128+N interrupted by signal N: 130 SIGINT (Ctrl-C), 143 SIGTERM, 129 SIGHUP.
====  =======================================================================================================

A command made of several runs (the suite's cells, the search's probes) exits with the most severe of its
own ending and its runs' (:func:`combine`). This module imports nothing of the load path or the analysis, so
both sides and every command use it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

DONE = 0
FAILED = 1
USAGE = 2
NOT_MET = 3
INCOMPLETE = 4
UNDECIDED = 5
SIGNAL_BASE = 128

WORDS = {
    DONE: "done",
    FAILED: "failed",
    USAGE: "bad input",
    NOT_MET: "SLO not met",
    INCOMPLETE: "incomplete",
    UNDECIDED: "SLO undecided",
}


def interrupted(signum: int) -> int:
    """The shell's convention for a run a signal ended: 128 + the signal's number."""
    return SIGNAL_BASE + int(signum)


def run_exit_code(*, signum: int | None, failed: bool, cut_short: bool, lost: bool, stopped: bool) -> int:
    """A Locust run's exit code, from how its newest run ended (the rule's rows, most severe first)."""
    if signum is not None:
        return interrupted(signum)
    if failed or cut_short:
        return FAILED
    if lost or stopped:
        return INCOMPLETE
    return DONE


@dataclass(frozen=True)
class Ending:
    """What a child Locust's exit code says about its run, read the same way by the suite, the SLO search and
    the self-check."""

    code: int

    @property
    def finished(self) -> bool:
        """The run reached its end and its results folder holds the run (complete or not): its data counts."""
        return self.code in (DONE, INCOMPLETE)

    @property
    def signum(self) -> int | None:
        """The signal that ended it (a negative code: killed by it; 128+N: it exited on it), else None."""
        if self.code < 0:
            return -self.code
        if SIGNAL_BASE < self.code < SIGNAL_BASE + 65:
            return self.code - SIGNAL_BASE
        return None

    def describe(self) -> str:
        """``locust exit 4 (incomplete)``, ``locust exit 143 (SIGTERM)``: for error lines."""
        signum = self.signum
        if signum is not None:
            try:
                word = signal.Signals(signum).name
            except ValueError:
                word = f"signal {signum}"
        else:
            word = WORDS.get(self.code, "unknown")
        return f"locust exit {self.code} ({word})"


def child_ending(code: int) -> Ending:
    return Ending(int(code))


SEVERITY = (DONE, UNDECIDED, NOT_MET, INCOMPLETE, FAILED, USAGE)
"""Least to most severe; a signal's code outranks them all."""


def combine(codes: Iterable[int]) -> int:
    """The exit code of a command made of several endings: the most severe (``DONE`` when there are none)."""

    def rank(code: int) -> int:
        if code in SEVERITY:
            return SEVERITY.index(code)
        return len(SEVERITY)  # a signal, or a code outside the rule: never hidden behind a milder one

    return max(codes, key=rank, default=DONE)


__all__ = [
    "DONE",
    "FAILED",
    "INCOMPLETE",
    "NOT_MET",
    "SIGNAL_BASE",
    "UNDECIDED",
    "USAGE",
    "Ending",
    "child_ending",
    "combine",
    "interrupted",
    "run_exit_code",
]
