"""The diagnosis as a reader meets it: plain text for terminals and logs, and the report's HTML fragment (each
answer's tone, its paragraph with the one note on missing intervals linked, its evidence as JSON). The answers
themselves come from :mod:`tailgate.postprocess.diagnosis`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypedDict

from markupsafe import Markup, escape

from .diagnosistypes import Finding
from .glossary import NO_INTERVAL, NO_INTERVAL_ID, NO_INTERVAL_NOTE


def interval_note(findings: Sequence[Finding]) -> str:
    """Why some comparisons have no interval, said once for all the answers ("" when every one has one)."""
    said = " ".join(str(f.get("text", "")) for f in findings)
    return NO_INTERVAL_NOTE if f"{NO_INTERVAL}: n = " in said else ""


def render_text(findings: Sequence[Finding]) -> str:
    """Plain text, one block per question, for terminals and logs."""
    note = interval_note(findings)
    blocks = [note] if note else []
    for f in findings:
        caveat = f"\n   {f['caveat']}" if f.get("caveat") else ""
        blocks.append(f"{f['number']}. {f['question']}\n   → {f['verdict']}\n   {f['text']}{caveat}".rstrip())
    return "\n\n".join(blocks) + "\n"


def _linked_text(text: str) -> Markup:
    """The answer's paragraph, escaped, with each "no interval" linking to the one note that explains it."""
    link = Markup('<a href="#{}">{}</a>').format(NO_INTERVAL_ID, NO_INTERVAL)
    return link.join(escape(part) for part in text.split(NO_INTERVAL))


class FindingView(TypedDict):
    """One answer as ``templates/diagnosis.html.j2`` shows it."""

    question: str
    verdict: str
    tone: str
    kind: str
    text: Markup
    caveat: str
    evidence: str


def findings_context(findings: Sequence[Finding]) -> list[FindingView]:
    """Each finding's texts and its evidence as indented JSON, for ``templates/diagnosis.html.j2``."""
    return [
        {
            "question": str(f["question"]),
            "verdict": str(f["verdict"]),
            "tone": tone(f),
            "kind": "describes the trace" if f.get("number") == DESCRIPTIVE else "",
            "text": _linked_text(str(f["text"])),
            "caveat": str(f.get("caveat") or ""),
            "evidence": json.dumps(f["evidence"], indent=1),
        }
        for f in findings
    ]


DESCRIPTIVE = 5
"""Question 5 describes the trace: its answer is neither good nor bad news, so the page shows it neutral."""


def tone(finding: Finding) -> str:
    """``found`` when a mechanism that moves the tail was found (drawn amber: look here), ``unknown`` when the
    data could not answer, else neutral: "no" is not good news to paint green, and a description is neither."""
    head = str(finding["verdict"]).split(":", 1)[0].strip().lower()
    if head.startswith(("unknown", "not measured")):
        return "unknown"
    if finding.get("number") != DESCRIPTIVE and head.startswith(("yes", "partly")):
        return "found"
    return ""


def render_html(findings: Sequence[Finding]) -> str:
    """An HTML fragment: question, verdict, explanation, and the evidence as collapsible JSON."""
    from .html import render

    html: str = render("diagnosis.html.j2", findings=findings_context(findings), interval_note=interval_note(findings),
                       interval_id=NO_INTERVAL_ID)  # fmt: skip
    return html
