"""CPU time of the load processes and of the whole machine while a self-check runs: what the load
generator cost, so a timing error can be read beside the CPU it had.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from tailgate.jsontypes import JsonObject

SAMPLE_INTERVAL_S = 0.2
"""How often the CPU of the load processes is read; processes that exit keep their last reading."""

# ------------------------------------------------------------------------------------------- machine


def _proc_stat() -> tuple[float, float, float]:
    """(busy, total, stolen) CPU seconds over all CPUs since boot.

    Stolen time is when the hypervisor ran something else instead of this machine's CPUs: to every process
    in it, a pause it cannot see coming. It is not busy time of this machine, so it is kept apart; a late
    read during a stage with much of it is the host's doing, not the load generator's.
    """
    import psutil

    times = psutil.cpu_times()
    total = sum(times)
    steal = getattr(times, "steal", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0) - steal, total, steal


def machine_facts() -> JsonObject:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cores": os.cpu_count(), "loadavg_1m": load[0], "loadavg_5m": load[1], "loadavg_15m": load[2]}


class CpuSampler(threading.Thread):
    """Reads the CPU time of a process tree, of other process trees (the server), and of the whole machine every
    ``SAMPLE_INTERVAL_S``.

    Forked load processes exit at the end of a run; the last reading of each pid is kept, so the
    tree's total only loses what a process spent after its last reading.
    """

    def __init__(
        self,
        root_pid: int,
        other_pids: Sequence[int] = (),
        interval_s: float = SAMPLE_INTERVAL_S,
        load_roots: Sequence[int] = (),
    ) -> None:
        super().__init__(daemon=True, name="tailgate-cpu-sampler")
        self.root_pid = root_pid
        self.load_roots = list(load_roots)
        """More process trees counted as the load (Locust workers on other hosts of this machine)."""
        self.other_pids = list(other_pids)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float, float, float]] = []
        """(wall time, tree CPU s, other pids' CPU s, machine busy CPU s, machine total CPU s, stolen CPU s)."""
        self._seen: dict[int, float] = {}
        self._others: dict[int, float] = {}
        self._halt = threading.Event()

    def _read(self) -> None:
        import psutil

        procs = []
        for pid in (self.root_pid, *self.load_roots):
            try:
                root = psutil.Process(pid)
                procs += [root, *root.children(recursive=True)]
            except psutil.Error:
                pass
        for p in procs:
            try:
                t = p.cpu_times()
                self._seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        for pid in self.other_pids:  # with their children: a server of several workers is one process tree
            try:
                root = psutil.Process(pid)
                others = [root, *root.children(recursive=True)]
            except psutil.Error:
                others = []
            for p in others:
                try:
                    t = p.cpu_times()
                    self._others[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
        busy, total, steal = _proc_stat()
        self.samples.append((time.time(), sum(self._seen.values()), sum(self._others.values()), busy, total, steal))

    def run(self) -> None:
        while not self._halt.is_set():
            self._read()
            self._halt.wait(self.interval_s)
        self._read()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def window(self, start_s: float, end_s: float) -> dict[str, float] | None:
        """CPU use between the last reading at or before ``start_s`` and the first at or after ``end_s``."""
        if len(self.samples) < 2:
            return None
        before = [s for s in self.samples if s[0] <= start_s] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= end_s] or self.samples[-1:]
        a, b = before[-1], after[0]
        wall = b[0] - a[0]
        if wall <= 0:
            return None
        cores = os.cpu_count() or 1
        span = max(1e-9, b[4] - a[4])
        machine = (b[3] - a[3]) / span * cores
        return {
            "wall_s": wall,
            "load_cpu_s": b[1] - a[1],
            "load_cores": (b[1] - a[1]) / wall,
            "server_cpu_s": b[2] - a[2],
            "server_cores": (b[2] - a[2]) / wall,
            "machine_busy_cores": machine,
            "others_busy_cores": machine - (b[1] - a[1] + b[2] - a[2]) / wall,
            "host_steal_share": (b[5] - a[5]) / span,
        }
