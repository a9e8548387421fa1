"""Arrival processes beside Poisson: gamma gaps with a burstiness factor, and replayed production traces.

Each yields absolute offsets for the same open-loop dispatcher that runs Poisson stages, so the
only thing that changes between processes is when requests are due. Poisson itself stays in
:mod:`tailgate.load.plan`, drawn exactly as the reference harness draws it.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

ARRIVALS = ("poisson", "gamma", "trace")


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
