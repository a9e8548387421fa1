"""The self-check's sleepers: a CPU held back shows as an oversleep at its moment, and only the stage's count."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tailgate.verify.hostheld import HostHeldWatch, held_line, held_summary, parse_lines

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing


def test_a_held_sleeper_reports_its_oversleep_and_when() -> None:
    """Stopping a sleeper for 60 ms is what a host holding its CPU looks like from inside."""
    watch = HostHeldWatch(report_ms=20.0).start()
    held_at = time.time() + 60.0  # a window nothing falls in, should the sleepers not start
    try:
        proc = next(iter(watch.procs.values()))
        time.sleep(0.5)  # the sleepers are running
        held_at = time.time()
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.06)
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.3)
    finally:
        got = watch.stop((held_at, held_at + 0.3))  # the oversleep ends (and is stamped) about 60 ms later
    assert got is not None and got["cpus"] == len(os.sched_getaffinity(0))
    assert got["oversleeps"] >= 1 and got["worst_ms"] >= 40, got
    assert not watch.procs  # stopped and reaped


def test_only_the_stages_oversleeps_count() -> None:
    late = {0: [(10.0, 7.0), (20.0, 30.0)], 1: [(12.0, 6.0)], 2: []}
    assert held_summary(late, (11.0, 21.0), 5.0) == {
        "cpus": 3, "over_ms": 5.0, "oversleeps": 2, "cpus_held": 2, "worst_ms": 30.0,
    }  # fmt: skip
    assert held_summary(late, (30.0, 40.0), 5.0)["oversleeps"] == 0


def test_the_line_speaks_only_when_the_client_was_late_and_cpus_were_held() -> None:
    held = {"cpus": 16, "over_ms": 5.0, "oversleeps": 9, "cpus_held": 4, "worst_ms": 25.0}
    line = held_line(held, client_late=True)
    assert line is not None and line.startswith("HOST HELD CPUS: sleepers pinned to 4 of 16 CPUs")
    assert "--chunk-stamp capture" in line
    assert held_line(held, client_late=False) is None
    assert held_line({**held, "oversleeps": 0}, client_late=True) is None
    assert held_line(None, client_late=True) is None


def test_sleeper_lines_are_read_and_junk_skipped() -> None:
    assert parse_lines("1796217864.6000 7.250\nnot a line\n1796217865.1 5.5\n") == [
        (1796217864.6, 7.25), (1796217865.1, 5.5),
    ]  # fmt: skip


# -- the reference and the load on CPUs of their own ---------------------------------------------------------


def test_the_cpus_are_split_like_the_two_sides_processes() -> None:
    from tailgate.verify.cpusplit import CpuSplit, cpu_ranges, split_cpus

    assert split_cpus(range(16), 8, 8) == CpuSplit(tuple(range(8)), tuple(range(8, 16)))
    assert split_cpus([3, 1, 2, 0, 5], 1, 3) == CpuSplit((0,), (1, 2, 3, 5))
    assert split_cpus(range(16), 1, 40) == CpuSplit((0,), tuple(range(1, 16)))  # each side keeps one CPU
    assert split_cpus(range(16), 40, 1) == CpuSplit(tuple(range(15)), (15,))
    assert split_cpus(range(3), 1, 1) is None and split_cpus(range(8), 0, 4) is None
    assert cpu_ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10" and cpu_ranges([5]) == "5"


def test_children_started_inside_keep_the_cpus_and_this_process_gets_its_own_back() -> None:
    import os
    import subprocess
    import sys

    from tailgate.verify.cpusplit import children_on

    mine = os.sched_getaffinity(0)
    one = min(mine)
    with children_on([one]):
        child = subprocess.Popen(
            [sys.executable, "-c", "import os, time; print(sorted(os.sched_getaffinity(0))); time.sleep(0.5)"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
    assert os.sched_getaffinity(0) == mine
    assert os.sched_getaffinity(child.pid) == {one}
    out, _ = child.communicate(timeout=30)
    assert out.strip() == f"[{one}]"
