"""Every option more than one command takes, declared once: flags, dest, type, default, help, choices.

Locust's parser (``tailgate/load/options.py``), ``tailgate suite`` (``tailgate/suitecommand.py``) and ``trace``,
``tailgate slo``, ``tailgate selfcheck`` and the ground-truth server share ``--seed``, ``--n``,
``--chunk-stamp`` and some twenty more. Declared once, their helps cannot differ between commands, and a
caller turning values back into a Locust command line cannot spell a flag another way: each parser adds
them with :func:`add_options`, a command needing another default or help says so in the call (an
override, by name), and :func:`to_flags` writes a child's command line from the same declarations.
``tests/test_optiondecl.py`` fails when an option string is declared by two ``add_argument`` calls again.

Pure Python, as :mod:`tailgate.optiontable`: the runner and the ground-truth server import it. Choices
and helps that come from a registry (endpoints, arrival processes, prompt sources) are read when the
option is added, after the plugins have registered theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tailgate.optiontable import DEFAULTS, STAMP_HELP, STAMP_SOURCES, rates_text
from tailgate.serverconfigs import DEFAULT, names_text

API_KEY_ENV = "TAILGATE_API_KEY"
"""Where the API key comes from when no ``--api-key`` is given (never a command line: ``ps`` shows those)."""

PLACEMENTS = ("isolated", "shared")
"""Where a local server runs beside the load generator (``tailgate/servers/spec.py`` applies them)."""

OVERRIDABLE = frozenset({"default", "help", "type", "choices"})
"""What a command may set differently from the declaration; a flag, a dest or an action never differs."""


@dataclass(frozen=True)
class OptionSpec:
    """One option as argparse (and Locust's configargparse) takes it.

    ``default``, ``help`` and ``choices`` may be a function of no arguments, called when the option is added:
    a registry's names are known only once the plugins are loaded.
    """

    dest: str
    flags: tuple[str, ...]
    help: str | Callable[[], str] | None
    default: Any = None
    type: Callable[[str], Any] | None = None
    action: str | None = None
    """``store_true`` or ``append``; None stores one value."""
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    required: bool = False
    web_ui: bool = True
    """Locust only: whether the web UI's Start form shows it."""
    secret: bool = False
    """Locust only: masked in the web UI and never logged."""

    @property
    def flag(self) -> str:
        """The flag a command line is written with."""
        return self.flags[-1]

    def kwargs(self, overrides: Mapping[str, Any], *, locust: bool) -> dict[str, Any]:
        """``add_argument``'s keywords, with the command's overrides applied: argparse's (and configargparse's)
        own keyword arguments, passed through as they are, each of its own type."""
        unknown = set(overrides) - OVERRIDABLE
        if unknown:
            raise TypeError(f"{self.flag}: {', '.join(sorted(unknown))} cannot differ between commands")
        out: dict[str, Any] = {"dest": self.dest}
        fields = {"default": self.default, "help": self.help, "type": self.type, "choices": self.choices}
        fields.update(overrides)
        for key in ("default", "help", "choices"):
            if key not in overrides and callable(fields[key]):
                fields[key] = fields[key]()
        if self.action is not None:
            out["action"] = self.action
        if self.action == "append":
            fields["default"] = list(fields["default"] or ())  # argparse appends to a copy of a list
        if self.action == "store_true":
            fields.pop("type")
            fields.pop("choices")
        for key, value in fields.items():
            if value is not None or key in ("default", "help"):
                out[key] = value
        if self.required:
            out["required"] = True
        if locust:
            out["include_in_web_ui"] = self.web_ui
            if self.secret:
                out["is_secret"] = True
        return out


def _endpoints() -> tuple[str, ...]:
    from tailgate.load.payloads import endpoints

    return tuple(endpoints())


def _default_endpoint() -> str:
    from tailgate.load.payloads import DEFAULT_ENDPOINT

    return DEFAULT_ENDPOINT


def _endpoint_help() -> str:
    from tailgate.load.payloads import endpoint_help

    return endpoint_help()


def _prompt_sources() -> tuple[str, ...]:
    from tailgate.load.promptsources import selectable_sources

    return selectable_sources()


def _arrivals() -> tuple[str, ...]:
    from tailgate.load.arrivals import arrival_processes

    return tuple(arrival_processes())


def _default_arrivals() -> str:
    from tailgate.load.arrivals import DEFAULT_ARRIVALS

    return DEFAULT_ARRIVALS


def _arrivals_help() -> str:
    from tailgate.load.arrivals import arrival_processes

    return "continuous arm: " + ", ".join(f"{p.name} ({p.help})" for p in arrival_processes().values())


def _groundtruth_default(name: str) -> Callable[[], float]:
    def default() -> float:
        from tailgate.verify.groundtruth import wire

        return float(getattr(wire, name))

    return default


SPECS: tuple[OptionSpec, ...] = (
    # what each Locust run measures: the child's options, also taken by the commands that run it
    OptionSpec(
        "rates",
        ("--rates",),
        "continuous arm: comma-separated arrival rates in req/s, one stage each",
        rates_text(DEFAULTS["rates"]),
    ),
    OptionSpec("batch_size", ("--batch-size",), "gated arm: requests per batch (B)", DEFAULTS["batch_size"], int),
    OptionSpec("n", ("--n",), "measured requests per stage", DEFAULTS["n"], int),
    OptionSpec("warmup", ("--warmup",), "warm-up requests per stage", DEFAULTS["warmup"], int),
    OptionSpec("seed", ("--seed",), "trace seed; arrival gaps use seed+1", DEFAULTS["seed"], int),
    OptionSpec(
        "trace_file", ("--trace-file",), "JSONL trace (prompt_tokens, max_tokens) instead of the seeded mix", ""
    ),
    OptionSpec(
        "api_key",
        ("--api-key",),
        f"Bearer token for the server (or ${API_KEY_ENV}); never written to outputs",
        "",
        secret=True,
    ),
    OptionSpec(
        "ignore_eos",
        ("--ignore-eos",),
        "ask vLLM to ignore EOS (needed for dummy weights); recorded in the results",
        False,
        action="store_true",
    ),
    OptionSpec("results_dir", ("--results-dir",), "where records and summaries go (default results/<arm>-<time>)", ""),
    OptionSpec(
        "config_label",
        ("--config-label",),
        f"name of the server configuration under test ({names_text()}, ...)",
        DEFAULT.name,
    ),
    OptionSpec(
        "realtime",
        ("--realtime",),
        "run the load processes at SCHED_FIFO when the system allows it (a server on the same cores "
        "cannot then delay the timestamps); refused: a warning, and the run goes on at normal priority",
        False,
        action="store_true",
    ),
    OptionSpec("chunk_stamp", ("--chunk-stamp",), STAMP_HELP, None, choices=STAMP_SOURCES),
    OptionSpec(
        "prometheus_url",
        ("--prometheus-url",),
        "a Prometheus scraping the server (compose: :9090); recorded for the report",
        "",
    ),
    OptionSpec(
        "prompts",
        ("--prompts",),
        "prompt source: seed (filler word x planned length, the reference), unique (every request "
        "distinct from its first token, exact length for the served tokenizer via /tokenize), dataset "
        "(--dataset), prefix (groups sharing a prefix: --prefix-tokens/--prefix-share/--prefix-groups)",
        "seed",
        choices=_prompt_sources,
    ),
    OptionSpec(
        "dataset",
        ("--dataset",),
        "--prompts dataset: ShareGPT JSON, or JSONL with prompt or messages (optional max_tokens)",
        "",
    ),
    OptionSpec("endpoint", ("--endpoint",), _endpoint_help, _default_endpoint, choices=_endpoints),
    OptionSpec("arrivals", ("--arrivals",), _arrivals_help, _default_arrivals, choices=_arrivals),
    # what the commands that run Locust share
    OptionSpec("embedded", ("--embedded",), "the CPU vLLM of this machine, scaled down", False, action="store_true"),
    OptionSpec("results", ("--results",), "the command's folder (default results/<command>-<time>)", ""),
    OptionSpec("max_rate", ("--max-rate",), "highest rate --until-knee may reach", 320.0, float),
    OptionSpec("processes", ("--processes",), "Locust load processes", 1, int),
    OptionSpec("locust_arg", ("--locust-arg",), "extra option for every Locust run", (), action="append"),
    OptionSpec("no_report", ("--no-report",), "skip the report at the end", False, action="store_true"),
    OptionSpec(
        "placement",
        ("--placement",),
        "local server: 'isolated' keeps it off the first core, nices its autogroup and runs Locust at SCHED_FIFO "
        "where allowed; 'shared' does none of that (for comparison)",
        "isolated",
        choices=PLACEMENTS,
    ),
    OptionSpec("out", ("--out",), None, required=True),
    # the ground-truth server's schedule, set by ``tailgate selfcheck`` and by the server's own command line
    OptionSpec(
        "ttft_ms", ("--ttft-ms",), "server's time to first chunk", _groundtruth_default("DEFAULT_TTFT_MS"), float
    ),
    OptionSpec("gap_ms", ("--gap-ms",), "server's inter-chunk gap", _groundtruth_default("DEFAULT_GAP_MS"), float),
)
BY_DEST: dict[str, OptionSpec] = {spec.dest: spec for spec in SPECS}


def spec(dest: str) -> OptionSpec:
    """The declaration of the option stored in ``dest``."""
    try:
        return BY_DEST[dest]
    except KeyError:
        raise KeyError(f"no shared option {dest!r} in tailgate/optiondecl.py") from None


def add_option(parser: Any, dest: str, *, locust: bool = False, **overrides: Any) -> Any:
    """Add one declared option to ``parser`` (``locust``: Locust's parser, which knows the web UI and
    secrets); ``overrides`` are this command's own default, help, type or choices."""
    declared = spec(dest)
    return parser.add_argument(*declared.flags, **declared.kwargs(overrides, locust=locust))


def add_options(parser: Any, dests: Iterable[str], *, locust: bool = False) -> None:
    """Add declared options as they are, in the order given (the order ``--help`` lists them in)."""
    for dest in dests:
        add_option(parser, dest, locust=locust)


def to_flags(values: Mapping[str, Any]) -> list[str]:
    """A command line for the values, by dest, in the order given: the flags as declared, a switch only when
    on, an appended option once per value, a rate list as written in a form; None and ``""`` are left out
    (the child's own default then holds)."""
    out: list[str] = []
    for dest, value in values.items():
        declared = spec(dest)
        if value is None or (isinstance(value, str) and value == ""):
            continue
        if declared.action == "store_true":
            out += [declared.flag] if value else []
        elif declared.action == "append":
            for item in value:
                out += _pair(declared.flag, str(item))
        elif isinstance(value, (tuple, list)):
            out += _pair(declared.flag, rates_text(value))
        else:
            out += _pair(declared.flag, str(value))
    return out


def _pair(flag: str, text: str) -> list[str]:
    """``--flag=VALUE`` where the value starts with a dash (argparse would take it for an option)."""
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]
