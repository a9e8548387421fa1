"""The ground-truth server as several worker processes on one port, and their write logs merged into one.

One event loop writes every chunk of every stream. On the 16-core host it filled its core at about
100,000 chunks/s (1,000 req/s of 100-chunk streams) and its writes fell seconds behind their targets, so
the streams a client measured were a queue, not the load asked for. With ``--workers N`` the server forks
N processes that each listen on the same port (``SO_REUSEPORT``: the kernel spreads connections over them
by their addresses) and each runs the whole server on its own event loop and core.

What stays one server:

- **Response ids.** Worker *i* of *N* numbers its completions ``i, i + N, i + 2N, ...``, so ``cmpl-<seq>``
  names one request across all of them and the self-check's join (:mod:`tailgate.verify.join`) stays exact.
- **The write log.** Each worker keeps its own log and, when the server stops, writes it as flat columns
  beside ``--chunk-log`` (``<chunk log>.worker<i>``); the parent merges them into the one document the
  join reads (``chunks`` in each worker's write order, one worker after another; ``chunk_targets`` and
  ``chunk_write_begin`` parallel to it) and removes the parts. The merged log also says how many workers
  ran and which of them ended before the server was stopped (``workers_lost``: their streams are missing).
- **Its settings** come from the command line: ``POST /_control`` and ``GET /_chunklog`` would reach one
  worker, so with several workers they are refused (409) instead of half applied.

The parent serves nothing: it reserves the port (bound, not listening, so it is never given a
connection), starts the workers, writes ``--port-file`` once every worker listens, and on SIGTERM or
SIGINT stops them and merges.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tailgate.jsontypes import JsonObject

from .settings import ChunkLogColumns, ChunkLogDump, read_columns
from .wire import json_bytes

START_TIMEOUT_S = 30.0
"""How long the workers have to listen before the server gives up starting."""
STOP_TIMEOUT_S = 300.0
"""How long a worker has to write its part of the log after SIGTERM (millions of chunks take seconds)."""

ServeOne = Callable[[argparse.Namespace, tuple[int, int], int | None], None]
"""Runs one server until SIGTERM: its arguments, ``(worker, workers)``, and a pipe to write a byte to once it
listens (None: the single server, which writes ``--port-file`` itself)."""


def part_path(chunk_log: Path, worker: int) -> Path:
    """Where worker ``worker`` leaves its log for the parent to merge."""
    return chunk_log.with_name(f"{chunk_log.name}.worker{worker}")


def merge_parts(parts: Sequence[ChunkLogColumns], workers: int, lost: Sequence[JsonObject]) -> ChunkLogDump:
    """One chunk-log document (:meth:`~.settings.ChunkLog.dump`'s shape) from the workers' columns."""
    chunks: list[list[int]] = []
    targets: list[int] = []
    begins: list[int] = []
    requests: list[list[int | None]] = []
    backpressured = 0
    for part in parts:
        chunks += [list(row) for row in zip(part["seq"], part["idx"], part["t_ns"], strict=True)]
        targets += part["target_ns"]
        begins += part["begin_ns"]
        requests += [[s, recv, first if first >= 0 else None] for s, recv, first in part["requests"]]
        backpressured += int(part["backpressured"])
    return {
        "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
        "pid": os.getpid(),
        "workers": workers,
        "worker_pids": [part["pid"] for part in parts],
        "worker_chunks": [len(part["seq"]) for part in parts],
        "workers_lost": list(lost),
        "chunks": chunks,
        "chunk_targets": targets,
        "chunk_write_begin": begins,
        "requests": requests,
        "backpressured_writes": backpressured,
    }


def write_json(path: Path, doc: ChunkLogColumns | ChunkLogDump) -> None:
    """Atomically: a reader sees the whole file or none of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(json_bytes(doc))
    os.replace(tmp, path)


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to the port with ``SO_REUSEPORT``, not listening: it holds the port (0 picks one) until
    the workers listen on it, and is never handed a connection."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


def _end(pids: dict[int, int], timeout_s: float, lost: list[JsonObject], stopping: bool) -> None:
    """SIGTERM every worker still running, wait for each (SIGKILL after ``timeout_s``), note any that failed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid, worker in list(pids.items()):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
                break
            time.sleep(0.02)
        code = os.waitstatus_to_exitcode(status)
        del pids[pid]
        if code != 0 or not stopping:
            lost.append({"worker": worker, "pid": pid, "exit": code})


def serve_workers(args: argparse.Namespace, serve_one: ServeOne) -> int:
    """Run ``args.workers`` servers on one port until SIGTERM or SIGINT; merge their logs. Exit status."""
    workers = int(args.workers)
    reserve = _reserve(args.host, args.port)
    port = int(reserve.getsockname()[1])
    ready_r, ready_w = os.pipe()
    pids: dict[int, int] = {}
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker: the whole server, on the reserved port, until SIGTERM
            os.close(ready_r)
            reserve.close()
            code = 0
            try:
                serve_one(argparse.Namespace(**{**vars(args), "port": port}), (worker, workers), ready_w)
            except BaseException as e:  # a worker never returns into the parent's code
                print(f"groundtruth worker {worker}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                code = 1
            finally:
                os._exit(code)
        pids[pid] = worker
    os.close(ready_w)
    stop = {"now": False}

    def on_signal(_signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    lost: list[JsonObject] = []
    ready = 0
    deadline = time.monotonic() + START_TIMEOUT_S
    while ready < workers and time.monotonic() < deadline and not stop["now"]:
        readable, _, _ = select.select([ready_r], [], [], 0.1)
        if readable:
            got = os.read(ready_r, workers)
            if not got:  # every worker closed its end: some died before listening
                break
            ready += len(got)
    os.close(ready_r)
    reserve.close()
    if ready < workers:
        _end(pids, 5.0, lost, stopping=False)
        print(f"groundtruth: {ready} of {workers} workers started: {lost}", file=sys.stderr, flush=True)
        return 1
    if args.port_file:
        tmp = Path(args.port_file).with_name(Path(args.port_file).name + ".tmp")
        tmp.write_text(f"{port}\n", encoding="utf-8")
        os.replace(tmp, args.port_file)
    print(f"groundtruth listening on {args.host}:{port} pid {os.getpid()}, {workers} workers", file=sys.stderr,
          flush=True)  # fmt: skip
    while not stop["now"]:
        time.sleep(0.1)
        for pid, worker in list(pids.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:  # ended on its own: its streams are cut and its log is lost
                del pids[pid]
                lost.append({"worker": worker, "pid": pid, "exit": os.waitstatus_to_exitcode(status)})
                print(f"groundtruth: worker {worker} ended before the server was stopped", file=sys.stderr)
    _end(pids, STOP_TIMEOUT_S, lost, stopping=True)
    if args.chunk_log:
        log = Path(args.chunk_log)
        parts = []
        for worker in range(workers):
            path = part_path(log, worker)
            if path.exists():
                parts.append(read_columns(path.read_bytes(), where=str(path)))
                path.unlink()
        write_json(log, merge_parts(parts, workers, lost))
    return 0


__all__ = ["STOP_TIMEOUT_S", "merge_parts", "part_path", "serve_workers", "write_json"]
