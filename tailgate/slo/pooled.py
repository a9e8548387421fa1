"""Evidence pooled across rates under the monotone order of a work-conserving server.

The share of requests over a latency limit does not fall as the arrival rate rises. Where the measured
shares break that order (a higher rate that looked better than a lower one), isotonic regression
(pool-adjacent-violators) merges the rates into one block, and the block's pooled counts are tested with
the same anytime-valid mixture martingales as one probe. The block's average share is at least the share
at its lowest rate and at most the share at its highest, so a pooled "under the limit" is a pass for the
lowest rate (and every rate below) and a pooled "over the limit" is a fail for the highest (and every rate
above). A verdict a rate's own data did not reach can then come from its neighbours, and the bracket's
stated confidence needs no share of the error per look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailgate.slo.state import ProbeEntry
    from tailgate.slo.verdict import Check

from tailgate.tailbounds import FAIL, NOT_ENOUGH, PASS, seq_above, seq_below


@dataclass
class Block:
    """Adjacent rates merged by pool-adjacent-violators: their pooled effective counts."""

    rates: list[float]
    over: float
    n: float

    @property
    def share(self) -> float:
        return self.over / self.n if self.n > 0 else 0.0


def isotonic_blocks(points: Sequence[tuple[float, float, float]]) -> list[Block]:
    """Pool-adjacent-violators on (rate, effective over, effective n): blocks whose shares rise with the rate."""
    blocks: list[Block] = []
    for rate, over, n in sorted(points):
        blocks.append(Block([rate], over, n))
        while len(blocks) > 1 and blocks[-2].share > blocks[-1].share:
            b = blocks.pop()
            a = blocks[-1]
            blocks[-1] = Block(a.rates + b.rates, a.over + b.over, a.n + b.n)
    return blocks


def _effective_counts(check: Check | None) -> tuple[float, float] | None:
    if check is None:
        return None
    n, n_eff, over = check.n, check.n_effective, check.over
    if n <= 0 or n_eff is None or over is None:
        return None
    return over * n_eff / n, float(n_eff)


def pooled_verdicts(probes: Sequence[ProbeEntry], tails: Mapping[str, float], level: float) -> dict[float, str]:
    """Every rate's verdict after pooling: ``probes`` are the latest entry per rate, ``tails`` the allowed share
    over each percentile limit by key (0.01 for a p99). A rate's own pass or fail stands; an undecided rate is
    decided when the pooled blocks decide every limit it left open (and fails when one fails)."""
    own = {float(p.rate): p.verdict for p in probes}
    checks = {float(p.rate): {c.key: c for c in p.checks} for p in probes}
    alpha = 1.0 - level
    pooled_pass: dict[float, set[str]] = {r: set() for r in own}
    pooled_fail: dict[float, set[str]] = {r: set() for r in own}
    for key, tail in tails.items():
        points = []
        for r, cs in checks.items():
            counts = _effective_counts(cs.get(key))
            if counts is not None:
                points.append((r, *counts))
        for b in isotonic_blocks(points):
            if len(b.rates) < 2:
                continue  # a rate alone is its own probe's verdict
            if seq_below(b.over, b.n, tail, alpha):
                for r in own:
                    if r <= min(b.rates):
                        pooled_pass[r].add(key)
            elif seq_above(b.over, b.n, tail, alpha):
                for r in own:
                    if r >= max(b.rates):
                        pooled_fail[r].add(key)
    out = dict(own)
    for r, v in own.items():
        if v != NOT_ENOUGH:
            continue
        open_checks = [c for c in checks[r].values() if c.verdict == NOT_ENOUGH]
        if any(c.key in pooled_fail[r] for c in open_checks):
            out[r] = FAIL
        elif (
            open_checks
            and all(c.key in pooled_pass[r] for c in open_checks)
            and not any(c.verdict == FAIL for c in checks[r].values())
        ):
            out[r] = PASS
    return out
