"""CPU per chunk of the client's read path alone: ``stream_completion`` under gevent against the ground-truth
server, without Locust, records or the dispatcher's spin.

The load process's CPU per chunk (the self-check's figure) bounds how many chunks one process times
exactly; this isolates the part that runs once per read and per event (recvmsg with its kernel stamp,
chunked framing, SSE, the template check), so a change to it can be measured on a busy machine: CPU
time is far less disturbed by other work than latency is.

    python benchmarks/read_path.py [--rate 200] [--n 600] [--tokens 100] [--stamp kernel] [--repeat 3]
    python benchmarks/read_path.py --profile 25          # the 25 costliest functions (cProfile)
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import cProfile  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402

from tailgate.verify.calibrate import timed_streams  # noqa: E402
from tailgate.verify.groundtruth import start_server_process  # noqa: E402


def run_once(base_url: str, rate: float, n: int, tokens: int, stamp: str) -> tuple[float, int]:
    """Open-loop arrivals at ``rate`` (even spacing), read as a load process reads them (the calibration's
    workload, :func:`tailgate.verify.calibrate.timed_streams`); returns (CPU seconds, content chunks)."""
    try:
        return timed_streams(base_url, n, rate=rate, tokens=tokens, stamp=stamp)
    except RuntimeError as e:
        raise SystemExit(f"read_path: {e}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--n", type=int, default=600)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--stamp", choices=("kernel", "recv"), default="kernel")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, help="print this many costliest functions of one more run")
    args = p.parse_args(argv)
    with start_server_process(ttft_ms=20, gap_ms=10) as server:
        run_once(server.base_url, args.rate, min(args.n, 50), args.tokens, args.stamp)  # warm: imports, first use
        per_chunk = []
        for _ in range(args.repeat):
            used, chunks = run_once(server.base_url, args.rate, args.n, args.tokens, args.stamp)
            per_chunk.append(used / chunks * 1e6)
        print(
            f"read path, {args.stamp} stamp, {args.rate:g} req/s x {args.tokens} chunks: CPU per chunk "
            f"{' / '.join(f'{v:.1f}' for v in per_chunk)} us (median {statistics.median(per_chunk):.1f})"
        )
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_once(server.base_url, args.rate, args.n, args.tokens, args.stamp)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
