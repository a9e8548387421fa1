"""The step loop's three costs, measured on a server's own streams.

A continuous-batching step costs ``step_ms + step_ms_per_seq * running + prefill_ms_per_token * prefilled``. Each
stream's decode time is a sum of such steps, so the costs follow from a least-squares fit of every stream's mean
step against how many streams shared the engine and how many prompt tokens were prefilled beside it. Two things
bias that fit on an engine of the fitted family; each is measured here, and the replay of the probes chooses
among the costs that result (:func:`fit_costs`), since a real server is not always of that family:

- A stream's mean step is an average over steps, but the share of time a count of streams was running weighs long
  steps (many streams) more: the count is taken per step (time weighted by the inverse of the step's cost at
  that count, from the fit before), or the step cost comes out a few percent low and every queue replays short.
- The prefill cost rides on a few long prompts per span and comes out 10-15% off. It is measured directly where
  it is plain: the TTFT of requests that found no queue, against their prompt length and its square. Attention
  reads the whole prompt before each token, so a prompt's cost grows faster than its length where the model is
  small beside its context (the CPU server's 6,000-token prompt takes 2.7 times what its 200- and 1,000-token ones
  extrapolate to); the square term measures that, and a chunked prompt's last chunk is then its dearest step.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tailgate.records import RequestRecord

IDLE_ROWS = 200
"""Requests that found no queue wanted for the direct prefill estimate, taken from the lowest rates first."""
PROMPT_SPREAD = 2.0
"""The longest prompt among them at least this many times the shortest, or the slope is not determined."""
TRIM = 4.0
"""Residuals beyond this many robust standard deviations are dropped once (a front end's hiccup)."""
ROUNDS = 3
"""Refits with the per-step running count from the fit before (it settles within 0.2% by the second)."""

Row = tuple[float, float, float, float]
"""(weight, response, first regressor, second regressor): one row of the fits' least squares."""


class Costs(NamedTuple):
    """One candidate set of step-loop costs (the :class:`EngineModel` fields of the same meaning)."""

    step: float
    per_seq: float
    prefill: float
    ctx: float = 0.0
    """ms per prefilled token per 1,000 tokens of its prompt before it."""
    batch: float = 0.0
    """ms per prefilled token per 1,000 tokens prefilled in the same step."""
    frontend: float = 0.0
    """ms before a request joins the scheduler's queue."""
    frontend_per_token: float = 0.0
    """ms per prompt token on top of ``frontend``."""
    kv: float = 0.0
    """ms per step per 1,000 tokens held by the running streams (decoding reads each of them)."""


STEP_TOL_S = 0.0015
"""First tokens this close together were emitted by one step (a client's read jitter is well under it)."""
STALL_ROWS = 20
"""Steps with a stall seen by a running stream wanted for the stall fit."""
CTX_MIN_SHARE = 0.05
"""The square term is kept only when it adds at least this share to the longest idle prompt's prefill cost."""
KV_MIN_SHARE = 0.05
"""The held-token term is kept only when it adds at least this share to the mean step where the most is held."""


@dataclass(frozen=True)
class Stream:
    """One finished request as the fit and the replay see it (seconds on the attempt's clock, tokens)."""

    intended: float
    first: float
    end: float
    prompt: int
    tokens: int
    ttft_ms: float
    measured: bool
    gap_ms: float = 0.0
    total_ms: float = 0.0
    gap_end: float = 0.0
    """When the worst gap ended (0: unknown)."""

    def value(self, metric: str) -> float:
        return {"ttft": self.ttft_ms, "gap": self.gap_ms, "total": self.total_ms}[metric]


def streams_of(records: Sequence[RequestRecord], measured_ids: set[int]) -> list[Stream]:
    """The successful records of one attempt as streams; ``measured_ids`` are the trace ids past the warm-up.

    A record says how long its prompt was by the server's count where it has one, else the tokenizer's, else
    the plan's; and its length by the usage's completion tokens, else its chunks. A stream that never reached
    its first token or its end is left out: it has no service to fit."""
    out = []
    for r in records:
        ttft, end = r.ttft_from_intended_ms, r.end_s
        if r.error_class is not None or ttft is None or end is None:
            continue
        first = r.first_chunk_s if r.first_chunk_s is not None else r.intended_s + ttft / 1000.0
        prompt = next((n for n in (r.prompt_tokens, r.prompt_tokens_tokenized, r.prompt_tokens_planned)
                       if n is not None and n > 0), None)  # fmt: skip
        tokens = next((n for n in (r.completion_tokens, r.chunks) if n is not None and n > 0), None)
        if prompt is None or tokens is None:
            continue
        total = r.total_from_intended_ms
        out.append(Stream(r.intended_s, first, end, prompt, tokens, ttft, r.trace_id in measured_ids,
                          r.worst_gap_ms or 0.0, total if total is not None else (end - r.intended_s) * 1000.0,
                          r.worst_gap_end_s or 0.0))  # fmt: skip
    return out


def _count_steps(streams: Sequence[Stream]) -> list[tuple[float, int]]:
    """The running count's changes: (time, count from then on)."""
    events = sorted([(s.first, 1) for s in streams] + [(s.end, -1) for s in streams])
    out, run = [], 0
    for t, d in events:
        run += d
        out.append((t, run))
    return out


class _PerStep:
    """Per-step means over a span of the running count and of the tokens the running streams hold (each stream's
    prompt, plus its output as it grows from the first token to the last). Each stretch between two starts or ends
    is weighed by its length over the step's cost ``step + per_seq * n + kv * held / 1000`` at its middle, so a
    mean counts steps rather than seconds (``step`` 1 and the rest 0: per second)."""

    def __init__(self, streams: Sequence[Stream], step: float, per_seq: float, kv: float = 0.0) -> None:
        events: list[tuple[float, int, float, float]] = []
        for s in streams:
            slope = s.tokens / (s.end - s.first) if s.end > s.first else 0.0
            events.append((s.first, 1, s.prompt - slope * s.first, slope))
            events.append((s.end, -1, slope * s.first - s.prompt, -slope))
        events.sort(key=lambda e: (e[0], e[1]))
        self.cost = (step, per_seq, kv)
        self.times: list[float] = []
        self.state: list[tuple[int, float, float]] = []
        self.sums: list[tuple[float, float, float]] = []
        run, base, slope = 0, 0.0, 0.0
        w_sum = n_sum = held_sum = 0.0
        last: float | None = None
        for t, d, db, ds in events:
            if last is not None and t > last:
                w, held = self._stretch(run, base, slope, last, t)
                w_sum, n_sum, held_sum = w_sum + w, n_sum + run * w, held_sum + held
            run, base, slope, last = run + d, base + db, slope + ds, t
            self.times.append(t)
            self.state.append((run, base, slope))
            self.sums.append((w_sum, n_sum, held_sum))

    def _stretch(self, run: int, base: float, slope: float, a: float, b: float) -> tuple[float, float]:
        """(integral of the weight, integral of weight times held tokens) from ``a`` to ``b`` at a constant count."""
        if run <= 0:
            return 0.0, 0.0
        step, per_seq, kv = self.cost
        held_mid = base + slope * (a + b) / 2.0
        w = (b - a) / (step + per_seq * run + kv * held_mid / 1000.0)
        return w, w * held_mid

    def _at(self, t: float) -> tuple[float, float, float]:
        i = bisect.bisect_right(self.times, t) - 1
        if i < 0:
            return 0.0, 0.0, 0.0
        run, base, slope = self.state[i]
        w_sum, n_sum, held_sum = self.sums[i]
        w, held = self._stretch(run, base, slope, self.times[i], t) if t > self.times[i] else (0.0, 0.0)
        return w_sum + w, n_sum + run * w, held_sum + held

    def mean(self, start: float, end: float) -> tuple[float, float]:
        """(streams running, thousands of tokens held) per step from ``start`` to ``end``."""
        (w0, n0, h0), (w1, n1, h1) = self._at(start), self._at(end)
        return ((n1 - n0) / (w1 - w0), (h1 - h0) / (w1 - w0) / 1000.0) if w1 > w0 else (0.0, 0.0)


def held_rows(
    streams: Sequence[Stream], step: float = 1.0, per_seq: float = 0.0, kv: float = 0.0, ctx: float = 0.0
) -> list[tuple[float, float, float, float, float]]:
    """Per stream with three tokens or more: (weight, mean step ms, streams running per step, prompt tokens
    prefilled per step, thousands of tokens held per step). ``step``, ``per_seq`` and ``kv`` weigh the steps by
    their cost (all but ``step`` 0: per second); a known context cost ``ctx`` (ms per token per 1,000 before it) is
    taken off each mean step."""
    if not streams:
        return []
    per_step = _PerStep(streams, step, per_seq, kv)
    by_first = sorted(streams, key=lambda s: s.first)
    firsts = [s.first for s in by_first]
    prefix, squares = [0], [0.0]
    for s in by_first:
        prefix.append(prefix[-1] + s.prompt)
        squares.append(squares[-1] + ctx * s.prompt * s.prompt / 2000.0)
    rows = []
    for s in streams:
        steps = s.tokens - 1
        span = s.end - s.first
        if steps < 2 or span <= 0:
            continue
        i, j = bisect.bisect_right(firsts, s.first), bisect.bisect_right(firsts, s.end)
        prefilled = (prefix[j] - prefix[i]) / steps
        mean_step = (span * 1000.0 - (squares[j] - squares[i])) / steps
        running, held = per_step.mean(s.first, s.end)
        rows.append((float(steps), mean_step, running, prefilled, held))
    return rows


def decode_rows(streams: Sequence[Stream], step: float = 1.0, per_seq: float = 0.0, ctx: float = 0.0) -> list[Row]:
    """:func:`held_rows` without the held tokens: (weight, mean step ms, streams running per step, prompt tokens
    prefilled per step)."""
    return [(w, y, running, p) for w, y, running, p, _ in held_rows(streams, step, per_seq, 0.0, ctx)]


def fit_held_cost(
    rows: Sequence[tuple[float, float, float, float, float]], prefill: float | None
) -> tuple[float, float, float, float] | None:
    """(step ms, ms per running stream, ms per prefilled token, ms per 1,000 held tokens), each at least 0, with the
    held-token term kept (None where it comes out negative: the rows do not show it); a known ``prefill`` is
    taken off each row and not fitted."""
    if len(rows) < 10:
        return None
    if prefill is not None:
        rows = [(w, y - prefill * p, r, 0.0, h) for w, y, r, p, h in rows]
    for use_seq, use_prefill in ((True, prefill is None), (False, prefill is None), (True, False), (False, False)):
        sol = least_squares([(w, y, (1.0, *((r,) if use_seq else ()), *((p,) if use_prefill else ()), h))
                             for w, y, r, p, h in rows])  # fmt: skip
        if sol is None:
            continue
        step, rest = sol[0], list(sol[1:])
        per_seq = rest.pop(0) if use_seq else 0.0
        fitted_prefill = rest.pop(0) if use_prefill else (prefill or 0.0)
        kv = rest.pop(0)
        if kv <= 0:
            return None
        if step > 0 and per_seq >= 0 and fitted_prefill >= 0:
            return step, per_seq, fitted_prefill, kv
    return None


def solve(rows: Sequence[Row], use: tuple[bool, bool]) -> list[float] | None:
    """Weighted least squares of the response on (1, first, second), the unused regressors held at 0."""
    cols = [0] + [k + 1 for k, u in enumerate(use) if u]
    sol = least_squares([(w, y, tuple((1.0, r, p)[c] for c in cols)) for w, y, r, p in rows])
    if sol is None:
        return None
    out = [0.0, 0.0, 0.0]
    for ci, v in zip(cols, sol, strict=True):
        out[ci] = v
    return out


def least_squares(rows: Sequence[tuple[float, float, tuple[float, ...]]]) -> list[float] | None:
    """Weighted least squares of each row's response on its regressors; None when they are collinear."""
    if not rows:
        return None
    size = len(rows[0][2])
    a = [[0.0] * size for _ in range(size)]
    b = [0.0] * size
    for w, y, x in rows:
        for i in range(size):
            b[i] += w * x[i] * y
            for j in range(size):
                a[i][j] += w * x[i] * x[j]
    # Gaussian elimination with partial pivoting (a handful of columns)
    for i in range(size):
        piv = max(range(i, size), key=lambda k: abs(a[k][i]))
        if abs(a[piv][i]) < 1e-12:
            return None
        a[i], a[piv], b[i], b[piv] = a[piv], a[i], b[piv], b[i]
        for k in range(i + 1, size):
            f = a[k][i] / a[i][i]
            for j in range(i, size):
                a[k][j] -= f * a[i][j]
            b[k] -= f * b[i]
    sol = [0.0] * size
    for i in reversed(range(size)):
        sol[i] = (b[i] - sum(a[i][j] * sol[j] for j in range(i + 1, size))) / a[i][i]
    return sol


def fit_step_cost(rows: Sequence[Row], prefill: float | None = None) -> tuple[float, float, float] | None:
    """(step ms, ms per running stream, ms per prefilled token), every figure at least 0 (dropped and refitted);
    a known ``prefill`` cost is taken off each row's mean step and not fitted."""
    if len(rows) < 10:
        return None
    if prefill is not None:
        rows = [(w, y - prefill * p, r, 0.0) for w, y, r, p in rows]
    for use in ((True, prefill is None), (True, False), (False, prefill is None), (False, False)):
        sol = solve(rows, use)
        if sol is not None and sol[0] > 0 and sol[1] >= 0 and sol[2] >= 0:
            return sol[0], sol[1], sol[2] if prefill is None else prefill
    return None


def idle_streams(streams: Sequence[Stream], alone: bool = True) -> list[tuple[Stream, int]]:
    """Each request that found no earlier request still waiting for its first token and (``alone``) saw none
    arrive before its own, with the count of streams running when it came: its TTFT is one prefill beside the
    running decodes. Without ``alone`` a slow first token is not what leaves a request out (a later arrival's
    chance to come first grows with it), at the price of a later prompt's prefill sharing its step now and then."""
    order = sorted(streams, key=lambda s: s.intended)
    waiting_until = float("-inf")  # the latest first token among the requests that arrived before
    starts = _count_steps(order)
    times = [t for t, _ in starts]
    out = []
    for k, s in enumerate(order):
        first_alone = not alone or k + 1 == len(order) or order[k + 1].intended >= s.first
        if waiting_until <= s.intended and first_alone:
            i = bisect.bisect_right(times, s.intended) - 1
            out.append((s, starts[i][1] if i >= 0 else 0))
        waiting_until = max(waiting_until, s.first)
    return out


def idle_rows(streams: Sequence[Stream]) -> list[Row]:
    """(1, TTFT ms, streams running, prompt tokens) of each of :func:`idle_streams`."""
    return [(1.0, s.ttft_ms, float(running), float(s.prompt)) for s, running in idle_streams(streams)]


def _idle_fit(rows: Sequence[Row], square: bool) -> list[float] | None:
    """TTFT on (1, running, prompt[, prompt**2 / 2000]), refitted once without residuals beyond TRIM robust sd."""

    def x(r: float, p: float) -> tuple[float, ...]:
        return (1.0, r, p, p * p / 2000.0) if square else (1.0, r, p)

    def resid(sol: Sequence[float], y: float, r: float, p: float) -> float:
        return abs(y - sum(c * v for c, v in zip(sol, x(r, p), strict=True)))

    sol = least_squares([(w, y, x(r, p)) for w, y, r, p in rows])
    if sol is None:
        return None
    spread = 1.4826 * sorted(resid(sol, y, r, p) for _, y, r, p in rows)[len(rows) // 2]
    if spread > 0:
        kept = [(w, y, x(r, p)) for w, y, r, p in rows if resid(sol, y, r, p) <= TRIM * spread]
        sol = least_squares(kept) if len(kept) >= IDLE_ROWS // 4 else None
    return sol


def prefill_from_idle(attempts_by_rate: Sequence[Sequence[Sequence[Stream]]]) -> tuple[float, float] | None:
    """(ms per prompt token, ms per token per 1,000 before it) from the TTFT of requests that found no queue, the
    lowest rates first (their requests are the likeliest to find none); None when too few, or their prompts too
    alike to give a slope. The square term needs three prompt lengths or more and is kept only where it is
    positive and material (:data:`CTX_MIN_SHARE` of the longest prompt's cost); else the cost is linear."""
    rows: list[Row] = []
    for attempts in attempts_by_rate:
        if len(rows) >= IDLE_ROWS:
            break
        rows += [row for a in attempts for row in idle_rows(a)]
    prompts = [p for *_, p in rows]
    if len(rows) < IDLE_ROWS // 4 or min(prompts) <= 0 or max(prompts) < PROMPT_SPREAD * min(prompts):
        return None
    if len(set(prompts)) >= 3:
        sol = _idle_fit(rows, square=True)
        longest = max(prompts)
        if (
            sol is not None
            and sol[2] >= 0
            and sol[3] * longest * longest / 2000.0
            >= CTX_MIN_SHARE * (sol[2] * longest + sol[3] * longest * longest / 2000.0)
        ):
            return sol[2], sol[3]
    sol = _idle_fit(rows, square=False)
    return (sol[2], 0.0) if sol is not None and sol[2] > 0 else None


def stall_rows(streams: Sequence[Stream]) -> list[Row]:
    """(1, stall ms, streams in the step, prompt tokens prefilled in it) of every step that emitted first tokens and
    ended some running stream's worst gap: that gap is the step, as the streams beside the prefill felt it.

    A first token's TTFT also holds what the front end spends on the prompt before the scheduler sees it; the gap
    of a stream already running holds only the step. Steps are told apart by their first tokens' times, so the
    prefill is taken whole (a chunked prompt's earlier chunks ran in other steps: the replay judges that)."""
    if not streams:
        return []
    firsts = sorted(streams, key=lambda s: s.first)
    ends = sorted((s.gap_end, s.gap_ms) for s in streams if s.gap_end > s.first)
    end_times = [t for t, _ in ends]
    running = _count_steps(streams)
    run_times = [t for t, _ in running]
    rows: list[Row] = []
    k = 0
    while k < len(firsts):
        group = [firsts[k]]
        while k + len(group) < len(firsts) and firsts[k + len(group)].first - group[-1].first <= STEP_TOL_S:
            group.append(firsts[k + len(group)])
        k += len(group)
        lo, hi = group[0].first - STEP_TOL_S, group[-1].first + STEP_TOL_S
        gaps = sorted(g for _, g in ends[bisect.bisect_left(end_times, lo) : bisect.bisect_right(end_times, hi)])
        if not gaps:
            continue
        i = bisect.bisect_right(run_times, lo) - 1
        before = running[i][1] if i >= 0 else 0
        rows.append((1.0, gaps[len(gaps) // 2], float(before + len(group)), float(sum(s.prompt for s in group))))
    return rows


def prefill_from_stalls(
    attempts_by_rate: Sequence[Sequence[Sequence[Stream]]], step: float, per_seq: float
) -> tuple[float, float] | None:
    """(ms per prefilled token, ms per token per 1,000 prefilled in the same step) from the stalls running streams
    saw (:func:`stall_rows`), the step's own cost (``step + per_seq * running``) taken off. The square term is kept
    where steps of different prefill sizes show it (an unchunked GPU prefill of two long prompts costs more than
    twice one) and it is material (:data:`CTX_MIN_SHARE` of the largest step's prefill); None when too few."""
    rows = [(w, y - step - per_seq * r, r, t) for a in attempts_by_rate for at in a for w, y, r, t in stall_rows(at)]
    rows = [row for row in rows if row[3] > 0]
    if len(rows) < STALL_ROWS or max(t for *_, t in rows) < PROMPT_SPREAD * min(t for *_, t in rows):
        return None
    largest = max(t for *_, t in rows)
    sol = least_squares([(w, y, (t, t * t / 2000.0)) for w, y, _, t in rows])
    if (
        sol is not None
        and sol[0] >= 0
        and sol[1] * largest / 2000.0 >= CTX_MIN_SHARE * (sol[0] + sol[1] * largest / 2000.0)
    ):
        return sol[0], sol[1]
    sol = least_squares([(w, y, (t,)) for w, y, _, t in rows])
    return (sol[0], 0.0) if sol is not None and sol[0] > 0 else None


def frontend_from_idle(attempts_by_rate: Sequence[Sequence[Sequence[Stream]]], cost: Costs) -> tuple[float, float]:
    """(ms, ms per prompt token) that requests which found no queue spent beyond the step that prefilled them:
    their TTFT less the step's cost and half the decode step they arrived in (the replay waits that out itself),
    against the prompt. Each figure at least 0; (0, 0) where too few such requests were seen."""
    rows: list[tuple[float, float, tuple[float, ...]]] = []
    for attempts in attempts_by_rate:
        if len(rows) >= IDLE_ROWS:
            break
        for a in attempts:
            for _, ttft, running, p in idle_rows(a):
                decode = cost.step + cost.per_seq * running
                stepped = (
                    cost.step
                    + cost.per_seq * (running + 1)
                    + cost.prefill * p
                    + (cost.ctx + cost.batch) * p * p / 2000.0
                )
                rows.append((1.0, ttft - stepped - decode / 2.0, (1.0, p)))
    prompts = [x[1] for *_, x in rows]
    if len(rows) < IDLE_ROWS // 4 or min(prompts) <= 0 or max(prompts) < PROMPT_SPREAD * min(prompts):
        return 0.0, 0.0
    sol = least_squares(rows)
    if sol is None:
        return 0.0, 0.0
    if sol[1] < 0:  # no slope: the mean alone
        return max(0.0, sum(y for _, y, _ in rows) / len(rows)), 0.0
    return max(0.0, sol[0]), sol[1]


def fit_costs(attempts_by_rate: Sequence[Sequence[Sequence[Stream]]]) -> list[Costs]:
    """Candidate costs from every attempt's streams (``attempts_by_rate`` in rising rate), for the replay to
    choose from: the running count per second; per step with the prefill cost fitted; per step with the prefill
    cost measured on requests that found no queue (with its context term); per step with the prefill cost
    measured on the stalls it put on running streams (with its batch term, and the front end's share of the TTFT
    measured beside it). On a step loop of the fitted family the third is exact, but a chunk's step overhead
    counts as prefill in the direct slope, a few long prefill steps weigh on the per-step count as many steps
    would, and a real server's front end spends time on a long prompt that no step pays: which holds is what the
    probes' own replay shows."""
    attempts = [a for by_rate in attempts_by_rate for a in by_rate]
    first = fit_step_cost([row for a in attempts for row in decode_rows(a)])
    if first is None:
        return []
    per_second = Costs(*first)
    out = [per_second]

    def per_step(prefill: float | None, ctx: float, batch: float) -> Costs | None:
        cost = per_second
        for _ in range(ROUNDS):
            # a step's batch term, for the one prompt most steps prefill, costs as the context term does
            rows = [row for a in attempts for row in decode_rows(a, cost.step, cost.per_seq, ctx + batch)]
            refit = fit_step_cost(rows, prefill)
            if refit is None:
                break
            cost = Costs(*refit, ctx=ctx, batch=batch)
        return cost if cost is not per_second else None

    def held(cost: Costs, prefill: float | None) -> Costs | None:
        """The same costs with the held-token term, where the streams show it and it is material."""
        out_cost, square = cost._replace(kv=0.0), cost.ctx + cost.batch
        for _ in range(ROUNDS):
            rows = [row for a in attempts
                    for row in held_rows(a, out_cost.step, out_cost.per_seq, out_cost.kv, square)]  # fmt: skip
            refit = fit_held_cost(rows, prefill)
            if refit is None:
                return None
            step, per_seq, fitted_prefill, kv = refit
            out_cost = out_cost._replace(step=step, per_seq=per_seq, prefill=fitted_prefill, kv=kv)
        most = max((h for a in attempts for *_, h in held_rows(a, out_cost.step, out_cost.per_seq, out_cost.kv)),
                   default=0.0)  # fmt: skip
        mean_step = out_cost.step + out_cost.kv * most
        return out_cost if out_cost.kv * most >= KV_MIN_SHARE * mean_step else None

    measured_prefills: list[float | None] = [None]
    for measured in (None, prefill_from_idle(attempts_by_rate)):
        prefill, ctx = measured if measured is not None else (None, 0.0)
        cost = per_step(prefill, ctx, 0.0)
        if cost is not None and cost not in out:
            out.append(cost)
            measured_prefills.append(prefill)
    fitted = out[-1] if len(out) > 1 else None
    stalls = prefill_from_stalls(attempts_by_rate, fitted.step, fitted.per_seq) if fitted is not None else None
    if stalls is not None:
        cost = per_step(stalls[0], 0.0, stalls[1])
        if cost is not None:
            front, per_token = frontend_from_idle(attempts_by_rate, cost)
            cost = cost._replace(frontend=front, frontend_per_token=per_token)
            if cost not in out:
                out.append(cost)
                measured_prefills.append(stalls[0])
    # decoding reads every token the batch holds: where the streams show that cost, each per-step candidate is
    # offered with it too, and the replay chooses (an H100's step: 0.041 ms per 1,000 held tokens, its per-stream
    # cost falling from 0.12 to 0.015 ms; without it the probes near the capacity replayed 9% short)
    for cost, prefill in list(zip(out, measured_prefills, strict=True))[1:]:
        with_held = held(cost, prefill)
        if with_held is not None and with_held not in out:
            out.append(with_held)
    return out


def max_concurrency(streams: Sequence[Stream]) -> int:
    return max((n for _, n in _count_steps(streams)), default=0)
