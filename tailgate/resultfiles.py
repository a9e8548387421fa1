"""The names of the files a run leaves behind, in one place.

The load path writes them, the suite and the SLO search read them back to resume and to judge, the
analysis and the web UI tab read them again: if two of those spelled a name differently, a results
folder would look empty to one of them without any error. Every product module takes the names from
here; ``tests/test_contracts.py`` fails when a literal reappears elsewhere.
"""

from __future__ import annotations

from pathlib import Path

RUN_META = "run.json"
"""One run (one Locust process tree, one or more stages): what ran, against which server, how it ended."""
SUITE_META = "suite.json"
"""A suite's plan, its servers as described after each restart, and its cells."""
SLO_META = "slo.json"
"""An SLO search's plan and every probe of every configuration."""
SLO_ANALYSIS = "slo-analysis.json"
"""The SLO section's figures, written beside its report."""

RECORDS_PREFIX = "records-"
RECORDS_SUFFIX = ".jsonl"
RECORDS_GLOB = f"{RECORDS_PREFIX}*{RECORDS_SUFFIX}"
RECORDS_SUBDIR = "records"
"""Older layouts kept the record files one folder down."""
SENT_GLOB = "sent-*.log"
SUMMARY_GLOB = "summary-*.json"
SERVER_METRICS = "server-metrics.jsonl"
"""Direct ``/metrics`` samples at about 1 Hz, the fallback when no Prometheus scraped the server."""

REPORT_DIR = "report"
REPORT_HTML = "report.html"
REPORT_LOG = "report.log"
DIAGNOSIS = "diagnosis.json"
TABLE_MD = "table.md"
TABLE_CSV = "table.csv"


def records_file(worker: str) -> str:
    """One load process's records (the master writes one per worker in a distributed run)."""
    return f"{RECORDS_PREFIX}{worker}{RECORDS_SUFFIX}"


def sent_file(worker: str) -> str:
    """One load process's send journal: a line before each send, so a crash's losses can be counted."""
    return f"sent-{worker}.log"


def summary_file(stage_label: str) -> str:
    return f"summary-{stage_label}.json"


def record_files(directory: str | Path) -> list[Path]:
    """Every record file of a results folder, the older one-folder-down layout included."""
    d = Path(directory)
    paths = sorted(d.glob(RECORDS_GLOB))
    sub = d / RECORDS_SUBDIR
    if sub.is_dir():
        paths += sorted(sub.glob(RECORDS_GLOB))
    return paths


def report_html(folder: str | Path) -> Path:
    return Path(folder) / REPORT_DIR / REPORT_HTML


WRITE_PROBE = ".probe"
"""A file written and removed at once to learn, before anything runs, that a results folder takes writes."""


def writable_folder_problem(root: Path) -> str | None:
    """Create ``root`` if needed and say why it cannot hold results, or None when it can.

    Every command that writes a results folder checks it before it starts a server: a folder found
    unwritable after twenty minutes of measuring loses them.
    """
    if root.exists() and not root.is_dir():
        return f"--results: {root} exists and is not a folder"
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / WRITE_PROBE).write_text("")
        (root / WRITE_PROBE).unlink()
    except OSError as e:
        return f"--results: {root} is not writable ({e.strerror or e})"
    return None
