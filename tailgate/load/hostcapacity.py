"""How many chunks per second one load process, and one ground-truth worker, are given on this host.

``--processes auto`` and the self-check's ``--truth-workers auto`` divide an expected chunk rate by these
capacities. Each is a share of one core divided by the CPU a chunk costs, and the CPU a chunk costs is
measured on this host by a short calibration (:mod:`tailgate.verify.calibrate`, 2-3 s), cached in
``$TAILGATE_HOME/calibration.json`` (``~/.cache/tailgate``) under a key of the CPU model, the core count,
Python's, tailgate's and gevent's versions, and a hash of the read path's and the server's source. A key that
differs (another host, an upgrade, a changed read path) measures again.

The rules that turn a measurement into a capacity (measured on the 16-core host,
``benchmarks/results/cpu-per-chunk-h200-hubreads/``, ``benchmarks/results/stamp-matrix-h200/``):

- A whole load process spends :data:`PROCESS_OVER_READ_PATH` times the read path's CPU per chunk: 1.7-2.35 times
  in the self-check's scale ramp there (41-51 us against a calibrated 19-27 us; the dispatcher, the records and
  Locust's events come on top of the reads), so the largest ratio seen, 2.3.
- With kernel or recv stamps a process is given **0.4 of a core** (:data:`CORE_SHARE_BY_STAMP`): its reads must
  be on time. In the scale ramp, processes at 0.41-0.44 of a core were exact (250 and 500 req/s), at 0.46 15
  streams of 100,000 merged (1,000 req/s), at 0.57 615 of 7,500 (250 req/s on two processes)
  (``benchmarks/results/scale-host-h200/``).
- With capture stamps the load process and its capture process together spend :data:`CAPTURE_OVER_KERNEL`
  times as much (+33% at 200 req/s), and are given **three quarters of a core**: the stamps no longer depend on
  reading on time, and the pair measured exactly at 40,000 chunks/s there (0.92 of a core).
- A ground-truth worker is given **half a core** (:data:`TRUTH_CORE_SHARE`) of its own CPU per chunk, so its
  writes do not queue behind each other.

When the calibration cannot run (``TAILGATE_CALIBRATION=off``, or it failed), the capacities fall back to
constants measured on the 16-core host (:data:`FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP`,
:data:`FALLBACK_CHUNKS_PER_TRUTH_WORKER`), and :meth:`HostCapacity.describe` says so.

Free of gevent and Locust: the commands that size their runs import it, and the measurement runs in a child.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from tailgate.jsontypes import JsonMapping, JsonObject, as_object, json_float

CALIBRATION_FILE = "calibration.json"
CALIBRATION_ENV = "TAILGATE_CALIBRATION"
"""``off`` (or ``table``): never calibrate, use the fallback constants."""
CALIBRATION_TIMEOUT_S = 120.0

PROCESS_OVER_READ_PATH = 2.3
"""A whole load process's CPU per chunk over its read path's (at most 2.35 in the 16-core host's scale ramp)."""
CAPTURE_OVER_KERNEL = 1.33
"""Load process plus capture process over the load process alone, with capture stamps (+33% at 200 req/s)."""
CORE_SHARE_BY_STAMP: dict[str, float] = {"kernel": 0.4, "recv": 0.4, "capture": 0.75}
"""The share of one core a load process is given, per stamp source (module docstring: why)."""
TRUTH_CORE_SHARE = 0.5
"""The share of one core a ground-truth worker is given."""

FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP: dict[str, float] = {"kernel": 15000.0, "recv": 15000.0, "capture": 20000.0}
"""Used only when the calibration cannot run. Kernel and recv: on the 16-core host one process timed 25,000
chunks/s (250 req/s of 100-chunk streams) within 0.01 ms at p99 in each of three runs, at about 33 us of CPU
per chunk (``benchmarks/results/stall-h200.md``); 15,000 is half a core of that. Capture: one process measured
exactly at 40,000 chunks/s, about 38 us a chunk with its capture process; half of it. ``recv`` was not measured
apart from ``kernel``."""
FALLBACK_CHUNKS_PER_TRUTH_WORKER = 40000.0
"""Used only when the calibration cannot run: the 16-core host's one-loop server filled its core at about
100,000 chunks/s and fell behind (issue #43), so at least 10 us a chunk; 40,000 is under half a core of that."""

_CALIBRATED_SOURCES = (
    "tailgate/load/client.py", "tailgate/load/reads.py", "tailgate/load/sse.py", "tailgate/load/rxstamp.py",
    "tailgate/verify/calibrate.py", "tailgate/verify/groundtruth/stream.py", "tailgate/verify/groundtruth/timers.py",
)  # fmt: skip
"""Whose change makes a cached calibration stale."""
_ROOT = Path(__file__).resolve().parents[2]


def calibration_path() -> Path:
    home = os.environ.get("TAILGATE_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "tailgate") / CALIBRATION_FILE


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


class HostKey(TypedDict, total=False):
    """What a calibration holds for (:func:`host_key`): another value of any of these measures again. Empty
    (every key being optional) where no key was taken: the calibration is off."""

    cpu_model: str
    cores: int | None
    python: str
    tailgate: str
    gevent: str
    code: str


def host_key() -> HostKey:
    """This host's and this code's :class:`HostKey`."""
    import tailgate

    digest = hashlib.sha1()
    for rel in _CALIBRATED_SOURCES:
        path = _ROOT / rel
        digest.update(path.read_bytes() if path.exists() else rel.encode())
    return HostKey(
        cpu_model=_cpu_model(),
        cores=os.cpu_count(),
        python=platform.python_version(),
        tailgate=tailgate.__version__,
        gevent=_version("gevent"),
        code=digest.hexdigest()[:12],
    )


@dataclass(frozen=True)
class HostCapacity:
    """This host's CPU per chunk (None: not measured) and what it gives a load process and a truth worker."""

    read_us_per_chunk: float | None = None
    server_us_per_chunk: float | None = None
    source: str = "table"
    """``measured`` (now), ``cached`` (an earlier measurement of this key) or ``table`` (the fallback)."""
    note: str = ""
    key: HostKey = field(default_factory=lambda: HostKey())
    measured: JsonMapping = field(default_factory=dict)
    """The calibration's whole answer (workload, seconds), kept as it came to be written back."""

    def per_process(self, stamp: str = "kernel") -> float:
        """Chunks per second one load process is given with this stamp source (``kernel``'s when unknown)."""
        stamp = stamp if stamp in CORE_SHARE_BY_STAMP else "kernel"
        if not self.read_us_per_chunk:
            return FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP[stamp]
        us = self.read_us_per_chunk * PROCESS_OVER_READ_PATH * (CAPTURE_OVER_KERNEL if stamp == "capture" else 1.0)
        return CORE_SHARE_BY_STAMP[stamp] * 1e6 / us

    def per_truth_worker(self) -> float:
        """Chunks per second one ground-truth worker is given."""
        if not self.server_us_per_chunk:
            return FALLBACK_CHUNKS_PER_TRUTH_WORKER
        return TRUTH_CORE_SHARE * 1e6 / self.server_us_per_chunk

    def describe(self) -> JsonObject:
        return {
            **asdict(self),
            "chunks_per_process": {s: round(self.per_process(s)) for s in CORE_SHARE_BY_STAMP},
            "chunks_per_truth_worker": round(self.per_truth_worker()),
        }

    def line(self) -> str:
        """One line for a console: where the capacities come from."""
        per = f"{self.per_process('kernel'):,.0f} chunks/s per load process (kernel stamps)"
        if self.source == "table":
            return f"capacity from the 16-core host's table ({self.note}): {per}"
        return (
            f"capacity from this host's calibration ({self.source}): load path {self.read_us_per_chunk:g} us and "
            f"ground-truth server {self.server_us_per_chunk:g} us of CPU per chunk: {per}"
        )


_memo: tuple[Path, HostCapacity] | None = None
"""The answer this process already has, and the cache file it is for."""


def _read_cache(key: HostKey) -> HostCapacity | None:
    try:
        doc = json.loads(calibration_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key:
        return None
    m = doc.get("measured")
    if not isinstance(m, dict):
        return None
    read, server = m.get("read_us_per_chunk"), m.get("server_us_per_chunk")
    if not (isinstance(read, int | float) and read > 0 and isinstance(server, int | float) and server > 0):
        return None
    return HostCapacity(float(read), float(server), "cached", f"measured {doc.get('at', '?')}", key, m)


def _write_cache(key: HostKey, measured: JsonMapping) -> None:
    import time

    path = calibration_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        tmp.write_text(json.dumps({"key": key, "measured": measured, "at": at}, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the next command measures again


def _measure(log: Callable[[str], None]) -> JsonMapping:
    """Run the calibration in a fresh interpreter (gevent patches it); its JSON answer, which holds both CPU
    costs per chunk, or raise RuntimeError."""
    log(f"[tailgate] calibrating this host once (a few seconds): CPU per chunk of the load path and the ground-truth "
        f"server, cached in {calibration_path()}")  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        done = subprocess.run([sys.executable, "-m", "tailgate.verify.calibrate"], capture_output=True, text=True,
                              timeout=CALIBRATION_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"the calibration did not finish: {e}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the calibration failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    try:
        answer = as_object(json.loads(lines[-1]))
        json_float(answer, "read_us_per_chunk")
        json_float(answer, "server_us_per_chunk")
        return answer
    except ValueError:
        raise RuntimeError(f"the calibration answered {lines[-1][:200]!r}") from None


def host_capacity(measure: bool = True, log: Callable[[str], None] | None = None) -> HostCapacity:
    """This host's capacities: cached, else measured now (``measure``), else the fallback table.

    ``measure=False`` never starts the calibration (a load process at the end of a stage uses it)."""
    global _memo
    if os.environ.get(CALIBRATION_ENV, "").strip().lower() in ("off", "table", "0", "no"):
        return HostCapacity(note=f"{CALIBRATION_ENV}=off")
    key = host_key()
    if _memo is not None and _memo[0] == calibration_path() and _memo[1].key == key:
        return _memo[1]
    found = _read_cache(key)
    if found is None and not measure:
        return HostCapacity(note="this host is not calibrated yet", key=key)
    if found is None:
        say = log or (lambda line: print(line, file=sys.stderr, flush=True))
        try:
            measured = _measure(say)
        except RuntimeError as e:
            say(f"[tailgate] {e}; sizing from the 16-core host's table")
            _memo = (calibration_path(), HostCapacity(note=str(e), key=key))
            return _memo[1]
        _write_cache(key, measured)
        found = HostCapacity(json_float(measured, "read_us_per_chunk"), json_float(measured, "server_us_per_chunk"),
                             "measured", "measured now", key, measured)  # fmt: skip
    _memo = (calibration_path(), found)
    return found


def forget() -> None:
    """Drop the in-process memo (tests that move ``TAILGATE_HOME``)."""
    global _memo
    _memo = None


__all__ = [
    "CALIBRATION_ENV", "CORE_SHARE_BY_STAMP", "FALLBACK_CHUNKS_PER_PROCESS_BY_STAMP",
    "FALLBACK_CHUNKS_PER_TRUTH_WORKER", "HostCapacity", "calibration_path", "forget", "host_capacity", "host_key",
]  # fmt: skip
