"""How far one load host measures exactly: the self-check from 250 to 4,000 req/s of 100-chunk streams.

Each step is one ``tailgate selfcheck`` (in a child process) at RATE req/s of ``--tokens``-chunk streams at
``--gap-ms`` gaps, with ``--stage-s`` seconds of arrivals (n = rate x stage), once per stamp source, with
``--processes auto`` and ``--truth-workers auto`` by default: this host's calibration sizes the load processes
and the reference server's workers (:mod:`tailgate.load.hostcapacity`). ``--hosts 2`` runs the same load over
two load hosts made of network namespaces (root), the master beside the reference server.

Per step it prints and keeps: the worst-gap error p99 and max, the TTFT error p99, merged streams, the load's
CPU per chunk, chunks/s per load process, the load processes and reference workers used, the reference's
write lateness p50/p99/max, the client's schedule lag p99, the accounting and the verdict. ``--out DIR``
gets ``scale-host.json``, ``scale-host.md`` and every step's whole self-check document under ``steps/``.
``--merge A.json B.json ... --out DIR`` writes one table from several runs (a long ramp split over calls).

    python benchmarks/scale_host.py --rates 250,500,1000,2000,4000 --stage-s 30 --stamps kernel,capture --out DIR
    python benchmarks/scale_host.py --rates 250,1000,2000 --hosts 2 --out DIR
    python benchmarks/scale_host.py --rates 50,100 --stage-s 5 --out /tmp/scale      # a small run on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEP_TIMEOUT_S = 1800.0
STOP_GRACE_S = 90.0
"""How long a step stopped at its timeout has to stop its Locust and reference before its group is killed."""
SCHEDULE_KEYS = ("server_write_lateness_p99_ms", "schedule_lag_p99_ms")
"""The self-check's bounds on the two schedules (the row says which side was late apart from them)."""


def step_command(args: argparse.Namespace, rate: float, stamp: str, out: Path) -> list[str]:
    n = max(20, round(rate * args.stage_s))
    return [
        sys.executable, "-m", "tailgate.verify.selfcheck", "--rate", f"{rate:g}", "--n", str(n),
        "--tokens", str(args.tokens), "--gap-ms", f"{args.gap_ms:g}", "--ttft-ms", f"{args.ttft_ms:g}",
        "--processes", args.processes, "--truth-workers", args.truth_workers, "--chunk-stamp", stamp,
        "--hosts", str(args.hosts), "--json", str(out), *(["--truth-realtime"] if args.truth_realtime else []),
        "--cpu-split", args.cpu_split,
    ]  # fmt: skip


def _get(doc: dict[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def row(rate: float, stamp: str, hosts: int, r: dict[str, Any] | None, wall_s: float, error: str | None) -> dict:
    """One step's figures (None where the step did not produce them)."""
    processes = _get(r, "load_processes")
    chunks_per_s = _get(r, "chunks_per_s")
    late = _get(r, "server_write_lateness_ms") or {}
    return {
        "rate": rate, "stamp": stamp, "hosts": hosts, "wall_s": round(wall_s, 1), "error": error,
        "load_processes": processes, "truth_workers": _get(r, "truth_server", "workers"),
        "cpu_split": _get(r, "cpu_split"),
        "chunks_per_s": chunks_per_s,
        "chunks_per_s_per_process": chunks_per_s / processes if chunks_per_s and processes else None,
        "us_per_chunk": _get(r, "cpu", "load_us_per_chunk"),
        "truth_us_per_chunk": _get(r, "cpu", "server_us_per_chunk"),
        "gap_err_p99": _get(r, "worst_gap_error_ms", "p99"), "gap_err_max": _get(r, "worst_gap_error_ms", "max"),
        "beyond_p99": _get(r, "worst_gap_beyond_write_ms", "p99"),
        "beyond_max": _get(r, "worst_gap_beyond_write_ms", "max"),
        "ttft_err_p99": _get(r, "ttft_error_ms", "p99"), "merged": _get(r, "client_coalesced_streams"),
        "lag_p99": _get(r, "schedule_lag_ms", "p99"),
        "truth_late_p50": late.get("p50"), "truth_late_p99": late.get("p99"), "truth_late_max": late.get("max"),
        "accounting": _get(r, "accounting"), "exact": _get(r, "join", "exact"),
        "capture_drops": _get(r, "capture", "drops"), "stamps_used": _get(r, "chunk_stamps"),
        "others_cores": _get(r, "cpu", "others_busy_cores"),
        "late": _get(r, "late"), "ok": _get(r, "ok"), "verdict": _get(r, "verdict") or error,
        "breached": [b["label"] for b in _get(r, "bounds") or () if b["breached"] and b["key"] not in SCHEDULE_KEYS],
    }  # fmt: skip


def short_verdict(r: dict[str, Any]) -> str:
    """The verdict in a few words, for the table: OK, or what failed."""
    if r.get("error"):
        return "no result: " + str(r["error"])[:80]
    if r.get("ok"):
        return "OK"
    late = r.get("late") or {}
    why = [w for w, bad in (("reference late", late.get("server")), ("client late", late.get("client"))) if bad]
    why += [] if r.get("exact") else ["join not exact"]
    why += ["accounting"] if (r.get("accounting") or {}).get("problem") else []
    why += r.get("breached") or []
    return "FAIL: " + ", ".join(why)


def _f(v: Any, digits: int = 3) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def line(r: dict[str, Any]) -> str:
    head = f"[scale] {r['rate']:g} req/s {r['stamp']}" + (f" over {r['hosts']} hosts" if r["hosts"] > 1 else "")
    if r["error"]:
        return f"{head}: {r['error']}"
    return (
        f"{head}: {r['load_processes']} load process(es), {r['truth_workers']} truth worker(s); worst-gap error "
        f"p99 {_f(r['gap_err_p99'])} max {_f(r['gap_err_max'])} ms, TTFT error p99 {_f(r['ttft_err_p99'])}, "
        f"merged {r['merged']}, {_f(r['us_per_chunk'], 1)} us/chunk, {_f(r['chunks_per_s_per_process'], 0)} "
        f"chunks/s per process; truth lateness p50/p99/max {_f(r['truth_late_p50'])}/{_f(r['truth_late_p99'])}/"
        f"{_f(r['truth_late_max'])} ms; {r['verdict']}"
    )


def markdown(rows: Sequence[dict[str, Any]], metas: Sequence[dict[str, Any]]) -> str:
    out = ["# One load host, 250 to 4,000 req/s", ""]
    for meta in metas:
        out += [f"- {meta['date']}, {meta['machine']}: `{meta['command']}`"]
    out += [
        "",
        "Each row: one `tailgate selfcheck` (100-chunk streams unless the command says otherwise), `--processes` and "
        "`--truth-workers` as the command says (auto: sized by this host's calibration). Errors in ms (client "
        "minus the reference's writes); lateness: the reference's write minus its target; CPU: the load "
        "processes (capture processes included) per chunk; CPUs: how many the reference and the load ran on "
        "(`--cpu-split`; shared: both on every CPU); verdict: the self-check's, in short (the whole "
        "sentence is in the JSON).",
        "",
        "| req/s | stamp | hosts | load proc | truth workers | CPUs ref / load | chunks/s | chunks/s per proc "
        "| us CPU/chunk | worst-gap err p99 | max | TTFT err p99 | merged | lag p99 | truth late p50 / p99 / max "
        "| planned / recorded | verdict |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        acc = r.get("accounting") or {}
        verdict = short_verdict(r).replace("|", "/")
        split = r.get("cpu_split")
        cpus = f"{len(split['reference'])} / {len(split['load'])}" if split else "shared"
        counts = f"{r['load_processes'] or '–'} | {r['truth_workers'] or '–'} | {cpus}"
        out.append(
            f"| {r['rate']:g} | {r['stamp']} | {r['hosts']} | {counts} "
            f"| {_f(r['chunks_per_s'], 0)} | {_f(r['chunks_per_s_per_process'], 0)} | {_f(r['us_per_chunk'], 1)} "
            f"| {_f(r['gap_err_p99'])} | {_f(r['gap_err_max'])} | {_f(r['ttft_err_p99'])} | {r['merged']} "
            f"| {_f(r['lag_p99'])} | {_f(r['truth_late_p50'])} / {_f(r['truth_late_p99'])} / {_f(r['truth_late_max'])} "
            f"| {acc.get('planned', '–')} / {acc.get('recorded', '–')} | {verdict} |"
        )
    return "\n".join(out) + "\n"


def write(out: Path, rows: list[dict[str, Any]], metas: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale-host.json").write_text(json.dumps({"meta": metas, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    (out / "scale-host.md").write_text(markdown(rows, metas), encoding="utf-8")


def run_step(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int | None, str]:
    """One self-check in a session of its own; past ``timeout_s`` it is stopped as Ctrl-C would (it then stops its
    Locust and its reference), then killed with whatever is left of its group. (exit code or None, stderr)."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err.seek(0)
        return code, err.read()


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    out = Path(args.out)
    (out / "steps").mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f} at the start",
        "command": "python benchmarks/scale_host.py " + shlex.join(argv),
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for rate in [float(x) for x in args.rates.split(",") if x.strip()]:
        for stamp in [x.strip() for x in args.stamps.split(",") if x.strip()]:
            step = out / "steps" / f"{rate:g}-{stamp}-h{args.hosts}.json"
            step.unlink(missing_ok=True)
            t0 = time.monotonic()
            error = None
            code, err = run_step(step_command(args, rate, stamp, step), env, args.step_timeout_s)
            if code is None:
                error = f"did not finish within {args.step_timeout_s:g} s"
            elif not step.exists():
                error = f"no result (exit {code}): {err.strip()[-600:]}"
            doc = json.loads(step.read_text()) if step.exists() else None
            r = row(rate, stamp, args.hosts, doc, time.monotonic() - t0, error)
            rows.append(r)
            print(line(r), flush=True)
            write(out, rows, [meta])
    print(f"[scale] wrote {out / 'scale-host.md'} and {out / 'scale-host.json'}")
    return 0


def merge(paths: Sequence[str], out: Path) -> int:
    rows: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        rows += doc["rows"]
        metas += doc["meta"]
    rows.sort(key=lambda r: (r["hosts"], r["stamp"], r["rate"]))
    write(out, rows, metas)
    print(f"[scale] merged {len(paths)} run(s) into {out / 'scale-host.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="250,500,1000,2000,4000")
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--stage-s", type=float, default=30.0, help="seconds of arrivals per step")
    p.add_argument("--stamps", default="kernel,capture")
    p.add_argument("--processes", default="auto")
    p.add_argument("--truth-workers", default="auto")
    p.add_argument("--truth-realtime", action="store_true", help="the reference's workers at SCHED_FIFO")
    p.add_argument("--hosts", type=int, default=1, help="load hosts (2: network namespaces, root)")
    p.add_argument("--cpu-split", choices=("auto", "off"), default="auto",
                   help="the reference and the load on CPUs of their own (auto) or sharing them (off)")  # fmt: skip
    p.add_argument("--step-timeout-s", type=float, default=STEP_TIMEOUT_S)
    p.add_argument("--out", required=True)
    p.add_argument("--merge", nargs="+", help="scale-host.json files to merge into one table in --out")
    args = p.parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
