"""How precisely the ground-truth server keeps its schedule under load, and what it costs in CPU.

The server is only a reference if its own writes stay close to their targets at the load a benchmark
puts on it. This script starts it in its own process, opens N streams of M chunks (by default
200 x 100 at 10 ms gaps: 20,000 chunks/s), reads them with a minimal asyncio reader, and prints:

- write lateness (write time minus the absolute target) from the server's own log;
- the write call's duration (after-write minus before-write stamp);
- delivery delay (this reader's receive time minus the server's after-write time; same clock);
- achieved chunk rate and the server's and reader's CPU use.

Run: ``python benchmarks/groundtruth_capacity.py [--streams 200 --chunks 100 --gap-ms 10 --start spread]``.
``--start aligned`` sends every request at once, so all streams share targets (a batch-like burst);
``spread`` staggers the starts evenly over one gap, so writes are evenly spaced in time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate.stats import percentile
from tailgate.verify.groundtruth import start_server_process

MS = 1_000_000
_ID = re.compile(rb'"id":"cmpl-(\d+)"')
_EVENT_END = b"\n\n\r\n"


class Reader(asyncio.Protocol):
    """Stamps every content event when the read that completed it returns; parses nothing else."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.rest = b""
        self.seq = -1
        self.times: list[int] = []
        self.complete = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t = time.monotonic_ns()
        buf = self.rest + data
        pieces = buf.split(_EVENT_END)
        self.rest = pieces.pop()
        for piece in pieces:
            if b'"choices":[{' in piece:
                if self.seq < 0:
                    m = _ID.search(piece)
                    self.seq = int(m.group(1)) if m else -1
                self.times.append(t)
        if self.rest.endswith(b"0\r\n\r\n"):
            self.complete = True
            if not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from /proc/stat (Linux)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def summary(values: Sequence[float]) -> str:
    if not values:
        return "n=0"
    parts = [f"p{p:g}={percentile(values, p):.3f}" for p in (50, 90, 99, 99.9)]
    return f"n={len(values)} " + " ".join(parts) + f" max={max(values):.3f}"


async def drive(port: int, streams: int, chunks: int, gap_ms: float, start: str) -> tuple[list[Reader], float]:
    loop = asyncio.get_running_loop()
    body = json.dumps(
        {
            "model": "ground-truth",
            "prompt": "ocean " * 200,
            "max_tokens": chunks,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    readers: list[Reader] = []
    for _ in range(streams):
        done: asyncio.Future[None] = loop.create_future()
        _, proto = await loop.create_connection(lambda d=done: Reader(d), "127.0.0.1", port)
        readers.append(proto)
    t0 = loop.time() + 0.05
    for i, r in enumerate(readers):
        at = t0 + (i * gap_ms / streams / 1000 if start == "spread" else 0.0)
        loop.call_at(at, lambda r=r: r.transport.write(request) if r.transport else None)
    wall0 = time.monotonic()
    await asyncio.gather(*(r.done for r in readers))
    for r in readers:
        if r.transport is not None:
            r.transport.close()
    return readers, time.monotonic() - wall0


def run(args: argparse.Namespace) -> dict[str, Any]:
    with start_server_process(ttft_ms=args.ttft_ms, gap_ms=args.gap_ms) as sp:
        if args.server_nice is not None:
            # Separates the server's own lateness from CPU contention on a shared machine.
            os.setpriority(os.PRIO_PROCESS, sp.pid, args.server_nice)
        cpu0_server = cpu_seconds(sp.pid)
        cpu0_self = time.process_time()
        busy0, total0 = machine_cpu()
        readers, wall = asyncio.run(drive(sp.port, args.streams, args.chunks, args.gap_ms, args.start))
        cpu_server = cpu_seconds(sp.pid) - cpu0_server
        cpu_self = time.process_time() - cpu0_self
        busy1, total1 = machine_cpu()
        dump = sp.dump()

    chunks = dump["chunks"]
    targets = dump["chunk_targets"]
    begins = dump["chunk_write_begin"]
    lateness = [(c[2] - tg) / MS for c, tg in zip(chunks, targets, strict=True)]
    write_call = [(c[2] - b) / MS for c, b in zip(chunks, begins, strict=True)]
    written = {(c[0], c[1]): c[2] for c in chunks}
    delivery = [(t - written[(r.seq, i)]) / MS for r in readers for i, t in enumerate(r.times) if (r.seq, i) in written]
    span_s = (max(c[2] for c in chunks) - min(targets)) / 1e9 if chunks else 0.0
    incomplete = sum(not r.complete or len(r.times) != args.chunks for r in readers)
    result = {
        "streams": args.streams,
        "chunks_per_stream": args.chunks,
        "gap_ms": args.gap_ms,
        "ttft_ms": args.ttft_ms,
        "start": args.start,
        "server_nice": args.server_nice,
        "chunks_logged": len(chunks),
        "incomplete_streams": incomplete,
        "backpressured_writes": dump["backpressured_writes"],
        "target_rate_chunks_s": args.streams * 1000 / args.gap_ms,
        "achieved_rate_chunks_s": len(chunks) / span_s if span_s else 0.0,
        "wall_s": wall,
        "server_cpu_s": cpu_server,
        "server_cpu_pct_of_core": 100 * cpu_server / wall,
        "server_cpu_us_per_chunk": 1e6 * cpu_server / max(1, len(chunks)),
        "reader_cpu_pct_of_core": 100 * cpu_self / wall,
        "cores": os.cpu_count(),
        "machine_busy_pct": 100 * (busy1 - busy0) / max(1, total1 - total0),
        "others_cores_busy": (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)
        - (cpu_server + cpu_self) / wall,
        "lateness_ms": lateness,
        "write_call_ms": write_call,
        "delivery_ms": delivery,
    }
    return result


def report(r: dict[str, Any]) -> None:
    print(
        f"{r['streams']} streams x {r['chunks_per_stream']} chunks, gap {r['gap_ms']:g} ms, "
        f"ttft {r['ttft_ms']:g} ms, starts {r['start']}"
        + (f", server nice {r['server_nice']}" if r["server_nice"] is not None else "")
    )
    print(
        f"  chunks logged {r['chunks_logged']}, incomplete streams {r['incomplete_streams']}, "
        f"backpressured writes {r['backpressured_writes']}"
    )
    print(
        f"  rate: target {r['target_rate_chunks_s']:.0f}/s, achieved {r['achieved_rate_chunks_s']:.0f}/s "
        f"over {r['wall_s']:.2f} s"
    )
    print(
        f"  server CPU {r['server_cpu_pct_of_core']:.0f}% of one core "
        f"({r['server_cpu_us_per_chunk']:.1f} us/chunk); reader CPU {r['reader_cpu_pct_of_core']:.0f}%"
    )
    print(
        f"  machine: {r['cores']} cores, {r['machine_busy_pct']:.0f}% busy; other processes used "
        f"{r['others_cores_busy']:.2f} cores during the run"
    )
    print(f"  write lateness ms (write - target): {summary(r['lateness_ms'])}")
    print(f"  write call ms (after - before):    {summary(r['write_call_ms'])}")
    print(f"  delivery ms (reader recv - write): {summary(r['delivery_ms'])}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms", type=float, default=10.0)
    p.add_argument("--start", choices=("spread", "aligned"), default="spread")
    p.add_argument("--server-nice", type=int, help="scheduling niceness for the server process (negative needs root)")
    p.add_argument("--json", help="also write the figures (without the raw samples) to this file")
    args = p.parse_args(argv)
    result = run(args)
    report(result)
    if args.json:
        figures = {k: v for k, v in result.items() if not isinstance(v, list)}
        for key in ("lateness_ms", "write_call_ms", "delivery_ms"):
            values = result[key]
            figures[key] = {f"p{q:g}": percentile(values, q) for q in (50, 90, 99, 99.9)} | {
                "max": max(values) if values else None,
                "n": len(values),
            }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if result["incomplete_streams"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
