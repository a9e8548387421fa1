"""The stage warm-up both the suite and the SLO search give a (re)started server before its first measured run.

A fresh engine pauses the first time it meets a new load: kernel compilation, graph capture, allocator growth
at a new batch size. On an H200 the first 20 req/s of a fresh vLLM brought a ~300 ms pause inside the engine
that a 25-request warm-up at the stage's own rate never reached. So the server is loaded at the highest rate
the run will use, in rounds, until a round's worst gap is no longer well below the round before's: that
round met no first-time pause either. One rule, one set of constants, for every command that measures.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    JsonShapeError,
    json_bool,
    json_extra,
    json_float,
    json_int,
    json_objects,
    json_opt_int,
    json_opt_str,
    json_str,
)

if TYPE_CHECKING:
    from tailgate.records import RequestRecord

STAGE_WARMUP_DIR = "stage-warmup"
"""Where the stage warm-up's runs go: a subfolder, so the report never reads them as cells."""
STAGE_WARMUP_ROUNDS = 3
STAGE_WARMUP_SEED = 500
PAUSE_RATIO = 1.25
"""A warm-up round whose worst gap is not this many times below the round before's: the stalls stopped falling."""
GPU_STAGE_WARMUP = 200
"""Requests per round by default: enough arrivals at a GPU's rates to reach every batch size the stage will."""
EMBEDDED_STAGE_WARMUP = 0
"""None on the embedded CPU server: it runs eager (no graphs to capture) and its rounds would cost minutes."""


def add_stage_warmup_argument(p: argparse.ArgumentParser, where: str) -> None:
    """``--stage-warmup``, declared once for every command that warms a server up (``where``: at what rate)."""
    p.add_argument("--stage-warmup", type=int, default=None,
                   help=f"before the first measured run on a server, rounds of this many requests at {where} until "
                        f"a round's worst gap stops falling (first-time pauses; default {GPU_STAGE_WARMUP}, "
                        f"embedded {EMBEDDED_STAGE_WARMUP}; 0: none)")  # fmt: skip


def stage_warmup_of(value: int | None, embedded: bool) -> int:
    """The requests per round asked for, or the default of the server kind; raises ValueError when negative."""
    if value is not None and value < 0:
        raise ValueError(f"--stage-warmup: must be 0 (none) or more requests, got {value}")
    if value is not None:
        return value
    return EMBEDDED_STAGE_WARMUP if embedded else GPU_STAGE_WARMUP


def worst_gap_ms(records: Iterable[RequestRecord]) -> float:
    """The worst inter-chunk gap of any stream in a round (0 when none streamed)."""
    return max((r.worst_gap_ms for r in records if r.worst_gap_ms is not None), default=0.0)


def still_falling(before: float, now: float) -> bool:
    """A round whose worst gap is well below the round before's: the round before still met a first-time pause."""
    return now * PAUSE_RATIO < before


@dataclass(frozen=True, slots=True)
class WarmupRound:
    """One warm-up round as ``suite.json`` and ``slo.json`` keep it: the load it put on the server (the suite's
    arm, value and requests, or the search's rate) and the worst gap it met."""

    round: int
    dir: str
    worst_gap_ms: float
    seconds: float | None = None
    arm: str | None = None
    value: float | None = None
    requests: int | None = None
    rate: float | None = None
    extra: JsonObject = field(default_factory=dict)
    """Keys another version wrote: kept, so a round read back is written back unchanged."""

    LOAD: ClassVar[tuple[str, ...]] = ("arm", "value", "requests", "rate")
    """The load's keys, written only where the command that ran the round sets them."""

    def to_json(self) -> JsonObject:
        load: JsonObject = {k: getattr(self, k) for k in self.LOAD if getattr(self, k) is not None}
        return {"round": self.round, "dir": self.dir, **load, "worst_gap_ms": self.worst_gap_ms,
                "seconds": self.seconds, **self.extra}  # fmt: skip

    @classmethod
    def from_json(cls, data: JsonMapping) -> WarmupRound:
        """A round read back; raises :class:`tailgate.jsontypes.JsonShapeError` (a ValueError) naming the key
        that does not fit."""
        where = "stage warm-up round"
        worst = _number(data, "worst_gap_ms", where)
        if worst is None:
            raise JsonShapeError(f"{where}: key 'worst_gap_ms' should be a number, got null")
        return cls(
            round=json_int(data, "round", where=where), dir=json_str(data, "dir", where=where), worst_gap_ms=worst,
            seconds=_number(data, "seconds", where), arm=json_opt_str(data, "arm", where=where),
            value=_number(data, "value", where), requests=json_opt_int(data, "requests", where=where),
            rate=_number(data, "rate", where), extra=json_extra(data, _ROUND_KEYS),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class StageWarmup:
    """A server's warm-up: its rounds in order, and whether the worst gap stopped falling before the last."""

    rounds: tuple[WarmupRound, ...]
    settled: bool

    def to_json(self) -> JsonObject:
        return {"rounds": [r.to_json() for r in self.rounds], "settled": self.settled}

    @classmethod
    def from_json(cls, data: JsonMapping) -> StageWarmup:
        """A warm-up read back (absent or null keys: no rounds, not settled); raises
        :class:`tailgate.jsontypes.JsonShapeError` naming a key that does not fit."""
        listed = json_objects(data, "rounds", where="stage warm-up") if data.get("rounds") is not None else []
        rounds = tuple(WarmupRound.from_json(r) for r in listed)
        return cls(rounds, data.get("settled") is not None and json_bool(data, "settled", where="stage warm-up"))


def _number(data: JsonMapping, key: str, where: str) -> float | None:
    """A number as it was written (``5`` stays an integer, so a round read back is written back unchanged), or
    None when absent or null."""
    value = data.get(key)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    return json_float(data, key, where=where)  # raises, naming the key


_ROUND_KEYS = frozenset({"round", "dir", "worst_gap_ms", "seconds", *WarmupRound.LOAD})


def warm_up(run_round: Callable[[int], WarmupRound], rounds: int = STAGE_WARMUP_ROUNDS) -> StageWarmup:
    """Run rounds until one is no longer well below the round before, ``rounds`` at most; ``settled`` says
    whether that point was reached."""
    done: list[WarmupRound] = []
    for k in range(1, rounds + 1):
        done.append(run_round(k))
        if k > 1 and not still_falling(done[-2].worst_gap_ms, done[-1].worst_gap_ms):
            break  # no longer well below the round before: that round had no first-time pause either
    settled = len(done) > 1 and not still_falling(done[-2].worst_gap_ms, done[-1].worst_gap_ms)
    return StageWarmup(tuple(done), settled)


def warmup_line(warm: StageWarmup) -> str:
    """The console's one line on a server's warm-up."""
    shown = " -> ".join(f"{r.worst_gap_ms:g}" for r in warm.rounds)
    ending = "no first-time pause left" if warm.settled else "still falling after the last round"
    return f"stage warm-up worst gaps {shown} ms: {ending}"


__all__ = [
    "PAUSE_RATIO",
    "STAGE_WARMUP_DIR",
    "STAGE_WARMUP_ROUNDS",
    "STAGE_WARMUP_SEED",
    "StageWarmup",
    "WarmupRound",
    "add_stage_warmup_argument",
    "stage_warmup_of",
    "still_falling",
    "warm_up",
    "warmup_line",
    "worst_gap_ms",
]
