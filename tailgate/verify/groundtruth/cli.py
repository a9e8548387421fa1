"""``python -m tailgate.verify.groundtruth``: run the server on its own."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tailgate.lifecycle import ArgumentParser
from tailgate.load.processes import set_realtime
from tailgate.optiondecl import add_option, add_options

from .engine import EngineModel
from .server import GroundTruthServer
from .settings import Settings
from .wire import DEFAULT_MODEL
from .workers import part_path, serve_workers, write_json

# ------------------------------------------------------------------------------------------------ CLI


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace, worker: tuple[int, int] = (0, 1), ready_fd: int | None = None) -> None:
    settings = Settings(
        ttft_ms=args.ttft_ms,
        gap_ms=args.gap_ms,
        model=args.model,
        accept_any_model=args.accept_any_model,
        prefix_caching=args.prefix_caching,
        engine=args.engine,
        write_delay_us=args.write_delay_us,
    )
    one = ready_fd is None  # the only server: it writes the log and the port file itself
    log_path = args.chunk_log if one else None
    server = GroundTruthServer(settings, args.host, args.port, log_path, worker=worker)
    if args.realtime:
        set_realtime()  # refused without CAP_SYS_NICE: the server carries on at its ordinary priority
    if args.script:
        server.apply_control({"script": json.loads(Path(args.script).read_text(encoding="utf-8"))})
    await server.start()
    # Startup objects never become garbage: keep full collections from walking them mid-run.
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except NotImplementedError:  # no loop signal handlers on this platform
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    if ready_fd is not None:
        os.write(ready_fd, b"w")
        os.close(ready_fd)
    elif args.port_file:
        _write_atomic(Path(args.port_file), f"{server.port}\n")
    if one:
        print(f"groundtruth listening on {args.host}:{server.port} pid {os.getpid()}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop()
    if not one and args.chunk_log:
        write_json(part_path(Path(args.chunk_log), worker[0]), server.log.columns())


def _serve_one(args: argparse.Namespace, worker: tuple[int, int], ready_fd: int | None) -> None:
    asyncio.run(_serve(args, worker, ready_fd))


def build_parser() -> argparse.ArgumentParser:
    # one line and exit 2 for bad input, options spelt out, as every command of the project
    p = ArgumentParser(
        prog="python -m tailgate.verify.groundtruth",
        description="Ground-truth OpenAI-compatible streaming server with a per-chunk write-time log.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", help="written with the listening port once the server accepts connections")
    p.add_argument("--chunk-log", help="JSON file the chunk and request logs are written to on shutdown")
    add_options(p, ("ttft_ms", "gap_ms"))
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--accept-any-model", action="store_true", help="do not answer 404 for other model names")
    p.add_argument(
        "--prefix-caching",
        action="store_true",
        help="count prefix-cache hits over 16-word blocks, as vLLM with prefix caching on",
    )
    p.add_argument(
        "--engine",
        type=_engine_arg,
        default=None,
        help='serve streams from the simulated engine: "on" for its defaults, or a JSON object of its settings '
        "(slots, step_ms, step_ms_per_seq, prefill_ms_per_token, prefill_ms_per_token_ctx, prefill_ms_per_token_step, "
        "step_ms_per_kv_ktoken, frontend_ms, frontend_ms_per_token, frontend_noise as [[prompt tokens, ms], ...], "
        "noise_seed, chunked, chunk_tokens, kv_capacity_tokens)",
    )
    p.add_argument("--script", help='JSON file {"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}')
    p.add_argument("--workers", type=_workers_arg, default=1,
                   help="server processes sharing the port (SO_REUSEPORT), one event loop each; their logs are "
                        "merged into --chunk-log when the server stops")  # fmt: skip
    add_option(p, "realtime", help="serve at SCHED_FIFO where allowed, so a load that fills every core delays the "
               "client's reads, not the reference's writes")  # fmt: skip
    p.add_argument(
        "--write-delay-us",
        type=_delay_arg,
        default=0.0,
        help="hold the event loop this long after each write (tests of a reference that falls behind)",
    )
    return p


def _workers_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a count of at least 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"a count of at least 1, got {n}")
    return n


def _delay_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"microseconds, 0 or more, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"microseconds, 0 or more, got {text!r}")
    return value


def _engine_arg(text: str) -> EngineModel:
    if text.strip().lower() == "on":
        return EngineModel()
    try:
        return EngineModel.from_dict(json.loads(text))
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"--engine: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers > 1:
        return serve_workers(args, _serve_one)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0
