"""Both arms through a real ``locust --headless`` process against a real (CPU) vLLM."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import load_records, load_summaries, run_locust, write_trace

from tailgate.load.plan import poisson_offsets
from tailgate.load.processes import master_port_args
from tailgate.records import RequestRecord
from tailgate.stats import summarize_stage

pytestmark = pytest.mark.vllm

#: Short prompts keep 2 cores responsive; one long prompt per stage still exercises prefill insertion.
SHORT_MIX = [(32, 16)] * 9 + [(400, 24)]


def short_trace(tmp_path: Path, n: int) -> Path:
    return write_trace(tmp_path / "trace.jsonl", (SHORT_MIX * (n // len(SHORT_MIX) + 1))[:n])


def check_sane(records: list[dict]) -> None:
    for r in records:
        assert r["error_class"] is None, r
        assert r["ttft_ms"] > 0 and r["worst_gap_ms"] >= 0 and r["total_ms"] >= r["ttft_ms"]
        assert r["chunks"] >= 1 and r["completion_tokens"] == r["max_tokens"]  # ignore_eos
        assert r["finish_reason"] == "length" and r["prompt_tokens"] == r["prompt_tokens_planned"]
        assert r["ttft_from_intended_ms"] >= r["ttft_ms"] - 0.01


def check_summary_matches_records(summary: dict, records: list[dict]) -> None:
    again = summarize_stage(
        [RequestRecord.from_dict(r) for r in records],
        arm=summary["arm"], rate_or_batch=summary["rate_or_batch"], started=summary["started"],
        warmup=summary["warmup"], warmup_rule=summary["warmup_rule"], preemptions_delta=summary["preemptions_delta"],
    )  # fmt: skip
    for key, value in again.items():
        assert summary[key] == value, key


def test_continuous_ramp_open_loop(vllm_server, tmp_path: Path) -> None:
    trace = short_trace(tmp_path, 24)
    out = tmp_path / "cont"
    done = run_locust(
        "continuous.py", vllm_server.base_url, out,
        "--rates", "2,4", "--trace-file", str(trace), "--warmup", "4", "--ignore-eos", "--settle", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(out)
    summaries = load_summaries(out)
    assert set(summaries) == {"cont_r2", "cont_r4"}
    for label, rate in (("cont_r2", 2.0), ("cont_r4", 4.0)):
        stage = [r for r in records if r["stage_label"] == label]
        # every trace item exactly once per stage, nothing dropped
        assert sorted(r["trace_id"] for r in stage) == list(range(24))
        check_sane(stage)
        # open loop: intended send times are t0 + the harness's cumulative gaps, to the microsecond
        stage.sort(key=lambda r: r["trace_id"])
        t0 = stage[0]["intended_s"]
        planned = poisson_offsets(24, rate, 7)
        assert [round(r["intended_s"] - t0, 4) for r in stage] == [round(x, 4) for x in planned]
        summary = summaries[label]
        assert summary["n"] == 20 and summary["errors"] == 0 and summary["sent"] == 24
        assert summary["preemptions_delta"] is not None and summary["preemptions_delta"] >= 0
        # the engine's own inter-token histogram, read around the stage: the server's count of slow gaps
        assert summary["server_slow_gaps_delta"] is not None and summary["server_slow_gaps_delta"] >= 0
        assert summary["server_slow_gap_edge_s"] >= 0.25
        check_summary_matches_records(summary, stage)
    # stages are separated: the second starts after every request of the first ended
    first_end = max(r["end_s"] for r in records if r["stage_label"] == "cont_r2")
    assert min(r["sent_s"] for r in records if r["stage_label"] == "cont_r4") > first_end


def test_gated_barrier(vllm_server, tmp_path: Path) -> None:
    trace = short_trace(tmp_path, 16)
    out = tmp_path / "gated"
    done = run_locust(
        "gated.py", vllm_server.base_url, out, "--batch-size", "4", "--trace-file", str(trace), "--warmup", "4",
        "--ignore-eos",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = load_records(out)
    assert sorted(r["trace_id"] for r in records) == list(range(16))
    check_sane(records)
    batches: dict[int, list[dict]] = {}
    for r in records:
        batches.setdefault(r["batch"], []).append(r)
    assert sorted(batches) == [0, 1, 2, 3]
    for k in range(1, 4):
        assert sorted(r["trace_id"] for r in batches[k]) == list(range(4 * k, 4 * k + 4))
        assert min(r["sent_s"] for r in batches[k]) >= max(r["end_s"] for r in batches[k - 1])
    summary = load_summaries(out)["gated_b4"]
    assert summary["arm"] == "gated" and summary["rate_or_batch"] == 4 and summary["n"] == 12
    check_summary_matches_records(summary, records)


def test_two_processes_split_one_schedule(vllm_server, tmp_path: Path) -> None:
    trace = short_trace(tmp_path, 20)
    single, multi = tmp_path / "one", tmp_path / "two"
    common = ["--rates", "3", "--trace-file", str(trace), "--warmup", "2", "--ignore-eos"]
    assert run_locust("continuous.py", vllm_server.base_url, single, *common).returncode == 0
    done = run_locust("continuous.py", vllm_server.base_url, multi, "--processes", "2", *master_port_args(), *common)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = load_records(single), load_records(multi)
    assert len({r["worker"] for r in two}) == 2
    assert sorted(r["trace_id"] for r in two) == list(range(20))

    def offsets(records: list[dict]) -> list[float]:
        records = sorted(records, key=lambda r: r["trace_id"])
        return [round(r["intended_s"] - records[0]["intended_s"], 4) for r in records]

    assert offsets(two) == offsets(one)


def test_preemption_delta_direct_and_prometheus(vllm_preempt_server, tmp_path: Path) -> None:
    """A tiny KV pool forces preemption; a real Prometheus scraping every second agrees with the direct reads."""
    prometheus = start_prometheus(vllm_preempt_server.base_url, tmp_path / "prom")
    try:
        # eight 200-token prompts asking for 1200 tokens each cannot share 24 x 128 KV blocks
        trace = write_trace(tmp_path / "long.jsonl", [(200, 1200)] * 8)
        out = tmp_path / "preempt"
        extra = ["--prometheus-url", prometheus.url] if prometheus else []
        done = run_locust(
            "gated.py", vllm_preempt_server.base_url, out, "--batch-size", "8", "--trace-file", str(trace),
            "--warmup", "0", "--ignore-eos", "--config-label", "preempt", *extra, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        summary = load_summaries(out)["gated_b8"]
        assert summary["errors"] == 0
        assert summary["preemptions_delta"] > 0, summary
        assert summary["preemptions_after"] - summary["preemptions_before"] == summary["preemptions_delta"]
        if prometheus is None:
            pytest.skip("no prometheus binary: the direct-scrape half passed")
        time.sleep(2.5)  # one more scrape after the stage's last read
        from tailgate.postprocess.prometheus import collect_server_data
        from tailgate.postprocess.report import build_report
        from tailgate.postprocess.runfolders import find_run_dirs
        from tailgate.postprocess.runfolders import load_summaries as pp_load_summaries

        data = collect_server_data(find_run_dirs(out), pp_load_summaries(out), prometheus.url, save=False)
        row = data.preemptions.iloc[0]
        assert row["preemptions_prometheus"] == summary["preemptions_delta"], row.to_dict()
        assert row["preemptions_direct"] == summary["preemptions_delta"]
        assert row["preemptions_source"] == "prometheus" and not row["preemptions_disagree"]
        series = data.series
        assert len(series) and (series["source"] == "prometheus").all()
        # covered to within one scrape interval (1 s): Prometheus aligns a range query's points to its step
        assert series["t"].min() <= summary["window_start_s"] + 1.0
        assert series["t"].max() >= summary["window_end_s"] - 1.0
        assert series["running"].max() >= 1 and series["kv_usage"].max() > 0.5
        # the report says where its numbers came from
        report = build_report(out, prometheus_url=prometheus.url)
        assert set(json.loads(report.diagnosis_json.read_text())["series_sources"].values()) == {"prometheus"}
    finally:
        if prometheus is not None:
            prometheus.stop()


def start_prometheus(scrape_url: str, directory: Path):
    from tailgate.servers.prometheus import LocalPrometheus, find_prometheus

    if not find_prometheus():
        if os.environ.get("CI"):
            pytest.fail("CI must install the prometheus package (scripts/setup.sh does)")
        return None
    prom = LocalPrometheus(scrape_url, directory)
    prom.start()
    prom.wait_for_target()
    return prom
