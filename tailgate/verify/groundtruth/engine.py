"""A simulated continuous-batching engine whose latencies follow from a stated model.

A capacity search can only be judged against a server whose true answer is known. This engine is
small enough to reason about and rich enough to show what a real scheduler does to the tail:

- ``slots`` sequences run at once; the rest wait in a FIFO admission queue;
- every step costs ``step_ms + step_ms_per_seq * running`` plus ``prefill_ms_per_token`` for every
  prompt token prefilled in it, so a long prompt inserted into the batch stalls *every* running
  stream for that step (the batch-wide stall of unchunked prefill); with ``prefill_ms_per_token_ctx``
  a prompt token also costs in proportion to the prompt before it (attention reads the whole context),
  so a prompt's cost grows with its square and the last chunk of a long prompt is its dearest; with
  ``prefill_ms_per_token_step`` a token also costs in proportion to every token prefilled in the same step, so
  two long prompts prefilled together cost more than twice one (as a GPU's unchunked prefill does); with
  ``prefill_flat_above``, a step past that many prompt tokens pays those square terms at their rate there, no more;
- with ``frontend_ms`` and ``frontend_ms_per_token`` a request reaches the scheduler that long (plus so much per
  prompt token) after it arrived (the front end parses, tokenizes and copies the prompt beside the engine): its
  own TTFT pays it, no step does;
- with ``frontend_noise``, each request reaches the scheduler later again by a delay drawn (seeded) from those
  measured on requests of its prompt's length: a real server's lone long prompt is answered in 180 ms one time
  and 330 the next, without stalling anyone, and at low load that spread, not any queue, is the TTFT's p99;
- with ``async_scheduling`` on, each step is composed when the one before it starts (vLLM's asynchronous
  scheduling keeps the next step ready while the GPU runs the current one): a request that joins the queue while
  a step runs misses the step after it too, so two long prompts that reach a busy engine a moment apart are
  prefilled in consecutive steps rather than in one;
- with ``step_ms_per_kv_ktoken``, a step also costs in proportion to the tokens its running sequences hold (prompt
  and output so far): decoding reads every one of them, so a batch of long contexts steps slower than as many
  short ones (on an H100 an 8B model's step rose by ~0.04 ms per 1,000 held tokens, its KV cache read once);
- with ``chunked`` on, a step prefills at most ``chunk_tokens`` prompt tokens, which bounds the stall
  and spreads a long prompt over several steps;
- with a KV pool (``kv_capacity_tokens``), admission waits for room and a running batch that outgrows
  the pool preempts its newest sequence (recompute: it goes back to the head of the queue and prefills
  its prompt and the tokens it already streamed again), counted as vLLM counts preemptions.

The same :class:`Engine` drives the ground-truth server's streams (real clock) and :func:`simulate`
(virtual clock), so the truth a benchmark computes and what the server serves cannot drift apart.
Times are integer nanoseconds. Stdlib only.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tailgate.jsontypes import JsonObject
from tailgate.records import RequestRecord

MS = 1_000_000


class EngineModelError(ValueError):
    """An engine setting out of range; the message names the setting."""


@dataclass(frozen=True)
class EngineModel:
    """The engine's parameters; every latency the engine produces follows from these."""

    slots: int = 8
    step_ms: float = 4.0
    step_ms_per_seq: float = 0.25
    prefill_ms_per_token: float = 0.02
    chunked: bool = False
    chunk_tokens: int = 512
    kv_capacity_tokens: int = 0
    """0: unlimited (no admission limit, no preemption)."""
    prefill_ms_per_token_ctx: float = 0.0
    """ms per prefilled token per 1,000 tokens of the prompt before it: a chunk of ``take`` tokens starting at
    position ``s`` costs ``prefill_ms_per_token_ctx * take * (s + take / 2) / 1000`` on top, and a whole prompt of
    ``P`` tokens ``prefill_ms_per_token_ctx * P**2 / 2000``, however it is chunked."""
    prefill_ms_per_token_step: float = 0.0
    """ms per prefilled token per 1,000 tokens prefilled in the same step: a step that prefills ``T`` tokens
    costs ``prefill_ms_per_token_step * T**2 / 2000`` on top (alone, a whole prompt costs as with the context
    term; two prompts in one step cost more than apart)."""
    prefill_flat_above: int = 0
    """Prompt tokens in a step beyond which the square terms grow only in proportion to the tokens (their average
    per token at this size; 0: never): costs fitted to steps no larger than this say nothing of the square past
    it, and a GPU's step there may cost its flat rate rather than the square's (an H100's full 8,192-token step:
    ~186 ms, where the square fitted to 6,000-token steps says ~211 and the flat rate ~179)."""
    step_ms_per_kv_ktoken: float = 0.0
    """ms per step per 1,000 tokens held by the running sequences (prompt and output so far, a prompt's chunks as
    they are prefilled)."""
    frontend_ms: float = 0.0
    """ms between a request's arrival and its entry into the scheduler's queue, whatever its prompt."""
    frontend_ms_per_token: float = 0.0
    """ms per prompt token on top of ``frontend_ms``."""
    frontend_noise: tuple[tuple[int, float], ...] = ()
    """(prompt tokens, ms) pairs: a request waits one of the delays measured at the prompt length nearest its own
    on top of the front end's (never before its arrival; empty: no spread)."""
    noise_seed: int = 0
    """Seeds the draws of ``frontend_noise``: one engine run, one sequence."""
    frontend_serial: bool = False
    """The per-token part of the front end serves one request at a time, in arrival order (a server that tokenizes
    on one event loop): a long prompt sent just after another reaches the scheduler one tokenization later, so
    the two rarely share a step. The fixed part is per request, as before. vLLM's H100 and H200 with chunked
    prefill off prefilled two 6,000-token prompts sent 1 ms apart in consecutive steps; over three 4,000-request
    runs they paired 10 times, this front end replayed 14 and a side-by-side one 21 (``benchmarks/pair_steps.py``)."""
    async_scheduling: bool = False
    """Each step is composed of the requests queued when the step before it started (back to back; an idle engine
    composes at once), as vLLM's asynchronous scheduling does (on by default in 0.24). On those runs it moved the
    paired steps little (19 against 21 side by side, 16 against 14 one at a time)."""

    def ready_ns(self, arrival_ns: int, prompt_tokens: int, extra_ms: float = 0.0) -> int:
        """When a request that arrived at ``arrival_ns`` joins the scheduler's queue (``extra_ms``: its draw of
        :attr:`frontend_noise`)."""
        delay = self.frontend_ms + self.frontend_ms_per_token * prompt_tokens + extra_ms
        return arrival_ns + max(0, round(delay * MS))

    @classmethod
    def from_dict(cls, doc: object) -> EngineModel:
        """Validate a control/CLI document; unknown keys and bad values raise :class:`EngineModelError`."""
        if not isinstance(doc, dict):
            raise EngineModelError("engine must be an object of engine settings (or null to turn it off)")
        known = {f.name: f for f in fields(cls)}
        unknown = set(doc) - set(known)
        if unknown:
            raise EngineModelError(f"unknown engine settings {sorted(unknown)}; known: {sorted(known)}")
        noise = doc.get("frontend_noise", ())
        if not isinstance(noise, list | tuple) or not all(
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and isinstance(pair[0], int)
            and not isinstance(pair[0], bool)
            and pair[0] > 0
            and isinstance(pair[1], int | float)
            and not isinstance(pair[1], bool)
            and math.isfinite(pair[1])
            for pair in noise
        ):
            raise EngineModelError(f"engine frontend_noise must be [prompt tokens, ms] pairs, got {noise!r}")
        model = cls(**{**doc, "frontend_noise": tuple((int(p), float(ms)) for p, ms in noise)})
        for name in ("slots", "chunk_tokens", "noise_seed"):
            v = getattr(model, name)
            least = 0 if name == "noise_seed" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise EngineModelError(f"engine {name} must be an integer >= {least}, got {v!r}")
        for name in ("kv_capacity_tokens", "prefill_flat_above"):
            v = getattr(model, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise EngineModelError(f"engine {name} must be an integer >= 0, got {v!r}")
        for name in (
            "step_ms",
            "step_ms_per_seq",
            "prefill_ms_per_token",
            "prefill_ms_per_token_ctx",
            "prefill_ms_per_token_step",
            "step_ms_per_kv_ktoken",
            "frontend_ms_per_token",
        ):
            v = getattr(model, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise EngineModelError(f"engine {name} must be a number >= 0, got {v!r}")
        if model.step_ms <= 0:
            raise EngineModelError("engine step_ms must be above 0")
        for name in ("chunked", "async_scheduling", "frontend_serial"):
            if not isinstance(getattr(model, name), bool):
                raise EngineModelError(f"engine {name} must be true or false, got {getattr(model, name)!r}")
        return model

    def describe(self) -> JsonObject:
        """The settings, the noise's only where there is noise (so an engine without it reads as it always did)."""
        doc: JsonObject = asdict(self)
        for unused in ("prefill_flat_above", "step_ms_per_kv_ktoken"):
            if not doc[unused]:
                del doc[unused]
        for flag in ("async_scheduling", "frontend_serial"):
            if not doc[flag]:
                del doc[flag]
        if not self.frontend_noise:
            del doc["frontend_noise"], doc["noise_seed"]
        else:
            doc["frontend_noise"] = [list(pair) for pair in self.frontend_noise]
        return doc


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One sequence in the engine. ``owner`` is whatever the caller attaches (the server's stream)."""

    prompt_tokens: int
    max_tokens: int
    arrival_ns: int
    owner: Any = None
    k: int = 0
    """Tokens emitted so far."""
    prefill_left: int = 0
    emitted_ns: list[int] = field(default_factory=list)
    """When each token was emitted (kept only by :func:`simulate`)."""
    cancelled: bool = False
    """The client went away (a front end still holding the request drops it)."""
    ready_ns: int = 0
    """When it joined the scheduler's queue (what :attr:`EngineModel.async_scheduling` composes by)."""

    def __post_init__(self) -> None:
        self.prefill_left = self.prompt_tokens


class FrontendNoise:
    """Draws of :attr:`EngineModel.frontend_noise`: among the delays measured at the prompt length nearest a
    request's own (by ratio), one at random."""

    def __init__(self, pairs: Sequence[tuple[int, float]], seed: int) -> None:
        self._rng = random.Random(seed)
        self._by_prompt: dict[int, list[float]] = {}
        for prompt, ms in pairs:
            self._by_prompt.setdefault(prompt, []).append(ms)
        self._lengths = sorted(self._by_prompt)
        self._nearest: dict[int, list[float]] = {}

    def draw(self, prompt_tokens: int) -> float:
        delays = self._nearest.get(prompt_tokens)
        if delays is None:
            p = max(1, prompt_tokens)
            near = min(self._lengths, key=lambda n: abs(math.log(n / p)))
            delays = self._nearest[prompt_tokens] = self._by_prompt[near]
        return self._rng.choice(delays)


class Engine:
    """The scheduler: submit requests, start a step, finish it; the caller owns the clock."""

    def __init__(self, model: EngineModel) -> None:
        self.model = model
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.preemptions = 0
        self.prompt_tokens_done = 0
        self.step_end_ns: int | None = None
        """End of the step in flight; None while idle."""
        self.last_end_ns = 0
        """End of the last step: an idle engine's next step starts no earlier (arrivals stamped before it
        wait for the next step, as they would have in a step-by-step clock)."""
        self.last_start_ns = -1
        """Start of the last step (-1: none yet)."""
        self._emit: list[EngineRequest] = []
        self._prefilled = 0
        self._frontend_free_ns = 0
        """When a serial front end finishes the request before (:attr:`EngineModel.frontend_serial`)."""
        self._noise = FrontendNoise(model.frontend_noise, model.noise_seed) if model.frontend_noise else None

    def ready_ns(self, arrival_ns: int, prompt_tokens: int) -> int:
        """When a request joins the queue: the model's front end, and its own draw of the front end's spread.
        Called once per request in arrival order (a serial front end queues each behind the one before)."""
        m = self.model
        extra = self._noise.draw(prompt_tokens) if self._noise is not None else 0.0
        if not m.frontend_serial:
            return m.ready_ns(arrival_ns, prompt_tokens, extra)
        start = max(arrival_ns, self._frontend_free_ns)
        self._frontend_free_ns = start + round(m.frontend_ms_per_token * prompt_tokens * MS)
        return self._frontend_free_ns + max(0, round((m.frontend_ms + extra) * MS))

    # -- state
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_used(self) -> int:
        """Tokens held by running sequences (prompt and generated so far)."""
        return sum(r.prompt_tokens + r.k for r in self.running)

    def submit(self, req: EngineRequest) -> None:
        self.waiting.append(req)

    def cancel(self, req: EngineRequest) -> None:
        """A client went away: the sequence leaves the engine wherever it is."""
        req.cancelled = True
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass

    # -- one step
    def start_step(self, now_ns: int) -> int | None:
        """Compose the next step at ``now_ns``; return when it ends (None: nothing to do)."""
        m = self.model
        cap = m.kv_capacity_tokens
        if cap:
            # the batch grows one token per running sequence per step: preempt the newest when it would not fit
            while len(self.running) > 1 and sum(r.prompt_tokens + r.k + 1 for r in self.running) > cap:
                victim = self.running.pop()
                victim.prefill_left = victim.prompt_tokens + victim.k
                self.waiting.appendleft(victim)
                self.preemptions += 1
        used = self.kv_used() if cap else 0
        # composed when the step before started, where this one follows it without a pause (an engine with
        # nothing running composes at once)
        back_to_back = self.running and self.last_start_ns >= 0 and self.last_end_ns == now_ns
        cut = self.last_start_ns if m.async_scheduling and back_to_back else now_ns
        while self.waiting and len(self.running) < m.slots:
            head = self.waiting[0]
            if head.ready_ns > cut:
                break
            need = head.prompt_tokens + head.k
            if cap and self.running and used + need > cap:
                break
            self.running.append(self.waiting.popleft())
            used += need
        if not self.running:
            self.step_end_ns = None
            return None
        self.last_start_ns = now_ns
        budget = m.chunk_tokens if m.chunked else math.inf
        prefilled = 0
        context = 0.0  # sum over the tokens prefilled of the prompt before each (a recompute counts its output too)
        held = 0  # tokens the running sequences hold in the KV cache as the step starts
        emit: list[EngineRequest] = []
        for r in self.running:
            held += r.prompt_tokens + r.k - r.prefill_left
            if r.prefill_left == 0:
                emit.append(r)
                continue
            if budget <= 0:
                continue
            take = int(min(r.prefill_left, budget))
            context += take * (r.prompt_tokens + r.k - r.prefill_left + take / 2)
            r.prefill_left -= take
            budget -= take
            prefilled += take
            if r.prefill_left == 0:
                emit.append(r)
        self.prompt_tokens_done += prefilled
        self._emit = emit
        self._prefilled = prefilled
        ms = m.step_ms + m.step_ms_per_seq * len(self.running) + m.prefill_ms_per_token * prefilled
        ms += m.step_ms_per_kv_ktoken * held / 1000.0
        square = m.prefill_ms_per_token_ctx * context / 1000.0 + m.prefill_ms_per_token_step * prefilled**2 / 2000.0
        if m.prefill_flat_above and prefilled > m.prefill_flat_above:
            rate = (m.prefill_ms_per_token_ctx + m.prefill_ms_per_token_step) * m.prefill_flat_above / 2000.0
            square = min(square, rate * prefilled)
        ms += square
        self.step_end_ns = now_ns + round(ms * MS)
        return self.step_end_ns

    def finish_step(self) -> list[EngineRequest]:
        """End the step in flight: every sequence that produced a token this step, in batch order.

        Each has ``k`` already advanced; those that reached ``max_tokens`` have left the batch.
        """
        emit, self._emit = self._emit, []
        self.last_end_ns = self.step_end_ns or self.last_end_ns
        self.step_end_ns = None
        done = False
        for r in emit:
            r.k += 1
            if r.k >= r.max_tokens:
                done = True
        if done:
            self.running = [r for r in self.running if r.k < r.max_tokens]
        return emit


# ------------------------------------------------------------------------------------------ the truth


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request saw, from its arrival (the intended send of an open-loop client)."""

    arrival_ns: int
    ttft_ms: float
    worst_gap_ms: float
    total_ms: float
    worst_gap_end_ns: int = 0
    """When the worst gap ended (0: the stream had one token)."""

    def record(self, trace_id: int, prompt_tokens: int, tokens: int, *, rate: float = 0.0) -> RequestRecord:
        """The record an exact open-loop client would have written for this request (sent on time, every token
        one chunk): what a verdict and the step-loop fit read from a probe, for a probe run in virtual time."""
        intended = self.arrival_ns / 1e9
        return RequestRecord(
            run_id="simulated", worker="simulated", trace_id=trace_id, stage=0, stage_label=f"{rate:g} req/s",
            arm="continuous", rate_or_batch=rate, batch=None, prompt_tokens_planned=prompt_tokens, max_tokens=tokens,
            ignore_eos=True, intended_s=intended, sent_s=intended, schedule_lag_ms=0.0, in_flight_at_send=0,
            first_chunk_s=intended + self.ttft_ms / 1e3, end_s=intended + self.total_ms / 1e3,
            ttft_ms=self.ttft_ms, ttft_from_intended_ms=self.ttft_ms, worst_gap_ms=self.worst_gap_ms,
            worst_gap_end_s=self.worst_gap_end_ns / 1e9 if self.worst_gap_end_ns else None,
            total_ms=self.total_ms, total_from_intended_ms=self.total_ms, chunks=tokens,
            prompt_tokens=prompt_tokens, completion_tokens=tokens,
        )  # fmt: skip


def simulate(model: EngineModel, arrivals: Iterable[tuple[int, int, int]], *, fast: bool = True) -> list[Outcome]:
    """Run the engine on ``(arrival ns, prompt tokens, max tokens)`` in virtual time, in arrival order.

    An arrival during a step joins the queue and is admitted at the next step's start, exactly as the
    server's event loop does it. ``fast`` jumps over runs of identical decode steps (no prefill, no
    possible admission, no completion, no preemption in between) in one move; it changes no result
    (a test holds it to the step-by-step run), only the time a long truth run takes.
    """
    engine = Engine(model)
    # (joins the queue, arrival, prompt, max tokens): a front end's delay may reorder requests
    pending = deque(sorted((engine.ready_ns(a, p), a, p, mx) for a, p, mx in arrivals))
    reqs: list[EngineRequest] = []
    # per request: [first token ns, last token ns, worst gap ns, end of the worst gap ns]
    stats: dict[int, list[int]] = {}

    def admit_until(t: int) -> None:
        while pending and pending[0][0] <= t:
            ready, a, p, mx = pending.popleft()
            req = EngineRequest(p, mx, a, ready_ns=ready)
            stats[id(req)] = [-1, -1, 0, 0]
            reqs.append(req)
            engine.submit(req)

    def emitted(r: EngineRequest, first_t: int, step_ns: int, count: int) -> None:
        st = stats[id(r)]
        if st[0] < 0:
            st[0] = first_t
        elif first_t - st[1] > st[2]:
            st[2], st[3] = first_t - st[1], first_t
        if count > 1 and step_ns > st[2]:
            st[2], st[3] = step_ns, first_t + step_ns
        st[1] = first_t + (count - 1) * step_ns

    t = 0
    while pending or engine.has_work:
        if engine.step_end_ns is None:
            if not engine.has_work:
                t = max(t, pending[0][0])
            admit_until(t)
            end = engine.start_step(t)
            if fast and end is not None:
                run = _identical_steps(engine, t, end - t, pending[0][0] if pending else None)
                if run > 1:
                    d = end - t
                    engine._emit = []
                    engine.step_end_ns = None
                    for r in engine.running:
                        r.k += run
                        emitted(r, t + d, d, run)
                    engine.running = [r for r in engine.running if r.k < r.max_tokens]
                    t += run * d
                    engine.last_start_ns, engine.last_end_ns = t - d, t
                    admit_until(t)
            continue
        end = engine.step_end_ns
        admit_until(end)
        for r in engine.finish_step():
            emitted(r, end, 0, 1)
        t = end
    out = []
    for r in sorted(reqs, key=lambda r: r.arrival_ns):
        first, last, worst, worst_end = stats[id(r)]
        out.append(
            Outcome(r.arrival_ns, (first - r.arrival_ns) / MS, worst / MS, (last - r.arrival_ns) / MS, worst_end)
        )
    return out


def _identical_steps(engine: Engine, now: int, step_ns: int, next_arrival: int | None) -> int:
    """How many steps from ``now`` will be the step just composed, unchanged (0 or 1: no shortcut)."""
    m = engine.model
    running = engine.running
    if engine._prefilled or len(engine._emit) != len(running):
        return 0
    if engine.waiting and len(running) < m.slots and not m.kv_capacity_tokens:
        return 0
    run = min(r.max_tokens - r.k for r in running)
    if len(running) < m.slots and next_arrival is not None:
        # the step that ends at or after the arrival is the last identical one: the next start admits it
        run = min(run, max(1, -(-(next_arrival - now) // step_ns)))
    if m.kv_capacity_tokens:
        if engine.waiting and len(running) < m.slots:
            return 0
        slack = m.kv_capacity_tokens - sum(r.prompt_tokens + r.k + 1 for r in running)
        run = min(run, 1 + slack // max(1, len(running)))
    return max(0, run)


def poisson_arrivals(
    rate: float, lengths: Sequence[tuple[int, int]], seed: int, start_ns: int = 0
) -> list[tuple[int, int, int]]:
    """Poisson arrivals at ``rate`` req/s carrying ``lengths`` in order (one arrival per item)."""
    rng = random.Random(seed)
    t = float(start_ns)
    out = []
    for p, mx in lengths:
        t += rng.expovariate(rate) * 1e9
        out.append((round(t), p, mx))
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule (the smallest value with at least q of the sample at or under it)."""
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def true_quantiles(
    model: EngineModel,
    rate: float,
    lengths: Sequence[tuple[int, int]],
    q: float = 0.99,
    *,
    seed: int = 1,
    warmup_fraction: float = 0.05,
) -> dict[str, float]:
    """Steady-state q-quantiles of TTFT, worst gap and total at ``rate``, by one long simulation.

    ``lengths`` should be long (tens of thousands of draws from the workload's mix) so the estimate's
    own error is small beside the quantities compared with it; the first ``warmup_fraction`` of
    requests (the empty-server start) is left out.
    """
    outs = simulate(model, poisson_arrivals(rate, lengths, seed))
    outs = outs[int(len(outs) * warmup_fraction) :]
    return {
        "ttft": quantile([o.ttft_ms for o in outs], q),
        "gap": quantile([o.worst_gap_ms for o in outs], q),
        "total": quantile([o.total_ms for o in outs], q),
    }


def true_capacity(
    model: EngineModel,
    limits: dict[str, float],
    lengths: Sequence[tuple[int, int]],
    *,
    q: float = 0.99,
    lo: float = 0.1,
    hi: float = 200.0,
    tolerance: float = 0.005,
    seed: int = 1,
) -> float:
    """The highest Poisson rate whose steady-state q-quantiles are all within ``limits`` (metric -> ms).

    Bisection on the rate with common random numbers (the same unit-rate arrival draws, scaled), so
    the quantiles are compared on the same sample path at every rate; ``tolerance`` is relative.
    """

    def ok(rate: float) -> bool:
        qs = true_quantiles(model, rate, lengths, q, seed=seed)
        return all(qs[k] <= v for k, v in limits.items())

    if not ok(lo):
        return 0.0
    if ok(hi):
        return hi
    while hi - lo > tolerance * lo:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
