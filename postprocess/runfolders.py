"""Finding runs and reading what the load path wrote, as pandas frames.

A results folder is either one run dir (it holds ``run.json`` or ``summary-*.json``) or a suite
folder whose immediate children are run dirs. Everything here tolerates what a killed load
generator leaves behind: a trailing partial JSONL line, a missing ``server-metrics.jsonl``, a
``run.json`` still marked ``running``, or stages whose summary was never written.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pandas as pd
from pandas.api.types import union_categoricals

from tailgate.arms import OPEN_LOOP, cell_name, value_text
from tailgate.contracts import C, ContractError, StageSummary
from tailgate.jsonl import parse_lines
from tailgate.jsontypes import JsonMapping, JsonObject
from tailgate.load.promptsources import DEFAULT_PROMPTS
from tailgate.records import RECORD_FIELDS, WORKLOAD_DEFAULTS, InFlightLoss, lost_in_flight, record_files
from tailgate.resultfiles import RUN_META, SENT_GLOB, SERVER_METRICS, SUMMARY_GLOB
from tailgate.runmeta import RunMeta, RunStatus
from tailgate.serverconfigs import CONFIGS, DEFAULT

#: Record fields left out of the analysis frame: never analysed here (per-chunk offsets, response
#: ids, the generator's monotonic clock), and leaving them out keeps a million-record frame small.
SKIPPED_FIELDS: tuple[str, ...] = (
    "chunk_offsets_ms", "chunk_read_delays_ms", "chunk_read_offsets_ms", "response_id", "sent_mono_ns",
)  # fmt: skip
RECORD_COLUMNS: tuple[str, ...] = tuple(f for f in RECORD_FIELDS if f not in SKIPPED_FIELDS)
CATEGORY_COLUMNS: tuple[str, ...] = (
    "run_id", "worker", "stage_label", "arm", "finish_reason", "error_class", "prompt_source", "endpoint", "arrivals",
)  # fmt: skip
TEXT_COLUMNS: tuple[str, ...] = ("error",)
INT_COLUMNS: tuple[str, ...] = (
    "trace_id", "stage", "prompt_tokens_planned", "max_tokens", "in_flight_at_send", "chunks",
)  # fmt: skip
BOOL_COLUMNS: tuple[str, ...] = ("ignore_eos", "client_coalesced")
SERVER_COLUMNS: tuple[str, ...] = (
    "t", "running", "waiting", "kv_usage", "preemptions_total",
    "prompt_tokens_total", "generation_tokens_total",
)  # fmt: skip


class ResultsError(Exception):
    """A results folder that cannot be analysed; the message fits on one line of output."""


@dataclass(frozen=True, slots=True)
class RunDir:
    """One Locust run's folder and its metadata (empty when ``run.json`` is missing or unreadable)."""

    path: Path
    name: str
    """Path relative to the results folder ("." when the folder is itself the run)."""
    meta: JsonMapping

    @property
    def run_id(self) -> str | None:
        rid = self.meta.get("run_id")
        return str(rid) if rid is not None else None


@dataclass(slots=True)
class RecordsLoad:
    frame: pd.DataFrame
    unreadable_lines: int
    """Lines that did not parse: a generator killed mid-write leaves one at the end of a file."""
    files: int
    unreadable_by_run: dict[str, int] = field(default_factory=dict)
    lost_in_flight: int | None = None
    """Requests the send journal lists without a readable record; None when there is no journal."""
    lost_by_stage: dict[int, int] = field(default_factory=dict)
    """The same, per stage index."""


# ---------------------------------------------------------------------------------------------
# finding runs


def _is_run_dir(path: Path) -> bool:
    return (path / RUN_META).is_file() or any(path.glob(SUMMARY_GLOB))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path} is not readable JSON: {e}") from None


def _read_contract(kind: type[C], path: Path) -> C | None:
    """A results file checked against its contract: None when absent, one :class:`ResultsError` line when
    damaged or wrong-typed (the report names the file rather than failing on a key deep in pandas)."""
    obj = _read_json(path)
    if obj is None:
        return None
    try:
        return kind.from_dict(obj, source=str(path))
    except ContractError as e:
        raise ResultsError(str(e)) from None


def find_run_dirs(results_dir: str | Path) -> list[RunDir]:
    """The run dirs of a results folder, in name order, or a :class:`ResultsError` saying why none."""
    root = Path(results_dir)
    if not root.exists():
        raise ResultsError(f"results folder {root} does not exist")
    if not root.is_dir():
        raise ResultsError(f"{root} is not a folder")
    if _is_run_dir(root):
        candidates = [(root, ".")]
    else:
        try:
            children = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError as e:
            raise ResultsError(f"results folder {root} cannot be listed: {e.strerror or e}") from None
        # hidden folders hold set-aside incomplete runs; report/ is our own output
        candidates = [(p, p.name) for p in children if not p.name.startswith(".") and _is_run_dir(p)]
    if not candidates:
        raise ResultsError(f"{root} holds no runs (no run.json or summary-*.json in it or in its immediate subfolders)")
    runs = []
    for path, name in candidates:
        meta = _read_contract(RunMeta, path / RUN_META)
        runs.append(RunDir(path, name, meta.to_dict() if meta is not None else {}))
    return runs


def _as_runs(source: str | Path | Sequence[RunDir]) -> list[RunDir]:
    if isinstance(source, (str, Path)):
        return find_run_dirs(source)
    return list(source)


# ---------------------------------------------------------------------------------------------
# summaries


rate_text = value_text
"""``5.0`` → ``5``, ``2.5`` → ``2.5``: how the seed names its cells (one rule, in ``tailgate.arms``)."""


def _config_of(summary: JsonMapping, run: RunDir) -> str:
    # V1 runs with chunked prefill unless told otherwise, so an unlabelled run is the default config
    return str(summary.get("config") or run.meta.get("config") or DEFAULT.name)


def load_summaries(source: str | Path | Sequence[RunDir]) -> pd.DataFrame:
    """One row per cell (a stage of a run), the summary keys as columns plus ``run_dir``/``cell``.

    Runs whose summaries are missing (a generator killed before a stage ended) get rows computed
    from their records with the same rules, marked ``summary_source == "records"``.
    """
    runs = _as_runs(source)
    rows: list[JsonObject] = []
    for run in runs:
        paths = sorted(run.path.glob(SUMMARY_GLOB))
        got: list[JsonObject] = []
        for p in paths:
            summary = _read_contract(StageSummary, p)
            if summary is not None:
                got.append(summary.to_dict())
        state = RunStatus.of(run.meta.get("status"))
        ended = state is not None and state.summarized
        if record_files(run.path) and (not got or (not ended and all("stage" in obj for obj in got))):
            # stages whose summary was never written (the generator died in them) come from their records
            from .summarize import summaries_from_records

            loaded = read_records_frame(run)
            have = {obj.get("stage") for obj in got}
            missing = loaded.frame.loc[~loaded.frame["stage"].isin(have)]
            derived = summaries_from_records(missing, default_warmup=_run_warmup(run)) if len(missing) else []
            for obj in derived:
                obj["lost_in_flight"] = (
                    loaded.unreadable_lines
                    if loaded.lost_in_flight is None
                    else loaded.lost_by_stage.get(int(cast("int", obj["stage"])), 0)  # the records frame's stage
                )
            got = got + derived
        for obj in got:
            row = dict(obj)
            row.setdefault("summary_source", "summary")
            row["config"] = _config_of(row, run)
            row["run_dir"] = run.name
            row.setdefault("run_id", run.run_id)
            rows.append(row)
    if not rows:
        names = ", ".join(r.name for r in runs)
        raise ResultsError(f"no stage summaries or records in {names}")
    df = pd.DataFrame(rows)
    for col in ("stage", "stage_label", "window_start_s", "window_end_s", "preemptions_before",
                "preemptions_after", "preemptions_delta", "ttft_from_intended_p99", "schedule_lag_p99",
                "warmup", "lost_in_flight"):  # fmt: skip
        if col not in df.columns:
            df[col] = np.nan
    df["rate_or_batch"] = pd.to_numeric(df["rate_or_batch"], errors="coerce")
    df["cell"] = [cell_name(c, a, r) for c, a, r in zip(df["config"], df["arm"], df["rate_or_batch"], strict=True)]
    if "prompts" in df.columns:  # another prompt source at the same cell: its name says which
        other = df["prompts"].notna() & (df["prompts"].astype(str) != DEFAULT_PROMPTS)
        df.loc[other, "cell"] = df.loc[other, "cell"] + "+" + df.loc[other, "prompts"].astype(str)
    df = order_cells(df)
    # the same cell measured twice (a repeat run) keeps both rows, told apart by a suffix
    dup = df.groupby("cell").cumcount()
    df.loc[dup > 0, "cell"] = df.loc[dup > 0, "cell"] + "~" + (dup[dup > 0] + 1).astype(str)
    return df.reset_index(drop=True)


def order_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Engine default first, then chunked-off, then the preemption cell, then user labels."""
    rank = {c: i for i, c in enumerate(CONFIGS)}
    key = pd.DataFrame(
        {
            "c": df["config"].map(lambda c: rank.get(c, len(rank))),
            "cname": df["config"],
            "a": (~df["arm"].isin(OPEN_LOOP)).astype(int),
            "r": df["rate_or_batch"],
            "w": df.get("window_start_s", 0.0),
        }
    )
    order = key.sort_values(["c", "cname", "a", "r", "w"], kind="stable").index
    return df.loc[order]


def _run_warmup(run: RunDir) -> int:
    trace = run.meta.get("trace")
    w = trace.get("warmup") if isinstance(trace, dict) else None
    return int(w) if isinstance(w, (int, float)) else 0


# ---------------------------------------------------------------------------------------------
# records


PARALLEL_BYTES = 64 << 20
"""Below this much JSONL, starting processes costs more than it saves."""
MAX_WORKERS = 8


def _parse_lines(data: bytes) -> tuple[list[JsonMapping], int]:
    """Every record line of ``data``, and the count of lines that are not a JSON object (the load path's
    reader, with orjson for files of millions of lines)."""
    return parse_lines(data, orjson.loads)


def _normalise(df: pd.DataFrame) -> pd.DataFrame:
    """One dtype per column whichever reader produced the rows, so frames concatenate cleanly."""
    out = {}
    n = len(df)
    for c in RECORD_COLUMNS:
        col = df[c] if c in df.columns else pd.Series([None] * n, index=df.index, dtype=object)
        if WORKLOAD_DEFAULTS.get(c) is not None:  # schema 2 records and seed runs leave these out
            col = col.astype(object).where(col.notna(), WORKLOAD_DEFAULTS[c])
        if c in CATEGORY_COLUMNS:
            out[c] = col if isinstance(col.dtype, pd.CategoricalDtype) else col.astype("category")
        elif c in TEXT_COLUMNS:
            out[c] = col.astype(object).where(col.notna(), None)
        elif c in BOOL_COLUMNS:
            out[c] = col.astype(object).where(col.notna(), False).astype(bool)
        elif c in INT_COLUMNS:
            num = pd.to_numeric(col, errors="coerce")
            out[c] = num.astype("int64") if not num.isna().any() else num.astype("float64")
        else:
            out[c] = pd.to_numeric(col, errors="coerce").astype("float64")
    return pd.DataFrame(out, index=df.index)


def read_records_file(path: str | Path) -> tuple[pd.DataFrame, int]:
    """One JSONL file as a frame, and the count of lines that did not parse.

    The usual damage is one partial line at the end (the generator died mid-write); it is counted,
    never guessed at.
    """
    rows, bad = _parse_lines(Path(path).read_bytes())
    frame = (
        pd.DataFrame.from_records(rows, columns=list(RECORD_COLUMNS))
        if rows
        else pd.DataFrame(columns=list(RECORD_COLUMNS))
    )
    return _normalise(frame), bad


def _str_categories(values: pd.Series) -> pd.Series:
    """Categories as strings: an all-missing column has object categories, which cannot be united."""
    cats = values.cat.categories
    if cats.dtype == "str":
        return values
    return values.cat.rename_categories(pd.Index([str(c) for c in cats], dtype="str"))


def _concat(parts: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Row-wise concatenation that keeps categoricals categorical.

    ``pd.concat`` turns categoricals with different categories into objects and the frame would
    have to factorize a million strings again; uniting the categories works on the codes.
    """
    parts = list(parts)
    united: dict[str, pd.Categorical] = {}
    for c in (*CATEGORY_COLUMNS, "run_dir"):
        if not all(c in p.columns and isinstance(p[c].dtype, pd.CategoricalDtype) for p in parts):
            continue
        try:
            united[c] = union_categoricals([_str_categories(p[c]) for p in parts], ignore_order=True)
        except (TypeError, ValueError):
            continue  # plain concatenation below copes, only slower
    order = list(parts[0].columns)
    df = pd.concat([p.drop(columns=list(united)) for p in parts], ignore_index=True)
    for c, values in united.items():
        df[c] = values
    df = df[order + [c for c in df.columns if c not in order]]
    for c in CATEGORY_COLUMNS:
        if not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    for c in INT_COLUMNS:
        if df[c].dtype != "int64" and not df[c].isna().any():
            df[c] = df[c].astype("int64")
    return df


def _journal_lost(run: RunDir, frame: pd.DataFrame) -> InFlightLoss | None:
    """Sent-but-unrecorded requests from the load path's send journal (``sent-*.log``), if any.

    The journal is written before each request goes out, so it also counts requests whose
    record was never started, which no partial line reveals.
    """
    if not any(run.path.glob(SENT_GLOB)):
        return None
    ok = frame["stage"].notna() & frame["trace_id"].notna()
    pairs = zip(frame.loc[ok, "stage"].astype("int64"), frame.loc[ok, "trace_id"].astype("int64"), strict=True)
    return lost_in_flight(run.path, recorded=pairs)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def read_records_files(paths: Sequence[Path]) -> list[tuple[pd.DataFrame, int]]:
    """:func:`read_records_file` for many files, in parallel processes when it pays.

    Parsing is CPU-bound and each load process writes its own file, so a large run splits
    naturally. Processes are forked (no re-import) and only from a single-threaded parent,
    where forking is safe; small inputs stay in this process.
    """
    paths = list(paths)
    workers = min(len(paths), usable_cpus(), MAX_WORKERS)
    can_fork = "fork" in mp.get_all_start_methods() and threading.active_count() == 1
    if workers > 1 and can_fork and sum(p.stat().st_size for p in paths) >= PARALLEL_BYTES:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as pool:
            return list(pool.map(read_records_file, paths))
    return [read_records_file(p) for p in paths]


def _one_per_request(frame: pd.DataFrame) -> pd.DataFrame:
    """The rule of :func:`tailgate.records.read_records`: one record per (run, stage, request), a worker's own
    over the ``worker_lost`` the master wrote for it (a partition that healed, a worker's unreported copy)."""
    cols = [c for c in ("run_id", "stage", "trace_id") if c in frame.columns]
    if len(frame) < 2 or len(cols) < 3 or not frame.duplicated(cols).any():
        return frame
    lost = (frame["error_class"] == "worker_lost") if "error_class" in frame.columns else False
    order = pd.Series(lost, index=frame.index).astype(int)
    return (
        frame.assign(_lost=order)
        .sort_values("_lost", kind="stable")
        .drop_duplicates(cols)
        .sort_index()
        .drop(columns="_lost")
    )


def read_records_frame(run: RunDir, parsed: Sequence[tuple[pd.DataFrame, int]] | None = None) -> RecordsLoad:
    """Every worker file of one run, with a ``run_dir`` column naming where each row came from.

    ``parsed`` takes the run's files already read by :func:`read_records_files`, in
    :func:`~tailgate.records.record_files` order.
    """
    files = record_files(run.path)
    frames, bad = [], 0
    for df, b in parsed if parsed is not None else read_records_files(files):
        frames.append(df)
        bad += b
    if frames:
        frame = frames[0] if len(frames) == 1 else _concat(frames)
    else:
        frame = _normalise(pd.DataFrame(columns=list(RECORD_COLUMNS)))
    frame = _one_per_request(frame).reset_index(drop=True)
    frame["run_dir"] = pd.Categorical([run.name] * len(frame)) if len(frame) else pd.Categorical([])
    key = run.run_id or run.name
    loss = _journal_lost(run, frame)
    if loss is None:
        return RecordsLoad(frame, bad, len(files), {key: bad})
    return RecordsLoad(frame, bad, len(files), {key: bad}, loss.lost, dict(loss.lost_by_stage))


def load_records(source: str | Path | Sequence[RunDir]) -> pd.DataFrame:
    """All runs' records in one frame; ``attrs`` carry what could not be read.

    ``attrs["unreadable_lines"]`` is the total and ``attrs["unreadable_by_run"]`` maps each run
    dir to its count of lines that did not parse; ``attrs["lost_in_flight_by_run"]`` holds, for
    runs with a send journal, the requests sent but never recorded. Both are requests lost in
    flight, which no summary can include.
    """
    runs = _as_runs(source)
    per_run = [record_files(run.path) for run in runs]
    parsed = read_records_files([p for paths in per_run for p in paths])
    frames, by_run, lost, total, files = [], {}, {}, 0, 0
    start = 0
    for run, paths in zip(runs, per_run, strict=True):
        got = read_records_frame(run, parsed[start : start + len(paths)])
        start += len(paths)
        frames.append(got.frame)
        by_run[run.name] = got.unreadable_lines
        if got.lost_in_flight is not None:
            lost[run.name] = got.lost_in_flight
        total += got.unreadable_lines
        files += got.files
    nonempty = [f for f in frames if len(f)]
    if not nonempty:
        df = frames[0] if frames else _normalise(pd.DataFrame(columns=list(RECORD_COLUMNS)))
    elif len(nonempty) == 1:
        df = nonempty[0]
    else:
        df = _concat(nonempty)
        df["run_dir"] = df["run_dir"].astype("category")
    df.attrs["unreadable_lines"] = total
    df.attrs["unreadable_by_run"] = by_run
    df.attrs["lost_in_flight_by_run"] = lost
    df.attrs["record_files"] = files
    return df


# ---------------------------------------------------------------------------------------------
# server metrics (direct /metrics scrapes)


def read_server_metrics(run: RunDir) -> tuple[pd.DataFrame, int]:
    """A run's ~1 Hz scrapes sorted by time; unparsable lines are skipped and counted.

    Read the same way as the records: one parse for a clean file, line by line for a damaged one.
    """
    path = run.path / SERVER_METRICS
    if not path.is_file():
        return pd.DataFrame(columns=[*SERVER_COLUMNS, "run_dir"]), 0
    rows, bad = _parse_lines(path.read_bytes())
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame()
    for c in SERVER_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df.columns else np.nan
    df = df.loc[df["t"].notna(), list(SERVER_COLUMNS)].sort_values("t", kind="stable").reset_index(drop=True)
    df["run_dir"] = run.name
    return df, bad


def load_server_metrics(source: str | Path | Sequence[RunDir]) -> pd.DataFrame:
    """All runs' direct scrapes; empty (with the columns) when no run sampled its server."""
    frames = [read_server_metrics(r)[0] for r in _as_runs(source)]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=[*SERVER_COLUMNS, "run_dir"])
    return pd.concat(frames, ignore_index=True)
