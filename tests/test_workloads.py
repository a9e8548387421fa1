"""Prompt sources, chat, arrival processes and prefix-cache counters (tailgate/load/prompts.py, arrivals.py).

Parsing and schedules are checked without a server; the rest through real Locust processes against the
ground-truth server (exact counts, a prefix cache that counts blocks exactly) and the real CPU vLLM (its
tokenizer through /tokenize, its prefix-cache counters, chat and completions).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, load_records, load_summaries, run_locust

from tailgate.contracts import Order
from tailgate.load.arrivals import gamma_offsets, load_trace
from tailgate.load.options import OptionError, add_arguments, validate
from tailgate.load.plan import poisson_offsets
from tailgate.load.prompts import load_dataset
from tailgate.load.stage_workload import order_item
from tailgate.verify.groundtruth import ServerProcess, start_server_process

FIXTURES = ROOT / "tests" / "fixtures" / "workloads"
MOONCAKE = FIXTURES / "mooncake-small.jsonl"
BURSTGPT = FIXTURES / "burstgpt-small.csv"
SHAREGPT = FIXTURES / "sharegpt-small.json"
PROMPTS_JSONL = FIXTURES / "prompts.jsonl"


def options(tmp_path: Path, *argv: str) -> argparse.Namespace:
    """The suite's options parsed by Locust's own parser (defaults included)."""
    from locust.argument_parser import get_parser

    parser = get_parser()
    add_arguments(parser)
    return parser.parse_args(["--host", "http://127.0.0.1:9", "--results-dir", str(tmp_path / "r"), *argv])


# ------------------------------------------------------------------------------------------- no server


def test_default_schedule_and_order_are_unchanged(tmp_path: Path) -> None:
    """Poisson stays the default, drawn exactly as before, and a seed arrival's order item keeps its five fields."""
    s = validate(options(tmp_path, "--rates", "10", "--n", "50", "--warmup", "5"), arm="continuous")
    assert (s.prompts, s.endpoint, s.arrivals) == ("seed", "completions", "poisson")
    stage = s.stages()[0]
    assert [a.offset_s for a in stage.arrivals] == poisson_offsets(55, 10.0, 7)
    assert all(a.prompt is None for a in stage.arrivals)
    # on the wire a seed item stays the five-element list it always was
    wire = Order(items=[order_item(stage.arrivals[3])]).to_dict()["items"][0]
    assert wire == [
        3,
        stage.arrivals[3].item.prompt_tokens,
        stage.arrivals[3].item.max_tokens,
        stage.arrivals[3].offset_s,
        None,
    ]


def test_gamma_burstiness_sets_the_spread_not_the_rate() -> None:
    for shape in (0.25, 1.0, 4.0):
        t = gamma_offsets(20001, 10.0, shape, seed=3)
        gaps = [b - a for a, b in itertools.pairwise(t)]
        mean = statistics.fmean(gaps)
        cv2 = statistics.pvariance(gaps) / mean**2
        assert mean == pytest.approx(0.1, rel=0.05)
        assert cv2 == pytest.approx(1 / shape, rel=0.1)


def test_trace_formats_and_time_scale(tmp_path: Path) -> None:
    kind, rows = load_trace(MOONCAKE)
    assert kind == "mooncake" and len(rows) == 12
    assert [r.offset_s for r in rows[:3]] == [0.0, 0.0, 0.09]  # equal timestamps arrive together
    assert rows[6].hash_ids == (0, 1, 6) and rows[6].prompt_tokens == 1100
    kind, rows = load_trace(BURSTGPT)
    assert kind == "burstgpt" and len(rows) == 11  # the 0-token response row is skipped
    assert rows[0].offset_s == 0.0 and rows[-1].offset_s == pytest.approx(2.4)
    s = validate(options(tmp_path, "--arrival-trace", str(BURSTGPT), "--time-scale", "0.5", "--warmup", "1"),
                 arm="continuous")  # fmt: skip
    assert s.arrivals == "trace" and s.n == 10
    assert [a.offset_s for a in s.stages()[0].arrivals] == pytest.approx([r.offset_s * 0.5 for r in rows])
    assert s.stages()[0].rate_or_batch == pytest.approx(10 / 1.2)


def test_datasets_both_formats() -> None:
    share = load_dataset(SHAREGPT)
    assert len(share) == 5 and share[2].text.startswith("w40")  # no human turn: skipped; system turn ignored
    rows = load_dataset(PROMPTS_JSONL)
    assert [r.max_tokens for r in rows] == [6, 5, None, None, 8]
    assert rows[1].messages == (("system", "w200 w201"), ("user", "w202 w203 w204 w205 w206"))


@pytest.mark.parametrize(
    ("option", "name", "content", "message"),
    [
        ("--dataset", "d.jsonl", '{"prompt": "a"}\n{"prompt": \n', "line 2: not valid JSON"),
        ("--dataset", "d.jsonl", '{"text": "a"}\n', "line 1: needs a non-empty 'prompt'"),
        ("--dataset", "d.jsonl", '{"prompt": "a", "max_tokens": 0}\n', "max_tokens must be a positive integer"),
        ("--dataset", "d.json", '[{"id": 1}]', "entry 0: no 'conversations' list"),
        ("--arrival-trace", "t.jsonl", '{"timestamp": 0, "input_length": 5}\n', "output_length must be"),
        (
            "--arrival-trace",
            "t.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\nnope\n',
            "line 2: not valid JSON",
        ),
        ("--arrival-trace", "t.csv", "Timestamp,Request tokens\n1,2\n", "lacks column(s) Response tokens"),
        ("--arrival-trace", "t.csv", "Timestamp,Request tokens,Response tokens\n1,x,3\n", "line 2:"),
    ],
)
def test_bad_files_name_the_defect(tmp_path: Path, option: str, name: str, content: str, message: str) -> None:
    bad = tmp_path / name
    bad.write_text(content)
    argv = [option, str(bad)] + (["--prompts", "dataset"] if option == "--dataset" else []) + ["--warmup", "0"]
    with pytest.raises(OptionError) as e:
        validate(options(tmp_path, *argv), arm="continuous")
    assert message in str(e.value) and str(bad) in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------- ground truth


@pytest.fixture(scope="module")
def cached_gt() -> Iterator[ServerProcess]:
    """The ground-truth server with its prefix cache on: hits are whole 16-word blocks seen before."""
    with start_server_process(ttft_ms=5, gap_ms=2, prefix_caching=True) as gt:
        yield gt


def _run(gt_url: str, results: Path, *args: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    done = run_locust("continuous.py", gt_url, results, "--settle", "0", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (summary,) = load_summaries(results).values()
    return load_records(results), summary


def test_unique_chat_vs_seed_on_one_schedule(cached_gt: ServerProcess, tmp_path: Path) -> None:
    """Unique chat prompts are exact and uncached; seed prompts on the same schedule are cached and warned about."""
    common = ("--rates", "40", "--n", "30", "--warmup", "2", "--seed", "11")
    seed_records, seed = _run(cached_gt.base_url, tmp_path / "seed", *common)
    uniq_records, uniq = _run(cached_gt.base_url, tmp_path / "unique", "--prompts", "unique", "--endpoint", "chat",
                              *common)  # fmt: skip
    assert seed["prefix_cache_hit_rate"] > 0.5 and "prefix caching on" in seed["prefix_cache_warning"]
    assert uniq["prefix_cache_hit_rate"] == 0.0 and "prefix_cache_warning" not in uniq
    assert uniq["prompts"] == "unique" and uniq["endpoint"] == "chat" and uniq["arrivals"] == "poisson"
    for r in uniq_records:
        assert r["prompt_source"] == "unique" and r["endpoint"] == "chat"
        assert r["prompt_tokens"] == r["prompt_tokens_planned"] == r["prompt_tokens_tokenized"]
        assert r["completion_tokens"] == r["max_tokens"] and r["chunks"] == r["max_tokens"] + 1  # + role delta
    assert uniq["prompt_tokens_exact"] == uniq["prompt_tokens_checked"] == 32

    # one arrival schedule: the same intended offsets and lengths in both runs
    def plan(records: list[dict[str, Any]]) -> list[tuple[int, float, int]]:
        t0 = min(r["intended_s"] for r in records)
        return sorted((r["trace_id"], round(r["intended_s"] - t0, 4), r["prompt_tokens_planned"]) for r in records)

    assert plan(seed_records) == plan(uniq_records)
    meta = json.loads((tmp_path / "unique" / "run.json").read_text())
    assert meta["workload"]["prompt_check"]["exact"] == 32
    assert meta["options"]["prompts"] == "unique" and meta["options"]["endpoint"] == "chat"

    from tailgate.postprocess.diagnosis import diagnose
    from tailgate.postprocess.report import analyze

    a = analyze(tmp_path, save_series=False)
    assert set(a.table["prompts"]) == {"seed", "unique"}
    findings = diagnose(a.summaries, a.records, run_meta=None, resamples=200)
    ab = findings[-1]
    assert len(findings) == 6 and ab["evidence"]["pairs"][0]["other"] == "chunked_cont_r40+unique"
    assert ab["evidence"]["pairs"][0]["prefix_hit_rate"][1] == 0.0


def test_mooncake_replay_shares_its_blocks(cached_gt: ServerProcess, tmp_path: Path) -> None:
    records, s = _run(cached_gt.base_url, tmp_path / "moon", "--arrival-trace", str(MOONCAKE), "--time-scale", "0.5",
                      "--warmup", "0")  # fmt: skip
    assert s["prompts"] == "mooncake" and s["arrivals"] == "trace" and s["stage_label"] == "trace_x0p5"
    _, rows = load_trace(MOONCAKE)
    t0 = min(r["intended_s"] for r in records)
    by_id = {r["trace_id"]: r for r in records}
    for i, row in enumerate(rows):
        assert by_id[i]["intended_s"] - t0 == pytest.approx(row.offset_s * 0.5, abs=1e-6)
        assert by_id[i]["prompt_tokens"] == row.prompt_tokens
    # requests repeating hash_ids (0, 1) reuse their blocks: the cache hits a large share of the prompt tokens
    assert s["prefix_cache_hit_rate"] > 0.3


def test_bad_file_exits_2_before_sending(cached_gt: ServerProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ocean"}\n{"messages": [{"role": "user"}]}\n')
    before = cached_gt.metrics()
    done = run_locust("continuous.py", cached_gt.base_url, tmp_path / "r", "--prompts", "dataset", "--dataset",
                      str(bad))  # fmt: skip
    assert done.returncode == 2
    lines = [x for x in done.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith("tailgate: error: --dataset:") and "line 2" in lines[-1]
    assert "Traceback" not in done.stderr
    assert _successes(cached_gt.metrics()) == _successes(before)  # nothing was sent


def _successes(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("vllm:request_success_total"))
    return float(line.split()[-1])


# ------------------------------------------------------------------------------------------- CPU vLLM


@pytest.fixture(scope="module")
def vllm_cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The CPU vLLM with prefix caching on (vLLM's default) and a chat template; 2048 tokens of context.

    ``TAILGATE_TEST_VLLM_CACHED_URL`` reuses such a server that is already up (handy while developing)."""
    import os

    from conftest import RunningServer, _start

    url = os.environ.get("TAILGATE_TEST_VLLM_CACHED_URL")
    if url:
        yield RunningServer(url.rstrip("/"))
        return

    from tailgate.servers.tinymodel import CHAT_TEMPLATE

    root = tmp_path_factory.mktemp("vllm-cached")
    template = root / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    flags = ["--enable-prefix-caching", "--max-model-len", "2048", "--chat-template", str(template)]
    yield from _start(root, "cached", flags)


@pytest.mark.vllm
def test_cpu_vllm_unique_vs_seed_chat_and_counters(vllm_cached: Any, tmp_path: Path) -> None:
    """The served tokenizer (/tokenize) makes unique prompts exact in vLLM's usage, on completions and chat; the
    engine's prefix-cache counters see seed prompts hit and unique ones miss on the same schedule."""
    url = vllm_cached.base_url
    common = ("--rates", "4", "--n", "6", "--warmup", "0", "--ignore-eos", "--trace-file",
              str(_trace(tmp_path, [(300, 4), (400, 6), (300, 4), (500, 4), (300, 6), (400, 4)])))  # fmt: skip
    _, seed = _run(url, tmp_path / "seed", *common)
    uniq_records, uniq = _run(url, tmp_path / "unique", "--prompts", "unique", *common)
    chat_records, chat = _run(url, tmp_path / "chat", "--prompts", "unique", "--endpoint", "chat", *common)
    assert seed["prefix_caching"] is True and "prefix_cache_warning" in seed
    # queries count every prompt token of each lookup (a request retried by the scheduler is looked up again)
    assert seed["prefix_cache_hits_delta"] > 0 and seed["prefix_cache_queries_delta"] >= 2200
    assert uniq["prefix_cache_hits_delta"] == 0 and uniq["prefix_cache_queries_delta"] >= 2200
    for r in uniq_records + chat_records:
        assert r["error_class"] is None, r["error"]
        assert r["prompt_tokens"] == r["prompt_tokens_planned"] == r["prompt_tokens_tokenized"]
        assert r["completion_tokens"] == r["max_tokens"] and r["chunks"] >= 1
    assert chat["endpoint"] == "chat" and chat["prompt_tokens_exact"] == 6


@pytest.mark.vllm
def test_cpu_vllm_refuses_lengths_above_its_limit(vllm_cached: Any, tmp_path: Path) -> None:
    data = tmp_path / "long.jsonl"
    data.write_text('{"prompt": "ocean ocean", "max_tokens": 4}\n{"prompt": "ocean", "max_tokens": 3000}\n')
    done = run_locust("continuous.py", vllm_cached.base_url, tmp_path / "r", "--prompts", "dataset", "--dataset",
                      str(data), "--n", "2", "--warmup", "0")  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "above the model's limit of 2048" in done.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "r").glob("sent-*.log")) and not list((tmp_path / "r").glob("records-*"))


def _trace(tmp_path: Path, lengths: list[tuple[int, int]]) -> Path:
    from conftest import write_trace

    return write_trace(tmp_path / "trace.jsonl", lengths)
