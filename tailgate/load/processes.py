"""How many load processes a run needs, and where they meet: free of gevent and Locust, so the suite's
command line, the self-check and benchmarks can use it without importing the load path."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

CHUNKS_PER_PROCESS = 15000.0
"""Chunks per second one load process is given by ``--processes auto``: on the 16-core host one process timed
25,000 chunks/s (250 req/s of 100-chunk streams) with worst-gap error p99 under 0.01 ms, max under 0.03 ms
and no stream merged, in each of three runs (``benchmarks/results/stall-h200.md``), at about 33 us of CPU per
chunk; 15,000 is half a core of that, room for a slower or busier host."""
CAPTURE_CHUNKS_PER_PROCESS = 20000.0
"""Chunks per second one load process is given with packet-capture stamps: on the 16-core host one process
measured exactly at 40,000 chunks/s (400 req/s of 100-chunk streams; worst-gap and TTFT error p99 under
0.02 ms, no drop, no stream missed, three runs of 30 s, ``benchmarks/results/stamp-matrix-h200/``). Its
stamps do not depend on the process reading on time, so the bound is CPU (about 38 us a chunk for the load
process and its capture process together); half the measured rate leaves room for a slower host."""
CHUNKS_PER_PROCESS_BY_STAMP: dict[str, float] = {
    "kernel": CHUNKS_PER_PROCESS,
    "recv": CHUNKS_PER_PROCESS,
    "capture": CAPTURE_CHUNKS_PER_PROCESS,
}
"""Chunks per second one load process is given, per stamp source (``--chunk-stamp``). ``recv`` has not been
measured apart from ``kernel`` and is given the same."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it), for Locust's master."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def master_port_args(port: int | None = None) -> list[str]:
    """Locust options that move master and ``--processes`` children off the default port together."""
    port = port or free_port()
    return ["--master-bind-port", str(port), "--master-port", str(port)]


def capacity(stamp: str = "kernel") -> float:
    """Chunks per second one process measures exactly with this stamp source (``kernel``'s when unknown)."""
    return CHUNKS_PER_PROCESS_BY_STAMP.get(stamp, CHUNKS_PER_PROCESS)


def processes_for(chunks_per_s: float, stamp: str = "kernel") -> int:
    """Load processes that keep ``chunks_per_s`` within the bound, whatever the cores of this host."""
    return max(1, math.ceil(chunks_per_s / capacity(stamp)))


def auto_processes(chunks_per_s: float, cores: int | None = None, stamp: str = "kernel") -> int:
    """Load processes for an expected chunk rate: enough to keep each under the stamp source's
    :func:`capacity`, never more than the cores (a process beyond the cores only adds scheduling delay)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, processes_for(chunks_per_s, stamp)))


def set_realtime(priority: int = 1, probe_only: bool = False) -> bool:
    """Run the calling process at ``SCHED_FIFO`` (``priority``); False, and nothing changed, when refused.

    A load generator at a real-time priority runs the moment its timer or socket wakes it, ahead of any
    ordinary task, so a busy server cannot delay its stamps. Refused without ``CAP_SYS_NICE`` or an
    ``RLIMIT_RTPRIO``; the caller carries on at its ordinary priority. The kernel's real-time throttling
    (``sched_rt_runtime_us``) still leaves ordinary tasks 5% of each second should the generator spin.
    ``probe_only`` tries on a throwaway child instead of the caller.
    """
    if not hasattr(os, "sched_setscheduler"):
        return False
    if probe_only:
        code = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
        return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, ValueError):
        return False
    return True
