"""The shape owns the admission policy: which requests go out when, stage by stage.

Locust calls ``tick()`` about once a second and only understands user counts, so the shape
asks for exactly one :class:`~tailgate.load.worker.StreamingUser` per load-generator process and
drives the experiment from a coordinator greenlet instead: it sends each process its share of
the schedule, waits until every request of a group has ended, reads the preemption counter
around each stage, and writes the stage summary. ``tick()`` returns ``None`` when the last stage
is summarized, which ends a headless run.
"""

from __future__ import annotations

import gevent
from gevent.event import Event
from locust import LoadTestShape
from locust import __version__ as locust_version
from locust.runners import MasterRunner

import json
import logging
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import tailgate
from tailgate.load.metrics import scrape
from tailgate.load.options import OptionError, Settings
from tailgate.load.plan import Stage, share
from tailgate.load.worker import ORDER_MESSAGE, order_runner
from tailgate.load.workload import mix_of
from tailgate.stats import summarize_stage

log = logging.getLogger("tailgate")

START_LEAD_S = 0.25
"""Orders carry an absolute start time this far ahead, so every process has it before t0."""


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class SuiteShape(LoadTestShape):
    """Base for the two admission arms; subclasses only name their arm."""

    arm: ClassVar[str] = ""
    abstract = True

    def __init__(self) -> None:
        super().__init__()
        self.settings: Settings | None = None
        self.finished = False
        self.failed: str | None = None
        self._coordinator: gevent.Greenlet | None = None
        self._ready: dict[str, str] = {}
        self._ready_event = Event()
        self._done: dict[str, dict[str, Any]] = {}
        self._done_event = Event()
        self._waiting_for: set[str] = set()
        self._counts: dict[str, tuple[int, int]] = {}
        """Load process -> (requests sent, ended) as it last reported them (distributed runs)."""
        self.summaries: list[dict[str, Any]] = []

    # -- Locust hooks ---------------------------------------------------------------------
    def workers_expected(self) -> int:
        runner = self.runner
        if isinstance(runner, MasterRunner):
            return max(1, runner.worker_count)
        return 1

    def tick(self) -> tuple[int, float] | None:
        if self.finished:
            return None
        if self._coordinator is None:
            self._coordinator = gevent.spawn(self._run_guarded)
        users = self.workers_expected()
        return users, float(users)

    def on_ready(self, environment: Any, msg: Any, **_: Any) -> None:
        self._ready[msg.node_id] = msg.data.get("worker", msg.node_id)
        self._ready_event.set()

    def on_progress(self, environment: Any, msg: Any, **_: Any) -> None:
        self._counts[msg.node_id] = (int(msg.data["sent"]), int(msg.data["ended"]))

    def _sent_ended(self) -> tuple[int, int]:
        """Requests sent and ended so far by every load process, from their in-memory counters.

        One process: read straight from its runner. Several: the sum of what each last reported (they
        report every few seconds). Never the record files: re-reading them grew with the run and held
        the loop that timestamps the streams.
        """
        if isinstance(self.runner, MasterRunner):
            return sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values())
        local = order_runner(self.runner.environment)
        return local.sent, local.ended

    def on_done(self, environment: Any, msg: Any, **_: Any) -> None:
        self._done[msg.node_id] = msg.data
        if "sent" in msg.data:  # exact counters at the end of each order, so a stage's baseline is never stale
            self._counts[msg.node_id] = (int(msg.data["sent"]), int(msg.data["ended"]))
        if self._waiting_for <= set(self._done):
            self._done_event.set()

    # -- the experiment -------------------------------------------------------------------
    def configure(self, settings: Settings) -> None:
        self.settings = settings

    def _run_guarded(self) -> None:
        try:
            self._run()
        except Exception as e:  # surface a clear line, then let the run end
            self.failed = f"{type(e).__name__}: {e}"
            log.exception("tailgate run failed")
        finally:
            self.finished = True

    def _wait_ready(self) -> list[str]:
        expected = self.workers_expected()
        while len(self._ready) < expected:
            self._ready_event.clear()
            self._ready_event.wait(timeout=1.0)
        return sorted(self._ready)

    def _run(self) -> None:
        s = self.settings
        assert s is not None, "settings are configured at init"
        out = s.results_dir
        out.mkdir(parents=True, exist_ok=True)
        run_id = uuid.uuid4().hex[:12]
        started = time.time()
        stages = s.stages()
        meta = self._metadata(run_id, started, stages)
        self._write_json(out / "run.json", meta)
        sampler = self._start_sampler()
        nodes = self._wait_ready()
        log.info("tailgate: %d load process(es) ready; %d stage(s); results in %s", len(nodes), len(stages), out)
        status = "completed"
        try:
            for stage in stages:
                summary = self._run_stage(run_id, stage, nodes)
                self.summaries.append(summary)
                log.info("tailgate: %s", _summary_line(summary))
                if s.stop_on_errors and summary["errors"] >= s.stop_on_errors:
                    status = f"stopped after {stage.label}: {summary['errors']} errors"
                    log.error("tailgate: %s (--stop-on-errors %d)", status, s.stop_on_errors)
                    break
                if stage is not stages[-1] and s.settle:
                    gevent.sleep(s.settle)
        except BaseException:
            status = "interrupted"
            raise
        finally:
            if sampler is not None:
                sampler.terminate()
                try:
                    sampler.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    sampler.kill()
            done = [x["stage_label"] for x in self.summaries]
            meta.update({"ended": iso(time.time()), "status": status, "stages": done})
            self._write_json(out / "run.json", meta)

    def _run_stage(self, run_id: str, stage: Stage, nodes: list[str]) -> dict[str, Any]:
        s = self.settings
        assert s is not None
        before = scrape(s.metrics_url) if s.metrics_url else None
        stage_start = time.time()
        records: list[dict[str, Any]] = []
        dropped = 0
        total = stage.size
        baseline = self._sent_ended()
        for group in stage.groups:
            t0 = time.time() + (START_LEAD_S if len(nodes) > 1 or group is stage.groups[0] else 0.0)
            self._done = {}
            self._done_event.clear()
            self._waiting_for = set(nodes)
            for index, node in enumerate(nodes):
                mine = share(group, index, len(nodes))
                order = {
                    "order_id": f"{stage.index}:{mine[0].batch if mine else 0}:{index}",
                    "run_id": run_id, "stage": stage.index, "stage_label": stage.label, "arm": stage.arm,
                    "rate_or_batch": stage.rate_or_batch, "t0_wall": t0,
                    "max_in_flight": s.max_in_flight if stage.arm == "continuous" else 0,
                    "items": [[a.item.id, a.item.prompt_tokens, a.item.max_tokens, a.offset_s, a.batch] for a in mine],
                    "config": self._order_config(),
                }  # fmt: skip
                self.runner.send_message(ORDER_MESSAGE, order, client_id=None if node == "local" else node)
            while not self._done_event.wait(timeout=5.0):
                self._progress(stage, baseline, stage_start)
            for result in self._done.values():
                records.extend(result["records"])
                dropped += result.get("dropped", 0)
        stage_end = max([r["end_s"] for r in records] or [time.time()])
        after = scrape(s.metrics_url) if s.metrics_url else None
        pre = None if before is None else before.preemptions_total
        post = None if after is None else after.preemptions_total
        delta = (post - pre) if pre is not None and post is not None else None
        summary = summarize_stage(
            records, arm=stage.arm, rate_or_batch=stage.rate_or_batch, started=iso(stage_start),
            warmup=stage.warmup, warmup_rule=s.warmup_rule, preemptions_delta=delta,
        )  # fmt: skip
        summary.update(
            {
                "stage": stage.index, "stage_label": stage.label, "config": s.config_label, "run_id": run_id,
                "window_start_s": min([r["sent_s"] for r in records] or [stage_start]),
                "window_end_s": stage_end, "planned": total, "dropped_arrivals": dropped,
                "preemptions_before": pre, "preemptions_after": post,
                "preemptions_before_t": None if before is None else before.t,
                "preemptions_after_t": None if after is None else after.t,
                "preemptions_source": "direct_scrape" if delta is not None else None,
                "preemption_counter_reset": bool(delta is not None and delta < 0),
                "metrics_url": s.metrics_url, "target_rate": stage.rate_or_batch if stage.arm == "continuous" else None,
            }
        )  # fmt: skip
        if delta is not None and delta < 0:
            # the counter went backwards: the server restarted mid-stage; a negative delta is meaningless
            summary["preemptions_delta"] = None
            log.warning("tailgate: %s: preemption counter fell %s -> %s (server restarted?)", stage.label, pre, post)
        self._write_json(s.results_dir / f"summary-{stage.label}.json", summary)
        return summary

    def _progress(self, stage: Stage, baseline: tuple[int, int], started: float) -> None:
        """Requests sent and ended so far in this stage, counted in memory by the load processes."""
        sent_now, ended_now = self._sent_ended()
        sent, ended = sent_now - baseline[0], ended_now - baseline[1]
        elapsed = time.time() - started
        eta = f", about {elapsed / ended * (stage.size - ended):.0f} s left" if ended else ""
        log.info("tailgate: %s: %d/%d ended, %d in flight%s", stage.label, ended, stage.size, sent - ended, eta)

    def _order_config(self) -> dict[str, Any]:
        s = self.settings
        assert s is not None
        return {
            "host": s.host, "model": s.model, "api_key": s.api_key, "ignore_eos": s.ignore_eos,
            "prompt_word": s.prompt_word, "record_chunks": s.record_chunks, "results_dir": str(s.results_dir),
            "connect_timeout": s.timeouts.connect_s, "request_timeout": s.timeouts.request_s,
            "stall_timeout": s.timeouts.stall_s,
        }  # fmt: skip

    def _start_sampler(self) -> subprocess.Popen | None:
        s = self.settings
        assert s is not None
        if not s.metrics_url or not s.sample_metrics:
            return None
        if s.prometheus_url and _answers(s.prometheus_url + "/-/ready"):
            # a Prometheus already scrapes the server; every extra read of /metrics costs the server
            # a few milliseconds of streaming (measured on vLLM 0.24: results/h200/README.md). A
            # Prometheus that is down at the start gets the direct samples as its fallback.
            log.info("tailgate: Prometheus at %s is up: no direct /metrics sampling", s.prometheus_url)
            return None
        cmd = [sys.executable, "-m", "tailgate.load.metrics", "--url", s.metrics_url,
               "--out", str(s.results_dir / "server-metrics.jsonl"), "--interval", str(s.sample_metrics)]  # fmt: skip
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_ordinary_priority,
        )  # fmt: skip

    def _metadata(self, run_id: str, started: float, stages: list[Stage]) -> dict[str, Any]:
        s = self.settings
        assert s is not None
        measured = s.trace[s.warmup :]
        return {
            "run_id": run_id, "arm": s.arm, "config": s.config_label, "host": s.host, "model": s.model,
            "prometheus_url": s.prometheus_url, "metrics_url": s.metrics_url, "started": iso(started),
            "ended": None, "status": "running",
            "trace": {"seed": s.seed, "warmup": s.warmup, "n": s.n, "source": s.trace_source,
                      "mix": mix_of(measured), "mix_with_warmup": mix_of(s.trace)},
            "stages_planned": [x.label for x in stages], "ignore_eos": s.ignore_eos,
            "options": s.public(), "load_processes": self.workers_expected(),
            "versions": {"tailgate": tailgate.__version__, "locust": locust_version,
                         "python": platform.python_version()},
            "load_host": platform.node(), "pid": os.getpid(),
            "server": server_info(s),
        }  # fmt: skip

    @staticmethod
    def _write_json(path: Path, obj: Any) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)


def _ordinary_priority() -> None:
    """A helper process does not inherit the load generator's ``SCHED_FIFO`` (``--realtime``)."""
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False


def _summary_line(s: dict[str, Any]) -> str:
    return (
        f"{s['stage_label']} [{s['config']}]: n={s['n']} errors={s['errors']} "
        f"TTFT p50/p99 {s['ttft_p50']}/{s['ttft_p99']} ms, worst gap p50/p99 {s['gap_p50']}/{s['gap_p99']} ms, "
        f"total p99 {s['total_p99']} ms, preemptions {s['preemptions_delta']}, "
        f"schedule lag p99 {s['schedule_lag_p99']} ms"
    )


def server_info(s: Settings) -> dict[str, Any]:
    """What the server says about itself (``/version``, served models); absent fields stay None."""
    import urllib.request

    info: dict[str, Any] = {"version": None, "models": None}
    headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
    for key, path in (("version", "/version"), ("models", "/v1/models")):
        try:
            req = urllib.request.Request(s.target.url(path), headers=headers)
            with urllib.request.urlopen(req, timeout=5) as resp:
                body = json.loads(resp.read())
            info[key] = body.get("version") if key == "version" else [m.get("id") for m in body.get("data", [])]
        except Exception:
            pass
    return info


__all__ = ["OptionError", "SuiteShape"]
