"""``--processes auto``: the chunk rate a run expects, and Locust's own ``--processes`` taking ``auto``.

A load process is given a chunk rate it times exactly on this host (:mod:`tailgate.load.hostcapacity`), so
``auto`` needs the chunk rate a run will ask for: arrivals per second times chunks per arrival for an open-loop
arm (the seeded mix's mean output, or a ``--trace-file``'s), a batch times a stream's decode rate for a gated
one. ``tailgate suite`` and ``tailgate slo`` ask per cell or probe; ``locust -f locustfiles/...`` (and
``tailgate locust``) take ``--processes auto`` through :func:`accept_auto`, sized from the run's own options
before Locust forks its processes.

Free of gevent: the suite's command line imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tailgate.load.processes import auto_processes
from tailgate.load.workload import SEED_MIX, TraceError, load_jsonl

GATED_STREAM_CHUNKS_PER_S = 100.0
"""Chunks per second one stream of a gated batch is assumed to receive (a fast GPU's decode rate), for
``--processes auto``."""
GATED_LOCUSTFILE = "gated.py"
"""The gated arm's locustfile: its runs start a batch at once (every other locustfile is open-loop)."""


def mean_output_tokens() -> float:
    """Expected max_tokens of one request of the seeded mix: the chunks one arrival brings."""
    mean, low = 0.0, 0.0
    for cumulative, _, out in SEED_MIX:
        mean += (cumulative - low) * out
        low = cumulative
    return mean


def mean_trace_output_tokens(path: str) -> float | None:
    """Mean max_tokens of a user trace: what ``auto`` sizes from when the run sends that trace, not the mix."""
    try:
        items = load_jsonl(path)
    except (TraceError, OSError):
        return None  # Locust's own validation names the problem in one line
    return sum(i.max_tokens for i in items) / len(items) if items else None


def expected_chunks_per_s(open_loop: bool, value: float, trace_file: str | None = None) -> float:
    """The chunk rate of a stage: ``value`` arrivals per second (open loop) or a batch of ``value`` streams."""
    if not open_loop:
        return value * GATED_STREAM_CHUNKS_PER_S
    per_arrival = (mean_trace_output_tokens(trace_file) if trace_file else None) or mean_output_tokens()
    return value * per_arrival


def _count_or_auto(text: str) -> int | str:
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a count or auto, got {text!r}") from None


def locust_processes(opts: Any) -> int | None:
    """Locust's ``--processes`` for ``auto``: from the run's highest rate (or its batch) and this host's capacity;
    None (one process, no fork) when one is enough."""
    from tailgate.load.rxstamp import chunk_stamp_mode
    from tailgate.optiontable import parse_rates

    if getattr(opts, "worker", False):
        raise ValueError("--processes auto: a worker cannot size itself (the master holds the plan); give a count")
    open_loop = Path(str(getattr(opts, "locustfile", "") or "")).name != GATED_LOCUSTFILE
    if open_loop:
        value = max(parse_rates(str(opts.rates)))
    else:
        value = float(opts.batch_size)
    chunks = expected_chunks_per_s(open_loop, value, getattr(opts, "trace_file", None) or None)
    count = auto_processes(chunks, stamp=getattr(opts, "chunk_stamp", None) or chunk_stamp_mode())
    print(f"tailgate: --processes auto: {count} load process(es) for {chunks:,.0f} chunks/s", file=sys.stderr)
    return count if count > 1 else None


def accept_auto(parser: Any) -> None:
    """Let Locust's own ``--processes`` take ``auto``, resolved once the whole command line is parsed (Locust forks
    right after, so the count must be a number by then)."""
    action = next((a for a in parser._actions if "--processes" in a.option_strings), None)
    if action is None:
        return
    action.type = _count_or_auto
    action.help = (action.help or "") + " tailgate: or auto, from the run's highest rate and this host's calibration."
    parse_args = parser.parse_args

    def parse_then_size(*args: Any, **kwargs: Any) -> Any:
        opts = parse_args(*args, **kwargs)
        if getattr(opts, "processes", None) == "auto":
            try:
                opts.processes = locust_processes(opts)
            except ValueError as e:  # OptionError included: one line, exit 2
                parser.exit(2, f"locust: error: {e}\n")
        return opts

    parser.parse_args = parse_then_size


__all__ = [
    "GATED_STREAM_CHUNKS_PER_S", "accept_auto", "expected_chunks_per_s", "locust_processes", "mean_output_tokens",
    "mean_trace_output_tokens",
]  # fmt: skip
