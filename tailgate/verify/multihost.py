"""The self-check's load over several load hosts: network namespaces on one machine (``--hosts N``).

One load host runs out of cores before the server does; the suite then spreads the same schedule over
Locust workers on other hosts (:mod:`tailgate.load.distributed`: one writer, one clock, the master's plan
split without moving any intended send). This runs that path under the self-check: the reference server
and Locust's master in one namespace, each load host's worker processes in a namespace of its own
(:mod:`tailgate.verify.netns`), talking over veth pairs and a bridge. The namespaces share the machine's
``CLOCK_MONOTONIC``, so the join with the server's log stays exact, and every request the master planned
must end as a record (or a classified error) in its one results folder.

Needs root (namespaces); the self-check says so in one line when they cannot be made.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tailgate.load.processes import free_port
from tailgate.runner import ChildRunner, LocustRun, prepare_results
from tailgate.verify.cpu import CpuSampler
from tailgate.verify.netns import Hosts, NetnsUnavailable

WORKER_STOP_S = 20.0
"""How long a load host's Locust has to end after its master did, before it is stopped."""


def load_hosts(count: int) -> Hosts:
    """``count`` load hosts around a master namespace, created; :class:`NetnsUnavailable` when they cannot be."""
    return Hosts(workers=count).create()


def spread(processes: int, hosts: int) -> list[int]:
    """Load processes per host: as even as the count allows, the first hosts taking the remainder."""
    base, extra = divmod(processes, hosts)
    return [base + (1 if i < extra else 0) for i in range(hosts)]


@dataclass
class HostsRun:
    """What the master's Locust and the load hosts left behind, before any joining."""

    exit_code: int
    seconds: float
    cpu_s_total: float
    sampler: CpuSampler
    problems: list[str] = field(default_factory=list)
    per_host: list[int] = field(default_factory=list)
    """Load processes on each host."""


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return int(proc.returncode)


def run_on_hosts(
    run: LocustRun,
    hosts: Hosts,
    processes: int,
    server_pids: Sequence[int],
    work: Path,
    child: ChildRunner,
    log: Callable[[str], None] = lambda _: None,
) -> HostsRun:
    """Run ``run`` (one process: the master) in the master namespace and ``processes`` Locust workers spread over
    the load hosts; return when the master ended and every load host stopped."""
    per_host = spread(processes, hosts.workers)
    port = free_port()
    prepare_results(run.results, None)
    run.results.parent.mkdir(parents=True, exist_ok=True)
    master = [*hosts.wrap(hosts.master), *run.command(port), "--master", "--expect-workers", str(processes),
              "--master-bind-host", hosts.master_ip]  # fmt: skip
    env = {**os.environ, **child.env, "PYTHONUNBUFFERED": "1"}
    workers: list[subprocess.Popen[bytes]] = []
    sampler: CpuSampler | None = None

    def on_master(pid: int) -> None:
        nonlocal sampler
        for i, count in enumerate(per_host):
            if count == 0:
                continue
            argv = [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(run.locustfile),
                "--worker",
                "--master-host",
                hosts.master_ip,
                "--master-port",
                str(port),
                *(["--processes", str(count)] if count > 1 else []),
            ]
            with open(work / f"host{i}.log", "wb") as out:  # fmt: skip
                workers.append(subprocess.Popen([*hosts.wrap(hosts.worker(i)), *argv], stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                                start_new_session=True))  # fmt: skip
        log(f"[selfcheck] {len(workers)} load host(s) started: {per_host} load process(es)")
        sampler = CpuSampler(pid, server_pids, load_roots=[w.pid for w in workers])
        sampler.start()

    problems: list[str] = []
    try:
        done = child.run(master, output=work / "locust.log", on_start=on_master)
    finally:
        child.stop()
        for i, proc in enumerate(workers):
            code = _stop(proc, WORKER_STOP_S)
            if code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                problems.append(f"load host {i} ended with exit {code}: see {work / f'host{i}.log'}")
        if sampler is not None:
            sampler.stop()
    assert sampler is not None
    usage = done.rusage
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else math.nan
    return HostsRun(done.exit_code, done.seconds, cpu, sampler, problems, per_host)


__all__ = ["HostsRun", "NetnsUnavailable", "load_hosts", "run_on_hosts", "spread"]
