"""The typed contracts, the result-file names, the option table and the arm registry.

Files written by any version must read back byte-for-byte the same (keys, their order, their values), a
damaged or wrong-typed file must fail with one line naming the file and the key, and keys a reader does not
know must survive a read-modify-write. The names and defaults have one owner each; the tests below fail
when a second copy reappears.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recordkit import record, records_of

from tailgate import arms, resultfiles
from tailgate.contracts import CaptureStats, ContractError, Order, OrderConfig, OrderDone, OrderItem, StageSummary
from tailgate.jsonl import Follower, parse_lines
from tailgate.load.plan import continuous_stage, gated_stage
from tailgate.load.workload import make_trace
from tailgate.optiontable import DEFAULTS, OptionError, check_counts, parse_rates
from tailgate.records import RequestRecord
from tailgate.runmeta import RunMeta, SloMeta, SuiteMeta
from tailgate.stats import SEED_SUMMARY_KEYS, field_values, summarize_stage, tail

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "results"
PRODUCT_DIRS = ("tailgate", "postprocess", "shapes", "locustfiles")


def _records(n: int) -> list[RequestRecord]:
    return records_of(
        {
            "trace_id": i, "intended_s": 100.0 + i * 0.2, "end_s": 101.0 + i * 0.2 + (i % 7) * 0.01,
            "schedule_lag_ms": 0.1 * (i % 5), "error_class": "http_500" if i % 11 == 0 else None,
            "ttft_ms": 20.0 + i, "worst_gap_ms": 5.0 + (i % 13), "total_ms": 300.0 + 3 * i, "chunks": 10 + i % 3,
            "ttft_from_intended_ms": 20.5 + i, "total_from_intended_ms": 300.5 + 3 * i, "completion_tokens": 10,
            "max_read_delay_ms": None if i % 2 else 0.3,
        }
        for i in range(n)
    )  # fmt: skip


def _summary() -> dict[str, Any]:
    """A summary as the coordinator writes it: the load path's keys, then the coordinator's."""
    s = summarize_stage(_records(60), arm="continuous", rate_or_batch=5.0, started="2026-01-01T00:00:00Z", warmup=5)
    s.update({"stage": 0, "stage_label": "cont_r5", "config": "chunked", "run_id": "abc", "partial": False,
              "window_start_s": 100.0, "window_end_s": 120.0, "planned": 60, "dropped_arrivals": 0,
              "preemptions_before": None, "preemptions_after": None, "metrics_url": None, "target_rate": 5.0,
              "sent_journal": 60, "workers_lost": [], "chunks_per_s": 31.2, "load_processes": 1})  # fmt: skip
    return s


def _order() -> dict[str, Any]:
    config = {"host": "http://127.0.0.1:1", "model": "m", "ignore_eos": True, "api_key": None, "prompt_word": "w",
              "record_chunks": False, "results_dir": "/tmp/r", "connect_timeout": 10.0, "request_timeout": 600.0,
              "stall_timeout": None}  # fmt: skip
    return {"order_id": "0:0:0", "run_id": "abc", "stage": 0, "stage_label": "gated_b4", "arm": "gated",
            "rate_or_batch": 4.0, "t0_wall": 1.5, "t0_master": 1.25, "max_in_flight": 0,
            "items": [[0, 200, 100, 0.0, 0], [1, 6000, 600, 0.0, 0]], "config": config}  # fmt: skip


# ----------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (StageSummary, _summary()),
        (Order, _order()),
        (RunMeta, {"run_id": "abc", "arm": "continuous", "status": "completed", "trace": {"seed": 7}, "pid": 3}),
        (SuiteMeta, {"created": "t", "servers": {"chunked": {"flags": []}}, "cells": ["chunked_cont_r5"]}),
        (SloMeta, {"created": "t", "started": "t", "plan": {"slo": "ttft_p99<=500ms"}, "configs": [{"name": "a"}]}),
    ],
)
def test_a_contract_writes_back_exactly_what_it_read(kind: type, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1)
    back = kind.from_dict(json.loads(text)).to_dict()
    assert json.dumps(back, indent=1) == text


def test_every_results_file_in_the_fixtures_round_trips(tmp_path: Path) -> None:
    kinds = {resultfiles.RUN_META: RunMeta}
    paths = sorted(FIXTURES.rglob("*.json"))
    assert paths
    for path in paths:
        kind = kinds.get(path.name, StageSummary if path.name.startswith("summary-") else None)
        if kind is None:
            continue
        raw = path.read_text()
        copy = tmp_path / path.name
        kind.read(path).write(copy)
        assert json.loads(copy.read_text()) == json.loads(raw)
        assert list(json.loads(copy.read_text())) == list(json.loads(raw)), path


def test_the_summary_starts_with_the_seeds_twelve_keys_in_order() -> None:
    summary = StageSummary.from_dict(_summary())
    assert tuple(summary.to_dict())[: len(SEED_SUMMARY_KEYS)] == SEED_SUMMARY_KEYS
    assert tuple(summary.seed_row()) == SEED_SUMMARY_KEYS
    fresh = StageSummary(arm="gated", n=3, started="t", rate_or_batch=16.0)
    assert tuple(fresh.to_dict())[:12] == SEED_SUMMARY_KEYS


def test_unknown_keys_survive_and_absent_known_keys_stay_absent(tmp_path: Path) -> None:
    path = tmp_path / resultfiles.RUN_META
    path.write_text(json.dumps({"run_id": "x", "from_a_newer_branch": {"k": [1, 2]}, "status": "running"}))
    meta = RunMeta.read(path)
    assert meta.extra == {"from_a_newer_branch": {"k": [1, 2]}}
    assert meta.get("from_a_newer_branch") == {"k": [1, 2]}
    meta.with_(status="completed", ended_by="test", ended=None).write(path)
    assert json.loads(path.read_text()) == {
        "run_id": "x", "from_a_newer_branch": {"k": [1, 2]}, "status": "completed", "ended_by": "test", "ended": None,
    }  # fmt: skip
    assert list(json.loads(path.read_text())) == ["run_id", "from_a_newer_branch", "status", "ended_by", "ended"]
    with pytest.raises(ContractError, match="run metadata key 'status' should be str or null, got 3"):
        meta.with_(status=3)


def test_an_order_types_its_items_and_travels_as_lists() -> None:
    order = Order.from_dict(_order())
    assert order.items[1] == OrderItem(1, 6000, 600, 0.0, 0)
    assert order.items[1].prompt_tokens == 6000
    assert order.to_dict()["items"] == _order()["items"]


WIRE_CONFIG = (
    "host", "model", "ignore_eos", "api_key", "prompt_word", "record_chunks", "results_dir", "prompts", "endpoint",
    "connect_timeout", "request_timeout", "stall_timeout", "chunk_stamp",
)  # fmt: skip
"""An order's config keys in the order the master has always sent them."""


def test_an_order_built_by_the_master_travels_as_it_always_did_and_is_read_typed() -> None:
    config = OrderConfig(
        host="http://h:1", model="m", ignore_eos=True, api_key=None, prompt_word="w", record_chunks=False,
        results_dir="/r", prompts="unique", endpoint="chat", connect_timeout=2.0, request_timeout=5.0,
        stall_timeout=None, chunk_stamp="recv",
    )  # fmt: skip
    order = Order(
        order_id="0:0:0", run_id="abc", stage=0, stage_label="cont_r5", arm="continuous", rate_or_batch=5.0,
        t0_wall=1.5, t0_master=1.25, max_in_flight=0, items=[OrderItem(0, 8, 20, 0.0, None)], config=config,
        arrivals="gamma",
    )  # fmt: skip
    wire = order.to_dict()
    assert list(wire) == [*Order.REQUIRED[:7], "t0_master", "max_in_flight", "items", "config", "arrivals"]
    assert list(wire["config"]) == list(WIRE_CONFIG) and wire["config"]["endpoint"] == "chat"
    assert wire["items"] == [[0, 8, 20, 0.0, None]]
    read = Order.from_dict(json.loads(json.dumps(wire)))
    assert read.config == config and read.arrivals == "gamma" and read.config.chunk_stamp == "recv"
    assert read.to_dict() == wire and list(read.to_dict()["config"]) == list(WIRE_CONFIG)
    older = Order.from_dict(_order())  # an order without the workload keys reads them as absent
    assert older.arrivals is None and older.config.endpoint is None and older.to_dict() == _order()


def test_a_done_reply_travels_as_an_object_and_is_read_back_typed() -> None:
    done = OrderDone(
        order_id="0:0:1", run_id="abc", stage=0, worker="w1", dropped=2, sent=40, ended=38, stamp="capture",
        capture=CaptureStats(packets=900, drops=1, missed_streams=0),
    )  # fmt: skip
    wire = done.to_dict()
    assert wire["capture"] == {"packets": 900, "drops": 1, "missed_streams": 0}
    read = OrderDone.from_dict(json.loads(json.dumps(wire)))
    assert read == done and read.capture == CaptureStats(packets=900, drops=1, missed_streams=0)
    # one process: the order's records ride along in memory, typed, never serialized
    mine = record(trace_id=3)
    local = OrderDone.from_dict(dataclasses.replace(done, records=[mine]).to_dict())
    assert local.records is not None and local.records[0] is mine
    failed = OrderDone.from_dict({**wire, "order_id": None, "stage": None, "capture": None, "error": "E: x"})
    assert failed.capture is None and failed.error == "E: x"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"order_id": "0:0:0", "run_id": "r", "stage": 0, "worker": "w"}, "order done lacks 'sent', 'ended'"),
        ({"order_id": "0", "run_id": "r", "stage": "0", "worker": "w", "sent": 1, "ended": 1},
         "order done key 'stage' should be int or null"),
        ({"order_id": "0", "run_id": "r", "stage": 0, "worker": "w", "sent": 1, "ended": 1, "capture": {"drops": "1"}},
         "capture stats key 'drops' should be int"),
    ],
)  # fmt: skip
def test_a_wrong_done_reply_fails_with_one_line_naming_the_key(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(ContractError) as e:
        OrderDone.from_dict(data, source="load process w")
    assert "\n" not in str(e.value) and str(e.value).startswith("load process w") and expected in str(e.value)


def test_a_summary_built_in_code_writes_its_notes_only_when_they_apply() -> None:
    fresh = StageSummary(arm="continuous", n=3, started="t", rate_or_batch=5.0)
    assert "prefix_cache_warning" not in fresh.to_dict() and "reconciled" not in fresh.to_dict()
    assert "never_sent" in fresh.to_dict()  # every other declared key is written, null when unknown
    noted = fresh.with_(reconciled=True, prefix_cache_warning="cached")
    assert list(noted.to_dict())[-1] == "reconciled" and noted.to_dict()["prefix_cache_warning"] == "cached"


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        (StageSummary, {**_summary(), "ttft_p99": "slow"}, "stage summary key 'ttft_p99' should be float or null"),
        (StageSummary, {**_summary(), "n": True}, "stage summary key 'n' should be int"),
        (StageSummary, {k: v for k, v in _summary().items() if k != "errors"}, "stage summary lacks 'errors'"),
        (RunMeta, {"run_id": 5}, "run metadata key 'run_id' should be str or null"),
        (RunMeta, ["run_id"], "run metadata must be a JSON object, got list"),
        (SuiteMeta, {"servers": []}, "suite metadata key 'servers' should be dict"),
        (SloMeta, {"configs": {}}, "slo metadata key 'configs' should be list"),
        (Order, {**_order(), "items": [[0, 200, 100, 0.0]]}, "order item 0 should be [trace_id int"),
        (Order, {**_order(), "items": [[0, "200", 100, 0.0, None]]}, "order item 0 should be"),
        (Order, {**_order(), "config": {"host": "h"}}, "order config lacks 'model'"),
        (Order, {**_order(), "config": {**_order()["config"], "endpoint": 5}}, "order config key 'endpoint' should"),
        (Order, {**_order(), "config": "h"}, "order key 'config' should be OrderConfig"),
    ],
)
def test_a_wrong_file_fails_with_one_line_naming_it_and_the_key(
    tmp_path: Path, kind: type, data: Any, expected: str
) -> None:
    path = tmp_path / "file.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError) as e:
        kind.read(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message


def test_a_damaged_or_missing_file_fails_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / resultfiles.summary_file("cont_r5")
    path.write_text('{"arm": "continuous", "n": 3')  # cut mid-write
    with pytest.raises(ContractError, match=r"stage summary is not valid JSON") as e:
        StageSummary.read(path)
    assert "\n" not in str(e.value)
    with pytest.raises(ContractError, match="cannot read run metadata"):
        RunMeta.read(tmp_path / "absent.json")
    assert StageSummary.read_or_none(path) is None


def test_the_analysis_names_a_wrong_typed_file_in_one_line(tmp_path: Path) -> None:
    """The report's loader turns a contract failure into its ResultsError (the report's one line, exit 2)."""
    from tailgate.postprocess.runfolders import ResultsError, find_run_dirs, load_summaries

    run = tmp_path / "run"
    run.mkdir()
    (run / resultfiles.RUN_META).write_text(json.dumps({"run_id": "x", "status": "completed"}))
    (run / resultfiles.summary_file("cont_r5")).write_text(json.dumps({**_summary(), "errors": "none"}))
    with pytest.raises(ResultsError, match=r"summary-cont_r5\.json: stage summary key 'errors' should be int"):
        load_summaries(tmp_path)
    (run / resultfiles.RUN_META).write_text(json.dumps({"run_id": "x", "status": ["completed"]}))
    with pytest.raises(ResultsError, match=r"run\.json: run metadata key 'status' should be str or null"):
        find_run_dirs(tmp_path)


# ------------------------------------------------------------------------------------- one owner each


_NAMES = {
    resultfiles.RUN_META, resultfiles.SUITE_META, resultfiles.SLO_META, resultfiles.SLO_ANALYSIS,
    resultfiles.SERVER_METRICS, resultfiles.DIAGNOSIS, resultfiles.TABLE_MD, resultfiles.TABLE_CSV,
    resultfiles.REPORT_HTML, resultfiles.REPORT_LOG,
}  # fmt: skip
_PATTERNED = re.compile(r"^(records-|summary-|sent-)\S*\.(jsonl|json|log)$")
_PREFIXES = ("records-", "summary-", "sent-")


def _name_literals(path: Path) -> list[str]:
    """String literals that are a result file's name, and f-strings that build one (docstrings may mention
    the names; code must take them from ``tailgate.resultfiles``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for part in parts[:-1]:
                if isinstance(part, ast.Constant) and str(part.value).endswith(_PREFIXES):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: f-string {part.value!r}...")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value in _NAMES or _PATTERNED.match(node.value))
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def test_no_product_file_but_the_names_module_spells_a_result_file_name() -> None:
    owner = ROOT / "tailgate" / "resultfiles.py"
    assert _name_literals(owner)  # the check finds them where they are
    found = [
        hit
        for d in PRODUCT_DIRS
        for path in sorted((ROOT / d).rglob("*.py"))
        if path != owner
        for hit in _name_literals(path)
    ]
    assert not found, "result file names belong in tailgate/resultfiles.py:\n" + "\n".join(found)


class _LocustLikeParser(argparse.ArgumentParser):
    """Takes Locust's extra keywords (``is_secret``, ``include_in_web_ui``) without importing Locust (gevent)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("is_secret", None)
        kwargs.pop("include_in_web_ui", None)
        return super().add_argument(*args, **kwargs)


def _defaults_of(add: Any) -> dict[str, Any]:
    parser = _LocustLikeParser()
    add(parser)
    return {a.dest: a.default for a in parser._actions}


def test_every_parser_takes_its_defaults_from_the_option_table() -> None:
    from tailgate.load.options import add_arguments
    from tailgate.slo import GPU, add_slo_arguments
    from tailgate.suite import SuitePlan
    from tailgate.suitecommand import EMBEDDED, build_plan

    assert DEFAULTS["n"] == 500 and DEFAULTS["warmup"] == 25 and DEFAULTS["seed"] == 7
    locust = _defaults_of(add_arguments)
    for name in ("n", "warmup", "seed", "batch_size", "warmup_rule", "settle", "request_timeout",
                 "connect_timeout", "stall_timeout", "max_in_flight", "sample_metrics"):  # fmt: skip
        assert locust[name] == DEFAULTS[name], name
    assert parse_rates(locust["rates"]) == DEFAULTS["rates"]

    plan = SuitePlan()
    for name in ("n", "warmup", "seed", "batch_size", "rates", "nochunk_rates", "preempt_rate"):
        assert getattr(plan, name) == DEFAULTS[name], name
    slo = _defaults_of(add_slo_arguments)
    assert slo["seed"] == DEFAULTS["seed"] and GPU["warmup"] == DEFAULTS["warmup"]

    from tailgate.suitecommand import add_suite_arguments

    parser = argparse.ArgumentParser()
    add_suite_arguments(parser)
    args = parser.parse_args([])
    built = build_plan(args)
    for name in ("n", "warmup", "seed", "batch_size", "rates", "nochunk_rates", "preempt_rate"):
        assert getattr(built, name) == DEFAULTS[name], name
    embedded = build_plan(parser.parse_args(["--embedded"]))
    assert (embedded.n, embedded.warmup, embedded.rates) == (EMBEDDED["n"], EMBEDDED["warmup"], EMBEDDED["rates"])


def test_the_trace_command_defaults_to_the_table(tmp_path: Path) -> None:
    from tailgate.cli import main

    out = tmp_path / "trace.jsonl"
    assert main(["trace", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == DEFAULTS["n"] + DEFAULTS["warmup"]
    first = json.loads(lines[0])
    item = make_trace(1, DEFAULTS["seed"])[0]
    assert (first["prompt_tokens"], first["max_tokens"]) == (item.prompt_tokens, item.max_tokens)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,x", "--rates: 'x' is not a number"),
        ("0", "--rates: every rate must be a positive number of req/s, got 0"),
        ("inf", "--rates: every rate must be a positive number of req/s, got inf"),
        ("nan", "--rates: every rate must be a positive number of req/s, got nan"),
        (",", "--rates: give at least one rate"),
    ],
)
def test_one_rate_check(text: str, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_rates(text)


def test_the_command_line_and_the_slo_search_refuse_a_rate_as_the_options_do() -> None:
    from tailgate.slo import SloError, add_slo_arguments
    from tailgate.slo import build_plan as slo_plan
    from tailgate.suitecommand import add_suite_arguments, build_plan

    parser = argparse.ArgumentParser()
    add_suite_arguments(parser)
    with pytest.raises(OptionError, match=re.escape("--nochunk-rates: every rate must be a positive number")):
        build_plan(parser.parse_args(["--nochunk-rates", "-1"]))
    assert build_plan(parser.parse_args(["--nochunk-rates", "none"])).nochunk_rates == ()
    slo = argparse.ArgumentParser()
    add_slo_arguments(slo)
    args = slo.parse_args(["--slo", "ttft_p99<=500ms", "--start-rate", "nan"])
    with pytest.raises(SloError, match=re.escape("--start-rate: every rate must be a positive number")):
        slo_plan(args)
    with pytest.raises(OptionError, match="fewer than the 25 warm-up"):
        check_counts(10, 25)


# ---------------------------------------------------------------------------------------------- arms


def test_each_arm_names_its_stages_as_its_plan_builder_does() -> None:
    trace = make_trace(40, 7)
    assert arms.CONTINUOUS.build(trace, (2.5, 10.0), 7, 5) == [
        continuous_stage(0, trace, 2.5, 7, 5),
        continuous_stage(1, trace, 10.0, 7, 5),
    ]
    assert arms.GATED.build(trace, (16,), 7, 5) == [gated_stage(0, trace, 16, 5)]
    for arm in arms.ARMS.values():
        value = 2.5 if arm.open_loop else 16
        assert arm.build(trace, (value,), 7, 5)[0].label == arm.stage_label(value)
        assert (ROOT / "locustfiles" / arm.locustfile).is_file()
        assert arm.value_args(value)[0] == arm.value_option


def test_one_naming_rule_for_stages_folders_and_table_cells() -> None:
    assert arms.stage_label("continuous", 2.5) == "cont_r2p5"
    assert arms.cell_folder("nochunk", "continuous", 10.0) == "nochunk_cont_r10"
    assert arms.cell_name("nochunk", "continuous", 10.0) == "nochunk_cont_r10"
    assert arms.cell_name("chunked", "continuous", 2.5) == "chunked_cont_r2p5"
    assert arms.cell_folder("chunked", "gated", 16.0) == "chunked_gated_b16"
    assert arms.cell_name("chunked", "gated", 16.0) == "chunked_gated_b16"
    assert arms.value_text(float("nan")) == "?"
    with pytest.raises(OptionError, match="--arm: unknown arm 'closed'; choose one of continuous, gated"):
        arms.arm("closed")


def test_every_arm_has_a_shape_that_names_it() -> None:
    text = "\n".join(p.read_text() for p in (ROOT / "shapes").glob("*.py"))
    for name in arms.ARMS:
        assert f'arm = "{name}"' in text


# ------------------------------------------------------------------------------------- reading and tails


def test_one_reader_counts_damaged_lines_and_follows_only_complete_ones(tmp_path: Path) -> None:
    good, bad = parse_lines(b'{"a": 1}\n\n[1]\nnot json\n{"b": 2}\n')
    assert good == [{"a": 1}, {"b": 2}] and bad == 2
    path = tmp_path / resultfiles.records_file("w1")
    follow = Follower(tmp_path, resultfiles.RECORDS_GLOB)
    path.write_bytes(b'{"a": 1}\n{"b": ')
    assert follow.new_objects() == ([{"a": 1}], 0)
    with open(path, "ab") as f:
        f.write(b"2}\nxx\n")
    assert follow.new_objects() == ([{"b": 2}], 1)
    assert follow.new_objects() == ([], 0)


def test_one_tail_computation_skips_what_was_never_measured() -> None:
    rows = [record(ttft_ms=v) for v in (1.0, None, 3.0, float("nan"), 2.0)]
    assert field_values(rows, "ttft_ms") == [1.0, 3.0, 2.0]
    assert tail(rows, "ttft_ms", 50) == 2.0
    assert tail(rows, "ttft_ms", 100) == 3.0
    assert tail([], "ttft_ms", 99) is None


def test_the_contracts_import_neither_gevent_nor_pandas() -> None:
    code = (
        "import sys, tailgate.contracts, tailgate.resultfiles, tailgate.optiontable, tailgate.arms, tailgate.jsonl,"
        " tailgate.clientbound;"
        "print(sorted(m for m in ('gevent', 'pandas', 'locust', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_run_status_is_read_as_written_and_says_whether_every_stage_was_summarized() -> None:
    from tailgate.runmeta import RunStatus

    written = {
        "completed": True, "stopped": True, "stopped after cont_r4: 3 errors": True,
        "stopped: stage deadline passed": False, "running": False, "interrupted": False, "failed": False,
    }  # fmt: skip
    for text, summarized in written.items():
        status = RunStatus.of(text)
        assert status is not None and status.summarized is summarized, text
        assert status.text(text[len(status.value) :]) == text
    assert RunStatus.of("a newer word") is None and RunStatus.of(None) is None
