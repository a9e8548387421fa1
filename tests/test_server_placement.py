"""How the local server is placed beside the load generator (benchmarks/results/embedded-stall.md).

Checked on a real child process started exactly as the server is (own session, the controller's
``preexec_fn``), without starting vLLM: the kernel's view of its nice value, autogroup and cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailgate.load.processes import set_realtime
from tailgate.servers.local import LocalVllmServer, server_cpus

REPORT = (
    "import json, os; print(json.dumps({'nice': os.nice(0), 'cpus': sorted(os.sched_getaffinity(0)), "
    "'autogroup': open('/proc/self/autogroup').read().strip() if os.path.exists('/proc/self/autogroup') else None}))"
)


def test_server_cpus_leave_the_first_core() -> None:
    assert server_cpus([0, 1]) == [1]
    assert server_cpus([2, 5, 3]) == [3, 5]
    assert server_cpus([4]) is None


def test_environment_binds_openmp_to_the_server_cores(tmp_path: Path) -> None:
    server = LocalVllmServer("/venv/bin/python", "/models/tiny", port=1, cpus=[1, 2], log_path=tmp_path / "l")
    assert server.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "1,2"
    assert server.describe()["cpus"] == [1, 2] and server.describe()["autogroup_nice"] is False
    free = LocalVllmServer("/venv/bin/python", "/models/tiny", port=1, cpus=None, log_path=tmp_path / "l")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in free.environment() or os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


def test_child_gets_the_nice_value_its_autogroup_and_its_cores(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    server = LocalVllmServer(
        "/venv/bin/python",
        "/models/tiny",
        port=1,
        cpus=cores[-1:],
        niceness=7,
        autogroup_nice=True,
        log_path=tmp_path / "l",
    )
    out = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, check=True, start_new_session=True,
        preexec_fn=server._place,
    )  # fmt: skip
    got = json.loads(out.stdout)
    assert got["nice"] == os.nice(0) + 7
    assert got["cpus"] == cores[-1:]
    if got["autogroup"] is not None:  # kernels with CONFIG_SCHED_AUTOGROUP: the whole session is niced
        assert got["autogroup"].endswith("nice 7"), got["autogroup"]


def test_realtime_is_refused_or_granted_never_raises() -> None:
    granted = set_realtime(probe_only=True)
    assert isinstance(granted, bool)
    if not hasattr(os, "sched_setscheduler"):
        pytest.skip("no scheduler control on this platform")
