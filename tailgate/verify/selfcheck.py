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
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tailgate.cell import CellSpec, run_cell
from tailgate.clientbound import (
    CHUNK_P99,
    DEFAULT_LIMITS,
    MERGED,
    TTFT_P99,
    WORST_GAP_MAX,
    WORST_GAP_P99,
    Finding,
    breached,
    judge,
    merged_breached,
)
from tailgate.exitcodes import child_ending
from tailgate.hoststeal import NOTABLE_SHARE
from tailgate.lifecycle import ArgumentParser, Stopped
from tailgate.optiondecl import add_option
from tailgate.records import read_records
from tailgate.resultfiles import RUN_META, SUMMARY_GLOB
from tailgate.runner import ChildRunner, LocustRun, signal_guard
from tailgate.verify.cpu import SAMPLE_INTERVAL_S, CpuSampler, machine_facts
from tailgate.verify.hostheld import HostHeldWatch, held_line
from tailgate.verify.join import (
    Join,
    KSResult,
    distribution,
    join_records,
    kolmogorov_sf,
    ks_exponential,
    server_write_begins,
    server_writes,
)

EXIT_OK = 0
EXIT_WARN = 1
EXIT_USAGE = 2

WARN_P99_MS = DEFAULT_LIMITS[CHUNK_P99]
"""A p99 chunk error above this means the generator, not the server, shapes the tail it reports."""
KS_ALPHA = 0.01
"""Significance level of the inter-arrival test: one fixed seed should not fail it by bad luck."""

_ROOT = Path(__file__).resolve().parents[2]


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
                            ("--max-merged", self.merged_max)):  # fmt: skip
            if not bound >= 0:
                raise ValueError(f"{name}: must be 0 or more, got {bound:g}")
        for name, ivalue in (("--n", self.n), ("--tokens", self.tokens), ("--processes", self.processes)):
            if ivalue < 1:
                raise ValueError(f"{name}: must be at least 1, got {ivalue}")
        if self.n < 2:
            raise ValueError("--n: at least 2 requests, so there is an inter-arrival gap to test")


def write_trace(path: Path, n: int, prompt_tokens: int, tokens: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt_tokens": prompt_tokens, "max_tokens": tokens}) + "\n")


def locust_run(cfg: SelfCheckConfig, host: str, trace: Path, results: Path, model: str) -> LocustRun:
    """The Locust run under test: the continuous arm exactly as a user runs it, plus chunk recording.

    Server sampling is off so that the only extra process is the one being measured; one stage
    needs no settle time.
    """
    return LocustRun(
        arm="continuous", host=host, results=results, stage=("--rates", f"{cfg.rate:g}"), n=cfg.n, warmup=0,
        seed=cfg.seed, processes=cfg.processes,
        chunk_stamp=cfg.chunk_stamp,
        extra=("--trace-file", str(trace), "--model", model, "--record-chunks", "--sample-metrics", "0",
               "--settle", "0", "--loglevel", "WARNING", *cfg.extra_locust_args),
    )  # fmt: skip


def locust_command(cfg: SelfCheckConfig, host: str, trace: Path, results: Path, model: str) -> list[str]:
    return locust_run(cfg, host, trace, results, model).command()


def capture_figures(results: Path) -> dict[str, Any] | None:
    """The capture's drops and missed streams from the run's stage summaries (None: no capture ran)."""
    drops = missed = None
    for path in sorted(results.glob(SUMMARY_GLOB)):
        s = json.loads(path.read_text(encoding="utf-8"))
        if s.get("capture_drops") is not None:
            drops = (drops or 0) + int(s["capture_drops"])
            missed = (missed or 0) + int(s.get("capture_missed_streams") or 0)
    return None if drops is None else {"drops": drops, "missed_streams": missed}


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
    write_trace(trace, cfg.n, cfg.prompt_tokens, cfg.tokens)
    run = locust_run(cfg, server.base_url, trace, results, DEFAULT_MODEL)
    log(f"[selfcheck] server {server.base_url} (pid {server.pid}); running: {' '.join(run.command())}")
    log_path = work / "locust.log"
    child = ChildRunner(log, env={"PYTHONPATH": str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    sampler: CpuSampler | None = None

    def sample(pid: int) -> None:
        nonlocal sampler
        sampler = CpuSampler(pid, [server.pid])
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
    watch = HostHeldWatch()
    run: LoadRun | None = None
    try:
        before = machine_facts()
        server = start_server_process(ttft_ms=cfg.ttft_ms, gap_ms=cfg.gap_ms, chunk_log=work / "chunklog.json")
        try:
            if cfg.host_watch:
                watch.start()
            run = run_load(cfg, server, work, log)
            dump = server.dump()
        finally:
            server.close()
            held = watch.stop(_stage_window(run.records) if run is not None else None)
        after = machine_facts()
        records = run.records
        from tailgate.load.client import chunk_stamp_mode

        stamp = chunk_stamp_mode() if cfg.chunk_stamp in (None, "capture") else cfg.chunk_stamp
        j = join_records(records, dump, stamp)
        used = Counter(str(r.get("chunk_stamp") or stamp) for r in records if not r.get("error_class"))
        capture = capture_figures(work / "results")
        meta_path = work / "results" / RUN_META
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        notes = sorted(set((meta.get("chunk_stamp_notes") or {}).values()))
        ending = child_ending(run.exit_code)
        if not ending.finished and not records:
            tail = run.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            j.problems.append(f"{ending.describe()}: {tail}")
        window = _stage_window(records)
        cpu = run.stage_cpu()
        total_chunks = j.client_chunks
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sorted(j.sent_mono_ns))]
        ks = ks_exponential(gaps, cfg.rate) if gaps else KSResult(0.0, 0, 1.0)
        chunk = distribution(j.chunk_error_ms)
        gap_error = distribution(j.worst_gap_error_ms)
        beyond = distribution(j.worst_gap_beyond_write_ms)
        judged = beyond if beyond["n"] else gap_error
        ttft_error = distribution(j.ttft_error_ms)
        merged = sum(1 for r in records if r.get("client_coalesced"))
        findings = judge(
            {WORST_GAP_P99: judged["p99"], WORST_GAP_MAX: judged["max"], TTFT_P99: ttft_error["p99"],
             CHUNK_P99: chunk["p99"], MERGED: merged},
            cfg.limits(),
        )  # fmt: skip
        verdict, ok = verdict_of(j.exact, findings)
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
            "ttft_error_ms": ttft_error,
            "worst_gap_error_ms": gap_error,
            "worst_gap_beyond_write_ms": beyond,
            "true_ttft_ms": distribution(j.true_ttft_ms),
            "true_worst_gap_ms": distribution(j.true_worst_gap_ms),
            "upload_ms": distribution(j.upload_ms),
            "schedule_lag_ms": distribution(j.schedule_lag_ms),
            "server_write_lateness_ms": distribution(j.write_lateness_ms),
            "chunk_stamp": used.most_common(1)[0][0] if used else stamp,
            "chunk_stamps": dict(used),
            "capture": capture,
            "stamp_notes": notes,
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
            "client_coalesced_streams": merged,
            "host_held": held,
            "bounds": [f.to_dict() for f in findings],
            "verdict": verdict,
            "ok": ok,
            "work_dir": str(work) if cfg.keep_dir else None,
        }
    finally:
        if tmp is not None:
            tmp.cleanup()


def verdict_of(exact: bool, findings: Sequence[Finding]) -> tuple[str, bool]:
    """The one-line verdict and whether the check passed: an exact join and no bound breached."""
    if not exact:
        return "FAIL: the join is not exact, so the error figures cannot be trusted", False
    bad = breached(findings)
    if bad:
        return "FAIL: " + "; ".join(f.text() for f in bad), False
    return f"OK: all {len(findings)} bounds held", True


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
            f"{max(0.0, cpu['others_busy_cores']):.2f} of them other processes, "
            f"{cpu.get('host_steal_share', 0.0):.0%} of the CPU time stolen by the host"
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
        ("  beyond the server's write calls", "worst_gap_beyond_write_ms"),
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
    cap = result.get("capture")
    if cap:
        lines.append(
            f"packet capture: {cap['drops']} segment(s) dropped, {cap['missed_streams']} stream(s) it could not "
            f"account for (kept kernel stamps); stamps used: "
            + ", ".join(f"{k} {v}" for k, v in (result.get("chunk_stamps") or {}).items())
        )
    for note in result.get("stamp_notes") or ():
        lines.append(f"stamp: {note}")
    merged = result.get("client_coalesced_streams")
    steal = cpu.get("host_steal_share")
    if merged_breached(merged):
        lines.append(
            f"CLIENT BEHIND: {merged} stream(s) merged chunks in late reads (client_coalesced): "
            "their gaps describe the load generator"
        )
    if steal is not None and steal >= NOTABLE_SHARE:
        lines.append(
            f"HOST STEAL: the hypervisor held back {steal:.0%} of this machine's CPU time during the stage; "
            "every process here was paused meanwhile, so late reads are the host's as much as the client's: "
            "measure again on a quieter host"
        )
    held_text = held_line(result.get("host_held"), client_late=not result["ok"] or bool(merged))
    if held_text:
        lines.append(held_text)
    lines.append(
        f"locust: exit {result['locust']['exit_code']}, {result['locust']['cpu_s_total']:.2f} s CPU in all "
        f"(start-up included), {result['locust']['wall_s']:.1f} s wall"
    )
    for problem in jn["problems"][:5]:
        lines.append(f"problem: {problem}")
    lines += [f"bound: {b['text']}" for b in result.get("bounds") or ()]
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    # one line and exit 2 for bad input, options spelt out (no prefix of one taken for it), as every command
    p = ArgumentParser(
        prog="tailgate selfcheck",
        description="measure the load generator's own timing error against the ground-truth server",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = SelfCheckConfig()
    p.add_argument("--rate", type=float, default=d.rate, help="arrivals per second (open-loop Poisson)")
    add_option(p, "n", default=d.n, help="requests (all measured)")
    p.add_argument("--tokens", type=int, default=d.tokens, help="content chunks per stream")
    add_option(p, "gap_ms", default=d.gap_ms)
    add_option(p, "ttft_ms", default=d.ttft_ms)
    add_option(p, "processes", default=d.processes)
    add_option(p, "seed", default=d.seed, help="arrival schedule seed (gaps use seed + 1)")
    p.add_argument("--warn-ms", type=float, default=d.warn_p99_ms, help="bound on the p99 chunk error (ms)")
    p.add_argument("--max-gap-p99-ms", type=float, default=d.gap_p99_ms, help="bound on the worst-gap error p99")
    p.add_argument("--max-gap-ms", type=float, default=d.gap_max_ms, help="bound on the largest worst-gap error")
    p.add_argument("--max-ttft-p99-ms", type=float, default=d.ttft_p99_ms, help="bound on the TTFT error p99")
    p.add_argument("--max-merged", type=int, default=d.merged_max, help="bound on streams merged by late reads")
    add_option(p, "chunk_stamp")
    p.add_argument("--keep", default=None, help="keep trace, records, logs and chunk log in this folder")
    p.add_argument("--no-host-watch", action="store_true",
                   help="no sleeper per CPU (they tell CPUs the host held back from a late client)")  # fmt: skip
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")


def config_from_args(args: argparse.Namespace) -> SelfCheckConfig:
    return SelfCheckConfig(
        rate=args.rate, n=args.n, tokens=args.tokens, gap_ms=args.gap_ms, ttft_ms=args.ttft_ms,
        processes=args.processes, seed=args.seed, warn_p99_ms=args.warn_ms, keep_dir=args.keep,
        gap_p99_ms=args.max_gap_p99_ms, gap_max_ms=args.max_gap_ms, ttft_p99_ms=args.max_ttft_p99_ms,
        merged_max=args.max_merged, chunk_stamp=args.chunk_stamp, host_watch=not args.no_host_watch,
    )  # fmt: skip


def run_from_args(args: argparse.Namespace, prog: str = "tailgate selfcheck") -> int:
    cfg = config_from_args(args)
    try:
        cfg.check()
    except ValueError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    # SIGTERM and SIGHUP raise like Ctrl-C, so the finally blocks stop Locust and the ground-truth server
    with signal_guard("[selfcheck]"):
        try:
            result = run_selfcheck(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
        except Stopped as e:
            sys.stderr.write(f"{prog}: {e.name}: stopped\n")
            return e.exit_code
    print(render(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if result["ok"] else EXIT_WARN


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when the join is exact and every bound held, 1 when one was breached, 2 on bad input."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_from_args(args)


__all__ = [
    "EXIT_OK", "EXIT_USAGE", "EXIT_WARN", "KS_ALPHA", "SAMPLE_INTERVAL_S", "WARN_P99_MS", "CpuSampler", "Join",
    "KSResult", "LoadRun", "SelfCheckConfig", "distribution", "join_records", "kolmogorov_sf", "ks_exponential",
    "locust_command", "machine_facts", "main", "render", "run_load", "run_selfcheck", "server_write_begins",
    "server_writes", "verdict_of",
]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
