"""The self-check's run: what it asks for (:class:`SelfCheckConfig`), how many load processes and reference
workers that takes (:func:`size_run`), and the Locust run that puts the load on the reference server, on this
host or over several load hosts (:mod:`tailgate.verify.multihost`). What the run left is joined and judged
by :mod:`tailgate.verify.selfcheck`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tailgate.cell import CellSpec, run_cell
from tailgate.clientbound import CHUNK_P99, DEFAULT_LIMITS, MERGED, TTFT_P99, WORST_GAP_MAX, WORST_GAP_P99
from tailgate.jsontypes import JsonObject, as_object, json_opt_int
from tailgate.load.hostcapacity import HostCapacity, host_capacity
from tailgate.load.processes import auto_processes, truth_workers
from tailgate.optiontable import AUTO
from tailgate.records import RequestRecord, read_records
from tailgate.resultfiles import SUMMARY_GLOB
from tailgate.runner import ChildRunner, LocustRun
from tailgate.verify.cpu import CpuSampler
from tailgate.verify.cpusplit import SPLIT_MODES
from tailgate.verify.lateness import CLIENT_LAG_P99_MS
from tailgate.verify.multihost import run_on_hosts
from tailgate.verify.netns import Hosts

WARN_P99_MS = DEFAULT_LIMITS[CHUNK_P99]
"""A p99 chunk error above this means the generator, not the server, shapes the tail it reports."""
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class SelfCheckConfig:
    rate: float = 20.0
    """Arrivals per second (open-loop Poisson, the continuous arm's schedule)."""
    n: int = 200
    tokens: int = 100
    """Content chunks per stream (``max_tokens``)."""
    gap_ms: float = 10.0
    ttft_ms: float = 20.0
    processes: int = 1
    """Load processes in all (over every host); 0: auto, from the chunk rate and this host's calibration."""
    truth_workers: int = AUTO
    """Reference server processes on its one port; 0: auto, from the chunk rate and this host's calibration."""
    truth_realtime: bool = False
    """The reference's workers at SCHED_FIFO where allowed: a load that fills the cores delays reads, not writes."""
    server_write_delay_us: float = 0.0
    """Hold the reference's event loop this long after each write: a reference made to fall behind (tests)."""
    server_late_p99_ms: float | None = None
    """Bound on the reference's write lateness p99; None: a quarter of the gap (:mod:`tailgate.verify.lateness`)."""
    lag_p99_ms: float = CLIENT_LAG_P99_MS
    """Bound on the client's schedule lag p99."""
    hosts: int = 1
    """Load hosts: 2 or more runs Locust's master and its workers in network namespaces of their own."""
    prompt_tokens: int = 16
    seed: int = 7
    warn_p99_ms: float = WARN_P99_MS
    gap_p99_ms: float = DEFAULT_LIMITS[WORST_GAP_P99]
    gap_max_ms: float = DEFAULT_LIMITS[WORST_GAP_MAX]
    ttft_p99_ms: float = DEFAULT_LIMITS[TTFT_P99]
    merged_max: int = int(DEFAULT_LIMITS[MERGED])
    """The verdict's bounds (:mod:`tailgate.clientbound`); any one breached fails the check."""
    chunk_stamp: str | None = None
    """``--chunk-stamp`` of the Locust run (None: its default)."""
    keep_dir: str | None = None
    """Keep the trace, records, Locust log and chunk log here instead of a temporary folder."""
    host_watch: bool = True
    """Run a sleeper per CPU during the stage (:mod:`tailgate.verify.hostheld`) to tell held CPUs apart."""
    cpu_split: str = "auto"
    """``auto``: the reference and the load on CPUs of their own where the host has enough
    (:mod:`tailgate.verify.cpusplit`); ``off``: both sides share every CPU."""
    extra_locust_args: tuple[str, ...] = ()

    def limits(self) -> dict[str, float]:
        return {
            WORST_GAP_P99: self.gap_p99_ms, WORST_GAP_MAX: self.gap_max_ms, TTFT_P99: self.ttft_p99_ms,
            CHUNK_P99: self.warn_p99_ms, MERGED: self.merged_max,
        }  # fmt: skip

    def check(self) -> None:
        for name, value, low in (("--rate", self.rate, 0.0), ("--gap-ms", self.gap_ms, 0.0)):
            if not value > low:
                raise ValueError(f"{name}: must be above {low:g}, got {value:g}")
        if self.ttft_ms < 0:
            raise ValueError(f"--ttft-ms: must be 0 or more, got {self.ttft_ms:g}")
        for name, bound in (("--warn-ms", self.warn_p99_ms), ("--max-gap-p99-ms", self.gap_p99_ms),
                            ("--max-gap-ms", self.gap_max_ms), ("--max-ttft-p99-ms", self.ttft_p99_ms),
                            ("--max-merged", self.merged_max), ("--max-lag-p99-ms", self.lag_p99_ms),
                            ("--max-server-late-p99-ms", self.server_late_p99_ms or 0.0),
                            ("--server-write-delay-us", self.server_write_delay_us)):  # fmt: skip
            if not bound >= 0:
                raise ValueError(f"{name}: must be 0 or more, got {bound:g}")
        for name, ivalue in (("--n", self.n), ("--tokens", self.tokens), ("--hosts", self.hosts)):
            if ivalue < 1:
                raise ValueError(f"{name}: must be at least 1, got {ivalue}")
        for name, ivalue in (("--processes", self.processes), ("--truth-workers", self.truth_workers)):
            if ivalue < 0:
                raise ValueError(f"{name}: must be at least 1 (or auto), got {ivalue}")
        if self.hosts > 1 and self.processes not in (AUTO,) and self.processes < self.hosts:
            raise ValueError(f"--processes: {self.processes} cannot cover --hosts {self.hosts}: one per host at least")
        if self.n < 2:
            raise ValueError("--n: at least 2 requests, so there is an inter-arrival gap to test")
        if self.cpu_split not in SPLIT_MODES:
            raise ValueError(f"--cpu-split: one of {', '.join(SPLIT_MODES)}, got {self.cpu_split!r}")


def chunks_per_s(cfg: SelfCheckConfig) -> float:
    """The chunk rate the run asks for: what ``auto`` sizes load processes and reference workers from."""
    return cfg.rate * cfg.tokens


@dataclass(frozen=True, slots=True)
class Sizing:
    """How many load processes and reference workers a run has, and the capacities ``auto`` used."""

    processes: int
    truth_workers: int
    capacity: HostCapacity | None
    """None when neither count was ``auto`` (no calibration was needed)."""


def size_run(cfg: SelfCheckConfig, stamp: str, log: Callable[[str], None] = lambda _: None) -> Sizing:
    """Resolve ``auto`` (0) counts from the chunk rate and this host's calibration (run once, then cached)."""
    if AUTO not in (cfg.processes, cfg.truth_workers):
        return Sizing(cfg.processes, cfg.truth_workers, None)
    cap = host_capacity(log=log)
    chunks = chunks_per_s(cfg)
    workers = cfg.truth_workers or truth_workers(chunks)
    cores = os.cpu_count() or 1
    # the reference and the load share this host's cores: auto gives the load what the reference leaves, since a
    # process beyond the cores only turns CPU shortage into scheduling delay on both sides
    processes = cfg.processes or max(cfg.hosts, auto_processes(chunks, cores=max(1, cores - workers), stamp=stamp))
    wanted = auto_processes(chunks, cores=10**6, stamp=stamp) + truth_workers(chunks, cores=10**6)
    if wanted > cores:
        log(
            f"[selfcheck] {chunks:,.0f} chunks/s wants {wanted} processes (load and reference) where this host has "
            f"{cores} cores: sized to the cores; the verdict says which side fell behind"
        )
    return Sizing(processes, workers, cap)


def write_trace(path: Path, n: int, prompt_tokens: int, tokens: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt_tokens": prompt_tokens, "max_tokens": tokens}) + "\n")


def locust_run(
    cfg: SelfCheckConfig, host: str, trace: Path, results: Path, model: str, processes: int | None = None
) -> LocustRun:
    """The Locust run under test: the continuous arm exactly as a user runs it, plus chunk recording.

    Server sampling is off so that the only extra process is the one being measured; one stage
    needs no settle time. ``processes``: the resolved count (default: the config's, when not auto).
    """
    return LocustRun(
        arm="continuous", host=host, results=results, stage=("--rates", f"{cfg.rate:g}"), n=cfg.n, warmup=0,
        seed=cfg.seed, processes=processes or max(1, cfg.processes),
        chunk_stamp=cfg.chunk_stamp,
        extra=("--trace-file", str(trace), "--model", model, "--record-chunks", "--sample-metrics", "0",
               "--settle", "0", "--loglevel", "WARNING", *cfg.extra_locust_args),
    )  # fmt: skip


def locust_command(cfg: SelfCheckConfig, host: str, trace: Path, results: Path, model: str) -> list[str]:
    return locust_run(cfg, host, trace, results, model).command()


def capture_figures(results: Path) -> JsonObject | None:
    """The capture's drops and missed streams from the run's stage summaries (None: no capture ran)."""
    drops = missed = None
    for path in sorted(results.glob(SUMMARY_GLOB)):
        s = as_object(json.loads(path.read_text(encoding="utf-8")), where=str(path))
        dropped = json_opt_int(s, "capture_drops", where=str(path))
        if dropped is not None:
            drops = (drops or 0) + dropped
            missed = (missed or 0) + (json_opt_int(s, "capture_missed_streams", where=str(path)) or 0)
    return None if drops is None else {"drops": drops, "missed_streams": missed}


ACCOUNTING_KEYS = ("planned", "sent", "recorded", "lost_in_flight", "never_sent", "errors")


def accounting_figures(results: Path) -> dict[str, int]:
    """Where every planned request went, from the run's stage summaries (the master's, in a run over hosts)."""
    out = dict.fromkeys(ACCOUNTING_KEYS, 0)
    for path in sorted(results.glob(SUMMARY_GLOB)):
        s = as_object(json.loads(path.read_text(encoding="utf-8")), where=str(path))
        for key in ACCOUNTING_KEYS:
            out[key] += json_opt_int(s, key, where=str(path)) or 0
    return out


def accounting_problem(planned: int, records: int, accounting: Mapping[str, int]) -> str | None:
    """How the run's accounting fails to account for every planned request exactly once (None: it does): the
    records read back, and the stage summaries' tally of sends, records, losses and arrivals never sent."""
    a = accounting
    if (
        records == planned
        and (a["planned"], a["sent"], a["recorded"]) == (planned,) * 3
        and not (a["lost_in_flight"] or a["never_sent"])
    ):
        return None
    return (
        f"{planned} planned, {records} records read back; the summaries say {a['sent']} sent, {a['recorded']} "
        f"recorded, {a['lost_in_flight']} lost in flight, {a['never_sent']} never sent"
    )


def stage_window(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    sent = [r.sent_s for r in records]
    ends = [r.end_s for r in records if r.end_s is not None]
    if not sent or not ends:
        return None
    return min(sent), max(ends)


@dataclass(slots=True)
class LoadRun:
    """What one Locust run left behind, before any joining."""

    records: list[RequestRecord]
    partial_lines: int
    exit_code: int
    wall_s: float
    cpu_s_total: float
    """utime + stime of the Locust process and every child it waited for, start-up included."""
    sampler: CpuSampler
    log_path: Path
    problems: list[str] = field(default_factory=list)
    """What went wrong around the run that the join cannot see (a load host that did not end)."""

    def stage_cpu(self) -> dict[str, float] | None:
        window = stage_window(self.records)
        return self.sampler.window(*window) if window else None


def run_load(
    cfg: SelfCheckConfig,
    server: Any,
    work: Path,
    log: Callable[[str], None] = lambda _: None,
    processes: int | None = None,
) -> LoadRun:
    """Run the continuous arm with Locust against a started ground-truth server and read its records."""
    from tailgate.verify.groundtruth import DEFAULT_MODEL

    trace = work / "trace.jsonl"
    results = work / "results"
    write_trace(trace, cfg.n, cfg.prompt_tokens, cfg.tokens)
    run = locust_run(cfg, server.base_url, trace, results, DEFAULT_MODEL, processes)
    log(f"[selfcheck] server {server.base_url} (pid {server.pid}); running: {' '.join(run.command())}")
    log_path = work / "locust.log"
    child = ChildRunner(log, env={"PYTHONPATH": str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    sampler: CpuSampler | None = None

    def sample(pid: int) -> None:
        nonlocal sampler
        sampler = CpuSampler(pid, server.pids())
        sampler.start()

    try:
        # aside_root None: a kept folder's earlier results are removed, never mixed in
        done = run_cell(CellSpec(run, "the self-check's run", output=log_path), child, on_start=sample).child
    finally:
        child.stop()
        if sampler is not None:
            sampler.stop()
    assert sampler is not None
    usage = done.rusage
    scan = read_records(results)
    return LoadRun(
        records=scan.records, partial_lines=scan.partial_lines, exit_code=done.exit_code, wall_s=done.seconds,
        cpu_s_total=usage.ru_utime + usage.ru_stime if usage is not None else math.nan, sampler=sampler,
        log_path=log_path,
    )  # fmt: skip


def run_load_hosts(
    cfg: SelfCheckConfig, server: Any, work: Path, hosts: Hosts, processes: int, log: Callable[[str], None]
) -> LoadRun:
    """:func:`run_load` with the master beside the server and the load processes on ``cfg.hosts`` load hosts."""
    from tailgate.verify.groundtruth import DEFAULT_MODEL

    trace = work / "trace.jsonl"
    write_trace(trace, cfg.n, cfg.prompt_tokens, cfg.tokens)
    run = replace(locust_run(cfg, server.base_url, trace, work / "results", DEFAULT_MODEL), processes=1)
    log(f"[selfcheck] server {server.base_url}; master and {cfg.hosts} load hosts in network namespaces")
    child = ChildRunner(log, env={"PYTHONPATH": str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    done = run_on_hosts(run, hosts, processes, server.pids(), work, child, log)
    scan = read_records(run.results)
    return LoadRun(
        records=scan.records, partial_lines=scan.partial_lines, exit_code=done.exit_code, wall_s=done.seconds,
        cpu_s_total=done.cpu_s_total, sampler=done.sampler, log_path=work / "locust.log", problems=done.problems,
    )  # fmt: skip
