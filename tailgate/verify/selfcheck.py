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

Both sides must also have kept their own schedule (:mod:`tailgate.verify.lateness`): a reference server
whose writes fell behind their targets, or a client whose sends fell behind theirs, did not put the asked
load on the wire, and the verdict says which side it was. The reference spreads over ``--truth-workers``
processes on one port (:mod:`tailgate.verify.groundtruth.workers`), by default as many as the expected chunk
rate needs on this host (:mod:`tailgate.load.hostcapacity`); ``--processes auto`` sizes the load processes the
same way. ``--hosts 2`` runs the load processes on two hosts made of network namespaces
(:mod:`tailgate.verify.multihost`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from tailgate.clientbound import (
    CHUNK_P99,
    MERGED,
    TTFT_P99,
    WORST_GAP_MAX,
    WORST_GAP_P99,
    judge,
)
from tailgate.exitcodes import DONE, FAILED, USAGE, child_ending
from tailgate.jsontypes import JsonObject
from tailgate.lifecycle import ArgumentParser, Stopped
from tailgate.optiondecl import add_option
from tailgate.optiontable import AUTO, parse_processes
from tailgate.resultfiles import RUN_META
from tailgate.runner import signal_guard
from tailgate.verify.cpu import SAMPLE_INTERVAL_S, CpuSampler, machine_facts
from tailgate.verify.cpusplit import SPLIT_MODES, children_on, cpu_ranges, split_cpus, usable_cpus
from tailgate.verify.hostheld import HostHeldWatch
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
from tailgate.verify.lateness import (
    CLIENT_LAG,
    SERVER_LATE,
    late_sides,
    schedule_findings,
    server_late_bound,
    verdict_of,
)
from tailgate.verify.multihost import load_hosts
from tailgate.verify.netns import NetnsUnavailable
from tailgate.verify.selfcheckrun import (
    WARN_P99_MS,
    LoadRun,
    SelfCheckConfig,
    Sizing,
    accounting_figures,
    accounting_problem,
    capture_figures,
    locust_command,
    run_load,
    run_load_hosts,
    size_run,
    stage_window,
)
from tailgate.verify.selfcheckview import render

EXIT_OK = DONE
EXIT_WARN = FAILED
"""Not OK: a bound breached, a side behind its schedule, or the join not exact (the one "failed" of
:mod:`tailgate.exitcodes`: the check could not show what it was asked to)."""
EXIT_USAGE = USAGE

KS_ALPHA = 0.01
"""Significance level of the inter-arrival test: one fixed seed should not fail it by bad luck."""


def run_selfcheck(cfg: SelfCheckConfig, log: Callable[[str], None] = lambda _: None) -> JsonObject:
    """Run one self-check and return every figure as a JSON-ready document (no raw samples)."""
    from tailgate.load.client import chunk_stamp_mode
    from tailgate.verify.groundtruth import start_server_process

    cfg.check()
    stamp = chunk_stamp_mode() if cfg.chunk_stamp in (None, "capture") else cfg.chunk_stamp
    sizing = size_run(cfg, cfg.chunk_stamp or stamp, log)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if cfg.keep_dir:
        work = Path(cfg.keep_dir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tailgate-selfcheck-")
        work = Path(tmp.name)
    watch = HostHeldWatch()
    run: LoadRun | None = None
    hosts = None
    split = split_cpus(usable_cpus(), sizing.truth_workers, sizing.processes) if cfg.cpu_split == "auto" else None
    if split is not None:
        log(f"[selfcheck] reference server on CPUs {cpu_ranges(split.reference)}, load on {cpu_ranges(split.load)}")
    try:
        before = machine_facts()
        start_server = functools.partial(
            start_server_process, ttft_ms=cfg.ttft_ms, gap_ms=cfg.gap_ms, chunk_log=work / "chunklog.json",
            workers=sizing.truth_workers, realtime=cfg.truth_realtime, write_delay_us=cfg.server_write_delay_us,
        )  # fmt: skip
        if cfg.hosts > 1:
            hosts = load_hosts(cfg.hosts)
            start_server = functools.partial(start_server, host=hosts.master_ip, wrap=hosts.wrap(hosts.master))
        with children_on(split.reference if split is not None else None):
            server = start_server()
        try:
            if cfg.host_watch:
                watch.start()
            with children_on(split.load if split is not None else None):
                if hosts is not None:
                    run = run_load_hosts(cfg, server, work, hosts, sizing.processes, log)
                else:
                    run = run_load(cfg, server, work, log, sizing.processes)
            log(f"[selfcheck] stopping the reference server ({sizing.truth_workers} worker(s)) and reading its log")
            server.stop()
            dump = server.dump()
        finally:
            server.close()
            held = watch.stop(stage_window(run.records) if run is not None else None)
        after = machine_facts()
        records = run.records
        j = join_records(records, dump, stamp)
        used = Counter(r.chunk_stamp or stamp for r in records if not r.error_class)
        capture = capture_figures(work / "results")
        meta_path = work / "results" / RUN_META
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
        notes = sorted(set((meta.get("chunk_stamp_notes") or {}).values()))
        ending = child_ending(run.exit_code)
        if not ending.finished and not records:
            tail = run.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            j.problems.append(f"{ending.describe()}: {tail}")
        j.problems += run.problems
        accounting = accounting_figures(work / "results")
        unaccounted = accounting_problem(cfg.n, len(records), accounting)
        window = stage_window(records)
        cpu = run.stage_cpu()
        total_chunks = j.client_chunks
        gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(sorted(j.sent_mono_ns))]
        ks = ks_exponential(gaps, cfg.rate) if gaps else KSResult(0.0, 0, 1.0)
        chunk = distribution(j.chunk_error_ms)
        gap_error = distribution(j.worst_gap_error_ms)
        beyond = distribution(j.worst_gap_beyond_write_ms)
        judged = beyond if beyond["n"] else gap_error
        ttft_error = distribution(j.ttft_error_ms)
        lateness = distribution(j.write_lateness_ms)
        lag = distribution(j.schedule_lag_ms)
        merged = sum(1 for r in records if r.client_coalesced)
        findings = judge(
            {WORST_GAP_P99: judged["p99"], WORST_GAP_MAX: judged["max"], TTFT_P99: ttft_error["p99"],
             CHUNK_P99: chunk["p99"], MERGED: merged},
            cfg.limits(),
        )  # fmt: skip
        schedule = schedule_findings(
            lateness["p99"], lag["p99"], server_late_bound(cfg.gap_ms, cfg.server_late_p99_ms), cfg.lag_p99_ms
        )
        p50s = {SERVER_LATE.key: lateness["p50"], CLIENT_LAG.key: lag["p50"]}
        verdict, ok = verdict_of(j.exact, findings, schedule, p50s, unaccounted)
        stage_s = (window[1] - window[0]) if window else None
        return {
            "config": asdict(cfg),
            "machine": {"before": before, "after": after},
            "load_processes": sizing.processes,
            "cpu_split": split.to_json() if split is not None else None,
            "truth_server": {
                "workers": sizing.truth_workers,
                "auto": cfg.truth_workers == AUTO,
                "realtime": cfg.truth_realtime,
                "workers_lost": dump.get("workers_lost") or [],
                "worker_chunks": dump.get("worker_chunks"),
                "backpressured_writes": dump.get("backpressured_writes"),
            },
            "capacity": None
            if sizing.capacity is None
            else {**sizing.capacity.describe(), "line": sizing.capacity.line()},
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
            "schedule_lag_ms": lag,
            "server_write_lateness_ms": lateness,
            "late": late_sides(schedule),
            "chunk_stamp": used.most_common(1)[0][0] if used else stamp,
            "chunk_stamps": dict(used),
            "capture": capture,
            "accounting": {**accounting, "problem": unaccounted},
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
                "server_us_per_chunk": 1e6 * cpu["server_cpu_s"] / total_chunks if total_chunks else None,
            },
            "locust": {"exit_code": run.exit_code, "wall_s": run.wall_s, "cpu_s_total": run.cpu_s_total},
            "client_coalesced_streams": merged,
            "host_held": held,
            "bounds": [f.to_dict() for f in [*schedule, *findings]],
            "verdict": verdict,
            "ok": ok,
            "work_dir": str(work) if cfg.keep_dir else None,
        }
    finally:
        if hosts is not None:
            hosts.remove()
        if tmp is not None:
            tmp.cleanup()


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
    add_option(p, "processes", type=str, default=str(d.processes),
               help="load processes in all, or auto: from the chunk rate (rate x tokens) and this host's "
                    "calibration (measured once, cached)")  # fmt: skip
    p.add_argument("--truth-workers", default="auto",
                   help="reference server processes sharing its port, or auto (the default): from the chunk "
                        "rate and this host's calibration")  # fmt: skip
    p.add_argument("--truth-realtime", action="store_true",
                   help="run the reference's workers at SCHED_FIFO where allowed, so a load that fills every "
                        "core delays the client's reads, not the reference's writes")  # fmt: skip
    p.add_argument("--hosts", type=int, default=d.hosts,
                   help="load hosts: 2 or more runs Locust's master and its workers in network namespaces of "
                        "their own (root), the processes spread over them")  # fmt: skip
    add_option(p, "seed", default=d.seed, help="arrival schedule seed (gaps use seed + 1)")
    p.add_argument("--warn-ms", type=float, default=d.warn_p99_ms, help="bound on the p99 chunk error (ms)")
    p.add_argument("--max-gap-p99-ms", type=float, default=d.gap_p99_ms, help="bound on the worst-gap error p99")
    p.add_argument("--max-gap-ms", type=float, default=d.gap_max_ms, help="bound on the largest worst-gap error")
    p.add_argument("--max-ttft-p99-ms", type=float, default=d.ttft_p99_ms, help="bound on the TTFT error p99")
    p.add_argument("--max-merged", type=int, default=d.merged_max, help="bound on streams merged by late reads")
    p.add_argument("--max-server-late-p99-ms", type=float, default=None,
                   help="bound on the reference server's write lateness p99, write - its target (default: a "
                        "quarter of --gap-ms)")  # fmt: skip
    p.add_argument("--max-lag-p99-ms", type=float, default=d.lag_p99_ms,
                   help="bound on the client's schedule lag p99 (sent - intended)")  # fmt: skip
    p.add_argument("--server-write-delay-us", type=float, default=0.0,
                   help="hold the reference's event loop this long after each write: a reference made to fall "
                        "behind, to see the lateness bound refuse it")  # fmt: skip
    add_option(p, "chunk_stamp")
    p.add_argument("--keep", default=None, help="keep trace, records, logs and chunk log in this folder")
    p.add_argument("--cpu-split", choices=SPLIT_MODES, default=d.cpu_split,
                   help="auto (the default): the reference server and the load on CPUs of their own where the host "
                        "has 4 or more; off: both share every CPU")  # fmt: skip
    p.add_argument("--no-host-watch", action="store_true",
                   help="no sleeper per CPU (they tell CPUs the host held back from a late client)")  # fmt: skip
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")


def config_from_args(args: argparse.Namespace) -> SelfCheckConfig:
    return SelfCheckConfig(
        rate=args.rate, n=args.n, tokens=args.tokens, gap_ms=args.gap_ms, ttft_ms=args.ttft_ms,
        processes=parse_processes(args.processes), seed=args.seed, warn_p99_ms=args.warn_ms, keep_dir=args.keep,
        gap_p99_ms=args.max_gap_p99_ms, gap_max_ms=args.max_gap_ms, ttft_p99_ms=args.max_ttft_p99_ms,
        merged_max=args.max_merged, chunk_stamp=args.chunk_stamp, host_watch=not args.no_host_watch,
        truth_workers=parse_processes(args.truth_workers, "--truth-workers"), truth_realtime=args.truth_realtime,
        hosts=args.hosts, server_late_p99_ms=args.max_server_late_p99_ms, lag_p99_ms=args.max_lag_p99_ms,
        server_write_delay_us=args.server_write_delay_us, cpu_split=args.cpu_split,
    )  # fmt: skip


def run_from_args(args: argparse.Namespace, prog: str = "tailgate selfcheck") -> int:
    try:
        cfg = config_from_args(args)
        cfg.check()
    except ValueError as e:  # OptionError included
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    # SIGTERM and SIGHUP raise like Ctrl-C, so the finally blocks stop Locust and the ground-truth server
    with signal_guard("[selfcheck]"):
        try:
            result = run_selfcheck(cfg, log=lambda line: print(line, file=sys.stderr, flush=True))
        except Stopped as e:
            sys.stderr.write(f"{prog}: {e.name}: stopped\n")
            return e.exit_code
        except NetnsUnavailable as e:  # asked for what this machine cannot make: nothing was sent
            sys.stderr.write(f"{prog}: error: --hosts {cfg.hosts}: network namespaces cannot be made here ({e})\n")
            return EXIT_USAGE
    print(render(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if result["ok"] else EXIT_WARN


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when the join is exact, both sides kept their schedule and every bound held; 1 when not; 2 on bad
    input (:mod:`tailgate.exitcodes`)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_from_args(args)


__all__ = [
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_WARN",
    "KS_ALPHA",
    "SAMPLE_INTERVAL_S",
    "WARN_P99_MS",
    "CpuSampler",
    "Join",
    "KSResult",
    "LoadRun",
    "SelfCheckConfig",
    "Sizing",
    "distribution",
    "join_records",
    "kolmogorov_sf",
    "ks_exponential",
    "locust_command",
    "machine_facts",
    "main",
    "render",
    "run_load",
    "run_selfcheck",
    "server_write_begins",
    "server_writes",
    "size_run",
    "verdict_of",
]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
