"""The HTML report read in a real browser: a 1400-px laptop window and a 390-px phone (headless Chromium).

The report is built from the repository's fixtures (``tests/fixtures/results``, no vLLM), with three cells
given the marks a real run can leave: one whose streams the client merged (not a measurement), one stopped
mid-stage (partial), one served from the prefix cache. At both widths the page must not scroll sideways, no
table may be wider than its container, every header (or on a phone, every value's label) must be visible,
and each mark must be explained on the page where it appears.

``TAILGATE_REPORT_SCREENSHOT=dir`` keeps a screenshot per width.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browserkit import headless_chromium
from conftest import ROOT

from tailgate.postprocess.glossary import TERMS, anchor
from tailgate.postprocess.report import build_report
from tailgate.postprocess.tableview import MARK_EXPLANATIONS

FIXTURES = ROOT / "tests" / "fixtures" / "results"
WIDTHS = (1400, 390)


def _edit_summary(path: Path, **changes: Any) -> None:
    summary = json.loads(path.read_text())
    summary.update(changes)
    path.write_text(json.dumps(summary))


def marked_results(dest: Path) -> Path:
    """The fixtures, with one cell of each mark."""
    shutil.copytree(FIXTURES, dest)
    _edit_summary(dest / "chunked-cont" / "summary-cont_r2.json", client_coalesced_streams=3)
    for records in (dest / "chunked-cont").glob("records-*.jsonl"):
        lines = [json.loads(x) for x in records.read_text().splitlines() if x.strip()]
        for rec in lines[:6]:
            if rec["stage"] == 0:
                rec["client_coalesced"] = True
        records.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _edit_summary(dest / "nochunk-cont" / "summary-cont_r8.json", partial=True)
    _edit_summary(dest / "nochunk-cont" / "summary-cont_r2.json", prefix_cache_hit_rate=0.62)
    return dest


@pytest.fixture(scope="module")
def report() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="tailgate-report-browser-"))
    try:
        yield build_report(marked_results(tmp / "results"), tmp / "report").html
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium("--hide-scrollbars") as driver:
        yield driver


def _open(browser: Any, html: Path, width: int) -> None:
    # the window's outer size; the test checks the layout against the viewport the page really got
    browser.set_window_size(width, 1000)
    browser.get(html.as_uri())
    browser.execute_script("document.querySelectorAll('details').forEach(d => d.open = true)")


OVERFLOW = """
const view = document.documentElement.clientWidth;
const out = [];
if (document.documentElement.scrollWidth > view + 1) out.push(['page', document.documentElement.scrollWidth, view]);
for (const t of document.querySelectorAll('table')) {
  const box = t.parentElement.getBoundingClientRect(), r = t.getBoundingClientRect();
  if (t.scrollWidth > t.parentElement.clientWidth + 1 || r.right > box.right + 1 || r.right > view + 1)
    out.push(['table', t.closest('section').id, Math.round(r.right), Math.round(box.right)]);
}
return out;
"""

HEADERS = """
const view = document.documentElement.clientWidth;
const shown = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
const table = document.querySelector('#table table.cells');
const heads = Array.from(table.querySelectorAll('thead th')).filter(shown);
if (heads.length) return heads.map(th => {
  const r = th.getBoundingClientRect();
  return [th.textContent.trim(), r.left >= 0 && r.right <= view + 1 && th.scrollWidth <= th.clientWidth + 1];
});
// a phone shows each value beside its label instead of a header row
return Array.from(table.querySelectorAll('tbody tr:first-child td')).map(td => {
  const label = getComputedStyle(td, '::before').content.replace(/^"|"$/g, '');
  const r = td.getBoundingClientRect();
  return [label || td.textContent.trim(), r.left >= 0 && r.right <= view + 1 && td.scrollWidth <= td.clientWidth + 1];
});
"""


@pytest.mark.parametrize("width", WIDTHS)
def test_report_fits_the_window_and_explains_its_marks(browser: Any, report: Path, width: int) -> None:
    _open(browser, report, width)
    assert browser.execute_script(OVERFLOW) == []
    heads = browser.execute_script(HEADERS)
    assert len(heads) >= 8
    assert [h for h, fits in heads if not fits] == [], heads
    labels = " ".join(h for h, _ in heads)
    assert "p99" in labels and "prefix_hit_rate" not in labels and "rate_or_batch" not in labels
    text = browser.execute_script("return document.body.innerText")
    for mark, explanation in MARK_EXPLANATIONS.items():
        assert mark in text
        assert explanation[:60] in " ".join(text.split()), mark
    # one name per cell: the folder's, in the table, the notes and the diagnosis
    cells = browser.execute_script(
        "return Array.from(document.querySelectorAll('#table table.cells tbody tr td:first-child'))"
        ".map(td => td.firstChild.textContent.trim())"
    )
    assert "nochunk_cont_r2" in cells and "chunked_gated_b4" in cells and "nochunk_r2" not in text
    assert "chunked_cont_r2: not a measurement" in text
    assert "Read with care: chunked_cont_r2 is not a measurement (its worst gaps describe the load generator" in text
    # an answer that rests on that cell says what it would be without it
    assert "Without chunked_cont_r2: yes by the point values only" in text
    assert "Without chunked_cont_r2 the answer is the same." in text
    # the columns left out are named with their reason
    flat = " ".join(text.split())
    left_out = flat[flat.index("Not shown, no data:") :][:1500]
    assert "preemptions (Prometheus): no Prometheus" in left_out
    assert "absent: no inter-token latency histogram was read per cell" in left_out
    shots = os.environ.get("TAILGATE_REPORT_SCREENSHOT")
    if shots:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(width, min(height + 200, 16000))
        Path(shots).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(shots) / f"report-{width}.png"))


def test_descriptive_answer_is_neutral_and_findings_are_marked(browser: Any, report: Path) -> None:
    _open(browser, report, 1400)
    verdicts = browser.execute_script(
        "return Array.from(document.querySelectorAll('#diagnosis .verdict'))"
        ".map(v => [v.className, v.textContent.trim(), getComputedStyle(v.querySelector('strong')).color])"
    )
    assert len(verdicts) >= 5
    q5_class, q5_text, _ = verdicts[4]
    assert "describes the trace" in q5_text and q5_class.split() == ["verdict"]
    colours = {c for _, _, c in verdicts}
    assert colours == {verdicts[0][2]}  # no red "yes", no green "no": the box, not the words, carries the tone
    for cls, text, _ in verdicts[:4]:
        found = text.lower().startswith(("yes", "partly"))
        assert ("found" in cls.split()) == found, (cls, text)
    # a caveat where an answer uses a marked cell's latencies (question 3 compares chunked_cont_r2), none where
    # it reads only the server's counter (question 4 lists every cell)
    caveats = browser.execute_script(
        "return Array.from(document.querySelectorAll('#diagnosis ol.diagnosis > li'))"
        ".map(li => !!li.querySelector('.caveat'))"
    )
    assert caveats[2] is True and caveats[3] is False


def test_every_term_is_defined_once_and_its_first_use_links_there(browser: Any, report: Path) -> None:
    _open(browser, report, 1400)
    terms = browser.execute_script(
        "return Array.from(document.querySelectorAll('#terms dl.glossary dt')).map(dt => [dt.id, dt.textContent])"
    )
    assert [t for t, _ in terms] == [anchor(t.key) for t in TERMS]
    # each term's first link on the page comes before its definition, carries the definition as a tooltip, and
    # every term but none is linked from somewhere above
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('a.term')).map(a => [a.getAttribute('href'), a.title,"
        " a.textContent, !!a.closest('#terms')])"
    )
    first: dict[str, tuple[str, str]] = {}
    for href, tip, label, inside in links:
        assert not inside
        first.setdefault(href.removeprefix("#"), (tip, label))
    assert set(first) == {anchor(t.key) for t in TERMS}
    for term in TERMS:
        tip, _ = first[anchor(term.key)]
        assert tip == f"{term.name}: {term.text}"
    meta = browser.execute_script("return document.querySelector('p.meta a.term').textContent")
    assert meta == "decision rate"
    heads = browser.execute_script(
        "return Array.from(document.querySelectorAll('#table table.cells thead a.term')).map(a => a.textContent)"
    )
    assert "p99 from intended send" in heads and "server-wide pauses" in heads
    # the rule behind "no interval" is said once, above the answers, and each "no interval" links to it (the
    # evidence, raw JSON under each answer, keeps its own reason per comparison)
    paragraphs = browser.execute_script(
        "return Array.from(document.querySelectorAll('#diagnosis p')).map(p => p.textContent).join(' ')"
    )
    assert paragraphs.count("needs at least 437 requests in each cell") == 1
    assert "a p99 interval needs at least" not in paragraphs and paragraphs.count("no interval: n = ") >= 4
    said = browser.execute_script(
        "return Array.from(document.querySelectorAll('#diagnosis ol.diagnosis a')).map(a => a.getAttribute('href'))"
    )
    assert len(said) >= 4 and set(said) == {"#no-interval"}
    note = browser.execute_script("return document.querySelector('#no-interval').closest('section').id")
    assert note == "diagnosis"
