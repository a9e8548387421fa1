"""A stage's summary: written when the stage ends (or a stop cuts it short), and written again when a load
process written off in it turns out to have sent more.

Held by :class:`~tailgate.load.session.RunSession` as a part of its own because it answers one question (what the
stage measured, and what became of every request planned for it) apart from running the stages; it keeps the
summaries and the readings they alone are built from, and is handed what it shares with the session.
"""

from __future__ import annotations

import gevent

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from tailgate.arms import arm as arm_of
from tailgate.contracts import OrderDone, StageSummary
from tailgate.hoststeal import cpu_counters, steal_share
from tailgate.load.capturelink import stamp_summary
from tailgate.load.metrics import Snapshot, scrape
from tailgate.load.options import Settings
from tailgate.load.plan import Stage
from tailgate.load.processes import processes_for
from tailgate.load.runfiles import stage_accounting, write_json
from tailgate.load.stage_workload import workload_summary
from tailgate.load.tally import StageTally
from tailgate.records import RequestRecord
from tailgate.resultfiles import summary_file
from tailgate.runmeta import utc_stamp
from tailgate.stats import summarize_stage

log = logging.getLogger("tailgate")


class StageSummaries:
    """Every stage summary of one run, with what each is built from that only the summaries read: the readings
    taken as the stage starts and ends, the arrivals the load processes refused, and which processes ran it to
    its end.

    The settings, stages and tally are the session's (its orders and sink use them too); ``done`` is the running
    group's DONE by process, which the session fills and clears in place: how its processes stamped chunks."""

    def __init__(
        self,
        settings: Settings,
        folder: Path,
        run_id: str,
        stages: list[Stage],
        tally: StageTally,
        done: Mapping[str, OrderDone],
    ) -> None:
        self.settings = settings
        self.folder = folder
        self.run_id = run_id
        self.stages = stages
        self.tally = tally
        self._done = done
        self.by_stage: dict[int, StageSummary] = {}
        self.stage_started: dict[int, float] = {}
        self._stage_cpu: dict[int, tuple[int, int] | None] = {}
        self.before: dict[int, Snapshot | None] = {}
        self._after: dict[int, Snapshot | None] = {}
        self.dropped: dict[int, int] = {}
        """Stage index -> arrivals the load processes refused (the in-flight cap), as their DONEs said."""
        self._stage_nodes: dict[int, list[str]] = {}
        """Stage index -> the processes it was split over."""
        self._lost_in: dict[str, int] = {}
        """Process -> the stage it was lost in (its share closed by the master)."""
        self._late_pending: set[int] = set()

    def begin(self, stage: Stage) -> None:
        """The readings a stage's summary compares its end with: the preemption counter, the time, the host's
        CPU counters."""
        s = self.settings
        self.before[stage.index] = scrape(s.metrics_url) if s.metrics_url else None
        self.stage_started[stage.index] = time.time()
        self._stage_cpu[stage.index] = cpu_counters()

    def split_over(self, stage_index: int, nodes: list[str]) -> None:
        self._stage_nodes[stage_index] = list(nodes)

    def mark_lost(self, node: str, stage_index: int) -> None:
        """The first stage a process was lost in: it did not run that one to its end."""
        self._lost_in.setdefault(node, stage_index)

    def add_dropped(self, stage_index: int, dropped: int) -> None:
        self.dropped[stage_index] = self.dropped.get(stage_index, 0) + dropped

    def summarize(
        self,
        stage: Stage,
        records: list[RequestRecord],
        after: Snapshot | None,
        *,
        partial: bool,
        lost: list[str] | None = None,
    ) -> StageSummary:
        """The stage's summary, written to its file and kept for run.json and the web UI.

        The percentile rules give their figures by name, as the analysis computes them from the same table
        (:data:`tailgate.stats.PERCENTILE_RULES`); they are checked against the contract once, and every other
        part (the window, the counters, the accounting, the workload, the stamps) is a typed value of its own."""
        s = self.settings
        stage_start = self.stage_started.get(stage.index, time.time())
        before = self.before.get(stage.index)
        pre = None if before is None else before.preemptions_total
        post = None if after is None else after.preemptions_total
        delta = (post - pre) if pre is not None and post is not None else None
        reset = delta is not None and delta < 0  # the counter went backwards: the server restarted mid-stage
        self._after[stage.index] = after
        figures = StageSummary.from_dict(summarize_stage(
            records, arm=stage.arm, rate_or_batch=stage.rate_or_batch, started=utc_stamp(stage_start),
            warmup=stage.warmup, warmup_rule=s.warmup_rule, preemptions_delta=None if reset else delta,
        ), source=f"{stage.label} summary")  # fmt: skip
        window_start = min([r.sent_s for r in records] or [stage_start])
        window_end = max([r.end_s for r in records if r.end_s is not None] or [time.time()])
        span = window_end - window_start
        chunks = sum(r.chunks for r in records)
        accounting = stage_accounting(self.folder, stage, records)
        workload = workload_summary(s, stage, records, before, after)
        if workload.prefix_cache_warning:
            log.warning("tailgate: %s: %s", stage.label, workload.prefix_cache_warning)
        negative = sum(1 for r in records for v in (r.ttft_ms, r.total_ms, r.worst_gap_ms) if (v or 0) < 0)
        if negative:  # stamps from two clocks that disagree; the load processes guard against it, this says so
            log.error("tailgate: %s: %d negative latency value(s) in the records: a clock disagreed with another "
                      "(see run.json chunk_stamp_notes); these percentiles are not to be trusted", stage.label,
                      negative)  # fmt: skip
        if reset:
            log.warning("tailgate: %s: preemption counter fell %s -> %s (server restarted?)", stage.label, pre, post)
        stamps = stamp_summary(self._done.values())
        summary = dataclasses.replace(
            figures, key_order=(),  # a new summary: written in the contract's declared order
            sent=accounting.sent,
            stage=stage.index, stage_label=stage.label, config=s.config_label, run_id=self.run_id, partial=partial,
            window_start_s=window_start, window_end_s=window_end,
            planned=accounting.planned, dropped_arrivals=self.dropped.get(stage.index, 0),
            preemptions_before=pre, preemptions_after=post,
            preemptions_before_t=None if before is None else before.t,
            preemptions_after_t=None if after is None else after.t,
            preemptions_source="direct_scrape" if delta is not None else None, preemption_counter_reset=reset,
            metrics_url=s.metrics_url, target_rate=stage.rate_or_batch if arm_of(stage.arm).open_loop else None,
            recorded=accounting.recorded, lost_in_flight=accounting.lost_in_flight,
            never_sent=accounting.never_sent, ran_short=accounting.ran_short,
            prompts=workload.prompts, endpoint=workload.endpoint, arrivals=workload.arrivals,
            prefix_cache_queries_delta=workload.prefix_cache_queries_delta,
            prefix_cache_hits_delta=workload.prefix_cache_hits_delta,
            prefix_cache_hit_rate=workload.prefix_cache_hit_rate, prefix_caching=workload.prefix_caching,
            server_slow_gaps_delta=workload.slow.server_slow_gaps_delta,
            server_slow_gap_edge_s=workload.slow.server_slow_gap_edge_s,
            prefix_cache_warning=workload.prefix_cache_warning,
            prompt_tokens_checked=workload.prompt_tokens_checked, prompt_tokens_exact=workload.prompt_tokens_exact,
            prompt_tokens_diff_max=workload.prompt_tokens_diff_max,
            prompt_tokens_diff_mean=workload.prompt_tokens_diff_mean,
            workers_lost=list(lost or []), negative_latencies=negative,
            chunks_per_s=round(chunks / span, 1) if span > 0 else None,
            load_processes=self._ran(stage.index),
            chunk_stamp=stamps.chunk_stamp, capture_drops=stamps.capture_drops,
            capture_missed_streams=stamps.capture_missed_streams,
            # what the report suggests when this stage fell behind its schedule
            processes_to_keep_up=processes_for(chunks / span, s.chunk_stamp) if span > 0 else None,
            # this machine's CPU time the hypervisor took during the stage (the coordinator's host)
            host_steal_share=steal_share(self._stage_cpu.get(stage.index), cpu_counters()),
        )  # fmt: skip
        self.by_stage[stage.index] = summary
        write_json(self.folder / summary_file(stage.label), summary.to_dict())
        return summary

    def _ran(self, stage_index: int) -> int:
        """Processes that ran this stage to its end: those it was split over, less those lost in it."""
        return sum(1 for n in self._stage_nodes.get(stage_index, []) if self._lost_in.get(n) != stage_index)

    def on_late(self, stage_index: int) -> None:
        """A worker written off sent or recorded more for a stage (a partition healed): once the burst is in,
        that stage's summary is written again from every record reported, so its accounting matches what was
        sent."""
        if stage_index in self._late_pending:
            return
        self._late_pending.add(stage_index)
        gevent.spawn_later(0.5, self._resummarize, stage_index)

    def _resummarize(self, stage_index: int) -> None:
        self._late_pending.discard(stage_index)
        old = self.by_stage.get(stage_index)
        stage = next((x for x in self.stages if x.index == stage_index), None)
        if old is None or stage is None:
            return  # not summarized yet: its summary counts these records when it is
        records = self.tally.records(stage_index)
        summary = dataclasses.replace(
            self.summarize(stage, records, self._after.get(stage_index), partial=bool(old.partial),
                            lost=old.workers_lost),
            reconciled=True,
        )  # fmt: skip
        self.by_stage[stage_index] = summary
        write_json(self.folder / summary_file(stage.label), summary.to_dict())
        log.warning("tailgate: %s: a load process written off sent more; summary reconciled: %s sent, %s recorded, "
                    "%s lost in flight, %s never sent", stage.label, summary.sent, summary.recorded,
                    summary.lost_in_flight, summary.never_sent)  # fmt: skip
