"""The fitted step loop in the report's SLO section: its table cell and its curve on the p99 chart, both labelled a
model estimate (the figures come from ``result.fitted`` in ``slo.json``, written by :mod:`tailgate.slo.replay`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tailgate.postprocess import charts


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
        xs = [x for x, _ in pts]
        ax.fill_between(xs, [b[1] for _, b in pts], [b[2] for _, b in pts], color=color, alpha=0.12, gid="model")
        ax.plot(xs, [b[0] for _, b in pts], color=color, ls="-.", lw=1.2, gid="model",
                label=f"{c['name']} (fitted step loop, model)")  # fmt: skip
