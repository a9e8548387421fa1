"""Arrival processes: when the open-loop dispatcher sends each request of a continuous stage.

Every process is one :class:`ArrivalProcess` in :data:`ARRIVALS`, and every module that needs to know
about one (the Locust options, the suite's options, the stage schedule, the records) asks the registry:
none compares process names. A new process is one module that calls :func:`register`; named in
``TAILGATE_PLUGINS`` (see :mod:`tailgate.plugins`), it needs no other file changed. Poisson is drawn
exactly as the reference harness draws it (:func:`tailgate.load.plan.poisson_offsets`); the others yield
absolute offsets for the same dispatcher, so the only thing that changes between processes is when
requests are due.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from tailgate.load.plan import Stage, continuous_stage, poisson_offsets, rate_label
from tailgate.load.workload import TraceItem
from tailgate.plugins import Registry

ArrivalValue: TypeAlias = float | str
"""An arrival option's value: a number (``burstiness``, ``time_scale``), or a text such as a trace's path."""
ArrivalParams: TypeAlias = Mapping[str, ArrivalValue]
"""Every registered process's option values, by dest."""


class ArrivalError(ValueError):
    """A trace or arrival setting that cannot be used; ``str()`` is the one line shown to the user."""


def gamma_offsets(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Gaps from a gamma distribution with mean ``1/rate`` and shape ``burstiness``.

    Shape 1 is exponential (Poisson arrivals, though not the same draws as :func:`poisson_offsets`);
    below 1 arrivals cluster (the squared coefficient of variation of the gaps is ``1/burstiness``),
    above 1 they even out. vLLM's ``bench serve --burstiness`` uses the same parametrisation.
    """
    rng = random.Random(seed + 1)
    scale = 1.0 / (rate * burstiness)
    offsets = []
    t = 0.0
    for _ in range(count):
        offsets.append(t)
        t += rng.gammavariate(burstiness, scale)
    return offsets


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    """Seconds after the trace's first request (before the time scale)."""
    prompt_tokens: int
    max_tokens: int
    hash_ids: tuple[int, ...] | None = None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_mooncake(path: Path, text: str) -> list[TraceRow]:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` (512-token blocks)."""
    rows: list[TraceRow] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"trace file {path} line {lineno}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            raise ArrivalError(f"{where}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise ArrivalError(f"{where}: expected an object")
        ts = obj.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise ArrivalError(f"{where}: timestamp must be a number of ms, 0 or more")
        for name in ("input_length", "output_length"):
            if not _positive_int(obj.get(name)):
                raise ArrivalError(f"{where}: {name} must be a positive integer")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise ArrivalError(f"{where}: hash_ids must be a list of integers")
        rows.append(TraceRow(float(ts) / 1000.0, obj["input_length"], obj["output_length"], tuple(ids)))
    return rows


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def load_burstgpt(path: Path, text: str) -> list[TraceRow]:
    """BurstGPT CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens`` (other columns ignored).

    Rows whose response has 0 tokens (failed requests in the original log) are skipped, as peer
    replayers do: a request cannot ask for 0 tokens."""
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in BURSTGPT_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ArrivalError(f"trace file {path}: BurstGPT CSV lacks column(s) {', '.join(missing)}")
    rows: list[TraceRow] = []
    first: float | None = None
    for lineno, rec in enumerate(reader, 2):
        where = f"trace file {path} line {lineno}"
        try:
            ts = float(rec["Timestamp"])
            prompt = int(rec["Request tokens"])
            out = int(rec["Response tokens"])
        except (TypeError, ValueError):
            raise ArrivalError(f"{where}: Timestamp, Request tokens and Response tokens must be numbers") from None
        if ts != ts or ts < 0 or prompt < 1 or out < 0:
            raise ArrivalError(f"{where}: negative or missing values")
        if out == 0:
            continue
        first = ts if first is None else first
        rows.append(TraceRow(ts, prompt, out))
    return rows


def load_trace(path: str | Path) -> tuple[str, list[TraceRow]]:
    """``(format, rows)`` of a Mooncake JSONL or BurstGPT CSV trace, offsets from the earliest request."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArrivalError(f"trace file {p} does not exist") from None
    except UnicodeDecodeError:
        raise ArrivalError(f"trace file {p} is not UTF-8 text") from None
    except OSError as e:
        raise ArrivalError(f"trace file {p} cannot be read: {e.strerror or e}") from None
    head = text.lstrip()[:1]
    if head == "{":
        kind, rows = "mooncake", load_mooncake(p, text)
    elif head:
        kind, rows = "burstgpt", load_burstgpt(p, text)
    else:
        raise ArrivalError(f"trace file {p} is empty")
    if not rows:
        raise ArrivalError(f"trace file {p} holds no requests")
    rows.sort(key=lambda r: r.offset_s)  # stable: equal timestamps keep file order and arrive together
    t0 = rows[0].offset_s
    return kind, [TraceRow(r.offset_s - t0, r.prompt_tokens, r.max_tokens, r.hash_ids) for r in rows]


def scaled(rows: list[TraceRow], time_scale: float) -> list[float]:
    """Offsets with the trace's time stretched by ``time_scale`` (0.5 = twice as fast)."""
    return [r.offset_s * time_scale for r in rows]


# ------------------------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class ArrivalParam:
    """An option a process reads: a Locust option (and a ``tailgate suite`` one for a rate-driven process)."""

    dest: str
    """The option's dest: ``burstiness`` is ``--burstiness``."""
    default: ArrivalValue
    help: str
    positive: bool = True
    """A number that must be above 0 and finite (otherwise a text, such as a file name)."""

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


@dataclass(frozen=True)
class ArrivalInput:
    """What a process draws a run's stages from: the items, the rates asked for, the seed, its options."""

    trace: Sequence[TraceItem]
    rates: Sequence[float]
    seed: int
    warmup: int
    params: ArrivalParams
    """Every registered process's option values, by dest."""
    trace_rows: Sequence[TraceRow] = ()
    """The rows of a replayed file (a process with a ``file_param``)."""


StagesBuilder = Callable[[ArrivalInput], list[Stage]]
OffsetDrawer = Callable[[int, float, int, ArrivalParams], list[float]]
"""(count, rate, seed, options) -> each arrival's offset from the stage's start, in seconds."""


@dataclass(frozen=True)
class ArrivalProcess:
    name: str
    help: str
    """A few words after its name in ``--arrivals``'s help."""
    build: StagesBuilder
    params: tuple[ArrivalParam, ...] = ()
    file_param: str = ""
    """The param naming a file the process replays (its times and lengths): giving that option selects the
    process, the file brings its own stage and rate, and ``tailgate suite --arrivals`` does not offer it
    (its cells take a file through ``--locust-arg``)."""
    file_kinds: str = ""
    """What files it reads, for the message when none is named."""
    load: Callable[[str], tuple[str, list[TraceRow]]] | None = None
    """Parses the file: ``(format, rows)``; raises :class:`ArrivalError`."""
    recorded: tuple[str, ...] | None = None
    """Keys it adds to the run's workload description (default: its params); ``trace_format`` is the loaded
    file's format."""

    @property
    def replays_file(self) -> bool:
        return bool(self.file_param)

    @property
    def file_flag(self) -> str:
        return "--" + self.file_param.replace("_", "-")

    def recorded_keys(self) -> tuple[str, ...]:
        return self.recorded if self.recorded is not None else tuple(p.dest for p in self.params)


ARRIVALS: Registry[ArrivalProcess] = Registry("arrival process")
"""Every known process by name, in the order ``--arrivals`` lists them. Read it through
:func:`arrival_processes`, which first imports the plugins that register more."""
DEFAULT_ARRIVALS = "poisson"
"""The process of a run that names none, and of a record written before processes were recorded."""


def register(process: ArrivalProcess) -> ArrivalProcess:
    """Add a process; a second one of the same name is refused (two meanings for one recorded name)."""
    return ARRIVALS.add(process.name, process)


def arrival_processes() -> Mapping[str, ArrivalProcess]:
    return ARRIVALS.loaded()


def arrival_process(name: str) -> ArrivalProcess:
    """The process of this name, or an :class:`ArrivalError` line listing the known ones."""
    known = arrival_processes()
    try:
        return known[name]
    except KeyError:
        raise ArrivalError(f"unknown process {name!r}; choose one of {', '.join(known)}") from None


def all_params() -> list[ArrivalParam]:
    """Every registered process's options, each once, in registry order."""
    seen: dict[str, ArrivalParam] = {}
    for process in arrival_processes().values():
        for param in process.params:
            seen.setdefault(param.dest, param)
    return list(seen.values())


def rate_driven() -> dict[str, ArrivalProcess]:
    """The processes drawn from ``--rates`` (all but file replays): those ``tailgate suite --arrivals`` offers."""
    return {name: p for name, p in arrival_processes().items() if not p.replays_file}


def rate_driven_params() -> list[ArrivalParam]:
    """Their numeric options, each once, in registry order: the suite's own options, passed on to Locust."""
    seen: dict[str, ArrivalParam] = {}
    for process in rate_driven().values():
        for param in process.params:
            if param.positive:
                seen.setdefault(param.dest, param)
    return list(seen.values())


def per_rate(
    name: str,
    help: str,
    draw: OffsetDrawer,
    params: tuple[ArrivalParam, ...] = (),
    label: Callable[[float, ArrivalParams], str] | None = None,
) -> ArrivalProcess:
    """A process with one stage per ``--rates`` value, its offsets drawn by ``draw``; stages are labelled
    ``cont_r<rate>_<name>`` unless ``label`` says otherwise."""

    def build(inp: ArrivalInput) -> list[Stage]:
        return [
            continuous_stage(i, inp.trace, r, inp.seed, inp.warmup,
                             offsets=draw(len(inp.trace), r, inp.seed, inp.params),
                             label=label(r, inp.params) if label else f"cont_r{rate_label(r)}_{name}")
            for i, r in enumerate(inp.rates)
        ]  # fmt: skip

    return ArrivalProcess(name, help, build, params)


def trace_rate(rows: Sequence[TraceRow], time_scale: float) -> float:
    """A replayed trace's mean offered rate after the time scale (requests over the span)."""
    span = (rows[-1].offset_s - rows[0].offset_s) * time_scale
    return (len(rows) - 1) / span if span > 0 else float(len(rows))


def _replay(inp: ArrivalInput) -> list[Stage]:
    time_scale = float(inp.params["time_scale"])
    offsets = scaled(list(inp.trace_rows), time_scale)
    return [continuous_stage(0, inp.trace, trace_rate(inp.trace_rows, time_scale), inp.seed, inp.warmup,
                             offsets=offsets, label=f"trace_x{rate_label(time_scale)}")]  # fmt: skip


BURSTINESS = ArrivalParam(
    "burstiness", 1.0, "gamma arrivals: shape of the gaps; below 1 burstier than Poisson, above 1 smoother"
)

register(per_rate("poisson", "the reference draws", lambda n, rate, seed, _: poisson_offsets(n, rate, seed),
                  label=lambda rate, _: f"cont_r{rate_label(rate)}"))  # fmt: skip
register(per_rate(
    "gamma", "--burstiness",
    lambda n, rate, seed, p: gamma_offsets(n, rate, float(p["burstiness"]), seed), (BURSTINESS,),
    label=lambda rate, p: f"cont_r{rate_label(rate)}_gamma{rate_label(float(p['burstiness']))}",
))  # fmt: skip
register(ArrivalProcess(
    "trace", "--arrival-trace", _replay,
    params=(
        ArrivalParam("arrival_trace", "", "replay a Mooncake JSONL or BurstGPT CSV trace: its timestamps and "
                     "lengths (implies --arrivals trace; Mooncake hash_ids become shared prompt blocks)",
                     positive=False),
        ArrivalParam("time_scale", 1.0, "trace arrivals: multiply the trace's time by this (0.5 replays it "
                     "twice as fast)"),
    ),
    file_param="arrival_trace", file_kinds="Mooncake JSONL or BurstGPT CSV", load=load_trace,
    recorded=("arrival_trace", "trace_format", "time_scale"),
))  # fmt: skip
