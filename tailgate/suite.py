"""The whole experiment in one command: every cell, server restarts between arms, the report.

A cell is one Locust run (one arm, one rate or batch size, one server configuration) in its own
folder. Cells run in an order that needs the fewest server restarts: the engine default
(chunked prefill on) for the rate ramp and the gated arm, then chunked prefill off, then a
small KV pool that forces preemption. A finished cell has ``run.json`` with status
``completed``; re-running the same command skips it, so an interrupted suite resumes.

Standard library only: Locust runs as a child process, exactly as a user would start it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tailgate
from tailgate import locustfiles
from tailgate.lifecycle import deferred, stop_process_tree
from tailgate.load.plan import rate_label
from tailgate.load.processes import auto_processes, master_port_args
from tailgate.load.workload import SEED_MIX
from tailgate.servers import CHUNKED_OFF_FLAG
from tailgate.servers.base import redact_argv

Log = Callable[[str], None]

CONFIG_ORDER = ("chunked", "nochunk", "preempt")


GATED_STREAM_CHUNKS_PER_S = 100.0
"""Chunks per second one stream of a gated batch is assumed to receive (a fast GPU's decode rate), for
``--processes auto``."""


def mean_output_tokens() -> float:
    """Expected max_tokens of one request of the seeded mix: the chunks one arrival brings."""
    mean, low = 0.0, 0.0
    for cumulative, _, out in SEED_MIX:
        mean += (cumulative - low) * out
        low = cumulative
    return mean


def cell_processes(cell: Cell, processes: int) -> int:
    """Load processes for one cell: as asked, or for ``auto`` (0) from the cores and the cell's expected
    chunk rate (arrivals per second x chunks per arrival; a gated batch streams all at once)."""
    if processes > 0:
        return processes
    if cell.arm == "gated":
        chunks = cell.value * GATED_STREAM_CHUNKS_PER_S
    else:
        chunks = cell.value * mean_output_tokens()
    return auto_processes(chunks)


@dataclass(frozen=True)
class Cell:
    config: str
    arm: str
    value: float
    """Arrival rate (continuous) or batch size (gated)."""

    @property
    def name(self) -> str:
        if self.arm == "gated":
            return f"{self.config}_gated_b{int(self.value)}"
        return f"{self.config}_cont_r{rate_label(self.value)}"

    @property
    def stage_label(self) -> str:
        return f"gated_b{int(self.value)}" if self.arm == "gated" else f"cont_r{rate_label(self.value)}"


@dataclass
class SuitePlan:
    rates: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0)
    until_knee: bool = False
    knee_factor: float = 2.0
    max_rate: float = 320.0
    batch_size: int = 16
    gated: bool = True
    nochunk_rates: tuple[float, ...] = (5.0, 10.0)
    preempt_rate: float | None = 10.0
    n: int = 500
    warmup: int = 25
    seed: int = 7
    ignore_eos: bool = False
    processes: int = 1
    """Load processes per cell; 0 = auto (:func:`cell_processes`)."""
    server_flags: dict[str, list[str]] = field(
        default_factory=lambda: {"chunked": [], "nochunk": [CHUNKED_OFF_FLAG], "preempt": []}
    )
    locust_args: list[str] = field(default_factory=list)
    """Passed through to every Locust run (e.g. --request-timeout, --trace-file)."""
    declared_flags: dict[str, list[str]] = field(default_factory=dict)
    """Flags the user stated for a server the suite does not start (recorded, not applied)."""
    configs: tuple[str, ...] = CONFIG_ORDER
    """Server configurations to run now (a server nobody can restart runs one at a time)."""
    realtime: bool = False
    """Load processes at SCHED_FIFO where allowed: set when the server shares this machine's cores."""

    def fixed_cells(self) -> list[Cell]:
        cells = [Cell("chunked", "continuous", r) for r in self.rates]
        if self.gated:
            cells.append(Cell("chunked", "gated", float(self.batch_size)))
        cells += [Cell("nochunk", "continuous", r) for r in self.nochunk_rates]
        if self.preempt_rate:
            cells.append(Cell("preempt", "continuous", self.preempt_rate))
        return [c for c in cells if c.config in self.configs]


def cell_done(root: Path, cell: Cell) -> bool:
    meta = root / cell.name / "run.json"
    try:
        return (
            json.loads(meta.read_text()).get("status") == "completed"
            and (root / cell.name / f"summary-{cell.stage_label}.json").exists()
        )
    except (OSError, ValueError):
        return False


def load_summary(root: Path, cell: Cell) -> dict[str, Any] | None:
    try:
        return json.loads((root / cell.name / f"summary-{cell.stage_label}.json").read_text())
    except (OSError, ValueError):
        return None


def kneed(previous: dict[str, Any] | None, current: dict[str, Any], factor: float) -> str | None:
    """Why the ramp should stop here, or None: errors, or a tail that grew past ``factor``."""
    if current.get("errors"):
        return f"{current['errors']} errors at {current['rate_or_batch']} req/s"
    if previous is None:
        return None
    for key in ("ttft_p99", "gap_p99"):
        before, now = previous.get(key), current.get(key)
        if before and now and now > factor * before:
            return f"{key} grew x{now / before:.1f} ({before} -> {now} ms) at {current['rate_or_batch']} req/s"
    return None


class Suite:
    """Runs the plan against one server, restarting it between configurations."""

    def __init__(
        self,
        plan: SuitePlan,
        controller: Any,
        root: Path,
        *,
        prometheus_url: str | None = None,
        log: Log = print,
        extra_metadata: dict[str, Any] | None = None,
        child_env: dict[str, str] | None = None,
    ) -> None:
        self.plan = plan
        self.controller = controller
        self.root = root
        self.prometheus_url = prometheus_url
        self.log = log
        self.extra_metadata = extra_metadata or {}
        self.child_env = dict(child_env or {})
        """Added to every Locust child's environment: the only way a secret (the API key) reaches it."""
        self._child: subprocess.Popen[str] | None = None
        self._config_running: str | None = None
        self._current_cell: Path | None = None
        self.knee: str | None = None

    # -- metadata ---------------------------------------------------------------------------
    def _meta_path(self) -> Path:
        return self.root / "suite.json"

    def _write_meta(self, **updates: Any) -> None:
        path = self._meta_path()
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError):
            meta = {"created": _iso(time.time()), "servers": {}}
        meta.update(updates)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        tmp.replace(path)

    # -- running ----------------------------------------------------------------------------
    def _ensure_server(self, config: str) -> None:
        if self._config_running == config:
            return
        flags: list[str] | None = self.plan.server_flags.get(config, [])
        entry: dict[str, Any] = {}
        if not getattr(self.controller, "restarts", True):
            self.log(f"[suite] server configuration '{config}': using the server as it runs (started elsewhere)")
            declared = list(self.plan.declared_flags.get(config, []))
            # nobody here applied them: they are the user's statement, kept apart from applied flags
            entry["declared_flags"] = declared or None
            flags = None
        elif getattr(self.controller, "flags_in_files", False):
            self.log(f"[suite] server configuration '{config}': re-creating the service from its compose files")
            flags = None  # the command is the compose files' own; describe() reads it from the container
        elif not getattr(self.controller, "applies_flags", True):
            self.log(f"[suite] server configuration '{config}': asking for a restart")
            entry["requested_flags"] = flags  # someone else applies them; the suite cannot confirm it
            flags = None
        else:
            self.log(f"[suite] server configuration '{config}': restarting with {' '.join(flags) or 'default flags'}")
        t0 = time.monotonic()
        if hasattr(self.controller, "use_config"):
            self.controller.use_config(config)
        self.controller.restart(entry.get("requested_flags", flags))
        self.controller.wait_healthy()
        self.log(f"[suite] server healthy after {time.monotonic() - t0:.0f} s")
        self._config_running = config
        describe = self.controller.describe()
        meta = json.loads(self._meta_path().read_text()) if self._meta_path().exists() else {}
        servers = meta.get("servers", {})
        servers[config] = {"flags": flags, **entry, **describe}
        self._write_meta(servers=servers)

    def _locust_command(self, cell: Cell, out: Path) -> list[str]:
        p = self.plan
        locustfile = Path(locustfiles.__file__).with_name("gated.py" if cell.arm == "gated" else "continuous.py")
        cmd = [
            sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
            "--host", self.controller.base_url, "--results-dir", str(out), "--config-label", cell.config,
            "--n", str(p.n), "--warmup", str(p.warmup), "--seed", str(p.seed),
        ]  # fmt: skip
        if cell.arm == "gated":
            cmd += ["--batch-size", str(int(cell.value))]
        else:
            cmd += ["--rates", f"{cell.value:g}"]
        if p.ignore_eos:
            cmd.append("--ignore-eos")
        if self.prometheus_url:
            cmd += ["--prometheus-url", self.prometheus_url]
        processes = cell_processes(cell, p.processes)
        if processes > 1:
            # a free master port: Locust's default (5557) makes two runs on one host cross-connect
            cmd += ["--processes", str(processes), *master_port_args()]
        if p.realtime:
            cmd.append("--realtime")
        return cmd + list(p.locust_args)

    def run_cell(self, cell: Cell, index: int, total: int) -> dict[str, Any]:
        out = self.root / cell.name
        if out.exists():  # an interrupted attempt: keep it aside, never mix its records in
            aside = self.root / ".incomplete" / f"{cell.name}-{int(time.time())}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(out), str(aside))
        self._ensure_server(cell.config)
        self.log(f"[suite] cell {index}/{total}: {cell.name}")
        cmd = self._locust_command(cell, out)
        t0 = time.monotonic()
        self._current_cell = out
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.child_env}
        # its own session: a Ctrl-C in the terminal reaches the suite alone, which stops Locust exactly
        # once (interrupt()); deferred() makes sure no child exists without self._child naming it
        with deferred():
            self._child = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                bufsize=1, env=env, start_new_session=True,
            )  # fmt: skip
        tail: list[str] = []
        assert self._child.stdout is not None
        for line in self._child.stdout:
            line = line.rstrip("\n")
            tail = [*tail[-39:], line]
            if "tailgate" in line:
                self.log("    " + line.split("tailgate: ", 1)[-1])
        code = self._child.wait()
        self._child.stdout.close()
        self._child = None
        self._current_cell = None
        summary = load_summary(self.root, cell)
        # Locust exits 1 when any request failed; failed requests are data (error records), so the
        # cell counts as done whenever the run completed and wrote its summary
        if code not in (0, 1) or summary is None or not cell_done(self.root, cell):
            mark_run_ended(out / "run.json", f"locust exit {code}", status="failed")
            detail = "\n".join(tail[-15:])
            raise SuiteError(f"cell {cell.name} failed (locust exit {code}); last output:\n{detail}")
        self.log(f"[suite] {cell.name} done in {time.monotonic() - t0:.0f} s")
        return summary

    def run(self) -> list[Cell]:
        """Run every pending cell; return the cells that exist when done."""
        p = self.plan
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_meta(
            started=_iso(time.time()), plan=asdict(p), prometheus_url=self.prometheus_url, **self.extra_metadata,
            status="running", exit_code=None, ended=None, end_detail=None,
        )  # fmt: skip
        cells = p.fixed_cells()
        done_cells: list[Cell] = []
        total = len(cells)
        index = 0
        # the chunked ramp first, deciding as it goes whether to extend it
        previous: dict[str, Any] | None = None
        ramp = [c for c in cells if c.config == "chunked" and c.arm == "continuous"]
        rate = ramp[-1].value if ramp else 0.0
        while ramp:
            cell = ramp.pop(0)
            index += 1
            if cell_done(self.root, cell):
                self.log(f"[suite] cell {index}/{total}: {cell.name} already done, skipped")
                summary = load_summary(self.root, cell)
            else:
                summary = self.run_cell(cell, index, total)
            done_cells.append(cell)
            assert summary is not None
            why = kneed(previous, summary, p.knee_factor)
            previous = summary
            if why and p.until_knee:
                self.knee = why
                self.log(f"[suite] the tail knees: {why}; ramp stops")
                break
            if not ramp and p.until_knee and rate * 2 <= p.max_rate:
                rate *= 2
                ramp.append(Cell("chunked", "continuous", rate))
                total += 1
        for cell in cells:
            if cell.config == "chunked" and cell.arm == "continuous":
                continue
            index += 1
            if cell_done(self.root, cell):
                self.log(f"[suite] cell {index}/{total}: {cell.name} already done, skipped")
            else:
                self.run_cell(cell, index, total)
            done_cells.append(cell)
        try:
            earlier = json.loads(self._meta_path().read_text()).get("cells", [])
        except (OSError, ValueError):
            earlier = []
        names = [*earlier, *(c.name for c in done_cells if c.name not in earlier)]
        self._write_meta(cells=names, knee=self.knee)
        return done_cells

    def interrupt(self, why: str = "interrupted") -> None:
        """Stop the Locust child and all its processes; say in its run.json how it ended.

        SIGINT first: Locust writes the requests in flight as ``cancelled`` records. A run.json
        Locust had no time to finish still says ``running``; it is rewritten to ``interrupted`` so
        no folder claims a run that is still going.
        """
        child = self._child
        if child is None:
            return
        # keep reading its output while it shuts down: Locust prints its final statistics, and a full
        # pipe would block it until the SIGKILL
        drain = threading.Thread(target=_drain, args=(child.stdout,), daemon=True)
        drain.start()
        killed = stop_process_tree(child, first=signal.SIGINT, grace_s=20.0)
        drain.join(timeout=5)
        if killed:
            self.log(f"[suite] Locust did not stop on SIGINT; killed {len(killed)} process(es)")
        self._child = None
        cell_dir = self._current_cell
        if cell_dir is not None:
            mark_run_ended(cell_dir / "run.json", why)

    def finish(self, status: str, exit_code: int, detail: str | None = None) -> None:
        """Record in suite.json how the suite ended (completed, interrupted, failed) and its exit code."""
        if not self._meta_path().exists():
            return
        self._write_meta(status=status, exit_code=exit_code, ended=_iso(time.time()), end_detail=detail)


def _drain(stream: Any) -> None:
    """Read a pipe to its end, discarding; closes it."""
    if stream is None:
        return
    try:
        for _ in stream:
            pass
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def mark_run_ended(path: Path, why: str, status: str = "interrupted") -> None:
    """Rewrite a run.json left at ``running`` (its Locust was stopped before it could) to ``status``."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if meta.get("status") != "running":
        return
    meta.update({"status": status, "ended": meta.get("ended") or _iso(time.time()), "ended_by": why})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n")
    tmp.replace(path)


class SuiteError(RuntimeError):
    pass


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def gpu_facts() -> dict[str, Any] | None:
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
    return {"gpus": gpus}


def host_facts() -> dict[str, Any]:
    import platform
    from importlib import metadata

    try:
        # never `import locust` here: importing it monkey-patches this process with gevent, and the
        # suite's signal handling and child processes would then run inside gevent's hub
        locust_version = metadata.version("locust")
    except metadata.PackageNotFoundError:
        locust_version = None
    return {
        "host": platform.node(), "python": platform.python_version(), "locust": locust_version,
        "tailgate": tailgate.__version__, "cpus": os.cpu_count(), "gpu": gpu_facts(),
        "argv": redact_argv(sys.argv),
    }  # fmt: skip


__all__ = ["Cell", "Suite", "SuiteError", "SuitePlan", "cell_done", "kneed"]
