"""The seed's three charts, saved as PNG and SVG.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot state), so charts
can be drawn from any thread and never need a display. Per-request scatters are rasterized
inside the SVG: a million vector markers would make a file no browser opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
from matplotlib.transforms import blended_transform_factory

from tailgate.arms import OPEN_LOOP, STARTS_TOGETHER, is_open_loop
from tailgate.serverconfigs import CHUNKED_PAIR, configuration, engine_default, preempting

from .prompts import long_prompt_threshold
from .runfolders import rate_text
from .tableview import CACHE_HITS, cell_marks, not_measured

EXTRA_COLORS = ("#2ca02c", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
METRIC_COLORS = {"ttft": "#4c72b0", "gap": "#dd8452", "total": "#55a868"}
RASTERIZE_ABOVE = 2000
"""Scatter sizes above which markers are rasterized in the SVG."""
LOG_RATIO = 20.0
"""Use a log y axis when a panel's largest value is this many times its smallest."""
DPI = 110
HOLLOW_LABEL = "hollow marker: not a measurement or partial (the table's key says why)"
CACHE_LABEL = "†: prefix-cache hits ≥ 10% of prompt tokens"
MARK_COLOR = "#c77c02"


def config_color(config: str, seen: Sequence[str] = ()) -> str:
    known = configuration(config)
    if known is not None:
        return known.color
    others = sorted(c for c in seen if configuration(c) is None)
    i = others.index(config) if config in others else 0
    return EXTRA_COLORS[i % len(EXTRA_COLORS)]


def config_label(config: str) -> str:
    known = configuration(config)
    return config if known is None else known.label


def _save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    fig.savefig(paths[0], dpi=DPI)
    # the layout solved for the PNG holds for the SVG: solving it again costs as much as drawing
    fig.set_layout_engine("none")
    fig.savefig(paths[1])
    return paths


def _wide(values: Sequence[float] | np.ndarray) -> bool:
    v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    wide: bool = v.size > 1 and v.max() / v.min() >= LOG_RATIO
    return wide


def _plain_number(v: float, _pos: int) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:g}"


def _log_y(ax: Axes) -> None:
    """Log scale with plain tick labels: 200 ms reads faster than 2×10²."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------------------------------------
# chart 1


def _plain(table: pd.DataFrame) -> pd.DataFrame:
    """Cells measured once; a repeat (``~2``) would zig-zag a line."""
    return table.loc[~table["cell"].astype(str).str.contains("~", regex=False)]


def chart1(table: pd.DataFrame, out_dir: str | Path, name: str = "chart1") -> list[Path]:
    """TTFT p99 and worst-gap p99 against arrival rate, one line per server configuration.

    Continuous cells only (the gated arm has no arrival rate), and without the preemption cell,
    whose seconds-long stalls would flatten the on/off comparison this chart exists for; chart 3
    and the table show it. Left is "time to start talking", right is "stutter while talking".
    """
    cont = _plain(table)
    cont = cont.loc[cont["arm"].isin(OPEN_LOOP) & ~cont["config"].map(preempting).astype(bool)]
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    configs = list(dict.fromkeys(cont["config"]))
    marked = cache_seen = False
    panels = (
        (axes[0], "ttft_p99", "TTFT p99: time to first token"),
        (axes[1], "gap_p99", "worst-gap p99: longest stall inside a stream"),
    )
    for ax, col, title in panels:
        ax.set_title(title, fontsize=10)
        if cont.empty:
            _empty(ax, "no continuous cells")
            continue
        for k, config in enumerate(configs):
            d = cont.loc[cont["config"] == config].sort_values("rate_or_batch")
            color = config_color(config, configs)
            known = configuration(config)
            marker, style = (known.marker, known.line) if known is not None else ("^", "-.")
            ax.plot(
                d["rate_or_batch"],
                d[col],
                marker=marker,
                linestyle=style,
                color=color,
                linewidth=2,
                markersize=6,
                label=config_label(config),
            )
            rows = d.to_dict("records")
            hollow = np.array([not_measured(r) for r in rows], dtype=bool)
            if hollow.any():  # the line still passes through, but the point says it is no measurement
                ax.plot(d["rate_or_batch"].to_numpy()[hollow], d[col].to_numpy()[hollow], marker=marker,
                        linestyle="none", markersize=9, markerfacecolor="white", markeredgecolor=color,
                        markeredgewidth=2, zorder=4)  # fmt: skip
                marked = True
            for x, y, r in zip(d["rate_or_batch"], d[col], rows, strict=True):
                if pd.notna(y):
                    cached = CACHE_HITS in cell_marks(r)
                    cache_seen = cache_seen or cached
                    # alternate above/below so equal values of two configs stay readable
                    dy = 8 if k % 2 == 0 else -14
                    ax.annotate(
                        f"{y:.0f}" + ("†" if cached else ""),
                        (x, y),
                        textcoords="offset points",
                        xytext=(0, dy),
                        ha="center",
                        fontsize=8,
                        color=color,
                    )
        values = cont[col].to_numpy(dtype=float)
        if _wide(values):
            _log_y(ax)
            ax.set_ylabel("p99 (ms, log scale)")
        else:
            top = float(np.nanmax(values)) if np.isfinite(values).any() else 1.0
            ax.set_ylim(bottom=0, top=top * 1.2)
            ax.set_ylabel("p99 (ms)")
        rates = sorted(cont["rate_or_batch"].dropna().unique())
        ax.set_xticks(rates)
        ax.set_xticklabels([rate_text(r) for r in rates])
        ax.set_xlabel("arrival rate (requests/s, open-loop Poisson)")
        ax.grid(True, alpha=0.3)
    handles, _ = axes[0].get_legend_handles_labels()
    if marked:
        handles.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor="#555555",
                              markeredgewidth=2, label=HOLLOW_LABEL))  # fmt: skip
    if cache_seen:
        handles.append(Line2D([], [], linestyle="none", label=CACHE_LABEL))
    if handles:  # below both panels, where it covers no point
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 3), fontsize=8)
    n = cont["n"].dropna()
    n_text = f"n = {int(n.min())}–{int(n.max())} per cell" if len(n) and n.min() != n.max() else ""
    if len(n) and not n_text:
        n_text = f"n = {int(n.min())} per cell"
    title = "Chart 1 · tail latency against load, continuous batching"
    fig.suptitle(title + (f"  ({n_text})" if n_text else ""), fontsize=11)
    return _save(fig, Path(out_dir), name)


# ---------------------------------------------------------------------------------------------
# chart 2


def chart2_cells(table: pd.DataFrame, decision_rate: float) -> list[tuple[str, pd.Series | None]]:
    """The three contenders: continuous default, continuous chunked-off, gated (B=16 if present)."""
    plain = _plain(table)
    cont = plain["arm"].isin(OPEN_LOOP)
    at_rate = np.isclose(plain["rate_or_batch"].astype(float), float(decision_rate))
    rate = rate_text(decision_rate)

    def pick(mask: pd.Series) -> pd.Series | None:
        d = plain.loc[mask]
        return d.iloc[0] if len(d) else None

    out: list[tuple[str, pd.Series | None]] = [
        (f"continuous, chunked {'on' if c.chunked_prefill else 'off'}\n{rate} req/s",
         pick(cont & at_rate & (plain["config"] == c.name)))
        for c in CHUNKED_PAIR
    ]  # fmt: skip
    gated = plain.loc[plain["arm"].isin(STARTS_TOGETHER)]
    if len(gated):
        on_default = gated["config"].map(engine_default).astype(bool)
        pref = gated.loc[on_default] if on_default.any() else gated
        b16 = pref.loc[np.isclose(pref["rate_or_batch"].astype(float), 16.0)]
        row = b16.iloc[0] if len(b16) else pref.sort_values("rate_or_batch").iloc[-1]
        out.append((f"gated, B={rate_text(row['rate_or_batch'])}\n(static stand-in)", row))
    else:
        out.append(("gated\n(not measured)", None))
    return out


def chart2(table: pd.DataFrame, decision_rate: float, out_dir: str | Path, name: str = "chart2") -> list[Path]:
    """p99 bars per contender at the decision rate: who pays at the door, who pays mid-stream."""
    cells = chart2_cells(table, decision_rate)
    metrics = (
        ("ttft_p99", "TTFT p99", "ttft"),
        ("gap_p99", "worst gap p99", "gap"),
        ("total_p99", "total p99", "total"),
    )
    fig = Figure(figsize=(10, 5.2), layout="constrained")
    ax = fig.subplots()
    width = 0.26
    x = np.arange(len(cells))
    values: list[float] = []
    for j, (col, label, key) in enumerate(metrics):
        ys = [float(row[col]) if row is not None and pd.notna(row[col]) else np.nan for _, row in cells]
        values += ys
        bars = ax.bar(x + (j - 1) * width, np.nan_to_num(ys, nan=0.0), width, label=label, color=METRIC_COLORS[key])
        for rect, (_, row) in zip(bars, cells, strict=True):
            if row is not None and not_measured(row.to_dict()):  # hatched: a figure of the client, not the server
                rect.set_hatch("//")
                rect.set_edgecolor(MARK_COLOR)
                rect.set_alpha(0.6)
        for rect, y in zip(bars, ys, strict=True):
            if np.isfinite(y):
                ax.annotate(
                    f"{y:,.0f}",
                    (rect.get_x() + rect.get_width() / 2, y),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    below = blended_transform_factory(ax.transData, ax.transAxes)
    for i, (_, row) in enumerate(cells):
        if row is None:
            ax.text(i, 0.5, "not measured", transform=below, ha="center", va="center", color="#888888")
        else:
            marks = cell_marks(row.to_dict())
            text = f"{row['cell']}, n={int(row['n'])}" + "".join(f"\n{m}" for m in marks)
            ax.text(i, -0.17, text, transform=below, ha="center", va="top", fontsize=8,
                    color=MARK_COLOR if not_measured(row.to_dict()) else "#555555")  # fmt: skip
    ax.set_xticks(x)
    ax.set_xticklabels([lab for lab, _ in cells])
    if _wide(values):
        _log_y(ax)
        ax.set_ylabel("p99 latency (ms, log scale)")
    else:
        ax.set_ylabel("p99 latency (ms)")
    ax.grid(True, axis="y", alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if any(row is not None and not_measured(row.to_dict()) for _, row in cells):
        handles.append(Patch(facecolor="white", edgecolor=MARK_COLOR, hatch="//", label="not a measurement / partial"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9)  # beside the bars, never on them
    ax.set_title(f"Chart 2 · p99 at the decision point ({rate_text(decision_rate)} req/s) against gated admission")
    return _save(fig, Path(out_dir), name)


# ---------------------------------------------------------------------------------------------
# chart 3

PROMPT_PALETTE = ("#4c72b0", "#dd8452", "#c44e52", "#8172b2", "#937860", "#da8bc3")
MAX_LIFELINES = 5000
MAX_SPANS = 500
MAX_SERIES_POINTS = 1500


def _stage_records(records: pd.DataFrame, stage: pd.Series) -> pd.DataFrame:
    rec = records
    if "run_dir" in rec.columns and "run_dir" in stage.index:
        rec = rec.loc[rec["run_dir"] == stage["run_dir"]]
    return rec.loc[rec["stage"] == stage["stage"]]


def _binned(s: pd.DataFrame, t0: float, max_points: int = MAX_SERIES_POINTS) -> tuple[pd.DataFrame, float | None]:
    """Series on at most ``max_points`` time bins: gauges keep each bin's peak, increments their sum.

    A long stage sampled every second has tens of thousands of points, more than a chart has
    pixels; peaks are what the eye should find, so a bin shows its maximum, not its mean.
    Returns the frame (``t`` is each bin's end, seconds from ``t0``) and the bin width (None
    when unbinned).
    """
    tt = s["t"].to_numpy(dtype=float) - t0
    if len(s) <= max_points:
        return s.assign(t=tt), None
    edges = np.linspace(tt.min(), tt.max(), max_points + 1)
    idx = np.clip(np.searchsorted(edges, tt, side="left"), 1, max_points)
    g = s.assign(_bin=idx).groupby("_bin")
    out = g[["running", "waiting", "kv_usage"]].max()
    out["preemptions_inc"] = g["preemptions_inc"].sum(min_count=1)
    out["t"] = edges[out.index.to_numpy()]
    return out.reset_index(drop=True), float(edges[1] - edges[0])


def _server_panels(axes: Sequence[Axes], top: Axes, s: pd.DataFrame, t0: float, t1: float, source: str) -> None:
    s, width = _binned(s, t0)
    tt = s["t"].to_numpy(dtype=float)
    src = f"  [{source}]" if source else ""
    per = f", peak per {width:.0f} s" if width else ""
    a1, a2, a3 = axes
    if s["running"].notna().any() or s["waiting"].notna().any():
        a1.step(tt, s["running"], where="post", color="#4c72b0", label="running")
        a1.step(tt, s["waiting"], where="post", color="#dd8452", label="waiting")
        a1.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, borderaxespad=0)
    else:
        _empty(a1, "no running/waiting series")
    a1.set_ylabel("requests")
    a1.set_title(f"server: requests running / waiting{per}{src}", fontsize=9, loc="left")
    if s["kv_usage"].notna().any():
        kv = s["kv_usage"].to_numpy(dtype=float) * 100.0
        a2.plot(tt, kv, color="#55a868")
        a2.set_ylim(0, max(100.0, float(np.nanmax(kv)) * 1.05))
    else:
        _empty(a2, "no KV usage series")
    a2.set_ylabel("KV cache (%)")
    a2.set_title(f"server: KV cache usage{per}{src}", fontsize=9, loc="left")
    inc = s["preemptions_inc"].to_numpy(dtype=float)
    if np.isfinite(inc).any() and tt.size:
        # an increment read at t happened since the previous read: draw it over that interval
        edges = np.r_[tt[0] - (width or (tt[1] - tt[0] if tt.size > 1 else 1.0)), tt]
        heights = np.nan_to_num(inc, nan=0.0)
        a3.stairs(heights, edges, fill=True, color="#c44e52")
        a3.set_ylim(0, max(1.0, float(heights.max()) * 1.25))
        window = (tt >= 0) & (tt <= t1 - t0 + (width or 1.0))
        total = float(heights[window].sum())
        what = "preemption-counter increments" + (f" per {width:.0f} s" if width else "")
        a3.set_title(f"server: {what} ({total:g} in the stage){src}", fontsize=9, loc="left")
        rose = heights > 0
        if rose.any():
            # one shaded span per run of consecutive intervals in which the counter rose
            padded = np.r_[False, rose, False]
            first = np.flatnonzero(padded[1:-1] & ~padded[:-2])
            last = np.flatnonzero(padded[1:-1] & ~padded[2:])
            spans = [(float(a), float(w)) for a, w in zip(edges[first], edges[last + 1] - edges[first], strict=True)]
            top.broken_barh(spans, (0, 1), transform=top.get_xaxis_transform(), color="#c44e52", alpha=0.09,
                            zorder=0, linewidth=0)  # fmt: skip
    else:
        _empty(a3, "no preemption counter series")
        a3.set_title("server: preemption-counter increments" + src, fontsize=9, loc="left")
    a3.set_ylabel("preemptions")
    for a in axes:
        a.grid(True, alpha=0.3)


def chart3(
    records: pd.DataFrame,
    series: pd.DataFrame | None,
    stage: pd.Series,
    out_dir: str | Path,
    name: str = "chart3",
    series_source: str | None = None,
) -> list[Path]:
    """Per-request view of one stage: each request's worst gap against when it arrived.

    Each request is a dot at its arrival and a cross where its worst gap ended, joined by a faint
    line. Crosses that pile up just after a long-prompt arrival (dashed lines) are prefill
    insertions; crosses after a shaded interval, where the preemption counter rose, are
    preemptions. Warm-up requests are drawn too: stalls do not care about the warm-up rule.
    """
    t0 = float(stage["window_start_s"])
    t1 = float(stage["window_end_s"])
    rec = _stage_records(records, stage)
    ok = rec["error_class"].isna().to_numpy()
    x_arr = rec["sent_s"].to_numpy(dtype=float) - t0
    gap = rec["worst_gap_ms"].to_numpy(dtype=float)
    x_end = rec["worst_gap_end_s"].to_numpy(dtype=float) - t0
    prompt = rec["prompt_tokens_planned"].to_numpy(dtype=float)
    long_min = long_prompt_threshold(rec["prompt_tokens_planned"])
    is_long = prompt >= long_min

    s = None
    if series is not None and len(series):
        s = series.loc[(series["t"] >= t0 - 2) & (series["t"] <= t1 + 2)].sort_values("t")
        s = s if len(s) else None
    ratios = [3.2, 1, 1, 1] if s is not None else [3.2, 0.3]
    fig = Figure(figsize=(12, 9 if s is not None else 6), layout="constrained")
    axes = fig.subplots(len(ratios), 1, sharex=True, gridspec_kw={"height_ratios": ratios})
    ax = axes[0]
    raster = len(rec) > RASTERIZE_ABOVE
    good = ok & np.isfinite(gap) & (gap > 0)
    ends = good & np.isfinite(x_end)
    if ends.sum() <= MAX_LIFELINES:
        ax.hlines(
            gap[ends],
            np.minimum(x_arr[ends], x_end[ends]),
            x_end[ends],
            color="#aaaaaa",
            linewidth=0.7,
            alpha=0.6,
            zorder=1,
            rasterized=raster,
        )
    dot = 16 if not raster else 3
    for k, c in enumerate(sorted(np.unique(prompt[np.isfinite(prompt)]))):
        m = good & (prompt == c)
        ax.scatter(
            x_arr[m],
            gap[m],
            s=dot,
            color=PROMPT_PALETTE[k % len(PROMPT_PALETTE)],
            alpha=0.85,
            zorder=3,
            label=f"arrival, {int(c)}-token prompt",
            rasterized=raster,
        )
    ax.scatter(
        x_end[ends],
        gap[ends],
        s=dot + 4,
        marker="x",
        color="#222222",
        linewidths=0.8,
        alpha=0.75,
        zorder=2,
        label="where its worst gap ended",
        rasterized=raster,
    )
    merged = good & rec.get("client_coalesced", pd.Series(False, index=rec.index)).fillna(False).astype(bool).to_numpy()
    if merged.any():
        label = "stream merged by the client (its gap is the client's)"
        ax.scatter(x_arr[merged], gap[merged], s=dot * 4 + 20, facecolors="none", edgecolors=MARK_COLOR,
                   linewidths=1.2, zorder=4, label=label, rasterized=raster)  # fmt: skip
    long_x = np.sort(x_arr[is_long & np.isfinite(x_arr)])
    if 0 < long_x.size <= MAX_SPANS:
        for a in axes:
            a.vlines(
                long_x,
                0,
                1,
                transform=blended_transform_factory(a.transData, a.transAxes),
                color="#c44e52",
                linestyle="--",
                linewidth=0.9,
                alpha=0.55,
                zorder=0,
            )
    elif long_x.size:  # too many to draw as lines: a rug along the bottom
        ax.plot(
            long_x,
            np.zeros_like(long_x),
            "|",
            color="#c44e52",
            markersize=10,
            transform=blended_transform_factory(ax.transData, ax.transAxes),
            rasterized=True,
        )
    bad = ~ok
    if bad.any():
        ax.scatter(
            x_arr[bad],
            np.full(int(bad.sum()), 0.97),
            marker="v",
            s=45,
            color="#d62728",
            zorder=4,
            transform=blended_transform_factory(ax.transData, ax.transAxes),
            label="failed request (sent here)",
        )
    if _wide(gap[good]):
        _log_y(ax)
        ax.set_ylabel("worst gap (ms, log scale)")
    else:
        ax.set_ylim(bottom=0, top=float(np.nanmax(gap[good])) * 1.12 if good.any() else 1.0)
        ax.set_ylabel("worst gap (ms)")
    handles, _ = ax.get_legend_handles_labels()
    if long_x.size:
        label = f"long-prompt arrival (≥ {int(long_min)} tokens)"
        handles.append(Line2D([], [], color="#c44e52", linestyle="--", label=label))
    if s is not None and np.nansum(s["preemptions_inc"].to_numpy(dtype=float)) > 0:
        handles.append(Patch(color="#c44e52", alpha=0.15, label="preemption counter rose"))
    # beside the plot, not on it: a legend inside the axes hides the tallest stalls, the ones this chart is for
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, borderaxespad=0)
    ax.grid(True, alpha=0.3)
    value = rate_text(stage["rate_or_batch"])
    load = f"{value} req/s" if is_open_loop(stage["arm"]) else f"{stage['arm']}, B={value}"
    warm = stage.get("warmup")
    warm_text = f", incl. {int(warm)} warm-up" if warm is not None and pd.notna(warm) else ""
    what = f"{config_label(str(stage.get('config', '')))}, {load}"
    marks = cell_marks(stage.to_dict())
    ax.set_title(
        f"Chart 3 · every request's worst gap: {stage['cell']} ({what}); "
        f"{len(rec)} requests{warm_text}, {int(bad.sum())} failed" + "".join(f" · {m.upper()}" for m in marks),
        fontsize=10,
        color=MARK_COLOR if not_measured(stage.to_dict()) else "black",
    )
    if s is not None:
        _server_panels(axes[1:], ax, s, t0, t1, series_source or "")
    else:
        note = axes[1]
        note.text(
            0.5,
            0.5,
            "no server series (neither Prometheus nor server-metrics.jsonl)",
            ha="center",
            va="center",
            transform=note.transAxes,
            color="#666666",
        )
        note.set_yticks([])
    axes[-1].set_xlabel("seconds from stage start (first send)")
    right = max(t1 - t0, float(np.nanmax(x_end)) if np.isfinite(x_end).any() else 0.0)
    ax.set_xlim(-0.02 * right - 0.2, right * 1.01 + 0.2)
    return _save(fig, Path(out_dir), name)
