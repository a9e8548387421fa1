"""This host's calibration: the CPU one load process spends per chunk on a fixed read-path workload, and the
CPU the ground-truth server spends per chunk it writes.

``--processes auto`` gives each load process a chunk rate it can time exactly, and the self-check's
``--truth-workers auto`` gives each ground-truth worker a chunk rate it writes on time. Both are CPU budgets,
so they follow from how much CPU a chunk costs on the host that runs them; a table measured on another host
says little about this one (the 16-core host's read path alone took 10.7 to 14 us per chunk on two leases;
a 2-core VM takes twice that). This is the measurement, a few seconds long: the client's read path
(:func:`tailgate.load.client.stream_completion` under gevent, kernel stamps, chunks recorded, collection
held as in a stage; what ``benchmarks/read_path.py`` measures) against a ground-truth server in its own
process, at a fixed open-loop rate, after a warm-up. It runs in a child process of its own (``python -m
tailgate.verify.calibrate``), because gevent must patch a fresh interpreter and the commands that need it
import no gevent; :mod:`tailgate.load.hostcapacity` caches its answer per host and turns it into capacities.

Prints one JSON object: ``read_us_per_chunk``, ``server_us_per_chunk``, ``chunks``, ``seconds``.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import gevent  # noqa: E402
from gevent.pool import Group  # noqa: E402

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from tailgate.jsontypes import JsonObject  # noqa: E402
from tailgate.load.client import StreamTiming, Target, build_payload, build_request, stream_completion  # noqa: E402
from tailgate.load.stagegc import QuietCollector  # noqa: E402
from tailgate.verify.groundtruth import DEFAULT_MODEL, start_server_process  # noqa: E402

RATE = 200.0
"""Arrivals per second of the fixed workload: 20,000 chunks/s, below one process's limit on any host seen."""
STREAMS = 300
TOKENS = 100
GAP_MS = 2.0
"""Short gaps keep the workload to about two seconds while each stream still has 100 chunks."""
WARMUP_STREAMS = 40


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of another process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_loop_cpu_s(one: Callable[[], None], n: int, rate: float) -> float:
    """``n`` greenlets of ``one`` started at ``rate`` (even spacing, open loop: none waits for another), then all
    joined; this process's CPU seconds meanwhile."""
    group = Group()
    start = cpu_s()
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        group.spawn(one)
    group.join()
    return cpu_s() - start


def timed_streams(
    base_url: str, n: int, rate: float = RATE, tokens: int = TOKENS, stamp: str = "kernel"
) -> tuple[float, int]:
    """``n`` streams at ``rate`` (even spacing), read as a load process reads them; CPU seconds of this process
    and content chunks read. Raises RuntimeError naming a failure: a failed stream's CPU is not a chunk's."""
    target = Target.parse(base_url)
    request = build_request(target, build_payload(DEFAULT_MODEL, "hello " * 8, tokens))
    timings: list[StreamTiming] = []

    def one() -> None:
        t = StreamTiming()
        timings.append(t)
        stream_completion(target, b"", t, request=request, record_chunks=True, stamp=stamp)

    quiet = QuietCollector()  # as in a load process's stage: no collection while streams are timed
    quiet.start()
    try:
        used = open_loop_cpu_s(one, n, rate)
    finally:
        quiet.end()
    failed = [t.error_class for t in timings if t.error_class]
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} streams failed, e.g. {failed[0]}")
    return used, sum(t.chunks for t in timings)


def measure() -> JsonObject:
    t0 = time.monotonic()
    with start_server_process(ttft_ms=GAP_MS, gap_ms=GAP_MS) as server:
        timed_streams(server.base_url, WARMUP_STREAMS)  # imports and first use, not counted
        before = _proc_cpu_s(server.pid)
        used, chunks = timed_streams(server.base_url, STREAMS)
        server_used = _proc_cpu_s(server.pid) - before
    return {
        "read_us_per_chunk": round(1e6 * used / chunks, 2),
        "server_us_per_chunk": round(1e6 * server_used / chunks, 2),
        "chunks": chunks,
        "seconds": round(time.monotonic() - t0, 2),
        "workload": f"{STREAMS} streams x {TOKENS} chunks at {RATE:g} req/s, {GAP_MS:g}-ms gaps, kernel stamps",
    }


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    try:
        result = measure()
    except (RuntimeError, OSError) as e:
        print(f"calibration failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
