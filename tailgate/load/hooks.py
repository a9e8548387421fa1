"""Wires the suite into Locust through its events: options, validation, messages.

Importing this module from a locustfile is all it takes: the options join Locust's parser (so
``locust.conf``, ``LOCUST_*`` variables and the web UI know them), bad values stop the run
with one line and exit code 2, and each process registers the messages that carry schedules
from the shape to the load processes and records back.
"""

from __future__ import annotations

from locust import events
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tailgate.load.options import OptionError, Settings, add_arguments, validate
from tailgate.load.worker import DONE_MESSAGE, ORDER_MESSAGE, PROGRESS_MESSAGE, READY_MESSAGE, order_runner

EXIT_USAGE = 2


def fail(message: str) -> None:
    """One line on stderr and exit code 2: the contract for every bad input."""
    sys.stderr.write(f"tailgate: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    add_arguments(parser)


def resolve_model(settings: Settings) -> str:
    """The model to request: the option, else the server's first served model.

    Doubles as the start-up reachability check, so an unreachable server is one clear line
    before anything runs."""
    url = settings.target.url("/v1/models")
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise OptionError(f"--host: {url} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise OptionError(f"--host: cannot reach {settings.host}: {reason}") from None
    except ValueError:
        raise OptionError(f"--host: {url} did not return JSON; is this an OpenAI-compatible server?") from None
    models = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
    if settings.model:
        return settings.model
    if not models:
        raise OptionError(f"--model: {settings.host} serves no models; name one with --model")
    return str(models[0])


def prepare(environment: Any) -> None:
    """Validate options and hand the shape its settings (master or single process only)."""
    shape = environment.shape_class
    if shape is None or not getattr(shape, "arm", ""):
        fail("this locustfile has no tailgate shape (use locustfiles/continuous.py or locustfiles/gated.py)")
    opts = environment.parsed_options
    if opts is None:
        return
    opts.host = opts.host or environment.host
    try:
        settings = validate(opts, arm=shape.arm, now=time.strftime("%Y%m%d-%H%M%S"))
        settings = settings.__class__(**{**settings.__dict__, "model": resolve_model(settings)})
    except OptionError as e:
        fail(str(e))
    shape.configure(settings)


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, (MasterRunner, LocalRunner)):
        shape = environment.shape_class
        if shape is not None and hasattr(shape, "on_ready"):
            runner.register_message(READY_MESSAGE, shape.on_ready)
            runner.register_message(DONE_MESSAGE, shape.on_done)
            runner.register_message(PROGRESS_MESSAGE, shape.on_progress)
        opts = environment.parsed_options
        headless = bool(opts and (opts.headless or getattr(opts, "autostart", False)))
        if headless or (opts and opts.host):
            prepare(environment)
    if isinstance(runner, (WorkerRunner, LocalRunner)):
        runner.register_message(ORDER_MESSAGE, _on_order)
        opts = environment.parsed_options
        if opts is not None and getattr(opts, "realtime", False):
            _go_realtime()


def _go_realtime() -> None:
    """This load process at ``SCHED_FIFO``, or a warning: the run never fails for want of the privilege."""
    import logging

    from tailgate.servers.local import set_realtime

    log = logging.getLogger("tailgate")
    if set_realtime():
        log.info("tailgate: load process %d runs at SCHED_FIFO", os.getpid())
    else:
        log.warning("tailgate: --realtime refused (no CAP_SYS_NICE or RLIMIT_RTPRIO); normal priority")


def _on_order(environment: Any, msg: Any, **_: Any) -> None:
    order_runner(environment).submit(msg.data)


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    """Web UI starts may change the host or options after init: validate again then."""
    runner = environment.runner
    if isinstance(runner, (MasterRunner, LocalRunner)):
        shape = environment.shape_class
        if shape is not None and getattr(shape, "settings", None) is None:
            try:
                prepare(environment)
            except SystemExit:
                runner.quit()


@events.quitting.add_listener
def _on_quit(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, (WorkerRunner, LocalRunner)):
        order_runner(environment).close()
    shape = environment.shape_class
    if shape is not None and getattr(shape, "failed", None):
        environment.process_exit_code = 1
