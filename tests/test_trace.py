"""The trace and the arrival schedule must be the reference harness's, draw for draw."""

from __future__ import annotations

import json
import random

import pytest

from tailgate.load.plan import continuous_stage, gated_stage, poisson_offsets, share
from tailgate.load.workload import TraceError, TraceItem, build_prompt, load_jsonl, make_trace, mix_of, save_jsonl


def published_rules(n: int, seed: int) -> list[tuple[int, int]]:
    """The published rules, written independently: one uniform draw per item, 70/20/10."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        out.append((200, 100) if u < 0.7 else (1000, 300) if u < 0.9 else (6000, 600))
    return out


@pytest.mark.parametrize("seed", [7, 1, 12345])
@pytest.mark.parametrize("length", [1, 37, 525])
def test_trace_matches_published_rules(seed: int, length: int) -> None:
    items = make_trace(length, seed)
    assert [(it.prompt_tokens, it.max_tokens) for it in items] == published_rules(length, seed)
    assert [it.id for it in items] == list(range(length))


def test_seed7_mix_is_mixed_length() -> None:
    mix = mix_of(make_trace(525, 7))
    assert set(mix) == {"200→100", "1000→300", "6000→600"}
    assert sum(mix.values()) == 525
    assert mix["200→100"] > mix["1000→300"] > mix["6000→600"] > 0


def test_prompt_is_word_repeated() -> None:
    assert build_prompt(3) == "ocean ocean ocean "
    assert build_prompt(2, "sea ") == "sea sea "


def test_jsonl_round_trip(tmp_path) -> None:
    items = make_trace(50, 3)
    path = tmp_path / "t.jsonl"
    save_jsonl(items, path)
    assert load_jsonl(path) == items


def test_jsonl_ids_default_to_line_order(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_tokens": 5, "max_tokens": 2}\n\n{"prompt_tokens": 7, "max_tokens": 3}\n')
    assert load_jsonl(path) == [TraceItem(0, 5, 2), TraceItem(1, 7, 3)]


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("", "holds no items"),
        ("{nope\n", "line 1: not valid JSON"),
        ("[1, 2]\n", "expected an object"),
        ('{"prompt_tokens": 0, "max_tokens": 1}\n', "prompt_tokens must be a positive integer"),
        ('{"prompt_tokens": 3, "max_tokens": "x"}\n', "max_tokens must be a positive integer"),
        ('{"id": 1, "prompt_tokens": 3, "max_tokens": 1}\n{"id": 1, "prompt_tokens": 3, "max_tokens": 1}\n', "unique"),
    ],
)
def test_bad_trace_files_are_one_line_errors(tmp_path, content: str, fragment: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as err:
        load_jsonl(path)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_binary_trace_files(tmp_path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_jsonl(tmp_path / "absent.jsonl")
    path = tmp_path / "b.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_jsonl(path)


def reference_send_offsets(n: int, rate: float, seed: int) -> list[float]:
    """The harness submits, then sleeps expovariate(rate) from Random(seed + 1)."""
    rng = random.Random(seed + 1)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@pytest.mark.parametrize("rate", [1.0, 5.0, 20.0])
def test_poisson_offsets_match_reference(rate: float) -> None:
    assert poisson_offsets(525, rate, 7) == pytest.approx(reference_send_offsets(525, rate, 7), abs=1e-12)


def test_continuous_stage_pairs_items_with_offsets() -> None:
    items = make_trace(30, 7)
    stage = continuous_stage(2, items, 5.0, 7, 25)
    assert stage.label == "cont_r5" and stage.arm == "continuous" and stage.index == 2
    assert [a.item for a in stage.arrivals] == items
    offsets = [a.offset_s for a in stage.arrivals]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)


def test_gated_stage_batches_in_trace_order() -> None:
    items = make_trace(37, 7)
    stage = gated_stage(0, items, 16, 25)
    assert stage.label == "gated_b16"
    assert [len(g) for g in stage.groups] == [16, 16, 5]
    assert [a.item.id for a in stage.arrivals] == list(range(37))
    assert {a.batch for a in stage.groups[1]} == {1}


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_worker_shares_union_is_the_schedule(workers: int) -> None:
    stage = continuous_stage(0, make_trace(100, 7), 10.0, 7, 25)
    arrivals = stage.arrivals
    parts = [share(arrivals, w, workers) for w in range(workers)]
    union = sorted((a for p in parts for a in p), key=lambda a: a.item.id)
    assert union == arrivals
    assert sum(len(p) for p in parts) == len(arrivals)


def test_trace_json_lines_are_plain(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    save_jsonl(make_trace(2, 7), path)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"id", "prompt_tokens", "max_tokens"}
