"""The shapes of the diagnosis's answers: each question's evidence as it is built, and the finding it becomes.

``TypedDict`` throughout: the evidence is turned into plain JSON (``diagnosis.json``, the page's collapsible
evidence) by walking it, and a finding is rendered by ``templates/diagnosis.html.j2``, so both must stay plain
dicts with their keys in the order they are written. Numbers in the evidence may still be numpy scalars (a
subclass of ``float``) or NaN until :func:`tailgate.postprocess.diagnosis.diagnose` makes them JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypeAlias, TypedDict, cast

import numpy as np
import pandas as pd

from tailgate.jsontypes import JsonObject, JsonValue

from .bootstrap import DifferenceDict
from .pauses import PauseRow
from .timeline import Attribution


class NoInterval(TypedDict):
    """A p99 comparison with too few requests per cell for an interval: the two n and why."""

    n_a: int
    n_b: int
    ci: None
    why_no_ci: str


P99Comparison: TypeAlias = DifferenceDict | NoInterval


class Comparison(TypedDict):
    """Two cells' p99 differences (``b - a``); None where a side has no records."""

    a: str
    b: str
    gap_p99: P99Comparison | None
    ttft_p99: P99Comparison | None


class GatedVsContinuous(TypedDict):
    gated: str
    continuous: str
    ttft_p50: list[float]
    ttft_p99: list[float]
    gap_p99: list[float]
    ttft_p50_ratio: float | None
    ttft_p99_ratio: float | None
    gap_p99_ratio: float | None
    bootstrap: Comparison


AdmissionRamp = TypedDict(
    "AdmissionRamp",
    {
        "config": str,
        "from": str,
        "to": str,
        "ttft_p50_growth": float | None,
        "ttft_p99_growth": float | None,
        "gap_p99_growth": float | None,
        "ttft_from_intended_p99": list[float | None],
    },
)


class AdmissionEvidence(TypedDict):
    """Question 1."""

    gated_vs_continuous: list[GatedVsContinuous]
    ramp: list[AdmissionRamp]


PrefillRamp = TypedDict(
    "PrefillRamp",
    {
        "config": str,
        "from": str,
        "to": str,
        "gap_p50": list[float],
        "gap_p99": list[float],
        "ttft_p50": list[float],
        "gap_p50_growth": float | None,
        "gap_p99_growth": float | None,
        "ttft_p50_growth": float | None,
    },
)


class PrefillEvidence(TypedDict):
    """Question 2; ``server_pauses`` only where the server paused many streams at once."""

    ramp: list[PrefillRamp]
    attribution: Attribution | None
    server_pauses: NotRequired[list[PauseRow]]


class ChunkedAtRate(TypedDict):
    """One rate with chunked prefill on and off; ``chunked`` and ``nochunk`` are the two cells, keyed by the
    names of ``serverconfigs.CHUNKED_PAIR``."""

    rate: float
    chunked: str
    nochunk: str
    gap_p99: list[float]
    gap_p99_ratio: float | None
    ttft_p99: list[float]
    ttft_p99_ratio: float | None
    bootstrap: Comparison
    small: bool
    interval: bool | None


class ChunkedEvidence(TypedDict):
    """Question 3."""

    by_rate: list[ChunkedAtRate]


class CellPreemptions(TypedDict):
    """Question 4, one cell; the increment keys only where the counter rose."""

    cell: str
    prometheus: float | None
    direct: float | None
    source: str | None
    disagree: bool
    moved: bool | None
    increments_seen: NotRequired[int]
    requests_in_flight_during_increments: NotRequired[int]
    stall_threshold_ms: NotRequired[float | None]
    requests_stalled_during_increments: NotRequired[int]
    stalled_trace_ids: NotRequired[list[int]]
    stalled_worst_gap_ms: NotRequired[list[float]]
    requests_whose_worst_gap_spans_an_increment: NotRequired[int]
    spanning_trace_ids: NotRequired[list[int]]
    spanning_worst_gap_ms: NotRequired[list[float]]


class PreemptionEvidence(TypedDict):
    """Question 4."""

    cells: list[CellPreemptions]


RunMix = TypedDict("RunMix", {"mix": dict[str, int], "from": str, "seed": NotRequired[object]})
"""A run's prompt→max-token classes; ``seed`` is the trace's, as run.json wrote it."""


class MixEvidence(TypedDict):
    """Question 5; the combined classes only when some run had a mix."""

    runs: dict[str, RunMix]
    prompt_classes: NotRequired[list[int]]
    combined: NotRequired[dict[str, int]]


class PromptPair(TypedDict):
    """One cell measured with the seed's prompts and with another source."""

    config: str
    rate: float
    seed: str
    other: str
    other_prompts: str
    gap_p99: list[float]
    gap_p99_ratio: float | None
    ttft_p99: list[float]
    ttft_p99_ratio: float | None
    prefix_hit_rate: list[float | None]
    bootstrap: Comparison
    interval: bool | None


class ChunkedFlip(TypedDict):
    rate: float
    off_on_seed: float | None
    off_on_other: float | None


class PromptEvidence(TypedDict):
    """The prompt A/B question."""

    pairs: list[PromptPair]
    chunked_off_on: list[ChunkedFlip]


Evidence: TypeAlias = (
    AdmissionEvidence | PrefillEvidence | ChunkedEvidence | PreemptionEvidence | MixEvidence | PromptEvidence
)


@dataclass(frozen=True, slots=True)
class Answer:
    """One question answered over one table: its evidence, its one-line verdict, and the paragraph's sentences."""

    evidence: Evidence
    verdict: str
    lines: list[str]


class WithoutUnmeasured(TypedDict):
    """The answer with the cells that are not a measurement left out (None: no answer without them)."""

    cells: list[str]
    verdict: str | None


class Finding(TypedDict):
    """One question as ``diagnosis.json`` and the page carry it."""

    number: int
    question: str
    verdict: str
    evidence: JsonObject
    text: str
    caveat: str
    without_unmeasured: NotRequired[WithoutUnmeasured]


def evidence_json(evidence: Evidence) -> JsonObject:
    """The evidence as JSON: numpy scalars as numbers, floats to three decimals, NaN and missing as null."""
    return {str(k): _jsonable(v) for k, v in evidence.items()}


def _jsonable(x: object) -> JsonValue:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return round(v, 3) if math.isfinite(v) else None
    if isinstance(x, np.bool_):
        return bool(x)
    if x is pd.NA or x is pd.NaT:
        return None
    return cast("JsonValue", x)  # str, int, bool, None; anything else json.dumps's default= writes as text
