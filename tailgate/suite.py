"""The whole experiment in one command: every cell, server restarts between arms, the report.

A cell is one Locust run (one arm, one rate or batch size, one server configuration) in its own
folder. Cells run in an order that needs the fewest server restarts: the engine default
(chunked prefill on) for the rate ramp and the gated arm, then chunked prefill off, then a
small KV pool that forces preemption. A finished cell has ``run.json`` with status
``completed``; re-running the same command skips it, so an interrupted suite resumes.

Standard library only: Locust runs as a child process, exactly as a user would start it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import tailgate
from tailgate import arms
from tailgate.arms import CONTINUOUS, GATED, cell_folder, stage_label
from tailgate.cell import CellSpec
from tailgate.clientbound import merged_breached
from tailgate.contracts import StageSummary
from tailgate.jsontypes import JsonObject
from tailgate.load.autosize import GATED_STREAM_CHUNKS_PER_S, mean_output_tokens, mean_trace_output_tokens
from tailgate.load.processes import auto_processes
from tailgate.load.promptsources import DEFAULT_PROMPTS
from tailgate.load.rxstamp import chunk_stamp_mode
from tailgate.optiontable import DEFAULTS
from tailgate.policies import FixedCells, KneeRamp, drive
from tailgate.records import read_records
from tailgate.resultfiles import RUN_META, SUITE_META, summary_file
from tailgate.runmeta import GpuFacts, HostFacts, RunMeta, RunStatus, SuiteMeta, utc_stamp
from tailgate.runner import ChildRunner, LocustRun
from tailgate.serverconfigs import CONFIGS, DEFAULT, NOCHUNK, PREEMPT, engine_default
from tailgate.servers.base import redact_argv
from tailgate.serversession import ConfigRunner, RoundRun, StageLoad, end_run_meta
from tailgate.stagewarmup import StageWarmup

Log = Callable[[str], None]


def trace_file_of(locust_args: list[str]) -> str | None:
    """The ``--trace-file`` passed through to Locust, if any (``--trace-file X`` or ``--trace-file=X``)."""
    for i, arg in enumerate(locust_args):
        if arg == "--trace-file" and i + 1 < len(locust_args):
            return locust_args[i + 1]
        if arg.startswith("--trace-file="):
            return arg.split("=", 1)[1]
    return None


def cell_processes(cell: Cell, processes: int, locust_args: list[str] | None = None) -> int:
    """Load processes for one cell: as asked, or for ``auto`` (0) from the cores and the cell's expected
    chunk rate (arrivals per second x chunks per arrival; a gated batch streams all at once). With
    ``--trace-file`` the chunks per arrival are that trace's mean output length, not the seeded mix's."""
    if processes > 0:
        return processes
    trace = trace_file_of(locust_args or [])
    per_arrival = (mean_trace_output_tokens(trace) if trace else None) or mean_output_tokens()
    if arms.arm(cell.arm).open_loop:
        chunks = cell.value * per_arrival
    else:
        chunks = cell.value * GATED_STREAM_CHUNKS_PER_S
    return auto_processes(chunks, stamp=stamp_of(locust_args or []))


def stamp_of(locust_args: list[str]) -> str:
    """The ``--chunk-stamp`` the cell's Locust runs with (the last one given), else Locust's default."""
    stamp = None
    for i, arg in enumerate(locust_args):
        if arg == "--chunk-stamp" and i + 1 < len(locust_args):
            stamp = locust_args[i + 1]
        elif arg.startswith("--chunk-stamp="):
            stamp = arg.split("=", 1)[1]
    return stamp or chunk_stamp_mode()


@dataclass(frozen=True)
class Cell:
    config: str
    arm: str
    value: float
    """Arrival rate (continuous) or batch size (gated)."""
    prompts: str = DEFAULT_PROMPTS
    """Prompt source; a cell with another source than the seed's is the B side of a prompt A/B."""

    @property
    def name(self) -> str:
        suffix = "" if self.prompts == DEFAULT_PROMPTS else f"+{self.prompts}"
        return cell_folder(self.config, self.arm, self.value) + suffix

    @property
    def stage_label(self) -> str:
        return stage_label(self.arm, self.value)


@dataclass
class SuitePlan:
    rates: tuple[float, ...] = DEFAULTS["rates"]
    until_knee: bool = False
    knee_factor: float = 2.0
    max_rate: float = 320.0
    batch_size: int = DEFAULTS["batch_size"]
    gated: bool = True
    nochunk_rates: tuple[float, ...] = DEFAULTS["nochunk_rates"]
    preempt_rate: float | None = DEFAULTS["preempt_rate"]
    n: int = DEFAULTS["n"]
    warmup: int = DEFAULTS["warmup"]
    seed: int = DEFAULTS["seed"]
    ignore_eos: bool = False
    processes: int = 1
    """Load processes per cell; 0 = auto (:func:`cell_processes`)."""
    server_flags: dict[str, list[str]] = field(
        default_factory=lambda: {c.name: list(c.plan_flags) for c in CONFIGS.values()}
    )
    locust_args: list[str] = field(default_factory=list)
    """Passed through to every Locust run (e.g. --request-timeout, --trace-file)."""
    declared_flags: dict[str, list[str]] = field(default_factory=dict)
    """Flags the user stated for a server the suite does not start (recorded, not applied)."""
    configs: tuple[str, ...] = tuple(CONFIGS)
    """Server configurations to run now (a server nobody can restart runs one at a time)."""
    realtime: bool = False
    """Load processes at SCHED_FIFO where allowed: set when the server shares this machine's cores."""
    prompts: tuple[str, ...] = (DEFAULT_PROMPTS,)
    """Prompt sources; with two or more, every open-loop cell runs once per source on the same arrival
    schedule (same seed): a paired A/B the report compares with the intervals of chunked on vs off."""
    stage_warmup: int = 0
    """Requests per stage warm-up round on each (re)started server, at the highest rate the run will use on
    it (0: none; see :mod:`tailgate.stagewarmup`)."""

    def fixed_cells(self) -> list[Cell]:
        first, others = self.prompts[0], self.prompts[1:]
        cells = [Cell(DEFAULT.name, CONTINUOUS.name, r, first) for r in self.rates]
        if self.gated:
            cells.append(Cell(DEFAULT.name, GATED.name, float(self.batch_size), first))
        cells += [Cell(NOCHUNK.name, CONTINUOUS.name, r, first) for r in self.nochunk_rates]
        if self.preempt_rate:
            cells.append(Cell(PREEMPT.name, CONTINUOUS.name, self.preempt_rate, first))
        paired = [Cell(c.config, c.arm, c.value, other) for c in cells if arms.arm(c.arm).open_loop for other in others]
        return [c for c in [*cells, *paired] if c.config in self.configs]

    def top_stage(self, config: str) -> Cell | None:
        """The heaviest load the run will put on ``config``'s server: its highest open-loop rate (a ramp
        ``--until-knee`` may double up to ``max_rate``), else its largest gated batch; None: no cells."""
        cells = [c for c in self.fixed_cells() if c.config == config and c.prompts == self.prompts[0]]
        rated = [c for c in cells if arms.arm(c.arm).open_loop]
        if rated:
            top = max(rated, key=lambda c: c.value)
            rate = top.value
            if engine_default(config) and self.until_knee and self.rates:
                rate = self.rates[-1]
                while rate * 2 <= self.max_rate:
                    rate *= 2
            return Cell(config, top.arm, max(rate, top.value), top.prompts)
        return max(cells, key=lambda c: c.value, default=None)


def cell_done(root: Path, cell: Cell) -> bool:
    meta = RunMeta.read_or_none(root / cell.name / RUN_META)
    return meta is not None and meta.completed and (root / cell.name / summary_file(cell.stage_label)).exists()


def load_summary(root: Path, cell: Cell) -> StageSummary | None:
    return StageSummary.read_or_none(root / cell.name / summary_file(cell.stage_label))


class Suite(ConfigRunner[str]):
    """Runs the plan against one server, restarting it between configurations."""

    tag = "[suite] "

    def __init__(
        self,
        plan: SuitePlan,
        controller: Any,
        root: Path,
        *,
        prometheus_url: str | None = None,
        log: Log = print,
        extra_metadata: JsonObject | None = None,
        child_env: dict[str, str] | None = None,
    ) -> None:
        # the API key reaches the Locust child through its environment only
        super().__init__(controller, root, ChildRunner(log, env=child_env), prometheus_url=prometheus_url, log=log,
                         extra_metadata=extra_metadata, tell_kills=True)  # fmt: skip
        self.plan = plan
        self.knee: str | None = None

    # -- suite.json ---------------------------------------------------------------------------
    def _meta_path(self) -> Path:
        return self.root / SUITE_META

    def _write_meta(self, **updates: Any) -> None:
        path = self._meta_path()
        meta = SuiteMeta.read_or_none(path) or SuiteMeta.from_dict({"created": utc_stamp(), "servers": {}})
        meta.with_(**updates).write(path)

    def record_server(self, config: str, entry: JsonObject) -> None:
        meta = SuiteMeta.read_or_none(self._meta_path())
        servers = dict(meta.servers) if meta is not None else {}
        servers[config] = entry
        self._write_meta(servers=servers)

    def record_warmup(self, config: str, warm: StageWarmup) -> None:
        meta = SuiteMeta.read_or_none(self._meta_path())
        warmups = dict((meta.stage_warmup if meta is not None else None) or {})
        warmups[config] = warm.to_json()
        self._write_meta(stage_warmup=warmups)

    # -- the server -------------------------------------------------------------------------
    def config_name(self, config: str) -> str:
        return config

    def server_flags(self, config: str) -> tuple[list[str], list[str] | None]:
        return self.plan.server_flags.get(config, []), self.plan.declared_flags.get(config)

    def stage_load(self, config: str) -> StageLoad | None:
        """The warm-up of a (re)started server: rounds at the heaviest load the run will put on it (its top rate,
        gated only: its batch), each a cell run of its own; the rounds go to ``suite.json``."""
        p = self.plan
        top = p.top_stage(config)
        if p.stage_warmup <= 0 or top is None:
            return None
        unit = "req/s" if arms.arm(top.arm).open_loop else "streams at once"

        def one_round(k: int, out: Path, seed: int) -> RoundRun:
            run = replace(self.locust_run(top, out), n=p.stage_warmup, warmup=0, seed=seed, prometheus_url=None)
            # aside_root None: an earlier start's round warmed another engine, so it is removed
            done = self.server.run(CellSpec(run, f"stage warm-up of {config}"))
            if not done.ending.finished:
                raise SuiteError(done.failure())
            return RoundRun(read_records(out).records, round(done.seconds, 1))

        return StageLoad(
            p.seed, one_round, arm=top.arm, value=top.value, requests=p.stage_warmup, at=f"{top.value:g} {unit}"
        )

    # -- running ----------------------------------------------------------------------------
    def locust_run(self, cell: Cell, out: Path) -> LocustRun:
        p = self.plan
        stage = tuple(arms.arm(cell.arm).value_args(cell.value))
        return LocustRun(
            arm=cell.arm, host=self.controller.base_url, results=out, stage=stage, n=p.n, warmup=p.warmup,
            seed=p.seed, config_label=cell.config, processes=cell_processes(cell, p.processes, p.locust_args),
            ignore_eos=p.ignore_eos, prometheus_url=self.prometheus_url, realtime=p.realtime,
            extra=(*(("--prompts", cell.prompts) if cell.prompts != DEFAULT_PROMPTS else ()), *p.locust_args),
        )  # fmt: skip

    def measure(self, cell: Cell, index: int, total: int) -> StageSummary:
        """Run one pending cell on its configuration's server; its summary, or :class:`SuiteError`."""
        out = self.root / cell.name
        self.serve(cell.config)
        processes = cell_processes(cell, self.plan.processes, self.plan.locust_args)
        how = " (auto)" if self.plan.processes == 0 else ""
        self.log(f"[suite] cell {index}/{total}: {cell.name}, {processes} load process(es){how}")

        def echo(line: str) -> None:
            if "tailgate" in line:
                self.log("    " + line.split("tailgate: ", 1)[-1])

        spec = CellSpec(self.locust_run(cell, out), f"cell {cell.name}", aside_root=self.root)
        done = self.server.run(spec, on_line=echo, kept=True)
        summary = next((s for s in done.summaries if s.stage_label == cell.stage_label), None)
        # failed requests are data (error records): the cell counts as done whenever its run finished and
        # wrote its summary, complete or not (a lost load process: exit 4, combined into the suite's own)
        if not done.complete or summary is None or done.meta is None or not done.meta.completed:
            if done.meta is not None:
                end_run_meta(done.meta, out / RUN_META, done.ending.describe(), RunStatus.FAILED)
            raise SuiteError(done.failure())
        self.exit_codes.append(done.ending.code)
        merged = summary.client_coalesced_streams or 0
        behind = f"; CLIENT BEHIND: {merged} merged stream(s), gaps show the client" if merged_breached(merged) else ""
        self.log(f"[suite] {cell.name} done in {done.seconds:.0f} s{behind}")
        return summary

    def policies(self) -> tuple[KneeRamp[Cell], FixedCells[Cell]]:
        """The order of the cells: the chunked ramp first (extended and stopped by its knee), then the rest."""
        p = self.plan
        cells = p.fixed_cells()

        def on_ramp(c: Cell) -> bool:
            return engine_default(c.config) and c.arm == CONTINUOUS.name and c.prompts == p.prompts[0]

        ramp = KneeRamp(
            [c for c in cells if on_ramp(c)], lambda c: c.value,
            lambda rate: Cell(DEFAULT.name, CONTINUOUS.name, rate, p.prompts[0]),
            until_knee=p.until_knee, factor=p.knee_factor, max_rate=p.max_rate,
        )  # fmt: skip
        return ramp, FixedCells([c for c in cells if not on_ramp(c)])

    def run(self) -> list[Cell]:
        """Run every pending cell; return the cells that exist when done."""
        p = self.plan
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_meta(
            started=utc_stamp(), plan=asdict(p), prometheus_url=self.prometheus_url, **self.extra_metadata,
            status="running", exit_code=None, ended=None, end_detail=None,
        )  # fmt: skip
        ramp, rest = self.policies()
        planned = len(p.fixed_cells())
        done_cells: list[Cell] = []

        def measured(cell: Cell) -> StageSummary:
            index, total = len(done_cells) + 1, planned + ramp.added
            summary = load_summary(self.root, cell) if cell_done(self.root, cell) else None
            if summary is not None:
                self.log(f"[suite] cell {index}/{total}: {cell.name} already done, skipped")
            else:
                summary = self.measure(cell, index, total)
            done_cells.append(cell)
            return summary

        drive(ramp, measured)
        if ramp.knee is not None:
            self.knee = ramp.knee
            self.log(f"[suite] the tail knees: {ramp.knee}; ramp stops")
        drive(rest, measured)
        meta = SuiteMeta.read_or_none(self._meta_path())
        earlier = list(meta.cells or []) if meta is not None else []
        names = [*earlier, *(c.name for c in done_cells if c.name not in earlier)]
        self._write_meta(cells=names, knee=self.knee)
        return done_cells

    def finish(self, status: str, exit_code: int, detail: str | None = None) -> None:
        """Record in suite.json how the suite ended (completed, interrupted, failed) and its exit code."""
        if not self._meta_path().exists():
            return
        self._write_meta(status=status, exit_code=exit_code, ended=utc_stamp(), end_detail=detail)


class SuiteError(RuntimeError):
    pass


def gpu_facts() -> GpuFacts | None:
    """GPU name and driver from ``nvidia-smi`` when there is one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [dict(zip(("name", "driver", "memory"), (x.strip() for x in line.split(",")), strict=False))
            for line in out.splitlines() if line.strip()]  # fmt: skip
    return GpuFacts(gpus=gpus)


def host_facts() -> JsonObject:
    """``environment`` of ``suite.json`` and ``slo.json``, as :class:`tailgate.runmeta.HostFacts` reads it back."""
    import platform
    from importlib import metadata

    try:
        # never `import locust` here: importing it monkey-patches this process with gevent, and the
        # suite's signal handling and child processes would then run inside gevent's hub
        locust_version = metadata.version("locust")
    except metadata.PackageNotFoundError:
        locust_version = None
    return HostFacts(
        host=platform.node(), python=platform.python_version(), locust=locust_version,
        tailgate=tailgate.__version__, cpus=os.cpu_count(), gpu=gpu_facts(), argv=redact_argv(sys.argv),
    ).to_dict()  # fmt: skip


__all__ = ["Cell", "Suite", "SuiteError", "SuitePlan", "cell_done"]
