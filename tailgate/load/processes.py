"""How many load processes a run needs, and where they meet: free of gevent and Locust, so the suite's
command line, the self-check and benchmarks can use it without importing the load path."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

from tailgate.load.hostcapacity import FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP, host_capacity

CHUNKS_PER_PROCESS_BY_STAMP = FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP
"""The 16-core host's table: used only when this host cannot be calibrated (:mod:`tailgate.load.hostcapacity`)."""
CHUNKS_PER_PROCESS = CHUNKS_PER_PROCESS_BY_STAMP["kernel"]
CAPTURE_CHUNKS_PER_PROCESS = CHUNKS_PER_PROCESS_BY_STAMP["capture"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it), for Locust's master."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def master_port_args(port: int | None = None) -> list[str]:
    """Locust options that move master and ``--processes`` children off the default port together."""
    port = port or free_port()
    return ["--master-bind-port", str(port), "--master-port", str(port)]


def capacity(stamp: str = "kernel", measure: bool = False) -> float:
    """Chunks per second one process measures exactly with this stamp source (``kernel``'s when unknown), from
    this host's calibration; ``measure`` runs it when it is not cached yet (else the fallback table)."""
    return host_capacity(measure=measure).per_process(stamp)


def processes_for(chunks_per_s: float, stamp: str = "kernel", measure: bool = False) -> int:
    """Load processes that keep ``chunks_per_s`` within the bound, whatever the cores of this host."""
    return max(1, math.ceil(chunks_per_s / capacity(stamp, measure)))


def auto_processes(chunks_per_s: float, cores: int | None = None, stamp: str = "kernel") -> int:
    """Load processes for an expected chunk rate (``--processes auto``): enough to keep each under the stamp
    source's :func:`capacity` on this host (calibrated now if it never was), never more than the cores (a
    process beyond the cores only adds scheduling delay)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, processes_for(chunks_per_s, stamp, measure=True)))


def truth_workers(chunks_per_s: float, cores: int | None = None) -> int:
    """Ground-truth server workers for an expected chunk rate (the self-check's ``--truth-workers auto``): enough
    to keep each under its calibrated capacity, at most half the cores (the rest are the load's)."""
    cores = cores or os.cpu_count() or 1
    per_worker = host_capacity(measure=True).per_truth_worker()
    return max(1, min(max(1, cores // 2), math.ceil(chunks_per_s / per_worker)))


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
