"""CPU per chunk of the client's read path alone: ``stream_completion`` under gevent against the ground-truth
server, without Locust, records or the dispatcher's spin.

The load process's CPU per chunk (the self-check's figure) bounds how many chunks one process times
exactly; this isolates the part that runs once per read and per event (recvmsg with its kernel stamp,
chunked framing, SSE, the template check), so a change to it can be measured on a busy machine: CPU
time is far less disturbed by other work than latency is.

    python benchmarks/read_path.py [--rate 200] [--n 600] [--tokens 100] [--stamp kernel] [--repeat 3]
                                                         # also the share of that CPU spent in the kernel
    python benchmarks/read_path.py --profile 25          # the 25 costliest functions (cProfile)
    python benchmarks/read_path.py --records             # what encoding one record costs, per encoder
    python benchmarks/read_path.py --take                # one read's handling alone, no socket (ns per read)
    python benchmarks/read_path.py --floor               # the same streams read by a client that parses nothing
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()


import argparse  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import pstats  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from tailgate.records import RequestRecord  # noqa: E402
from tailgate.verify.calibrate import timed_streams  # noqa: E402
from tailgate.verify.groundtruth import start_server_process  # noqa: E402


def run_once(base_url: str, rate: float, n: int, tokens: int, stamp: str) -> tuple[float, int]:
    """Open-loop arrivals at ``rate`` (even spacing), read as a load process reads them (the calibration's
    workload, :func:`tailgate.verify.calibrate.timed_streams`); returns (CPU seconds, content chunks)."""
    try:
        return timed_streams(base_url, n, rate=rate, tokens=tokens, stamp=stamp)
    except RuntimeError as e:
        raise SystemExit(f"read_path: {e}") from None


def record_encoding(tokens: int, repeat: int = 20_000) -> None:
    """The record a self-check stream leaves (``tokens`` chunk offsets and read delays), encoded the way the files
    are written (``tailgate.records.json_line``) and the way they were (``json.dumps``): per record, per chunk."""
    rng = random.Random(1)
    record = RequestRecord(
        run_id="r", worker="host-1", trace_id=1, stage=1, stage_label="r200", arm="continuous", rate_or_batch=200.0,
        batch=None, prompt_tokens_planned=200, max_tokens=tokens, ignore_eos=True, intended_s=1_796_414_291.123456,
        sent_s=1_796_414_291.123501, schedule_lag_ms=0.045, in_flight_at_send=40, sent_mono_ns=123_456_789_012_345,
        ttft_ms=20.113, worst_gap_ms=10.412, total_ms=1010.5, chunks=tokens, chunk_stamp="kernel",
        chunk_offsets_ms=[round(20 + 10 * i + rng.random(), 3) for i in range(tokens)],
        chunk_read_delays_ms=[round(rng.random() * 0.05, 3) for _ in range(tokens)],
    )  # fmt: skip
    for name, encode in (("json.dumps", lambda: json.dumps(record.to_dict(), separators=(",", ":"))),
                         ("json_line (orjson)", record.to_line)):  # fmt: skip
        start = time.perf_counter()
        for _ in range(repeat):
            encode()
        us = (time.perf_counter() - start) / repeat * 1e6
        print(f"record of {tokens} chunks, {name}: {us:.1f} us per record, {us / tokens:.2f} us per chunk")


def take_alone(tokens: int, streams: int = 3000, repeat: int = 5) -> None:
    """``StreamReads.take`` over a stream's reads as the reference server frames them, without a socket or
    a loop: the part of the read path that is this project's Python (the best of ``repeat`` passes)."""
    from tailgate.load.client import StreamReads
    from tailgate.load.timing import StreamTiming
    from tailgate.load.transport import ResponseHead

    def framed(event: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(event), event)

    prefix = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":'
    mid = framed(prefix + b'" tok","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n')
    last = framed(prefix + b'" tok","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n')
    last += framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    head = ResponseHead(200, {"transfer-encoding": "chunked"}, 0, b"", 0, None)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time_ns()
        for _ in range(streams):
            reads = StreamReads(StreamTiming(), head, kernel=True, capture_offsets=False)
            now = 0
            for _ in range(tokens - 1):
                now += 10_000_000
                reads.take(mid, now, 5_000)
            reads.take(last, now + 10_000_000, 5_000)
        best = min(best, (time.process_time_ns() - start) / (streams * tokens))
    print(f"take alone, {tokens}-chunk streams: {best:.0f} ns per read")


def floor_streams(base_url: str, rate: float, n: int, tokens: int) -> tuple[float, int]:
    """The least a gevent client can spend per read on the same workload: the same request on a fresh connection,
    then, in the I/O watcher's callback, one ``recvmsg`` with the kernel's receive stamp and nothing else (no
    framing, no SSE, no timing), until the chunked body's end. What :func:`run_once` costs above this is the
    project's own handling; this much is the interpreter, the event loop and the kernel's. (CPU seconds, reads)."""
    from gevent import get_hub
    from gevent.event import Event

    import socket

    from tailgate.load.client import Target, build_payload, build_request
    from tailgate.load.rxstamp import SO_TIMESTAMPNS, SOL_SOCKET, TS_SPACE
    from tailgate.verify.calibrate import open_loop_cpu_s
    from tailgate.verify.groundtruth import DEFAULT_MODEL

    target = Target.parse(base_url)
    request = build_request(target, build_payload(DEFAULT_MODEL, "hello " * 8, tokens))
    hub, reads = get_hub(), [0]

    def one() -> None:
        sock = socket.create_connection((target.host, target.port))
        sock.setsockopt(SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.sendall(request)
        raw, done, tail = sock._sock, Event(), [b""]  # type: ignore[attr-defined]
        watcher = hub.loop.io(sock.fileno(), 1)

        def readable() -> None:
            try:
                data, _ancillary, _, _ = raw.recvmsg(65536, TS_SPACE)
            except BlockingIOError:
                return
            reads[0] += 1
            tail[0] = (tail[0] + data)[-5:]
            if not data or tail[0] == b"0\r\n\r\n":
                watcher.stop()
                done.set()

        watcher.start(readable)
        done.wait()
        watcher.close()
        sock.close()

    return open_loop_cpu_s(one, n, rate), reads[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--n", type=int, default=600)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--stamp", choices=("kernel", "recv"), default="kernel")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, help="print this many costliest functions of one more run")
    p.add_argument("--records", action="store_true", help="time encoding a record instead of reading streams")
    p.add_argument("--take", action="store_true", help="time one read's handling alone, without a socket")
    p.add_argument("--floor", action="store_true", help="also read the same streams by a client that parses nothing")
    args = p.parse_args(argv)
    if args.records:
        record_encoding(args.tokens)
        return 0
    if args.take:
        take_alone(args.tokens)
        return 0
    with start_server_process(ttft_ms=20, gap_ms=10) as server:
        run_once(server.base_url, args.rate, min(args.n, 50), args.tokens, args.stamp)  # warm: imports, first use
        per_chunk, system_share = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_SELF)
            used, chunks = run_once(server.base_url, args.rate, args.n, args.tokens, args.stamp)
            after = resource.getrusage(resource.RUSAGE_SELF)
            per_chunk.append(used / chunks * 1e6)
            system_share.append((after.ru_stime - before.ru_stime) / max(used, 1e-9))
        print(
            f"read path, {args.stamp} stamp, {args.rate:g} req/s x {args.tokens} chunks: CPU per chunk "
            f"{' / '.join(f'{v:.1f}' for v in per_chunk)} us (median {statistics.median(per_chunk):.1f}); "
            f"in the kernel {' / '.join(f'{v:.0%}' for v in system_share)} of it (the rest in this process's code)"
        )
        if args.floor:
            floor = [floor_streams(server.base_url, args.rate, args.n, args.tokens) for _ in range(args.repeat)]
            per_read = [used / count * 1e6 for used, count in floor]
            print(
                f"floor (one recvmsg with its stamp per callback, nothing parsed; {floor[0][1] / args.n:.0f} reads "
                f"a stream): CPU per read {' / '.join(f'{v:.1f}' for v in per_read)} us "
                f"(median {statistics.median(per_read):.1f})"
            )
        if args.profile:
            prof = cProfile.Profile(time.process_time)  # CPU time: a wait in the hub is not charged to its caller
            prof.enable()
            run_once(server.base_url, args.rate, args.n, args.tokens, args.stamp)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
