"""How long the analysis takes on a million requests: load, summaries, charts, and the full report.

Writes a synthetic suite of eight cells (125,000 requests each, two load processes per run)
into a temporary folder, in the load path's exact record format, then times each step of the
analysis separately and the whole ``build_report``. Generation is not timed.

    python benchmarks/analysis_speed.py [--records 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tailgate.postprocess.prometheus import collect_server_data  # noqa: E402
from tailgate.postprocess.report import REPORT_DIR, Analysis, build_report, draw_charts  # noqa: E402
from tailgate.postprocess.runfolders import find_run_dirs, load_records, load_summaries, usable_cpus  # noqa: E402
from tailgate.postprocess.summarize import summaries_from_records  # noqa: E402
from tailgate.postprocess.table import summary_table  # noqa: E402
from tailgate.records import RECORD_FIELDS  # noqa: E402

T0 = 1785830400.0
CELLS = (
    ("chunked-cont", "chunked", "continuous", (2.0, 5.0, 10.0, 20.0)),
    ("chunked-gated", "chunked", "gated", (16.0,)),
    ("nochunk-cont", "nochunk", "continuous", (5.0, 10.0)),
    ("preempt", "preempt", "continuous", (10.0,)),
)
WARMUP = 25


def _stage(rng: np.random.Generator, n: int, arm: str, value: float, config: str, t0: float) -> pd.DataFrame:
    """One stage of plausible requests: the seed's length mix, load-dependent decode steps and stalls."""
    u = rng.random(n)
    prompt = np.where(u < 0.7, 200, np.where(u < 0.9, 1000, 6000))
    out = np.where(u < 0.7, 100, np.where(u < 0.9, 300, 600))
    if arm == "continuous":
        intended = t0 + np.cumsum(rng.exponential(1.0 / value, n))
        batch = np.full(n, np.nan)
    else:
        batch = np.arange(n) // int(value)
        intended = t0 + batch * 4.0
    lag = rng.uniform(0.1, 2.0, n)
    sent = intended + lag / 1000.0
    step = 8.0 + (value if arm == "continuous" else 4.0) * 1.5
    ttft = 5.0 + 0.03 * prompt * rng.uniform(0.9, 1.3, n) + rng.lognormal(1.0, 0.5, n)
    stall = rng.random(n) < 0.3
    block = {"nochunk": 180.0, "preempt": 2500.0}.get(config, 60.0)
    worst = step * rng.uniform(1.4, 2.2, n) + stall * block * rng.uniform(0.5, 1.2, n)
    total = ttft + (out - 1) * step + stall * block
    first = sent + ttft / 1000.0
    last = sent + total / 1000.0
    df = pd.DataFrame(
        {
            "run_id": "", "worker": "", "trace_id": np.arange(n), "stage": 0, "stage_label": "",
            "arm": arm, "rate_or_batch": value, "batch": batch, "prompt_tokens_planned": prompt,
            "max_tokens": out, "ignore_eos": True, "intended_s": intended, "sent_s": sent,
            "schedule_lag_ms": lag, "in_flight_at_send": rng.integers(0, 60, n),
            "sent_mono_ns": ((sent - t0) * 1e9).astype(np.int64), "headers_s": sent + 0.002,
            "first_chunk_s": first, "last_chunk_s": last, "end_s": last + 0.0004, "ttft_ms": ttft,
            "ttft_from_intended_ms": ttft + lag, "worst_gap_ms": worst,
            "worst_gap_end_s": first + rng.uniform(0.1, 0.9, n) * (last - first), "total_ms": total,
            "total_from_intended_ms": total + lag, "chunks": out, "prompt_tokens": prompt,
            "completion_tokens": out, "finish_reason": "length", "status": 200,
            "response_id": [f"cmpl-{i:08x}" for i in range(n)], "error_class": None, "error": None,
        }
    )  # fmt: skip
    failed = rng.random(n) < 0.001
    df.loc[failed, "error_class"] = "io_error"
    df.loc[failed, "error"] = "ConnectionResetError during body: [Errno 104] Connection reset by peer"
    df.loc[failed, ["total_ms", "total_from_intended_ms", "completion_tokens", "finish_reason"]] = None
    return df


def generate(root: Path, total: int, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    n_cells = sum(len(v) for *_, v in CELLS)
    per = total // n_cells
    t = T0
    for name, config, arm, values in CELLS:
        d = root / name
        d.mkdir(parents=True)
        run_id = f"{zlib.crc32(name.encode()):012x}"
        frames = []
        for i, value in enumerate(values):
            label = f"gated_b{int(value)}" if arm == "gated" else f"cont_r{int(value)}"
            df = _stage(rng, per, arm, value, config, t)
            df["run_id"], df["stage"], df["stage_label"] = run_id, i, label
            frames.append(df)
            t = float(df["end_s"].max()) + 3.0
        run = pd.concat(frames, ignore_index=True)
        run["worker"] = np.where(run["trace_id"] % 2 == 0, "bench-1", "bench-2")
        for worker, part in run.groupby("worker"):
            part = part.sort_values("end_s", kind="stable")[[f for f in RECORD_FIELDS if f in part.columns]]
            part.to_json(d / f"records-{worker}.jsonl", orient="records", lines=True, double_precision=6)
        run["run_dir"] = name
        for s in summaries_from_records(run, default_warmup=WARMUP):
            s.update({"config": config, "preemptions_delta": 0.0, "preemptions_source": "direct_scrape"})
            s.pop("run_dir", None)
            (d / f"summary-{s['stage_label']}.json").write_text(json.dumps(s, indent=1, default=float))
        meta = {"run_id": run_id, "arm": arm, "config": config, "prometheus_url": None, "status": "completed",
                "trace": {"seed": seed, "warmup": WARMUP, "n": per - WARMUP,
                          "mix": {"200→100": 70, "1000→300": 20, "6000→600": 10}}}  # fmt: skip
        (d / "run.json").write_text(json.dumps(meta, indent=1))
        if config in ("chunked", "preempt"):
            ts = np.arange(math_floor(run["sent_s"].min()) - 2, run["end_s"].max() + 2, 1.0)
            preempt = np.cumsum(rng.random(ts.size) < (0.3 if config == "preempt" else 0.0)).astype(float)
            gauges = {"running": 20.0, "waiting": 2.0, "kv_usage": 0.6}
            lines = [
                json.dumps({"t": float(x), **gauges, "preemptions_total": p,
                            "prompt_tokens_total": 1e3 * i, "generation_tokens_total": 3e3 * i})
                for i, (x, p) in enumerate(zip(ts, preempt, strict=True))
            ]  # fmt: skip
            (d / "server-metrics.jsonl").write_text("\n".join(lines) + "\n")


def math_floor(x: float) -> float:
    return float(np.floor(x))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(label: str, fn: Callable[[], Any], figures: dict[str, tuple[float, float]]) -> Any:
    """Wall time, and CPU time of this process and its finished children (the parallel readers)."""
    t, c = time.perf_counter(), _cpu()
    out = fn()
    figures[label] = (time.perf_counter() - t, _cpu() - c)
    wall, cpu = figures[label]
    print(f"  {label:<38} {wall:7.2f} s wall {cpu:7.2f} s CPU", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="write the synthetic suite here and keep it")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tailgate-bench-")) if args.keep is None else args.keep
    root = tmp / "suite"
    try:
        t = time.perf_counter()
        generate(root, args.records)
        size = sum(p.stat().st_size for p in root.rglob("records-*.jsonl"))
        took = time.perf_counter() - t
        print(f"generated {args.records:,} records ({size / 1e6:.0f} MB of JSONL) in {took:.0f} s")
        figures: dict[str, tuple[float, float]] = {}
        load = os.getloadavg()[0]
        print(f"{usable_cpus()} CPU(s) usable; load average {load:.2f} before the analysis")
        print("analysis steps:")
        runs = timed("find runs", lambda: find_run_dirs(root), figures)
        records = timed("load records (JSONL -> DataFrame)", lambda: load_records(runs), figures)
        summaries = timed(
            "summaries from records", lambda: summaries_from_records(records, default_warmup=WARMUP), figures
        )
        files = timed("load summary files", lambda: load_summaries(runs), figures)
        server = timed("server series (direct scrapes)", lambda: collect_server_data(runs, files), figures)
        table = timed("table", lambda: summary_table(files, server.preemptions), figures)
        analysis = Analysis(root, runs, files, records, server, table, 10.0)
        out = tmp / "charts"
        drawn = timed("charts 1, 2, 3, 3_preempt (png + svg)", lambda: draw_charts(analysis, out), figures)
        del drawn
        core = [sum(v[i] for k, v in figures.items() if k != "find runs") for i in (0, 1)]
        analysis_only = [
            sum(v[i] for k, v in figures.items() if not k.startswith(("find", "load rec"))) for i in (0, 1)
        ]
        shape = f"({len(summaries)} stages, {len(records):,} rows)"
        print(f"  {'summaries + charts':<38} {analysis_only[0]:7.2f} s wall {analysis_only[1]:7.2f} s CPU")
        print(f"  {'load + summaries + charts':<38} {core[0]:7.2f} s wall {core[1]:7.2f} s CPU {shape}")
        t = time.perf_counter()
        paths = build_report(root)
        took = time.perf_counter() - t
        print(f"  {'full build_report (with diagnosis)':<38} {took:7.2f} s wall -> {paths.html}")
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {root} (report in {root / REPORT_DIR})")


if __name__ == "__main__":
    sys.exit(main())
