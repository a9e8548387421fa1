"""The fitted step loop in the report's SLO section: its table cell and its curve on the p99 chart, both labelled a
model estimate (the figures come from ``result.fitted`` in ``slo.json``, written by :mod:`tailgate.slo.replay`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import charts


def _rate(v: float) -> str:
    return f"{v:g}"


def fitted_cell(fitted: Mapping[str, Any]) -> str:
    br = fitted.get("bracket")
    if fitted.get("usable") and br:
        return f"[{_rate(br[0])}, {_rate(br[1])}] ({(br[1] - br[0]) / br[0]:.0%})" if br[0] else f"[0, {_rate(br[1])}]"
    return "not used: " + str(fitted["why"]) if fitted.get("why") else "–"


def fitted_curves(ax: Any, state: Mapping[str, Any], metric: str, names: Sequence[str]) -> None:
    """The fitted step loop's simulated p99 against rate with its band, per configuration: dash-dot, labelled a
    model, drawn only over the rates the probes spanned (the rest is extrapolation)."""
    for c in state.get("configs", []):
        fitted = (c.get("result") or {}).get("fitted") or {}
        rates = [float(p["rate"]) for p in c.get("probes", [])]
        pts = [(float(row["rate"]), row[metric]) for row in fitted.get("curve") or [] if row.get(metric)]
        pts = [(x, b) for x, b in pts if rates and min(rates) * 0.9 <= x <= max(rates) * 1.1]
        if len(pts) < 2:
            continue
        color = charts.config_color(c["name"], names)
        _interval_and_confirmations(ax, c, fitted, metric, color)
        xs = [x for x, _ in pts]
        ax.fill_between(xs, [b[1] for _, b in pts], [b[2] for _, b in pts], color=color, alpha=0.12, gid="model")
        ax.plot(xs, [b[0] for _, b in pts], color=color, ls="-.", lw=1.2, gid="model",
                label=f"{c['name']} (fitted step loop, model)")  # fmt: skip


def _interval_and_confirmations(ax: Any, config: Mapping[str, Any], fitted: Mapping[str, Any], metric: str,
                                color: str) -> None:  # fmt: skip
    """The model's capacity interval as a shaded span (its capacity a line), and a square around each
    confirmation probe: the probes that tested the model after its fit."""
    low, high = (fitted.get("interval") or [None, None])[:2]
    cap = fitted.get("capacity")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and isinstance(cap, (int, float)):
        ax.axvspan(low, high, color=color, alpha=0.07, lw=0, gid="model")
        ax.axvline(cap, color=color, ls="-.", lw=0.8, alpha=0.8, gid="model")
    tested = {float(t["rate"]) for t in (fitted.get("confirmation") or {}).get("probes", [])}
    points = [(float(p["rate"]), p.get("p99", {}).get(metric)) for p in config.get("probes", [])
              if float(p["rate"]) in tested]  # fmt: skip
    points = [(x, float(y)) for x, y in points if isinstance(y, (int, float))]
    if points:
        ax.plot([x for x, _ in points], [y for _, y in points], marker="s", ms=13, mfc="none", mew=1.2,
                color=color, ls="none", gid="model", label=f"{config['name']} confirmation probe")  # fmt: skip
