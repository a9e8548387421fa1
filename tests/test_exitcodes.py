"""The one exit-code rule (``tailgate.exitcodes``): its reading of a child's code and how endings combine.

The commands themselves are held to it where each ending is injected: a lost worker (kill -9, a partition,
SIGSTOP: ``test_distributed.py``, 4), a run that ended itself early (``--on-worker-loss stop``,
``--stop-on-errors``: 1), failed requests (``test_faults.py``: 0), each signal (``test_suite_lifecycle.py``,
``test_runner.py``, ``test_webui.py``: 128 + N), bad input (``test_bad_input.py``: 2).
"""

from __future__ import annotations

import signal

from tailgate import exitcodes
from tailgate.exitcodes import DONE, FAILED, INCOMPLETE, NOT_MET, USAGE, child_ending, combine, run_exit_code


def test_a_childs_code_is_read_one_way() -> None:
    assert child_ending(DONE).finished and child_ending(INCOMPLETE).finished
    for code in (FAILED, USAGE, 130, 143, -9):
        assert not child_ending(code).finished, code
    assert child_ending(143).signum == signal.SIGTERM and child_ending(-9).signum == signal.SIGKILL
    assert child_ending(INCOMPLETE).describe() == "locust exit 4 (incomplete)"
    assert child_ending(130).describe() == "locust exit 130 (SIGINT)"


def test_a_run_ends_with_its_most_severe_row() -> None:
    clean = {"signum": None, "failed": False, "cut_short": False, "lost": False, "stopped": False}
    assert run_exit_code(**clean) == DONE
    assert run_exit_code(**{**clean, "lost": True}) == INCOMPLETE
    assert run_exit_code(**{**clean, "stopped": True}) == INCOMPLETE
    assert run_exit_code(**{**clean, "lost": True, "cut_short": True}) == FAILED
    assert run_exit_code(**{**clean, "failed": True, "signum": signal.SIGTERM}) == 143


def test_several_endings_combine_to_the_most_severe() -> None:
    assert combine([]) == DONE
    assert combine([DONE, NOT_MET]) == NOT_MET
    assert combine([NOT_MET, INCOMPLETE, DONE]) == INCOMPLETE  # a probe that lost a process outranks the answer
    assert combine([INCOMPLETE, FAILED]) == FAILED
    assert combine([FAILED, USAGE]) == USAGE
    assert combine([USAGE, 130]) == 130


def test_every_command_uses_the_one_rule() -> None:
    """The suite's, the search's and the Locust process's constants are this module's, not copies."""
    from tailgate import lifecycle
    from tailgate.slo import spec

    assert (lifecycle.EXIT_OK, lifecycle.EXIT_ERRORS, lifecycle.EXIT_USAGE) == (DONE, FAILED, USAGE)
    assert (spec.EXIT_OK, spec.EXIT_FAILED, spec.EXIT_USAGE, spec.EXIT_NOT_MET) == (DONE, FAILED, USAGE, NOT_MET)
    assert lifecycle.Stopped(signal.SIGTERM).exit_code == exitcodes.interrupted(signal.SIGTERM) == 143
