"""The suite's option defaults and their validation, in one table.

The Locust options (command line, ``locust.conf``, the web UI's Start form), ``tailgate suite`` and
``tailgate slo`` all take a measured count, a warm-up, a seed and arrival rates. Each reads its defaults
and checks from here, so a value one refuses is refused by all; ``tests/test_contracts.py`` compares every parser's
defaults with this table. Pure Python: the load path, the command line and the analysis import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypedDict


class OptionError(ValueError):
    """A bad option value; ``str()`` is the one line shown to the user."""


class OptionDefaults(TypedDict):
    """The shared options' defaults, by dest (``--batch-size`` is ``batch_size``)."""

    n: int
    """Measured requests per stage."""
    warmup: int
    """Warm-up requests per stage."""
    seed: int
    """Trace seed; arrival gaps use seed+1."""
    rates: tuple[float, ...]
    """Continuous arm: arrival rates in req/s, one stage each."""
    batch_size: int
    """Gated arm: requests per batch (B)."""
    nochunk_rates: tuple[float, ...]
    """Chunked-prefill-off arm rates."""
    preempt_rate: float
    """Rate of the small-KV-pool cell."""
    warmup_rule: str
    """Which requests the warm-up drops."""
    settle: float
    """Idle seconds between stages, so 1 s scrapes bracket each stage cleanly."""
    request_timeout: float
    """Seconds a whole request may take."""
    connect_timeout: float
    """Seconds to open a connection."""
    stall_timeout: float
    """Seconds of silence tolerated mid-stream; 0 = the request timeout."""
    max_in_flight: int
    """Continuous arm: drop (and count) arrivals above this many in flight."""
    sample_metrics: float
    """Seconds between direct /metrics samples kept for the report; 0 = off."""


DEFAULTS: OptionDefaults = {
    "n": 500, "warmup": 25, "seed": 7, "rates": (1.0, 5.0, 10.0, 20.0), "batch_size": 16,
    "nochunk_rates": (5.0, 10.0), "preempt_rate": 10.0, "warmup_rule": "completion", "settle": 2.0,
    "request_timeout": 600.0, "connect_timeout": 10.0, "stall_timeout": 0.0, "max_in_flight": 0,
    "sample_metrics": 1.0,
}  # fmt: skip

STAMP_SOURCES: tuple[str, ...] = ("capture", "kernel", "recv")
"""What gives a chunk its time (``--chunk-stamp``): ``capture``, the arrival of the TCP segment that carried
it, from a packet socket in a process of its own (needs CAP_NET_RAW, not over TLS); ``kernel``, the
kernel's receive stamp of the newest bytes of the read that delivered it; ``recv``, when that read returned.
Where capture is refused, a run falls back to ``kernel`` and says so in one line."""
STAMP_HELP = (
    "what gives a chunk its time: capture (the arrival of its TCP segment, from a packet socket; needs "
    "CAP_NET_RAW, not TLS; else kernel, said in one line), kernel (the kernel's receive stamp of its read) or "
    "recv (when its read returned)"
)

DEFAULT_SEED: int = DEFAULTS["seed"]


def rates_text(rates: Iterable[float]) -> str:
    """``(1.0, 2.5)`` -> ``1,2.5``: how a rate list is written on a command line and in a form."""
    return ",".join(f"{r:g}" for r in rates)


def check_rate(value: float, option: str) -> float:
    """A rate is a finite number of requests per second above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise OptionError(f"{option}: every rate must be a positive number of req/s, got {value:g}"
                          if isinstance(value, (int, float)) else f"{option}: {value!r} is not a number")  # fmt: skip
    return float(value)


AUTO = 0
"""``--processes auto`` (and ``--truth-workers auto``) as a count: sized per run from the expected chunk rate
and this host's calibration (:mod:`tailgate.load.hostcapacity`)."""


def parse_processes(text: str, option: str = "--processes") -> int:
    """``auto`` -> :data:`AUTO` (0), else a count of at least 1."""
    if str(text).strip().lower() == "auto":
        return AUTO
    try:
        n = int(str(text).strip())
    except ValueError:
        raise OptionError(f"{option}: a count or auto, got {text!r}") from None
    if n < 1:
        raise OptionError(f"{option}: must be at least 1 (or auto), got {n}")
    return n


def parse_rates(text: str, option: str = "--rates", *, allow_none: bool = False) -> tuple[float, ...]:
    """Comma-separated rates; ``none`` (when allowed) is an empty tuple: a cell the user turned off."""
    if allow_none and str(text).strip().lower() == "none":
        return ()
    rates = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            raise OptionError(f"{option}: {part!r} is not a number") from None
        if not (math.isfinite(rate) and rate > 0):
            raise OptionError(f"{option}: every rate must be a positive number of req/s, got {part}")
        rates.append(rate)
    if not rates:
        raise OptionError(f"{option}: give at least one rate, e.g. {option} 1,5,10,20")
    seen: set[str] = set()
    for rate in rates:
        label = f"{rate:g}"
        if label in seen:
            # each stage's files are named by its rate: a repeat would overwrite the earlier stage's results
            raise OptionError(f"{option}: {label} req/s appears twice; each rate is one stage "
                              "(to repeat a rate, run again into another --results-dir)")  # fmt: skip
        seen.add(label)
    return tuple(rates)


def check_counts(n: int, warmup: int, *, what: str = "measured requests", ordered: bool = True) -> None:
    """The measured count and the warm-up: at least one measured request, and (``ordered``) no fewer than the
    warm-up, so a percentile is never taken over fewer requests than were thrown away."""
    if warmup < 0:
        raise OptionError(f"--warmup: must be 0 or more, got {warmup}")
    if n < 1:
        raise OptionError(f"--n: must be at least 1 {what[:-1] if what.endswith('s') else what}, got {n}")
    if ordered and n < warmup:
        raise OptionError(f"--n: {n} {what} is fewer than the {warmup} warm-up requests")
