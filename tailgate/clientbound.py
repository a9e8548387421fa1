"""When the load generator's own timing error is too large for its figures to describe the server.

One rule, shared by everything that says so: ``tailgate selfcheck`` (which knows the true server times
and so can judge the error figures themselves), the console's ``CLIENT BEHIND`` line after each stage,
the web UI's Tail latency tab and the report's table (which know only the client's records, so they
judge what those show: streams whose chunks a late read merged). A figure is judged against a stated
bound and printed beside it, so a reader sees how close a pass was.

The bounds are the issue's targets for a busy 2-core host: a worst gap off by more than 1 ms at the
99th percentile, or 5 ms in any stream, is a gap the generator made; so is a TTFT off by 1 ms at p99.
One merged stream is already a stream whose gaps describe the client, so its bound is 0.

Free of gevent, Locust and pandas: the load path, the web UI and the analysis all import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tailgate.jsontypes import JsonObject

WORST_GAP_P99 = "worst_gap_error_p99_ms"
WORST_GAP_MAX = "worst_gap_error_max_ms"
TTFT_P99 = "ttft_error_p99_ms"
CHUNK_P99 = "chunk_error_p99_ms"
MERGED = "merged_streams"


@dataclass(frozen=True, slots=True)
class Bound:
    """One figure and the most it may be while the generator still measures the server."""

    key: str
    label: str
    limit: float
    unit: str
    """``ms`` or ``streams``: how the figure and its bound are printed."""

    def show(self, value: float) -> str:
        return f"{value:.3f} ms" if self.unit == "ms" else f"{value:g} {self.unit}"


BOUNDS: tuple[Bound, ...] = (
    Bound(WORST_GAP_P99, "worst-gap error p99", 1.0, "ms"),
    Bound(WORST_GAP_MAX, "worst-gap error max", 5.0, "ms"),
    Bound(TTFT_P99, "TTFT error p99", 1.0, "ms"),
    Bound(CHUNK_P99, "chunk error p99", 1.0, "ms"),
    Bound(MERGED, "merged streams", 0, "streams"),
)
"""Every bound, in the order they are printed."""
DEFAULT_LIMITS: dict[str, float] = {b.key: b.limit for b in BOUNDS}


@dataclass(frozen=True, slots=True)
class Finding:
    """A figure against its bound; a figure that could not be measured (no streams) is not judged."""

    bound: Bound
    value: float | None

    @property
    def breached(self) -> bool:
        return self.value is not None and self.value > self.bound.limit

    def to_dict(self) -> JsonObject:
        b = self.bound
        return {"key": b.key, "label": b.label, "value": self.value, "limit": b.limit, "unit": b.unit,
                "breached": self.breached, "text": self.text()}  # fmt: skip

    def text(self) -> str:
        b = self.bound
        if self.value is None:
            return f"{b.label}: - (bound {b.show(b.limit)}): not measured"
        return f"{b.label}: {b.show(self.value)} (bound {b.show(b.limit)}): {'BREACHED' if self.breached else 'ok'}"


def judge(figures: Mapping[str, float | int | None], limits: Mapping[str, float] | None = None) -> list[Finding]:
    """Each bound whose figure is in ``figures``, in :data:`BOUNDS` order; ``limits`` overrides bounds by key."""
    out = []
    for b in BOUNDS:
        if b.key not in figures:
            continue
        if limits and b.key in limits:
            b = Bound(b.key, b.label, float(limits[b.key]), b.unit)
        value = figures[b.key]
        out.append(Finding(b, None if value is None else float(value)))
    return out


def breached(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if f.breached]


def merged_breached(merged: int | float | None) -> bool:
    """The records' side of the rule: streams whose chunks a late read merged, against :data:`MERGED`'s bound."""
    return any(f.breached for f in judge({MERGED: merged}))


def behind_note(merged: int | float | None) -> str:
    """The tab's and report's short mark for a stage the rule finds the client behind in; '' when it is not."""
    return f"{merged:g} (gaps show the client)" if merged is not None and merged_breached(merged) else ""


__all__ = [
    "BOUNDS", "CHUNK_P99", "DEFAULT_LIMITS", "MERGED", "TTFT_P99", "WORST_GAP_MAX", "WORST_GAP_P99", "Bound",
    "Finding", "behind_note", "breached", "judge", "merged_breached",
]  # fmt: skip
