"""Wires the suite into Locust through its events: options, validation, messages.

Importing this module from a locustfile is all it takes: the options join Locust's parser (so
``locust.conf``, ``LOCUST_*`` variables and the web UI know them), bad values stop the run
with one line and exit code 2, and each process registers the messages that carry schedules
from the shape to the load processes and records back.

The web UI is safe by default (``tailgate/load/webaccess.py``): it binds to loopback unless ``--web-host``
says otherwise, an address other machines can reach needs ``--web-login`` with credentials, and the start
form may only load the servers allowed at launch. Options must be spelt out (no argparse abbreviations).

Locust's test events bound each run: ``test_start`` clears what a load process kept of the last
run, ``test_stopping`` (Stop, ``--run-time``, a natural end) and ``quitting`` (Ctrl-C, SIGTERM) finish
it on disk before Locust reports it stopped, and ``test_stop`` starts its report in the web UI.
"""

from __future__ import annotations

from locust import events
from locust.event import EventHook
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

import argparse
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tailgate.load import distributed, stallwatch
from tailgate.load.autosize import accept_auto
from tailgate.load.descriptors import reserve_descriptors
from tailgate.load.options import add_arguments
from tailgate.load.peers import PeerGate
from tailgate.load.preflight import fail, settings_for
from tailgate.load.webaccess import check_access, forget_credentials, install_login, prepare_parser
from tailgate.load.worker import (
    CANCEL_MESSAGE,
    DONE_MESSAGE,
    ORDER_MESSAGE,
    PROGRESS_MESSAGE,
    READY_MESSAGE,
    order_runner,
)
from tailgate.optiontable import OptionError
from tailgate.plugins import load_plugins

Handler = TypeVar("Handler", bound=Callable[..., None])


def listener(hook: EventHook) -> Callable[[Handler], Handler]:
    """``@listener(events.init)``: ``hook.add_listener`` as a decorator that keeps the handler's type (Locust's
    own is unannotated, which would leave every handler it decorates untyped)."""
    add: Callable[[Callable[..., None]], object] = hook.add_listener

    def register(handler: Handler) -> Handler:
        add(handler)
        return handler

    return register


@listener(events.init_command_line_parser)
def _add_options(parser: Any) -> None:
    try:
        load_plugins()  # the registries' extensions first: their names are option choices
    except OptionError as e:
        fail(str(e))
    add_arguments(parser)
    distributed.add_arguments(parser)
    accept_auto(parser)  # Locust's own --processes, sized from this run's options
    prepare_parser(parser)


def prepare(environment: Any) -> None:
    """Validate the command line and hand the shape its settings (master or single process only)."""
    shape = environment.shape_class
    opts = environment.parsed_options
    if opts is None:
        return
    opts.host = opts.host or environment.host
    try:
        settings = settings_for(environment, opts)
    except OptionError as e:
        fail(str(e))
    shape.configure(settings)


def check_command_line(environment: Any) -> None:
    """Web UI: the command line only fills the form, but a bad value there still stops at launch.

    The server need not be up yet (nor named: the form has a Host field), so this checks values only;
    every Start validates the form again, server included."""
    opts = environment.parsed_options
    if opts is None:
        return
    from tailgate.webui import WEB_RESULTS  # only where there is a web UI: flask stays out of headless runs

    probe = argparse.Namespace(**vars(opts))
    probe.host = probe.host or environment.host or "http://127.0.0.1"
    probe.results_dir = probe.results_dir or WEB_RESULTS  # where the form's runs go, not a folder per launch
    try:
        settings_for(environment, probe, contact_server=False)
    except OptionError as e:
        fail(str(e))


def guard_web_ui(environment: Any) -> None:
    """Before the web UI serves anything: refuse a web UI others could reach without a login (one line, exit 2),
    install the login it asks for, and say in one line when it is reachable from other machines."""
    opts = environment.parsed_options
    if opts is None:
        return
    try:
        access = check_access(opts)
    except OptionError as e:
        fail(str(e))
    if access.login is not None:
        install_login(environment.web_ui, *access.login, base_path=getattr(opts, "web_base_path", "") or "")
    forget_credentials(opts)
    notice = access.notice(getattr(opts, "web_port", 0))
    if notice:
        logging.getLogger("tailgate").info(notice)


def _is_tailgate(environment: Any) -> bool:
    shape = environment.shape_class
    return shape is not None and bool(getattr(shape, "arm", ""))


@listener(events.init)
def _on_init(environment: Any, **_: Any) -> None:
    runner = environment.runner
    if isinstance(runner, (MasterRunner, LocalRunner)):
        if not _is_tailgate(environment):
            fail("this locustfile has no tailgate shape (use locustfiles/continuous.py or locustfiles/gated.py)")
        shape = environment.shape_class
        runner.register_message(READY_MESSAGE, shape.on_ready)
        if isinstance(runner, MasterRunner):  # one process: its orders and their DONE do not go as messages
            runner.register_message(DONE_MESSAGE, shape.on_done)
            runner.register_message(PROGRESS_MESSAGE, shape.on_progress)
            runner.register_message(distributed.SENT_MESSAGE, shape.on_sent)
            runner.register_message(distributed.RECORDS_MESSAGE, shape.on_records)
            runner.register_message(distributed.PONG_MESSAGE, shape.on_pong)
            _keep_key_off_the_wire(environment)
            shape.gate = PeerGate(runner, key=lambda: _key_in_force(environment))
            shape.gate.install()
        opts = environment.parsed_options
        if environment.web_ui is not None:
            from tailgate.webui import WEB_RESULTS, install

            shape.own_folders = True
            guard_web_ui(environment)
            check_command_line(environment)
            install(environment)
            if opts is not None and getattr(opts, "autostart", False):
                opts.results_dir = opts.results_dir or WEB_RESULTS
                prepare(environment)  # --autostart starts without the form
        elif opts is not None and opts.headless:
            prepare(environment)
    if isinstance(runner, (WorkerRunner, LocalRunner)):
        stallwatch.install_from_env()
        reserve_descriptors()  # before any stage: a socket() mid-stage must never grow the table
        opts = environment.parsed_options
        if opts is not None and getattr(opts, "realtime", False):
            _go_realtime()
    if isinstance(runner, WorkerRunner):
        _cache_default_args()
        runner.register_message(ORDER_MESSAGE, _on_order)
        runner.register_message(CANCEL_MESSAGE, _on_cancel)
        runner.register_message(distributed.PING_MESSAGE, distributed.on_ping)
        runner.register_message(distributed.CHALLENGE_MESSAGE, distributed.on_challenge)
        opts = environment.parsed_options
        distributed.set_own_key(getattr(opts, "api_key", None) if opts is not None else None)
        _watch_master(environment)


def _keep_key_off_the_wire(environment: Any) -> None:
    """Locust sends the master's parsed options to every worker that connects, unauthenticated: the key
    moves from the options into this process's environment, where the settings read it and nothing sends it."""
    opts = environment.parsed_options
    key = getattr(opts, "api_key", None) if opts is not None else None
    if key:
        os.environ[distributed.API_KEY_ENV] = key  # the option wins over the environment, as in validate()
        opts.api_key = None


def _key_in_force(environment: Any) -> str | None:
    """The key a peer must prove: the next or running run's, else this master's own (moved to its environment)."""
    settings = environment.shape_class.settings
    if settings is not None:
        key: str | None = settings.api_key
        return key
    return os.environ.get(distributed.API_KEY_ENV)


def _watch_master(environment: Any) -> None:
    """A worker that stops hearing the master stops its load itself (see ``MASTER_SILENCE_S``), instead of
    sending its share to a server nobody records until Locust gives up on the master a minute later."""
    import gevent

    heard = [time.monotonic()]

    def on_heartbeat(**_: Any) -> None:
        heard[0] = time.monotonic()

    environment.events.heartbeat_received.add_listener(on_heartbeat)

    def silence() -> float:
        quiet = time.monotonic() - heard[0]
        return quiet if quiet > distributed.MASTER_SILENCE_S else 0.0

    runner = environment.runner

    def watch() -> None:
        while True:
            gevent.sleep(0.5)
            if not silence():
                continue
            order_runner(environment).master_lost(silence())
            if distributed.master_gone(runner.master_host, runner.master_port):
                # a partition answers nothing; a host whose master process died refuses the connection: that
                # master is gone for good, and Locust alone would keep this process idle for a minute
                log = logging.getLogger("tailgate")
                log.error("tailgate: %s: the master at %s:%s refuses connections (it is gone): quitting",
                          order_runner(environment).worker, runner.master_host, runner.master_port)  # fmt: skip
                runner.quit()
                return

    order_runner(environment).master_silence = silence
    gevent.spawn(watch)


def _cache_default_args() -> None:
    """A worker answers every ``spawn`` message (a worker joining, Locust rebalancing) by filtering the
    master's options against ``default_args_dict()``, which builds Locust's whole option parser and is
    called once per option: about a second of blocked event loop on a busy host, during which no arrival
    of a running stage goes out and no chunk is stamped. The defaults cannot change within a process, so
    they are computed once, here, before any stage."""
    from locust import argument_parser

    if getattr(argument_parser.default_args_dict, "tailgate_cached", False):
        return
    defaults = argument_parser.default_args_dict()

    def cached() -> dict[str, Any]:  # Locust's own option defaults, open-ended and passed through as they are
        return defaults

    cached.tailgate_cached = True  # type: ignore[attr-defined]
    argument_parser.default_args_dict = cached


def _go_realtime() -> None:
    """This load process at ``SCHED_FIFO``, or a warning: the run never fails for want of the privilege."""
    from tailgate.load.processes import set_realtime

    log = logging.getLogger("tailgate")
    if set_realtime():
        log.info("tailgate: load process %d runs at SCHED_FIFO", os.getpid())
    else:
        log.warning("tailgate: --realtime refused (no CAP_SYS_NICE or RLIMIT_RTPRIO); normal priority")


def _on_order(environment: Any, msg: Any, **_: Any) -> None:
    order_runner(environment).submit(msg.data)


def _on_cancel(environment: Any, msg: Any, **_: Any) -> None:
    order_runner(environment).cancel()


@listener(events.test_start)
def _on_test_start(environment: Any, **_: Any) -> None:
    """A new run in a load process: nothing of the previous one (orders, stop flag, files) carries over."""
    if isinstance(environment.runner, (WorkerRunner, LocalRunner)):
        order_runner(environment).reset()


@listener(events.test_stopping)
def _on_test_stopping(environment: Any, **_: Any) -> None:
    """Stop, --run-time or a natural end: the run is finished on disk before Locust reports it stopped."""
    if isinstance(environment.runner, (MasterRunner, LocalRunner)) and _is_tailgate(environment):
        environment.shape_class.stop_run("stop")


@listener(events.test_stop)
def _on_test_stop(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, (MasterRunner, LocalRunner)) and _is_tailgate(environment):
        environment.shape_class.close_run()


@listener(events.quitting)
def _on_quit(environment: Any, **_: Any) -> None:
    """Ctrl-C, SIGTERM or the end of a headless run: stop the run like Stop does, then close the files."""
    runner = environment.runner
    shape = environment.shape_class
    if isinstance(runner, (MasterRunner, LocalRunner)) and _is_tailgate(environment):
        shape.quit()
    if isinstance(runner, (WorkerRunner, LocalRunner)):
        order_runner(environment).cancel()
        order_runner(environment).close()
    if isinstance(runner, (MasterRunner, LocalRunner)) and _is_tailgate(environment):
        # the one rule of tailgate.exitcodes, from how the newest run ended; Locust's own (1 when any request
        # failed) would make a server's errors, which are measurements, read as a failed run
        from locust import log as locust_log

        defect = bool(runner.exceptions) or bool(locust_log.unhandled_greenlet_exception)
        environment.process_exit_code = shape.exit_code(defect=defect)
