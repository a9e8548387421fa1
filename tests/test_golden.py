"""A golden run: what a user sees of a fixed-seed run must not move when the code under it is rearranged.

Two small real Locust runs (both arms, the seeded mixed-length trace) against the ground-truth server, and a
small ``tailgate suite`` with its report (``suite.json``, its cells, the report's table and diagnosis).
What does not depend on timing — trace ids, stage labels, each record's fields and planned lengths, the
arrival schedule's offsets, the summaries' counts, the run manifest's keys — is compared with
``tests/fixtures/golden/golden.json``. Latency figures are the machine's (the test command's second pass
runs under CPU stress), so they are left to the self-check's bounds.

After a change meant to alter what users see, write the file again and review its diff:

    TAILGATE_GOLDEN_UPDATE=1 .venv/bin/python -m pytest -q tests/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, load_records, load_summaries, run_locust

from tailgate.verify.groundtruth import start_server_process

GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "golden.json"
UPDATE_ENV = "TAILGATE_GOLDEN_UPDATE"

RECORD_FIELDS = (
    "trace_id", "stage", "stage_label", "arm", "rate_or_batch", "batch", "prompt_tokens_planned", "max_tokens",
    "ignore_eos", "chunks", "prompt_tokens", "completion_tokens", "finish_reason", "status", "chunk_stamp",
    "error_class",
)  # fmt: skip
"""Record fields fixed by the seed and the server's settings, not by timing."""
SUMMARY_FIELDS = (
    "arm", "n", "rate_or_batch", "errors", "sent", "warmup", "warmup_rule", "stage", "stage_label", "config",
    "partial", "planned", "dropped_arrivals", "target_rate", "recorded", "lost_in_flight", "never_sent",
    "ran_short", "prompts", "endpoint", "arrivals", "completion_tokens", "chunks_p50", "prompt_tokens_checked",
    "prompt_tokens_exact", "load_processes", "chunk_stamp", "errors_by_class",
)  # fmt: skip
"""Stage-summary figures that are counts or settings."""
TABLE_FIELDS = (
    "cell", "config", "arm", "rate_or_batch", "n", "errors", "prompts", "planned", "sent", "recorded",
    "lost_in_flight", "never_sent", "warmup", "warmup_rule", "endpoint", "arrivals", "partial", "chunk_stamp",
    "stage_label", "summary_source", "preemptions_source",
)  # fmt: skip
"""The report table's columns that are counts, names or settings (the CSV keeps them all)."""
OFFSET_SLACK_S = 1e-5
"""Intended send offsets are drawn from the seed; the slack is float rounding of wall-clock seconds."""


def _schedule(record: dict[str, Any], first: dict[int, float]) -> dict[str, float]:
    """An open-loop arrival's offset in its stage (the seed's); a gated one is sent when its batch is
    admitted, which is timing, so it has none."""
    if record["arm"] != "continuous":
        return {}
    return {"intended_offset_s": record["intended_s"] - first[record["stage"]]}


def _project(results: Path) -> dict[str, Any]:
    records = sorted(load_records(results), key=lambda r: (r["stage"], r["trace_id"]))
    first: dict[int, float] = {}
    for r in records:
        first[r["stage"]] = min(first.get(r["stage"], r["intended_s"]), r["intended_s"])
    summaries = load_summaries(results)
    manifest = json.loads((results / "run.json").read_text())
    return {
        "record_keys": sorted({k for r in records for k in r}),
        "records": [{k: r.get(k) for k in RECORD_FIELDS} | _schedule(r, first) for r in records],
        "summary_keys": sorted({k for s in summaries.values() for k in s}),
        "summaries": {name: {k: s.get(k) for k in SUMMARY_FIELDS} for name, s in sorted(summaries.items())},
        "manifest_keys": sorted(manifest),
        "option_keys": sorted(manifest.get("options") or {}),
        "stages_planned": manifest.get("stages_planned"),
    }


def _run_both_arms(tmp_path: Path) -> dict[str, Any]:
    common = ("--sample-metrics", "0", "--settle", "0", "--seed", "7")
    with start_server_process(ttft_ms=5, gap_ms=1) as server:
        cont = run_locust("continuous.py", server.base_url, tmp_path / "cont", "--rates", "20,40", "--n", "6",
                          "--warmup", "2", *common)  # fmt: skip
        assert cont.returncode == 0, cont.stderr[-3000:]
        gated = run_locust("gated.py", server.base_url, tmp_path / "gated", "--batch-size", "4", "--n", "8",
                           "--warmup", "0", *common)  # fmt: skip
        assert gated.returncode == 0, gated.stderr[-3000:]
    return {"continuous": _project(tmp_path / "cont"), "gated": _project(tmp_path / "gated")}


def _run_suite(tmp_path: Path) -> dict[str, Any]:
    """``tailgate suite`` over both arms with its report, against the same kind of server."""
    import csv
    import subprocess
    import sys

    results = tmp_path / "suite"
    with start_server_process(ttft_ms=5, gap_ms=1) as server:
        cmd = [
            sys.executable, "-m", "tailgate.cli", "suite", "--server", "url", "--host", server.base_url,
            "--configs", "chunked", "--rates", "20", "--batch-size", "4", "--nochunk-rates", "none",
            "--preempt-rate", "none", "--n", "6", "--warmup", "0", "--stage-warmup", "0", "--seed", "7",
            "--results", str(results), "--locust-arg=--settle=0", "--locust-arg=--sample-metrics=0",
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    meta = json.loads((results / "suite.json").read_text())
    with open(results / "report" / "table.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    diagnosis = json.loads((results / "report" / "diagnosis.json").read_text())
    summaries = {cell: load_summaries(results / cell) for cell in meta["cells"]}
    return {
        "suite_keys": sorted(meta),
        "cells": meta["cells"],
        "status": [meta["status"], meta["exit_code"]],
        "summaries": {
            cell: {name: {k: s.get(k) for k in SUMMARY_FIELDS} for name, s in sorted(found.items())}
            for cell, found in summaries.items()
        },
        "table_keys": sorted(rows[0]) if rows else [],
        "table": [{k: row.get(k) for k in TABLE_FIELDS} for row in rows],
        "table_md_head": (results / "report" / "table.md").read_text().splitlines()[0],
        "diagnosis_keys": sorted(diagnosis),
    }


def _compare(got: Any, want: Any, where: str, problems: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got or key not in want:
                problems.append(f"{where}.{key}: {'missing' if key not in got else 'new'}")
            else:
                _compare(got[key], want[key], f"{where}.{key}", problems)
    elif where.endswith("_keys") and isinstance(want, list) and isinstance(got, list):
        new, gone = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        if new or gone:
            problems.append(f"{where}: new {new}, gone {gone}")
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _compare(g, w, f"{where}[{i}]", problems)
    elif where.endswith("intended_offset_s") and isinstance(got, float) and isinstance(want, float):
        if abs(got - want) > OFFSET_SLACK_S:
            problems.append(f"{where}: {got!r} != {want!r}")
    elif got != want:
        problems.append(f"{where}: {got!r} != {want!r}")


def test_a_fixed_seed_run_shows_users_what_it_showed_before(tmp_path: Path) -> None:
    got = _run_both_arms(tmp_path) | {"suite": _run_suite(tmp_path)}
    if os.environ.get(UPDATE_ENV):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"{GOLDEN.relative_to(ROOT)} written: review its diff")
    want = json.loads(GOLDEN.read_text())
    problems: list[str] = []
    _compare(got, want, "golden", problems)
    assert not problems, "\n".join(problems[:40])


def test_the_comparison_names_what_moved() -> None:
    """The check itself can fail: a changed label, a lost field and a shifted arrival are each named."""
    want = {"records": [{"stage_label": "cont_r20", "intended_offset_s": 0.5, "chunks": 100}]}
    got = {"records": [{"stage_label": "r20", "intended_offset_s": 0.6}]}
    problems: list[str] = []
    _compare(got, want, "golden", problems)
    assert problems == [
        "golden.records[0].chunks: missing",
        "golden.records[0].intended_offset_s: 0.6 != 0.5",
        "golden.records[0].stage_label: 'r20' != 'cont_r20'",
    ]
