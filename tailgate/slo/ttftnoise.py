"""How much a lone request's TTFT varies on a server, read from the requests that found no queue, for the fitted
engine to replay.

A step loop's fitted costs give a prompt one TTFT on a quiet server. A real server does not: on the development
machine's CPU vLLM a 6,000-token prompt that found nothing ahead of it was answered in 181 ms one time and 380 the
next, while the streams running beside it stalled ~150 ms each time (the spread is in what no step pays: the
front end, the first token's way out). At 2 req/s the TTFT's p99 is the top of that spread, not any queue; a
model without it replays that p99 at its median (145-212 ms against 328 measured) and is refused for it.

The spread is measured where nothing else is in it: requests that found no request ahead of them still waiting
for its first token (:func:`idle_streams`; not only those whose first token came before the next arrival, which
would keep the fast and leave out the slow), each replayed on its attempt's own arrivals, which holds the wait for
the step in flight, a prefill shared with a later arrival and the fitted front end as the engine has them. What
the measured TTFT adds to the replayed one is a delay of that request's prompt length; the engine draws one per
request from those measured at the nearest length (:attr:`EngineModel.frontend_noise`), on top of its front end,
stalling no one. Whether the engine keeps it is the replay's to say (:func:`tailgate.slo.servicefit.fit_service`,
which pools a few draws per probe: a p99 of 200 requests lies on two of them), as for every other fitted term.
A front end whose hold grows with the load (one that serves requests one at a time) is not of this kind: its lone
requests show the hold without the queue, and the replay at load refuses the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from tailgate.slo.stepfit import Stream, idle_streams
from tailgate.verify.groundtruth.engine import EngineModel, Outcome, simulate

NOISE_ROWS = 400
"""Lone requests wanted, taken from the lowest rates first (their requests are the likeliest to find no queue)."""
LENGTH_MIN_ROWS = 8
"""A prompt length needs this many lone requests for its delays to be kept (others draw from the nearest)."""
MIN_SPREAD = 0.1
"""Delays whose 10-90% range is under this share of the lengths' replayed TTFT at every length are no spread: a
client's read jitter, which the fit already answers."""


class Rated(Protocol):
    """A probe as the noise reads it: its rate and each attempt's streams."""

    rate: float
    attempts: list[list[Stream]]


def replay_every(engine: EngineModel, streams: Sequence[Stream]) -> dict[int, Outcome]:
    """What the engine gives every stream of an attempt sent at its times, by the stream's index."""
    if not streams:
        return {}
    t0 = min(s.intended for s in streams)
    order = sorted(range(len(streams)), key=lambda i: streams[i].intended)
    arrivals = [
        (round((streams[i].intended - t0) * 1e9) + k, streams[i].prompt, streams[i].tokens) for k, i in enumerate(order)
    ]  # fmt: skip  (+k: distinct times keep the order)
    by_arrival = {o.arrival_ns: o for o in simulate(engine, arrivals)}
    return {i: by_arrival[a[0]] for a, i in zip(arrivals, order, strict=True)}


def lone_delays(engine: EngineModel, probes: Sequence[Rated]) -> tuple[tuple[int, float], ...]:
    """(prompt tokens, ms) of every lone request: its measured TTFT less the engine's replay of it. Empty where no
    prompt length has :data:`LENGTH_MIN_ROWS` of them, or where they spread less than :data:`MIN_SPREAD`."""
    quiet = replace(engine, frontend_noise=())
    rows: dict[int, list[tuple[float, float]]] = {}  # prompt -> (measured - replayed, replayed)
    taken = 0
    for probe in sorted(probes, key=lambda p: p.rate):
        for streams in probe.attempts:
            if taken >= NOISE_ROWS:
                break
            lone = [s for s, _ in idle_streams(streams, alone=False) if s.measured]
            if not lone:
                continue
            index = {id(s): i for i, s in enumerate(streams)}
            replayed = replay_every(quiet, streams)
            for s in lone:
                ttft = replayed[index[id(s)]].ttft_ms
                rows.setdefault(s.prompt, []).append((s.ttft_ms - ttft, ttft))
                taken += 1
    kept = {p: v for p, v in rows.items() if len(v) >= LENGTH_MIN_ROWS}
    if not kept or not any(_spread(v) >= MIN_SPREAD for v in kept.values()):
        return ()
    return tuple((p, round(d, 3)) for p in sorted(kept) for d, _ in sorted(kept[p]))


def _spread(rows: Sequence[tuple[float, float]]) -> float:
    delays = sorted(d for d, _ in rows)
    replayed = sorted(t for _, t in rows)
    n = len(delays)
    return (delays[min(n - 1, (9 * n) // 10)] - delays[n // 10]) / max(replayed[n // 2], 1.0)


__all__ = ["lone_delays", "replay_every"]
