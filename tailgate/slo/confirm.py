"""Predict, then test: a fitted capacity stands only once probes it was not fitted to fail to contradict it.

A model checked only against the probes it was fitted to cannot see its own bias: the replay of those probes is
close by construction, and on an engine outside the model's family (FIFO slots, a prefill that pairs long
prompts, KV-cache pressure) the narrow interval it gives can lie wholly on one side of the truth. So, after the
fit, the search runs *confirmation probes* where the model is most exposed: just under its interval's lower end
(the model says the SLO holds there) and just over its upper end (the model says it fails). They are chosen after
the fit and never fed to it, and they are longer than the search's probes, so that an error larger than the
interval's width shows.

Each confirmation probe can contradict the model two ways, each at the confidence of the search's verdicts:

- its measured verdict is the opposite of the model's (a decided *fail* under the interval, a decided *pass*
  over it): the capacity is outside the interval;
- the model, given the probe's own arrivals and requests, gives a percentile outside the probe's
  distribution-free interval for it (the same requests, so no window-to-window spread to hide behind).

A probe that decides as the model said *confirms* that end. A probe that decides nothing and whose percentile
the model replays inside the measured interval leaves that end *not contradicted*: the answer says so. A
contradicted model is refitted once on everything measured (the confirmation probes included) and confirmed
again at new rates; a second contradiction refuses it, and the answer is the measured bracket alone. A refit that
the probes already run still contradict is refused before any new probe is spent on it.

Pure: the probe's data come in, the judgement goes out, so the rule is tested against servers whose answer is
known (``tests/test_slo_confirm.py``) without a server.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tailgate.jsontypes import JsonObject
from tailgate.slo.readings import ReadingsTest, between_rate, judge_readings, narrowed_answer, readings_of
from tailgate.slo.replay import ModelAnswer
from tailgate.slo.search import SearchStopped
from tailgate.slo.servicefit import Probe
from tailgate.slo.windowmatch import WindowMatch, matches_at

MARGIN = 0.03
"""How far outside the model's interval a confirmation probe is placed, relative to the end it tests: close
enough that a model off by more than its width is contradicted, far enough that a right one is rarely."""
LENGTH = 1.5
"""A confirmation probe's measured requests, as a multiple of a search probe's."""
ROUNDS = 2
"""Fits confirmed at most: the first, and one refit after a contradiction."""
FITS_MARGIN = 0.98
"""The share of the time left a confirmation probe is sized to: the rounding of its request count and the
arrivals' own spread."""

Side = Literal["below", "above", "between"]
Outcome = Literal["confirmed", "not_contradicted", "contradicted", "not_run"]


def confirmation_rates(low: float, high: float, margin: float = MARGIN) -> tuple[float, float]:
    """Where to test an interval [low, high]: just under its lower end and just over its upper end (req/s)."""
    return round(low * (1.0 - margin), 3), round(high * (1.0 + margin), 3)


def reserve_seconds(time_budget: float, *, duration: float, n: int, warmup: int, rate: float,
                    overhead: float, rounds: int = ROUNDS) -> float:  # fmt: skip
    """Seconds of the time budget the search keeps for its confirmation probes, if they were at ``rate`` (a
    probe's length is ``max(n, rate * duration)`` requests, so the lowest rate costs the most): two probes of
    :data:`LENGTH` for the first fit, and two of one search probe's length for each refit after it (the
    shortest :func:`length_within` allows), so that a contradicted model can still be tested; 0 without a
    budget, never more than half of it."""
    if not time_budget:
        return 0.0
    per_request_s = 1.0 / rate
    first = LENGTH * max(n, rate * duration) + warmup
    later = max(n, rate * duration) + warmup
    seconds = 2 * (first * per_request_s + overhead) + (rounds - 1) * 2 * (later * per_request_s + overhead)
    return min(time_budget / 2, seconds * 1.05)


def reserve_rate(low: float | None, high: float | None, next_rate: float) -> float:
    """The rate the confirmation probes are budgeted at before the model is fitted: the highest rate shown to
    pass (they run near the capacity, above it); with only a failure, half the next probe's rate (the capacity
    may lie well under it); with nothing decided, the next probe's own rate. A search that decides nothing
    answers by its model alone, so that is when the model's confirmation matters most: a CPU vLLM search that
    extended one undecided rate five times left 39 s for the refit's test (issue #40)."""
    if low is not None:
        return low
    return next_rate / 2 if high is not None else next_rate


def length_within(remaining_s: float, probes_left: int, n: int, warmup: int, rate: float,
                  overhead: float, kept: int = 0, *, refit_s: float = 0.0) -> float | None:  # fmt: skip
    """The length (a multiple of a search probe's ``n``) a confirmation probe may have so that it and the
    ``probes_left - 1`` after it fit in ``remaining_s``: :data:`LENGTH` when it fits, less when not, never under
    one search probe (None: not even that fits; inf remaining: no budget).

    ``kept`` probes of a later round (a refitted model's test) are left time first, at one search probe's
    length each: a first round that took the whole reserve left a contradicted model's refit 2% short of its
    test in 9 of the simulated searches of issue #40 (270 s left, two 120-s probes and their overhead needed).
    ``refit_s`` is kept with them (the refit's own computing time). Where keeping them leaves this round under one
    search probe, this round takes what there is: a refit is only tested after this round has run."""
    if math.isinf(remaining_s):
        return LENGTH
    if kept:
        later = kept * ((n + warmup) / rate + overhead) / FITS_MARGIN + refit_s
        length = length_within(remaining_s - later, probes_left, n, warmup, rate, overhead)
        if length is not None:
            return length
    per_probe = remaining_s / max(1, probes_left) - overhead
    fits = FITS_MARGIN * (per_probe * rate - warmup) / n
    if fits < 1.0:
        return None
    return min(LENGTH, fits)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """One confirmation probe and what it says of the model."""

    rate: float
    side: Side
    """``below``: under the interval, where the model says the SLO holds; ``above``: over it, where it fails;
    ``between``: between two readings of an extrapolated cost (:mod:`tailgate.slo.readings`)."""
    verdict: str
    """The probe's measured verdict (``pass``, ``fail``, ``not_enough_data``; ``not_run`` when it could not)."""
    matches: tuple[WindowMatch, ...] = ()
    outcome: Outcome = "not_run"
    why: str = ""
    round: int = 1

    def to_json(self) -> JsonObject:
        return {"rate": self.rate, "side": self.side, "verdict": self.verdict, "outcome": self.outcome,
                "why": self.why, "round": self.round,
                "windows": [m.to_json() for m in self.matches]}  # fmt: skip


def expected_verdict(side: Side) -> str:
    return "pass" if side == "below" else "fail"


def judge(rate: float, side: Side, verdict: str, matches: Sequence[WindowMatch], claimed: tuple[float, float],
          round_: int = 1) -> Confirmation:  # fmt: skip
    """What one confirmation probe says of the model whose capacity interval, relative to its own capacity, is
    ``claimed`` (low / capacity, high / capacity): contradicted by a verdict opposite to the model's, or by a
    window whose implied capacity ratio lies wholly outside the claim; confirmed when neither happens and a
    window could be matched (or the verdict is the model's); not contradicted when nothing could tell."""
    says = "meets" if side == "below" else "fails"
    if verdict == "not_run":
        return Confirmation(rate, side, verdict, tuple(matches), "not_run",
                            f"the probe at {rate:g} req/s could not run", round_)  # fmt: skip
    opposite = "fail" if side == "below" else "pass"
    if verdict == opposite:
        why = f"the model says {rate:g} req/s {says} the SLO; the probe there measured {verdict.upper()}"
        return Confirmation(rate, side, verdict, tuple(matches), "contradicted", why, round_)
    lo_c, hi_c = claimed
    off = [m for m in matches if m.high < lo_c or m.low > hi_c]
    if off:
        m = off[0]
        why = (f"at {rate:g} req/s, {m.text()}, outside the model's own [{lo_c:.3f}, {hi_c:.3f}]")  # fmt: skip
        return Confirmation(rate, side, verdict, tuple(matches), "contradicted", why, round_)
    if any(m.bounds for m in matches) or verdict == expected_verdict(side):
        held = "; ".join(m.text() for m in matches) or f"measured {verdict.upper()} as the model says"
        why = f"at {rate:g} req/s ({verdict.replace('_', ' ')}): {held}"
        return Confirmation(rate, side, verdict, tuple(matches), "confirmed", why, round_)
    if matches:
        why = (f"the probe at {rate:g} req/s decided nothing and its window bounds nothing "
               f"({'; '.join(m.text() for m in matches)}): that end is not contradicted, not confirmed")  # fmt: skip
    else:
        why = (f"the probe at {rate:g} req/s decided nothing and had too few streams to match the model's tail: "
               "that end is not contradicted, not confirmed")  # fmt: skip
    return Confirmation(rate, side, verdict, tuple(matches), "not_contradicted", why, round_)


@dataclass(frozen=True, slots=True)
class Pooled:
    """A round's two confirmation windows matched as one: the ratio that bounds the capacity the answer states."""

    round: int
    claimed: tuple[float, float]
    matches: tuple[WindowMatch, ...]

    @property
    def excludes_claim(self) -> bool:
        lo, hi = self.claimed
        return any(m.high < lo or m.low > hi for m in self.matches)

    @property
    def span(self) -> tuple[float, float] | None:
        """The ratios every matched metric allows, hulled (None: no window matched, or one is open)."""
        if not self.matches or any(m.open_low or m.open_high for m in self.matches):
            return None
        return min(m.low for m in self.matches), max(m.high for m in self.matches)

    def text(self) -> str:
        return "; ".join(m.text() for m in self.matches) or "no limited percentile near its limit to match"

    def to_json(self) -> JsonObject:
        return {"round": self.round, "claimed": [round(c, 4) for c in self.claimed],
                "windows": [m.to_json() for m in self.matches]}  # fmt: skip


@dataclass
class ConfirmationRecord:
    """Every confirmation of one configuration's fitted model, and what they decided."""

    confirmations: list[Confirmation] = field(default_factory=list)
    pooled: list[Pooled] = field(default_factory=list)
    refitted: bool = False
    readings: list[ReadingsTest] = field(default_factory=list)
    """The probes between the readings of an extrapolated cost, and what each left."""

    @property
    def last_pooled(self) -> Pooled | None:
        last = max((c.round for c in self.confirmations), default=0)
        return next((p for p in self.pooled if p.round == last), None)

    @property
    def latest(self) -> list[Confirmation]:
        """The confirmations of the last round run (those of the fit that answers)."""
        last = max((c.round for c in self.confirmations), default=0)
        return [c for c in self.confirmations if c.round == last]

    @property
    def contradicted(self) -> list[Confirmation]:
        """The last round's contradictions: a probe's own, or both windows' together (reported on the upper one)."""
        own = [c for c in self.latest if c.outcome == "contradicted"]
        pooled = self.last_pooled
        if own or pooled is None or not pooled.excludes_claim:
            return own
        top = max(self.latest, key=lambda c: c.rate)
        lo, hi = pooled.claimed
        why = f"both windows together: {pooled.text()}, outside the model's own [{lo:.3f}, {hi:.3f}]"
        return [replace(top, outcome="contradicted", why=why)]

    @property
    def stands(self) -> bool:
        """The model's answer stands: both ends tested in its last round, neither contradicted, and something
        measured bounds it: the windows matched, or both verdicts came out as the model says."""
        latest = self.latest
        sides = {c.side for c in latest if c.outcome in ("confirmed", "not_contradicted")}
        if not latest or self.contradicted or not {"below", "above"} <= sides:
            return False
        pooled = self.last_pooled
        decided = all(c.verdict == expected_verdict(c.side) for c in latest if c.side != "between")
        return decided or (pooled is not None and pooled.span is not None)

    def summary(self) -> str:
        """One sentence: how the model fared against its confirmation probes."""
        if not self.confirmations:
            return "no confirmation probe ran"
        latest = self.latest
        if self.contradicted:
            again = max(c.round for c in self.confirmations) > 1
            lead = "contradicted again after a refit" if again else "contradicted"
            return f"{lead}: {self.contradicted[0].why}"
        not_run = [c for c in latest if c.outcome == "not_run" and c.side != "between"]
        if not_run:
            return not_run[0].why
        parts = [f"{c.rate:g} req/s {c.outcome.replace('_', ' ')} ({c.verdict.replace('_', ' ')})" for c in latest
                 if c.side != "between"]  # fmt: skip
        lead = "after a refit, " if self.refitted else ""
        text = f"{lead}tested outside its interval: " + "; ".join(parts)
        between = [c for c in latest if c.side == "between"]
        if between:
            said = between[0].why if between[0].outcome == "not_run" else f"between its readings {between[0].why}"
            text = f"{lead}{said}; " + text[len(lead) :]
        pooled = self.last_pooled
        if pooled is not None and pooled.matches:
            text += f"; both windows: {pooled.text()}"
        if not self.stands:
            text += "; nothing measured bounds it (no window bounds the ratio, no verdict decided)"
        return text

    def to_json(self) -> JsonObject:
        return {"stands": self.stands, "refitted": self.refitted, "summary": self.summary(),
                "probes": [c.to_json() for c in self.confirmations],
                "pooled": [p.to_json() for p in self.pooled],
                "readings": [t.to_json() for t in self.readings]}  # fmt: skip


ConfirmationRun = Callable[[float, int, int], tuple[str, Probe | None]]
"""Runs a confirmation probe at a rate, with this many confirmation probes of its round left to run counting it
and this many of a later round (a refit's test) to keep time for (so that it can leave them time:
:func:`length_within`): its verdict and its data as the model sees them (None: no data); raises
:class:`~tailgate.slo.search.SearchStopped` when no time is left for it."""


def _between(fitted: ModelAnswer, run: ConfirmationRun, q: float, limits: Mapping[str, float],
             log: Callable[[str], None], round_: int, record: ConfirmationRecord,
             windows: list[Probe], kept: int) -> ModelAnswer:  # fmt: skip
    """Where the answer's interval spans readings of a cost never measured that do not overlap, one probe between
    them first (:mod:`tailgate.slo.readings`): the answer within the bracket it leaves; no reading left standing is
    a contradiction. Without time for it and the two ends, the ends test the readings' whole bracket."""
    readings = readings_of(fitted)
    rate = between_rate(readings) if readings else None
    if rate is None:
        return fitted
    log(f"the readings its probes cannot rule out part ({'; '.join(r.text() for r in readings)}): "
        f"a probe between them at {rate:g} req/s")  # fmt: skip
    try:
        verdict, probe = run(rate, 3, kept)
    except SearchStopped as e:
        why = f"no time for a probe at {rate:g} req/s between its readings ({e}): the ends test their whole bracket"
        record.confirmations.append(Confirmation(rate, "between", "not_run", (), "not_run", why, round_))
        log(f"  {why}")
        return fitted
    test = ReadingsTest(round_, rate, verdict, tuple(judge_readings(readings, rate, verdict, probe, q, limits)))
    record.readings.append(test)
    windows.extend([probe] if probe is not None else [])
    narrowed = len(test.kept) < len(readings)
    outcome: Outcome = "contradicted" if not test.stands else "confirmed" if narrowed else "not_contradicted"
    why = test.text() if test.stands else f"no reading left standing {test.text()}"
    record.confirmations.append(Confirmation(rate, "between", verdict, (), outcome, why, round_))
    log(f"  between its readings: {why}")
    return narrowed_answer(fitted, test) if test.stands else fitted


def _ends(fitted: ModelAnswer, run: ConfirmationRun, q: float, limits: Mapping[str, float],
          log: Callable[[str], None], round_: int, record: ConfirmationRecord,
          windows: list[Probe], kept: int) -> None:  # fmt: skip
    """The two probes just outside the answer's interval (the upper one first), then their windows pooled."""
    assert fitted.fit is not None and fitted.low is not None and fitted.high is not None
    below, above = confirmation_rates(fitted.low, fitted.high)
    cap = fitted.capacity or (fitted.low + fitted.high) / 2
    claimed = (fitted.low / cap, fitted.high / cap)
    log(f"testing the fitted model (capacity ~{cap:.3g} req/s, interval [{fitted.low:.3g}, {fitted.high:.3g}]) "
        f"at {above:g} and {below:g} req/s, on probes it was not fitted to")  # fmt: skip
    sides: tuple[tuple[float, Side], ...] = ((above, "above"), (below, "below"))
    for k, (rate, side) in enumerate(sides):
        try:
            verdict, probe = run(rate, len(sides) - k, kept)
        except SearchStopped as e:
            c = replace(judge(rate, side, "not_run", (), claimed, round_),
                        why=f"no time for a probe at {rate:g} req/s: {e}")  # fmt: skip
        else:
            matches = () if probe is None else matches_at(fitted.fit.engine, [probe], q, list(limits), limits)
            c = judge(rate, side, verdict, matches, claimed, round_)
            windows.extend([probe] if probe is not None else [])
        record.confirmations.append(c)
        log(f"  confirmation at {rate:g} req/s: {c.outcome.replace('_', ' ')}: {c.why}")
        if c.outcome in ("contradicted", "not_run"):
            return
    if len(windows) > 1:  # every window at once: more blocks for one ratio
        pooled = matches_at(fitted.fit.engine, windows, q, list(limits), limits)
        record.pooled.append(Pooled(round_, claimed, pooled))
        log(f"  every window: {record.pooled[-1].text()}")


def contradicted_already(fitted: ModelAnswer, earlier: Sequence[tuple[Confirmation, Probe | None]], q: float,
                         limits: Mapping[str, float], round_: int) -> Confirmation | None:  # fmt: skip
    """A refit the confirmation probes already measured contradict, found before any new probe is spent on it.

    The refit is fitted to those probes too, yet a model outside the engine's family cannot always bend to
    them: on a lent H100 (chunked prefill on) the refit came out at the same capacity, its replay of the probe
    that had contradicted the first fit as far off as before (gap p99 180.1 ms against 196.8 measured), and its
    own two probes (274 s) only said so again. A decided verdict on the wrong side of the refit's interval, or a
    window whose implied capacity lies wholly outside its claim, refuses it at once (None: nothing measured
    contradicts it)."""
    if fitted.fit is None or fitted.low is None or fitted.high is None:
        return None
    cap = fitted.capacity or (fitted.low + fitted.high) / 2
    lo_c, hi_c = fitted.low / cap, fitted.high / cap
    for c, probe in earlier:
        side: Side = "below" if c.rate < cap else "above"
        why = ""
        if c.verdict == "fail" and c.rate < fitted.low:
            why = f"measured FAIL at {c.rate:g} req/s, under its interval"
        elif c.verdict == "pass" and c.rate > fitted.high:
            why = f"measured PASS at {c.rate:g} req/s, over its interval"
        matches = () if probe is None else matches_at(fitted.fit.engine, [probe], q, list(limits), limits)
        off = [m for m in matches if m.high < lo_c or m.low > hi_c]
        if not why and off:
            why = f"at {c.rate:g} req/s, {off[0].text()}, outside the refit's own [{lo_c:.3f}, {hi_c:.3f}]"
        if why:
            why = f"the probe of round {c.round} contradicts the refit too: {why}"
            return Confirmation(c.rate, side, c.verdict, matches, "contradicted", why, round_)
    return None


def confirm_answer(
    fitted: ModelAnswer,
    run: ConfirmationRun,
    refit: Callable[[], ModelAnswer | None],
    q: float,
    limits: Mapping[str, float],
    log: Callable[[str], None] = lambda line: None,
    rounds: int = ROUNDS,
) -> tuple[ModelAnswer, ConfirmationRecord]:
    """Test a fitted answer just outside its interval (the upper end first: there a too pessimistic model, the
    commoner error, is caught by one probe), after a probe between its readings where they part; after a
    contradiction refit once on everything measured and test the refit the same way. Returns the last answer
    tested and every confirmation; whether the answer stands is the record's to say (:func:`settle_confirmed`
    applies it)."""
    record = ConfirmationRecord()
    measured: list[Probe] = []
    for round_ in range(1, rounds + 1):
        if fitted.fit is None or fitted.low is None or fitted.high is None or not fitted.usable:
            break
        if round_ > 1:
            by_rate = {p.rate: p for p in measured}
            earlier = [(c, by_rate.get(c.rate)) for c in record.confirmations if c.verdict != "not_run"]
            stale = contradicted_already(fitted, earlier, q, limits, round_)
            if stale is not None:
                record.confirmations.append(stale)
                log(f"  {stale.why}: refused without a new probe")
                break
        windows: list[Probe] = []
        kept = 2 if round_ < rounds else 0  # a refit's two ends, should this round contradict the model
        fitted = _between(fitted, run, q, limits, log, round_, record, windows, kept)
        if not any(c.round == round_ and c.outcome == "contradicted" for c in record.confirmations):
            _ends(fitted, run, q, limits, log, round_, record, windows, kept)
        measured.extend(windows)
        if not record.contradicted or round_ == rounds:
            break
        again = refit()
        if again is None:
            break
        record.refitted = True
        fitted = again
        log(f"refitted on every probe, the confirmation probes included: capacity "
            f"{'~' + format(fitted.capacity, '.3g') if fitted.capacity else 'none'}"
            f"{'' if fitted.usable else ' (' + fitted.why + ')'}")  # fmt: skip
    return fitted, record


def settle_confirmed(
    answer: ModelAnswer, record: ConfirmationRecord, measured: tuple[float | None, float | None]
) -> ModelAnswer:
    """The fitted answer after its confirmation: it narrows the measured bracket (now with the confirmation
    probes' verdicts) only when it stands, and says why not otherwise; the answer is then the measured bracket."""
    answer.confirmation = record
    lo_m, hi_m = measured
    if not record.stands:
        lead = "refused" if record.contradicted else "not confirmed"
        answer.usable, answer.bracket = False, None
        answer.why = f"{lead}: {record.summary()}; the answer is the measured bracket alone"
        return answer
    low, high = answer.low, answer.high
    if low is None or high is None:
        answer.usable, answer.bracket, answer.why = False, None, "no interval to confirm"
        return answer
    pooled = record.last_pooled
    span = pooled.span if pooled is not None else None
    if span is not None and answer.capacity:
        # the interval stated is what the model claims and what its windows allow together, whichever is wider
        low, high = min(low, answer.capacity * span[0]), max(high, answer.capacity * span[1])
        answer.low, answer.high = low, high
    if lo_m is not None and high < lo_m:
        answer.usable, answer.bracket = False, None
        answer.why = f"its interval ends under the measured pass at {lo_m:g} req/s"
        return answer
    if hi_m is not None and low >= hi_m:
        answer.usable, answer.bracket = False, None
        answer.why = f"its interval starts over the measured failure at {hi_m:g} req/s"
        return answer
    answer.usable = True
    answer.bracket = (max(low, lo_m or 0.0), min(high, hi_m if hi_m is not None else math.inf))
    answer.why = f"every check held; {record.summary()}"
    return answer
