"""``tailgate slo``: the highest Poisson rate each server configuration sustains under an SLO.

The question after the seed's table: *at my SLO, how much load can this server take, and which
scheduler setting gives the most?* For every server configuration of a sweep (chunked prefill,
``--max-num-batched-tokens``, ``--long-prefill-token-threshold``, ``--max-num-seqs``), the server is
restarted with its flags and the continuous arm probes rates: double from a start rate until the
SLO fails, then bisect to a resolution. Every probe is an ordinary Locust run in its own folder
(nothing is discarded, and ``tailgate report`` reads them like any other cell).

An SLO limits TTFT, worst-gap and total percentiles **from the intended send** (so a late load
generator or a queue in front of the server counts against the server, as a user would feel it),
and the error rate. A p99 of a few hundred requests rests on a handful of them, so each verdict
comes with a bootstrap interval: a probe passes only when the whole interval is under every limit,
fails when an interval lies wholly above one, and is otherwise *uncertain*: re-run (the attempts
are pooled), and still uncertain after that it counts as not passing and is reported as such.

This module drives child processes and reads JSONL; it never imports pandas, gevent or Locust.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from tailgate import locustfiles
from tailgate.arms import CONTINUOUS
from tailgate.contracts import SloMeta, StageSummary
from tailgate.jsonl import Follower
from tailgate.load.plan import rate_label
from tailgate.optiontable import DEFAULTS, OptionError, check_counts, check_rate
from tailgate.records import read_records
from tailgate.resultfiles import RECORDS_GLOB, SERVER_METRICS, SUMMARY_GLOB
from tailgate.resultfiles import SLO_META as SLO_FILE
from tailgate.stats import measured_records, percentile, tail

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_MET = 3
"""The search finished and no configuration met the SLO at any probed rate."""

PROBE_MARK = "slo-probe.json"

Log = Callable[[str], None]


class SloError(ValueError):
    """Bad input; the message starts with the option it concerns and fits on one line."""


# ----------------------------------------------------------------------------------------- the SLO

#: SLO metric -> record field. TTFT and total count from the intended send (open-loop latency); the
#: worst gap lies inside the stream, where the send time does not enter.
METRIC_FIELDS: dict[str, str] = {
    "ttft": "ttft_from_intended_ms",
    "gap": "worst_gap_ms",
    "total": "total_from_intended_ms",
}
_PCT_LIMIT = re.compile(r"^(ttft|gap|total)_p(\d{1,2}(?:\.\d+)?)\s*<=\s*(\d+(?:\.\d+)?)\s*(ms|s)?$")
_ERR_LIMIT = re.compile(r"^errors\s*<=\s*(\d+(?:\.\d+)?)\s*(%)?$")


@dataclass(frozen=True)
class Limit:
    """One term of an SLO: a percentile of a latency (ms) or the error fraction, at most ``limit``."""

    key: str
    """``ttft_p99``, ``gap_p99``, ``total_p95``, ``errors``..."""
    metric: str
    p: float | None
    limit: float
    """Milliseconds, or a fraction (0–1) for ``errors``."""

    def text(self) -> str:
        if self.metric == "errors":
            return f"errors<={self.limit * 100:g}%"
        return f"{self.key}<={self.limit:g}ms"


def parse_slo(text: str) -> tuple[Limit, ...]:
    """``"ttft_p99<=300ms,gap_p99<=200ms,errors<=0.5%"`` -> limits; :class:`SloError` naming ``--slo``."""
    limits: list[Limit] = []
    for raw in (text or "").split(","):
        term = raw.strip().lower()
        if not term:
            continue
        m = _PCT_LIMIT.match(term)
        if m:
            metric, p, value, unit = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4) or "ms"
            if not 0 < p < 100:
                raise SloError(f"--slo: percentile in {raw.strip()!r} must be between 0 and 100")
            ms = value * 1000.0 if unit == "s" else value
            if ms <= 0:
                raise SloError(f"--slo: limit in {raw.strip()!r} must be above 0")
            limits.append(Limit(f"{metric}_p{p:g}", metric, p, ms))
            continue
        m = _ERR_LIMIT.match(term)
        if m:
            value = float(m.group(1))
            frac = value / 100.0 if m.group(2) else value
            if not 0 <= frac <= 1:
                raise SloError(f"--slo: error limit in {raw.strip()!r} must be a fraction 0-1 or a percentage")
            limits.append(Limit("errors", "errors", None, frac))
            continue
        raise SloError(
            f"--slo: cannot read {raw.strip()!r}; use e.g. ttft_p99<=300ms,gap_p99<=200ms,total_p99<=10s,errors<=0.5%"
        )
    if not limits:
        raise SloError("--slo: no limits given; e.g. ttft_p99<=300ms,gap_p99<=200ms,errors<=0.5%")
    keys = [lim.key for lim in limits]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise SloError(f"--slo: {', '.join(dup)} given twice")
    if all(lim.metric == "errors" for lim in limits):
        raise SloError("--slo: give at least one latency limit (ttft_pNN, gap_pNN or total_pNN)")
    return tuple(limits)


def slo_text(limits: Sequence[Limit]) -> str:
    return ",".join(lim.text() for lim in limits)


# ------------------------------------------------------------------------------------ configurations

#: Scheduler knobs a sweep may set, with the short name used in generated configuration names.
KNOBS: dict[str, str] = {
    "chunked": "chunked",
    "max-num-batched-tokens": "mnbt",
    "long-prefill-token-threshold": "lptt",
    "max-num-seqs": "mns",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ON = {"on", "true", "yes", "1"}
_OFF = {"off", "false", "no", "0"}
EMBEDDED_MAX_MODEL_LEN = 8192
"""The CPU server's context: with chunked prefill off the step budget must hold a whole prompt."""


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration of the sweep: a name, its knob values, and the vLLM flags they mean."""

    name: str
    knobs: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "knobs": dict(self.knobs), "flags": list(self.flags)}


def _knob_name(raw: str, option: str) -> str:
    name = raw.strip().lower().replace("_", "-").lstrip("-")
    if name not in KNOBS:
        raise SloError(f"{option}: unknown knob {raw.strip()!r}; known: {', '.join(KNOBS)}")
    return name


def _knob_value(knob: str, raw: Any, option: str) -> str:
    text = str(raw).strip().lower()
    if knob == "chunked":
        if isinstance(raw, bool):
            return "on" if raw else "off"
        if text in _ON:
            return "on"
        if text in _OFF:
            return "off"
        raise SloError(f"{option}: chunked must be on or off, got {raw!r}")
    try:
        value = int(text)
    except ValueError:
        raise SloError(f"{option}: {knob} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise SloError(f"{option}: {knob} must be at least 1, got {value}")
    return str(value)


def knob_flags(knobs: Mapping[str, str], embedded: bool = False) -> list[str]:
    """The vLLM flags for these knob values (flag names verified against vLLM 0.24.0)."""
    flags: list[str] = []
    chunked = knobs.get("chunked")
    if chunked == "off":
        flags.append("--no-enable-chunked-prefill")
        if embedded and "max-num-batched-tokens" not in knobs:
            # the CPU default budget (2048) is below the context; unchunked prompts must fit one step
            flags += ["--max-num-batched-tokens", str(EMBEDDED_MAX_MODEL_LEN)]
    elif chunked == "on":
        flags.append("--enable-chunked-prefill")
    for knob in ("max-num-batched-tokens", "long-prefill-token-threshold", "max-num-seqs"):
        if knob in knobs:
            flags += [f"--{knob}", knobs[knob]]
    return flags


def _auto_name(knobs: Mapping[str, str]) -> str:
    if not knobs:
        return "default"
    return "_".join(f"{KNOBS[k]}-{v}" for k, v in knobs.items())


def _make(name: str | None, knobs: dict[str, str], option: str, embedded: bool) -> ServerConfig:
    name = name or _auto_name(knobs)
    if not _NAME.match(name):
        raise SloError(f"{option}: configuration name {name!r} must be letters, digits, '.', '_' or '-'")
    return ServerConfig(name, tuple(knobs.items()), tuple(knob_flags(knobs, embedded)))


def parse_config(text: str, embedded: bool = False) -> ServerConfig:
    """``NAME`` or ``NAME: knob=value knob=value`` or ``knob=value ...`` (named after its knobs)."""
    option = "--config"
    if ":" in text:
        name, _, rest = text.partition(":")
    elif "=" in text:
        name, rest = "", text
    else:
        name, rest = text, ""
    knobs: dict[str, str] = {}
    for part in rest.replace(",", " ").split():
        if "=" not in part:
            raise SloError(f"{option}: expected knob=value in {text!r}, got {part!r}")
        k, v = part.split("=", 1)
        knob = _knob_name(k, option)
        knobs[knob] = _knob_value(knob, v, option)
    return _make(name.strip() or None, knobs, option, embedded)


def parse_grid(items: Sequence[str], embedded: bool = False, option: str = "--knob") -> list[ServerConfig]:
    """``--knob NAME=V1,V2`` repeated: every combination, in the order given."""
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        if "=" not in item:
            raise SloError(f"{option}: expected knob=value1,value2 in {item!r}")
        k, values = item.split("=", 1)
        knob = _knob_name(k, option)
        vals = [_knob_value(knob, v, option) for v in values.split(",") if v.strip()]
        if not vals:
            raise SloError(f"{option}: no values for {knob}")
        if any(knob == a for a, _ in axes):
            raise SloError(f"{option}: {knob} given twice")
        axes.append((knob, list(dict.fromkeys(vals))))
    return [
        _make(None, dict(zip((a for a, _ in axes), combo, strict=True)), option, embedded)
        for combo in itertools.product(*(v for _, v in axes))
    ]


def parse_sweep_file(path: str, embedded: bool = False) -> list[ServerConfig]:
    """A JSON or TOML file: ``{"configs": [{"name": ..., "knobs": {...}}]}`` and/or ``{"grid": {knob: [values]}}``."""
    option = "--sweep"
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise SloError(f"{option}: cannot read {path} ({e.strerror or e})") from None
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            doc = tomllib.loads(raw.decode("utf-8"))
        else:
            doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise SloError(f"{option}: {path} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'} ({e})") from None
    if not isinstance(doc, dict) or set(doc) - {"configs", "grid"}:
        raise SloError(f"{option}: {path} must hold an object with 'configs' and/or 'grid'")
    out: list[ServerConfig] = []
    for entry in doc.get("configs") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("knobs", {}), dict):
            raise SloError(f"{option}: each entry of 'configs' must be {{'name': ..., 'knobs': {{...}}}}")
        knobs: dict[str, str] = {}
        for k, v in (entry.get("knobs") or {}).items():
            knob = _knob_name(str(k), option)
            knobs[knob] = _knob_value(knob, v, option)
        name = entry.get("name")
        out.append(_make(str(name) if name else None, knobs, option, embedded))
    grid = doc.get("grid") or {}
    if not isinstance(grid, dict):
        raise SloError(f"{option}: 'grid' must map knobs to lists of values")
    if grid:
        items = []
        for k, values in grid.items():
            vals = values if isinstance(values, list) else [values]
            items.append(f"{k}=" + ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in vals))
        out += parse_grid(items, embedded, option)
    if not out:
        raise SloError(f"{option}: {path} describes no configuration (the sweep is empty)")
    return out


def build_sweep(args: argparse.Namespace) -> list[ServerConfig]:
    """Every configuration named by ``--config``, ``--knob`` and ``--sweep``; one 'default' when none."""
    configs: list[ServerConfig] = []
    for text in args.config or []:
        if not text.strip():
            raise SloError("--config: empty configuration")
        configs.append(parse_config(text, args.embedded))
    if args.knob:
        configs += parse_grid(args.knob, args.embedded)
    if args.sweep:
        configs += parse_sweep_file(args.sweep, args.embedded)
    if not configs:
        configs = [ServerConfig("default", (), ())]
    names = [c.name for c in configs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SloError(f"--config: configuration {', '.join(dup)} appears twice")
    return configs


# --------------------------------------------------------------------------------------------- verdicts


@dataclass
class Check:
    """One limit checked on one probe: point estimate, interval at the confidence level, verdict."""

    key: str
    limit: float
    point: float | None
    low: float | None
    high: float | None
    n: int
    verdict: str
    """``pass`` (interval under the limit), ``fail`` (interval above it) or ``uncertain``."""


def _verdict(low: float, high: float, limit: float) -> str:
    if high <= limit:
        return "pass"
    if low > limit:
        return "fail"
    return "uncertain"


def _error_verdict(point: float, low: float, limit: float) -> str:
    """Errors: fail when even the interval's low end is over the limit, uncertain when only the point is.

    Zero errors in n requests bound the rate only near 3/n, so an interval rule would call every probe
    under a 0.5% limit uncertain below ~600 requests. The observed rate is therefore held against the
    limit, and the Wilson interval is reported beside it, not used to pass.
    """
    if low > limit:
        return "fail"
    return "uncertain" if point > limit else "pass"


def bootstrap_interval(values: np.ndarray, p: float, level: float, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile-bootstrap interval of the ``p``-th percentile (the report's fast order-statistic bootstrap)."""
    from tailgate.postprocess.bootstrap import bootstrap_percentile

    draws = bootstrap_percentile(values, p, resamples, np.random.default_rng(seed))
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(draws, [tail, 100.0 - tail])
    return float(lo), float(hi)


def wilson_interval(k: int, n: int, level: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: sound at 0 errors and small n, unlike the normal one."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    ph = k / n
    den = 1 + z * z / n
    mid = (ph + z * z / (2 * n)) / den
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def check_probe(
    attempts: Sequence[Mapping[str, Any]],
    limits: Sequence[Limit],
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 7,
) -> tuple[str, list[Check]]:
    """Pool the attempts of one probe and check every limit; the probe's verdict and the checks.

    Each attempt is ``{"measured": [records], "sent": int, "errors": int, "stopped_early": str|None}``.
    A probe stopped early (queue without bound, error budget spent) fails whatever its percentiles say.
    """
    measured = [r for a in attempts for r in a["measured"]]
    sent = sum(int(a["sent"]) for a in attempts)
    errors = sum(int(a["errors"]) for a in attempts)
    checks: list[Check] = []
    for lim in limits:
        if lim.metric == "errors":
            frac = errors / sent if sent else 1.0
            lo, hi = wilson_interval(errors, sent, level)
            checks.append(Check(lim.key, lim.limit, round(frac, 5), round(lo, 5), round(hi, 5), sent,
                                _error_verdict(frac, lo, lim.limit) if sent else "fail"))  # fmt: skip
            continue
        vals = np.array([r.get(METRIC_FIELDS[lim.metric]) for r in measured], dtype=float)
        vals = vals[np.isfinite(vals)]
        if vals.size == 0:
            checks.append(Check(lim.key, lim.limit, None, None, None, 0, "fail"))
            continue
        assert lim.p is not None
        point = float(percentile(vals.tolist(), lim.p) or 0.0)
        lo, hi = bootstrap_interval(vals, lim.p, level, resamples, seed)
        checks.append(Check(lim.key, lim.limit, round(point, 1), round(lo, 1), round(hi, 1), int(vals.size),
                            _verdict(lo, hi, lim.limit)))  # fmt: skip
    verdicts = {c.verdict for c in checks}
    if any(a.get("stopped_early") for a in attempts) or "fail" in verdicts:
        return "fail", checks
    return ("uncertain" if "uncertain" in verdicts else "pass"), checks


def p99s(measured: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """TTFT, worst-gap and total p99 from the intended send, whatever the SLO limits: the table shows all three."""
    out: dict[str, float | None] = {}
    for metric, fld in METRIC_FIELDS.items():
        out[metric] = tail(measured, fld, 99)
    return out


def binding_limit(checks: Sequence[Check] | Sequence[Mapping[str, Any]]) -> str | None:
    """The limit that binds: the failing (else uncertain) check furthest above its limit, relative to it."""
    rows = [c if isinstance(c, Mapping) else asdict(c) for c in checks]
    for verdict in ("fail", "uncertain"):
        cands = [c for c in rows if c["verdict"] == verdict]
        if cands:

            def over(c: Mapping[str, Any]) -> float:
                if c["point"] is None:
                    return math.inf
                return (c["point"] - c["limit"]) / c["limit"] if c["limit"] > 0 else c["point"]

            return str(max(cands, key=over)["key"])
    return None


# ----------------------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Resolution:
    """Bisection stops when the bracket is this narrow: req/s, or a fraction of the passing rate."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Resolution:
        t = text.strip()
        try:
            res = cls(float(t[:-1]) / 100.0, True) if t.endswith("%") else cls(float(t), False)
        except ValueError:
            raise SloError(f"--resolution: expected req/s (e.g. 2) or a percentage (e.g. 10%), got {text!r}") from None
        if not res.value > 0 or (res.relative and res.value >= 1):
            raise SloError(f"--resolution: must be above 0 (and a percentage below 100%), got {text!r}")
        return res

    def narrow(self, lo: float, hi: float) -> bool:
        return hi - lo <= (self.value * lo if self.relative else self.value) + 1e-9

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g} req/s"


@dataclass
class SearchStep:
    rate: float
    phase: str
    """``double``, ``halve`` or ``bisect``."""
    verdict: str


@dataclass
class SearchOutcome:
    best: float | None
    """Highest rate that passed (None: none did)."""
    first_fail: float | None
    """Lowest rate above ``best`` that did not pass (None: every probe up to the maximum passed)."""
    status: str
    """``bracketed`` (to the resolution), ``max_rate`` (passed at the cap), ``below_min`` (nothing passed),
    ``probe_limit`` (the probe budget ran out before the resolution)."""
    steps: list[SearchStep] = field(default_factory=list)


def search(
    probe: Callable[[float, str], str],
    *,
    start: float,
    max_rate: float,
    min_rate: float,
    resolution: Resolution,
    max_probes: int,
) -> SearchOutcome:
    """Double from ``start`` until a probe does not pass, then bisect; only ``pass`` counts as meeting the SLO.

    ``probe(rate, phase)`` returns ``pass``, ``fail`` or ``uncertain``. When the start rate already fails
    the rate halves until one passes or ``min_rate`` is reached. Rates are rounded to 1/1000 req/s.
    """
    steps: list[SearchStep] = []
    lo: float | None = None
    hi: float | None = None

    def run(rate: float, phase: str) -> bool:
        v = probe(rate, phase)
        steps.append(SearchStep(rate, phase, v))
        return v == "pass"

    rate = round(min(start, max_rate), 3)
    while len(steps) < max_probes:  # doubling
        if run(rate, "double"):
            lo = rate
            if rate >= max_rate:
                return SearchOutcome(lo, None, "max_rate", steps)
            rate = round(min(rate * 2, max_rate), 3)
        else:
            hi = rate
            break
    if hi is None:
        return SearchOutcome(lo, None, "probe_limit", steps)
    while lo is None and len(steps) < max_probes:  # the start failed: halve
        rate = round(hi / 2, 3)
        if rate < min_rate:
            return SearchOutcome(None, hi, "below_min", steps)
        if run(rate, "halve"):
            lo = rate
        else:
            hi = rate
    if lo is None:
        return SearchOutcome(None, hi, "probe_limit", steps)
    while not resolution.narrow(lo, hi):  # bisection
        if len(steps) >= max_probes:
            return SearchOutcome(lo, hi, "probe_limit", steps)
        mid = round((lo + hi) / 2, 3)
        if mid in (lo, hi):
            break
        if run(mid, "bisect"):
            lo = mid
        else:
            hi = mid
    return SearchOutcome(lo, hi, "bracketed", steps)


# --------------------------------------------------------------------------------------- running probes


@dataclass
class SloPlan:
    limits: tuple[Limit, ...]
    configs: list[ServerConfig]
    start_rate: float = 5.0
    max_rate: float = 64.0
    min_rate: float = 0.5
    resolution: Resolution = field(default_factory=lambda: Resolution(0.25, True))
    max_probes: int = 8
    reruns: int = 1
    confidence: float = 0.95
    resamples: int = 2000
    n: int = 200
    warmup: int = 25
    seed: int = 7
    ignore_eos: bool = False
    processes: int = 1
    max_waiting: int = 0
    """Stop a probe once the server's waiting queue reaches this many requests (0: never)."""
    time_budget: float = 0.0
    """Seconds of probing per configuration; no probe starts that would overrun it (0: no budget)."""
    locust_args: list[str] = field(default_factory=list)
    base_flags: list[str] = field(default_factory=list)
    """Flags every configuration starts with (the embedded server's eager mode), before its own."""

    def describe(self) -> dict[str, Any]:
        return {
            "slo": slo_text(self.limits), "limits": [asdict(lim) for lim in self.limits],
            "start_rate": self.start_rate, "max_rate": self.max_rate, "min_rate": self.min_rate,
            "resolution": str(self.resolution), "max_probes": self.max_probes, "reruns": self.reruns,
            "confidence": self.confidence, "resamples": self.resamples, "n": self.n, "warmup": self.warmup,
            "seed": self.seed, "ignore_eos": self.ignore_eos, "processes": self.processes,
            "max_waiting": self.max_waiting, "time_budget": self.time_budget, "locust_args": self.locust_args,
            "base_flags": self.base_flags,
            "measured_from": "intended send (TTFT, total); worst gap inside the stream",
        }  # fmt: skip


def probe_dir_name(config: str, rate: float, attempt: int) -> str:
    return f"{config}_slo_r{rate_label(rate)}_a{attempt}"


_NULL_CLASS = re.compile(rb'"error_class":\s*null')


class _Watch:
    """Follows a running probe's files: the server's waiting queue and the error records so far."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._metrics = Follower(out, SERVER_METRICS)
        self._records = Follower(out, RECORDS_GLOB)
        self.errors = 0
        self.waiting: float | None = None
        self.waiting_max = 0.0

    def poll(self) -> None:
        samples, _ = self._metrics.new_objects()
        for sample in samples:
            w = sample.get("waiting")
            if isinstance(w, (int, float)):
                self.waiting = float(w)
                self.waiting_max = max(self.waiting_max, float(w))
        for line in self._records.new_lines():  # a byte search, not a parse: probes can be large
            if b'"error_class"' in line and not _NULL_CLASS.search(line):
                self.errors += 1


class SloRunner:
    """Runs the search for every configuration, restarting the server between them."""

    def __init__(
        self,
        plan: SloPlan,
        controller: Any,
        root: Path,
        *,
        prometheus_url: str | None = None,
        log: Log = print,
        extra_metadata: dict[str, Any] | None = None,
    ) -> None:
        self.plan = plan
        self.controller = controller
        self.root = root
        self.prometheus_url = prometheus_url
        self.log = log
        self.extra = extra_metadata or {}
        self._child: subprocess.Popen[str] | None = None
        self._running: str | None = None
        self._interrupted = False
        self.state: dict[str, Any] = {}
        self.clock: Callable[[], float] = time.monotonic
        """What the time budget is counted on (a test may substitute its own)."""
        self._config_t0 = self.clock()

    # -- state file ------------------------------------------------------------------------------
    def _save(self) -> None:
        path = self.root / SLO_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str) + "\n")
        tmp.replace(path)

    def _config_state(self, config: ServerConfig) -> dict[str, Any]:
        configs = self.state.setdefault("configs", [])
        for c in configs:
            if c["name"] == config.name:
                return c
        c = {**config.as_dict(), "status": "pending", "probes": [], "server": None}
        configs.append(c)
        return c

    # -- server ------------------------------------------------------------------------------------
    def _ensure_server(self, config: ServerConfig) -> None:
        if self._running == config.name:
            return
        flags = [*self.plan.base_flags, *config.flags]
        cs = self._config_state(config)
        if hasattr(self.controller, "use_config"):
            self.controller.use_config(config.name)
        if getattr(self.controller, "restarts", True):
            shown = shlex.join(flags) or "default flags"
            self.log(f"[slo] server configuration '{config.name}': restarting with {shown}")
            t0 = self.clock()
            self.controller.restart(flags)
            self.controller.wait_healthy()
            self.log(f"[slo] server healthy after {self.clock() - t0:.0f} s")
            self._config_t0 += self.clock() - t0  # the time budget is for probes, not for starts
            applied = True
        else:
            self.log(f"[slo] server configuration '{config.name}': using the server as it runs; "
                     f"declared flags {shlex.join(flags) or '(none)'} are recorded, not applied")  # fmt: skip
            self.controller.wait_healthy()
            applied = False
        self._running = config.name
        cs["server"] = {"flags": flags, "flags_applied": applied, **self.controller.describe()}
        self._save()

    # -- one Locust run ----------------------------------------------------------------------------
    def _command(self, config: ServerConfig, rate: float, seed: int, out: Path) -> list[str]:
        p = self.plan
        cmd = [
            sys.executable, "-m", "locust", "-f", str(Path(locustfiles.__file__).with_name(CONTINUOUS.locustfile)),
            "--headless", "--only-summary", "--host", self.controller.base_url, "--results-dir", str(out),
            "--config-label", config.name, "--n", str(p.n), "--warmup", str(p.warmup), "--seed", str(seed),
            "--rates", f"{rate:g}",
        ]  # fmt: skip
        if p.ignore_eos:
            cmd.append("--ignore-eos")
        if self.prometheus_url:
            cmd += ["--prometheus-url", self.prometheus_url]
        if p.processes > 1:
            cmd += ["--processes", str(p.processes)]
        return cmd + list(p.locust_args)

    def _error_budget(self) -> int | None:
        """Errors beyond which a probe fails whatever happens next (None: no error limit)."""
        lim = next((x for x in self.plan.limits if x.metric == "errors"), None)
        if lim is None:
            return None
        return math.floor(lim.limit * (self.plan.n + self.plan.warmup))

    def _run_child(self, config: ServerConfig, rate: float, seed: int, out: Path) -> dict[str, Any]:
        """Run one Locust child, stopping it early when the queue or the errors already decide the probe."""
        if out.exists():  # an interrupted attempt: kept aside, never mixed in
            aside = self.root / ".incomplete" / f"{out.name}-{int(time.time())}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            out.rename(aside)
        cmd = self._command(config, rate, seed, out)
        t0 = time.monotonic()
        tail: list[str] = []
        child = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self._child = child

        def pump() -> None:
            assert child.stdout is not None
            for line in child.stdout:
                tail.append(line.rstrip("\n"))
                del tail[:-40]

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        watch = _Watch(out)
        budget = self._error_budget()
        stopped: str | None = None
        while child.poll() is None:
            time.sleep(0.5)
            watch.poll()
            if stopped:
                continue
            if self.plan.max_waiting and watch.waiting is not None and watch.waiting >= self.plan.max_waiting:
                stopped = (f"waiting queue reached {watch.waiting:.0f} (limit {self.plan.max_waiting}): "
                           "it grows without bound")
            elif budget is not None and watch.errors > budget:
                stopped = f"{watch.errors} errors: over the SLO's error budget of {budget} for the probe"
            if stopped:
                self.log(f"[slo]   stopping the probe early: {stopped}")
                child.send_signal(signal.SIGINT)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
        code = child.wait()
        reader.join(timeout=5)
        self._child = None
        watch.poll()
        summaries = sorted(out.glob(SUMMARY_GLOB))
        summary = StageSummary.read(summaries[0]) if summaries else None
        if stopped is None and (code not in (0, 1) or summary is None):
            detail = "\n".join(tail[-15:])
            raise SloRunError(f"probe {out.name} failed (locust exit {code}); last output:\n{detail}")
        mark = {
            "rate": rate, "seed": seed, "exit_code": code, "seconds": round(time.monotonic() - t0, 1),
            "stopped_early": stopped, "waiting_max": watch.waiting_max,
        }  # fmt: skip
        (out / PROBE_MARK).write_text(json.dumps(mark, indent=1) + "\n")
        return mark

    def _attempt_data(self, out: Path, mark: Mapping[str, Any]) -> dict[str, Any]:
        """What a verdict needs from one attempt's folder."""
        scan = read_records(out)
        recs = [r for r in scan.records if r.get("error_class") != "cancelled" or not mark.get("stopped_early")]
        summaries = sorted(out.glob(SUMMARY_GLOB))
        summary = StageSummary.read(summaries[0]) if summaries else StageSummary()
        dropped = int(summary.dropped_arrivals or 0)
        errors = sum(1 for r in scan.records if r.get("error_class") is not None) + dropped
        return {
            "measured": measured_records(recs, self.plan.warmup),
            "sent": len(scan.records) + dropped,
            "errors": errors,
            "stopped_early": mark.get("stopped_early"),
            "summary": summary,
            "records": scan.records,
        }

    def probe(self, config: ServerConfig, rate: float, phase: str, index: int) -> str:
        """One rate: run (or reuse) attempts until the verdict is certain or the re-runs are spent."""
        p = self.plan
        attempts: list[dict[str, Any]] = []
        entry: dict[str, Any] = {"index": index, "rate": rate, "phase": phase, "attempts": []}
        verdict, checks = "uncertain", []
        for attempt in range(1, p.reruns + 2):
            out = self.root / probe_dir_name(config.name, rate, attempt)
            seed = p.seed + 100 * (attempt - 1)  # a re-run draws a fresh trace and fresh arrival gaps
            mark_path = out / PROBE_MARK
            if mark_path.exists():
                mark = json.loads(mark_path.read_text())
                self.log(f"[slo] {config.name}: probe {index} ({phase}) {rate:g} req/s attempt {attempt}: already done")
            else:
                est = (p.n + p.warmup) / rate
                spent = self.clock() - self._config_t0
                if p.time_budget and spent + est + PROBE_OVERHEAD_S > p.time_budget:
                    if attempts:  # a re-run that does not fit: the probe stays uncertain, and is recorded
                        self.log(f"[slo]   no time left in the budget for the re-run: {rate:g} req/s stays uncertain")
                        break
                    need = est + PROBE_OVERHEAD_S
                    raise _BudgetSpent(f"{spent:.0f} s spent; a {rate:g} req/s probe needs ~{need:.0f} s more "
                                       f"than the {p.time_budget:g} s budget allows")  # fmt: skip
                self._ensure_server(config)
                self.log(f"[slo] {config.name}: probe {index} ({phase}) {rate:g} req/s attempt {attempt} "
                         f"(~{est:.0f} s of arrivals)")  # fmt: skip
                mark = self._run_child(config, rate, seed, out)
            data = self._attempt_data(out, mark)
            attempts.append(data)
            verdict, checks = check_probe(attempts, p.limits, level=p.confidence, resamples=p.resamples, seed=p.seed)
            s = data["summary"]
            entry["attempts"].append({
                "dir": out.name, "seed": seed, "seconds": mark.get("seconds"),
                "stopped_early": mark.get("stopped_early"), "waiting_max": mark.get("waiting_max"),
                "sent": data["sent"], "errors": data["errors"],
                "n_measured": len(data["measured"]), "achieved_rate": s.get("achieved_rate"),
                "ttft_p99_from_send": s.get("ttft_p99"), "preemptions_delta": s.get("preemptions_delta"),
                "schedule_lag_p99": s.get("schedule_lag_p99"),
            })  # fmt: skip
            shown = ", ".join(
                f"{c.key} {_fmt(c.key, c.point)} [{_fmt(c.key, c.low)}, {_fmt(c.key, c.high)}] {c.verdict}"
                for c in checks
            )
            self.log(f"[slo]   -> {verdict.upper()}: {shown}")
            if verdict != "uncertain":
                break
            if attempt <= p.reruns:
                self.log("[slo]   an interval straddles its limit: re-running, the attempts pooled")
        pooled = [r for a in attempts for r in a["measured"]]
        entry.update({"verdict": verdict, "checks": [asdict(c) for c in checks],
                      "binding": binding_limit(checks), "p99": p99s(pooled)})  # fmt: skip
        cs = next(c for c in self.state["configs"] if c["name"] == config.name)
        cs["probes"].append(entry)
        self._save()
        return verdict

    def run_config(self, config: ServerConfig) -> dict[str, Any]:
        p = self.plan
        cs = self._config_state(config)
        cs.update({"status": "running", "probes": []})
        self._save()
        counter = itertools.count(1)
        self._config_t0 = self.clock()
        try:
            outcome = search(
                lambda rate, phase: self.probe(config, rate, phase, next(counter)),
                start=p.start_rate, max_rate=p.max_rate, min_rate=p.min_rate,
                resolution=p.resolution, max_probes=p.max_probes,
            )  # fmt: skip
        except _BudgetSpent as e:
            self.log(f"[slo] {config.name}: time budget spent ({e}); the bracket so far is the answer")
            outcome = _outcome_so_far(cs["probes"])
        best_probe = next((pr for pr in reversed(cs["probes"]) if pr["rate"] == outcome.best), None)
        fail_probe = next((pr for pr in reversed(cs["probes"]) if pr["rate"] == outcome.first_fail), None)
        cs["result"] = {
            "best_rate": outcome.best, "first_fail_rate": outcome.first_fail, "status": outcome.status,
            "binding": fail_probe["binding"] if fail_probe else None,
            "at_best": {c["key"]: c for c in best_probe["checks"]} if best_probe else None,
            "uncertain_rates": [pr["rate"] for pr in cs["probes"] if pr["verdict"] == "uncertain"],
            "probes": len(cs["probes"]),
            "attempts": sum(len(pr["attempts"]) for pr in cs["probes"]),
        }  # fmt: skip
        cs["status"] = "done"
        self._save()
        best = "none" if outcome.best is None else f"{outcome.best:g} req/s"
        self.log(f"[slo] {config.name}: highest rate meeting the SLO {best} ({outcome.status}; "
                 f"binding limit above it: {cs['result']['binding'] or 'none'})")  # fmt: skip
        return cs

    def run(self) -> list[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        found = SloMeta.read_or_none(self.root / SLO_FILE)
        self.state = found.to_dict() if found is not None else {"created": _iso(time.time())}
        self.state.update({"started": _iso(time.time()), "plan": self.plan.describe(), **self.extra})
        # configurations searched by earlier invocations (one per device call) stay in the file
        self.state.setdefault("configs", [])
        self._save()
        done = []
        for config in self.plan.configs:
            done.append(self.run_config(config))
        self.state["ended"] = _iso(time.time())
        self._save()
        return done

    def interrupt(self) -> None:
        """Stop the Locust child (its in-flight requests are written as cancelled records)."""
        self._interrupted = True
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()


class SloRunError(RuntimeError):
    pass


class _BudgetSpent(Exception):
    """The next probe would overrun the configuration's time budget."""


PROBE_OVERHEAD_S = 15.0
"""Seconds a probe costs beyond its arrivals: the load generator's start, the last streams, the settle."""


def _outcome_so_far(probes: Sequence[Mapping[str, Any]]) -> SearchOutcome:
    """The answer the probes run so far give, when the search is cut short."""
    passed = [p["rate"] for p in probes if p["verdict"] == "pass"]
    best = max(passed) if passed else None
    above = [p["rate"] for p in probes if p["verdict"] != "pass" and (best is None or p["rate"] > best)]
    steps = [SearchStep(p["rate"], p["phase"], p["verdict"]) for p in probes]
    return SearchOutcome(best, min(above) if above else None, "time_budget", steps)


def _fmt(key: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v * 100:.2f}%" if key == "errors" else f"{v:.1f}"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ------------------------------------------------------------------------------------------- the command

#: Eager mode on the CPU server: it starts in ~40 s instead of minutes of torch.compile on 2 cores.
EMBEDDED_BASE_FLAGS = ("--enforce-eager",)
EMBEDDED = {"start_rate": 1.0, "max_rate": 8.0, "n": 20, "warmup": 3, "max_waiting": 64}
GPU = {"start_rate": 5.0, "max_rate": 64.0, "n": 200, "warmup": DEFAULTS["warmup"], "max_waiting": 400}


def add_slo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo", default="",
                   help="limits from the intended send, e.g. 'ttft_p99<=300ms,gap_p99<=200ms,errors<=0.5%%'")
    p.add_argument("--embedded", action="store_true", help="the CPU vLLM of this machine, scaled down")
    p.add_argument("--server", choices=("local", "compose", "manual", "url", "command"), default=None,
                   help="who restarts the server per configuration: local (CPU vLLM), compose (an override "
                        "file per configuration), manual (you), command (--restart-command), url (nobody: "
                        "one configuration, its flags recorded as declared)")  # fmt: skip
    p.add_argument("--host", default="http://127.0.0.1:8000", help="server URL (compose, manual, url, command)")
    p.add_argument("--restart-command", default="",
                   help="shell command that (re)starts the server; {flags} and {config} are filled in")
    p.add_argument("--stop-command", default="", help="shell command that stops the server at the end (command)")
    p.add_argument("--config", action="append", default=[],
                   help="a configuration: 'NAME' or 'NAME: knob=value ...' (repeat); knobs: " + ", ".join(KNOBS))
    p.add_argument("--knob", action="append", default=[], help="knob=v1,v2: a grid over every combination (repeat)")
    p.add_argument("--sweep", default="", help="JSON or TOML file with 'configs' and/or 'grid'")
    p.add_argument("--results", default="", help="folder (default results/slo-<time>); re-use to resume")
    p.add_argument("--start-rate", type=float, default=None, help="first rate of the doubling, req/s (default 5)")
    p.add_argument("--max-rate", type=float, default=None, help="highest rate probed, req/s (default 64)")
    p.add_argument("--min-rate", type=float, default=None, help="lowest rate halving may reach (default start/8)")
    p.add_argument("--resolution", default="25%",
                   help="bisect until the bracket is this narrow: req/s or a %% of the rate")
    p.add_argument("--max-probes", type=int, default=8, help="rates probed per configuration at most")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds of probing per configuration; no probe starts that would overrun it (0: none)")
    p.add_argument("--reruns", type=int, default=1, help="re-runs of a probe whose interval straddles a limit")
    p.add_argument("--confidence", type=float, default=0.95, help="level of the bootstrap / Wilson intervals")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per percentile")
    p.add_argument("--n", type=int, default=None, help="measured requests per probe (default 200)")
    p.add_argument("--warmup", type=int, default=None, help=f"warm-up requests per probe (default {GPU['warmup']})")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="trace seed; a re-run uses seed + 100")
    p.add_argument("--trace-file", default="", help="JSONL of {prompt_tokens, max_tokens} instead of the seeded mix")
    p.add_argument("--ignore-eos", action="store_true", help="needed for dummy-weight models")
    p.add_argument("--processes", type=int, default=1, help="load-generator processes per probe")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="stop a probe when vllm:num_requests_waiting reaches this (default 400; 0 = never)")
    p.add_argument("--prometheus-url", default="", help="a Prometheus scraping the server")
    p.add_argument("--compose-file", action="append", default=[], help="compose file(s) (default docker-compose.yml)")
    p.add_argument("--compose-service", default="vllm")
    p.add_argument("--locust-arg", action="append", default=[], help="extra option for every Locust run")
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")


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
    if not 0.5 <= args.confidence < 1:
        raise SloError(f"--confidence: must be in [0.5, 1), got {args.confidence:g}")
    if args.resamples < 100:
        raise SloError(f"--resamples: must be at least 100, got {args.resamples}")
    if args.processes < 1:
        raise SloError(f"--processes: must be at least 1, got {args.processes}")
    if not (math.isfinite(args.time_budget) and args.time_budget >= 0):
        raise SloError(f"--time-budget: must be 0 (none) or more seconds, got {args.time_budget:g}")
    if max_waiting < 0:
        raise SloError(f"--max-waiting: must be 0 (never) or more, got {max_waiting}")
    locust_args = list(args.locust_arg)
    if args.trace_file:
        if not Path(args.trace_file).is_file():
            raise SloError(f"--trace-file: {args.trace_file} is not a file")
        locust_args += ["--trace-file", str(Path(args.trace_file).resolve())]
        try:  # the file sets the count: every item after the warm-up is measured
            lines = [x for x in Path(args.trace_file).read_text().splitlines() if x.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise SloError(f"--trace-file: cannot read {args.trace_file} ({e})") from None
        if len(lines) <= warmup:
            raise SloError(f"--trace-file: {len(lines)} items leave nothing after --warmup {warmup}")
        n = len(lines) - warmup
    return SloPlan(
        limits=limits, configs=configs, start_rate=start, max_rate=max_rate, min_rate=min_rate,
        resolution=Resolution.parse(args.resolution), max_probes=args.max_probes, reruns=args.reruns,
        confidence=args.confidence, resamples=args.resamples, n=n, warmup=warmup, seed=args.seed,
        ignore_eos=args.ignore_eos or args.embedded, processes=args.processes, max_waiting=max_waiting,
        time_budget=args.time_budget,
        locust_args=locust_args, base_flags=list(EMBEDDED_BASE_FLAGS) if args.embedded else [],
    )  # fmt: skip


def _check_url(option: str, url: str) -> None:
    from tailgate.load.client import Target, TargetError

    try:
        Target.parse(url)
    except TargetError as e:
        raise SloError(f"{option}: {e}") from None


def print_table(state: Mapping[str, Any], log: Log) -> None:
    """The answer in the terminal: configuration -> highest rate meeting the SLO, its p99s, the binding limit."""
    log(f"[slo] SLO {state.get('plan', {}).get('slo')}: highest Poisson rate meeting it, per configuration")
    for c in state.get("configs", []):
        r = c.get("result") or {}
        best = r.get("best_rate")
        at = r.get("at_best") or {}
        p99 = " ".join(f"{k} {_fmt(k, v.get('point'))}" for k, v in at.items())
        status = r.get("status")
        where = "none" if best is None else (f">= {best:g}" if status == "max_rate" else f"{best:g}")
        log(f"[slo]   {c['name']:<28} {where:>8} req/s  {p99}  binding: {r.get('binding') or '-'}  ({status})")


def main(argv: Sequence[str] | None = None) -> int:
    from tailgate.cli import ArgumentParser

    prog = "tailgate slo"
    parser = ArgumentParser(prog=prog, description="highest Poisson rate meeting an SLO, per server configuration")
    add_slo_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = build_plan(args)
        if not args.embedded and args.server is None:
            raise SloError("--server: say who runs the server (local, compose, manual, url, command) "
                           "or use --embedded")
        if args.server == "url" and len(plan.configs) > 1:
            raise SloError("--config: --server url cannot restart the server; name the one configuration it runs")
        if args.server == "command" and "{flags}" not in args.restart_command:
            raise SloError("--restart-command: give a shell command with a {flags} placeholder")
        if args.server in ("compose", "manual", "url", "command"):
            _check_url("--host", args.host)
        if args.prometheus_url:
            _check_url("--prometheus-url", args.prometheus_url)
        root = Path(args.results or f"results/slo-{time.strftime('%Y%m%d-%H%M%S')}")
        if root.exists() and not root.is_dir():
            raise SloError(f"--results: {root} exists and is not a folder")
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / ".probe").write_text("")
            (root / ".probe").unlink()
        except OSError as e:
            raise SloError(f"--results: {root} is not writable ({e.strerror or e})") from None
    except SloError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return EXIT_USAGE
    log = _printer()
    return run(args, plan, root, log)


def _printer() -> Log:
    def log(line: str) -> None:
        print(line, flush=True)

    return log


def make_controller(args: argparse.Namespace, root: Path, log: Log) -> Any:
    from tailgate import servers
    from tailgate.servers.sweep import CommandServer, ComposeWithFlags

    if args.embedded or args.server == "local":
        log("[slo] preparing the CPU vLLM (installed once into ~/.cache/tailgate)")
        python = servers.ensure_vllm_venv(log=log)
        model = servers.ensure_tiny_model(python=python)
        return servers.LocalVllmServer(python, model, log_path=root / "server.log")
    if args.server == "compose":
        return ComposeWithFlags(args.compose_service, args.compose_file or ["docker-compose.yml"],
                                root / "compose", base_url=args.host)  # fmt: skip
    if args.server == "manual":
        return servers.ManualServer(args.host, out=log)
    if args.server == "command":
        return CommandServer(args.host, args.restart_command, stop_command=args.stop_command)
    return servers.FixedServer(args.host)


def run(args: argparse.Namespace, plan: SloPlan, root: Path, log: Log) -> int:
    from tailgate import servers

    started = time.monotonic()
    controller: Any = None
    runner: SloRunner | None = None
    try:
        controller = make_controller(args, root, log)
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
        runner.run()
        print_table(runner.state, log)
        if not args.no_report:
            from tailgate.postprocess.report import build_report

            log("[slo] building the report")
            paths = build_report(root, prometheus_url=args.prometheus_url or None)
            log(f"[slo] report: {getattr(paths, 'html', paths)}")
        log(f"[slo] finished in {time.monotonic() - started:.0f} s")
        met = any((c.get("result") or {}).get("best_rate") is not None for c in runner.state.get("configs", []))
        return EXIT_OK if met else EXIT_NOT_MET
    except KeyboardInterrupt:
        if runner is not None:
            runner.interrupt()
        log("[slo] interrupted: finished probes are kept; run the same command again to resume")
        return 130
    except (SloRunError, servers.ServerError, OSError) as e:
        log(f"[slo] failed: {e}")
        return EXIT_FAILED
    finally:
        if runner is not None:
            runner.interrupt()
        if controller is not None and (args.embedded or args.server in ("local", "command")):
            controller.stop()


__all__ = [
    "Check", "Limit", "Resolution", "SearchOutcome", "ServerConfig", "SloError", "SloPlan", "SloRunner",
    "binding_limit", "build_sweep", "check_probe", "knob_flags", "main", "parse_config", "parse_grid",
    "parse_slo", "parse_sweep_file", "search", "wilson_interval",
]  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
