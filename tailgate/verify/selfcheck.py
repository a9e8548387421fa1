"""``tailgate selfcheck``: measure the load generator's own timing error against a server whose writes are known.

Every figure tailgate reports is a client-side timestamp, and a load generator that falls behind
(a busy event loop, a slow parser, a starved core) inflates exactly the tail it is meant to
measure. This command makes that error a number instead of an assumption: it starts the
ground-truth server (:mod:`tailgate.verify.groundtruth`) in its own process, runs a real
``locust --headless`` of the continuous arm against it with ``--record-chunks``, and joins the two
logs chunk by chunk. Both sides read ``CLOCK_MONOTONIC`` (the server's ``time.monotonic_ns``, the
client's ``perf_counter_ns`` through each record's ``sent_mono_ns``), so the join needs no clock
synchronisation and no wall-clock round trip.

Definitions, all in milliseconds:

- chunk error: when the client timestamped content chunk *i* minus when the server's write of it
  returned. What the client adds on top of the wire: loopback delivery, waking the event loop,
  parsing. It can dip below zero by the write call's own duration, because a reader on another
  core may get the bytes before the write returns.
- true TTFT: the server's first write minus the client's actual send (so it keeps connect and
  upload, as the client's TTFT does); TTFT error: the client's ``ttft_ms`` minus that.
- true worst gap: the longest interval between the server's consecutive writes of a stream;
  worst-gap error: the client's ``worst_gap_ms`` minus that.
- schedule lag: actual send minus intended send, from the records.
- inter-arrival KS: actual sends against Exp(rate), a one-sample Kolmogorov-Smirnov test.

The join is exact by construction: the server's response id ``cmpl-<seq>`` names the request, and
chunk *i* of a record is chunk *i* of that sequence number. Anything unmatched is reported, and
makes the check fail, because a mis-join would make every error figure meaningless.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tailgate import locustfiles
from tailgate.arms import CONTINUOUS
from tailgate.load.processes import master_port_args
from tailgate.records import read_records
from tailgate.stats import percentile

EXIT_OK = 0
EXIT_WARN = 1
EXIT_USAGE = 2

WARN_P99_MS = 1.0
"""A p99 chunk error above this means the generator, not the server, shapes the tail it reports."""
KS_ALPHA = 0.01
"""Significance level of the inter-arrival test: one fixed seed should not fail it by bad luck."""
SAMPLE_INTERVAL_S = 0.2
"""How often the CPU of the load processes is read; processes that exit keep their last reading."""

_ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = Path(locustfiles.__file__).with_name(CONTINUOUS.locustfile)
_MS = 1e6


# ----------------------------------------------------------------------------------------- statistics


def kolmogorov_sf(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution (the asymptotic KS null), by its alternating series.

    Below 0.2 the series converges too slowly to be worth summing and the value is 1 to eight
    decimals anyway.
    """
    if x <= 0.2:
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = math.exp(-2.0 * k * k * x * x)
        total += term if k % 2 else -term
        if term < 1e-16:
            break
    return min(1.0, max(0.0, 2.0 * total))


@dataclass(frozen=True, slots=True)
class KSResult:
    statistic: float
    """D = sup |F_n(x) - F(x)|."""
    n: int
    p_value: float
    """Asymptotic, with Stephens' small-sample correction ``(sqrt(n) + 0.12 + 0.11/sqrt(n)) * D``."""


def ks_exponential(samples: Sequence[float], rate: float) -> KSResult:
    """One-sample KS test of ``samples`` against Exp(``rate``), the rate known in advance (not fitted).

    The rate is the one the schedule was drawn with, so the textbook null distribution applies;
    fitting it from the data would need Lilliefors' tables instead.
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    xs = sorted(samples)
    n = len(xs)
    if n == 0:
        return KSResult(0.0, 0, 1.0)
    d = 0.0
    for i, x in enumerate(xs):
        cdf = -math.expm1(-rate * x) if x > 0 else 0.0
        d = max(d, (i + 1) / n - cdf, cdf - i / n)
    root = math.sqrt(n)
    return KSResult(d, n, kolmogorov_sf((root + 0.12 + 0.11 / root) * d))


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, min, p50, p99, p99.9 and max, the percentiles interpolated as everywhere else in tailgate."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "p99": None, "p99.9": None, "max": None}
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "p99.9": percentile(values, 99.9),
        "max": max(values),
    }


# --------------------------------------------------------------------------------------------- join


@dataclass(slots=True)
class Join:
    """Client records matched to the server's chunk log, and every error derived from the match."""

    requests: int = 0
    """Records of the run (successful or not)."""
    failed: int = 0
    matched_requests: int = 0
    client_chunks: int = 0
    server_chunks: int = 0
    """Chunks the server wrote for the sequence numbers the records name."""
    matched_chunks: int = 0
    unclaimed_server_requests: int = 0
    """Completions the server streamed that no record names (a lost record, or another client)."""
    problems: list[str] = field(default_factory=list)
    chunk_error_ms: list[float] = field(default_factory=list)
    chunk_error_begin_ms: list[float] = field(default_factory=list)
    """The same against the instant the server's write call began: an upper bound, never negative
    for a correct match, that also holds when the server was descheduled inside its write."""
    ttft_error_ms: list[float] = field(default_factory=list)
    worst_gap_error_ms: list[float] = field(default_factory=list)
    true_ttft_ms: list[float] = field(default_factory=list)
    true_worst_gap_ms: list[float] = field(default_factory=list)
    upload_ms: list[float] = field(default_factory=list)
    """Server's body-received minus the client's send: connect, upload and the server's parse."""
    schedule_lag_ms: list[float] = field(default_factory=list)
    sent_mono_ns: list[int] = field(default_factory=list)
    write_lateness_ms: list[float] = field(default_factory=list)
    """The server's own error, write minus its target: context for the client's."""
    by_stamp: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {m: {"chunk": [], "ttft": [], "gap": []} for m in ("recv", "kernel")}
    )
    """Chunk, TTFT and worst-gap errors as each chunk stamp would have made them, from the same reads
    (records with ``chunk_read_delays_ms`` whose reads all had kernel stamps)."""

    @property
    def exact(self) -> bool:
        return (
            not self.problems
            and self.failed == 0
            and self.matched_requests == self.requests > 0
            and self.matched_chunks == self.client_chunks == self.server_chunks
            and self.unclaimed_server_requests == 0
        )


def _seq_of(response_id: Any) -> int | None:
    if isinstance(response_id, str) and response_id.startswith("cmpl-") and response_id[5:].isdigit():
        return int(response_id[5:])
    return None


def server_writes(dump: Mapping[str, Any]) -> dict[int, dict[int, int]]:
    """seq -> {chunk index -> write-returned ns} from a ground-truth chunk-log document."""
    out: dict[int, dict[int, int]] = {}
    for seq, idx, t_ns in dump["chunks"]:
        out.setdefault(seq, {})[idx] = t_ns
    return out


def server_write_begins(dump: Mapping[str, Any]) -> dict[tuple[int, int], int]:
    """(seq, chunk index) -> the instant the write call began (empty for logs without it)."""
    begins = dump.get("chunk_write_begin") or []
    if len(begins) != len(dump["chunks"]):
        return {}
    return {(row[0], row[1]): b for row, b in zip(dump["chunks"], begins, strict=True)}


def _both_stamps(offsets: Sequence[float], delays: Sequence[float], stamp: str) -> dict[str, list[float]] | None:
    """Each chunk's offset under the ``recv`` and the ``kernel`` stamp, or None if a read had no kernel stamp."""
    if len(delays) != len(offsets) or any(d < 0 for d in delays):
        return None
    if stamp == "kernel":
        return {"kernel": list(offsets), "recv": [o + d for o, d in zip(offsets, delays, strict=True)]}
    return {"recv": list(offsets), "kernel": [o - d for o, d in zip(offsets, delays, strict=True)]}


def join_records(records: Sequence[Mapping[str, Any]], dump: Mapping[str, Any], stamp: str = "recv") -> Join:
    """Match every record's chunks to the server's writes of the same sequence number and index.

    ``stamp`` names the chunk stamp the run used (``TAILGATE_CHUNK_STAMP``), so the other one can be
    rebuilt from the records' read delays and both compared on the same reads."""
    writes = server_writes(dump)
    begins = server_write_begins(dump)
    received = {row[0]: row[1] for row in dump.get("requests", [])}
    j = Join()
    claimed: set[int] = set()
    for rec in records:
        j.requests += 1
        if rec.get("error_class"):
            j.failed += 1
            j.problems.append(f"trace {rec.get('trace_id')}: {rec.get('error_class')}: {rec.get('error')}")
            continue
        if rec.get("schedule_lag_ms") is not None:
            j.schedule_lag_ms.append(float(rec["schedule_lag_ms"]))
        seq = _seq_of(rec.get("response_id"))
        sent = rec.get("sent_mono_ns")
        offsets = rec.get("chunk_offsets_ms")
        if seq is None or sent is None or offsets is None:
            j.problems.append(f"trace {rec.get('trace_id')}: no response id, sent_mono_ns or chunk offsets")
            continue
        j.sent_mono_ns.append(int(sent))
        if seq in claimed:
            j.problems.append(f"cmpl-{seq} claimed by two records")
            continue
        claimed.add(seq)
        mine = writes.get(seq, {})
        j.client_chunks += len(offsets)
        j.server_chunks += len(mine)
        if len(offsets) != len(mine):
            j.problems.append(f"cmpl-{seq}: client saw {len(offsets)} chunks, server wrote {len(mine)}")
        matched = 0
        for i, off in enumerate(offsets):
            t = mine.get(i)
            if t is None:
                continue
            matched += 1
            received_ms = sent / _MS + off
            j.chunk_error_ms.append(received_ms - t / _MS)
            if begins:
                j.chunk_error_begin_ms.append(received_ms - begins[(seq, i)] / _MS)
        j.matched_chunks += matched
        if matched != len(offsets) or not mine:
            continue
        j.matched_requests += 1
        ordered = [mine[i] for i in range(len(mine))] if len(mine) == max(mine) + 1 else sorted(mine.values())
        true_ttft = (ordered[0] - sent) / _MS
        j.true_ttft_ms.append(true_ttft)
        if rec.get("ttft_ms") is not None:
            j.ttft_error_ms.append(float(rec["ttft_ms"]) - true_ttft)
        true_gap = max((b - a for a, b in itertools.pairwise(ordered)), default=0) / _MS
        j.true_worst_gap_ms.append(true_gap)
        if rec.get("worst_gap_ms") is not None and len(ordered) > 1:
            j.worst_gap_error_ms.append(float(rec["worst_gap_ms"]) - true_gap)
        if seq in received:
            j.upload_ms.append((received[seq] - sent) / _MS)
        both = _both_stamps(offsets, rec.get("chunk_read_delays_ms") or [], stamp)
        if both is not None and len(ordered) == len(offsets):
            for mode, offs in both.items():
                got = j.by_stamp[mode]
                got["chunk"] += [sent / _MS + off - t / _MS for off, t in zip(offs, ordered, strict=True)]
                got["ttft"].append(offs[0] - true_ttft)
                if len(offs) > 1:
                    gap = max(b - a for a, b in itertools.pairwise(offs))
                    got["gap"].append(gap - true_gap)
    j.unclaimed_server_requests = sum(1 for seq in writes if seq not in claimed)
    claimed_rows = [i for i, row in enumerate(dump["chunks"]) if row[0] in claimed]
    targets = dump.get("chunk_targets") or []
    if len(targets) == len(dump["chunks"]):
        j.write_lateness_ms = [(dump["chunks"][i][2] - targets[i]) / _MS for i in claimed_rows]
    return j


# ------------------------------------------------------------------------------------------- machine


def _proc_stat() -> tuple[float, float]:
    """(busy, total) CPU seconds over all CPUs since boot."""
    import psutil

    times = psutil.cpu_times()
    total = sum(times)
    return total - times.idle - getattr(times, "iowait", 0.0), total


def machine_facts() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cores": os.cpu_count(), "loadavg_1m": load[0], "loadavg_5m": load[1], "loadavg_15m": load[2]}


class CpuSampler(threading.Thread):
    """Reads the CPU time of a process tree and of the whole machine every ``SAMPLE_INTERVAL_S``.

    Forked load processes exit at the end of a run; the last reading of each pid is kept, so the
    tree's total only loses what a process spent after its last reading.
    """

    def __init__(self, root_pid: int, other_pids: Sequence[int] = (), interval_s: float = SAMPLE_INTERVAL_S) -> None:
        super().__init__(daemon=True, name="tailgate-cpu-sampler")
        self.root_pid = root_pid
        self.other_pids = list(other_pids)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float, float]] = []
        """(wall time, tree CPU s, other pids' CPU s, machine busy CPU s, machine total CPU s)."""
        self._seen: dict[int, float] = {}
        self._others: dict[int, float] = {}
        self._halt = threading.Event()

    def _read(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                self._seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        for pid in self.other_pids:
            try:
                t = psutil.Process(pid).cpu_times()
                self._others[pid] = t.user + t.system
            except psutil.Error:
                pass
        busy, total = _proc_stat()
        self.samples.append((time.time(), sum(self._seen.values()), sum(self._others.values()), busy, total))

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
        machine = (b[3] - a[3]) / max(1, b[4] - a[4]) * cores
        return {
            "wall_s": wall,
            "load_cpu_s": b[1] - a[1],
            "load_cores": (b[1] - a[1]) / wall,
            "server_cpu_s": b[2] - a[2],
            "server_cores": (b[2] - a[2]) / wall,
            "machine_busy_cores": machine,
            "others_busy_cores": machine - (b[1] - a[1] + b[2] - a[2]) / wall,
        }


# ------------------------------------------------------------------------------------------- the run


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
    prompt_tokens: int = 16
    seed: int = 7
    warn_p99_ms: float = WARN_P99_MS
    keep_dir: str | None = None
    """Keep the trace, records, Locust log and chunk log here instead of a temporary folder."""
    extra_locust_args: tuple[str, ...] = ()

    def check(self) -> None:
        for name, value, low in (("--rate", self.rate, 0.0), ("--gap-ms", self.gap_ms, 0.0)):
            if not value > low:
                raise ValueError(f"{name}: must be above {low:g}, got {value:g}")
        if self.ttft_ms < 0:
            raise ValueError(f"--ttft-ms: must be 0 or more, got {self.ttft_ms:g}")
        for name, ivalue in (("--n", self.n), ("--tokens", self.tokens), ("--processes", self.processes)):
            if ivalue < 1:
                raise ValueError(f"{name}: must be at least 1, got {ivalue}")
        if self.n < 2:
            raise ValueError("--n: at least 2 requests, so there is an inter-arrival gap to test")


def write_trace(path: Path, n: int, prompt_tokens: int, tokens: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt_tokens": prompt_tokens, "max_tokens": tokens}) + "\n")


def locust_command(cfg: SelfCheckConfig, host: str, trace: Path, results: Path, model: str) -> list[str]:
    """The Locust run under test: the continuous arm exactly as a user runs it, plus chunk recording.

    Server sampling is off so that the only extra process is the one being measured; one stage
    needs no settle time.
    """
    cmd = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", host,
        "--rates", f"{cfg.rate:g}", "--n", str(cfg.n), "--warmup", "0", "--trace-file", str(trace),
        "--seed", str(cfg.seed), "--model", model, "--record-chunks", "--results-dir", str(results),
        "--sample-metrics", "0", "--settle", "0", "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    if cfg.processes > 1:
        cmd += ["--processes", str(cfg.processes), *master_port_args()]  # never Locust's shared default port
    return cmd + list(cfg.extra_locust_args)


def _stage_window(records: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    sent = [r["sent_s"] for r in records if r.get("sent_s") is not None]
    ends = [r["end_s"] for r in records if r.get("end_s") is not None]
    if not sent or not ends:
        return None
    return min(sent), max(ends)


@dataclass(slots=True)
class LoadRun:
    """What one Locust run left behind, before any joining."""

    records: list[dict[str, Any]]
    partial_lines: int
    exit_code: int
    wall_s: float
    cpu_s_total: float
    """utime + stime of the Locust process and every child it waited for, start-up included."""
    sampler: CpuSampler
    log_path: Path

    def stage_cpu(self) -> dict[str, float] | None:
        window = _stage_window(self.records)
        return self.sampler.window(*window) if window else None


def run_load(cfg: SelfCheckConfig, server: Any, work: Path, log: Callable[[str], None] = lambda _: None) -> LoadRun:
    """Run the continuous arm with Locust against a started ground-truth server and read its records."""
    from tailgate.verify.groundtruth import DEFAULT_MODEL

    trace = work / "trace.jsonl"
    results = work / "results"
    if results.exists():
        shutil.rmtree(results)
    write_trace(trace, cfg.n, cfg.prompt_tokens, cfg.tokens)
    cmd = locust_command(cfg, server.base_url, trace, results, DEFAULT_MODEL)
    log(f"[selfcheck] server {server.base_url} (pid {server.pid}); running: {' '.join(cmd)}")
    env = dict(os.environ, PYTHONPATH=str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    log_path = work / "locust.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        sampler = CpuSampler(proc.pid, [server.pid])
        sampler.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            sampler.stop()
    scan = read_records(results)
    return LoadRun(
        records=scan.records, partial_lines=scan.partial_lines, exit_code=proc.returncode,
        wall_s=time.monotonic() - started, cpu_s_total=usage.ru_utime + usage.ru_stime, sampler=sampler,
        log_path=log_path,
    )  # fmt: skip


def run_selfcheck(cfg: SelfCheckConfig, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run one self-check and return every figure as a JSON-ready document (no raw samples)."""
    from tailgate.verify.groundtruth import start_server_process

    cfg.check()
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if cfg.keep_dir:
        work = Path(cfg.keep_dir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tailgate-selfcheck-")
        work = Path(tmp.name)
    try:
        before = machine_facts()
        server = start_server_process(ttft_ms=cfg.ttft_ms, gap_ms=cfg.gap_ms, chunk_log=work / "chunklog.json")
        try:
            run = run_load(cfg, server, work, log)
            dump = server.dump()
        finally:
            server.close()
        after = machine_facts()
        records = run.records
        from tailgate.load.client import chunk_stamp_mode

        stamp = chunk_stamp_mode()
        j = join_records(records, dump, stamp)
        if run.exit_code != 0 and not records:
            tail = run.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            j.problems.append(f"locust exited {run.exit_code}: {tail}")
        window = _stage_window(records)
        cpu = run.stage_cpu()
        total_chunks = j.client_chunks
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sorted(j.sent_mono_ns))]
        ks = ks_exponential(gaps, cfg.rate) if gaps else KSResult(0.0, 0, 1.0)
        chunk = distribution(j.chunk_error_ms)
        p99 = chunk["p99"]
        if not j.exact:
            verdict = "FAIL: the join is not exact, so the error figures cannot be trusted"
        elif p99 is not None and p99 > cfg.warn_p99_ms:
            verdict = f"WARN: p99 chunk error {p99:.3f} ms is above {cfg.warn_p99_ms:g} ms"
        else:
            verdict = f"OK: p99 chunk error {p99:.3f} ms is within {cfg.warn_p99_ms:g} ms"
        stage_s = (window[1] - window[0]) if window else None
        return {
            "config": asdict(cfg),
            "machine": {"before": before, "after": after},
            "join": {
                "exact": j.exact,
                "requests": j.requests,
                "failed": j.failed,
                "matched_requests": j.matched_requests,
                "client_chunks": j.client_chunks,
                "server_chunks": j.server_chunks,
                "matched_chunks": j.matched_chunks,
                "unclaimed_server_requests": j.unclaimed_server_requests,
                "unreadable_record_lines": run.partial_lines,
                "problems": j.problems[:20],
            },
            "chunk_error_ms": chunk,
            "chunk_error_begin_ms": distribution(j.chunk_error_begin_ms),
            "ttft_error_ms": distribution(j.ttft_error_ms),
            "worst_gap_error_ms": distribution(j.worst_gap_error_ms),
            "true_ttft_ms": distribution(j.true_ttft_ms),
            "true_worst_gap_ms": distribution(j.true_worst_gap_ms),
            "upload_ms": distribution(j.upload_ms),
            "schedule_lag_ms": distribution(j.schedule_lag_ms),
            "server_write_lateness_ms": distribution(j.write_lateness_ms),
            "chunk_stamp": stamp,
            "by_stamp": {
                mode: {f"{k}_error_ms": distribution(v) for k, v in got.items()} for mode, got in j.by_stamp.items()
            },
            "interarrival_ks": {**asdict(ks), "rate": cfg.rate, "alpha": KS_ALPHA, "passed": ks.p_value >= KS_ALPHA},
            "stage_s": stage_s,
            "chunks_per_s": total_chunks / stage_s if stage_s else None,
            "cpu": None
            if cpu is None
            else {
                **cpu,
                "load_us_per_chunk": 1e6 * cpu["load_cpu_s"] / total_chunks if total_chunks else None,
            },
            "locust": {"exit_code": run.exit_code, "wall_s": run.wall_s, "cpu_s_total": run.cpu_s_total},
            "verdict": verdict,
            "ok": j.exact and (p99 is None or p99 <= cfg.warn_p99_ms),
            "work_dir": str(work) if cfg.keep_dir else None,
        }
    finally:
        if tmp is not None:
            tmp.cleanup()


# ------------------------------------------------------------------------------------------- output


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def render(result: Mapping[str, Any]) -> str:
    """The human-readable table of one self-check."""
    c = result["config"]
    jn = result["join"]
    m0, m1 = result["machine"]["before"], result["machine"]["after"]
    cpu = result.get("cpu") or {}
    lines = [
        f"tailgate selfcheck: {c['rate']:g} req/s, {c['n']} requests x {c['tokens']} tokens, gap {c['gap_ms']:g} ms, "
        f"TTFT {c['ttft_ms']:g} ms, {c['processes']} load process(es)",
        f"machine: {m0['cores']} cores, load average {m0['loadavg_1m']:.2f} before / {m1['loadavg_1m']:.2f} after"
        + (
            f"; {cpu['machine_busy_cores']:.2f} cores busy during the stage, "
            f"{max(0.0, cpu['others_busy_cores']):.2f} of them other processes"
            if cpu
            else ""
        ),
        f"join: {jn['matched_requests']}/{jn['requests']} requests, {jn['matched_chunks']}/{jn['client_chunks']} "
        f"client chunks matched to {jn['server_chunks']} server writes, {jn['failed']} failed, "
        f"{jn['unclaimed_server_requests']} unclaimed server streams: {'exact' if jn['exact'] else 'NOT exact'}",
        "",
        f"{'ms':<40}{'n':>8}{'min':>10}{'p50':>10}{'p99':>10}{'p99.9':>10}{'max':>10}",
    ]
    rows = (
        ("client-added error per chunk", "chunk_error_ms"),
        ("  the same vs write begin (upper bound)", "chunk_error_begin_ms"),
        ("TTFT error (client - true)", "ttft_error_ms"),
        ("worst-gap error (client - true)", "worst_gap_error_ms"),
        ("schedule lag (sent - intended)", "schedule_lag_ms"),
        ("true TTFT (server 1st write - send)", "true_ttft_ms"),
        ("true worst gap (server writes)", "true_worst_gap_ms"),
        ("upload (server received - send)", "upload_ms"),
        ("server write lateness (context)", "server_write_lateness_ms"),
    )
    for label, key in rows:
        d = result[key]
        lines.append(
            f"{label:<40}{d['n']:>8}{_fmt(d['min']):>10}{_fmt(d['p50']):>10}{_fmt(d['p99']):>10}"
            f"{_fmt(d['p99.9']):>10}{_fmt(d['max']):>10}"
        )
    for mode, figures in (result.get("by_stamp") or {}).items():
        used = " (used)" if mode == result.get("chunk_stamp") else ""
        for key, label in (("chunk_error_ms", "chunk"), ("gap_error_ms", "worst gap")):
            d = figures[key]
            if d["n"]:
                text = f"  {label} error, {mode} stamp{used}"
                lines.append(
                    f"{text:<40}{d['n']:>8}{_fmt(d['min']):>10}{_fmt(d['p50']):>10}{_fmt(d['p99']):>10}"
                    f"{_fmt(d['p99.9']):>10}{_fmt(d['max']):>10}"
                )
    ks = result["interarrival_ks"]
    lines += [
        "",
        f"inter-arrival KS vs Exp({ks['rate']:g}/s): D={ks['statistic']:.4f}, n={ks['n']}, p={ks['p_value']:.3f} "
        f"({'pass' if ks['passed'] else 'FAIL'} at alpha {ks['alpha']:g})",
    ]
    if cpu:
        per_chunk = cpu.get("load_us_per_chunk")
        lines.append(
            f"load generator CPU: {100 * cpu['load_cores']:.1f}% of one core over the {cpu['wall_s']:.1f} s stage "
            f"({_fmt(per_chunk) if per_chunk is None else f'{per_chunk:.1f}'} us per chunk, "
            f"{result['chunks_per_s']:.0f} chunks/s); server {100 * cpu['server_cores']:.1f}%"
        )
    lines.append(
        f"locust: exit {result['locust']['exit_code']}, {result['locust']['cpu_s_total']:.2f} s CPU in all "
        f"(start-up included), {result['locust']['wall_s']:.1f} s wall"
    )
    for problem in jn["problems"][:5]:
        lines.append(f"problem: {problem}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailgate selfcheck",
        description="measure the load generator's own timing error against the ground-truth server",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SelfCheckConfig()
    p.add_argument("--rate", type=float, default=d.rate, help="arrivals per second (open-loop Poisson)")
    p.add_argument("--n", type=int, default=d.n, help="requests (all measured)")
    p.add_argument("--tokens", type=int, default=d.tokens, help="content chunks per stream")
    p.add_argument("--gap-ms", type=float, default=d.gap_ms, help="server's inter-chunk gap")
    p.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="server's time to first chunk")
    p.add_argument("--processes", type=int, default=d.processes, help="Locust load processes")
    p.add_argument("--seed", type=int, default=d.seed, help="arrival schedule seed (gaps use seed + 1)")
    p.add_argument("--warn-ms", type=float, default=d.warn_p99_ms, help="warn above this p99 chunk error")
    p.add_argument("--keep", default=None, help="keep trace, records, logs and chunk log in this folder")
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")


def config_from_args(args: argparse.Namespace) -> SelfCheckConfig:
    return SelfCheckConfig(
        rate=args.rate, n=args.n, tokens=args.tokens, gap_ms=args.gap_ms, ttft_ms=args.ttft_ms,
        processes=args.processes, seed=args.seed, warn_p99_ms=args.warn_ms, keep_dir=args.keep,
    )  # fmt: skip


def run_from_args(args: argparse.Namespace, prog: str = "tailgate selfcheck") -> int:
    cfg = config_from_args(args)
    try:
        cfg.check()
    except ValueError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    result = run_selfcheck(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if result["ok"] else EXIT_WARN


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when the join is exact and the p99 chunk error within the bound, 1 otherwise, 2 on bad input."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
