"""``tailgate serve``: the CPU vLLM with the tiny dummy-weight model on this machine, until Ctrl-C.

Running Locust by hand needs a server at a URL. Without a GPU or Docker, the suite's own CPU server (the one
``tailgate suite --embedded`` starts for its cells) is the quickest: this command installs it once, starts it
on a loopback port, prints its URL and keeps it up until Ctrl-C, SIGTERM or SIGHUP, then stops it with its
engine processes. Its weights are random, so a request must ask for ``ignore_eos`` (Locust's
``--ignore-eos``) to get the ``max_tokens`` it planned rather than an early end.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import time
from typing import Any

from tailgate.lifecycle import EXIT_ERRORS, Stopped, signals_raise, usage_error
from tailgate.optiondecl import add_option
from tailgate.servers.base import HOST

DEFAULT_PORT = 8000
"""The port the README's examples and vLLM's own default use."""


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"loopback port to serve on (default {DEFAULT_PORT}; 0 picks a free one)")  # fmt: skip
    p.add_argument("--flags", default="",
                   help="extra vLLM flags, e.g. --flags=--no-enable-chunked-prefill (the model, host and port "
                        "are the command's own)")  # fmt: skip
    add_option(p, "placement", help="'isolated' keeps the server off the first core, for a load generator to time "
               "on; 'shared' lets it use every core")  # fmt: skip


def port_problem(port: int) -> str | None:
    """Why the server could not listen on ``port``, checked before a start of about a minute."""
    if not 0 <= port <= 65535:
        return f"--port: {port} is not a port number"
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            return f"--port: {HOST}:{port} is taken ({e.strerror or e}); choose another, or --port 0 for a free one"
    return None


def run_serve(args: argparse.Namespace, prog: str) -> int:
    """Start, print the URL, wait for a signal (or the server's own end), stop. Exit 128 + the signal, 1 when
    the server failed or ended by itself, 2 for bad input."""
    from tailgate import servers
    from tailgate.servers.local import AUTO_CPUS

    problem = port_problem(args.port)
    if problem:
        return usage_error(prog, problem)
    flags = shlex.split(args.flags)
    try:
        servers.vllm_server_argv("python", "model", 1, flags)
    except ValueError as e:
        return usage_error(prog, f"--flags: {e}")
    log = _printer()
    server: Any = None

    def still_stopping(_signum: int) -> None:
        os.write(1, b"[serve] still stopping the server\n")  # not print: the main code may be printing

    with signals_raise(on_repeat=still_stopping) as guard:
        try:
            log("[serve] preparing the CPU vLLM and the tiny model (installed once into ~/.cache/tailgate)")
            python = servers.ensure_vllm_venv(log=log)
            model = servers.ensure_tiny_model(python=python)
            cpus = AUTO_CPUS if args.placement == "isolated" else None  # shared: no cores set apart
            server = servers.LocalVllmServer(python, model, port=args.port or None, extra_args=flags, cpus=cpus)
            log(f"[serve] starting vLLM on {server.base_url} (about a minute on 2 cores); log: {server.log_path}")
            server.start()
            took = server.wait_healthy()
            version = (servers.http_json(server.base_url + "/version") or {}).get("version", "?")
            log(f"[serve] vLLM {version} serves {server.served_model_name} (dummy weights) on {server.base_url}, "
                f"up after {took:.0f} s")  # fmt: skip
            log(f"[serve] e.g. locust -f locustfiles/continuous.py --headless --host {server.base_url} --ignore-eos "
                "--rates 1 --n 20 --warmup 2")  # fmt: skip
            log("[serve] Ctrl-C stops it")
            while server.running:
                time.sleep(0.5)
            log(f"[serve] the server ended by itself; log {server.log_path}:\n{server.log_tail()}")
            return EXIT_ERRORS
        except (KeyboardInterrupt, Stopped) as e:
            stop = e if isinstance(e, Stopped) else Stopped(signal.SIGINT)
            guard.disarm()
            log(f"[serve] {stop.name}: stopping the server")
            return stop.exit_code
        except servers.ServerError as e:
            guard.disarm()
            log(f"[serve] failed: {e}")
            return EXIT_ERRORS
        finally:
            guard.disarm()
            if server is not None:
                server.stop()


def _printer() -> Any:
    def log(line: str) -> None:
        print(line, flush=True)

    return log
