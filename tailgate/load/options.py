"""The suite's options, declared once for Locust's parser and validated into typed settings.

Declaring them through Locust's ``init_command_line_parser`` gives every option a CLI flag, a
``LOCUST_*`` environment variable, a ``locust.conf`` key and a web-UI field for free. Validation
turns every bad value into an :class:`OptionError` whose message names the option, so the
entry points can print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from tailgate import arms
from tailgate.jsontypes import JsonObject
from tailgate.load.arrivals import (
    DEFAULT_ARRIVALS,
    ArrivalError,
    ArrivalInput,
    ArrivalValue,
    TraceRow,
    all_params,
    arrival_process,
    arrival_processes,
)
from tailgate.load.client import Target, TargetError, Timeouts, chunk_stamp_mode
from tailgate.load.payloads import DEFAULT_ENDPOINT, endpoints
from tailgate.load.plan import Stage, with_prompts
from tailgate.load.prompts import DatasetEntry, Prompt, PromptError
from tailgate.load.promptsources import (
    DEFAULT_PROMPTS,
    PREFIX_DEFAULTS,
    TRACE_BLOCKS,
    PromptOptions,
    prefix_options,
    prompt_source,
    selectable_sources,
)
from tailgate.load.webaccess import add_web_arguments
from tailgate.load.workload import PROMPT_WORD, TraceError, TraceItem, load_jsonl, make_trace
from tailgate.optiondecl import API_KEY_ENV, add_option, add_options
from tailgate.optiontable import (
    DEFAULTS,
    OptionError,
    check_counts,
    parse_rates,
)
from tailgate.resultfiles import RUN_META
from tailgate.runmeta import RunMeta
from tailgate.stats import WARMUP_RULES

ARMS = tuple(arms.ARMS)


class _EnvNamed:
    """Adds options that also read ``LOCUST_<NAME>``, as Locust's own options do.

    Locust's parser has no automatic environment prefix: an option without an explicit
    ``env_var`` ignores the environment, so ``LOCUST_RATES`` would silently do nothing.
    """

    def __init__(self, parser: Any) -> None:
        self._parser = parser

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        action = self._parser.add_argument(*args, **kwargs)
        if not getattr(action, "env_var", None):
            action.env_var = "LOCUST_" + action.dest.upper()
        return action


def _is_locust(g: Any) -> bool:
    """The workload options go to Locust's parser and to a plain one that checks a suite's pass-through."""
    return isinstance(g, _EnvNamed)


def add_arguments(parser: Any) -> None:
    """Add the suite's options to Locust's (configargparse) parser."""
    g = _EnvNamed(parser)  # Locust's own add_argument knows is_secret and include_in_web_ui; groups do not
    add_options(g, ("rates", "batch_size", "n", "warmup"), locust=True)
    g.add_argument(
        "--warmup-rule",
        choices=WARMUP_RULES,
        default=DEFAULTS["warmup_rule"],
        help="completion: drop the first WARMUP successes to finish (the reference harness); "
        "trace: drop the first WARMUP trace items",
    )
    add_options(g, ("seed", "trace_file"), locust=True)
    g.add_argument("--prompt-word", default=PROMPT_WORD, help="filler word repeated prompt_tokens times")
    g.add_argument("--model", default="", help="model name to request (default: the server's first model)")
    add_options(g, ("api_key", "ignore_eos", "results_dir", "config_label"), locust=True)
    g.add_argument(
        "--max-in-flight",
        type=int,
        default=DEFAULTS["max_in_flight"],
        help="continuous arm: drop (and count) arrivals above this many in flight; 0 = no cap",
    )
    g.add_argument(
        "--request-timeout", type=float, default=DEFAULTS["request_timeout"], help="seconds a whole request may take"
    )
    g.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULTS["stall_timeout"],
        help="seconds of silence tolerated mid-stream; 0 = the request timeout",
    )
    g.add_argument(
        "--connect-timeout", type=float, default=DEFAULTS["connect_timeout"], help="seconds to open a connection"
    )
    g.add_argument(
        "--record-chunks", action="store_true", default=False, help="keep every chunk's arrival time in the records"
    )
    add_option(g, "realtime", locust=True)
    add_option(g, "chunk_stamp", locust=True, default=chunk_stamp_mode())
    g.add_argument("--metrics-url", default="", help="server /metrics URL (default: <host>/metrics)")
    g.add_argument(
        "--no-metrics", action="store_true", default=False, help="do not read /metrics (servers that do not expose it)"
    )
    g.add_argument(
        "--sample-metrics",
        type=float,
        default=DEFAULTS["sample_metrics"],
        help="seconds between direct /metrics samples kept for the report; 0 = off",
    )
    add_option(g, "prometheus_url", locust=True)
    g.add_argument(
        "--settle",
        type=float,
        default=DEFAULTS["settle"],
        help="idle seconds between stages, so 1 s scrapes bracket each stage cleanly",
    )
    g.add_argument("--stop-on-errors", type=int, default=0,
                   help="stop the run after a stage with at least this many failed requests; 0 = never")  # fmt: skip
    add_workload_arguments(g)
    add_web_arguments(g)


def add_prefix_arguments(g: Any) -> None:
    """The prefix source's shape, for Locust's options and the suite's alike."""
    g.add_argument(
        "--prefix-tokens",
        type=int,
        default=PREFIX_DEFAULTS["prefix_tokens"],
        help="prefix prompts: tokens of each shared prefix",
    )
    g.add_argument(
        "--prefix-share",
        type=float,
        default=PREFIX_DEFAULTS["prefix_share"],
        help="prefix prompts: share of requests (0-1) that start with a shared prefix",
    )
    g.add_argument(
        "--prefix-groups",
        type=int,
        default=PREFIX_DEFAULTS["prefix_groups"],
        help="prefix prompts: how many distinct shared prefixes",
    )


def add_workload_arguments(g: Any) -> None:
    """What each request carries and when it arrives (see tailgate/load/prompts.py and arrivals.py)."""
    add_options(g, ("prompts", "dataset"), locust=_is_locust(g))
    add_prefix_arguments(g)
    add_options(g, ("endpoint", "arrivals"), locust=_is_locust(g))
    for param in all_params():
        kind = float if param.positive else str
        g.add_argument(param.flag, type=kind, default=param.default, help=param.help)


@dataclass(frozen=True)
class Settings:
    arm: str
    host: str
    target: Target
    rates: tuple[float, ...]
    batch_size: int
    n: int
    warmup: int
    warmup_rule: str
    seed: int
    trace: tuple[TraceItem, ...]
    trace_source: str
    prompt_word: str
    model: str
    api_key: str | None = field(repr=False)
    ignore_eos: bool
    results_dir: Path
    config_label: str
    max_in_flight: int
    timeouts: Timeouts
    record_chunks: bool
    metrics_url: str | None
    sample_metrics: float
    prometheus_url: str | None
    settle: float
    stop_on_errors: int
    realtime: bool = False
    """Load processes asked for SCHED_FIFO (whether they got it is in their log)."""
    chunk_stamp: str = "kernel"
    """The stamp source asked for (``--chunk-stamp``); what each process used is in ``run.json``."""
    prompts: str = DEFAULT_PROMPTS
    """Prompt source (tailgate/load/prompts.py); ``mooncake`` when a Mooncake trace's hash_ids make the prompts."""
    endpoint: str = DEFAULT_ENDPOINT
    arrivals: str = DEFAULT_ARRIVALS
    arrival_params: dict[str, ArrivalValue] = field(default_factory=dict)
    """Every registered arrival process's option values, by dest (``burstiness``, ``time_scale``, ...)."""
    trace_format: str = ""
    trace_rows: tuple[TraceRow, ...] = ()
    dataset: str = ""
    dataset_entries: tuple[DatasetEntry, ...] = field(default=(), repr=False)
    prefix_tokens: int = 512
    prefix_share: float = 0.5
    prefix_groups: int = 4
    prompt_sets: tuple[tuple[Prompt | None, ...], ...] | None = field(default=None, repr=False)
    """Built prompts per stage, in arrival order (None: the seed filler, built in the load processes)."""
    prompt_check: JsonObject = field(default_factory=dict)
    """How the prompts were built and counted (pool size, template overhead, planned vs tokenized)."""

    def prompt_options(self) -> PromptOptions:
        """The prompt sources' own option values (what :class:`~tailgate.load.promptsources.PromptPlan` carries)."""
        return PromptOptions(dataset=self.dataset, dataset_entries=self.dataset_entries,
                             prefix_tokens=self.prefix_tokens, prefix_share=self.prefix_share,
                             prefix_groups=self.prefix_groups)  # fmt: skip

    def stages(self) -> list[Stage]:
        the_arm = arms.arm(self.arm)
        if the_arm.open_loop:
            stages = arrival_process(self.arrivals).build(
                ArrivalInput(self.trace, self.rates, self.seed, self.warmup, self.arrival_params, self.trace_rows)
            )
        else:
            stages = the_arm.build(self.trace, (self.batch_size,), self.seed, self.warmup)
        if self.prompt_sets is not None:
            stages = [with_prompts(st, self.prompt_sets[min(i, len(self.prompt_sets) - 1)])
                      for i, st in enumerate(stages)]  # fmt: skip
        return stages

    def workload(self) -> JsonObject:
        """Which source, endpoint and arrival process produced the records (run.json, summaries, records)."""
        out: JsonObject = {"prompts": self.prompts, "endpoint": self.endpoint, "arrivals": self.arrivals}
        known: dict[str, ArrivalValue] = {**self.arrival_params, "trace_format": self.trace_format}
        out.update({key: known[key] for key in arrival_process(self.arrivals).recorded_keys()})
        options: JsonObject = {"dataset": self.dataset, "prefix_tokens": self.prefix_tokens,
                               "prefix_share": self.prefix_share, "prefix_groups": self.prefix_groups}  # fmt: skip
        out.update({key: options[key] for key in prompt_source(self.prompts).recorded})
        if self.prompt_check:
            out["prompt_check"] = self.prompt_check
        return out

    def public(self) -> JsonObject:
        """Every option as used, for run metadata; the API key is reduced to whether one was set."""
        return {
            "arm": self.arm, "host": self.host, "rates": list(self.rates), "batch_size": self.batch_size,
            "n": self.n, "warmup": self.warmup, "warmup_rule": self.warmup_rule, "seed": self.seed,
            "trace_source": self.trace_source, "prompt_word": self.prompt_word, "model": self.model,
            "api_key_set": bool(self.api_key), "ignore_eos": self.ignore_eos,
            "results_dir": str(self.results_dir), "config_label": self.config_label,
            "max_in_flight": self.max_in_flight, "request_timeout": self.timeouts.request_s,
            "stall_timeout": self.timeouts.stall_s, "connect_timeout": self.timeouts.connect_s,
            "record_chunks": self.record_chunks, "metrics_url": self.metrics_url,
            "sample_metrics": self.sample_metrics, "prometheus_url": self.prometheus_url,
            "settle": self.settle, "stop_on_errors": self.stop_on_errors, "realtime": self.realtime,
            "chunk_stamp": self.chunk_stamp, **{k: v for k, v in self.workload().items() if k != "prompt_check"},
        }  # fmt: skip


def _check_url(option: str, url: str) -> str:
    try:
        Target.parse(url)
    except TargetError as e:
        raise OptionError(f"{option}: {e}") from None
    return url.rstrip("/")


def _writable_dir(path: Path) -> Path:
    """Create the folder now and prove a file can be written there, rather than fail mid-run."""
    if path.exists() and not path.is_dir():
        raise OptionError(f"--results-dir: {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".tailgate-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OptionError(f"--results-dir: {path} is not writable ({e.strerror or e})") from None
    return path


def _refuse_used_folder(results: Path) -> None:
    """One folder, one run: records of two runs in one folder would be summarized together."""
    meta = results / RUN_META
    if not meta.exists():
        return
    found = RunMeta.read_or_none(meta)
    what = "a run" if found is None else f"run {found.run_id} ({found.status})"
    raise OptionError(f"--results-dir: {results} already holds {what}; choose a new folder for this run")


def validate(opts: Any, *, arm: str | None = None, now: str = "") -> Settings:
    """Check every value; raise OptionError naming the first bad option."""
    arm = arm or getattr(opts, "arm", None) or ""
    the_arm = arms.arm(arm)
    host = getattr(opts, "host", None) or ""
    if not host:
        raise OptionError("--host: give the server URL, e.g. --host http://127.0.0.1:8000")
    host = _check_url("--host", host)
    target = Target.parse(host)
    rates = parse_rates(opts.rates) if the_arm.open_loop else ()
    if opts.batch_size < 1:
        raise OptionError(f"--batch-size: must be at least 1, got {opts.batch_size}")
    if opts.warmup < 0:
        check_counts(1, opts.warmup)
    workload = _validate_workload(opts, arm)
    rows: tuple[TraceRow, ...] = workload["trace_rows"]
    if rows:
        replay = arrival_process(workload["arrivals"])
        flag, path = replay.file_flag, workload["arrival_params"][replay.file_param]
        if opts.trace_file:
            raise OptionError(f"{flag}: a replayed trace brings its own lengths; drop --trace-file")
        items = [TraceItem(i, r.prompt_tokens, r.max_tokens) for i, r in enumerate(rows)]
        if len(items) <= opts.warmup:
            raise OptionError(f"{flag}: {len(items)} requests leave nothing after --warmup {opts.warmup}")
        n = len(items) - opts.warmup
        source = f"{workload['trace_format']} trace {path}"
    elif opts.trace_file:
        try:
            items = load_jsonl(opts.trace_file)
        except TraceError as e:
            raise OptionError(f"--trace-file: {e}") from None
        if len(items) <= opts.warmup:
            raise OptionError(f"--trace-file: {len(items)} items leave nothing after --warmup {opts.warmup}")
        n = len(items) - opts.warmup
        source = str(opts.trace_file)
    else:
        check_counts(opts.n, opts.warmup)
        n = opts.n
        items = make_trace(n + opts.warmup, opts.seed)
        source = f"seeded mix, seed {opts.seed}"
    for name in ("request_timeout", "connect_timeout"):
        if not getattr(opts, name) > 0:
            raise OptionError(f"--{name.replace('_', '-')}: must be positive, got {getattr(opts, name)}")
    if opts.stall_timeout < 0:
        raise OptionError(f"--stall-timeout: must be 0 or more, got {opts.stall_timeout}")
    if opts.max_in_flight < 0:
        raise OptionError(f"--max-in-flight: must be 0 (no cap) or more, got {opts.max_in_flight}")
    for name in ("settle", "sample_metrics", "stop_on_errors"):
        if getattr(opts, name) < 0:
            raise OptionError(f"--{name.replace('_', '-')}: must be 0 or more, got {getattr(opts, name)}")
    if not opts.prompt_word.strip():
        raise OptionError("--prompt-word: must contain a word")
    metrics_url = None
    if not opts.no_metrics:
        metrics_url = _check_url("--metrics-url", opts.metrics_url) if opts.metrics_url else target.url("/metrics")
    prometheus_url = _check_url("--prometheus-url", opts.prometheus_url) if opts.prometheus_url else None
    results = Path(opts.results_dir) if opts.results_dir else Path("results") / f"{arm}-{now or 'run'}"
    results = _writable_dir(results)
    _refuse_used_folder(results)
    api_key = opts.api_key or os.environ.get(API_KEY_ENV) or None
    return Settings(
        arm=arm, host=host, target=target, rates=rates, batch_size=opts.batch_size, n=n,
        warmup=opts.warmup, warmup_rule=opts.warmup_rule, seed=opts.seed, trace=tuple(items),
        trace_source=source, prompt_word=opts.prompt_word, model=opts.model, api_key=api_key,
        ignore_eos=bool(opts.ignore_eos), results_dir=results, config_label=opts.config_label or "default",
        max_in_flight=opts.max_in_flight,
        timeouts=Timeouts(opts.connect_timeout, opts.request_timeout, opts.stall_timeout or None),
        record_chunks=bool(opts.record_chunks), metrics_url=metrics_url,
        sample_metrics=opts.sample_metrics, prometheus_url=prometheus_url, settle=opts.settle,
        stop_on_errors=opts.stop_on_errors, realtime=bool(getattr(opts, "realtime", False)),
        chunk_stamp=getattr(opts, "chunk_stamp", None) or chunk_stamp_mode(), **workload,
    )  # fmt: skip


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises :class:`OptionError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise OptionError(message)


def check_workload(locust_args: Sequence[str], cells: Sequence[tuple[str | None, str]]) -> None:
    """The workload options a suite or an SLO search hands to its Locust runs, checked as each run will
    check them, before any server starts: a missing dataset or a bad trace must not cost a server start
    (minutes on a GPU box) to find. ``cells`` are the (prompt source, arm) pairs that will run; a source
    of ``None`` keeps whatever ``--prompts`` the Locust options name."""
    parser = _RaisingParser(add_help=False, allow_abbrev=False)  # as Locust's parser will read them
    add_workload_arguments(parser)
    opts, _ = parser.parse_known_args(list(locust_args))
    for source, arm in cells:
        if source is not None:
            opts.prompts = source
        _validate_workload(opts, arm)


class WorkloadFields(PromptOptions):
    """The settings fields the workload options fill (:func:`_validate_workload`), the prompt sources' own
    among them."""

    prompts: str
    endpoint: str
    arrivals: str
    arrival_params: dict[str, ArrivalValue]
    trace_format: str
    trace_rows: tuple[TraceRow, ...]


def _validate_workload(opts: Any, arm: str) -> WorkloadFields:
    """The prompt source, endpoint and arrival options, files parsed now: a bad file stops the run before
    anything is sent. Options a parser without them (an old locust.conf) lacks take their defaults."""

    def get(name: str, default: Any) -> Any:
        return getattr(opts, name, default)

    prompts = get("prompts", DEFAULT_PROMPTS) or DEFAULT_PROMPTS
    endpoint = get("endpoint", DEFAULT_ENDPOINT) or DEFAULT_ENDPOINT
    arrivals = get("arrivals", DEFAULT_ARRIVALS) or DEFAULT_ARRIVALS
    if prompts not in selectable_sources():
        raise OptionError(f"--prompts: unknown source {prompts!r}; choose one of {', '.join(selectable_sources())}")
    if endpoint not in endpoints():
        raise OptionError(f"--endpoint: unknown endpoint {endpoint!r}; choose one of {', '.join(endpoints())}")
    params, arrivals = _arrival_params(get, arrivals)
    process = arrival_process(arrivals)
    rows: tuple[TraceRow, ...] = ()
    trace_format = ""
    if process.file_param and process.load is not None:
        flag, trace_path = process.file_flag, str(params[process.file_param])
        if not trace_path:
            raise OptionError(f"--arrivals {arrivals}: name the trace with {flag} ({process.file_kinds})")
        if not arms.arm(arm).open_loop:
            raise OptionError(f"{flag}: trace replay is an open-loop (continuous) arrival process")
        try:
            trace_format, loaded = process.load(trace_path)
        except ArrivalError as e:
            raise OptionError(f"{flag}: {e}") from None
        rows = tuple(loaded)
        if trace_format == "mooncake" and any(r.hash_ids for r in rows):
            if prompts != DEFAULT_PROMPTS:
                raise OptionError(f"--prompts {prompts}: a Mooncake trace's hash_ids already define its prompts")
            prompts = TRACE_BLOCKS
    # every source carries the prefix shape and a dataset slot; a source checks only its own options (a suite
    # A/B passes the dataset to every cell: only the dataset source reads it)
    own = PromptOptions(dataset="", dataset_entries=(), **prefix_options(get))
    check = prompt_source(prompts).check
    if check is not None:
        try:
            own.update(check(get))
        except PromptError as e:
            raise OptionError(str(e)) from None
    return WorkloadFields(
        prompts=prompts, endpoint=endpoint, arrivals=arrivals, arrival_params=params,
        trace_format=trace_format, trace_rows=rows,
        **own,
    )  # fmt: skip


def _arrival_params(get: Any, arrivals: str) -> tuple[dict[str, ArrivalValue], str]:
    """Every arrival option's value, checked, and the process: a file named for a replaying process selects it."""
    params: dict[str, ArrivalValue] = {}
    for param in all_params():
        value = get(param.dest, param.default)
        if param.positive:
            value = float(value)
            if not 0 < value < float("inf"):
                raise OptionError(f"{param.flag}: must be a positive number, got {value:g}")
        params[param.dest] = value or param.default
    for process in arrival_processes().values():
        if process.file_param and params.get(process.file_param):
            arrivals = process.name
    try:
        arrival_process(arrivals)
    except ArrivalError as e:
        raise OptionError(f"--arrivals: {e}") from None
    return params, arrivals
