"""Open-loop Poisson arrivals over a rate ramp (1, 5, 10, 20 req/s by default).

Request i of a stage goes out at t0 + the sum of the first i exponential gaps, drawn from
``Random(seed + 1)`` exactly as the reference harness draws them, whatever is in flight. A stage
starts once every request of the previous stage has ended (plus ``--settle`` seconds).
"""

from __future__ import annotations

from .base import SuiteShape


class ContinuousRamp(SuiteShape):
    arm = "continuous"
