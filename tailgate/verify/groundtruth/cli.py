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

from tailgate.optiondecl import add_options

from .engine import EngineModel
from .server import GroundTruthServer
from .settings import Settings
from .wire import DEFAULT_MODEL

# ------------------------------------------------------------------------------------------------ CLI


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    settings = Settings(
        ttft_ms=args.ttft_ms,
        gap_ms=args.gap_ms,
        model=args.model,
        accept_any_model=args.accept_any_model,
        prefix_caching=args.prefix_caching,
        engine=args.engine,
    )
    server = GroundTruthServer(settings, args.host, args.port, args.chunk_log)
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
    if args.port_file:
        _write_atomic(Path(args.port_file), f"{server.port}\n")
    print(f"groundtruth listening on {args.host}:{server.port} pid {os.getpid()}", file=sys.stderr, flush=True)
    await stop.wait()
    await server.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        "(slots, step_ms, step_ms_per_seq, prefill_ms_per_token, chunked, chunk_tokens, kv_capacity_tokens)",
    )
    p.add_argument("--script", help='JSON file {"schedules": {"<seq>": [ttft_ms, gap_ms, ...]}}')
    return p


def _engine_arg(text: str) -> EngineModel:
    if text.strip().lower() == "on":
        return EngineModel()
    try:
        return EngineModel.from_dict(json.loads(text))
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"--engine: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))
    return 0
