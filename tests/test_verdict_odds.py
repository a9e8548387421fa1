"""A probe's verdict is wrong at most as often as its confidence allows, on a server whose capacity is known.

The FIFO-slot server of the coverage benchmark (outside the fitted model's family) queues in rare build-ups near
its capacity: a window of 500 requests just over it often sees none, and would pass on its own exceedances'
clustering (none to see). The design effect read at a populated threshold (q97) as well is what keeps those
passes under 5%: read at q99.5 instead, 9% of these probes passed (``benchmarks/verdict_odds.py``).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import verdict_odds

from tailgate import slo

FIFO4_TRUTH = 2.177
"""fifo4's capacity under its SLO (TTFT p99 <= 1 s), by 4 x 100,000 simulated requests per rate."""


def test_probes_just_over_the_capacity_rarely_pass_and_under_it_rarely_fail() -> None:
    server, text = verdict_odds.shape_server("fifo4")
    limits = slo.parse_slo(text)
    over = sum(
        (
            verdict_odds.odds(server, limits, round(FIFO4_TRUTH * f, 4), 500, 400, 25, 0.95, 100_000)
            for f in (1.03, 1.1)
        ),
        start=Counter(),
    )
    assert over["pass"] / 800 <= 0.07, over
    under = verdict_odds.odds(server, limits, round(FIFO4_TRUTH * 0.95, 4), 500, 400, 25, 0.95, 100_000)
    assert under["fail"] / 400 <= 0.07, under
    assert under["pass"] > over["pass"] / 2  # the verdicts are not merely silent: under the capacity some pass
