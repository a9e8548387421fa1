"""The SLO and the sweep as a user writes them: limits (``ttft_p99<=300ms,errors<=0.5%``) and the server
configurations to search (``--config``, ``--knob``, ``--sweep``), each parsed into frozen values or one-line
:class:`SloError` naming the option, so bad input never reaches a server.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailgate import exitcodes
from tailgate.jsontypes import JsonObject
from tailgate.resultfiles import SLO_META
from tailgate.serverconfigs import CHUNKED_OFF_FLAG

EXIT_OK = exitcodes.DONE
EXIT_FAILED = exitcodes.FAILED
EXIT_USAGE = exitcodes.USAGE
EXIT_NOT_MET = exitcodes.NOT_MET
"""The search finished and every configuration was shown to fail at the lowest rate it reached."""
EXIT_UNDECIDED = exitcodes.UNDECIDED
"""The search finished and no configuration met the SLO, but not every one was shown to fail: undecided."""

SLO_FILE = SLO_META
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

    def as_dict(self) -> JsonObject:
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
        flags.append(CHUNKED_OFF_FLAG)
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
