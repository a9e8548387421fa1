"""``tailgate suite``: its options, the plan they make, the checks on a results folder, and the run from the server's
start to the report. :mod:`tailgate.cli` only dispatches to it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from tailgate.arms import CONTINUOUS, GATED
from tailgate.exitcodes import combine
from tailgate.lifecycle import EXIT_ERRORS, EXIT_OK, Stopped, usage_error
from tailgate.load.arrivals import DEFAULT_ARRIVALS, arrival_processes, rate_driven, rate_driven_params
from tailgate.load.client import Target, TargetError
from tailgate.load.options import add_prefix_arguments, check_workload
from tailgate.load.payloads import DEFAULT_ENDPOINT
from tailgate.load.promptsources import PREFIX_DEFAULTS
from tailgate.optiondecl import API_KEY_ENV, add_option, add_options, to_flags
from tailgate.optiontable import (
    DEFAULTS,
    OptionDefaults,
    OptionError,
    check_counts,
    check_rate,
    parse_processes,
    parse_rates,
    rates_text,
)
from tailgate.resultfiles import SUITE_META, WRITE_PROBE, writable_folder_problem
from tailgate.serverconfigs import CONFIGS, declared_flags, names_text, option_text, server_flags
from tailgate.servers.spec import (
    SERVER_KINDS,
    ServerSpec,
    add_server_arguments,
    embedded_server_problem,
    make_controller,
    server_kind_of,
    server_spec,
)
from tailgate.stagewarmup import add_stage_warmup_argument, stage_warmup_of

EMBEDDED: OptionDefaults = {
    **DEFAULTS,
    "rates": (1.0, 2.0, 4.0),
    "nochunk_rates": (2.0, 4.0),
    "preempt_rate": 2.0,
    "n": 40,
    "warmup": 5,
    "batch_size": 16,
}


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "embedded",
               help="run everything here: install the CPU vLLM, build the tiny model, start the server "
                    "(and Prometheus when installed), a scaled-down suite, the report")  # fmt: skip
    add_server_arguments(p)
    add_option(p, "results", help="suite folder (default results/suite-<time>); must be new or empty")
    p.add_argument("--resume", action="store_true",
                   help="continue the suite in --results: finished cells are kept, the others run")  # fmt: skip
    add_option(p, "api_key", help=f"Bearer token for the server (default ${API_KEY_ENV}); handed to Locust only "
               "through its environment, never written anywhere")  # fmt: skip
    add_option(p, "rates", default="", help=f"continuous ramp, req/s (default {rates_text(DEFAULTS['rates'])})")
    p.add_argument("--until-knee", action="store_true", help="keep doubling the rate until the tail knees")
    p.add_argument("--knee-factor", type=float, default=2.0, help="a p99 growing past this factor is the knee")
    add_option(p, "max_rate")
    add_option(p, "batch_size", default=None, help=f"gated arm batch size (default {DEFAULTS['batch_size']})")
    p.add_argument("--no-gated", action="store_true", help="skip the gated arm")
    p.add_argument("--nochunk-rates", default="",
                   help=f"chunked-prefill-off arm rates (default {rates_text(DEFAULTS['nochunk_rates'])}; "
                        "'none' skips)")  # fmt: skip
    p.add_argument(
        "--preempt-rate",
        default="",
        help=f"rate of the small-KV-pool cell (default {DEFAULTS['preempt_rate']:g}; 'none' skips)",
    )
    p.add_argument(
        "--preempt-flags",
        default="",
        help="server flags of the preemption cell (default: a small --num-gpu-blocks-override)",
    )
    p.add_argument("--nochunk-flags", default="", help="server flags of the chunked-off arm")
    add_option(p, "n", default=None, help=f"measured requests per cell (default {DEFAULTS['n']})")
    add_option(p, "warmup", default=None, help=f"warm-up requests per cell (default {DEFAULTS['warmup']})")
    add_stage_warmup_argument(p, "the highest rate of the server's cells (gated only: the batch)")
    add_options(p, ("seed", "ignore_eos"))
    add_option(p, "processes", type=None, default="auto",
               help="load processes per cell, or auto (the default: from the cell's expected chunk rate and this "
                    "host's calibration, each process within what it times exactly, one per core at most)")  # fmt: skip
    add_option(p, "prometheus_url")
    p.add_argument(
        "--nochunk-compose-file",
        default="docker-compose.nochunk.yml",
        help="override file whose vllm command turns chunked prefill off",
    )
    p.add_argument(
        "--preempt-compose-file",
        default="docker-compose.preempt.yml",
        help="override file whose vllm command has the small KV pool of the preemption cell",
    )
    add_options(p, ("locust_arg", "chunk_stamp"))
    add_option(
        p,
        "prompts",
        choices=None,
        help="prompt source(s), comma-separated: seed, unique, dataset, prefix; two or more run every "
        "open-loop cell once per source on the same arrival schedule (a paired A/B in the report)",
    )
    add_option(p, "endpoint", help="completions or chat completions (streamed, usage in both)")
    add_option(
        p,
        "arrivals",
        choices=tuple(rate_driven()),
        help="open-loop arrival process (gamma: --burstiness; a trace: --locust-arg=--arrival-trace=F with --no-gated)",
    )
    for param in rate_driven_params():
        p.add_argument(param.flag, type=float, default=param.default, help=param.help)
    add_option(p, "dataset")
    add_prefix_arguments(p)
    p.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help="server configurations to run; with --server url, the one the server has now",
    )
    add_option(p, "no_report")


def _rates_or_none(text: str, default: tuple[float, ...], option: str) -> tuple[float, ...]:
    return parse_rates(text, option, allow_none=True) if text else default


def build_plan(args: argparse.Namespace) -> Any:
    from tailgate.suite import SuitePlan

    defaults = EMBEDDED if args.embedded else DEFAULTS
    rates = _rates_or_none(args.rates, defaults["rates"], "--rates")
    if not rates:
        raise OptionError("--rates: the ramp needs at least one rate")
    nochunk = _rates_or_none(args.nochunk_rates, defaults["nochunk_rates"], "--nochunk-rates")
    preempt = _rates_or_none(args.preempt_rate, (defaults["preempt_rate"],), "--preempt-rate")
    n = args.n if args.n is not None else defaults["n"]
    warmup = args.warmup if args.warmup is not None else defaults["warmup"]
    batch = args.batch_size if args.batch_size is not None else defaults["batch_size"]
    check_counts(n, warmup)
    try:
        stage_warmup = stage_warmup_of(args.stage_warmup, args.embedded)
    except ValueError as e:
        raise OptionError(str(e)) from None
    check_rate(args.max_rate, "--max-rate")
    if batch < 1:
        raise OptionError(f"--batch-size: must be at least 1, got {batch}")
    processes = parse_processes(args.processes)
    if not args.knee_factor > 1:
        raise OptionError(f"--knee-factor: must be above 1, got {args.knee_factor}")
    kind = server_kind_of(args)
    plan = SuitePlan(
        rates=rates, until_knee=args.until_knee, knee_factor=args.knee_factor, max_rate=args.max_rate,
        batch_size=batch, gated=not args.no_gated, nochunk_rates=nochunk,
        preempt_rate=preempt[0] if preempt else None, n=n, warmup=warmup, seed=args.seed,
        ignore_eos=args.ignore_eos or args.embedded, processes=processes,
        realtime=kind is not None and kind.shares_cores and args.placement == "isolated",
        server_flags=server_flags(args),
        locust_args=list(args.locust_arg) + workload_locust_args(args) + stamp_locust_args(args),
        prompts=parse_prompt_sources(args.prompts), stage_warmup=stage_warmup,
    )  # fmt: skip
    check_workload(plan.locust_args, [(source, CONTINUOUS.name) for source in plan.prompts])
    if plan.gated:
        try:
            check_workload(plan.locust_args, [(plan.prompts[0], GATED.name)])
        except OptionError as e:
            raise OptionError(f"{e} (the gated arm cannot take it: add --no-gated)") from None
    return plan


def parse_prompt_sources(text: str) -> tuple[str, ...]:
    from tailgate.load.promptsources import selectable_sources

    known = selectable_sources()
    sources = tuple(dict.fromkeys(x.strip() for x in str(text).split(",") if x.strip()))
    bad = [x for x in sources if x not in known]
    if bad or not sources:
        raise OptionError(f"--prompts: unknown source {', '.join(bad) or '(none)'}; choose from "
                          f"{', '.join(known)}, comma-separated")  # fmt: skip
    return sources


def stamp_locust_args(args: argparse.Namespace) -> list[str]:
    """``--chunk-stamp`` for every Locust run, when given (recorded by each run in its ``run.json``)."""
    return to_flags({"chunk_stamp": getattr(args, "chunk_stamp", None)})


def workload_locust_args(args: argparse.Namespace) -> list[str]:
    """The suite's workload options as every Locust run takes them (the prompt source goes per cell)."""
    out: list[str] = []
    for param in rate_driven_params():
        value = float(getattr(args, param.dest, param.default))  # parsed as a float already (type=float)
        if not 0 < value < float("inf"):
            raise OptionError(f"{param.flag}: must be a positive number, got {value:g}")
    if getattr(args, "endpoint", DEFAULT_ENDPOINT) != DEFAULT_ENDPOINT:
        out += to_flags({"endpoint": args.endpoint})
    arrivals = getattr(args, "arrivals", DEFAULT_ARRIVALS)
    if arrivals != DEFAULT_ARRIVALS:
        out += to_flags({"arrivals": arrivals})
        for param in arrival_processes()[arrivals].params:
            out += [param.flag, f"{getattr(args, param.dest, param.default):g}"]
    if getattr(args, "dataset", ""):
        out += to_flags({"dataset": str(Path(args.dataset).resolve())})
    for option, default in PREFIX_DEFAULTS.items():
        value = getattr(args, option, default)
        if value != default:
            out += ["--" + option.replace("_", "-"), f"{value:g}"]
    return out


def _locust_args_without_key(args: list[str]) -> tuple[list[str], str | None]:
    """Take ``--api-key`` out of the pass-through Locust options: a key on a command line is visible to
    every user of the machine (``ps``) and would be recorded with the command."""
    kept: list[str] = []
    key: str | None = None
    it = iter(args)
    for arg in it:
        if arg == "--api-key":
            key = next(it, "")
        elif arg.startswith("--api-key="):
            key = arg.split("=", 1)[1]
        else:
            kept.append(arg)
    return kept, key


def check_results_folder(root: Path, resume: bool) -> None:
    """A folder holding a suite is never written into by another one, unless ``--resume`` says so.

    Two suites in one folder would mix their cells under one suite.json; analysis would then
    compare runs that were never meant to be compared.
    """
    meta = root / SUITE_META
    if root.exists() and not root.is_dir():
        raise OptionError(f"--results: {root} exists and is not a folder")
    if meta.exists():
        if resume:
            return
        try:
            status = json.loads(meta.read_text()).get("status") or "unknown"
        except (OSError, ValueError):
            status = "unreadable"
        if status == "completed":
            raise OptionError(f"--results: {root} holds a finished suite; choose a new folder "
                              "(or --resume to rebuild its report and run cells it lacks)")  # fmt: skip
        raise OptionError(f"--results: {root} holds a suite that ended as '{status}'; add --resume to continue it, "
                          "or choose a new folder")  # fmt: skip
    if resume:
        raise OptionError(f"--resume: {root} holds no suite.json; there is nothing to resume")
    if root.is_dir() and any(p.name != WRITE_PROBE for p in root.iterdir()):
        raise OptionError(f"--results: {root} is not empty and holds no suite; choose a new or empty folder")


def _check_same_plan(root: Path, plan: Any) -> None:
    """A resumed suite must measure what the first attempt measured, or its cells do not compare."""
    from dataclasses import asdict

    try:
        before = json.loads((root / SUITE_META).read_text()).get("plan") or {}
    except (OSError, ValueError):
        return
    now = asdict(plan)
    for key in ("n", "warmup", "seed", "ignore_eos", "batch_size", "server_flags", "locust_args"):
        old, new = before.get(key), now.get(key)
        if isinstance(new, tuple):
            new = list(new)
        if key in before and old != json.loads(json.dumps(new)):
            raise OptionError(f"--resume: {key} was {old} in {root}, now {new}; resume with the same options")


def validate_suite_args(args: argparse.Namespace) -> tuple[Any, list[str], Path, str | None]:
    """Every check that needs no server: plan, configurations, controller options, results folder."""
    problem = embedded_server_problem(args)
    if problem:
        raise OptionError(problem)
    if not args.embedded and args.server is None:
        raise OptionError(f"--server: say who runs the server ({', '.join(SERVER_KINDS)}), or use --embedded")
    kind = server_kind_of(args)
    assert kind is not None  # --server is one of SERVER_KINDS' choices, or --embedded
    given = declared_flags(args)
    if kind.flags_in_files and given:
        files = ", ".join(option_text(c.compose_file_option) for c in CONFIGS.values() if c.compose_file_option)
        raise OptionError(f"{option_text(CONFIGS[next(iter(given))].flags_option)}: {kind.name} takes a "
                          f"configuration's flags from its compose file ({files}); put them there")  # fmt: skip
    locust_args, key_in_args = _locust_args_without_key(list(args.locust_arg))
    args.locust_arg = locust_args
    api_key = args.api_key or key_in_args or os.environ.get(API_KEY_ENV) or None
    plan = build_plan(args)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown or not configs:
        raise OptionError(f"--configs: unknown configuration {', '.join(unknown) or '(none)'}; "
                          f"use {names_text()}")  # fmt: skip
    if not kind.restarts and len(configs) > 1:
        raise OptionError(f"--configs: --server {kind.name} cannot restart the server; name the one configuration "
                          "it runs")  # fmt: skip
    plan.configs = tuple(configs)
    plan.declared_flags = declared_flags(args)
    problems = suite_server(args, Path(".")).problems()
    if problems:
        raise OptionError(problems[0])
    if kind.has_url:
        try:
            Target.parse(args.host)
        except TargetError as e:
            raise OptionError(f"--host: {e}") from None
    if args.prometheus_url:
        try:
            Target.parse(args.prometheus_url)
        except TargetError as e:
            raise OptionError(f"--prometheus-url: {e}") from None
    root = Path(args.results or f"results/suite-{time.strftime('%Y%m%d-%H%M%S')}")
    check_results_folder(root, args.resume)
    if args.resume:
        _check_same_plan(root, plan)
    problem = writable_folder_problem(root)
    if problem:
        raise OptionError(problem)
    return plan, configs, root, api_key


def suite_server(args: argparse.Namespace, root: Path) -> ServerSpec:
    """The suite's server: compose gives each of its fixed configurations the override file that sets its flags."""
    overrides = {
        c.name: (getattr(args, c.compose_file_option),) if c.compose_file_option else () for c in CONFIGS.values()
    }
    return server_spec(args, root, tag="[suite]", config_overrides=overrides)


def run_suite(args: argparse.Namespace, prog: str) -> int:
    """Validate, then run the suite inside one cleanup path.

    Whatever ends the run (the last cell, Ctrl-C, SIGTERM, SIGHUP, a failed cell, a defect), the
    same ``finally`` stops Locust with its processes, the server with its engine, and Prometheus,
    and suite.json says how it ended. Exit: 0, 1 (failed), 2 (bad input), 128 + signal.
    """
    try:
        plan, configs, root, api_key = validate_suite_args(args)
    except OptionError as e:
        return usage_error(prog, str(e))
    from tailgate.runner import signal_guard

    kind = server_kind_of(args)
    assert kind is not None  # validated above
    if kind.checks_setup:
        from tailgate.servers import ComposeSetupError
        from tailgate.servers.spec import check_setup

        # the engine, the images and the server's port, before the suite stops or starts anything
        try:
            check_setup(make_controller(suite_server(args, root), log=_printer()), configs)
        except ComposeSetupError as e:
            try:
                root.rmdir()  # refused before anything ran: no empty results folder left behind
            except OSError:
                pass
            return usage_error(prog, str(e))

    if kind.up_already:  # down now is a wrong --host as far as the suite can tell
        from tailgate.servers.net import unreachable

        reason = unreachable(args.host)
        if reason:
            try:
                root.rmdir()
            except OSError:
                pass
            return usage_error(prog, f"--host: {reason}")

    log = _printer()
    with signal_guard("[suite]") as guard:
        return _run_suite(args, plan, root, api_key, log, guard)


def _run_suite(args: argparse.Namespace, plan: Any, root: Path, api_key: str | None, log: Any, guard: Any) -> int:
    from tailgate import servers, suite
    from tailgate.servers.prometheus import LocalPrometheus, PrometheusError, find_prometheus

    started = time.monotonic()
    controller: Any = None
    prometheus: LocalPrometheus | None = None
    runner: suite.Suite | None = None
    prom_url = args.prometheus_url or None
    status, code, detail = "failed", EXIT_ERRORS, None
    spec = suite_server(args, root)
    try:
        controller = make_controller(spec, log)
        if args.embedded and not prom_url:
            if find_prometheus():
                prometheus = LocalPrometheus(controller.base_url, root / "prometheus")
                try:
                    prometheus.start()
                    prom_url = prometheus.url
                    log(f"[suite] Prometheus on {prom_url}, scraping the server every second")
                except PrometheusError as e:
                    log(f"[suite] Prometheus could not start ({e}); using direct /metrics reads")
                    prometheus.stop()
                    prometheus = None
            else:
                log("[suite] no prometheus binary: the report will use direct /metrics reads")
        from tailgate.suite import host_facts

        runner = suite.Suite(
            plan, controller, root, prometheus_url=prom_url, log=log,
            extra_metadata={"environment": host_facts(), "server_kind": type(controller).__name__,
                            "embedded": args.embedded, "host": controller.base_url,
                            "api_key_set": bool(api_key)},
            child_env={API_KEY_ENV: api_key} if api_key else None,
        )  # fmt: skip
        runner.run()
        status, code = "completed", combine(runner.exit_codes)
        if not args.no_report:
            from tailgate.postprocess.report import build_report

            log("[suite] building the report")
            paths = build_report(root, prometheus_url=prom_url)
            log(f"[suite] finished in {time.monotonic() - started:.0f} s")
            log(f"[suite] report: {getattr(paths, 'html', paths)}")
        if code != EXIT_OK:
            log(f"[suite] exit {code}: a cell ran only part of its plan (a load process lost; see its run.json)")
        return code
    except (KeyboardInterrupt, Stopped) as e:
        stop = e if isinstance(e, Stopped) else Stopped(signal.SIGINT)
        guard.disarm()
        status, code, detail = "interrupted", stop.exit_code, stop.name
        log(f"[suite] {stop.name}: stopping everything this suite started")
        return code
    except (suite.SuiteError, servers.ServerError, PrometheusError) as e:
        guard.disarm()
        detail = str(e)
        log(f"[suite] failed: {e}")
        return EXIT_ERRORS
    except Exception as e:  # a defect: still one cleanup path, the traceback kept in a file
        guard.disarm()
        import traceback

        detail = f"{type(e).__name__}: {e}"
        where = root / "suite-error.log"
        try:
            where.write_text(traceback.format_exc())
        except OSError:
            where = None  # type: ignore[assignment]
        log(f"[suite] failed: {detail}" + (f" (traceback in {where})" if where else ""))
        return EXIT_ERRORS
    finally:
        guard.disarm()
        cleanup_started = time.monotonic()
        if runner is not None:
            runner.interrupt(why=detail or status)
        if controller is not None and spec.server_kind.stopped_at_end:
            controller.stop()
        if prometheus is not None:
            prometheus.stop()
        if runner is not None:
            runner.finish(status, code, detail)
        if status == "interrupted":
            log(f"[suite] everything stopped in {time.monotonic() - cleanup_started:.1f} s; finished cells are "
                f"kept in {root}: add --results {root} --resume to the same command to continue")  # fmt: skip


def _printer() -> Any:
    def log(line: str) -> None:
        print(line, flush=True)

    return log
