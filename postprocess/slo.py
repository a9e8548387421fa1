"""The SLO search in the report: table, two charts, the mechanism that binds, and a recommendation.

``tailgate slo`` leaves ``slo.json`` (the SLO, every probe with its verdict and intervals, each
configuration's server command) next to ordinary run folders, one per probe attempt. This module
reads it and, for the probe where each configuration's SLO broke, looks for the same evidence the
diagnosis uses for the seed's questions: the preemption counter (preemption), the server's waiting
queue and TTFT growing faster than the gaps (admission queueing), and worst gaps lining up with
other requests' long prefills (prefill insertion). A highest rate is only ever a rate whose probe
*passed*: its whole interval was under every limit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from tailgate.contracts import ContractError
from tailgate.jsontypes import JsonMapping, json_list, json_object
from tailgate.resultfiles import SLO_ANALYSIS
from tailgate.resultfiles import SLO_META as SLO_FILE
from tailgate.runmeta import SloMeta
from tailgate.slo.answer import bracket_text, check_text
from tailgate.slo.result import SearchResult

from . import charts
from .html import render
from .runfolders import ResultsError
from .slofitted import fitted_cell, fitted_curves
from .slomechanism import METRICS, Mechanism, MechanismEvidence, mechanism, probe_at
from .slomechanism import num as _num
from .slomechanism import rate_text as _rate

METRIC_NAMES = {"ttft": "TTFT", "gap": "worst gap", "total": "total"}
STATUS_TEXT = {
    "bracketed": "bracketed to the resolution",
    "settled": "the fitted model, checked against every probe, met the resolution first (model estimate)",
    "max_rate": "met at the highest rate probed (the capacity may be higher)",
    "below_min": "not met even at the lowest rate probed",
    "probe_limit": "probe count spent before the bracket met the resolution (the bracket so far)",
    "time_budget": "time budget spent before the bracket met the resolution (the bracket so far)",
    "unresolved": "the bracket is wider than the resolution: the rates inside it had not enough data",
}
"""Every status a search ends with, in words (``unresolved``: written by searches before the current rules)."""


class SloRow(TypedDict):
    """One configuration's line of the SLO table, as ``slo_analysis.json`` and ``templates/slo.html.j2`` carry
    it; the objects (``p99``, ``checks``, ``model``, ``fitted``) are slo.json's, as the search wrote them."""

    config: str
    flags: str
    flags_applied: bool | None
    command: str | None
    best_rate: float | None
    first_fail_rate: float | None
    status: str | None
    p99: JsonMapping
    checks: dict[str, JsonMapping]
    binding: str | None
    mechanism: str
    mechanism_text: str
    evidence: MechanismEvidence
    probes: int
    attempts: int
    seeds: list[int]
    uncertain: list[float]
    undecided_detail: list[JsonMapping]
    model: JsonMapping
    fitted: JsonMapping
    bracket_text: str
    busy_attempts: int
    others_busy_cores_max: float | None


@dataclass
class SloSection:
    html: Markup
    table_md: Path
    json_path: Path
    charts: dict[str, list[Path]] = field(default_factory=dict)
    rows: list[SloRow] = field(default_factory=list)
    recommendation: str = ""


def load_slo(results_dir: str | Path) -> JsonMapping | None:
    """``slo.json`` of a results folder; None when the folder is not an SLO search."""
    path = Path(results_dir) / SLO_FILE
    if not path.is_file():
        return None
    try:
        doc = SloMeta.read(path).to_dict()
    except ContractError as e:
        raise ResultsError(str(e)) from None
    return doc if isinstance(doc.get("configs"), list) else None


def _ms(x: Any) -> str:
    v = _num(x)
    return "–" if v is None else f"{v:,.1f}"


def slo_rows(state: Mapping[str, Any], records: pd.DataFrame | None = None) -> list[SloRow]:
    """One row per configuration: the highest rate meeting the SLO, its p99s, the binding limit, the mechanism."""
    frame = records if records is not None else pd.DataFrame()
    rows: list[SloRow] = []
    for c in state.get("configs", []):
        r = c.get("result") or {}
        best = probe_at(c, r.get("best_rate"))
        server = c.get("server") or {}
        command = server.get("command")
        mech: Mechanism = (
            mechanism(c, frame) if r else {"mechanism": "–", "text": "search not finished", "evidence": {}}
        )
        rows.append({
            "config": c["name"],
            "flags": " ".join(c.get("flags") or []) or "(defaults)",
            "flags_applied": server.get("flags_applied"),
            "command": " ".join(map(str, command)) if isinstance(command, list) else command,
            "best_rate": r.get("best_rate"),
            "first_fail_rate": r.get("first_fail_rate"),
            "status": r.get("status") or c.get("status"),
            "p99": (best or {}).get("p99", {}),
            "checks": {ch["key"]: ch for ch in (best or {}).get("checks", [])},
            "binding": r.get("binding"),
            "mechanism": mech["mechanism"],
            "mechanism_text": mech["text"],
            "evidence": mech["evidence"],
            "probes": len(c.get("probes", [])),
            "attempts": sum(len(p.get("attempts", [])) for p in c.get("probes", [])),
            "seeds": _seeds(c),
            "uncertain": (r.get("not_enough_data_rates") or r.get("uncertain_rates")) or [],
            "undecided_detail": r.get("undecided") or [],
            "model": r.get("model") or {},
            "fitted": r.get("fitted") or {},
            "bracket_text": bracket_text(SearchResult.from_json(r)) if r else "search not finished",
            "busy_attempts": r.get("busy_attempts") or 0, "others_busy_cores_max": r.get("others_busy_cores_max"),
        })  # fmt: skip
    return rows


HEADERS = ("configuration", "flags", "highest rate meeting the SLO (req/s)", "lowest failing rate above it",
           "bracket width",
           "TTFT p99 there (ms)", "worst-gap p99 there (ms)", "total p99 there (ms)", "binding limit",
           "mechanism at the limit", "probes (attempts)", "not enough data at",
           "narrowed by the fitted step loop (model estimate)")  # fmt: skip


def _best_text(row: SloRow) -> str:
    if row["best_rate"] is None:
        return "none"
    return f"≥ {_rate(row['best_rate'])}" if row["status"] == "max_rate" else _rate(row["best_rate"])


def _width_text(row: SloRow) -> str:
    lo, hi = _num(row["best_rate"]), _num(row["first_fail_rate"])
    if hi is None:
        return "open (nothing above failed)" if row["status"] != "max_rate" else "open (at the highest rate)"
    if lo is None:
        return f"[0, {_rate(hi)}]"
    return f"{hi - lo:g} req/s ({(hi - lo) / lo:.0%})" if lo > 0 else f"{hi - lo:g} req/s"


def _seeds(config: Mapping[str, Any]) -> list[int]:
    """The workload seeds a configuration's attempts ran (re-runs repeat one; extensions add others)."""
    return sorted({a["seed"] for p in config.get("probes", []) for a in p.get("attempts", [])
                   if isinstance(a.get("seed"), int)})  # fmt: skip


def _probes_text(row: SloRow) -> str:
    """Probes (attempts), and the workload seeds when extensions drew more than one: pooled samples of
    several seeds are reported as such."""
    seeds = row.get("seeds") or []
    extra = f"; seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return f"{row['probes']} ({row['attempts']}{extra})"


def _cells(row: SloRow) -> list[str]:
    return [
        row["config"], row["flags"], _best_text(row), _rate(row["first_fail_rate"]), _width_text(row),
        _ms(row["p99"].get("ttft")), _ms(row["p99"].get("gap")), _ms(row["p99"].get("total")),
        row["binding"] or "–", row["mechanism"], _probes_text(row),
        ", ".join(_rate(u) for u in row["uncertain"]) or "–", fitted_cell(row.get("fitted") or {}),
    ]  # fmt: skip


def table_markdown(rows: Sequence[SloRow], slo: str) -> str:
    lines = [f"SLO: `{slo}` (TTFT and total from the intended send). p99s at the highest passing rate.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]  # fmt: skip
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _bracket(row: SloRow) -> tuple[float, float] | None:
    """The interval the configuration's capacity lies in, or None when the search did not close it."""
    best, fail = _num(row["best_rate"]), _num(row["first_fail_rate"])
    if row["status"] == "max_rate" and best is not None:
        return best, math.inf
    if best is None and fail is not None and row["status"] == "below_min":
        return 0.0, fail
    if best is None or fail is None:
        return None
    return best, fail


def _bracket_text(row: SloRow) -> str:
    b = _bracket(row)
    if b is None:
        lo = "none" if row["best_rate"] is None else _rate(row["best_rate"])
        return f"{row['config']}: passes up to {lo} req/s, no failing rate above it (the bracket is open)"
    hi = "above the highest rate probed" if math.isinf(b[1]) else f"{_rate(b[1])}"
    return f"{row['config']}: [{_rate(b[0])}, {hi}] req/s"


def recommendation(rows: Sequence[SloRow], slo: str) -> str:
    """Which configuration to run, and what limits it, in one paragraph; or why the data cannot say; and whether
    the machine was busy beside a server on it while it was measured."""
    busy = [r for r in rows if r.get("busy_attempts")]
    if not busy:
        return _ranking(rows, slo)
    most = max(r.get("others_busy_cores_max") or 0.0 for r in busy)
    return (f"{_ranking(rows, slo)} The machine was busy during {sum(r['busy_attempts'] for r in busy)} attempt(s) "
            f"of {', '.join(r['config'] for r in busy)}: other processes took up to {most:.1f} core(s) beside a "
            "server on it, which has only what they leave it, so those capacities may read low; search again on "
            "a quiet machine.")  # fmt: skip


def _ranking(rows: Sequence[SloRow], slo: str) -> str:
    """Which configuration to run, and what limits it, in one paragraph; or why the data cannot say.

    A configuration is named only when its capacity bracket lies wholly above every other's: brackets
    that overlap, or a search that never closed one, do not rank (the difference is not resolved at
    this n, however the passing rates compare)."""
    if not any(r["best_rate"] is not None for r in rows):
        if not any(r["first_fail_rate"] is not None for r in rows):
            undecided = "; ".join(f"{r['config']} at {', '.join(_rate(u) for u in r['uncertain']) or 'no rate'}"
                                  for r in rows)  # fmt: skip
            return (f"No answer at this n: no probe passed or failed {slo} ({undecided} req/s: not enough data, "
                    "the tail bound needs more requests than the probes held). Run longer probes (--duration, --n) "
                    "before comparing configurations.")  # fmt: skip
        return f"No configuration met {slo} at any rate probed; the binding limits and mechanisms are in the table."
    brackets = {r["config"]: _bracket(r) for r in rows}
    shown = "; ".join(_bracket_text(r) for r in rows)
    if len(rows) > 1:
        open_ = [r["config"] for r in rows if brackets[r["config"]] is None]
        lows = sorted(rows, key=lambda r: -(brackets[r["config"]] or (0.0, 0.0))[0])
        top = lows[0]
        tb = brackets[top["config"]]
        clear = (
            tb is not None
            and not open_
            and all((brackets[r["config"]] or (0.0, math.inf))[1] <= tb[0] for r in rows if r is not top)
        )
        if not clear:
            why = f"{', '.join(open_)} did not close a bracket" if open_ else "their capacity brackets overlap"
            return (f"Not distinguishable at this n; run longer (more requests per probe, or a finer --resolution "
                    f"where the brackets meet): {why}. Capacity brackets under {slo}: {shown}.")  # fmt: skip
    else:
        top = rows[0]
        tb = brackets[top["config"]]
    reach = (
        f"at every rate probed, up to {_rate(top['best_rate'])} req/s (the capacity may be higher)"
        if top["status"] == "max_rate"
        else f"up to {_rate(top['best_rate'])} req/s"
    )
    text = f"Run {top['config']} ({top['flags']}): it met {slo} {reach}. "
    if len(rows) > 1:
        text += f"Its capacity bracket lies above every other configuration's ({shown}). "
    if top["first_fail_rate"] is not None:
        text += (f"At {_rate(top['first_fail_rate'])} req/s the binding limit is "
                 f"{top['binding'] or 'the SLO'}; mechanism: {top['mechanism']} "
                 f"({top['mechanism_text']}). ")  # fmt: skip
    if tb is None:
        text += "Its own capacity is not bracketed: no rate above the passing one failed; run longer there."
    elif not math.isinf(tb[1]):
        text += f"The capacity lies between {_rate(tb[0])} and {_rate(tb[1])} req/s."
    return text.strip()


# --------------------------------------------------------------------------------------------- charts


def chart_feasible(rows: Sequence[SloRow], out_dir: Path, name: str = "slo_rate") -> list[Path]:
    """Highest rate meeting the SLO per configuration, with the first failing rate as a whisker."""
    names = [r["config"] for r in rows]
    fig = Figure(figsize=(8, 0.6 * len(rows) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(rows))
    for i, r in enumerate(rows):
        best = _num(r["best_rate"]) or 0.0
        color = charts.config_color(r["config"], names)
        ax.barh(i, best, color=color, hatch="//" if r["status"] == "max_rate" else None, alpha=0.85)
        fail = _num(r["first_fail_rate"])
        if fail is not None:
            ax.plot([best, fail], [i, i], color="#333333", lw=1)
            ax.plot([fail], [i], marker="|", color="#a02020", ms=14, mew=2)
        label = f"{_best_text(r)} req/s" + (f" · {r['binding']} · {r['mechanism']}" if r["binding"] else "")
        ax.text(max(best, fail or 0) * 1.02 + 0.01, i, label, va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    xmax = max([_num(r["first_fail_rate"]) or _num(r["best_rate"]) or 1.0 for r in rows] or [1.0])
    ax.set_xlim(0, xmax * 1.6)
    ax.set_xlabel("Poisson arrival rate (req/s): bar = highest passing probe, red tick = lowest failing probe above it")
    ax.set_title("SLO-feasible rate per server configuration")
    ax.grid(axis="x", alpha=0.3)
    return cast("list[Path]", charts._save(fig, out_dir, name))


def chart_p99(state: Mapping[str, Any], out_dir: Path, name: str = "slo_p99") -> list[Path]:
    """Each p99 against rate per configuration, with its interval and the SLO's limit."""
    all_limits = state.get("plan", {}).get("limits", [])
    limits = {lim["metric"]: lim for lim in all_limits if lim["metric"] in METRICS}
    shown = [m for m in METRICS if m in limits] + [m for m in METRICS if m not in limits]
    errors = next((lim for lim in all_limits if lim["metric"] == "errors"), None)
    if errors is not None:
        shown.append("errors")
    fig = Figure(figsize=(5 * len(shown), 4.2), layout="constrained")
    axes = fig.subplots(1, len(shown), squeeze=False)[0]
    names = [c["name"] for c in state.get("configs", [])]
    for ax, metric in zip(axes, shown, strict=True):
        if metric == "errors":
            _errors_panel(ax, state, errors or {}, names)
            continue
        lim = limits.get(metric)
        drawn: list[float] = [lim["limit"]] if lim else []
        key = lim["key"] if lim else None
        for c in state.get("configs", []):
            probes = sorted(c.get("probes", []), key=lambda p: p["rate"])
            if not probes:
                continue
            color = charts.config_color(c["name"], names)
            xs = [p["rate"] for p in probes]
            ys = [_num(p.get("p99", {}).get(metric)) for p in probes]
            drawn += [v for v in ys if v is not None]
            ax.plot(xs, [np.nan if v is None else v for v in ys], color=color, lw=1, alpha=0.7, label=c["name"])
            for p, v in zip(probes, ys, strict=True):
                if v is None:
                    continue
                ch = next((x for x in p.get("checks", []) if x["key"] == key), None) if key else None
                if ch and ch.get("point") is not None and (ch.get("low") is not None or ch.get("high") is not None):
                    pt = float(ch["point"])
                    low = pt if ch.get("low") is None else float(ch["low"])
                    if ch.get("high") is None:
                        # no upper bound exists at this n: an arrow up from the point, not a bar that looks closed
                        ax.annotate("", xy=(p["rate"], pt * 1.6), xytext=(p["rate"], pt),
                                    arrowprops={"arrowstyle": "->", "color": color, "lw": 1})  # fmt: skip
                        high = pt
                    else:
                        high = float(ch["high"])
                    ax.errorbar([p["rate"]], [pt], yerr=[[pt - low], [high - pt]], color=color, capsize=3, lw=1)
                marker = {"pass": "o", "fail": "X", "not_enough_data": "D", "uncertain": "D"}.get(p["verdict"], "o")
                face = "none" if p["verdict"] in ("not_enough_data", "uncertain") else color
                ax.plot([p["rate"]], [v], marker=marker, color=color, mfc=face, ms=7, ls="none")
        if key:
            _model_curves(ax, state, key, names)
        fitted_curves(ax, state, metric, names)
        if lim:
            ax.axhline(lim["limit"], color="#a02020", ls="--", lw=1)
            ax.text(0.01, lim["limit"], f" limit {lim['limit']:g} ms", color="#a02020", fontsize=8, va="bottom",
                    transform=ax.get_yaxis_transform())  # fmt: skip
        if charts._wide(drawn):
            charts._log_y(ax)
        _rate_axis(ax)
        ax.set_ylabel(f"{METRIC_NAMES[metric]} p99 (ms)" + (" from intended send" if metric != "gap" else ""))
        ax.set_title(f"{METRIC_NAMES[metric]} p99" + ("" if lim else " (no limit)"))
    axes[0].legend(fontsize=8, title="o pass · X fail · ◇ not enough data", title_fontsize=8)
    return cast("list[Path]", charts._save(fig, out_dir, name))


def _model_curves(ax: Any, state: Mapping[str, Any], key: str, names: Sequence[str]) -> None:
    """The fitted model of this limit against rate, per configuration: dotted, labelled a model, never a measurement."""
    for c in state.get("configs", []):
        model = (c.get("result") or {}).get("model") or {}
        rates = [float(p["rate"]) for p in c.get("probes", [])]
        if model.get("key") != key or not rates or not model.get("mu"):
            continue
        mu, base, scale = float(model["mu"]), float(model["base"]), float(model["scale"])
        xs = np.linspace(min(rates), min(max(rates) * 1.1, mu * 0.97), 60)
        ys = base + scale * xs / (mu - xs)
        ax.plot(
            xs,
            ys,
            color=charts.config_color(c["name"], names),
            ls=":",
            lw=1.2,
            label=f"{c['name']} (model)",
            gid="model",
        )


def _rate_axis(ax: Any) -> None:
    """Log-2 rate axis labelled at the rates that were probed (a bisection's 7.5 sits between powers)."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    ax.set_xscale("log", base=2)
    rates = sorted({round(x, 6) for line in ax.get_lines() if line.get_gid() != "model"
                    for x in line.get_xdata() if x > 0})  # fmt: skip
    if rates:
        ax.xaxis.set_major_locator(FixedLocator(rates))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(charts.FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_xlabel("arrival rate (req/s)")
    ax.grid(alpha=0.3)


def _errors_panel(ax: Any, state: Mapping[str, Any], lim: Mapping[str, Any], names: Sequence[str]) -> None:
    """Error rate (errors and dropped arrivals over arrivals) per probe, its Clopper-Pearson bounds, the limit."""
    for c in state.get("configs", []):
        probes = sorted(c.get("probes", []), key=lambda p: p["rate"])
        color = charts.config_color(c["name"], names)
        pts: list[tuple[Any, Any]] = [
            (p, next((x for x in p.get("checks", []) if x["key"] == "errors"), None)) for p in probes
        ]
        pts = [(p, ch) for p, ch in pts if ch and ch.get("point") is not None]
        if not pts:
            continue
        xs = [p["rate"] for p, _ in pts]
        ys = [100 * ch["point"] for _, ch in pts]
        err = [[y - 100 * ch["low"] for (_, ch), y in zip(pts, ys, strict=True)],
               [100 * ch["high"] - y for (_, ch), y in zip(pts, ys, strict=True)]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=err, color=color, marker="o", capsize=3, lw=1, label=c["name"])
    ax.axhline(100 * float(lim.get("limit", 0)), color="#a02020", ls="--", lw=1)
    _rate_axis(ax)
    ax.set_ylabel("errors + dropped arrivals (% of arrivals)")
    ax.set_title("error rate (Clopper-Pearson bounds)")


# ---------------------------------------------------------------------------------------------- build


def slo_section(results_dir: str | Path, records: pd.DataFrame | None, out_dir: str | Path) -> SloSection | None:
    """Write ``slo_table.md``, ``slo.json`` (analysed) and the two charts; return the HTML section, or None."""
    state = load_slo(results_dir)
    if state is None:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = slo_rows(state, records)
    plan = json_object(state, "plan", {}, where=SLO_FILE)
    slo = str(plan.get("slo", ""))
    md = out / "slo_table.md"
    rec = recommendation(rows, slo)
    md.write_text(table_markdown(rows, slo) + "\n" + rec + "\n", encoding="utf-8")
    paths = {"slo_rate": chart_feasible(rows, out), "slo_p99": chart_p99(state, out)}
    js = out / SLO_ANALYSIS
    js.write_text(json.dumps({"slo": slo, "recommendation": rec, "rows": rows}, indent=1, default=str) + "\n")
    import base64

    figures = [
        {"name": n, "png_base64": base64.b64encode(p[0].read_bytes()).decode("ascii"), "caption": cap}
        for n, p, cap in (
            ("slo_rate", paths["slo_rate"], "Highest Poisson rate whose probe passed the SLO (every interval under "
             "its limit), and the lowest rate above it that failed. Hatched: passed at the highest rate probed."),
            ("slo_p99", paths["slo_p99"], "Each p99 against rate per configuration (the probe's pooled attempts). "
             "Where the SLO limits it, the bar is the anytime-valid distribution-free confidence interval of the "
             "p99 (order statistics, counts shrunk by the design effect); an arrow up: no upper bound exists at "
             "that n. o pass, X fail, hollow ◇ not enough data; the dashed line is the limit. Dotted: the model "
             "base + scale·rate/(saturation − rate) fitted to the probes, a model estimate and not a measurement "
             "(its fit to each probe's interval is in slo.json). Dash-dot with a shaded band: the step loop "
             "fitted to the server's own streams, simulated at each rate (the band: the jackknife over its "
             "replicates), also a model estimate; the shaded span is its capacity interval (the dash-dot line its "
             "capacity) and a square marks each confirmation probe, run after the fit to test it."),
        )
    ]  # fmt: skip
    html = render(
        "slo.html.j2",
        slo=slo,
        plan=plan,
        recommendation=rec,
        headers=HEADERS,
        rows=[{"cells": _cells(r), "row": r} for r in rows],
        figures=figures,
        configs=json_list(state, "configs", [], where=SLO_FILE),
        status_text=STATUS_TEXT,
        check_text=check_text,
    )
    return SloSection(Markup(html), md, js, paths, rows, rec)
