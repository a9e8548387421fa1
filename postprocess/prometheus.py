"""Server-side evidence for each stage: preemption deltas and 1 s time series.

Prometheus, when it scraped the server during the run, is the better witness: it has every
sample of ``vllm:num_preemptions_total`` inside a stage window and per-engine series, so a
counter reset (a server restart) is visible. The load path's own direct ``/metrics`` reads
(before/after each stage, and ``server-metrics.jsonl`` at ~1 Hz) are the fallback. Every
number carries its source, and when both exist both are reported and compared.

Pulled series are saved next to the results (``prometheus-series.csv`` per run) so that a report
built later, without Prometheus, still draws them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from tailgate.jsontypes import json_opt_str
from tailgate.resultfiles import SERVER_METRICS

from .counters import counter_increase, counter_increments, increase_from_increments, summed_increase
from .runfolders import RunDir, read_server_metrics

PROMETHEUS = "prometheus"
DIRECT = "direct_scrape"
NONE = "none"

PREEMPTION_METRIC = "vllm:num_preemptions_total"
PREFIX_QUERIES_METRIC = "vllm:prefix_cache_queries_total"
PREFIX_HITS_METRIC = "vllm:prefix_cache_hits_total"
SERIES_FILE = "prometheus-series.csv"

#: column -> queries tried in order (older vLLM spellings after the current one)
SERIES_QUERIES: dict[str, tuple[str, ...]] = {
    "running": ("sum(vllm:num_requests_running)",),
    "waiting": ("sum(vllm:num_requests_waiting)",),
    "kv_usage": ("sum(vllm:kv_cache_usage_perc)", "sum(vllm:gpu_cache_usage_perc)"),
    "prompt_tokens_rate": ("sum(rate(vllm:prompt_tokens_total[5s]))",),
    "generation_tokens_rate": ("sum(rate(vllm:generation_tokens_total[5s]))",),
    "preemptions_total": (f"sum({PREEMPTION_METRIC})",),
}
SERIES_COLUMNS: tuple[str, ...] = ("t", *SERIES_QUERIES, "preemptions_inc")
MAX_POINTS = 10_000
"""Prometheus refuses range queries of more than 11,000 points per series."""
DISAGREE_TOLERANCE = 0.5
"""Counters count whole events: any difference of one or more is a disagreement."""


def _matrix(result: Any) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """``[(labels, times, values)]`` from a Prometheus matrix result."""
    out = []
    for item in result or []:
        values = item.get("values")
        if values is None and "value" in item:
            values = [item["value"]]
        if not values:
            continue
        arr = np.array([(float(t), _float(v)) for t, v in values], dtype=float)
        out.append((dict(item.get("metric") or {}), arr[:, 0], arr[:, 1]))
    return out


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# ---------------------------------------------------------------------------------------------
# the Prometheus HTTP API through prometheus-api-client


COUNTER_PAD_S = 1.5
"""Seconds added around a stage's direct counter reads: more than one 1 s scrape interval, and
less than the idle time the load path leaves between stages (``--settle``, 2 s)."""


class PrometheusUnavailable(Exception):
    """Prometheus did not answer; the message fits on one line."""


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc)


@dataclass
class PrometheusSource:
    """One Prometheus server, probed once; queries return data or raise with a short reason."""

    url: str
    timeout_s: float = 5.0
    _client: Any = None

    def connect(self) -> PrometheusSource:
        import requests
        from prometheus_api_client import PrometheusConnect
        from prometheus_api_client.exceptions import PrometheusApiClientException
        from urllib3.util.retry import Retry

        # no retries: an unreachable Prometheus must fall back at once, not after back-offs
        self._client = PrometheusConnect(
            url=self.url.rstrip("/"), disable_ssl=True, retry=Retry(total=0), timeout=self.timeout_s
        )
        try:
            self._client.custom_query("vector(1)")
        except (requests.RequestException, PrometheusApiClientException, ValueError, KeyError) as e:
            raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer ({_short(e)})") from None
        return self

    def _query(self, query: str, at: float) -> Any:
        return self._call(lambda c: c.custom_query(query, params={"time": f"{at:.3f}"}))

    def _query_range(self, query: str, start: float, end: float, step: float) -> Any:
        return self._call(lambda c: c.custom_query_range(query, _utc(start), _utc(end), step=f"{step:g}"))

    def _call(self, fn: Any) -> Any:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        if self._client is None:
            self.connect()
        try:
            return fn(self._client)
        except (requests.RequestException, PrometheusApiClientException, ValueError, KeyError) as e:
            raise PrometheusUnavailable(f"query failed at {self.url} ({_short(e)})") from None

    def raw_counter(self, metric: str, start: float, end: float) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every raw sample of every series of ``metric`` in ``[start, end]``.

        A range-vector selector evaluated at ``end`` returns stored samples, not the step-aligned
        values of a range query, so the window edges are exact; a little extra range covers
        Prometheus 3's left-open selectors and the edge filter does the rest.
        """
        width = max(1, math.ceil(end - start) + 2)
        result = self._query(f"{metric}[{width}s]", end)
        out = []
        for _labels, t, v in _matrix(result):
            inside = (t >= start) & (t <= end)
            out.append((t[inside], v[inside]))
        return out

    def preemption_increase(self, start: float, end: float) -> tuple[float | None, str | None]:
        series = self.raw_counter(PREEMPTION_METRIC, start, end)
        if not series:
            return None, f"{PREEMPTION_METRIC} has no samples in the window"
        value = summed_increase(series, start, end)
        if value is None:
            return None, f"{PREEMPTION_METRIC} has fewer than two samples in the window"
        return value, None

    def prefix_cache_hit_rate(self, start: float, end: float) -> float | None:
        """Prefix-cache hits over queries (tokens) in the window, None without both counters or queries."""
        got = []
        for metric in (PREFIX_QUERIES_METRIC, PREFIX_HITS_METRIC):
            series = self.raw_counter(metric, start, end)
            got.append(summed_increase(series, start, end) if series else None)
        queries, hits = got
        return hits / queries if queries and hits is not None else None

    def range_frame(self, query: str, start: float, end: float, step: float = 1.0) -> pd.DataFrame:
        """One query's series over ``[start, end]`` at ``step``, in pieces under the point limit."""
        frames = []
        piece = MAX_POINTS * step
        a = start
        while a <= end:
            b = min(end, a + piece)
            for labels, t, v in _matrix(self._query_range(query, a, b, step)):
                frames.append(pd.DataFrame({"t": t, "value": v, "series": repr(sorted(labels.items()))}))
            a = b + step
        if not frames:
            return pd.DataFrame(columns=["t", "value", "series"])
        return pd.concat(frames, ignore_index=True).drop_duplicates(["series", "t"])

    def series(self, start: float, end: float, step: float = 1.0) -> tuple[pd.DataFrame, list[str]]:
        """The chart series on a ``step`` grid, and the queries that had no data (their columns NaN)."""
        notes: list[str] = []
        cols: dict[str, pd.Series] = {}
        for name, queries in SERIES_QUERIES.items():
            got = None
            for q in queries:
                df = self.range_frame(q, start, end, step)
                if len(df):
                    got = df.groupby("t")["value"].sum()
                    break
            if got is None:
                notes.append(queries[0])
            else:
                cols[name] = got
        raw = self.range_frame(PREEMPTION_METRIC, start, end, step)
        if len(raw):
            raw = raw.sort_values(["series", "t"], kind="stable")
            raw["inc"] = np.concatenate([counter_increments(g["value"].to_numpy()) for _, g in raw.groupby("series")])
            cols["preemptions_inc"] = raw.groupby("t")["inc"].sum()
        elif "preemptions_total" in cols:
            cols["preemptions_inc"] = pd.Series(
                counter_increments(cols["preemptions_total"].to_numpy()),
                index=cols["preemptions_total"].index,
            )
        if not cols:
            return _empty_series(), notes
        frame = pd.DataFrame(cols).sort_index()
        frame.index.name = "t"
        frame = frame.reset_index()
        for c in SERIES_COLUMNS:
            if c not in frame.columns:
                frame[c] = np.nan
        return frame[list(SERIES_COLUMNS)], notes


def _short(e: BaseException) -> str:
    """What went wrong, in words: the person reading a report needs "connection refused", not the
    urllib3 pool, retry and adapter classes that ``str()`` of a requests exception spells out."""
    import re

    import requests

    text = str(e)
    lower = text.lower()
    if isinstance(e, requests.Timeout) or "timed out" in lower:
        return "no answer in time"
    if "connection refused" in lower or "errno 111" in lower:
        return "connection refused"
    if any(m in lower for m in ("name or service not known", "failed to resolve", "nodename nor servname",
                                "temporary failure in name resolution", "getaddrinfo failed")):  # fmt: skip
        return "host name not found"
    if "connection reset" in lower or "remotedisconnected" in lower or "connection aborted" in lower:
        return "the connection was closed without an answer"
    if isinstance(e, requests.exceptions.SSLError) or "ssl" in lower:
        return "TLS handshake failed"
    status = re.search(r"(?:status code|http)\D{0,3}(\d{3})", text, re.IGNORECASE)
    if status:
        return f"answered HTTP {status.group(1)}"
    if isinstance(e, (ValueError, KeyError)):
        return "the answer is not a Prometheus API response"
    if isinstance(e, requests.ConnectionError):
        return "cannot connect"
    first = text.splitlines()[0] if text else type(e).__name__
    return first if len(first) <= 120 else first[:117] + "..."


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in SERIES_COLUMNS})


# ---------------------------------------------------------------------------------------------
# direct scrapes


def direct_series(server_metrics: pd.DataFrame) -> pd.DataFrame:
    """``server-metrics.jsonl`` in the same columns as the Prometheus pull."""
    if server_metrics.empty:
        return _empty_series()
    df = server_metrics.sort_values("t", kind="stable")
    t = df["t"].to_numpy(dtype=float)
    out = pd.DataFrame({"t": t})
    for c in ("running", "waiting", "kv_usage", "preemptions_total"):
        out[c] = df[c].to_numpy(dtype=float)
    dt = np.r_[np.nan, np.diff(t)]
    dt[dt <= 0] = np.nan
    for total, rate in (
        ("prompt_tokens_total", "prompt_tokens_rate"),
        ("generation_tokens_total", "generation_tokens_rate"),
    ):
        out[rate] = _increments_nan(df[total].to_numpy(dtype=float)) / dt
    out["preemptions_inc"] = _increments_nan(out["preemptions_total"].to_numpy())
    return out[list(SERIES_COLUMNS)]


def _increments_nan(v: np.ndarray) -> np.ndarray:
    """Per-sample increments where missing readings stay missing rather than becoming resets."""
    out = np.full(v.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(v))
    if ok.size:
        inc = counter_increments(v[ok])
        out[ok] = inc
    return out


# ---------------------------------------------------------------------------------------------
# per run and per stage


@dataclass
class ServerData:
    """Everything server-side the report shows, with where each piece came from."""

    preemptions: pd.DataFrame
    """One row per stage: ``preemptions_prometheus``, ``preemptions_direct``, source, note, disagreement."""
    series: pd.DataFrame
    """Series of every run (``run_dir`` column), with a ``source`` column."""
    sources: dict[str, str] = field(default_factory=dict)
    """Series source per run dir: prometheus, direct_scrape or none."""
    notes: list[str] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class StagePreemptions(TypedDict):
    """One stage's preemption delta from each source, the one chosen and why: a row of ``ServerData.preemptions``."""

    run_dir: str
    stage: int
    cell: str
    preemptions_prometheus: float | None
    preemptions_direct: float | None
    preemptions_direct_from: str | None
    preemptions_source: str
    preemptions_disagree: bool
    preemptions_note: str
    preemptions: float | None
    prefix_cache_hit_rate_prometheus: float | None


def _direct_delta(row: pd.Series, server: pd.DataFrame) -> tuple[float | None, str | None]:
    """The load path's own before/after reads, else its ~1 Hz scrapes over the stage window."""
    delta = _finite(row.get("preemptions_delta"))
    source = row.get("preemptions_source")
    if delta is not None and (source in (None, DIRECT) or (isinstance(source, float) and math.isnan(source))):
        return delta, "summary before/after"
    before, after = _finite(row.get("preemptions_before")), _finite(row.get("preemptions_after"))
    if before is not None and after is not None and after >= before:
        return after - before, "summary before/after"
    start, end = _finite(row.get("window_start_s")), _finite(row.get("window_end_s"))
    if not server.empty and start is not None and end is not None:
        value = counter_increase(server["t"], server["preemptions_total"], start, end)
        if value is not None:
            return value, SERVER_METRICS
    return None, None


def _read_saved(path: Path) -> pd.DataFrame | None:
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError):
        return None
    if "t" not in df.columns:
        return None
    for c in SERIES_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    return df[list(SERIES_COLUMNS)].astype(float)


def collect_server_data(
    runs: Sequence[RunDir],
    summaries: pd.DataFrame,
    prometheus_url: str | None = None,
    *,
    save: bool = True,
    timeout_s: float = 5.0,
    step_s: float = 1.0,
) -> ServerData:
    """Preemption deltas per stage and series per run, from the best source each run has.

    ``prometheus_url`` (the CLI's ``--prometheus-url``) overrides each run's recorded URL, which
    is what results copied off the measuring machine need. With Prometheus reachable, series
    are saved as ``prometheus-series.csv`` in each run dir (``save=False`` skips that).
    """
    sources: dict[str, PrometheusSource | PrometheusUnavailable] = {}
    notes: list[str] = []
    rows: list[StagePreemptions] = []
    all_series: list[pd.DataFrame] = []
    run_source: dict[str, str] = {}
    saved: list[Path] = []
    unreachable: dict[str, list[str]] = {}
    for run in runs:
        stages = summaries.loc[summaries["run_dir"] == run.name]
        server, _ = read_server_metrics(run)
        url = prometheus_url or json_opt_str(run.meta, "prometheus_url", where=f"{run.name} run.json") or None
        prom: PrometheusSource | None = None
        if url:
            if url not in sources:
                try:
                    sources[url] = PrometheusSource(url, timeout_s).connect()
                except PrometheusUnavailable as e:
                    sources[url] = e
            got = sources[url]
            if isinstance(got, PrometheusUnavailable):
                unreachable.setdefault(str(got), []).append(run.name)  # one note per problem, not per run
            else:
                prom = got
        saved_series = _read_saved(run.path / SERIES_FILE) if prom is None else None

        # series for the charts
        series, source = _empty_series(), NONE
        starts = pd.to_numeric(stages["window_start_s"], errors="coerce").dropna()
        ends = pd.to_numeric(stages["window_end_s"], errors="coerce").dropna()
        if prom is not None and len(starts) and len(ends):
            try:
                pulled, missing = prom.series(float(starts.min()) - 5.0, float(ends.max()) + 5.0, step_s)
            except PrometheusUnavailable as e:
                notes.append(f"{run.name}: {e}")
                pulled, missing = _empty_series(), []
            if len(missing) == len(SERIES_QUERIES):
                notes.append(f"{run.name}: Prometheus has no vllm series for this run's time range")
            elif missing:
                notes.append(f"{run.name}: Prometheus has no data for " + ", ".join(missing))
            if len(pulled):
                series, source = pulled, PROMETHEUS
                if save:
                    try:
                        pulled.to_csv(run.path / SERIES_FILE, index=False)
                        saved.append(run.path / SERIES_FILE)
                    except OSError as e:
                        notes.append(f"{run.name}: could not save {SERIES_FILE} ({e.strerror or e})")
        elif saved_series is not None and len(saved_series):
            series, source = saved_series, PROMETHEUS
            notes.append(f"{run.name}: Prometheus series from the saved {SERIES_FILE}")
        if source == NONE and len(server):
            series, source = direct_series(server), DIRECT
        run_source[run.name] = source
        if len(series):
            s = series.copy()
            s["run_dir"] = run.name
            s["source"] = source
            all_series.append(s)

        # preemption deltas per stage
        for _, row in stages.iterrows():
            start, end = _finite(row.get("window_start_s")), _finite(row.get("window_end_s"))
            prom_value: float | None = None
            prom_hit_rate: float | None = None
            prom_note: str | None = None
            if start is None or end is None:
                prom_note = "stage window unknown"
            elif prom is not None:
                # the direct reads bracket the stage from outside; widen the window by more than one
                # scrape interval on each side so Prometheus sees the same first and last value
                before_t, after_t = _finite(row.get("preemptions_before_t")), _finite(row.get("preemptions_after_t"))
                p_start = before_t - COUNTER_PAD_S if before_t is not None else start
                p_end = after_t + COUNTER_PAD_S if after_t is not None else end
                try:
                    prom_value, prom_note = prom.preemption_increase(p_start, p_end)
                    prom_hit_rate = prom.prefix_cache_hit_rate(p_start, p_end)
                except PrometheusUnavailable as e:
                    prom_note = str(e)
            elif saved_series is not None and len(saved_series):
                prom_value = increase_from_increments(
                    saved_series["t"], saved_series["preemptions_inc"].fillna(0.0), start, end
                )
                prom_note = f"from the saved {SERIES_FILE}" if prom_value is not None else "saved series too short"
            direct_value, direct_from = _direct_delta(row, server)
            if prom_value is not None:
                chosen = PROMETHEUS
            elif direct_value is not None:
                chosen = DIRECT
            else:
                chosen = NONE
            disagree = (
                prom_value is not None
                and direct_value is not None
                and abs(prom_value - direct_value) >= DISAGREE_TOLERANCE
            )
            rows.append(
                {
                    "run_dir": run.name,
                    "stage": row.get("stage"),
                    "cell": row.get("cell"),
                    "preemptions_prometheus": prom_value,
                    "preemptions_direct": direct_value,
                    "preemptions_direct_from": direct_from,
                    "preemptions_source": chosen,
                    "preemptions_disagree": bool(disagree),
                    "preemptions_note": _stage_note(prom_value, prom_note, direct_value, direct_from, disagree, url),
                    "preemptions": prom_value if prom_value is not None else direct_value,
                    "prefix_cache_hit_rate_prometheus": prom_hit_rate,
                }
            )
    for problem, names in unreachable.items():
        if len(names) == len(runs) and len(names) > 1:
            which = "every run uses"
        else:
            one = len(names) == 1
            which = ("run " if one else "runs ") + ", ".join(names) + (" uses" if one else " use")
        notes.append(f"{problem}: {which} the direct /metrics scrapes")
    if not any(s == PROMETHEUS for s in run_source.values()):
        if any(r["preemptions_source"] == DIRECT for r in rows):
            notes.insert(0, "no Prometheus data: preemption deltas from direct /metrics scrapes")
        else:
            notes.insert(0, "no Prometheus data and no direct /metrics scrapes: preemption deltas unknown")
    if not any(s != NONE for s in run_source.values()):
        notes.append("no server series: neither Prometheus nor server-metrics.jsonl")
    pre = pd.DataFrame(rows)
    series = pd.concat(all_series, ignore_index=True) if all_series else _empty_series().assign(run_dir="", source="")
    return ServerData(pre, series, run_source, notes, saved)


def _stage_note(
    prom: float | None,
    prom_note: str | None,
    direct: float | None,
    direct_from: str | None,
    disagree: bool,
    url: str | None,
) -> str:
    parts = []
    if prom is not None:
        parts.append(f"Prometheus {prom:g}" + (f" ({prom_note})" if prom_note else ""))
    elif url:
        parts.append(f"Prometheus: {prom_note or 'no data'}")
    else:
        parts.append("no Prometheus configured")
    if direct is not None:
        parts.append(f"direct {direct:g} ({direct_from})")
    else:
        parts.append("no direct reading")
    if disagree:
        parts.append("SOURCES DISAGREE")
    return "; ".join(parts)
