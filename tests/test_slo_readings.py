"""A probe between the readings of a cost never measured: it keeps the reading a known engine follows and rules
out the others, and the answer it leaves still holds the engine's capacity."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tailgate import slo
from tailgate.load.workload import make_trace
from tailgate.slo.confirm import confirm_answer, confirmation_rates, settle_confirmed
from tailgate.slo.readings import (
    FITTED,
    Reading,
    ReadingsTest,
    between_rate,
    judge_readings,
    narrowed_answer,
    readings_of,
)
from tailgate.slo.replay import Extrapolated, ModelAnswer, Workload, model_answer
from tailgate.slo.replicates import Replicates, capacity_of
from tailgate.slo.servicefit import Probe, ServiceFit, prefill_choices, probes_of
from tailgate.slo.windowmatch import sign_ranks_needed
from tailgate.stats import measured_records
from tailgate.verify.groundtruth.engine import EngineModel, poisson_arrivals, simulate

Q = 0.99
TRUE = EngineModel(slots=4096, step_ms=6.0, step_ms_per_seq=0.17, prefill_ms_per_token=0.009,
                   prefill_ms_per_token_step=0.0037, chunked=True, chunk_tokens=8192,
                   prefill_flat_above=6000)  # fmt: skip
"""A GPU-like engine with an 8,192-token step budget whose square prefill term is flat past 6,000 tokens (as an
H100's full step cost ~186 ms where the square fitted on smaller steps said ~211)."""
LIMITS = {"ttft": 600.0, "gap": 195.0}
SLO = "ttft_p99<=600ms,gap_p99<=195ms"


def lengths(n: int, seed: int) -> list[tuple[int, int]]:
    return [(t.prompt_tokens, t.max_tokens) for t in make_trace(n, seed)]


def probe_on(engine: EngineModel, rate: float, seed: int, n: int = 900) -> tuple[str, Probe]:
    """A probe of ``n`` measured requests on ``engine``: its verdict and its data as the model sees them."""
    mix = lengths(n + 25, seed)
    outs = simulate(engine, poisson_arrivals(rate, mix, seed + 1))
    recs = [o.record(i, p, mx, rate=rate) for i, (o, (p, mx)) in enumerate(zip(outs, mix, strict=True))]
    attempt = slo.ProbeAttempt(measured_records(recs, 25), sent=len(recs), errors=0, records=recs,
                               workload=seed)  # fmt: skip
    verdict, checks = slo.check_probe([attempt], slo.parse_slo(SLO), rate=rate)
    return verdict, probes_of({rate: [attempt]}, {rate: list(checks)})[0]


@pytest.fixture(scope="module")
def truth() -> float:
    cap, _ = capacity_of(Replicates(TRUE, [lengths(8000, 500 + k) for k in range(3)], seed=3), LIMITS, Q,
                         near=12.0, tolerance=0.01)  # fmt: skip
    assert cap is not None
    return cap


@pytest.fixture(scope="module")
def spanning() -> ModelAnswer:
    """The model of probes at 3 req/s, where no step prefilled more than one long prompt: its interval spans the
    square's readings past what was measured."""
    chunks = prefill_choices({"chunked": "on", "max-num-batched-tokens": "8192"})
    _, low_probe = probe_on(TRUE, 3.0, 11)
    return model_answer([low_probe], LIMITS, Q, (None, None), workload=Workload(seeded=True), requests=1000,
                        replicates=4, seed=5, chunks=chunks)  # fmt: skip


def _reading(name: str, cap: float, low: float, high: float) -> Reading:
    return Reading(name, TRUE, cap, low, high)


def test_the_probe_goes_into_the_widest_gap_between_readings() -> None:
    h100 = [_reading(FITTED, 6.83, 6.45, 7.16), _reading("flat", 12.9, 12.4, 13.4), _reading("per", 14.2, 13.6, 14.8)]
    assert between_rate(h100) == pytest.approx(math.sqrt(7.16 * 12.4), abs=1e-3)
    overlapping = [_reading(FITTED, 10.0, 9.0, 11.0), _reading("flat", 11.5, 10.5, 12.5)]
    assert between_rate(overlapping) is None


def test_a_decided_verdict_rules_out_the_readings_it_opposes_and_moves_that_end() -> None:
    low, high = _reading(FITTED, 6.8, 6.5, 7.2), _reading("flat", 12.9, 12.4, 13.4)
    passed = ReadingsTest(1, 9.4, "pass", tuple(judge_readings([low, high], 9.4, "pass", None, Q, LIMITS)))
    assert [bool(j.ruled_out) for j in passed.judged] == [True, False] and "PASS" in passed.judged[0].ruled_out
    assert passed.bounds == (9.4, 13.4) and passed.stands
    failed = ReadingsTest(1, 9.4, "fail", tuple(judge_readings([low, high], 9.4, "fail", None, Q, LIMITS)))
    assert [bool(j.ruled_out) for j in failed.judged] == [False, True] and failed.bounds == (6.5, 9.4)
    undecided = ReadingsTest(
        1, 9.4, "not_enough_data", tuple(judge_readings([low, high], 9.4, "nope", None, Q, LIMITS))
    )
    assert not any(j.ruled_out for j in undecided.judged) and undecided.bounds == (6.5, 13.4)


def test_the_bracket_keeps_the_readings_ends_and_the_kept_reading_nearest_its_middle_answers() -> None:
    """Two readings ruled out on either side move both ends in; of the two kept, the one nearest the middle
    answers with its engine."""
    fit = ServiceFit(TRUE, True, 1000, [])
    flat = replace(TRUE, prefill_flat_above=7000)
    readings = [_reading(FITTED, 6.8, 6.5, 7.2), Reading("flat", flat, 10.0, 9.0, 11.0),
                _reading("per prompt", 12.0, 11.0, 13.0), _reading("per step", 16.0, 15.5, 16.5)]  # fmt: skip
    judged = judge_readings(readings, 9.6, "not_enough_data", None, Q, LIMITS)
    judged[0] = replace(judged[0], ruled_out="too slow", above=8.5)
    judged[3] = replace(judged[3], ruled_out="too fast", below=14.0)
    test = ReadingsTest(1, 9.6, "not_enough_data", tuple(judged))
    assert test.bounds == (8.5, 14.0) and test.stands
    answer = ModelAnswer(6.8, 6.5, 16.5, [], fit, True, "", bracket=(6.5, 15.0), own=(6.5, 7.2))
    narrowed = narrowed_answer(answer, test)
    assert (narrowed.low, narrowed.high, narrowed.bracket) == (8.5, 14.0, (8.5, 14.0))
    assert narrowed.capacity == 10.0 and narrowed.fit is not None and narrowed.fit.engine == flat
    assert (answer.low, answer.fit) == (6.5, fit), "the answer given is left as it was"
    crossed = ReadingsTest(1, 9.6, "x", (replace(judged[1], above=12.0), replace(judged[2], below=11.0)))
    assert not crossed.stands


def test_a_probe_between_the_readings_rules_out_nothing_on_a_few_stalls_and_the_answer_holds(
    spanning: ModelAnswer, truth: float
) -> None:
    """The fit read the square per prompt where this engine pays it per step (flat past 6,000 tokens): its own
    interval misses the capacity, and the union of its readings holds it. The probe between the readings runs
    first; its worst gaps over the limit came in three stalls, which say how the readings priced those three and
    not the next (a window needs 7 events to bound a ratio), so no reading is ruled out by them and none that holds
    the capacity is ruled out at all; the ends then test the readings' bracket, and the answer still holds the
    capacity."""
    readings = readings_of(spanning)
    assert len(readings) == 3 and spanning.low is not None and spanning.high is not None
    fitted_reading = readings[0]
    assert not fitted_reading.low <= truth <= fitted_reading.high, "the case: the fitted reading alone misses"
    assert spanning.low <= truth <= spanning.high
    ran: list[tuple[float, int]] = []

    def run(rate: float, left: int, kept: int) -> tuple[str, Probe | None]:
        ran.append((rate, left))
        return probe_on(TRUE, rate, 100 + len(ran), n=1350)

    fitted, record = confirm_answer(spanning, run, lambda: None, Q, LIMITS)
    between = between_rate(readings)
    assert between is not None and ran[0] == (between, 3), ran
    test = record.readings[0]
    gaps = [m for j in test.judged for m in j.matches if m.metric == "gap"]
    assert gaps and all(m.events < sign_ranks_needed() and not m.bounds for m in gaps), [m.text() for m in gaps]
    ruled = [j.reading for j in test.judged if j.ruled_out]
    assert fitted_reading not in ruled and all(not r.low <= truth <= r.high for r in ruled), test.text()
    assert test.bounds[0] <= truth <= test.bounds[1], test.text()
    assert fitted.low is not None and fitted.high is not None
    assert [rate for rate, _ in ran[1:]] == list(reversed(confirmation_rates(fitted.low, fitted.high)))
    settled = settle_confirmed(fitted, record, (None, None))
    if settled.usable:
        assert settled.low is not None and settled.high is not None
        assert settled.low <= truth <= settled.high, (settled.low, truth, settled.high, record.summary())
    document = settled.as_dict()["confirmation"]
    assert document["readings"][0]["rate"] == between and "between its readings" in document["summary"]


def test_a_probe_that_rules_out_every_reading_is_a_contradiction_and_refits() -> None:
    """Two narrow readings, 8 and 16 req/s, of an engine three times slower than either: the probe between them
    fails (ruling out the reading over it) and its window is far slower than the reading under it. Nothing is
    left: a contradiction, and the refit comes before any end is tested."""
    fit = ServiceFit(TRUE, True, 1000, [])
    flat = Extrapolated(6000, "flat past 6,000 tokens", 16.0, 15.4, 16.6, TRUE)
    answer = ModelAnswer(8.0, 7.7, 16.6, [], fit, True, "", own=(7.7, 8.3), extrapolated=[flat])
    slow = replace(TRUE, step_ms=3 * TRUE.step_ms, prefill_ms_per_token=3 * TRUE.prefill_ms_per_token)
    ran: list[float] = []
    refits: list[int] = []

    def run(rate: float, left: int, kept: int) -> tuple[str, Probe | None]:
        ran.append(rate)
        return probe_on(slow, rate, 200 + len(ran))

    def refit() -> ModelAnswer | None:
        refits.append(1)
        return None

    _, record = confirm_answer(answer, run, refit, Q, LIMITS)
    assert ran == [pytest.approx(math.sqrt(8.3 * 15.4), abs=1e-3)] and refits == [1], ran
    assert record.contradicted and record.contradicted[0].side == "between"
    assert "no reading left standing" in record.contradicted[0].why and not record.stands


SLOTS = EngineModel(slots=4, step_ms=0.5, step_ms_per_seq=0.5, prefill_ms_per_token=0.005)
"""FIFO-like slots whose TTFT p99 crosses 1,000 ms near 5.3 req/s: a tail that rises with the load."""


def _scaled(engine: EngineModel, factor: float) -> EngineModel:
    return replace(engine, step_ms=engine.step_ms * factor, step_ms_per_seq=engine.step_ms_per_seq * factor,
                   prefill_ms_per_token=engine.prefill_ms_per_token * factor)  # fmt: skip


def test_windows_on_a_tail_that_moves_with_the_load_move_both_ends_and_hold_the_capacity() -> None:
    """Readings 25% too slow and 25% too fast bracket a slots engine's capacity; the probe between them finds the
    first too slow and the second too fast on the probe's own requests, and the bracket closes in on the truth
    from both sides."""
    limits = {"ttft": 1000.0}
    mixes = [lengths(6000, 700 + k) for k in range(3)]

    def cap(engine: EngineModel) -> float:
        c, _ = capacity_of(Replicates(engine, mixes, seed=3), limits, Q, near=5.3, tolerance=0.01)
        assert c is not None
        return c

    truth = cap(SLOTS)
    slow, fast = _scaled(SLOTS, 1.25), _scaled(SLOTS, 0.8)
    readings = [Reading(FITTED, slow, cap(slow), 0.96 * cap(slow), 1.04 * cap(slow)),
                Reading("per prompt", fast, cap(fast), 0.96 * cap(fast), 1.04 * cap(fast))]  # fmt: skip
    rate = between_rate(readings)
    assert rate is not None and readings[0].high < truth < readings[1].low
    mix = lengths(1500 + 25, 31)
    outs = simulate(SLOTS, poisson_arrivals(rate, mix, 32))
    recs = [o.record(i, p, mx, rate=rate) for i, (o, (p, mx)) in enumerate(zip(outs, mix, strict=True))]
    attempt = slo.ProbeAttempt(measured_records(recs, 25), sent=len(recs), errors=0, records=recs, workload=31)
    verdict, checks = slo.check_probe([attempt], slo.parse_slo("ttft_p99<=1000ms"), rate=rate)
    probe = probes_of({rate: [attempt]}, {rate: list(checks)})[0]
    test = ReadingsTest(1, rate, verdict, tuple(judge_readings(readings, rate, verdict, probe, Q, limits)))
    low, high = test.bounds
    assert readings[0].low < low <= truth <= high < readings[1].high, test.text()
    assert all(j.ruled_out for j in test.judged) and not test.stands, "no reading is left to answer: a refit"


def test_without_time_for_three_probes_the_ends_test_the_readings_whole_bracket() -> None:
    fit = ServiceFit(TRUE, True, 1000, [])
    flat = Extrapolated(6000, "flat past 6,000 tokens", 16.0, 15.4, 16.6, TRUE)
    answer = ModelAnswer(8.0, 7.7, 16.6, [], fit, True, "", own=(7.7, 8.3), extrapolated=[flat])
    ran: list[tuple[float, int]] = []

    def run(rate: float, left: int, kept: int) -> tuple[str, Probe | None]:
        if left == 3:
            raise slo.SearchStopped("200 s of the budget left")
        ran.append((rate, left))
        return ("fail" if rate > 16 else "pass"), None

    fitted, record = confirm_answer(answer, run, lambda: None, Q, LIMITS)
    assert [r for r, _ in ran] == list(reversed(confirmation_rates(7.7, 16.6))) and record.stands
    assert record.summary().startswith("no time for a probe at") and "whole bracket" in record.summary()
    assert (fitted.low, fitted.high) == (7.7, 16.6)
