"""What a run writes about itself outside the records: ``run.json``'s opening metadata, a stage's
accounting of where every planned arrival went, and the whole-file JSON replace both are written with.

Plain functions of the settings and the files, kept apart from the coordinator's greenlets and messages.
"""

from __future__ import annotations

from locust import __version__ as locust_version

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path

import tailgate
from tailgate.jsontypes import JsonObject, JsonValue
from tailgate.load.options import Settings
from tailgate.load.plan import Stage
from tailgate.load.sidecars import server_info
from tailgate.load.workload import mix_of
from tailgate.records import WORKER_LOST, RequestRecord, StageAccounting, account_stage, read_sent
from tailgate.runmeta import RunStatus, utc_stamp


def write_json(path: Path, obj: JsonValue) -> None:
    """Whole-file replace, so a reader (the live tab, a report) never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def stage_accounting(folder: Path, stage: Stage, records: Sequence[RequestRecord]) -> StageAccounting:
    """A stage's accounting (:func:`tailgate.records.account_stage`) from its journal and its records."""
    return account_stage(
        stage.size, [trace for index, trace in read_sent(folder) if index == stage.index],
        [r.trace_id for r in records if r.stage == stage.index],
        worker_lost=sum(1 for r in records if r.error_class == WORKER_LOST),
    )  # fmt: skip


def run_metadata(
    settings: Settings, run_id: str, started: float, stages: Sequence[Stage], load_processes: int
) -> JsonObject:
    """``run.json`` as a run starts: what was asked, of which server, from which versions (its end is added later)."""
    s = settings
    measured = s.trace[s.warmup :]
    return {
        "run_id": run_id, "arm": s.arm, "config": s.config_label, "host": s.host, "model": s.model,
        "prometheus_url": s.prometheus_url, "metrics_url": s.metrics_url, "started": utc_stamp(started),
        "ended": None, "status": RunStatus.RUNNING.text(), "stop_reason": None,
        "trace": {"seed": s.seed, "warmup": s.warmup, "n": s.n, "source": s.trace_source,
                  "mix": mix_of(measured), "mix_with_warmup": mix_of(s.trace)},
        "stages_planned": [x.label for x in stages], "ignore_eos": s.ignore_eos,
        "options": s.public(), "load_processes": load_processes, "workload": s.workload(),
        "versions": {"tailgate": tailgate.__version__, "locust": locust_version,
                     "python": platform.python_version()},
        "load_host": platform.node(), "pid": os.getpid(),
        "server": server_info(s),
    }  # fmt: skip
