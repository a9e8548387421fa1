"""The analysis path: results folder in, table, charts, diagnosis and HTML report out.

Library use works on pandas frames::

    from postprocess import load_summaries, load_records, summary_table, diagnose, build_report

    summaries = load_summaries("results/h200")
    records = load_records("results/h200")
    print(summary_table(summaries))
    paths = build_report("results/h200", prometheus_url="http://127.0.0.1:9090")

Names resolve on first use, so ``tailgate report --help`` does not pay for importing pandas and
matplotlib. Nothing here imports gevent or Locust.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS: dict[str, str] = {
    "ResultsError": "postprocess.load",
    "find_run_dirs": "postprocess.load",
    "load_summaries": "postprocess.load",
    "load_records": "postprocess.load",
    "load_server_metrics": "postprocess.load",
    "summaries_from_records": "postprocess.summarize",
    "summary_table": "postprocess.table",
    "table_markdown": "postprocess.table",
    "choose_decision_rate": "postprocess.table",
    "counter_increase": "postprocess.prometheus",
    "collect_server_data": "postprocess.prometheus",
    "diagnose": "postprocess.diagnosis",
    "render_text": "postprocess.diagnosis",
    "render_html": "postprocess.diagnosis",
    "analyze": "postprocess.report",
    "build_report": "postprocess.report",
    "ReportPaths": "postprocess.report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'postprocess' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
