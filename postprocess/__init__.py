"""The analysis path: results folder in, table, charts, diagnosis and HTML report out.

Library use works on pandas frames::

    from . import load_summaries, load_records, summary_table, diagnose, build_report

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

if __name__ != "tailgate.postprocess":  # a checkout with its root on sys.path would also offer "postprocess"
    raise ImportError(f"import tailgate.postprocess, not {__name__}: one file under two names would load twice")

_EXPORTS: dict[str, str] = {
    "ResultsError": "tailgate.postprocess.runfolders",
    "find_run_dirs": "tailgate.postprocess.runfolders",
    "load_summaries": "tailgate.postprocess.runfolders",
    "load_records": "tailgate.postprocess.runfolders",
    "load_server_metrics": "tailgate.postprocess.runfolders",
    "summaries_from_records": "tailgate.postprocess.summarize",
    "summary_table": "tailgate.postprocess.table",
    "table_markdown": "tailgate.postprocess.table",
    "choose_decision_rate": "tailgate.postprocess.table",
    "counter_increase": "tailgate.postprocess.prometheus",
    "collect_server_data": "tailgate.postprocess.prometheus",
    "diagnose": "tailgate.postprocess.diagnosis",
    "render_text": "tailgate.postprocess.diagnosisview",
    "render_html": "tailgate.postprocess.diagnosisview",
    "analyze": "tailgate.postprocess.report",
    "build_report": "tailgate.postprocess.report",
    "ReportPaths": "tailgate.postprocess.report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tailgate.postprocess' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
