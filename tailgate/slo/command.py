"""``tailgate slo`` on the command line: its options, their validation into an :class:`SloPlan`, the
controller for ``--server``, and the run that prints the answer and builds the report.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from tailgate.arms import CONTINUOUS
from tailgate.exitcodes import combine
from tailgate.jsontypes import JsonShapeError
from tailgate.lifecycle import ArgumentParser, SignalGuard, Stopped
from tailgate.optiondecl import add_option, add_options, to_flags
from tailgate.optiontable import DEFAULTS, OptionError, check_counts, check_rate, parse_processes
from tailgate.resultfiles import writable_folder_problem
from tailgate.runmeta import SloMeta
from tailgate.runner import signal_guard
from tailgate.serverconfigs import EMBEDDED_BASE_FLAGS
from tailgate.servers.spec import (
    SERVER_KINDS,
    add_server_arguments,
    check_setup,
    embedded_server_problem,
    make_controller,
    server_kind_of,
    server_spec,
)
from tailgate.slo.answer import print_table
from tailgate.slo.plan import SloPlan
from tailgate.slo.probe import SloRunError, SloRunner
from tailgate.slo.search import Resolution
from tailgate.slo.spec import (
    EXIT_FAILED,
    EXIT_NOT_MET,
    EXIT_OK,
    EXIT_UNDECIDED,
    EXIT_USAGE,
    KNOBS,
    PROBE_MARK,
    SLO_FILE,
    Limit,
    Log,
    SloError,
    build_sweep,
    parse_slo,
    slo_text,
)
from tailgate.slo.state import ConfigSearch, SloState
from tailgate.stagewarmup import EMBEDDED_STAGE_WARMUP, GPU_STAGE_WARMUP, add_stage_warmup_argument
from tailgate.tailbounds import min_n_for_sequence


class ScaleDefaults(TypedDict):
    """What a search takes for the options left out: sized for the CPU server (``--embedded``) or a GPU's."""

    start_rate: float
    max_rate: float
    n: int
    warmup: int
    max_waiting: int
    duration: float
    stage_warmup: int


#: Eager mode on the CPU server: it starts in ~40 s instead of minutes of torch.compile on 2 cores. The highest
#: rate leaves room above the 2-core CPU vLLM's capacity, which was 5-6.5 req/s on one machine and 8-9 on another
#: (a probe past it is cheap: its queue runs away and it stops early).
EMBEDDED: ScaleDefaults = {
    "start_rate": 1.0,
    "max_rate": 16.0,
    "n": 20,
    "warmup": 3,
    "max_waiting": -1,
    "duration": 30.0,
    "stage_warmup": EMBEDDED_STAGE_WARMUP,
}
GPU: ScaleDefaults = {
    "start_rate": 5.0,
    "max_rate": 64.0,
    "n": 500,
    "warmup": DEFAULTS["warmup"],
    "max_waiting": -1,
    "duration": 120.0,
    "stage_warmup": GPU_STAGE_WARMUP,
}
#: Plan keys a resumed search must share with the folder's: a probe measured under others is another answer.
RESUME_KEYS = (
    "slo",
    "n",
    "warmup",
    "seed",
    "duration",
    "ignore_eos",
    "processes",
    "locust_args",
    "base_flags",
    "confidence",
    "reruns",
    "extend",
)


def add_slo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--slo", default="", help="limits from the intended send, e.g. 'ttft_p99<=300ms,gap_p99<=200ms,errors<=0.5%%'"
    )
    add_option(p, "embedded")
    add_server_arguments(p)
    p.add_argument(
        "--config",
        action="append",
        default=[],
        help="a configuration: 'NAME' or 'NAME: knob=value ...' (repeat); knobs: " + ", ".join(KNOBS),
    )
    p.add_argument("--knob", action="append", default=[], help="knob=v1,v2: a grid over every combination (repeat)")
    p.add_argument("--sweep", default="", help="JSON or TOML file with 'configs' and/or 'grid'")
    add_option(p, "results", help="folder (default results/slo-<time>); re-use to resume")
    p.add_argument("--start-rate", type=float, default=None, help="first rate of the doubling, req/s (default 5)")
    add_option(p, "max_rate", default=None, help="highest rate probed, req/s (default 64)")
    p.add_argument("--min-rate", type=float, default=None, help="lowest rate halving may reach (default start/8)")
    p.add_argument(
        "--resolution", default="25%", help="bisect until the bracket is this narrow: req/s or a %% of the rate"
    )
    p.add_argument("--max-probes", type=int, default=8, help="rates probed per configuration at most")
    p.add_argument(
        "--time-budget",
        type=float,
        default=0.0,
        help="seconds of probing per configuration; no probe starts that would overrun it (0: none)",
    )
    p.add_argument("--reruns", type=int, default=0,
                   help="re-runs of the same workload for a probe without a verdict (clustered with the first run: "
                        "they add evidence only as far as the server behaved differently)")  # fmt: skip
    p.add_argument("--extend", type=int, default=0,
                   help="then further attempts on new samples of the workload (seed + 1000 each) at once while the "
                        "probe stays undecided (default 0: the search itself comes back to an undecided rate when "
                        "only its data can narrow the bracket; verdicts are anytime-valid either way)")  # fmt: skip
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="one-sided confidence of every bound (Clopper-Pearson on the share over a limit)",
    )
    add_option(
        p,
        "n",
        default=None,
        help="measured requests per probe at least (default 500: a first-look p99 pass needs 449 independent "
        "ones; with --duration, the minimum)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of arrivals per probe, so every rate reaches and holds steady state "
        "(default 120; embedded 30; 0: --n alone)",
    )
    add_option(p, "warmup", default=None, help=f"warm-up requests per probe (default {DEFAULTS['warmup']})")
    add_stage_warmup_argument(p, "--max-rate")
    add_option(p, "seed", help="trace seed; a re-run repeats the same workload")
    add_options(p, ("trace_file", "ignore_eos"))
    add_option(p, "processes", type=str, default="1",
               help="load-generator processes per probe, or auto: for each probe from its chunk rate and this "
                    "host's calibration (measured once, cached)")  # fmt: skip
    p.add_argument(
        "--max-waiting",
        type=int,
        default=None,
        help="stop a probe when vllm:num_requests_waiting reaches this (default: a quarter of the "
        "probe's requests; 0 = never)",
    )
    p.add_argument(
        "--model-replicates",
        type=int,
        default=8,
        help="simulations of the step loop fitted to the server's own streams, for the model's capacity interval "
        "(a labelled estimate that narrows the bracket only when its replay of every probe holds; 0: no model)",
    )
    p.add_argument(
        "--model-requests",
        type=int,
        default=10000,
        help="simulated requests per model replicate in the check after each probe; the final answer simulates "
        "4 times as many",
    )
    p.add_argument(
        "--no-model-stop",
        dest="model_stop",
        action="store_false",
        help="spend the whole budget even when the fitted model, checked against five probes or more, already "
        "brackets the capacity to the resolution (by default the search then ends)",
    )
    p.add_argument(
        "--no-confirm",
        dest="confirm",
        action="store_false",
        help="take the fitted model's interval without confirmation probes (by default a share of the time "
        "budget tests it just outside its interval, on probes it was not fitted to, and a contradicted model "
        "is refitted once, then refused)",
    )
    add_options(p, ("prometheus_url", "locust_arg", "chunk_stamp", "no_report"))


def build_plan(args: argparse.Namespace) -> SloPlan:
    """Validate every option before anything starts; :class:`SloError` names the option."""
    limits = parse_slo(args.slo)
    if not any(lim.metric == "errors" for lim in limits):
        # errors are never an acceptable way to meet a latency limit: without an error term, the first
        # failed request fails the probe (and stops it early)
        limits = (*limits, Limit("errors", "errors", None, 0.0))
    configs = build_sweep(args)
    scaled = EMBEDDED if args.embedded else GPU
    start = args.start_rate if args.start_rate is not None else scaled["start_rate"]
    max_rate = args.max_rate if args.max_rate is not None else scaled["max_rate"]
    n = args.n if args.n is not None else scaled["n"]
    warmup = args.warmup if args.warmup is not None else scaled["warmup"]
    max_waiting = args.max_waiting if args.max_waiting is not None else scaled["max_waiting"]
    duration = args.duration if args.duration is not None else scaled["duration"]
    if not (math.isfinite(duration) and duration >= 0):
        raise SloError(f"--duration: must be 0 or more seconds, got {duration:g}")
    try:
        for option, value in (("--start-rate", start), ("--max-rate", max_rate)):
            check_rate(value, option)
    except OptionError as e:
        raise SloError(str(e)) from None
    if max_rate < start:
        raise SloError(f"--max-rate: {max_rate:g} is below --start-rate {start:g}")
    min_rate = args.min_rate if args.min_rate is not None else start / 8
    if not (math.isfinite(min_rate) and 0 < min_rate <= start):
        raise SloError(f"--min-rate: must be above 0 and at most --start-rate, got {min_rate:g}")
    try:
        check_counts(n, warmup, ordered=not args.trace_file)
    except OptionError as e:
        raise SloError(str(e)) from None
    if args.max_probes < 1:
        raise SloError(f"--max-probes: must be at least 1, got {args.max_probes}")
    if args.reruns < 0:
        raise SloError(f"--reruns: must be 0 or more, got {args.reruns}")
    if args.extend < 0:
        raise SloError(f"--extend: must be 0 or more, got {args.extend}")
    if not 0.5 <= args.confidence < 1:
        raise SloError(f"--confidence: must be in [0.5, 1), got {args.confidence:g}")
    if args.stage_warmup is not None and args.stage_warmup < 0:
        raise SloError(f"--stage-warmup: must be 0 (none) or more requests, got {args.stage_warmup}")
    try:
        processes = parse_processes(args.processes)
    except OptionError as e:
        raise SloError(str(e)) from None
    if not (math.isfinite(args.time_budget) and args.time_budget >= 0):
        raise SloError(f"--time-budget: must be 0 (none) or more seconds, got {args.time_budget:g}")
    if args.model_replicates < 0 or (args.model_replicates and not 1 <= args.model_replicates <= 64):
        raise SloError(f"--model-replicates: 0 (no model) or 2 to 64, got {args.model_replicates}")
    if args.model_replicates == 1:
        raise SloError("--model-replicates: an interval needs at least 2 replicates (0: no model)")
    if args.model_requests < 1000:
        raise SloError(f"--model-requests: at least 1000, got {args.model_requests}")
    if args.max_waiting is not None and args.max_waiting < 0:
        raise SloError(f"--max-waiting: must be 0 (never) or more, got {max_waiting}")
    locust_args = list(args.locust_arg) + to_flags({"chunk_stamp": args.chunk_stamp})
    if args.trace_file:
        if not Path(args.trace_file).is_file():
            raise SloError(f"--trace-file: {args.trace_file} is not a file")
        locust_args += to_flags({"trace_file": str(Path(args.trace_file).resolve())})
        try:  # the file sets the count: every item after the warm-up is measured
            lines = [x for x in Path(args.trace_file).read_text().splitlines() if x.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise SloError(f"--trace-file: cannot read {args.trace_file} ({e})") from None
        if len(lines) <= warmup:
            raise SloError(f"--trace-file: {len(lines)} items leave nothing after --warmup {warmup}")
        n = len(lines) - warmup
    from tailgate.load.options import check_workload

    try:
        check_workload(locust_args, [(None, CONTINUOUS.name)])
    except OptionError as e:
        raise SloError(str(e)) from None
    return SloPlan(
        limits=limits, configs=configs, start_rate=start, max_rate=max_rate, min_rate=min_rate,
        resolution=Resolution.parse(args.resolution), max_probes=args.max_probes, reruns=args.reruns,
        extend=args.extend,
        confidence=args.confidence, n=n, warmup=warmup, seed=args.seed,
        ignore_eos=args.ignore_eos or args.embedded, processes=processes, max_waiting=max_waiting,
        time_budget=args.time_budget, duration=0.0 if args.trace_file else duration,
        stage_warmup=args.stage_warmup if args.stage_warmup is not None else scaled["stage_warmup"],
        locust_args=locust_args, base_flags=list(EMBEDDED_BASE_FLAGS) if args.embedded else [],
        model_replicates=args.model_replicates, model_requests=args.model_requests, model_stop=args.model_stop,
        confirm=args.confirm,
    )  # fmt: skip


def _check_url(option: str, url: str) -> None:
    from tailgate.load.client import Target, TargetError

    try:
        Target.parse(url)
    except TargetError as e:
        raise SloError(f"{option}: {e}") from None


def resume_refusal(root: Path, plan: SloPlan) -> str | None:
    """Why a folder's earlier probes cannot be resumed under this plan (None: they can, or there are none).

    Probes are reused by folder name; a changed SLO, n, seed, duration or flag would mix answers to
    different questions under one slo.json."""
    path = root / SLO_FILE
    found = SloMeta.read_or_none(path)  # absent, or not a file this reads: the search starts it afresh
    try:
        old = SloState.from_meta(found, where=str(path)) if found is not None else SloState()
    except JsonShapeError as e:
        return f"{e}; repair it or use a new --results folder"
    # The plan is saved before the first probe starts, and a probe reaches the file only when its attempts
    # end: an attempt folder on disk is measured data whatever the file's probe list says.
    measured = any(c.probes for c in old.configs) or any(root.glob(f"*_slo_r*_a*/{PROBE_MARK}"))
    if not measured:
        return None
    before, now = old.plan or {}, plan.describe()
    changed = [k for k in RESUME_KEYS if k in before and before.get(k) != now.get(k)]
    flags = {c.name: list(c.flags) for c in plan.configs}
    for c in old.configs:
        if c.probes and c.name in flags and c.flags != flags[c.name]:
            changed.append(f"flags of '{c.name}'")
    if changed:
        return (f"{root} holds probes of another plan ({', '.join(changed)} changed); use a new --results folder "
                "or the same options")  # fmt: skip
    return None


def main(argv: Sequence[str] | None = None) -> int:
    prog = "tailgate slo"
    parser = ArgumentParser(prog=prog, description="highest Poisson rate meeting an SLO, per server configuration")
    add_slo_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = build_plan(args)
        problem = embedded_server_problem(args)
        if problem:
            raise SloError(problem)
        if not args.embedded and args.server is None:
            raise SloError(f"--server: say who runs the server ({', '.join(SERVER_KINDS)}) or use --embedded")
        kind = server_kind_of(args)
        assert kind is not None  # --server is one of SERVER_KINDS' choices, or --embedded
        named = SERVER_KINDS[args.server] if args.server else kind
        if not named.restarts and len(plan.configs) > 1:
            raise SloError(f"--config: --server {named.name} cannot restart the server; name the one configuration "
                           "it runs")  # fmt: skip
        problems = server_spec(args, Path("."), tag="[slo]").problems()
        if problems:
            raise SloError(problems[0])
        if kind.has_url:
            _check_url("--host", args.host)
        if args.prometheus_url:
            _check_url("--prometheus-url", args.prometheus_url)
        root = Path(args.results or f"results/slo-{time.strftime('%Y%m%d-%H%M%S')}")
        fresh = not root.exists()
        problem = writable_folder_problem(root)
        if problem:
            raise SloError(problem)
    except SloError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    log = _printer()
    try:
        return run(args, plan, root, log)
    finally:
        if fresh and root.is_dir() and not any(root.iterdir()):
            root.rmdir()  # a search refused before it wrote anything leaves no empty folder behind


def answer_code(configs: Sequence[ConfigSearch]) -> int:
    """The search's answer as an exit code: 0 when some configuration met the SLO, 3 only when every one was
    shown to fail at the lowest rate the search could reach, 5 when the probes could not decide either way."""
    if any(c.result is not None and c.result.met for c in configs):
        return EXIT_OK
    if configs and all(shown_to_fail(c) for c in configs):
        return EXIT_NOT_MET
    return EXIT_UNDECIDED


def shown_to_fail(config: ConfigSearch) -> bool:
    """Nothing passed and the lowest rate the search reached failed (a decided verdict, not a lack of data)."""
    result = config.result
    if result is None or result.met or not result.verdicts:
        return False
    lowest = result.verdicts[min(result.verdicts)]
    return lowest == "fail" and result.status in ("below_min", "probe_limit", "time_budget")


def _printer() -> Log:
    def log(line: str) -> None:
        print(line, flush=True)

    return log


def run(args: argparse.Namespace, plan: SloPlan, root: Path, log: Log) -> int:
    """The search inside one cleanup path: SIGINT, SIGTERM and SIGHUP raise, so the same ``finally``
    stops the Locust child with its processes and the server this command started."""
    with signal_guard("[slo]") as guard:
        return _run(args, plan, root, log, guard)


def _run(args: argparse.Namespace, plan: SloPlan, root: Path, log: Log, guard: SignalGuard) -> int:
    from tailgate import servers

    started = time.monotonic()
    controller: Any = None
    runner: SloRunner | None = None
    spec = server_spec(args, root, tag="[slo]")
    try:
        refusal = resume_refusal(root, plan)
        if refusal:
            sys.stderr.write(f"tailgate slo: error: --results: {refusal}\n")
            return EXIT_USAGE
        if spec.server_kind.has_url:
            from tailgate.servers.net import unreachable as server_unreachable

            unreachable = server_unreachable(args.host)
            if unreachable and spec.server_kind.up_already:
                sys.stderr.write(f"tailgate slo: error: --host: {unreachable}\n")
                return EXIT_USAGE
        controller = make_controller(spec, log)
        try:  # the engine, the images and the server's port, before the search starts anything
            check_setup(controller, [c.name for c in plan.configs])
        except servers.ComposeSetupError as e:
            sys.stderr.write(f"tailgate slo: error: {e}\n")
            return EXIT_USAGE
        from tailgate.suite import host_facts

        runner = SloRunner(
            plan, controller, root, prometheus_url=args.prometheus_url or None, log=log,
            extra_metadata={"environment": host_facts(), "server_kind": type(controller).__name__,
                            "embedded": args.embedded},
        )  # fmt: skip
        log(f"[slo] SLO {slo_text(plan.limits)}; {len(plan.configs)} configuration(s): "
            f"{', '.join(c.name for c in plan.configs)}; doubling from {plan.start_rate:g} req/s to at most "
            f"{plan.max_rate:g}, bisecting to {plan.resolution}; n={plan.n} (+{plan.warmup} warm-up) "
            "per probe")  # fmt: skip
        pct = [lim for lim in plan.limits if lim.p is not None]
        need = max((min_n_for_sequence((lim.p or 0) / 100.0, plan.look_confidence) for lim in pct), default=0)
        if plan.probe_n(plan.start_rate) < need:
            log(f"[slo] note: {plan.probe_n(plan.start_rate)} measured requests per probe at {plan.start_rate:g} "
                f"req/s is below the {need} an anytime-valid {plan.look_confidence:.0%} bound on "
                f"{max(pct, key=lambda lim: lim.p or 0).key} needs: such probes can only fail or have not enough "
                "data until extended; raise --n or --duration for a pass at the first look")  # fmt: skip
        runner.run()
        print_table(runner.state, log)
        if not args.no_report:
            from tailgate.postprocess.report import build_report

            log("[slo] building the report")
            paths = build_report(root, prometheus_url=args.prometheus_url or None)
            log(f"[slo] report: {getattr(paths, 'html', paths)}")
        log(f"[slo] finished in {time.monotonic() - started:.0f} s")
        configs = runner.state.configs
        met = any(c.result is not None and c.result.met for c in configs)
        erred = [c for c in configs if not (c.result is not None and c.result.met) and c.probes
                 and all(p.verdict == "fail" and p.binding == "errors" for p in c.probes)]  # fmt: skip
        if not met and erred:
            c = erred[0]
            first = c.probes[0].attempts[0] if c.probes[0].attempts else None
            cut = first.cancelled if first is not None else 0
            ended = first.sent - cut if first is not None else "?"
            also = f", {cut} more cut off by its early stop" if cut else ""
            log(f"[slo] errors bind, not latency: '{c.name}' failed every probe on errors "
                f"({first.errors if first is not None else '?'} of {ended} requests that ended at the first probe"
                f"{also}); "
                "check the server and the request (model name, max tokens, authentication)")  # fmt: skip
            return EXIT_FAILED
        # a probe whose load process was lost measured only part of its plan: the rule's 4 outranks the answer
        return combine([answer_code(configs), *runner.exit_codes])
    except (KeyboardInterrupt, Stopped) as e:
        stop = e if isinstance(e, Stopped) else Stopped(signal.SIGINT)
        guard.disarm()
        log(f"[slo] {stop.name}: stopping everything this search started")
        if runner is not None:
            runner.interrupt()
            runner.close_running("interrupted", f"{stop.name}: finished probes are kept; the same command resumes")
        log("[slo] interrupted: finished probes are kept; run the same command again to resume")
        return stop.exit_code
    except (SloRunError, servers.ServerError, OSError) as e:
        guard.disarm()
        log(f"[slo] failed: {e}")
        if runner is not None:
            runner.close_running("failed", str(e).splitlines()[0])
        return EXIT_FAILED
    finally:
        guard.disarm()
        if runner is not None:
            runner.interrupt()
        if controller is not None and spec.server_kind.stopped_at_end:
            controller.stop()
