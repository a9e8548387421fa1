"""The suite's options, declared once for Locust's parser and validated into typed settings.

Declaring them through Locust's ``init_command_line_parser`` gives every option a CLI flag, a
``LOCUST_*`` environment variable, a ``locust.conf`` key and a web-UI field for free. Validation
turns every bad value into an :class:`OptionError` whose message names the option, so the
entry points can print one line and exit 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailgate import arms
from tailgate.contracts import RunMeta
from tailgate.load.client import Target, TargetError, Timeouts, chunk_stamp_mode
from tailgate.load.plan import Stage
from tailgate.load.workload import PROMPT_WORD, TraceError, TraceItem, load_jsonl, make_trace
from tailgate.optiontable import DEFAULTS, OptionError, check_counts, parse_rates, rates_text
from tailgate.resultfiles import RUN_META
from tailgate.stats import WARMUP_RULES

ARMS = tuple(arms.ARMS)
API_KEY_ENV = "TAILGATE_API_KEY"


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


def add_arguments(parser: Any) -> None:
    """Add the suite's options to Locust's (configargparse) parser."""
    g = _EnvNamed(parser)  # Locust's own add_argument knows is_secret and include_in_web_ui; groups do not
    g.add_argument(
        "--rates",
        default=rates_text(DEFAULTS["rates"]),
        help="continuous arm: comma-separated arrival rates in req/s, one stage each",
    )
    g.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="gated arm: requests per batch (B)")
    g.add_argument("--n", type=int, default=DEFAULTS["n"], help="measured requests per stage")
    g.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="warm-up requests per stage")
    g.add_argument(
        "--warmup-rule",
        choices=WARMUP_RULES,
        default=DEFAULTS["warmup_rule"],
        help="completion: drop the first WARMUP successes to finish (the reference harness); "
        "trace: drop the first WARMUP trace items",
    )
    g.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="trace seed; arrival gaps use seed+1")
    g.add_argument("--trace-file", default="", help="JSONL trace (prompt_tokens, max_tokens) instead of the seeded mix")
    g.add_argument("--prompt-word", default=PROMPT_WORD, help="filler word repeated prompt_tokens times")
    g.add_argument("--model", default="", help="model name to request (default: the server's first model)")
    g.add_argument(
        "--api-key",
        default="",
        is_secret=True,
        help=f"Bearer token for the server (or ${API_KEY_ENV}); never written to outputs",
    )
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        default=False,
        help="ask vLLM to ignore EOS (needed for dummy weights); recorded in the results",
    )
    g.add_argument("--results-dir", default="", help="where records and summaries go (default results/<arm>-<time>)")
    g.add_argument(
        "--config-label",
        default="chunked",
        help="name of the server configuration under test (chunked, nochunk, preempt, ...)",
    )
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
    g.add_argument(
        "--realtime", action="store_true", default=False,
        help="run the load processes at SCHED_FIFO when the system allows it (a server on the same cores "
        "cannot then delay the timestamps); refused: a warning, and the run goes on at normal priority",
    )  # fmt: skip
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
    g.add_argument("--prometheus-url", default="", help="Prometheus that scrapes the server (recorded for the report)")
    g.add_argument(
        "--settle",
        type=float,
        default=DEFAULTS["settle"],
        help="idle seconds between stages, so 1 s scrapes bracket each stage cleanly",
    )
    g.add_argument("--stop-on-errors", type=int, default=0,
                   help="stop the run after a stage with at least this many failed requests; 0 = never")  # fmt: skip


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

    def stages(self) -> list[Stage]:
        a = arms.arm(self.arm)
        return a.build(self.trace, self.rates if a.open_loop else (self.batch_size,), self.seed, self.warmup)

    def public(self) -> dict[str, Any]:
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
            "chunk_stamp": chunk_stamp_mode(),
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
    if opts.trace_file:
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
    )  # fmt: skip
