"""One probe attempt, typed from the Locust child that ran it to the verdict, the answer's row and the fitted model.

An attempt leaves two things in its folder: the records (JSON lines, read by :func:`tailgate.records.read_records`)
and the probe mark (``PROBE_MARK``), which says how the run went and lets a resumed search reuse it. The mark is
the only file here: :meth:`ProbeMark.to_json` / :meth:`ProbeMark.from_json` meet it. Everything the search derives
from an attempt travels as a :class:`ProbeAttempt`; ``slo.json`` keeps only its row
(:func:`tailgate.slo.answer.attempt_row`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tailgate.contracts import StageSummary
from tailgate.jsontypes import (
    JsonMapping,
    JsonObject,
    as_object,
    json_float,
    json_floats,
    json_int,
    json_opt_int,
    json_opt_number,
    json_opt_str,
)
from tailgate.records import RequestRecord


@dataclass(frozen=True, slots=True)
class ProbeMark:
    """How one attempt's Locust child ended, as its mark file keeps it: what a resume reads instead of running
    the attempt again, and what the attempt's row in ``slo.json`` reports beside the records."""

    rate: float
    seed: int
    exit_code: int | None = None
    seconds: float | None = None
    stopped_early: str | None = None
    """Why the search stopped the child before its arrivals ended (None: it ran to the end)."""
    waiting_max: float | None = None
    queue_stop: int | None = None
    waiting_series: tuple[float, ...] = ()
    """The server's waiting queue, every sample in time order: the steady-state check tests it for a trend."""
    errors_at_stop: int | None = None
    kv_capacity_tokens: int | None = None
    """The server's KV pool in tokens while the attempt ran (None: the server did not state it)."""
    others_busy_cores: float | None = None
    """CPU the machine's other processes took while the attempt ran, in cores (beside the server's process
    tree and the Locust child's); None: not measured (the server is not a process of this machine)."""

    def to_json(self) -> JsonObject:
        return {
            "rate": self.rate, "seed": self.seed, "exit_code": self.exit_code, "seconds": self.seconds,
            "stopped_early": self.stopped_early, "waiting_max": self.waiting_max, "queue_stop": self.queue_stop,
            "waiting_series": list(self.waiting_series), "errors_at_stop": self.errors_at_stop,
            "kv_capacity_tokens": self.kv_capacity_tokens, "others_busy_cores": self.others_busy_cores,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: JsonMapping, *, where: str = "") -> ProbeMark:
        """A mark as any version wrote it: keys it lacks take their defaults, keys it adds are not needed."""
        series = json_floats(data, "waiting_series", where=where) if data.get("waiting_series") is not None else []
        return cls(
            rate=json_float(data, "rate", where=where), seed=json_int(data, "seed", where=where),
            exit_code=json_opt_int(data, "exit_code", where=where),
            seconds=json_opt_number(data, "seconds", where=where),
            stopped_early=json_opt_str(data, "stopped_early", where=where),
            waiting_max=json_opt_number(data, "waiting_max", where=where),
            queue_stop=json_opt_int(data, "queue_stop", where=where), waiting_series=tuple(series),
            errors_at_stop=json_opt_int(data, "errors_at_stop", where=where),
            kv_capacity_tokens=json_opt_int(data, "kv_capacity_tokens", where=where),
            others_busy_cores=json_opt_number(data, "others_busy_cores", where=where),
        )  # fmt: skip

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> ProbeMark:
        return cls.from_json(as_object(json.loads(path.read_text()), where=str(path)), where=str(path))


@dataclass(frozen=True, slots=True)
class ProbeAttempt:
    """What a verdict needs from one attempt: its measured records and counts, read once from its folder.

    Attempts of one rate are pooled, so a later look at the rate sees every earlier attempt as it was read."""

    measured: Sequence[RequestRecord]
    """The records past the warm-up (the completion-order rule), as the records file holds them."""
    sent: int
    errors: int
    stopped_early: str | None = None
    cancelled: int = 0
    """Requests the attempt's own early stop cut off: they have no outcome, so they are not in the error share."""
    waiting_series: Sequence[float] = ()
    workload: int = 0
    """The seed of the attempt's trace: re-runs of one workload repeat its build-ups, so they are one cluster."""
    summary: StageSummary | None = None
    records: Sequence[RequestRecord] = ()
    """Every record of the attempt, warm-up included: what the fitted step loop replays."""
    kv_capacity_tokens: int | None = None
    """The server's KV pool in tokens: the fitted step loop admits and preempts by it where it is known."""


__all__ = ["ProbeAttempt", "ProbeMark"]
