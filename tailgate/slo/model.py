"""A model of a percentile against the arrival rate, fitted to the probes measured so far: where to probe next,
and a labelled estimate of the capacity that the measured bracket is not.

The form is the heavy-traffic shape of a queue's wait: ``p(rate) = base + scale * rate / (mu - rate)`` for a
rate under the saturation rate ``mu`` (the wait of an M/M/1 queue scales as rho / (1 - rho); many-server and
batching servers keep the pole at their saturation rate and differ in how steeply they approach it). ``mu`` is
searched on a grid between the highest rate the server sustained and the lowest it did not; ``base`` and
``scale`` are then a weighted least-squares fit on relative error. The fit is checked against every measured
probe: a model whose prediction falls outside a probe's own interval says so, and nothing here ever decides
a verdict or an end of the bracket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from tailgate.jsontypes import JsonObject

if TYPE_CHECKING:
    from tailgate.slo.state import ProbeEntry

GRID = 200
"""Saturation rates tried between the bounds the probes set."""
INFORMED = 0.25
"""A model is fitted only once a probe reached this share of the limit (or one was not sustained)."""


@dataclass
class Point:
    """One probe as the model sees it: its rate, the measured percentile and its interval (ms), sustained or not."""

    rate: float
    value: float | None
    low: float | None = None
    high: float | None = None
    sustained: bool = True


@dataclass(frozen=True, slots=True)
class Residual:
    """One probe against the fitted model: whether the model's percentile at its rate lies in its interval."""

    rate: float
    measured: float | None
    low: float | None
    high: float | None
    model: float | None
    """The model's percentile at this rate, ms (None: at or past the saturation rate)."""
    inside: bool | None
    """None when the probe has no interval to check against."""

    def to_json(self) -> JsonObject:
        return {"rate": self.rate, "measured": self.measured, "interval": [self.low, self.high], "model": self.model,
                "inside": self.inside}  # fmt: skip


@dataclass
class RateModel:
    """The fitted model, with what the probes say about it. Every figure here is a model statement."""

    mu: float
    base: float
    scale: float
    limit: float
    capacity: float | None
    """The rate at which the model's percentile reaches the limit (None: the limit is under ``base``)."""
    consistent: int
    checked: int
    """Probes whose interval holds the model's prediction, of the probes with an interval."""
    residuals: list[Residual] = field(default_factory=list)
    key: str = ""
    """The limit modelled (``ttft_p99``...)."""

    def predict(self, rate: float) -> float:
        return math.inf if rate >= self.mu else self.base + self.scale * rate / (self.mu - rate)

    def as_dict(self) -> JsonObject:
        """The model as ``slo.json`` keeps it: every field in order, floats to 4 places, residual rows as JSON."""
        figures = {f.name: getattr(self, f.name) for f in fields(self)}
        figures["residuals"] = [r.to_json() for r in self.residuals]
        return {"form": "base + scale * rate / (mu - rate)", "label": "model estimate, not a measurement",
                **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}}  # fmt: skip


def fit(points: Sequence[Point], limit: float) -> RateModel | None:
    """The model through the measured points (None: fewer than three rates with a value, or nothing fits)."""
    valued = [p for p in points if p.value is not None and p.value > 0 and p.sustained]
    if len({p.rate for p in valued}) < 3:
        return None
    if max(float(p.value) for p in valued) < INFORMED * limit and all(p.sustained for p in points):  # type: ignore[arg-type]
        return None  # every probe far below the limit: the curve's bend, and so the capacity, is not in the data
    top_sustained = max(p.rate for p in valued)
    unsustained = [p.rate for p in points if not p.sustained and p.rate > top_sustained]
    mu_hi = min(unsustained) if unsustained else 4.0 * top_sustained
    best: tuple[float, float, float, float] | None = None
    for i in range(1, GRID + 1):
        mu = top_sustained + (mu_hi - top_sustained) * (i / GRID) ** 2  # denser near the highest sustained rate
        if mu <= top_sustained:
            continue
        xs = [p.rate / (mu - p.rate) for p in valued]
        ys = [float(p.value) for p in valued]  # type: ignore[arg-type]
        ws = [1.0 / (y * y) for y in ys]  # relative error: a 10 ms miss at 50 ms weighs as 100 ms at 500 ms
        sw = sum(ws)
        mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
        my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
        sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
        if sxx <= 0:
            continue
        scale = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx
        base = my - scale * mx
        if scale <= 0 or base < 0:
            continue
        sse = sum(w * (y - base - scale * x) ** 2 for w, x, y in zip(ws, xs, ys, strict=True))
        if best is None or sse < best[0]:
            best = (sse, mu, base, scale)
    if best is None:
        return None
    _, mu, base, scale = best
    capacity = mu * (limit - base) / (limit - base + scale) if limit > base else None
    model = RateModel(mu, base, scale, limit, capacity, 0, 0)
    for p in points:
        pred = model.predict(p.rate)
        inside = None
        if p.low is not None or p.high is not None:
            inside = (p.low is None or pred >= p.low) and (p.high is None or pred <= p.high)
            model.checked += 1
            model.consistent += bool(inside)
        model.residuals.append(Residual(p.rate, p.value, p.low, p.high, None if math.isinf(pred) else round(pred, 1),
                                        inside))  # fmt: skip
    return model


def points_of(probes: Sequence[ProbeEntry], key: str) -> list[Point]:
    """The latest probe of each rate as model points for the limit ``key`` (its check's point and interval)."""
    latest = {float(p.rate): p for p in probes}
    out = []
    for rate, p in sorted(latest.items()):
        c = p.check(key)
        sustain = p.check("sustained")
        if c is None:
            continue
        # a sample that fell behind leaves the rate's verdict open but is no point on a curve of a steady state:
        # it bounds the saturation rate as a failure does
        kept_up = sustain is None or (sustain.verdict != "fail" and not sustain.over)
        out.append(Point(rate, c.point, c.low, c.high, kept_up))
    return out


def binding_model(probes: Sequence[ProbeEntry], limits: Mapping[str, float]) -> RateModel | None:
    """The model of the limit with the lowest modelled capacity: the one that binds, by the model."""
    models = []
    for key, lim in limits.items():
        m = fit(points_of(probes, key), lim)
        if m is not None:
            m.key = key
            models.append(m)
    with_cap = [m for m in models if m.capacity is not None]
    return min(with_cap, key=lambda m: m.capacity or 0.0) if with_cap else None
