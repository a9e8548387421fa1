"""Stages and arrival schedules: when each trace item should be sent.

Pure and deterministic, so the schedule a run follows can be reproduced, split across worker
processes, and checked against the reference harness without sending anything.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tailgate.load.prompts import Prompt
from tailgate.load.workload import TraceItem


@dataclass(frozen=True, slots=True)
class Arrival:
    item: TraceItem
    offset_s: float
    """Intended send time relative to the start of the stage (continuous) or batch (gated)."""
    batch: int | None = None
    prompt: Prompt | None = None
    """The prompt to send; None = the seed filler built from the planned length (the default source)."""


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    label: str
    arm: str
    rate_or_batch: float
    warmup: int
    groups: tuple[tuple[Arrival, ...], ...]
    """Units that start together: one group for an open-loop stage, one per batch when gated.

    A group starts only after every request of the previous group has ended."""

    @property
    def arrivals(self) -> list[Arrival]:
        return [a for g in self.groups for a in g]

    @property
    def size(self) -> int:
        return sum(len(g) for g in self.groups)


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Open-loop arrival offsets drawn as the reference harness draws them.

    It sends, then sleeps ``Random(seed + 1).expovariate(rate)``: item i goes out at the sum of
    the first i gaps. Absolute offsets (not relative sleeps) keep the schedule from drifting.
    """
    rng = random.Random(seed + 1)
    offsets = []
    t = 0.0
    for _ in range(count):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def rate_label(rate: float) -> str:
    """A rate or batch size inside a stage label or folder name: ``2.5`` -> ``2p5`` (no dot in file names)."""
    return f"{rate:g}".replace(".", "p")


def continuous_stage(
    index: int,
    items: Sequence[TraceItem],
    rate: float,
    seed: int,
    warmup: int,
    *,
    offsets: Sequence[float] | None = None,
    label: str | None = None,
) -> Stage:
    """An open-loop stage: Poisson offsets unless ``offsets`` (gamma, a replayed trace) are given."""
    if offsets is None:
        offsets = poisson_offsets(len(items), rate, seed)
    arrivals = tuple(Arrival(it, off) for it, off in zip(items, offsets, strict=True))
    return Stage(index, label or f"cont_r{rate_label(rate)}", "continuous", rate, warmup, (arrivals,))


def with_prompts(stage: Stage, prompts: Sequence[Prompt | None]) -> Stage:
    """The same schedule carrying these prompts, in arrival order."""
    it = iter(prompts)
    groups = tuple(tuple(replace(a, prompt=next(it)) for a in g) for g in stage.groups)
    return replace(stage, groups=groups)


def gated_stage(index: int, items: Sequence[TraceItem], batch_size: int, warmup: int) -> Stage:
    groups = tuple(
        tuple(Arrival(it, 0.0, k) for it in items[start : start + batch_size])
        for k, start in enumerate(range(0, len(items), batch_size))
    )
    return Stage(index, f"gated_b{batch_size}", "gated", float(batch_size), warmup, groups)


def share(arrivals: Sequence[Arrival], worker_index: int, worker_count: int) -> list[Arrival]:
    """Worker ``w`` of ``W`` takes every W-th arrival of the one master schedule.

    The union over workers is exactly the single-process schedule, each item once, at the same
    intended times; only which process sends it changes.
    """
    return list(arrivals[worker_index::worker_count])
