"""The analysis path on the committed fixture: loading, the table, charts, diagnosis, report, CLI."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tailgate.postprocess.bootstrap import bootstrap_percentile, bootstrap_percentile_naive, percentile_difference
from tailgate.postprocess.cli import main as report_main
from tailgate.postprocess.diagnosis import QUESTIONS, diagnose
from tailgate.postprocess.diagnosisview import render_text
from tailgate.postprocess.report import ReportPaths, build_report
from tailgate.postprocess.runfolders import (
    ResultsError,
    cell_name,
    find_run_dirs,
    load_records,
    load_server_metrics,
    load_summaries,
    read_records_file,
)
from tailgate.postprocess.summarize import measured_mask, summaries_from_records
from tailgate.postprocess.table import TABLE_COLUMNS, choose_decision_rate, summary_table, table_markdown
from tailgate.records import read_records
from tailgate.stats import SEED_SUMMARY_KEYS, measured_records

FIXTURE = Path(__file__).parent / "fixtures" / "results"
CELLS = [
    "chunked_cont_r2",
    "chunked_cont_r8",
    "chunked_gated_b4",
    "nochunk_cont_r2",
    "nochunk_cont_r8",
    "preempt_cont_r8",
]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    dest = tmp_path / "results"
    shutil.copytree(FIXTURE, dest)
    return dest


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportPaths:
    dest = tmp_path_factory.mktemp("report") / "results"
    shutil.copytree(FIXTURE, dest)
    return build_report(dest)


def _summary_files() -> dict[str, dict]:
    out = {}
    for p in sorted(FIXTURE.glob("*/summary-*.json")):
        d = json.loads(p.read_text())
        out[cell_name(d["config"], d["arm"], d["rate_or_batch"])] = d
    return out


# ---------------------------------------------------------------------------------------------
# the fixture itself


def test_fixture_is_small_and_reproducible(tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert total < 360_000  # schema 2 added five per-record fields
    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURE.parent / "make_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.build(tmp_path / "again")
    stale = "the fixture is out of date with its generator: run python tests/fixtures/make_fixture.py"
    for p in FIXTURE.rglob("*"):
        if p.is_file():
            assert (tmp_path / "again" / p.relative_to(FIXTURE)).read_bytes() == p.read_bytes(), f"{p}: {stale}"


# ---------------------------------------------------------------------------------------------
# loading


def test_run_dirs_of_a_suite_folder_and_of_a_single_run() -> None:
    runs = find_run_dirs(FIXTURE)
    assert [r.name for r in runs] == ["chunked-cont", "chunked-gated", "nochunk-cont", "preempt"]
    assert runs[0].meta["config"] == "chunked"
    single = find_run_dirs(FIXTURE / "preempt")
    assert [r.name for r in single] == ["."]


def test_missing_and_empty_folders_raise_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="does not exist"):
        find_run_dirs(tmp_path / "nope")
    (tmp_path / "somefolder").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ResultsError, match="holds no runs") as e:
        find_run_dirs(tmp_path)
    assert "\n" not in str(e.value)


def test_summaries_one_row_per_cell_with_seed_names() -> None:
    df = load_summaries(FIXTURE)
    assert df["cell"].tolist() == CELLS
    assert set(SEED_SUMMARY_KEYS) <= set(df.columns)
    assert df.set_index("cell").loc["nochunk_cont_r8", "config"] == "nochunk"


def test_a_cell_has_one_name_its_folder() -> None:
    assert cell_name("chunked", "continuous", 5.0) == "chunked_cont_r5"
    assert cell_name("chunked", "gated", 16) == "chunked_gated_b16"
    assert cell_name("nochunk", "continuous", 10.0) == "nochunk_cont_r10"
    assert cell_name("preempt", "continuous", 10.0) == "preempt_cont_r10"
    assert cell_name("chunked", "continuous", 2.5) == "chunked_cont_r2p5"
    assert cell_name("mybox", "gated", 4) == "mybox_gated_b4"


def test_records_tolerate_a_partial_last_line_and_count_it() -> None:
    df = load_records(FIXTURE)
    assert len(df) == 6 * 55
    assert df.attrs["unreadable_lines"] == 1
    assert df.attrs["unreadable_by_run"]["chunked-gated"] == 1
    # the send journal knows the request whose record was cut off
    assert df.attrs["lost_in_flight_by_run"] == {
        "chunked-cont": 0,
        "chunked-gated": 1,
        "nochunk-cont": 0,
        "preempt": 0,
    }
    errors = df.loc[df["error_class"].notna()]
    assert sorted(errors["error_class"].astype(str)) == ["io_error", "stall_timeout"]
    # the message with separators went through the line-by-line reader intact
    assert "Connection reset by peer" in " ".join(errors["error"].astype(str))


def _json_frame(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("path", sorted(FIXTURE.glob("*/records-*.jsonl")), ids=lambda p: p.parent.name)
def test_records_reader_equals_line_by_line_json(path: Path) -> None:
    fast, bad = read_records_file(path)
    text = path.read_text()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    good = []
    for ln in lines:
        try:
            good.append(json.loads(ln))
        except ValueError:
            pass
    assert bad == len(lines) - len(good)
    ref = pd.DataFrame(good)
    fast = fast.sort_values(["stage", "trace_id"]).reset_index(drop=True)
    ref = ref.sort_values(["stage", "trace_id"]).reset_index(drop=True)
    for col in (
        "trace_id",
        "ttft_ms",
        "worst_gap_ms",
        "total_ms",
        "sent_s",
        "end_s",
        "worst_gap_end_s",
        "chunks",
    ):
        np.testing.assert_array_equal(fast[col].to_numpy(dtype=float), ref[col].to_numpy(dtype=float), err_msg=col)
    assert fast["ignore_eos"].tolist() == ref["ignore_eos"].tolist()
    assert fast["stage_label"].astype(str).tolist() == ref["stage_label"].tolist()
    assert fast["error_class"].astype(object).where(fast["error_class"].notna(), None).tolist() == [
        None if pd.isna(x) else x for x in ref["error_class"]
    ]


def test_reader_falls_back_for_lines_it_cannot_take(tmp_path: Path) -> None:
    src = FIXTURE / "chunked-cont" / "records-fixture-host-1001.jsonl"
    lines = src.read_text().splitlines()
    # run ids with separators, per-chunk lists, a merged line from a restarted writer
    odd = []
    for i, ln in enumerate(lines):
        d = json.loads(ln)
        d["run_id"] = "2026-08-04T08:00:00Z"
        if i % 2:
            d["chunk_offsets_ms"] = [1.0, 2.5, 4.0]
        odd.append(json.dumps(d, separators=(",", ":")))
    merged = odd[0][:40] + odd[1]
    path = tmp_path / "records-x-1.jsonl"
    path.write_text("\n".join([*odd[2:], merged]) + "\n")
    df, bad = read_records_file(path)
    assert bad == 1
    assert len(df) == len(lines) - 2
    assert set(df["run_id"].astype(str)) == {"2026-08-04T08:00:00Z"}
    chunks = tmp_path / "records-y-1.jsonl"
    chunks.write_text("\n".join(json.dumps({**json.loads(x), "chunk_offsets_ms": [1.0, 2.0]}) for x in lines) + "\n")
    df2, bad2 = read_records_file(chunks)
    assert (bad2, len(df2)) == (0, len(lines))


def test_error_texts_come_back_exactly(tmp_path: Path) -> None:
    texts = [
        'he said "hi": then left',
        "ends with a backslash \\",
        "braces {a: 1}, commas, colons: many " + ",:" * 40,
        "plain",
        'ünïcode ✓ and "quotes"',
        'quote at the end"',
    ]
    lines = (FIXTURE / "chunked-cont" / "records-fixture-host-1001.jsonl").read_text().splitlines()
    out = []
    for i, ln in enumerate(lines):
        d = json.loads(ln)
        if i < len(texts):
            d["error_class"], d["error"] = "client_error", texts[i]
        out.append(json.dumps(d, separators=(",", ":"), ensure_ascii=i % 2 == 0))
    path = tmp_path / "records-z-1.jsonl"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    df, bad = read_records_file(path)
    assert bad == 0 and len(df) == len(lines)
    got = dict(zip(zip(df["stage"], df["trace_id"], strict=True), df["error"], strict=True))
    for i, ln in enumerate(lines[: len(texts)]):
        d = json.loads(ln)
        assert got[(d["stage"], d["trace_id"])] == texts[i]


def test_parallel_reading_and_drawing_match_serial(
    results: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tailgate.postprocess.report as report_module
    import tailgate.postprocess.runfolders as load_module

    serial = load_records(results)
    monkeypatch.setattr(load_module, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(report_module, "PARALLEL_CHART_RECORDS", 0)
    parallel = load_records(results)
    pd.testing.assert_frame_equal(serial, parallel)
    assert parallel.attrs == serial.attrs
    paths = build_report(results, out_dir=tmp_path / "parallel")
    assert set(paths.charts) == {"chart1", "chart2", "chart3", "chart3_preempt"}
    assert all(p.stat().st_size > 10_000 for ps in paths.charts.values() for p in ps)


def test_server_metrics_load_per_run() -> None:
    df = load_server_metrics(FIXTURE)
    assert set(df["run_dir"]) == {"chunked-cont", "preempt"}
    assert df.loc[df["run_dir"] == "preempt", "preemptions_total"].max() == 15


# ---------------------------------------------------------------------------------------------
# summaries recomputed from records


def test_measured_mask_matches_the_core_rules() -> None:
    records = load_records(FIXTURE)
    scan = read_records(FIXTURE / "chunked-cont").records
    for rule in ("completion", "trace"):
        mask = measured_mask(records, 5, rule)
        for stage in (0, 1):
            sel = records.loc[mask & (records["run_dir"] == "chunked-cont") & (records["stage"] == stage)]
            core = measured_records([r for r in scan if r.stage == stage], 5, rule)
            assert sorted(sel["trace_id"]) == sorted(r.trace_id for r in core)


def test_summaries_from_records_equal_the_summary_files() -> None:
    records = load_records(FIXTURE)
    config = {
        "chunked-cont": "chunked",
        "chunked-gated": "chunked",
        "nochunk-cont": "nochunk",
        "preempt": "preempt",
    }
    derived = {
        cell_name(config[d["run_dir"]], d["arm"], d["rate_or_batch"]): d
        for d in summaries_from_records(records, default_warmup=5)
    }
    files = _summary_files()
    assert set(derived) == set(files)
    for cell, want in files.items():
        got = derived[cell]
        for key in ("n", "errors", "sent", "completion_tokens"):
            assert got[key] == want[key], (cell, key)
        for key in ("ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99",
                    "ttft_from_intended_p99", "schedule_lag_p99", "chunks_p50"):  # fmt: skip
            assert got[key] == pytest.approx(want[key], abs=0.051), (cell, key)
        assert got["errors_by_class"] == want["errors_by_class"]
        assert got["window_start_s"] == want["window_start_s"]
        assert got["window_end_s"] == want["window_end_s"]


def test_a_run_without_summary_files_gets_them_from_records(results: Path) -> None:
    for p in (results / "nochunk-cont").glob("summary-*.json"):
        p.unlink()
    df = load_summaries(results).set_index("cell")
    files = _summary_files()
    for cell in ("nochunk_cont_r2", "nochunk_cont_r8"):
        assert df.loc[cell, "summary_source"] == "records"
        assert df.loc[cell, "gap_p99"] == pytest.approx(files[cell]["gap_p99"], abs=0.051)


# ---------------------------------------------------------------------------------------------
# table


def test_table_numbers_equal_the_summaries() -> None:
    table = summary_table(load_summaries(FIXTURE))
    files = _summary_files()
    assert table["cell"].tolist() == CELLS
    for _, row in table.iterrows():
        want = files[row["cell"]]
        for key in ("n", "ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99", "errors",
                    "ttft_from_intended_p99", "schedule_lag_p99"):  # fmt: skip
            assert row[key] == want[key], (row["cell"], key)
        direct = want["preemptions_delta"]
        assert (pd.isna(row["preemptions_direct"]) and direct is None) or row["preemptions_direct"] == direct


def test_report_table_files_hold_the_same_numbers(report: ReportPaths) -> None:
    csv = pd.read_csv(report.table_csv).set_index("cell")
    files = _summary_files()
    for cell, want in files.items():
        for key in ("ttft_p99", "gap_p99", "total_p99", "n", "errors"):
            assert csv.loc[cell, key] == want[key]
    md = report.table_md.read_text()
    header = md.splitlines()[0]
    assert header.count("|") == len(TABLE_COLUMNS) + 1
    for cell, want in files.items():
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {cell} |"))
        assert f" {want['gap_p99']:.1f} " in line and f" {want['ttft_p99']:.1f} " in line
    assert csv.loc["preempt_cont_r8", "preemptions_direct"] == 15
    assert csv.loc["preempt_cont_r8", "preemptions_source"] == "direct_scrape"


def test_markdown_marks_missing_values() -> None:
    table = summary_table(load_summaries(FIXTURE))
    md = table_markdown(table)
    gated = next(ln for ln in md.splitlines() if ln.startswith("| chunked_gated_b4 |"))
    assert "–" in gated  # no preemption reading for the gated run


def test_decision_rate_rules() -> None:
    table = summary_table(load_summaries(FIXTURE))
    assert choose_decision_rate(table) == 8.0  # highest rate with chunked prefill both on and off
    assert choose_decision_rate(table, 2.0) == 2.0
    with pytest.raises(ResultsError, match="no continuous cell at rate 3"):
        choose_decision_rate(table, 3.0)
    only_on = table.loc[table["config"] != "nochunk"]
    assert choose_decision_rate(only_on) == 8.0
    ten = only_on.assign(rate_or_batch=only_on["rate_or_batch"].replace({2.0: 10.0}))
    assert choose_decision_rate(ten.loc[ten["config"] == "chunked"]) == 10.0


# ---------------------------------------------------------------------------------------------
# report


def test_report_renders_table_charts_diagnosis(report: ReportPaths) -> None:
    html = report.html.read_text()
    assert "<table" in html and all(f'<td data-label="cell">{c}</td>' in html for c in CELLS)
    assert len(re.findall(r"<img [^>]*src=\"data:image/png;base64,", html)) >= 3
    assert "Diagnosis: the five questions" in html
    for q in QUESTIONS:
        assert q.split("?")[0][:40].replace("'", "&#x27;") in html
    assert "no Prometheus data: preemption deltas from direct /metrics scrapes" in html
    assert "chunked-gated: 1 request(s) sent but never recorded" in html
    assert "run.json" in html and "3f2a9c1d7e01" in html  # run metadata of every run
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html)
    assert "<link" not in html and "<script" not in html


def test_chart_files_are_real_images(report: ReportPaths) -> None:
    assert set(report.charts) == {"chart1", "chart2", "chart3", "chart3_preempt"}
    for paths in report.charts.values():
        png, svg = paths
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert "<svg" in svg.read_text()[:2000] and svg.stat().st_size > 10_000


def test_diagnosis_answers_all_five_with_evidence(report: ReportPaths) -> None:
    data = json.loads(report.diagnosis_json.read_text())
    findings = data["findings"]
    assert [f["number"] for f in findings] == [1, 2, 3, 4, 5]
    for f in findings:
        assert set(f) >= {"question", "verdict", "evidence", "text"} and f["verdict"] and f["text"]
    q1, q2, q3, q4, q5 = findings
    assert q1["verdict"].startswith("yes") and q1["evidence"]["gated_vs_continuous"][0]["ttft_p50_ratio"] > 2
    assert q2["verdict"].startswith("yes") and q2["evidence"]["attribution"]["share"] > 0.5
    by_rate = {i["rate"]: i for i in q3["evidence"]["by_rate"]}
    assert set(by_rate) == {2.0, 8.0}
    assert by_rate[8.0]["gap_p99_ratio"] == pytest.approx(233.6 / 142.0, abs=0.001)
    # 48-50 requests per cell: a p99 interval would rest on one request, so none is given, and it is said
    ci = by_rate[8.0]["bootstrap"]["gap_p99"]
    assert ci["ci"] is None and "needs at least 437" in ci["why_no_ci"] and (ci["n_a"], ci["n_b"]) == (48, 50)
    assert "no interval: n = 48 and 50" in q3["text"] and "95% CI" not in q3["text"]
    assert q3["verdict"].startswith("yes by the point values only (fewer than 437 requests per cell: no interval)")
    # why there is no interval is said once for all the answers, not beside each comparison
    assert not any("needs at least" in f["text"] for f in findings)
    text = render_text(findings)
    assert text.count("needs at least 437 requests in each cell") == 1 and text.startswith("No interval:")
    assert "without_unmeasured" not in q3  # no cell here is marked not a measurement
    assert "1.65× at 8 req/s (n = 48, 50)" in q3["verdict"]
    # chart 3 and question 2 call the same prompts long
    from tailgate.postprocess.prompts import long_prompt_threshold

    assert q2["evidence"]["attribution"]["big_prompt_min_tokens"] == 6000 == long_prompt_threshold([200, 1000, 6000])
    pre = next(c for c in q4["evidence"]["cells"] if c["cell"] == "preempt_cont_r8")
    assert pre["moved"] and pre["direct"] == 15
    assert pre["requests_in_flight_during_increments"] >= pre["requests_stalled_during_increments"]
    assert pre["requests_stalled_during_increments"] >= pre["requests_whose_worst_gap_spans_an_increment"] > 0
    assert len(pre["stalled_trace_ids"]) == pre["requests_stalled_during_increments"]
    assert set(pre["spanning_trace_ids"]) <= set(pre["stalled_trace_ids"])
    assert all(isinstance(i, int) for i in pre["stalled_trace_ids"])
    assert q5["verdict"].startswith("yes") and q5["evidence"]["prompt_classes"] == [200, 1000, 6000]


def test_diagnosis_is_deterministic_and_says_small_effects_plainly() -> None:
    rng = np.random.default_rng(3)
    n = 500
    frames = []
    for run in ("on", "off"):
        for stage, rate in enumerate((5.0, 10.0)):
            sent = 1e9 + stage * 1000 + np.sort(rng.uniform(0, 60, n))
            gap = rng.lognormal(4.0, 0.4, n)
            frames.append(
                pd.DataFrame(
                    {
                        "run_id": run, "worker": "w", "trace_id": np.arange(n), "stage": stage,
                        "stage_label": f"cont_r{int(rate)}", "arm": "continuous", "rate_or_batch": rate,
                        "prompt_tokens_planned": 200, "max_tokens": 100, "intended_s": sent, "sent_s": sent,
                        "schedule_lag_ms": 0.5, "first_chunk_s": sent + 0.02, "last_chunk_s": sent + 2.0,
                        "end_s": sent + 2.0, "ttft_ms": rng.lognormal(3.0, 0.3, n),
                        "ttft_from_intended_ms": 21.0,
                        "worst_gap_ms": gap, "worst_gap_end_s": sent + 1.0, "total_ms": 2000.0,
                        "total_from_intended_ms": 2000.0, "chunks": 100, "completion_tokens": 100,
                        "error_class": None, "run_dir": run,
                    }
                )
            )  # fmt: skip
    records = pd.concat(frames, ignore_index=True)
    summaries = pd.DataFrame(summaries_from_records(records))
    summaries["config"] = summaries["run_dir"].map({"on": "chunked", "off": "nochunk"})
    summaries["cell"] = [
        cell_name(c, "continuous", r) for c, r in zip(summaries["config"], summaries["rate_or_batch"], strict=True)
    ]
    a = diagnose(summaries, records)
    b = diagnose(summaries, records)
    assert a == b
    q3 = a[2]
    assert q3["verdict"].startswith("no difference resolved: worst-gap p99 off/on")
    assert all(i["small"] for i in q3["evidence"]["by_rate"])
    # n = 500 per cell: distribution-free intervals are computed and stated with their n
    assert all(i["bootstrap"]["gap_p99"]["n_a"] == 500 and "ci_low" in i["bootstrap"]["gap_p99"]
               for i in q3["evidence"]["by_rate"])  # fmt: skip
    assert "95% CI [" in q3["text"] and "n = 500 and 500" in q3["text"]
    q5 = a[4]
    assert q5["verdict"].startswith("no: one prompt length")
    assert "5." in render_text(a)


def test_fast_bootstrap_matches_the_textbook_one() -> None:
    x = np.random.default_rng(11).lognormal(3, 1, 300)
    fast = bootstrap_percentile(x, 99, 20000, np.random.default_rng(1))
    slow = bootstrap_percentile_naive(x, 99, 4000, np.random.default_rng(2))
    for q in (5, 25, 50, 75, 95):
        assert np.percentile(fast, q) == pytest.approx(np.percentile(slow, q), rel=0.06)
    # the stated interval is distribution-free: at n = 300 no order statistic bounds a p99 at 98.75%
    d1 = percentile_difference(x, x * 3.0, seed=7)
    assert d1 is not None and d1.high is None and d1.includes_zero and d1.ratio == pytest.approx(3.0)
    y = np.random.default_rng(12).lognormal(3, 1, 2000)
    d2 = percentile_difference(y, y * 3.0)
    assert d2 is not None and d2.low is not None and d2.low > 0
    same = percentile_difference(y, y.copy())
    assert same is not None and same.includes_zero
    assert percentile_difference(np.array([]), x) is None


# ---------------------------------------------------------------------------------------------
# command line


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tailgate report: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_cli_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main([str(tmp_path / "absent")]) == 2
    assert "does not exist" in _one_line_error(capsys)


def test_cli_folder_that_is_not_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "readme.txt").write_text("nothing here")
    assert report_main([str(tmp_path)]) == 2
    assert "holds no runs" in _one_line_error(capsys)


def test_cli_bad_options(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main([str(results), "--prometheus-url", "localhost:9090"]) == 2
    assert "http(s) URL" in _one_line_error(capsys)
    assert report_main([str(results), "--decision-rate", "3"]) == 2
    assert "no continuous cell at rate 3" in _one_line_error(capsys)
    assert report_main([str(results), "--decision-rate", "fast"]) == 2
    _one_line_error(capsys)
    assert report_main([]) == 2
    _one_line_error(capsys)


def test_cli_writes_the_report(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "elsewhere"
    assert report_main(["report", str(results), "--out", str(out), "--decision-rate", "2"]) == 0
    stdout = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in stdout
    assert (out / "chart3.png").is_file() and (out / "table.md").is_file()
    diag = json.loads((out / "diagnosis.json").read_text())
    assert diag["decision_rate"] == 2.0


def test_public_names_and_no_load_path_imports() -> None:
    code = (
        "import sys\n"
        "import tailgate.postprocess as postprocess\n"
        "from tailgate.postprocess import build_report, diagnose, load_records, load_summaries, summary_table\n"
        "import tailgate.postprocess.charts, tailgate.postprocess.prometheus, tailgate.postprocess.cli\n"
        "assert not ({'gevent', 'locust'} & set(sys.modules)), 'the analysis imported the load path'\n"
        "assert set(postprocess.__all__) <= set(dir(postprocess))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tempfile.gettempdir())


def test_installed_names_live_under_the_tailgate_namespace() -> None:
    """The folders keep their names in the tree; installed, nothing generic lands in site-packages."""
    code = (
        "import importlib.util as u\n"
        "for name in ('shapes', 'postprocess', 'locustfiles'):\n"
        "    assert u.find_spec(name) is None, name\n"
        "    assert u.find_spec('tailgate.' + name) is not None, name\n"
        "assert u.find_spec('tailgate.trace') is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tempfile.gettempdir())


def test_a_bare_checkout_maps_the_same_names() -> None:
    """Without the install (no site-packages at all: ``-S``), the checkout on PYTHONPATH still imports
    the folders under the namespace, as on a GPU box with no build backend."""
    root = Path(__file__).resolve().parents[1]
    code = (
        "import tailgate.locustfiles, tailgate.shapes, tailgate.postprocess\n"
        f"assert tailgate.locustfiles.__file__ == {str(root / 'locustfiles' / '__init__.py')!r}\n"
        "import sys\n"
        "assert not any('site-packages' in p for p in sys.path)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-S", "-c", code], check=True, cwd=tempfile.gettempdir(), env=env)


def test_an_unreachable_prometheus_is_one_note_in_words(tmp_path: Path) -> None:
    from tailgate.postprocess.report import analyze
    from tailgate.servers import free_port

    results = tmp_path / "results"
    shutil.copytree(FIXTURE, results)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    notes = analyze(results, prometheus_url=url, save_series=False).notes
    about = [n for n in notes if url in n]
    said = f"Prometheus at {url} did not answer (connection refused): every run uses the direct /metrics scrapes"
    assert about == [said]
    assert not any(word in " ".join(notes) for word in ("HTTPConnectionPool", "Max retries", "urllib3", "Errno"))
    assert all("\n" not in n for n in notes)


def test_question_2_says_when_gaps_inside_long_prefills_were_shorter() -> None:
    """Streams whose worst gap falls inside a long prefill, but is shorter than everyone else's: the
    diagnosis must say so and not count it as prefill stalls."""
    rows = []
    for stage, rate in enumerate((5.0, 10.0)):
        base = 1e9 + stage * 1000
        for k, start in enumerate((10.0, 30.0, 50.0)):  # long prompts prefill for 2 s each
            rows.append({"trace_id": 1000 + k, "stage": stage, "rate_or_batch": rate, "prompt_tokens_planned": 6000,
                         "sent_s": base + start, "first_chunk_s": base + start + 2.0, "last_chunk_s": base + start + 4,
                         "worst_gap_ms": 30.0, "worst_gap_end_s": base + start + 3.0})  # fmt: skip
        for i in range(60):
            t = base + i
            big_gap = 0.1 * (1 + stage)
            clear = [
                e
                for e in (0.5, 2.5, 4.5)  # a gap end whose interval touches no long prefill
                if not any(w - 0.05 <= i + e and i + e - big_gap <= w + 2.05 for w in (10.0, 30.0, 50.0))
            ]
            inside = i % 3 == 0 and any(w <= i + 2.5 <= w + 2.0 for w in (10.0, 30.0, 50.0))
            if not inside and not clear:
                continue
            gap_end = t + 2.5 if inside else t + clear[0]
            rows.append({"trace_id": i, "stage": stage, "rate_or_batch": rate, "prompt_tokens_planned": 200,
                         "sent_s": t, "first_chunk_s": t + 0.02, "last_chunk_s": t + 5.0,
                         "worst_gap_ms": 20.0 if inside else 100.0 * (1 + stage),
                         "worst_gap_end_s": gap_end})  # fmt: skip
    records = pd.DataFrame(rows)
    n = len(records)
    records = records.assign(
        run_id="r", worker="w", stage_label=[f"cont_r{int(r)}" for r in records["rate_or_batch"]], arm="continuous",
        max_tokens=100, intended_s=records["sent_s"], schedule_lag_ms=0.5, end_s=records["last_chunk_s"],
        ttft_ms=20.0, ttft_from_intended_ms=20.0, total_ms=5000.0, total_from_intended_ms=5000.0, chunks=100,
        completion_tokens=100, error_class=[None] * n, run_dir="run",
    )  # fmt: skip
    summaries = pd.DataFrame(summaries_from_records(records))
    summaries["config"] = "chunked"
    summaries["cell"] = [cell_name("chunked", "continuous", r) for r in summaries["rate_or_batch"]]
    q2 = diagnose(summaries, records)[1]
    att = q2["evidence"]["attribution"]
    assert att["inside_shorter"] is True
    assert att["median_worst_gap_inside_ms"] == 20.0 < att["median_worst_gap_other_ms"]
    assert "shorter inside, so these prefills did not lengthen the worst gaps they overlapped" in q2["text"]
    assert "inside a long prefill vs" not in q2["verdict"]  # not counted as prefill stalls


def test_an_answer_resting_on_a_cell_that_is_not_a_measurement_says_what_it_is_without_it() -> None:
    from tailgate.postprocess.diagnosis import _without_text

    same = _without_text(["chunked_cont_r2"], "yes: 1.7×", "yes: 1.7×")
    assert same == "Without chunked_cont_r2 the answer is the same."
    other = _without_text(["chunked_cont_r2"], "yes: 1.7×", "no: 1.0×")
    assert other == "Without chunked_cont_r2: no: 1.0×."
    none = _without_text(["a", "b"], "yes: 1.7×", "unknown: no rate ramp to compare")
    assert none == "Without a and b there is no answer (no rate ramp to compare)."
    assert _without_text(["a"], "yes", None) == "Without a there is no answer."
