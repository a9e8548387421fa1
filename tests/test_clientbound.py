"""The one rule that says the load generator measured itself: its bounds, and every place that uses it."""

from __future__ import annotations

from dataclasses import replace

from tailgate.clientbound import (
    BOUNDS,
    MERGED,
    TTFT_P99,
    WORST_GAP_MAX,
    WORST_GAP_P99,
    behind_note,
    breached,
    judge,
    merged_breached,
)
from tailgate.contracts import StageSummary
from tailgate.load.console import client_behind
from tailgate.verify.selfcheck import verdict_of
from tailgate.webui.live import table_rows


def test_each_figure_is_judged_against_its_own_bound_and_printed_beside_it() -> None:
    found = judge({WORST_GAP_P99: 0.4, WORST_GAP_MAX: 9.7, TTFT_P99: 0.02, MERGED: 0})
    assert [f.bound.key for f in found] == [WORST_GAP_P99, WORST_GAP_MAX, TTFT_P99, MERGED]
    assert [f.bound.key for f in breached(found)] == [WORST_GAP_MAX]
    text = found[1].text()
    assert "9.700 ms" in text and "bound 5.000 ms" in text and "BREACHED" in text
    assert found[0].text().endswith("ok") and "bound 1.000 ms" in found[0].text()


def test_a_bound_is_inclusive_and_a_figure_never_measured_is_not_a_breach() -> None:
    limits = {b.key: b.limit for b in BOUNDS}
    at_bounds = judge({key: limits[key] for key in (WORST_GAP_P99, WORST_GAP_MAX, TTFT_P99, MERGED)})
    assert not breached(at_bounds)
    (unmeasured,) = judge({TTFT_P99: None})
    assert not unmeasured.breached and "not measured" in unmeasured.text()


def test_limits_override_the_stated_bounds() -> None:
    (f,) = judge({WORST_GAP_P99: 2.0}, {WORST_GAP_P99: 3.0})
    assert not f.breached and "bound 3.000 ms" in f.text()
    (m,) = judge({MERGED: 2}, {MERGED: 5})
    assert not m.breached


def test_the_verdict_fails_on_any_breach_and_on_an_inexact_join() -> None:
    ok, passed = verdict_of(True, judge({WORST_GAP_P99: 0.1, MERGED: 0}))
    assert passed and ok.startswith("OK")
    text, passed = verdict_of(True, judge({WORST_GAP_P99: 0.1, MERGED: 249}))
    assert not passed and "merged streams: 249 streams" in text
    text, passed = verdict_of(False, judge({WORST_GAP_P99: 0.1}))
    assert not passed and "not exact" in text


def test_console_tab_and_self_check_agree_on_merged_streams() -> None:
    """The console line, the tab's column and the report's mark all ask ``merged_breached``."""
    base = StageSummary(stage_label="cont_r50", n=200)
    for merged in (0, 1, 249):
        flagged = merged_breached(merged)
        assert flagged == (merged > 0)
        assert bool(client_behind(replace(base, client_coalesced_streams=merged))) == flagged
        (row,) = table_rows({"stages": [{"label": "s", "state": "done", "planned": 1, "sent": 1, "recorded": 1,
                                         "client_coalesced": merged}]})  # fmt: skip
        assert ("gaps show the client" in row["behind"]) == flagged
        assert bool(behind_note(merged)) == flagged
