"""The report's terms, each defined once: a "Terms" section at the foot of the page, and a link with a tooltip
where a term first appears.

The page uses words a reader who did not write the suite cannot guess ("decision rate", "p99 from the intended
send", "server-wide pauses"). One definition per term, here, keeps the table's headers, the phone view's long
column labels, the diagnosis's evidence, the meta line and the glossary saying the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cellstats import MIN_N_P99_CI
from .pauses import ALIGN_MS, MIN_SHARE, MIN_STREAMS, PAUSE_FLOOR_MS


@dataclass(frozen=True)
class Term:
    key: str
    """The anchor's suffix: the definition is ``#term-<key>``."""
    name: str
    text: str


TERMS: tuple[Term, ...] = (
    Term(
        "decision-rate",
        "decision rate",
        "the arrival rate at which chart 2, chart 3 and the diagnosis compare configurations: the highest rate "
        "measured with chunked prefill both on and off, else 10 req/s when measured, else the highest continuous "
        "rate (tailgate report --decision-rate chooses another).",
    ),
    Term(
        "percentile",
        "p50, p99",
        "the median and the 99th percentile of a cell's measured requests (warm-up excluded), interpolated "
        "linearly between closest ranks as the reference harness does. Under 100 requests the p99 lies between "
        "the two slowest of them.",
    ),
    Term(
        "ttft",
        "time to first token (TTFT)",
        "from the moment the request was sent to its first streamed token.",
    ),
    Term(
        "from-intended",
        "p99 from the intended send",
        "TTFT measured from the moment the schedule meant the request to go out rather than from when it went, so "
        "the load generator's own lateness (schedule lag) is included: a generator that fell behind cannot hide a "
        "queue by sending late. Close to the plain p99 when the lag is small.",
    ),
    Term(
        "worst-gap",
        "worst gap",
        "the longest pause between two chunks inside one stream: the longest stall its reader saw mid-answer.",
    ),
    Term(
        "server-pauses",
        "server-wide pauses",
        f"moments when the engine held every decoding stream at once: the worst gaps (each at least "
        f"{PAUSE_FLOOR_MS:g} ms) of {MIN_STREAMS} or more streams, or of two and at least {MIN_SHARE:.0%} of those "
        f"streaming, ending within {ALIGN_MS:g} ms of one another. Events: how many, per cell, warm-up included; "
        "largest: the longest, as the shortest of its streams' gaps; slow server gaps: the engine's own count of "
        "inter-token gaps over 0.25 s (0.3 s on vLLM) from its latency histogram. Only each stream's worst gap is "
        "recorded, so the counts are lower bounds (postprocess/pauses.py).",
    ),
    Term(
        "preemptions",
        "preemptions",
        "the increase of vllm:num_preemptions_total over the stage window, from Prometheus and from the load "
        "generator's direct /metrics reads.",
    ),
    Term(
        "schedule-lag",
        "lag p99",
        "how late the load generator sent its requests against its schedule, 99th percentile.",
    ),
    Term(
        "merged-by-client",
        "merged by client",
        "streams in which the load generator read late and received in one read chunks the server had sent apart; "
        "any makes the cell not a measurement.",
    ),
)
BY_KEY: dict[str, Term] = {t.key: t for t in TERMS}

NO_INTERVAL = "no interval"
"""How an answer marks a p99 comparison whose cells are too small for an interval (cellstats.ci_text)."""
NO_INTERVAL_ID = "no-interval"
NO_INTERVAL_NOTE = (
    f"No interval: a 95% interval of a p99 difference, without assuming a distribution, needs at least "
    f"{MIN_N_P99_CI} requests in each cell. Where an answer below says “no interval” beside a comparison (with "
    "the two cells' n), its cells have fewer, and it gives the point values only."
)
"""Said once above the answers, not beside each comparison: at the embedded suite's n = 40 it applied to every
comparison, eight times on one page."""


def anchor(key: str) -> str:
    """The id of a term's definition on the page."""
    return f"term-{BY_KEY[key].key}"


def title(key: str) -> str:
    """The definition as a tooltip: a reader hovering over a header need not scroll to the foot of the page."""
    term = BY_KEY[key]
    return f"{term.name}: {term.text}"


def glossary_context() -> list[dict[str, str]]:
    """Every term, for the page's "Terms" section and the links to it."""
    return [{"key": t.key, "id": anchor(t.key), "name": t.name, "text": t.text, "title": title(t.key)} for t in TERMS]
