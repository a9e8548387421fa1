"""The self-check's reference server and its load on CPUs of their own.

On one host the reference and the client share the cores. The reference's workers run at SCHED_FIFO (so a
load that fills the machine delays the client's reads, not the reference's writes), and a FIFO worker that
wakes on a CPU where a load process runs takes it: the load process waits until the scheduler moves it, up
to a tick or two (4-8 ms). On the 16-core host at 2,000 req/s every CPU was held that way now and then (the
per-CPU sleepers overslept by up to 8 ms) and a few reads per run came one 10-ms gap late, which the
verdict blamed on the client. Given disjoint CPUs, neither side can take the other's: what is left of the
client's error is the client's.

The split is made by the self-check's own affinity around each start (children inherit it at fork), so
the reference's workers and every Locust process land on their side without knowing it. A machine with
fewer than :data:`MIN_CPUS` usable CPUs is not split: one side per core would leave the other no room.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

MIN_CPUS = 4
"""Fewest usable CPUs the automatic split takes; below, both sides share them as before."""

SPLIT_MODES = ("auto", "off")


@dataclass(frozen=True, slots=True)
class CpuSplit:
    """The CPUs each side of the self-check runs on."""

    reference: tuple[int, ...]
    load: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {"reference": list(self.reference), "load": list(self.load)}


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cpus(cpus: Sequence[int], reference_processes: int, load_processes: int) -> CpuSplit | None:
    """The CPUs in two sets sized like the two sides' processes, each side at least one CPU; None when there
    are fewer than :data:`MIN_CPUS` or a side has no process.

    The reference gets the low CPUs: interrupts are usually steered there, and its writes, not its reads,
    are what it times."""
    ordered = sorted(set(cpus))
    if len(ordered) < MIN_CPUS or reference_processes < 1 or load_processes < 1:
        return None
    share = reference_processes / (reference_processes + load_processes)
    ref = min(len(ordered) - 1, max(1, round(len(ordered) * share)))
    return CpuSplit(tuple(ordered[:ref]), tuple(ordered[ref:]))


def cpu_ranges(cpus: Sequence[int]) -> str:
    """``0-7,12``: the CPUs as ``taskset`` and ``/proc`` write them."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = ordered[0] if ordered else 0
    for cpu in [*ordered[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out) if ordered else ""


@contextmanager
def children_on(cpus: Sequence[int] | None) -> Iterator[None]:
    """Processes started inside run on ``cpus`` (None: wherever they would): this process's affinity is set
    for the starts and given back after, so only the children keep it."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


__all__ = ["MIN_CPUS", "SPLIT_MODES", "CpuSplit", "children_on", "cpu_ranges", "split_cpus", "usable_cpus"]
