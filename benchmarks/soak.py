"""Soak: does the load generator stay flat in memory and lose nothing over a long open-loop stage?

Runs a real ``locust --headless`` (the continuous arm, one stage) against the ground-truth server for
``--duration-s`` seconds at ``--rate`` req/s, every request a ``--tokens``-token stream at
``--gap-ms`` gaps. While it runs, the Locust process's RSS is sampled every ``--sample-s`` seconds.
At the end it checks the books (records written == requests journaled as sent == planned), reads the
stage summary (errors, schedule lag, achieved rate) and writes the figures, with the exact command,
to ``--report`` (default ``benchmarks/results/soak.md``).

    python benchmarks/soak.py                                   # 30 minutes at 50 req/s
    python benchmarks/soak.py --duration-s 180 --rate 50        # a 3-minute smoke of the same

Memory is reported as RSS after a settling period (``--settle-s``, default 10% of the run, at least
20 s) and at the end, with the least-squares slope over the rest of the run, so start-up allocation
does not count as growth.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tailgate.load.workload import TraceItem, save_jsonl  # noqa: E402
from tailgate.records import lost_in_flight, read_sent  # noqa: E402
from tailgate.verify.groundtruth import start_server_process  # noqa: E402

MB = 1024 * 1024


@dataclass
class Sample:
    t: float
    """Seconds since Locust started."""
    rss: int
    cpu_s: float
    sent: int
    ended: int


def count_lines(directory: Path, pattern: str) -> int:
    total = 0
    for path in directory.glob(pattern):
        try:
            with open(path, "rb") as f:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            pass
    return total


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two points."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def tree_rss(proc: psutil.Process) -> tuple[int, float]:
    """RSS and CPU seconds of the Locust process (its /metrics sampler child is reported apart)."""
    with proc.oneshot():
        cpu = proc.cpu_times()
        return proc.memory_info().rss, cpu.user + cpu.system


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = round(args.rate * args.duration_s)
    work = Path(args.results_dir) if args.results_dir else Path(tempfile.mkdtemp(prefix="tailgate-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    results = work / "results"
    trace = work / "trace.jsonl"
    save_jsonl([TraceItem(i, args.prompt_tokens, args.tokens) for i in range(n)], trace)
    settle_s = args.settle_s if args.settle_s is not None else max(20.0, 0.1 * args.duration_s)
    samples: list[Sample] = []
    load_at_start = os.getloadavg()
    with start_server_process(ttft_ms=args.ttft_ms, gap_ms=args.gap_ms) as server:
        cmd = [
            sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "continuous.py"), "--headless",
            "--only-summary", "--host", server.base_url, "--rates", f"{args.rate:g}", "--trace-file", str(trace),
            "--warmup", "0", "--settle", "0", "--request-timeout", "120", "--results-dir", str(results),
        ]  # fmt: skip
        started = time.monotonic()
        with open(work / "locust.stdout", "wb") as out, open(work / "locust.stderr", "wb") as err:
            locust = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        proc = psutil.Process(locust.pid)
        last_print = 0.0
        try:
            while locust.poll() is None:
                try:
                    rss, cpu = tree_rss(proc)
                except psutil.Error:
                    break
                t = time.monotonic() - started
                samples.append(Sample(t, rss, cpu, count_lines(results, "sent-*.log"),
                                      count_lines(results, "records-*.jsonl")))  # fmt: skip
                if t - last_print >= 30:
                    s = samples[-1]
                    print(f"[soak] {t:6.0f} s  rss {s.rss / MB:7.1f} MB  sent {s.sent:7d}  ended {s.ended:7d}",
                          flush=True)  # fmt: skip
                    last_print = t
                time.sleep(args.sample_s)
            code = locust.wait()
        finally:
            if locust.poll() is None:
                locust.terminate()
                locust.wait(30)
        wall = time.monotonic() - started
    stderr = (work / "locust.stderr").read_text(errors="replace")
    summaries = [json.loads(p.read_text()) for p in results.glob("summary-*.json")]
    summary = summaries[0] if len(summaries) == 1 else {}
    loss = lost_in_flight(results)
    records = count_lines(results, "records-*.jsonl")
    sent = len(read_sent(results))
    steady = [s for s in samples if s.t >= settle_s]
    growth_slope = slope([s.t for s in steady], [s.rss for s in steady])
    per_request = slope([s.ended for s in steady], [s.rss for s in steady])
    figures: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "locust_command": " ".join(shlex.quote(a) for a in cmd),
        "duration_s": args.duration_s,
        "rate": args.rate,
        "tokens": args.tokens,
        "gap_ms": args.gap_ms,
        "ttft_ms": args.ttft_ms,
        "planned": n,
        "locust_exit": code,
        "wall_s": round(wall, 1),
        "sent_journal": sent,
        "records": records,
        "lost_in_flight": loss.lost,
        "errors": summary.get("errors"),
        "errors_by_class": summary.get("errors_by_class"),
        "n_ok": summary.get("n"),
        "achieved_rate": summary.get("achieved_rate"),
        "schedule_lag_p99_ms": summary.get("schedule_lag_p99"),
        "schedule_lag_max_ms": summary.get("schedule_lag_max"),
        "ttft_p99_ms": summary.get("ttft_p99"),
        "gap_p99_ms": summary.get("gap_p99"),
        "rss_first_mb": round(samples[0].rss / MB, 1) if samples else None,
        "rss_after_settle_mb": round(steady[0].rss / MB, 1) if steady else None,
        "rss_end_mb": round(samples[-1].rss / MB, 1) if samples else None,
        "rss_max_mb": round(max(s.rss for s in samples) / MB, 1) if samples else None,
        "rss_growth_after_settle_mb": round((steady[-1].rss - steady[0].rss) / MB, 1) if steady else None,
        "rss_slope_mb_per_min": None if growth_slope is None else round(growth_slope * 60 / MB, 2),
        "rss_per_finished_request_kb": None if per_request is None else round(per_request / 1024, 2),
        "locust_cpu_s": round(samples[-1].cpu_s, 1) if samples else None,
        "settle_s": settle_s,
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "cores": os.cpu_count(),
        "timeline": [(round(s.t), round(s.rss / MB, 1), s.sent, s.ended) for s in samples],
        "traceback": "Traceback" in stderr,
        "work_dir": str(work),
    }
    if not args.results_dir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        figures["work_dir"] = None
    return figures


def render(f: dict[str, Any], note: str) -> str:
    ok = f["records"] == f["sent_journal"] == f["planned"] and f["lost_in_flight"] == 0
    timeline = f["timeline"]
    step = max(1, len(timeline) // 24)
    rows = [timeline[i] for i in range(0, len(timeline), step)]
    if timeline and rows[-1] != timeline[-1]:
        rows.append(timeline[-1])
    lines = [
        "# Soak: load-generator memory and bookkeeping over a long stage",
        "",
        note,
        "",
        "Command:",
        "",
        "```bash",
        f["command"],
        "```",
        "",
        "Locust command it ran (paths are temporary):",
        "",
        "```bash",
        f["locust_command"],
        "```",
        "",
        f"Machine: {f['cores']} cores, load average at start {f['load_average_at_start']} (shared with other work).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| duration / rate / stream | {f['duration_s']:g} s at {f['rate']:g} req/s; {f['tokens']} tokens, "
        f"TTFT {f['ttft_ms']:g} ms, {f['gap_ms']:g} ms gaps |",
        f"| planned requests | {f['planned']} |",
        f"| journaled as sent | {f['sent_journal']} |",
        f"| records written | {f['records']} |",
        f"| lost in flight | {f['lost_in_flight']} |",
        f"| books balance (records == sent == planned) | {'yes' if ok else 'NO'} |",
        f"| errors (by class) | {f['errors']} {f['errors_by_class'] or ''} |",
        f"| achieved arrival rate | {f['achieved_rate']} req/s |",
        f"| schedule lag p99 / max | {f['schedule_lag_p99_ms']} / {f['schedule_lag_max_ms']} ms |",
        f"| TTFT p99 / worst-gap p99 | {f['ttft_p99_ms']} / {f['gap_p99_ms']} ms |",
        f"| Locust RSS: first sample / after {f['settle_s']:g} s / end / max | {f['rss_first_mb']} / "
        f"{f['rss_after_settle_mb']} / {f['rss_end_mb']} / {f['rss_max_mb']} MB |",
        f"| RSS growth after settling | {f['rss_growth_after_settle_mb']} MB "
        f"({f['rss_slope_mb_per_min']} MB/min; {f['rss_per_finished_request_kb']} KB per finished request) |",
        f"| Locust CPU time | {f['locust_cpu_s']} s over {f['wall_s']} s wall |",
        f"| Locust exit code / traceback | {f['locust_exit']} / {'yes' if f['traceback'] else 'no'} |",
        "",
        "RSS timeline (seconds since start, MB, sent, ended):",
        "",
        "| t s | RSS MB | sent | ended |",
        "|---:|---:|---:|---:|",
        *[f"| {t} | {rss} | {sent} | {ended} |" for t, rss, sent, ended in rows],
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=1800.0, help="length of the stage (default 30 minutes)")
    p.add_argument("--rate", type=float, default=50.0, help="arrival rate, req/s")
    p.add_argument("--tokens", type=int, default=100, help="content chunks per stream")
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--prompt-tokens", type=int, default=4)
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--settle-s", type=float, default=None, help="start-up period left out of the growth figures")
    p.add_argument("--results-dir", default="", help="keep the run here (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "soak.md"))
    p.add_argument("--note", default="", help="a paragraph put at the top of the report")
    args = p.parse_args(argv)
    if not (args.duration_s > 0 and args.rate > 0 and args.tokens > 0 and args.sample_s > 0):
        p.error("--duration-s, --rate, --tokens and --sample-s must be positive")
    figures = run(args)
    report = Path(args.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(render(figures, args.note), encoding="utf-8")
    (report.with_suffix(".json")).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    keys = ("planned", "sent_journal", "records", "lost_in_flight", "errors", "rss_after_settle_mb", "rss_end_mb",
            "rss_growth_after_settle_mb", "rss_slope_mb_per_min", "rss_per_finished_request_kb",
            "schedule_lag_p99_ms")  # fmt: skip
    print(json.dumps({k: figures[k] for k in keys}))
    print(f"[soak] report: {report}")
    balanced = figures["records"] == figures["sent_journal"] == figures["planned"]
    return 0 if balanced and not figures["traceback"] else 1


if __name__ == "__main__":
    sys.exit(main())
