"""``report/`` for a results folder: table, charts, diagnosis and one self-contained HTML page.

The page embeds its charts as base64 PNG and has no external references, so it can be mailed,
archived next to the raw JSON, or opened from disk on a machine without network access.
"""

from __future__ import annotations

import base64
import json
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from tailgate.arms import OPEN_LOOP
from tailgate.jsontypes import JsonMapping, json_opt_object
from tailgate.resultfiles import DIAGNOSIS, REPORT_DIR, REPORT_HTML
from tailgate.runmeta import RunStatus
from tailgate.serverconfigs import engine_default, preempting

from . import charts
from .accounting import COLUMNS as ACCOUNTING
from .accounting import account
from .diagnosis import diagnose
from .diagnosistypes import Finding
from .diagnosisview import findings_context, interval_note
from .glossary import NO_INTERVAL_ID, glossary_context
from .html import render
from .pauses import PAUSE_COLUMNS, cell_pauses
from .prometheus import NONE, ServerData, collect_server_data
from .runfolders import RunDir, find_run_dirs, load_records, load_summaries, rate_text, usable_cpus
from .table import choose_decision_rate, summary_table, table_context, write_table
from .tableview import NOT_A_MEASUREMENT, PARTIAL, cell_marks

PARALLEL_CHART_RECORDS = 200_000
"""From this many records, charts are drawn in parallel processes."""


@dataclass
class Analysis:
    """Everything loaded and derived from one results folder, as frames."""

    results_dir: Path
    runs: list[RunDir]
    summaries: pd.DataFrame
    records: pd.DataFrame
    server: ServerData
    table: pd.DataFrame
    decision_rate: float | None
    notes: list[str] = field(default_factory=list)


@dataclass
class ReportPaths:
    out_dir: Path
    html: Path
    table_md: Path
    table_csv: Path
    diagnosis_json: Path
    charts: dict[str, list[Path]]
    """Chart name (``chart1``, ``chart2``, ``chart3``, ``chart3_preempt``) -> [png, svg]."""
    series_csv: list[Path] = field(default_factory=list)
    """``prometheus-series.csv`` files written next to the runs in this build."""
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return str(self.html)


def analyze(
    results_dir: str | Path,
    prometheus_url: str | None = None,
    decision_rate: float | None = None,
    *,
    save_series: bool = True,
) -> Analysis:
    """Load a results folder and line up every source; raises :class:`ResultsError` on bad input."""
    root = Path(results_dir)
    runs = find_run_dirs(root)
    records = load_records(runs)
    summaries = load_summaries(runs)
    # where every planned request went, from the send journal and the records (not the summaries' word)
    summaries[list(ACCOUNTING)] = account(summaries, records, runs)
    summaries[list(PAUSE_COLUMNS)] = cell_pauses(summaries, records)  # the server's shared pauses, per cell
    server = collect_server_data(runs, summaries, prometheus_url, save=save_series)
    table = summary_table(summaries, server.preemptions)
    rate = choose_decision_rate(table, decision_rate)
    notes = list(server.notes)
    notes += _data_notes(runs, summaries, records, table)
    return Analysis(root, runs, summaries, records, server, table, rate, notes)


LAG_WARN_MS = 10.0
"""Above this schedule lag p99 the generator was starved: the numbers describe an overloaded client."""


def short_stage_notes(summaries: pd.DataFrame) -> list[str]:
    """One line under the table for each stage that did not run as planned (``ran_short`` in its summary)."""
    if "ran_short" not in summaries.columns:
        return []
    notes = []
    for _, row in summaries.loc[summaries["ran_short"].map(lambda v: v is True)].iterrows():
        notes.append(
            f"{row['cell']}: ran short of its plan: {_count(row.get('never_sent'))} never sent, "
            f"{_count(row.get('lost_in_flight'))} lost in flight of {_count(row.get('planned'))} planned"
            + (" (reconciled with a worker that came back)" if row.get("reconciled") is True else "")
        )
    return notes


def _count(value: Any) -> str:
    try:
        return str(int(value))
    except (TypeError, ValueError):
        return "?"


def coordinator_gone(meta: JsonMapping) -> bool:
    """A run marked ``running`` whose coordinating process no longer exists (killed, host rebooted): it will
    never finish. Only knowable on the host that ran it; elsewhere the run is taken as still running."""
    import os
    import platform

    pid = meta.get("pid")
    if meta.get("load_host") != platform.node() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def stamp_notes(name: str, meta: JsonMapping) -> list[str]:
    """What stamped the run's chunks when it was not the kernel's receive stamp, and why it fell back if so
    (run.json: the ``--chunk-stamp`` asked for, each load process's note)."""
    asked = (json_opt_object(meta, "options") or {}).get("chunk_stamp")
    fallbacks = sorted({str(note) for note in (json_opt_object(meta, "chunk_stamp_notes") or {}).values()})
    notes = [f"{name}: chunk stamps: {note}" for note in fallbacks]
    if asked and asked != "kernel" and not fallbacks:
        notes.append(f"{name}: chunks stamped by {asked} (--chunk-stamp {asked})")
    return notes


def capture_notes(summaries: pd.DataFrame) -> list[str]:
    """Cells whose packet capture dropped segments or could not account for a stream."""
    notes = []
    for col, what in (
        ("capture_drops", "segment(s) dropped by the packet capture"),
        ("capture_missed_streams", "stream(s) the capture could not account for (kernel stamps kept)"),
    ):
        counts = pd.to_numeric(summaries.get(col, pd.Series(dtype=float)), errors="coerce")
        notes += [f"{summaries.loc[i, 'cell']}: {int(counts[i])} {what}" for i in counts[counts > 0].index]
    return notes


def _data_notes(
    runs: Sequence[RunDir], summaries: pd.DataFrame, records: pd.DataFrame, table: pd.DataFrame
) -> list[str]:
    notes = []
    for name, bad in (records.attrs.get("unreadable_by_run") or {}).items():
        if bad:
            notes.append(f"{name}: {bad} record line(s) unreadable (cut off when a load generator stopped)")
    for name, lost in (records.attrs.get("lost_in_flight_by_run") or {}).items():
        if lost:
            notes.append(f"{name}: {lost} request(s) sent but never recorded: lost in flight (send journal)")
    for run in runs:
        status = run.meta.get("status")
        state = RunStatus.of(status)
        if state is RunStatus.RUNNING and coordinator_gone(run.meta):
            notes.append(
                f"{run.name}: run.json status is 'running' but its coordinator died mid-run (process "
                f"{run.meta.get('pid')} on {run.meta.get('load_host')} is gone); stages without a summary "
                "are computed from the records, workers' unreported files included"
            )
        elif status and state is not RunStatus.COMPLETED:
            notes.append(f"{run.name}: run.json status is {status!r}")
        if not run.meta:
            notes.append(f"{run.name}: no run.json; configuration taken from the summaries")
        notes += stamp_notes(run.name, run.meta)
    derived = summaries.loc[summaries.get("summary_source", pd.Series(dtype=str)) == "records", "cell"].tolist()
    if derived:
        notes.append("summaries recomputed from records (no summary file): " + ", ".join(derived))
    notes += short_stage_notes(summaries)
    notes += capture_notes(summaries)
    with_errors = table.loc[pd.to_numeric(table["errors"], errors="coerce").fillna(0) > 0]
    for _, row in with_errors.iterrows():
        by_class = summaries.loc[summaries["cell"] == row["cell"], "errors_by_class"]
        detail = ""
        if len(by_class) and isinstance(by_class.iloc[0], Mapping):
            detail = " (" + ", ".join(f"{k} {v}" for k, v in by_class.iloc[0].items()) + ")"
        notes.append(f"{row['cell']}: {int(row['errors'])} failed request(s){detail}, excluded from percentiles")
    reset = summaries.get("preemption_counter_reset", pd.Series(dtype=object)).map(lambda v: v is True)
    for _, row in summaries.loc[reset.reindex(summaries.index, fill_value=False)].iterrows():
        notes.append(
            f"{row['cell']}: preemption counter reset during the stage ({row['preemptions_before']:g} -> "
            f"{row['preemptions_after']:g}, server restarted?): its delta over the stage is unknown"
        )
    lag = pd.to_numeric(summaries.get("schedule_lag_p99", pd.Series(dtype=float)), errors="coerce")
    behind = summaries.loc[lag > LAG_WARN_MS]
    if len(behind):
        worst = ", ".join(f"{c} {v:g} ms" for c, v in zip(behind["cell"], lag[behind.index], strict=True))
        if "processes_to_keep_up" in behind:
            need = pd.to_numeric(behind["processes_to_keep_up"], errors="coerce")
            worst += "; load processes that would have kept up: " + ", ".join(
                f"{c} {int(v)}" for c, v in zip(behind["cell"], need, strict=True) if v == v
            )
        notes.append(
            f"the load generator fell behind its schedule (schedule lag p99 above {LAG_WARN_MS:g} ms: {worst}): "
            "it lacked CPU, so arrivals were late and the client's own timestamps may be late too; the "
            "*_from_intended figures include the lag. Give the generator its own cores or more --processes."
        )
    for d in table.to_dict("records"):
        marks = cell_marks(d)
        if NOT_A_MEASUREMENT in marks:
            notes.append(
                f"{d['cell']}: not a measurement: the client merged chunks in {_count(d['client_coalesced_streams'])} "
                "of its streams, so its worst-gap figures describe the load generator (the table's key says more)"
            )
        if PARTIAL in marks:
            notes.append(f"{d['cell']}: partial: the stage was stopped before its end")
    warning = summaries.get("prefix_cache_warning", pd.Series(None, index=summaries.index, dtype=object))
    cached = summaries.loc[warning.map(lambda v: isinstance(v, str) and len(v) > 0).astype(bool).to_numpy()]
    if len(cached):
        notes.append(f"{', '.join(map(str, cached['cell']))}: {cached['prefix_cache_warning'].iloc[0]}")
    diff_max = summaries.get("prompt_tokens_diff_max", pd.Series(np.nan, index=summaries.index))
    mismatched = summaries.loc[(pd.to_numeric(diff_max, errors="coerce") > 0).to_numpy()]
    for _, row in mismatched.iterrows():
        notes.append(
            f"{row['cell']}: the server counted prompt lengths other than planned in "
            f"{int(row['prompt_tokens_checked']) - int(row['prompt_tokens_exact'])} of "
            f"{int(row['prompt_tokens_checked'])} requests (largest difference {row['prompt_tokens_diff_max']:g} "
            "tokens): the seed's filler is one token per word only for some tokenizers; --prompts unique "
            "builds exact lengths"
        )
    for _, row in table.loc[table["preemptions_disagree"].fillna(False).astype(bool)].iterrows():
        notes.append(
            f"{row['cell']}: preemption sources disagree: Prometheus {row['preemptions_prometheus']:g}, "
            f"direct {row['preemptions_direct']:g}"
        )
    return notes


def _chart3_cells(table: pd.DataFrame, rate: float | None) -> list[tuple[str, pd.Series]]:
    """The default-config cell at the decision rate, and the preemption cell when there is one."""
    plain = table.loc[~table["cell"].astype(str).str.contains("~")]
    cont = plain.loc[plain["arm"].isin(OPEN_LOOP)]

    def nearest(d: pd.DataFrame) -> pd.Series | None:
        if d.empty:
            return None
        if rate is None:
            return d.sort_values("rate_or_batch").iloc[-1]
        dist = (d["rate_or_batch"].astype(float) - rate).abs()
        return d.loc[dist.sort_values(kind="stable").index[0]]

    preempts = cont["config"].map(preempting).astype(bool)
    main = nearest(cont.loc[cont["config"].map(engine_default).astype(bool)])
    if main is None:
        main = nearest(cont.loc[~preempts])
    pre = nearest(cont.loc[preempts])
    out = []
    if main is not None:
        out.append(("chart3", main))
    if pre is not None:
        out.append(("chart3_preempt" if out else "chart3", pre))
    if not out and len(plain):
        out.append(("chart3", plain.iloc[0]))
    return out


_JOBS: list[tuple[str, Callable[[], list[Path]]]] = []
"""Chart jobs for forked workers, which inherit them instead of receiving pickled frames."""


def _run_job(i: int) -> list[Path]:
    return _JOBS[i][1]()


def _chart_jobs(analysis: Analysis, out: Path) -> list[tuple[str, Callable[[], list[Path]]]]:
    table = analysis.table.copy()
    jobs: list[tuple[str, Callable[[], list[Path]]]] = [("chart1", partial(charts.chart1, table, out))]
    if analysis.decision_rate is not None:
        jobs.append(("chart2", partial(charts.chart2, table, analysis.decision_rate, out)))
    windows = analysis.summaries[["run_dir", "stage", "window_start_s", "window_end_s"]]
    full = table.drop(columns=["window_start_s", "window_end_s"], errors="ignore").merge(
        windows, on=["run_dir", "stage"], how="left"
    )
    for name, row in _chart3_cells(full, analysis.decision_rate):
        run = str(row["run_dir"])
        series = analysis.server.series
        series = series.loc[series["run_dir"] == run] if len(series) else None
        source = analysis.server.sources.get(run, NONE)
        jobs.append((name, partial(charts.chart3, analysis.records, series, row, out, name, series_source=source)))
    return jobs


def draw_charts(analysis: Analysis, out_dir: str | Path) -> dict[str, list[Path]]:
    """All charts of an analysis; chart 2 needs a decision rate, so it is skipped without one.

    With many records the per-request charts dominate, and each chart is independent: they are
    drawn in forked processes, one per CPU, when the parent is single-threaded (where forking
    is safe).
    """
    global _JOBS
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = _chart_jobs(analysis, out)
    workers = min(len(jobs), usable_cpus())
    parallel = (
        len(analysis.records) >= PARALLEL_CHART_RECORDS
        and workers > 1
        and "fork" in mp.get_all_start_methods()
        and threading.active_count() == 1
    )
    if not parallel:
        return {name: job() for name, job in jobs}
    _JOBS = jobs
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
            done = list(pool.map(_run_job, range(len(jobs))))
    finally:
        _JOBS = []
    return {name: paths for (name, _), paths in zip(jobs, done, strict=True)}


# ---------------------------------------------------------------------------------------------
# HTML


CAPTIONS = {
    "chart1": (
        "Chart 1. TTFT p99 (left) and worst inter-chunk gap p99 (right) against arrival rate, continuous "
        "cells only, one line per server configuration (the preemption cell is in chart 3 and the table). A hollow "
        "marker is a cell that is not a measurement or is partial; † marks prefix-cache hits (the key says why)."
    ),
    "chart2": (
        "Chart 2. p99 TTFT, worst gap and total at the decision rate: continuous with chunked prefill on, "
        "the same with it off, and gated admission. Hatched bars are a cell that is not a measurement or is partial, "
        "named under its bars."
    ),
    "chart3": (
        "Chart 3. Every request of one stage: its worst gap at its arrival (dots, coloured by prompt size) "
        "and where that gap ended (crosses); dashed lines are long-prompt arrivals, shaded intervals are "
        "where the preemption counter rose; below, the server's running/waiting requests, KV-cache usage "
        "and preemption increments on the same time axis. Orange rings are streams the client merged: their gap is "
        "the client's, not the server's."
    ),
}


def _object(value: object) -> JsonMapping:
    """A run.json member that should be an object; a missing or malformed one reads as empty."""
    return value if isinstance(value, Mapping) else {}


class RunFacts(TypedDict):
    """One run as the page's "Runs" section lists it: its facts, and run.json as written."""

    name: str
    facts: list[tuple[str, str]]
    raw: str


def _run_facts(run: RunDir) -> RunFacts:
    m = run.meta
    trace, versions, server = (_object(m.get(key)) for key in ("trace", "versions", "server"))
    rows = [
        ("run dir", run.name),
        ("run id", m.get("run_id")),
        ("arm", m.get("arm")),
        ("config", m.get("config")),
        ("status", m.get("status")),
        ("host", m.get("host")),
        ("model", m.get("model")),
        ("server version", server.get("version")),
        ("started", m.get("started")),
        ("ended", m.get("ended")),
        ("prometheus url", m.get("prometheus_url")),
        ("metrics url", m.get("metrics_url")),
        ("trace", ", ".join(f"{k} {trace.get(k)}" for k in ("seed", "warmup", "n", "source") if k in trace)),
        ("mix", ", ".join(f"{k}: {v}" for k, v in _object(trace.get("mix")).items())),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
    ]
    return {
        "name": run.name,
        "facts": [(k, str(v)) for k, v in rows if v not in (None, "")],
        "raw": json.dumps(m, indent=1, default=str) if m else "no run.json",
    }


def _figures(chart_paths: Mapping[str, Sequence[Path]]) -> list[dict[str, str]]:
    figures = []
    for name, paths in chart_paths.items():
        png = next((p for p in paths if p.suffix == ".png"), None)
        if png is None:
            continue
        caption = CAPTIONS.get(name.split("_")[0], "")
        if name == "chart3_preempt":
            caption = "Chart 3 (preemption cell). " + caption.split(". ", 1)[1]
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        figures.append({"name": name, "png_base64": data, "caption": caption})
    return figures


def render_report_html(
    analysis: Analysis,
    chart_paths: Mapping[str, Sequence[Path]],
    findings: Sequence[Finding],
    extra_sections: Sequence[str] = (),
) -> str:
    """The whole self-contained page (charts embedded), from ``templates/report.html.j2``."""
    a = analysis
    html: str = render(
        "report.html.j2",
        title=a.results_dir.name,
        results_dir=str(a.results_dir),
        n_runs=len(a.runs),
        n_cells=len(a.table),
        rate="none" if a.decision_rate is None else f"{rate_text(a.decision_rate)} req/s",
        sources=", ".join(sorted(set(a.table["preemptions_source"].dropna().astype(str)))),
        generated=time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        notes=list(a.notes),
        table=table_context(a.table),
        figures=_figures(chart_paths),
        findings=findings_context(findings),
        interval_note=interval_note(findings),
        interval_id=NO_INTERVAL_ID,
        glossary=glossary_context(),
        terms={t["key"]: t for t in glossary_context()},
        runs=[_run_facts(r) for r in a.runs],
        extra_sections=list(extra_sections),
    )
    return html


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, Path):
        return str(x)
    return str(x)


def build_report(
    results_dir: str | Path,
    out_dir: str | Path | None = None,
    prometheus_url: str | None = None,
    decision_rate: float | None = None,
) -> ReportPaths:
    """Write ``report/`` (or ``out_dir``) for a results folder and return where everything went."""
    analysis = analyze(results_dir, prometheus_url, decision_rate)
    out = Path(out_dir) if out_dir is not None else analysis.results_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path = write_table(analysis.table, out)
    chart_paths = draw_charts(analysis, out)
    findings = diagnose(
        analysis.summaries,
        analysis.records,
        analysis.server.series,
        preemptions=analysis.server.preemptions,
        run_meta={r.name: r.meta for r in analysis.runs},
        decision_rate=analysis.decision_rate,
    )
    diag = out / DIAGNOSIS
    diag.write_text(
        json.dumps(
            {
                "results": str(analysis.results_dir),
                "decision_rate": analysis.decision_rate,
                "series_sources": analysis.server.sources,
                "notes": analysis.notes,
                "findings": findings,
            },
            indent=1,
            default=_json_default,
        )
        + "\n",
        encoding="utf-8",
    )
    from .slo import slo_section

    slo = slo_section(analysis.results_dir, analysis.records, out)  # None unless `tailgate slo` wrote slo.json
    if slo is not None:
        chart_paths = {**chart_paths, **slo.charts}
    html_path = out / REPORT_HTML
    sections = [slo.html] if slo is not None else []
    html_path.write_text(render_report_html(analysis, chart_paths, findings, sections), encoding="utf-8")
    return ReportPaths(out, html_path, md, csv_path, diag, chart_paths, list(analysis.server.saved), analysis.notes)
