"""The seed's five-question checklist, answered from the data with the numbers behind each answer.

Each answer is a dict: ``number``, ``question``, ``verdict`` (one short line), ``evidence`` (the
numbers, JSON-ready) and ``text`` (a paragraph). Where two configurations are compared, the p99
difference carries a seeded 95% bootstrap interval, because a p99 of a few hundred requests
rests on a handful of them and a difference that the interval straddles is not a finding.

The answers are built in :mod:`.schedulinganswers` (questions 1-3) and :mod:`.workloadanswers` (4 and 5);
here they are asked in the seed's order, and each is told when it rests on a cell that is not a measurement.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tailgate.jsontypes import JsonMapping

from .bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED
from .cellstats import Cells
from .diagnosistypes import Answer, Finding, evidence_json
from .prompt_ab import PROMPT_AB_QUESTION, prompt_ab
from .schedulinganswers import admission_answer, chunked_answer, prefill_answer
from .table import choose_decision_rate, summary_table
from .tableview import IN_SHORT, NOT_A_MEASUREMENT, cell_marks, not_measured
from .workloadanswers import mix_answer, preemption_answer

QUESTIONS: tuple[str, ...] = (
    "Did TTFT explode while the gaps stayed flat? (admission: gated, or overloaded before the first token)",
    "Did the gaps explode while median TTFT looks fine? (prefill insertion)",
    "Does turning chunked prefill off widen the gap p99, and by how much?",
    "Did vllm:num_preemptions_total move, and which requests stalled across the increments?",
    "Is the trace mixed-length?",
)
LATENCY_QUESTIONS = frozenset({1, 2, 3, 6})
"""Answers built on cells' latencies: a cell marked not a measurement or partial weakens them (not 4's counter)."""


def diagnose(
    summaries: pd.DataFrame,
    records: pd.DataFrame,
    series: pd.DataFrame | None = None,
    *,
    preemptions: pd.DataFrame | None = None,
    run_meta: Mapping[str, JsonMapping] | None = None,
    decision_rate: float | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> list[Finding]:
    """Answer the five checklist questions; one dict per question, in the seed's order."""
    table = summary_table(summaries, preemptions)
    for col in ("window_start_s", "window_end_s"):
        table[col] = summaries[col].to_numpy() if col in summaries.columns else np.nan
    rate = choose_decision_rate(table, decision_rate)
    answers = _answers(table, Cells(table, records, summaries), rate, records, run_meta, series, resamples, seed)
    marked = {str(r["cell"]): cell_marks(r) for r in table.to_dict("records") if not_measured(r)}
    unmeasured = [c for c, marks in marked.items() if NOT_A_MEASUREMENT in marks]
    without: dict[str, Answer] | None = None  # the answers with those cells left out, when one needs them
    out = []
    for i, (q, p) in enumerate(answers.items(), 1):
        ev = evidence_json(p.evidence)
        said = json.dumps(ev)
        used = [c for c in marked if i in LATENCY_QUESTIONS and json.dumps(c) in said]
        named = [f"{c} is {m} ({IN_SHORT[m]})" for c in used for m in marked[c] if m in IN_SHORT]
        if i in (1, 3, 6):
            ev["bootstrap"] = {"resamples": resamples, "seed": seed, "level": 0.95, "percentile": 99}
        if i == 2 and rate is not None:
            ev["decision_rate"] = rate
        finding: Finding = {
            "number": i,
            "question": q,
            "verdict": p.verdict,
            "evidence": ev,
            "text": " ".join(p.lines),
            "caveat": f"Read with care: {'; '.join(named)}." if named else "",
        }
        rests_on = [c for c in used if c in unmeasured]
        if rests_on:
            if without is None:
                kept = table.loc[~table["cell"].astype(str).isin(unmeasured)].reset_index(drop=True)
                cells = Cells(kept, records, summaries)
                without = _answers(kept, cells, rate, records, run_meta, series, resamples, seed)
            alt = without.get(q)
            finding["without_unmeasured"] = {"cells": unmeasured, "verdict": alt.verdict if alt else None}
            finding["caveat"] += " " + _without_text(unmeasured, p.verdict, alt.verdict if alt else None)
        out.append(finding)
    return out


def _answers(
    table: pd.DataFrame,
    cells: Cells,
    rate: float | None,
    records: pd.DataFrame,
    run_meta: Mapping[str, JsonMapping] | None,
    series: pd.DataFrame | None,
    resamples: int,
    seed: int,
) -> dict[str, Answer]:
    """Each question's answer over ``table``, keyed by the question: run once over every cell, and again without
    the cells that are not a measurement, to say what an answer that used one would be without it."""
    parts = [
        admission_answer(table, cells, rate, resamples, seed),
        prefill_answer(table, cells, rate),
        chunked_answer(table, cells, resamples, seed),
        preemption_answer(table, cells, series),
        mix_answer(records, run_meta, cells),
    ]
    questions = list(QUESTIONS)
    ab = prompt_ab(table, cells, resamples, seed)
    if ab is not None:  # only when a run measured another prompt source on the same schedule
        questions.append(PROMPT_AB_QUESTION)
        parts.append(ab)
    return dict(zip(questions, parts, strict=True))


NO_ANSWER = ("unknown", "not measured", "not enough data")
"""Verdicts that say the data could not answer."""


def _without_text(cells: Sequence[str], verdict: str, alt: str | None) -> str:
    """What the answer is once the cells that are not a measurement are left out: a reader must not have to
    guess whether the answer stands on a cell the page itself says describes the load generator."""
    who = " and ".join(cells)
    if alt is None or alt.lower().startswith(NO_ANSWER):
        why = f" ({alt.split(':', 1)[1].strip()})" if alt and ":" in alt else ""
        return f"Without {who} there is no answer{why}."
    if alt == verdict:
        return f"Without {who} the answer is the same."
    return f"Without {who}: {alt}."
