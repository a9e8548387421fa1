"""What one refresh of the Tail latency tab costs the load generator's event loop.

The tab's figures are computed in the process that timestamps chunks, so a refresh is time that
loop does not read sockets. This builds a run folder of the suite's default size (4 stages of
525 records, one ``server-metrics.jsonl`` sample a second), then times, on this machine:

- the first refresh (every record parsed once),
- a refresh after 20 more records (2 s of a 10 req/s stage: the steady state while a run goes),
- a refresh with nothing new,

each as CPU time in all and as the longest slice between two hand-backs to the loop.

    python benchmarks/webui_refresh.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailgate.load.plan import continuous_stage
from tailgate.load.workload import make_trace
from tailgate.records import RecordWriter, RequestRecord
from tailgate.webui import live
from tailgate.webui.live import LiveRun, table_rows

STAGES = (1.0, 5.0, 10.0, 20.0)
PER_STAGE = 525


@dataclass
class FakeSettings:
    arm: str = "continuous"
    host: str = "http://127.0.0.1:8000"
    model: str = "m"
    warmup: int = 25
    warmup_rule: str = "completion"


@dataclass
class FakeSummaries:
    """The stage summaries' attributes the live view reads."""

    by_stage: dict[int, Any] = field(default_factory=dict)
    before: dict[int, Any] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)


@dataclass
class FakeSession:
    """The attributes of a RunSession the live view reads."""

    folder: Path
    stages: list[Any]
    settings: FakeSettings = field(default_factory=FakeSettings)
    run_id: str = "bench"
    status: str = "running"
    stop_reason: str | None = None
    ended: bool = False
    ended_at: float | None = None
    stopping: bool = False
    started: float = field(default_factory=time.time)
    coordinator_alive: bool = True
    sampler_alive: bool = True
    current: Any = None
    summaries: FakeSummaries = field(default_factory=FakeSummaries)

    def report_state(self) -> str:
        return "none"

    def report_error(self) -> None:
        return None


def record(rng: random.Random, stage: int, trace_id: int, t: float) -> RequestRecord:
    ttft = rng.lognormvariate(4, 1)
    total = ttft + rng.lognormvariate(7, 0.5)
    return RequestRecord(
        run_id="bench", worker="w", trace_id=trace_id, stage=stage, stage_label=f"cont_r{STAGES[stage]:g}",
        arm="continuous", rate_or_batch=STAGES[stage], batch=None, prompt_tokens_planned=200, max_tokens=100,
        ignore_eos=True, intended_s=t, sent_s=t, schedule_lag_ms=rng.random(), in_flight_at_send=3,
        end_s=t + total / 1e3,
        first_chunk_s=t + ttft / 1e3, last_chunk_s=t + total / 1e3, ttft_ms=ttft, ttft_from_intended_ms=ttft,
        worst_gap_ms=rng.random() * 80, total_ms=total, total_from_intended_ms=total, chunks=100, completion_tokens=100,
        finish_reason="length", status=200, response_id=f"cmpl-{trace_id}",
    )  # fmt: skip


def timed(fn: Any) -> tuple[float, float]:
    """CPU milliseconds in all, and the longest CPU stretch without handing the event loop back.

    CPU time (``thread_time``), not wall time: on a shared machine the wall clock also counts the time
    other processes held the core, which is not work this refresh asks of the loop."""
    clock = time.thread_time
    marks = [clock()]
    real = live.pause

    def pause() -> None:
        marks.append(clock())
        real()
        marks.append(clock())

    live.pause = pause
    try:
        fn()
    finally:
        live.pause = real
    marks.append(clock())
    held = max(b - a for a, b in zip(marks[::2], marks[1::2], strict=True))
    return (marks[-1] - marks[0]) * 1000, held * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    rng = random.Random(1)
    trace = make_trace(PER_STAGE, 7)
    stages = [continuous_stage(i, trace, r, 7, 25) for i, r in enumerate(STAGES)]
    first, steady, idle = [], [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            writer = RecordWriter(folder, "w")
            with open(folder / "sent-w.log", "w") as sent, open(folder / "server-metrics.jsonl", "w") as metrics:
                for s in range(len(STAGES)):
                    for i in range(PER_STAGE - (20 if s == len(STAGES) - 1 else 0)):
                        writer.write(record(rng, s, i, time.time()))
                        sent.write(f"{s} {i}\n")
                for k in range(600):
                    metrics.write(json.dumps({"t": time.time() + k, "running": 5, "waiting": 1, "kv_usage": 0.2,
                                              "preemptions_total": 0}) + "\n")  # fmt: skip
            session = FakeSession(folder, stages, current=stages[-1])
            view = LiveRun(session)
            first.append(timed(lambda view=view: table_rows(view.snapshot())))
            for i in range(PER_STAGE - 20, PER_STAGE):
                writer.write(record(rng, len(STAGES) - 1, i, time.time()))
            steady.append(timed(lambda view=view: table_rows(view.snapshot())))
            idle.append(timed(lambda view=view: table_rows(view.snapshot())))
            writer.close()

    def line(name: str, xs: list[tuple[float, float]]) -> str:
        total, held = [x[0] for x in xs], [x[1] for x in xs]
        return (f"{name:<38} CPU median {statistics.median(total):6.2f} ms (max {max(total):6.2f}); "
                f"longest slice: median {statistics.median(held):5.2f} ms (max {max(held):5.2f})")  # fmt: skip

    print(f"run folder: {len(STAGES)} stages x {PER_STAGE} records, 600 server samples; {args.repeat} repeats")
    print(line("first refresh (parse every record)", first))
    print(line("refresh after 20 new records", steady))
    print(line("refresh with nothing new", idle))


if __name__ == "__main__":
    main()
