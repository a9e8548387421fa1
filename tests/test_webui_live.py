"""The Tail latency tab's figures and the Start check, without a browser or a server.

The tab must say what the stage summary will say (same records, same warm-up rule, same
percentile), read files that are being appended to without ever parsing half a line, and turn
form values that do not convert into the command line's one-line errors.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

import pytest
from recordkit import record, records_of
from werkzeug.datastructures import MultiDict

from tailgate.contracts import StageSummary
from tailgate.load.options import OptionError
from tailgate.records import RequestRecord
from tailgate.stats import summarize_stage
from tailgate.webui import form_options
from tailgate.webui.live import Tail, stage_figures, table_rows


def records(n: int, seed: int = 3) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        failed = rng.random() < 0.1
        out.append({
            "trace_id": i, "intended_s": float(i), "end_s": i + rng.random() * 5, "schedule_lag_ms": rng.random(),
            "error_class": rng.choice(["http_500", "cancelled"]) if failed else None,
            "ttft_ms": None if failed else rng.lognormvariate(4, 1),
            "worst_gap_ms": None if failed else rng.random() * 90,
            "total_ms": None if failed else rng.lognormvariate(7, 0.5), "chunks": 10, "completion_tokens": 10,
        })  # fmt: skip
        out[-1]["ttft_from_intended_ms"], out[-1]["total_from_intended_ms"] = out[-1]["ttft_ms"], out[-1]["total_ms"]
    return records_of(out)


@pytest.mark.parametrize("rule", ["completion", "trace"])
def test_tab_figures_are_the_summary_figures(rule: str) -> None:
    recs = records(300)
    fig = stage_figures(recs, 25, rule)
    summary = summarize_stage(recs, arm="continuous", rate_or_batch=5, started="", warmup=25, warmup_rule=rule)
    assert fig.measured == summary["n"]
    for key, tails in (("ttft", fig.ttft), ("gap", fig.gap), ("total", fig.total)):
        assert (tails.p50, tails.p99) == (summary[f"{key}_p50"], summary[f"{key}_p99"])
    assert fig.errors_by_class == summary["errors_by_class"] and fig.errors == summary["errors"]
    assert fig.lag_p99 == summary["schedule_lag_p99"]
    good = [r.total_ms for r in recs if r.error_class is None and r.total_ms is not None]
    assert fig.total.max is not None and fig.total.max <= round(max(good), 1)


def test_an_empty_stage_reads_as_dashes() -> None:
    fig = stage_figures([], 25, "completion")
    assert fig.ttft.to_json() == {"p50": None, "p90": None, "p99": None, "max": None} and fig.errors == 0
    snap = {"stages": [{"label": "cont_r1", "state": "waiting", "planned": 10, "sent": 0, "recorded": 0,
                        "preemptions": None, **fig.to_json()}]}  # fmt: skip
    (row,) = table_rows(snap)
    assert row["ttft"] == "–" and row["counts"] == "10 / 0 / 0" and row["errors"] == "0"
    assert row["unsent"] == "0 / – / 0"  # never sent is known once the stage is summarized


def test_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    tail = Tail(tmp_path, "records-*.jsonl")
    path = tmp_path / "records-a.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2')  # the second line is being written
    assert tail.new_lines() == [b'{"a": 1}']
    assert tail.new_lines() == []
    with open(path, "ab") as f:
        f.write(b'}\n{"a": 3}\n')
    (tmp_path / "records-b.jsonl").write_bytes(b'{"b": 1}\n')
    assert tail.new_lines() == [b'{"a": 2}', b'{"a": 3}', b'{"b": 1}']


def parsed() -> argparse.Namespace:
    return argparse.Namespace(host="", rates="1,5", n=500, settle=2.0, ignore_eos=False, results_dir="", model="",
                              num_users=1)  # fmt: skip


def test_form_values_keep_each_option_type() -> None:
    form = MultiDict({"host": "http://h:8000<>", "rates": "2,3", "n": "12", "settle": "0.5", "ignore_eos": "true",
                      "user_count": "7", "unknown": "x"})  # fmt: skip
    opts = form_options(parsed(), form)
    assert (opts.host, opts.rates, opts.n, opts.settle, opts.ignore_eos) == ("http://h:8000", "2,3", 12, 0.5, True)
    assert opts.num_users == 1 and not hasattr(opts, "unknown")
    assert parsed().n == 500  # a copy: Locust's own options are left to Locust


@pytest.mark.parametrize(("field", "value", "line"), [
    ("n", "ten", "--n: 'ten' is not a whole number"),
    ("settle", "soon", "--settle: 'soon' is not a number"),
])  # fmt: skip
def test_form_values_that_do_not_convert_name_the_option(field: str, value: str, line: str) -> None:
    with pytest.raises(OptionError) as e:
        form_options(parsed(), MultiDict({field: value}))
    assert str(e.value) == line


def test_the_web_ui_code_stays_out_of_the_analysis_stack() -> None:
    """The tab runs in the load generator's loop: no pandas, numpy or matplotlib get imported with it."""
    code = (
        "import sys\n"
        "import tailgate.locustfiles.continuous, tailgate.locustfiles.gated, tailgate.webui, tailgate.webui.live\n"
        "import tailgate.load.session\n"
        "heavy = {'pandas', 'numpy', 'matplotlib'} & set(sys.modules)\n"
        "assert not heavy, f'the load path imported {heavy}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_a_report_cut_short_by_quitting_says_so(tmp_path: Path) -> None:
    """Quitting the web UI while a report builds ends the build and leaves a line saying so, and how to build it."""
    from tailgate.load.session import RunSession
    from tailgate.resultfiles import REPORT_LOG

    run = RunSession.__new__(RunSession)
    run.folder, run.run_id = tmp_path, "r1"
    run.report = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert run.report_state() == "building"
    run.end_report()
    assert run.report.returncode is not None
    assert run.report_state() == "failed"
    assert "report interrupted while building" in (run.report_error() or "")
    assert f"tailgate report {tmp_path}" in (tmp_path / REPORT_LOG).read_text()
    run.report = None  # as a later look at the folder sees it
    assert run.report_state() == "interrupted"


def test_the_tab_counts_sends_as_the_analysis_does(tmp_path: Path) -> None:
    """The journal's ``dropped`` lines take a send back in the tab as in the summaries (one reader for both),
    and a worker's own record replaces the ``worker_lost`` one."""
    from types import SimpleNamespace

    from tailgate.load.plan import continuous_stage
    from tailgate.load.workload import make_trace
    from tailgate.records import read_sent
    from tailgate.webui.live import LiveRun

    stage = continuous_stage(0, make_trace(6), 5.0, 7, 0)
    (tmp_path / "sent-w.log").write_text("0 0\n0 1\n0 2\n0 2 dropped\n0 3\n0 3 dropped\n0 4\n")
    rows = [record(run_id="r", trace_id=i, end_s=10.0 + i, ttft_ms=5.0, worst_gap_ms=2.0) for i in (0, 1)]
    rows.append(record(run_id="r", trace_id=4, end_s=12.0, error_class="worker_lost"))
    rows.append(record(run_id="r", trace_id=4, end_s=12.5, ttft_ms=6.0))
    (tmp_path / "records-w.jsonl").write_text("".join(r.to_json() + "\n" for r in rows))
    settings = SimpleNamespace(warmup_rule="trace", arm="continuous", host="h", model="m", warmup=0)
    session = SimpleNamespace(
        folder=tmp_path, stages=[stage], settings=settings, current=stage, ended=False, stopping=False,
        summaries=SimpleNamespace(by_stage={}, before={}, dropped={}), run_id="r", status="running",
        stop_reason=None, started=0.0, ended_at=None, coordinator_alive=True, sampler_alive=False,
        report_state=lambda: "none", report_error=lambda: None,
    )  # fmt: skip
    live = LiveRun(session)
    snap = live.snapshot()["stages"][0]
    assert snap["sent"] == len(read_sent(tmp_path)) == 3 and snap["dropped"] == 2 and snap["recorded"] == 3
    assert snap["errors"] == 0  # the worker_lost record was superseded
    # a Stop: the two take-backs were arrivals the stop cancelled, not refused by the in-flight cap; from the
    # stop on, and in the summary, dropped is what the load processes reported refusing: one definition
    session.stopping = True
    assert live.snapshot()["stages"][0]["dropped"] == 0
    summary = StageSummary(partial=True, dropped_arrivals=0, preemptions_delta=None, never_sent=3)
    session.summaries.by_stage = {0: summary}
    snap = live.snapshot()["stages"][0]
    assert (snap["dropped"], snap["never_sent"]) == (0, 3)
