"""Why a plain process stalls beside the CPU vLLM on a small machine, and what stops it.

Starts the CPU vLLM with the tiny model the way the embedded suite does, drives it with a few
streaming requests (long prompts, so prefill keeps its threads busy), and runs a *plain* probe
process beside it: a loop that sleeps 1 ms and records by how much it overslept (its schedule
lag), as a load generator's timer would. The probe also reads its own ``/proc/self/schedstat``
(time spent runnable but waiting for a CPU). Each mode changes only how the server and the probe
are placed and prioritised:

- ``as-is``: the server in its own session at nice 10 (the controller's former default).
- ``autogroup``: the same, and the server's autogroup niced too (``/proc/<pid>/autogroup``).
- ``split``: the server restricted to the cores after the first, its OpenMP threads bound there
  (the controller's default now); the probe at its ordinary priority.
- ``isolated``: ``split`` and the probe at ``SCHED_FIFO`` when allowed (as ``--realtime`` runs Locust).

    python benchmarks/embedded_stall.py [--modes as-is,isolated,autogroup] [--seconds 30] [--json out.json]

Prints, per mode, the probe's lag p50/p99/max and how long it waited runnable, and the server's
thread placement (affinity, nice, autogroup) as the kernel reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from tailgate.load.processes import set_realtime
from tailgate.servers import LocalVllmServer, ServerError, ensure_tiny_model, ensure_vllm_venv

PROBE = r"""
import json, os, sys, time
seconds, realtime = float(sys.argv[1]), sys.argv[2] == "1"
got_rt = False
if realtime:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        got_rt = True
    except OSError:
        pass
def schedstat():
    run, wait, slices = (int(x) for x in open("/proc/self/schedstat").read().split())
    return run, wait, slices
lags = []
s0 = schedstat()
end = time.perf_counter() + seconds
while True:
    t = time.perf_counter()
    if t >= end:
        break
    time.sleep(0.001)
    lags.append((time.perf_counter() - t - 0.001) * 1e3)
s1 = schedstat()
lags.sort()
pick = lambda p: lags[min(len(lags) - 1, int(p / 100 * len(lags)))]
print(json.dumps({
    "samples": len(lags), "lag_p50_ms": pick(50), "lag_p99_ms": pick(99), "lag_p999_ms": pick(99.9),
    "lag_max_ms": lags[-1], "over_10ms": sum(x > 10 for x in lags), "over_100ms": sum(x > 100 for x in lags),
    "over_1s": sum(x > 1000 for x in lags), "run_s": (s1[0] - s0[0]) / 1e9, "runnable_wait_s": (s1[1] - s0[1]) / 1e9,
    "timeslices": s1[2] - s0[2], "realtime": got_rt, "autogroup": open("/proc/self/autogroup").read().strip(),
    "affinity": sorted(os.sched_getaffinity(0)),
}))
"""


def drive(base_url: str, model: str, stop: threading.Event, prompt_words: int, max_tokens: int) -> list[float]:
    """One client thread: streaming completions back to back until ``stop``; returns their durations."""
    body = json.dumps({
        "model": model, "prompt": "ocean " * prompt_words, "max_tokens": max_tokens, "stream": True,
        "ignore_eos": True, "temperature": 0,
    }).encode()  # fmt: skip
    took = []
    while not stop.is_set():
        t = time.perf_counter()
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(base_url + "/v1/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                for _ in resp:
                    pass
        except OSError:
            time.sleep(0.5)
        took.append(time.perf_counter() - t)
    return took


def thread_facts(pid: int) -> list[dict[str, Any]]:
    """Every thread of every process in the server's group: name, affinity, nice, policy, CPU time."""
    from tailgate.servers.local import group_members

    out = []
    for member in group_members(pid):
        try:
            autogroup = Path(f"/proc/{member}/autogroup").read_text().strip()
        except OSError:
            autogroup = None
        for task in Path(f"/proc/{member}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
                status = (task / "status").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            name = stat[stat.find("(") + 1 : stat.rfind(")")]
            allowed = next((ln.split(":", 1)[1].strip() for ln in status.splitlines()
                            if ln.startswith("Cpus_allowed_list")), "?")  # fmt: skip
            out.append({
                "pid": member, "tid": int(task.name), "name": name, "cpus": allowed, "nice": int(fields[16]),
                "policy": int(fields[38]), "cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                "autogroup": autogroup,
            })  # fmt: skip
    return out


def run_mode(mode: str, seconds: float, clients: int, log_dir: Path) -> dict[str, Any]:
    python = ensure_vllm_venv()
    model_dir = ensure_tiny_model(python=python)
    kwargs: dict[str, Any] = {}
    if mode == "as-is":
        kwargs = {"cpus": None, "autogroup_nice": False}
    elif mode == "autogroup":
        kwargs = {"cpus": None, "autogroup_nice": True}
    elif mode in ("isolated", "split"):
        kwargs = {}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    server = LocalVllmServer(python, model_dir, extra_args=["--enforce-eager"], log_path=log_dir / f"vllm-{mode}.log",
                             **kwargs)  # fmt: skip
    t0 = time.monotonic()
    with server:
        started = time.monotonic() - t0
        stop = threading.Event()
        results: list[list[float]] = []

        def client() -> None:
            results.append(drive(server.base_url, "tiny-llama", stop, 1500, 64))

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for th in threads:
            th.start()
        time.sleep(2)  # the server is busy before the probe starts
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, str(seconds), "1" if mode == "isolated" else "0"],
            capture_output=True, text=True, timeout=seconds + 120,
        )  # fmt: skip
        facts = thread_facts(server.pid) if server.pid else []
        stop.set()
        for th in threads:
            th.join(timeout=180)
    out = json.loads(probe.stdout) if probe.returncode == 0 else {"error": probe.stderr[-500:]}
    busy = sorted(facts, key=lambda f: -f["cpu_s"])[:6]
    return {
        "mode": mode, "server_start_s": round(started, 1), "probe": out,
        "requests": sum(len(r) for r in results), "server_busiest_threads": busy,
        "server_cpus": sorted({f["cpus"] for f in facts}), "server_nice": sorted({f["nice"] for f in facts}),
        "server_autogroups": sorted({str(f["autogroup"]) for f in facts}),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="as-is,isolated,autogroup")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--logs", default="/tmp/tailgate-embedded-stall")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    group = Path("/proc/self/autogroup").read_text().strip()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; this process's autogroup: "
          f"{group}; realtime allowed: {set_realtime(probe_only=True)}")  # fmt: skip
    for mode in args.modes.split(","):
        try:
            r = run_mode(mode.strip(), args.seconds, args.clients, logs)
        except ServerError as e:
            print(f"{mode:>10}: the server did not come up: {str(e).splitlines()[0]}", flush=True)
            rows.append({"mode": mode, "error": str(e).splitlines()[0]})
            continue
        rows.append(r)
        pr = r["probe"]
        if "error" in pr:
            print(f"{mode}: probe failed: {pr['error']}")
            continue
        print(
            f"{mode:>10}: probe lag p50 {pr['lag_p50_ms']:.3f} p99 {pr['lag_p99_ms']:.3f} "
            f"p99.9 {pr['lag_p999_ms']:.3f} max {pr['lag_max_ms']:.1f} ms; "
            f">10 ms {pr['over_10ms']}, >100 ms {pr['over_100ms']}, >1 s {pr['over_1s']}; "
            f"waited runnable {pr['runnable_wait_s']:.2f} s of {args.seconds:g} s (ran {pr['run_s']:.2f} s); "
            f"FIFO {pr['realtime']}; server cpus {r['server_cpus']} nice {r['server_nice']} "
            f"autogroups {r['server_autogroups']}; {r['requests']} requests served",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
