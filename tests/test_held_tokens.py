"""A step's cost in the tokens its batch holds: simulated by the engine, measured from streams, offered to the replay.

Decoding reads every token the running sequences hold, so on a GPU a batch of long contexts steps slower than as
many short ones (an H100 with an 8B model: ~0.04 ms per 1,000 held tokens). A fit by the running count alone
charges that to every stream and replays the probes near the capacity short.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tailgate.slo.servicefit import fit_service
from tailgate.slo.stepfit import fit_costs
from tailgate.verify.groundtruth.engine import EngineModel, EngineModelError, simulate
from tests.test_slo_replay import ENGINE, GPU, GPU_LIMITS, Q, probes

HELD = replace(GPU, step_ms_per_seq=0.01, step_ms_per_kv_ktoken=0.04)
"""The lent H100's costs as its streams showed them: 0.04 ms per 1,000 held tokens, 0.01 per stream."""


def test_a_step_costs_the_tokens_its_batch_holds() -> None:
    lone = replace(HELD, frontend_ms=0.0, frontend_ms_per_token=0.0)
    prefill = lone.prefill_ms_per_token * 6000 + lone.prefill_ms_per_token_step * 6000**2 / 2000
    out = simulate(lone, [(0, 6000, 3)])[0]
    # the prefill step starts with nothing held; the decode steps after it hold the prompt and the output so far
    assert out.ttft_ms == pytest.approx(lone.step_ms + lone.step_ms_per_seq + prefill, abs=0.01)
    decode = lone.step_ms + lone.step_ms_per_seq + lone.step_ms_per_kv_ktoken * 6.001
    assert out.worst_gap_ms == pytest.approx(lone.step_ms + lone.step_ms_per_seq + lone.step_ms_per_kv_ktoken * 6.002,
                                             abs=0.01)  # fmt: skip
    assert out.total_ms == pytest.approx(out.ttft_ms + decode + out.worst_gap_ms, abs=0.01)
    short = simulate(lone, [(0, 200, 3)])[0]
    assert short.worst_gap_ms < out.worst_gap_ms - 0.2  # the same one stream, a thirtieth of the tokens held


def test_an_engine_without_the_term_reads_as_before() -> None:
    assert "step_ms_per_kv_ktoken" not in GPU.describe()
    assert HELD.describe()["step_ms_per_kv_ktoken"] == 0.04
    assert EngineModel.from_dict(HELD.describe()) == HELD
    with pytest.raises(EngineModelError, match="step_ms_per_kv_ktoken"):
        EngineModel.from_dict({"step_ms_per_kv_ktoken": -1})


def test_the_held_token_cost_is_measured_and_chosen_by_the_replay() -> None:
    ps = probes([3.0, 6.0, 9.0], engine=HELD)
    costs = fit_costs([p.attempts for p in ps])
    held = [c for c in costs if c.kv > 0]
    assert held, costs
    assert any(c.kv == pytest.approx(HELD.step_ms_per_kv_ktoken, rel=0.15) for c in held), held
    assert all(c.per_seq < 0.05 for c in held), held  # the per-stream cost no longer carries the context's
    fit = fit_service(ps, Q, ("ttft", "gap"), GPU_LIMITS)
    assert fit is not None and fit.engine.step_ms_per_kv_ktoken > 0, fit.engine
    assert all(abs(r.model - r.measured) <= 0.1 * r.measured for r in fit.replay), fit.replay


def test_streams_of_an_engine_without_it_offer_no_such_costs() -> None:
    assert all(c.kv == 0.0 for c in fit_costs([p.attempts for p in probes([2.0, 6.0, 9.0], engine=ENGINE)]))
