"""The self-check's load over two load hosts (network namespaces on this machine): one schedule, one writer, every
planned request accounted for, and a join with the reference's log as exact as on one host.

Low rate: what is asserted is the path (master beside the reference, two hosts' worker processes sending on the
master's schedule), not the precision two cores allow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tailgate.load.plan import poisson_offsets
from tailgate.verify.multihost import spread
from tailgate.verify.netns import NetnsUnavailable
from tailgate.verify.selfcheck import SelfCheckConfig, run_selfcheck

# the busy pass (scripts/test.sh) runs these again: their verdicts depend on when things happen
pytestmark = pytest.mark.timing

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("ip") is None,
    reason="load hosts are network namespaces: they need root and iproute2's ip command",
)


def _namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def test_processes_spread_evenly_over_the_hosts() -> None:
    assert spread(2, 2) == [1, 1] and spread(5, 2) == [3, 2] and spread(3, 4) == [1, 1, 1, 0]


@needs_root
def test_two_load_hosts_one_schedule_exact_accounting(tmp_path: Path) -> None:
    n, rate, seed = 20, 10.0, 7
    before = _namespaces()
    cfg = SelfCheckConfig(rate=rate, n=n, tokens=10, processes=2, truth_workers=1, hosts=2, seed=seed,
                          server_late_p99_ms=200.0, lag_p99_ms=500.0, keep_dir=str(tmp_path / "run"),
                          host_watch=False)  # fmt: skip
    try:
        result = run_selfcheck(cfg)
    except NetnsUnavailable as e:
        pytest.skip(f"the kernel refused network namespaces: {e}")
    assert _namespaces() == before  # the hosts are gone with the run
    assert result["join"]["exact"], result["join"]
    assert result["join"]["matched_chunks"] == result["join"]["server_chunks"] == n * 10
    acc = result["accounting"]
    assert (acc["planned"], acc["sent"], acc["recorded"], acc["lost_in_flight"], acc["never_sent"]) == (n, n, n, 0, 0)
    assert result["load_processes"] == 2 and result["config"]["hosts"] == 2
    results = tmp_path / "run" / "results"
    rows = [json.loads(line) for p in results.glob("records-*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(r["trace_id"] for r in rows) == list(range(n))
    assert len({r["worker"] for r in rows}) == 2  # both hosts sent
    # one schedule: the intended sends are the master's plan, whichever host sent each request
    rows.sort(key=lambda r: r["trace_id"])
    offsets = [r["intended_s"] - rows[0]["intended_s"] for r in rows]
    assert offsets == pytest.approx(poisson_offsets(n, rate, seed), abs=2e-3)
    assert all(r["error_class"] is None for r in rows)
    assert {p.name for p in (tmp_path / "run").glob("host*.log")} == {"host0.log", "host1.log"}
