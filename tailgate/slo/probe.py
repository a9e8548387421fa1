"""Running the search against a server: restart per configuration, one Locust child per probe attempt
(stopped early once the queue or the errors decide it), verdicts pooled over attempts, and ``slo.json``
saved after every step so an interrupted search resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tailgate.arms import CONTINUOUS
from tailgate.cell import CellSpec, read_summaries
from tailgate.contracts import StageSummary
from tailgate.jsontypes import JsonObject
from tailgate.load.plan import rate_label
from tailgate.records import read_records
from tailgate.runmeta import SloMeta, utc_stamp
from tailgate.runner import ChildRunner, LocustRun
from tailgate.serversession import ConfigRunner, RoundRun, StageLoad
from tailgate.slo.answer import answer_line, attempt_row, result_of, seconds_to_decide, undecided_reason, verdict_line
from tailgate.slo.attempt import ProbeAttempt, ProbeMark
from tailgate.slo.busy import MachineWatch, busy_line
from tailgate.slo.confirm import (
    ConfirmationRecord,
    confirm_answer,
    length_within,
    reserve_rate,
    settle_confirmed,
)
from tailgate.slo.model import RateModel, binding_model
from tailgate.slo.plan import PROBE_OVERHEAD_S, SloPlan
from tailgate.slo.pooled import pooled_verdicts
from tailgate.slo.replay import (
    FINAL_GROWTH,
    ModelAnswer,
    Workload,
    model_answer,
    settling_answer,
    workload_of,
)
from tailgate.slo.result import NotRun
from tailgate.slo.search import (
    SearchOutcome,
    SearchStopped,
    bracket,
    lacks_only_data,
    over_a_limit,
    search,
    worth_extending,
)
from tailgate.slo.servicefit import Probe, prefill_choices, probes_of
from tailgate.slo.spec import PROBE_MARK, SLO_FILE, Log, ServerConfig
from tailgate.slo.state import ConfigSearch, ProbeEntry, SloState
from tailgate.slo.verdict import binding_limit, check_probe, p99s
from tailgate.slo.watch import ProbeWatch
from tailgate.stagewarmup import StageWarmup
from tailgate.stats import measured_records
from tailgate.suite import Cell, cell_processes


def probe_dir_name(config: str, rate: float, attempt: int) -> str:
    return f"{config}_slo_r{rate_label(rate)}_a{attempt}"


class SloRunner(ConfigRunner[ServerConfig]):
    """Runs the search for every configuration, restarting the server between them."""

    tag = "[slo] "

    def __init__(
        self,
        plan: SloPlan,
        controller: Any,
        root: Path,
        *,
        prometheus_url: str | None = None,
        log: Log = print,
        extra_metadata: JsonObject | None = None,
    ) -> None:
        super().__init__(controller, root, ChildRunner(log, tag="[slo]   "), prometheus_url=prometheus_url, log=log,
                         extra_metadata=extra_metadata)  # fmt: skip
        self.plan = plan
        self.state = SloState()
        self._loaded = False
        """Whether :meth:`run` has read (or begun) this folder's ``slo.json``: nothing to close before."""
        self.clock: Callable[[], float] = time.monotonic
        """What the time budget is counted on (a test may substitute its own)."""
        self._config_t0 = self.clock()
        self._by_rate: dict[float, list[ProbeAttempt]] = {}
        """Attempt data of every rate probed in the configuration under search: a later probe pools them."""
        self._settled: tuple[int, ModelAnswer] | None = None
        """(probes, answer) of the fitted model that ended the search early."""
        self._fit_s = 0.0
        """Seconds the last fit took: a refit's time the confirmation keeps with the refit's probes."""
        self._settle_tried = 0
        """Attempts the last early-stop check saw."""
        self._reserve = True
        """Whether the search's probes leave time for the confirmation probes (not once they run)."""
        self._index = itertools.count(1)
        self._last_failure = ""

    # -- state file ------------------------------------------------------------------------------
    def _save(self) -> None:
        path = self.root / SLO_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state.to_dict(), indent=1, default=str) + "\n")
        tmp.replace(path)

    def _config_state(self, config: ServerConfig) -> ConfigSearch:
        return self.state.config(config)

    def record_server(self, config: ServerConfig, entry: JsonObject) -> None:
        self._config_state(config).server = entry
        self._save()

    def record_warmup(self, config: ServerConfig, warm: StageWarmup) -> None:
        self._config_state(config).stage_warmup = warm
        self._save()

    # -- server ------------------------------------------------------------------------------------
    def config_name(self, config: ServerConfig) -> str:
        return config.name

    def server_flags(self, config: ServerConfig) -> tuple[list[str], list[str] | None]:
        flags = [*self.plan.base_flags, *config.flags]
        return flags, flags

    def serve(self, config: ServerConfig) -> bool:
        """The configuration's server up and warmed; the time budget is for probes, not for starts and warm-ups."""
        t0 = self.clock()
        started = super().serve(config)
        if started:
            self._config_t0 += self.clock() - t0
        return started

    def stage_load(self, config: ServerConfig) -> StageLoad | None:
        """The warm-up of a (re)started server: rounds at the highest rate the search may use, each a probe run of
        its own (the queue and the errors may stop it early); a resumed search reads a round already on disk."""
        p = self.plan
        if p.stage_warmup <= 0:
            return None

        def one_round(k: int, out: Path, seed: int) -> RoundRun:
            if (out / PROBE_MARK).exists():
                mark = ProbeMark.read(out / PROBE_MARK)
            else:
                self.log(f"[slo] {config.name}: stage warm-up round {k}: {p.stage_warmup} requests at "
                         f"{p.max_rate:g} req/s, the highest rate the search may use")  # fmt: skip
                out.parent.mkdir(parents=True, exist_ok=True)
                mark = self._run_child(config, p.max_rate, seed, out, n=p.stage_warmup)
            return RoundRun(self._attempt_data(out, mark).measured, mark.seconds)

        return StageLoad(p.seed, one_round, rate=p.max_rate)

    # -- one Locust run ----------------------------------------------------------------------------
    def _cell(self, config: ServerConfig, rate: float, seed: int, out: Path, n: int | None = None,
              warmup: bool | None = None) -> CellSpec:  # fmt: skip
        """``n``: measured requests other than the plan's; ``warmup``: whether the probe warm-up runs (by default
        only with the plan's own count: a stage warm-up round is all warm-up)."""
        p = self.plan
        fixed = "--trace-file" in p.locust_args  # the file sets the count
        warm = (n is None or fixed) if warmup is None else warmup
        run = LocustRun(
            arm=CONTINUOUS.name, host=self.controller.base_url, results=out, stage=tuple(CONTINUOUS.value_args(rate)),
            n=p.probe_n(rate) if n is None or fixed else n, warmup=p.warmup if warm else 0, seed=seed,
            config_label=config.name,
            processes=p.processes or cell_processes(Cell(config.name, CONTINUOUS.name, rate), 0, p.locust_args),
            ignore_eos=p.ignore_eos, prometheus_url=self.prometheus_url, extra=tuple(p.locust_args),
        )  # fmt: skip
        # an interrupted attempt is kept aside, never mixed in
        return CellSpec(run, f"probe {out.name}", aside_root=self.root)

    def _error_budget_at(self, rate: float, n: int | None = None) -> int | None:
        """Errors beyond which a probe fails whatever happens next (None: no error limit)."""
        lim = next((x for x in self.plan.limits if x.metric == "errors"), None)
        if lim is None:
            return None
        return math.floor(lim.limit * ((n or self.plan.probe_n(rate)) + self.plan.warmup))

    def _run_child(self, config: ServerConfig, rate: float, seed: int, out: Path, n: int | None = None,
                   warmup: bool | None = None) -> ProbeMark:  # fmt: skip
        """Run one Locust child, stopping it early when the queue or the errors already decide the probe."""
        base = self.controller.base_url
        watch = ProbeWatch(out, f"{base.rstrip('/')}/metrics" if isinstance(base, str) and base else None)
        budget = self._error_budget_at(rate, n)
        queue_stop = self.plan.queue_stop(rate)

        def decided() -> str | None:
            watch.poll()
            if queue_stop and watch.waiting is not None and watch.waiting >= queue_stop:
                return (f"waiting queue reached {watch.waiting:.0f} (stop at {queue_stop}, a quarter of the "
                        "probe's requests): the server is not keeping up")  # fmt: skip
            if budget is not None and watch.errors > budget:
                return f"{watch.errors} errors: over the SLO's error budget of {budget} for the probe"
            return None

        machine = MachineWatch(getattr(self.controller, "pid", None))
        try:
            done = self.server.run(self._cell(config, rate, seed, out, n, warmup), watch=decided,
                                   on_start=machine.on_start)  # fmt: skip
        finally:
            others = machine.stop()
        busy = busy_line(others)
        if busy:
            self.log(f"[slo]   {busy}")
        code, stopped = done.child.exit_code, done.stopped_early
        if stopped:
            self.log(f"[slo]   stopped the probe early: {stopped}")
        watch.poll()
        if stopped is None and not done.complete:
            raise SloRunError(done.failure())
        if stopped is None:  # a probe the search stopped itself was interrupted on purpose
            self.exit_codes.append(done.ending.code)
        mark = ProbeMark(rate, seed, exit_code=code, seconds=round(done.seconds, 1), stopped_early=stopped,
                         waiting_max=watch.waiting_max, queue_stop=queue_stop,
                         waiting_series=tuple(watch.waiting_series), errors_at_stop=watch.errors,
                         kv_capacity_tokens=watch.kv_capacity_tokens, others_busy_cores=others)  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)  # a run set aside or never started leaves no folder to mark
        mark.write(out / PROBE_MARK)
        return mark

    def _attempt_data(self, out: Path, mark: ProbeMark) -> ProbeAttempt:
        """What a verdict needs from one attempt's folder."""
        scan = read_records(out)
        recs = [r for r in scan.records if r.error_class != "cancelled" or not mark.stopped_early]
        summary = next(iter(read_summaries(out)), StageSummary())
        dropped = int(summary.dropped_arrivals or 0)
        # requests the early stop itself cancelled are not the server's errors
        errors = sum(1 for r in recs if r.error_class is not None) + dropped
        return ProbeAttempt(
            measured=measured_records(recs, self.plan.warmup), sent=len(scan.records) + dropped,
            errors=errors, stopped_early=mark.stopped_early, cancelled=len(scan.records) - len(recs),
            waiting_series=mark.waiting_series, summary=summary, records=scan.records,
            kv_capacity_tokens=mark.kv_capacity_tokens,
        )  # fmt: skip

    def probe(self, config: ServerConfig, rate: float, phase: str, index: int, length: float = 1.0) -> str:
        """One rate: run (or reuse) attempts until the verdict is decided or this call's attempts are spent.

        A rate probed again (``extend``) pools its earlier attempts: the verdicts are anytime-valid, so the
        growing data may be looked at after every attempt at the stated confidence. ``length``: measured
        requests as a multiple of the plan's (a confirmation probe is longer)."""
        p = self.plan
        attempts = self._by_rate.setdefault(rate, [])
        entry = ProbeEntry(index, rate, phase)
        verdict, checks = "not_enough_data", list[Any]()
        first = len(attempts) + 1
        for attempt in range(first, first + p.looks):
            out = self.root / probe_dir_name(config.name, rate, attempt)
            # a re-run repeats the workload, an extension draws a new sample, a confirmation one of its own
            seed = p.confirm_seed(rate, attempt) if phase == "confirm" else p.attempt_seed(attempt)
            mark_path = out / PROBE_MARK
            if mark_path.exists():
                mark = ProbeMark.read(mark_path)
                self.log(f"[slo] {config.name}: probe {index} ({phase}) {rate:g} req/s attempt {attempt}: already done")
            else:
                spent = self.clock() - self._config_t0
                budget = self._budget_for(config, rate)
                n = p.attempt_n(rate, attempt, length, budget - spent if budget else None)
                est = ((n or p.probe_n(rate)) + p.warmup) / rate
                if budget and spent + est + PROBE_OVERHEAD_S > budget:
                    need = est + PROBE_OVERHEAD_S
                    why = (f"{spent:.0f} s spent; a {rate:g} req/s attempt needs ~{need:.0f} s more than the "
                           f"{budget:.0f} s {'the search may use' if budget < p.time_budget else 'budget'} "
                           "allows")  # fmt: skip
                    if attempt > first:  # an extension that does not fit: the probe stays undecided, recorded
                        self.log(f"[slo]   no time left in the budget for more: {rate:g} req/s stays undecided")
                        break
                    raise SearchStopped(why)
                self.serve(config)
                self.log(f"[slo] {config.name}: probe {index} ({phase}) {rate:g} req/s attempt {attempt} "
                         f"(~{est:.0f} s of arrivals)")  # fmt: skip
                ran = self._attempt_run(config, rate, seed, out, n)
                if ran is None:  # could not run twice: marked, and the search goes on without it
                    self._config_state(config).not_run.append(NotRun(rate, phase, attempt, self._last_failure))
                    self._save()
                    break
                mark = ran
            # a trace file fixes the requests whatever the seed: its extensions only redraw the arrival gaps,
            # so they are clustered with the first run, never counted as a new sample
            workload = p.seed if "--trace-file" in p.locust_args else seed
            data = replace(self._attempt_data(out, mark), workload=workload)
            attempts.append(data)
            verdict, checks = check_probe(attempts, p.limits, level=p.look_confidence, rate=rate)
            entry.attempts.append(attempt_row(out.name, seed, mark, data))
            self.log(f"[slo]   -> {verdict_line(verdict, checks)}")
            if verdict != "not_enough_data":
                break
            if attempt <= p.reruns:
                self.log("[slo]   not enough data for a verdict: re-running the same workload, the runs pooled "
                         "(a block of every run of it counts as one cluster)")  # fmt: skip
            elif attempt < first + p.looks - 1:
                self.log(f"[slo]   not enough data for a verdict: extending with a new sample of the workload "
                         f"(seed {p.attempt_seed(attempt + 1)}), pooled as blocks of their own")  # fmt: skip
        pooled = [r for a in attempts for r in a.measured]
        entry.verdict, entry.checks, entry.pooled_attempts = verdict, list(checks), len(attempts)
        entry.binding, entry.p99 = binding_limit(checks), p99s(pooled)
        entry.undecided_reason = undecided_reason(verdict, checks)
        if not entry.attempts:
            return verdict
        self._config_state(config).probes.append(entry)
        self._save()
        return verdict

    def _budget_for(self, config: ServerConfig, rate: float) -> float:
        """Seconds of probing the next attempt may end by: the whole budget, less the confirmation probes' time
        while the search's own probes run, once there are streams a model can be fitted to."""
        if not self._reserve or not self.plan.time_budget:
            return self.plan.time_budget
        if self._model_inputs(config) is None:
            return self.plan.time_budget  # no streams a model could be fitted to: nothing to confirm
        lo, hi = bracket(self._pooled(config))
        return self.plan.search_budget(reserve_rate(lo, hi, rate))

    def _attempt_run(self, config: ServerConfig, rate: float, seed: int, out: Path, n: int | None) -> ProbeMark | None:
        """One attempt, tried a second time when its Locust run could not complete (None: neither did). A probe
        that could not run is marked in ``slo.json`` and costs the search that rate only, never the
        configuration."""
        for k in (1, 2):
            try:
                return self._run_child(config, rate, seed, out, n, warmup=True if n is not None else None)
            except (SloRunError, OSError) as e:
                self._last_failure = str(e).splitlines()[0] if str(e) else type(e).__name__
                self.log(f"[slo]   the attempt could not run ({self._last_failure})"
                         + ("; trying once more" if k == 1 else "; marked, and the search goes on"))  # fmt: skip
        return None

    def _pooled(self, config: ServerConfig) -> dict[float, str]:
        """Every rate's verdict with the evidence pooled across rates (the latest entry of each rate)."""
        latest = self._config_state(config).latest()
        return pooled_verdicts(list(latest.values()), self.plan.tails, self.plan.look_confidence)

    def _model(self, config: ServerConfig) -> RateModel | None:
        """The model of the binding percentile against rate, fitted to this configuration's probes so far."""
        limits = {lim.key: lim.limit for lim in self.plan.limits if lim.p is not None}
        return binding_model(self._config_state(config).probes, limits)

    def _model_inputs(self, config: ServerConfig) -> tuple[list[Probe], Workload, dict[str, float], float] | None:
        """What the fitted step loop is given: the probes, the workload, the limits and their quantile."""
        p = self.plan
        qs = {lim.p for lim in p.limits if lim.p is not None}
        if not p.model_replicates or len(qs) != 1:
            return None
        latest = {rate: pr.checks for rate, pr in self._config_state(config).latest().items()}
        probes = probes_of(self._by_rate, latest)
        workload = workload_of(self._by_rate, "--trace-file" in p.locust_args)
        if not probes or workload is None:
            return None
        limits = {lim.metric: lim.limit for lim in p.limits if lim.p is not None}
        return probes, workload, limits, qs.pop() / 100.0

    def _settles(self, config: ServerConfig) -> bool:
        """Whether the fitted model, checked against this configuration's probes so far, meets the resolution
        (:func:`tailgate.slo.replay.settling_answer`): the search may end before its budget."""
        p = self.plan
        inputs = self._model_inputs(config) if p.model_stop else None
        if inputs is None:
            return False
        probes, workload, limits, q = inputs
        seen = sum(len(a) for a in self._by_rate.values())
        if seen == self._settle_tried:
            return False  # no new attempt since the last try: the same data give the same answer
        self._settle_tried = seen
        answer = settling_answer(probes, limits, q, bracket(self._pooled(config)), p.resolution.narrow,
                                 workload=workload, requests=p.model_requests, replicates=p.model_replicates,
                                 seed=p.seed, chunks=prefill_choices(dict(config.knobs)))  # fmt: skip
        if answer is None or answer.bracket is None:
            return False
        lo, hi = answer.bracket
        self.log(f"[slo] {config.name}: the fitted model, checked against {len(probes)} probes, brackets the "
                 f"capacity at [{lo:.3g}, {hi:.3g}] req/s (model estimate): the search ends here")  # fmt: skip
        self._settled = (len(probes), answer)
        return True

    def _fitted(self, outcome: SearchOutcome, *, config: ServerConfig) -> ModelAnswer | None:
        """The step loop fitted to this configuration's streams: its capacity interval, its checks, and the
        bracket it narrows when they hold (a model estimate, labelled so wherever it is shown)."""
        p = self.plan
        inputs = self._model_inputs(config)
        if inputs is None:
            return None
        probes, workload, limits, q = inputs
        if self._settled is not None and self._settled[0] == len(probes):
            return self._settled[1]  # computed on these very probes when the search settled
        streams = sum(len(a) for pr in probes for a in pr.attempts)
        self.log(f"[slo] {config.name}: fitting the server's step loop to {streams} streams and simulating it "
                 f"({p.model_replicates} x {FINAL_GROWTH * p.model_requests} requests of "
                 f"{workload.describe()})")  # fmt: skip
        t0 = self.clock()
        answer = model_answer(probes, limits, q, (outcome.best, outcome.first_fail), workload=workload,
                              requests=p.model_requests, replicates=p.model_replicates, seed=p.seed,
                              chunks=prefill_choices(dict(config.knobs)))  # fmt: skip
        self._fit_s = self.clock() - t0
        return answer

    def _search(self, config: ServerConfig, *, settle: bool, max_probes: int) -> SearchOutcome:
        """The search over rates from the verdicts so far (pooled across rates), within the phase's budget."""
        p = self.plan
        return search(
            lambda rate, phase: self.probe(config, rate, phase, next(self._index)),
            start=p.start_rate, max_rate=p.max_rate, min_rate=p.min_rate,
            resolution=p.resolution, max_probes=max_probes, pooled=lambda: self._pooled(config),
            guess=lambda: getattr(self._model(config), "capacity", None),
            settled=(lambda: self._settles(config)) if settle else None,
            on_track=lambda: self._on_track(config), over_limit=lambda: self._over_limit(config),
        )  # fmt: skip

    def _over_limit(self, config: ServerConfig) -> list[float]:
        """Undecided rates whose measured point of some limited percentile is already over its limit."""
        return [float(rate) for rate, entry in self._config_state(config).latest().items()
                if over_a_limit(entry.verdict, entry.checks)]  # fmt: skip

    def _on_track(self, config: ServerConfig) -> list[float]:
        """Undecided rates that lack only data (every limited point under its limit, the server not shown to fall
        behind, no error check failed) and that more data can decide in the budget left (:func:`worth_extending`)."""
        state = self._config_state(config)
        spent: dict[float, float] = {}  # every attempt at the rate: its latest verdict pools them all
        for entry in state.probes:
            spent[float(entry.rate)] = spent.get(float(entry.rate), 0.0) + sum(a.seconds or 0.0 for a in entry.attempts)
        lacking = {
            rate: seconds_to_decide(entry.checks, spent.get(float(rate), 0.0), self.plan.confidence)
            for rate, entry in state.latest().items() if lacks_only_data(entry.verdict, entry.checks)
        }  # fmt: skip
        if not lacking:
            return []
        budget = self._budget_for(config, max(lacking))
        left = budget - (self.clock() - self._config_t0) if budget else None
        return worth_extending(lacking, left)

    def _remeasured(self, config: ServerConfig, outcome: SearchOutcome) -> SearchOutcome:
        """The outcome with the measured bracket and verdicts of every probe run so far (confirmation probes are
        measurements too), its status kept unless the bracket now meets the resolution."""
        verdicts = self._pooled(config)
        lo, hi = bracket(verdicts)
        status = outcome.status
        if lo is not None and hi is not None and self.plan.resolution.narrow(lo, hi):
            status = "bracketed"
        return replace(outcome, best=lo, first_fail=hi, verdicts=verdicts, status=status)

    def _confirm(self, config: ServerConfig, outcome: SearchOutcome,
                 fitted: ModelAnswer) -> tuple[ModelAnswer, ConfirmationRecord]:  # fmt: skip
        """Test the fitted answer on probes it was not fitted to, refit once on everything after a
        contradiction, then refuse (:func:`tailgate.slo.confirm.confirm_answer`)."""
        self._reserve = False
        limits = {lim.metric: lim.limit for lim in self.plan.limits if lim.p is not None}
        qs = {lim.p for lim in self.plan.limits if lim.p is not None}

        def run(rate: float, left: int, kept: int) -> tuple[str, Probe | None]:
            p = self.plan
            remaining = p.time_budget - (self.clock() - self._config_t0) if p.time_budget else math.inf
            # a refit, should one come, takes about as long as the fit did (97 s on a 2-core CPU vLLM host)
            length = length_within(remaining, left, p.probe_n(rate), p.warmup, rate, PROBE_OVERHEAD_S, kept,
                                   refit_s=self._fit_s)  # fmt: skip
            done = self.root / probe_dir_name(config.name, rate, len(self._by_rate.get(rate, [])) + 1) / PROBE_MARK
            if done.exists():  # a resumed search reads the probe it already ran, whatever the budget left
                length = length or 1.0
            elif length is None:
                raise SearchStopped(f"{remaining:.0f} s of the budget left, less than one probe needs")
            verdict = self.probe(config, rate, "confirm", next(self._index), length=length)
            entry = self._config_state(config).latest().get(rate)
            if entry is None or not self._by_rate.get(rate):
                return "not_run", None
            probes = probes_of({rate: self._by_rate[rate]}, {rate: entry.checks})
            return verdict, probes[0] if probes else None

        def refit() -> ModelAnswer | None:
            self._settled = None
            return self._fitted(self._remeasured(config, outcome), config=config)

        def log(line: str) -> None:
            self.log(f"[slo] {config.name}: {line}")

        return confirm_answer(fitted, run, refit, qs.pop() / 100.0, limits, log)

    def run_config(self, config: ServerConfig) -> ConfigSearch:
        p = self.plan
        cs = self._config_state(config)
        cs.status, cs.probes = "running", []
        self._save()
        self._index = itertools.count(1)
        self._config_t0 = self.clock()
        self._by_rate = {}
        self._settled, self._settle_tried = None, 0
        self._reserve = True
        outcome = self._search(config, settle=True, max_probes=p.max_probes)
        if outcome.status == "time_budget":
            self.log(f"[slo] {config.name}: time budget spent; the bracket so far is the answer")
        model = self._model(config)
        fitted_json: JsonObject | None
        try:
            fitted = self._fitted(outcome, config=config)
            if outcome.status == "time_budget" and self._reserve and (fitted is None or not fitted.usable):
                # the time kept for the model's test goes back to measuring: there is no model to test (a CPU
                # vLLM search whose fit its own replay refused stopped with 280 s of its 900 unspent)
                self._reserve = False
                self.log(f"[slo] {config.name}: no usable model to confirm; the time kept for it goes on measuring")
                ran = sum(1 for pr in cs.probes if pr.phase != "confirm")
                more = self._search(config, settle=False, max_probes=max(0, p.max_probes - ran))
                outcome = replace(more, steps=[*outcome.steps, *more.steps])
                if len(more.steps):
                    fitted = self._fitted(outcome, config=config)
            if fitted is not None and p.confirm and fitted.usable:
                fitted, record = self._confirm(config, outcome, fitted)
                outcome = self._remeasured(config, outcome)
                fitted = settle_confirmed(fitted, record, (outcome.best, outcome.first_fail))
                if not record.stands and outcome.status in ("settled", "time_budget"):
                    # the model that ended the search early, or that the reserve was kept for, did not stand: the
                    # budget left goes on measuring (a CPU vLLM search whose refit was refused stopped with 168 s
                    # of its 900 unspent)
                    ran = sum(1 for pr in cs.probes if pr.phase != "confirm")
                    more = self._search(config, settle=False, max_probes=max(0, p.max_probes - ran))
                    outcome = replace(more, steps=[*outcome.steps, *more.steps])
                    if more.steps:
                        self.log(f"[slo] {config.name}: the model did not stand; {len(more.steps)} more probe(s) "
                                 "in the budget its test left")  # fmt: skip
            fitted_json = fitted.as_dict() if fitted is not None else None
        except (ArithmeticError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as e:
            # a model estimate never costs the measured answer it sits beside
            why = f"the fitted model failed: {type(e).__name__}: {e}"
            fitted_json = {"label": "model estimate, not a measurement", "capacity": None, "why": why}
        result = result_of(outcome, cs.probes, p)
        result.not_run = list(cs.not_run)
        result.model = model.as_dict() if model is not None else None
        result.fitted = fitted_json
        cs.result, cs.status = result, "done"
        self._save()
        self.log(f"[slo] {config.name}: {answer_line(result)}")
        return cs

    def run(self) -> list[ConfigSearch]:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / SLO_FILE
        found = SloMeta.read_or_none(path)
        # configurations searched by earlier invocations (one per device call) stay in the file
        self.state = SloState.from_meta(found, where=str(path)) if found is not None else SloState(created=utc_stamp())
        self.state.started, self.state.plan = utc_stamp(), self.plan.describe()
        self.state.extra.update(self.extra_metadata)
        self._loaded = True
        self._save()
        done = [self.run_config(config) for config in self.plan.configs]
        self.state.ended = utc_stamp()
        self._save()
        return done

    def close_running(self, status: str, reason: str) -> None:
        """Mark configurations still searching as ended by ``status`` (``interrupted``, ``failed``), with why:
        a slo.json left "running" after its process is gone would read as a search still under way."""
        if not self._loaded:
            return
        for c in self.state.configs:
            if c.status == "running":
                c.status, c.error = status, reason
        self.state.ended = utc_stamp()
        self._save()


class SloRunError(RuntimeError):
    pass
