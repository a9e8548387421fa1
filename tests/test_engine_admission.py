"""How the simulated engine takes requests in: a serial front end and asynchronous scheduling decide whether two
long prompts sent together share one prefill step, the event behind a worst-gap p99 with chunked prefill off."""

from __future__ import annotations

import random

import pytest

from tailgate.verify.groundtruth.engine import MS, EngineModel, EngineModelError, simulate

LONG = EngineModel(slots=64, step_ms=10.0, step_ms_per_seq=0.0, prefill_ms_per_token=0.02, frontend_ms=5.0,
                   frontend_ms_per_token=0.004)  # fmt: skip
"""A 6,000-token prompt: 24 ms of front end per prompt, a 130-ms prefill step."""


def _firsts(model: EngineModel, arrivals: list[tuple[int, int, int]]) -> list[float]:
    """Each request's first token, ms from time 0, beside a stream that decodes in 10-ms steps from time 0 (the
    scheduler composes a step every 10 ms: at 115.24 and 125.24 around the long prompts)."""
    return [o.arrival_ns / MS + o.ttft_ms for o in simulate(model, [(0, 10, 100), *arrivals])][1:]


def test_side_by_side_front_end_pairs_long_prompts_sent_together() -> None:
    a, b = _firsts(LONG, [(94 * MS, 6000, 4), (95 * MS, 6000, 4)])
    assert a == pytest.approx(b)  # both joined the queue (at 123, 124 ms) before the step at 125.24


def test_serial_front_end_prefills_them_one_step_after_the_other() -> None:
    serial = EngineModel(**{**LONG.describe(), "frontend_serial": True})
    a, b = _firsts(serial, [(94 * MS, 6000, 4), (95 * MS, 6000, 4)])
    assert 123 + 130 < a <= 123 + 10 + 130  # queued at 123, the next step prefilled it whole
    # the second waited for the first's tokenization (to 142, queued at 147), missed that step and had the next
    assert b == pytest.approx(a + 10 + 120)


def test_serial_front_end_queues_a_short_prompt_behind_a_long_one() -> None:
    serial = EngineModel(**{**LONG.describe(), "frontend_serial": True})
    side = simulate(LONG, [(0, 6000, 2), (1 * MS, 100, 2)])
    queued = simulate(serial, [(0, 6000, 2), (1 * MS, 100, 2)])
    assert queued[1].ttft_ms > side[1].ttft_ms + 20  # 24 ms of the long prompt's tokenization first


def test_asynchronous_scheduling_composes_each_step_as_the_one_before_starts() -> None:
    """A decodes in 10-ms steps from t=0; B reaches the scheduler at 15 ms, inside the step [10, 20]. Composed at
    each step's start, B is prefilled in [20, 30]; composed one step ahead, [20, 30] was fixed at 10 ms, so B's
    step is [30, 40]. An engine with nothing running composes at once either way."""
    base = EngineModel(slots=8, step_ms=10.0, step_ms_per_seq=0.0, prefill_ms_per_token=0.0)
    ahead = EngineModel(**{**base.describe(), "async_scheduling": True})
    arrivals = [(0, 10, 10), (15 * MS, 10, 3)]
    assert [o.ttft_ms for o in simulate(base, arrivals)] == pytest.approx([10.0, 15.0])
    assert [o.ttft_ms for o in simulate(ahead, arrivals)] == pytest.approx([10.0, 25.0])
    # idle: a lone request is composed the moment it arrives
    assert simulate(ahead, [(3 * MS, 10, 2)])[0].ttft_ms == pytest.approx(10.0)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("ahead", [False, True])
def test_runs_of_identical_steps_taken_at_once_change_nothing(chunked: bool, serial: bool, ahead: bool) -> None:
    """The fast path jumps over runs of identical decode steps; every outcome equals the step-by-step run's."""
    rng = random.Random(3)
    t, arrivals = 0, []
    for _ in range(300):
        t += round(rng.expovariate(8.0) * 1e9)
        prompt, tokens = rng.choice([(200, 100), (1000, 300), (6000, 60)])
        arrivals.append((t, prompt, tokens))
    model = EngineModel(slots=48, step_ms=8.0, step_ms_per_seq=0.1, prefill_ms_per_token=0.015,
                        prefill_ms_per_token_step=0.001, chunked=chunked, chunk_tokens=2048, frontend_ms=4.0,
                        frontend_ms_per_token=0.003, frontend_serial=serial, async_scheduling=ahead,
                        kv_capacity_tokens=120_000)  # fmt: skip
    assert simulate(model, arrivals, fast=True) == simulate(model, arrivals, fast=False)


@pytest.mark.parametrize("name", ["async_scheduling", "frontend_serial"])
def test_admission_switches_are_booleans(name: str) -> None:
    with pytest.raises(EngineModelError, match=name):
        EngineModel.from_dict({name: "yes"})
    assert name not in EngineModel().describe()  # off: the engine reads as it always did
    assert EngineModel.from_dict({name: True}).describe()[name] is True
