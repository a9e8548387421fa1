"""What AIPerf, GuideLLM and ``tailgate slo`` each answer for "the highest rate this server sustains under the SLO",
on servers whose true capacity is known.

The servers are the queueing shapes of ``benchmarks/slo_coverage.py`` (``--shape slots4`` or ``slots8``): the
ground-truth server's simulated engine run in real time, so the true capacity under the SLO (e.g. TTFT p99 <=
1000 ms) comes from :func:`slo_coverage.pooled_truth`, long simulations of the same engine, not from any tool. Every
tool sends the project's reference mix (70% 200 -> 100 tokens, 20% 1000 -> 300, 10% 6000 -> 600, the seeded trace
of :func:`tailgate.load.workload.make_trace`) as ``"ocean "`` prompts, which the server counts one token per word,
with ``max_tokens`` the output length; the server's own token counters, read before and after each run, show what
it was sent. Each tool then gives its own answer, the way a user would read it:

- ``tailgate slo`` end to end through Locust, as ``slo_coverage.e2e`` runs it (20-minute probing budget): the
  measured bracket [highest pass, lowest fail] and the fitted step-loop estimate with its interval;
- AIPerf (its own venv): its SLA search over request rate (see :func:`run_aiperf` for which of its features, and
  why), the answer being the search's boundary;
- GuideLLM (its own venv): its default ``--profile sweep`` (synchronous, throughput, then Poisson rates between),
  the answer being the highest measured rate whose TTFT p99 meets the limit; ``guidellm-1w`` repeats it with one
  worker process, since its workers seed their Poisson generators alike and arrive in bursts.

Per tool it records the answer, its error against the truth, the uncertainty the tool states (if any), wall time
and the exact command line, in ``benchmarks/results/slo-peers-<shape>.json`` (tools run separately merge into it),
and rewrites ``benchmarks/results/slo-peers.md`` from every shape's file. One tool runs at a time, each under a
wall-clock cap (``--cap-min``).

Setup: the peers' venvs are made on first use (``python -m venv`` + ``pip install aiperf`` / ``guidellm`` under
``~/.cache/tailgate/peers``); the tokenizer they need is the project's word-level one in ``~/.cache/tailgate/
tiny-model`` (``tailgate/servers/tinymodel.py``), so nothing is downloaded beyond PyPI.

Run: ``python benchmarks/slo_peers.py --shape slots4 [--tools ours,aiperf,guidellm,guidellm-1w] [--cap-min 25]``;
``--report-only`` rewrites the markdown from the JSON files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from slo_coverage import SHAPES, pooled_truth  # noqa: E402

from tailgate import slo  # noqa: E402
from tailgate.load.workload import build_prompt, make_trace  # noqa: E402
from tailgate.verify.groundtruth import start_server_process  # noqa: E402
from tailgate.verify.groundtruth.engine import EngineModel  # noqa: E402
from tailgate.verify.groundtruth.process import ServerProcess  # noqa: E402

ROOT = HERE.parent
RESULTS = HERE / "results"
CACHE = Path.home() / ".cache" / "tailgate"
PEERS = CACHE / "peers"
TOKENIZER = CACHE / "tiny-model"
MODEL = "ground-truth"
TOOLS = ("ours", "aiperf", "guidellm", "guidellm-1w")
TRACE_SEED = 7


# ------------------------------------------------------------------------------------------- shared


def venv_exe(package: str, exe: str) -> Path:
    """The peer's entry point in its own venv, made on first use: its dependencies must not touch ours."""
    venv = PEERS / f"{package}-venv"
    path = venv / "bin" / exe
    if not path.exists():
        PEERS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=True)
    return path


def version_of(package: str) -> str | None:
    py = PEERS / f"{package}-venv" / "bin" / "python"
    if not py.exists():
        return None
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    return r.stdout.strip() or None


def server_counts(server: ServerProcess) -> dict[str, float]:
    """The server's own counters: what it was sent, whatever the tool believes it sent."""
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for key in ("prompt_tokens", "generation_tokens", "request_success"):
            if line.startswith(f"vllm:{key}_total{{"):
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


def sent_mix(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    n = after.get("request_success", 0) - before.get("request_success", 0)
    if n <= 0:
        return {"requests": 0, "mean_prompt_tokens": None, "mean_output_tokens": None}
    return {
        "requests": n,
        "mean_prompt_tokens": round((after["prompt_tokens"] - before["prompt_tokens"]) / n, 1),
        "mean_output_tokens": round((after["generation_tokens"] - before["generation_tokens"]) / n, 1),
    }


def run_capped(cmd: Sequence[str], *, cwd: Path, log: Path, cap_s: float, env: dict[str, str] | None = None) -> int:
    """Run a tool in its own process group; past the cap, SIGINT (tools write what they have), then SIGKILL."""
    with open(log, "w") as out:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            out.write(f"\n[slo_peers] wall-clock cap of {cap_s:.0f} s reached: interrupting\n")
            out.flush()
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return 124


def tail(log: Path, chars: int = 1500) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def trace_rows(count: int) -> list[tuple[int, int, str]]:
    """(prompt tokens, max tokens, prompt) of the seeded mix, in trace order."""
    return [(t.prompt_tokens, t.max_tokens, build_prompt(t.prompt_tokens)) for t in make_trace(count, TRACE_SEED)]


# ------------------------------------------------------------------------------------------- ours


def run_ours(server: ServerProcess, limit_ms: float, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``tailgate slo`` as ``slo_coverage.e2e`` drives it, with its defaults there."""
    cmd = [
        sys.executable, "-m", "tailgate.cli", "slo", "--server", "url", "--host", server.base_url,
        "--config", "engine", "--slo", f"ttft_p99<={limit_ms:g}ms", "--results", str(work / "slo"), "--no-report",
        "--start-rate", "2", "--max-rate", "64", "--resolution", "10%", "--duration", "75", "--n", "300",
        "--warmup", "25", "--seed", str(TRACE_SEED), "--max-probes", "30", "--reruns", "0",
        "--time-budget", f"{args.time_budget:g}", "--extend", "0", "--confidence", "0.95",
    ]  # fmt: skip
    row: dict[str, Any] = {
        "command": shlex.join(["tailgate", *cmd[3:]]).replace(server.base_url, "<server>").replace(str(work), "<work>")
    }
    rc = run_capped(cmd, cwd=ROOT, log=work / "ours.log", cap_s=args.cap_min * 60,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    row["exit"] = rc
    state_file = work / "slo" / "slo.json"
    if not state_file.exists():
        row["error"] = f"no slo.json (exit {rc}): {tail(work / 'ours.log')}"
        return row
    cfg = json.loads(state_file.read_text())["configs"][0]
    result = cfg.get("result") or {}
    fitted = result.get("fitted") or {}
    best, fail = result.get("best_rate"), result.get("first_fail_rate")
    row.update({
        "answer": best, "bracket": [best, fail], "status": result.get("status"),
        "probes": [(p["rate"], p["verdict"]) for p in cfg.get("probes", [])],
        "fitted_capacity": fitted.get("capacity"), "fitted_interval": fitted.get("interval"),
        "fitted_bracket": fitted.get("bracket"), "fitted_why": fitted.get("why"),
        "uncertainty": f"measured bracket [{best}, {fail}]"
                       + (f"; fitted {fitted.get('capacity'):.3f}, interval {fitted.get('interval')}"
                          if fitted.get("capacity") else ""),
    })  # fmt: skip
    return row


# ------------------------------------------------------------------------------------------- AIPerf


def run_aiperf(server: ServerProcess, limit_ms: float, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """AIPerf's own SLA search: ``--search-planner monotonic-sla`` over the Poisson request rate.

    AIPerf 0.13 has three ways to ask for a rate under an SLO: ``--goodput`` (one rate: the share of good
    requests, no search), its recipes (``max-concurrency-under-sla`` and the ``max-throughput-*-sla`` BO recipes,
    all over concurrency, not rate) and the adaptive search flags, whose ``monotonic-sla`` planner is its
    perf_analyzer-style SLA search: double the rate from ``lo`` until the SLA filter fails, then bisect until the
    bracket is within 5% or one apart (integer dimensions only, so the rate moves in whole req/s), each point
    confirmed by two agreeing runs (its ``monotonic_stability_trials`` default). Each run is
    ``--aiperf-duration`` seconds of Poisson arrivals of the mix, in file order."""
    rows = trace_rows(args.data_rows)
    data = work / "aiperf-data.jsonl"
    with open(data, "w") as f:
        for _, out, prompt in rows:
            f.write(json.dumps({"text": prompt, "output_length": out}) + "\n")
    exe = venv_exe("aiperf", "aiperf")
    art = work / "aiperf"
    cmd = [
        str(exe), "profile", "-m", MODEL, "--url", server.base_url, "--endpoint-type", "completions", "--streaming",
        "--tokenizer", str(TOKENIZER), "--input-file", str(data), "--custom-dataset-type", "single_turn",
        "--request-rate", "1", "--arrival-pattern", "poisson",
        "--benchmark-duration", f"{args.aiperf_duration:g}", "--benchmark-grace-period", "30",
        "--search-space", "rate:1,64:int", "--search-planner", "monotonic-sla",
        "--search-metric", "request_throughput", "--search-direction", "maximize", "--search-max-iterations", "20",
        "--search-sla", f"time_to_first_token:p99:le:{limit_ms:g}", "--artifact-dir", str(art), "--ui-type", "none",
    ]  # fmt: skip
    row: dict[str, Any] = {
        "command": shlex.join(["aiperf", *cmd[1:]]).replace(server.base_url, "<server>").replace(str(work), "<work>"),
        "version": version_of("aiperf"),
    }
    row["exit"] = run_capped(cmd, cwd=work, log=work / "aiperf.log", cap_s=args.cap_min * 60)
    hist_file = art / "search_history.json"
    if not hist_file.exists():
        runs = aiperf_runs(art / "search_checkpoint.json")
        return {**row, **aiperf_checkpoint(art / "search_checkpoint.json", limit_ms, row["exit"], work), "runs": runs}
    hist = json.loads(hist_file.read_text())
    summary = hist.get("boundary_summary") or {}
    best = (summary.get("feasible_max") or {}).get("value")
    fail = (summary.get("infeasible_min") or {}).get("value")
    iterations = [
        (next(iter(it["variation_values"].values())), it.get("feasible")) for it in hist.get("iterations", [])
    ]
    row.update({
        "answer": best, "bracket": [best, fail], "status": hist.get("convergence_reason"), "probes": iterations,
        "runs": aiperf_runs(art / "search_checkpoint.json"),
        "uncertainty": f"boundary [{best}, {fail}] (feasible_max, infeasible_min)",
    })  # fmt: skip
    return row


def aiperf_runs(path: Path) -> list[tuple[int, float | None, float | None]]:
    """(rate, TTFT p99 ms, requests) of every finished run, in order, from the search's checkpoint."""
    if not path.exists():
        return []
    out = []
    for it in json.loads(path.read_text()).get("iterations", []):
        rate = int(next(iter(it["variation_values"].values())))
        for r in it.get("results", []):
            m = r.get("summary_metrics") or {}
            out.append(
                (rate, (m.get("time_to_first_token") or {}).get("p99"), (m.get("request_count") or {}).get("avg"))
            )
    return out


def aiperf_checkpoint(path: Path, limit_ms: float, rc: int, work: Path) -> dict[str, Any]:
    """A search stopped by the cap leaves no history, only its checkpoint of finished runs: the bracket its
    planner had latched so far (a rate latches after two agreeing runs), marked as interrupted."""
    if not path.exists():
        return {"error": f"no search_history.json nor checkpoint (exit {rc}): {tail(work / 'aiperf.log')}"}
    verdicts: dict[int, list[bool]] = {}
    for rate, p99, _ in aiperf_runs(path):
        verdicts.setdefault(rate, []).append(p99 is not None and p99 <= limit_ms)
    passed = [r for r, v in verdicts.items() if len(v) >= 2 and all(v[-2:])]
    failed = [r for r, v in verdicts.items() if len(v) >= 2 and not any(v[-2:])]
    best, fail = max(passed, default=None), min(failed, default=None)
    return {
        "answer": best, "bracket": [best, fail], "status": f"interrupted by the cap (exit {rc})",
        "probes": sorted((r, v) for r, v in verdicts.items()),
        "uncertainty": f"interrupted; bracket latched so far [{best}, {fail}] (from its checkpoint)",
    }  # fmt: skip


# ------------------------------------------------------------------------------------------- GuideLLM


def run_guidellm(
    server: ServerProcess, limit_ms: float, work: Path, args: argparse.Namespace, workers: int | None = None
) -> dict[str, Any]:
    """GuideLLM's sweep: synchronous, throughput, then ``sweep_size - 2`` Poisson rates spaced evenly between the
    two measured rates, each ``--guidellm-seconds`` long; the answer is the highest of those rates whose TTFT p99
    meets the limit. GuideLLM 0.8's sweep defaults to constant-rate arrivals (``strategy_type=constant``), so the
    Poisson sweep is asked for by name."""
    name = "guidellm" if workers is None else f"guidellm-{workers}w"
    data = work / "guidellm-data.jsonl"
    with open(data, "w") as f:
        for p_tok, out, prompt in trace_rows(args.data_rows):
            f.write(json.dumps({"prompt": prompt, "prompt_tokens_count": p_tok, "output_tokens_count": out}) + "\n")
    exe = venv_exe("guidellm", "guidellm")
    out_file = work / f"{name}.json"
    cmd = [
        str(exe), "run",
        "--backend", f"kind=openai_http,target={server.base_url},model={MODEL},request_format=/v1/completions",
        "--profile", "kind=sweep,strategy_type=poisson",
        "--constraint", f"kind=max_duration,seconds={args.guidellm_seconds:g}",
        "--data", f"kind=json_file,path={data}", "--tokenizer", f"kind=huggingface_auto,model={TOKENIZER}",
        "--output", f"kind=json,path={out_file}", "--disable-console-interactive",
    ]  # fmt: skip
    env = dict(os.environ)
    prefix = ""
    if workers is not None:
        env["GUIDELLM__MAX_WORKER_PROCESSES"] = str(workers)
        prefix = f"GUIDELLM__MAX_WORKER_PROCESSES={workers} "
    row: dict[str, Any] = {
        "command": prefix + shlex.join(["guidellm", *cmd[1:]]).replace(server.base_url, "<server>")
        .replace(str(work), "<work>"),
        "version": version_of("guidellm"),
    }  # fmt: skip
    row["exit"] = run_capped(cmd, cwd=work, log=work / f"{name}.log", cap_s=args.cap_min * 60, env=env)
    if not out_file.exists():
        row["error"] = f"no result file (exit {row['exit']}): {tail(work / f'{name}.log')}"
        return row
    points = []
    for b in json.loads(out_file.read_text())["benchmarks"]:
        strat = b["config"]["strategy"]
        m = b["metrics"]
        ttft = m["time_to_first_token_ms"]["successful"]
        totals = m.get("request_totals") or {}
        points.append({
            "strategy": strat.get("type_"), "rate": strat.get("rate"), "workers": strat.get("worker_count"),
            "achieved": m["requests_per_second"]["successful"].get("mean"),
            "ttft_p99": (ttft.get("percentiles") or {}).get("p99"),
            "ttft_p99_ci": (ttft.get("percentile_cis") or {}).get("p99"), "requests": totals,
        })  # fmt: skip
    passing = [p for p in points if p["strategy"] == "poisson" and p["ttft_p99"] is not None
               and p["ttft_p99"] <= limit_ms]  # fmt: skip
    failing = [p for p in points if p["strategy"] == "poisson" and (p["ttft_p99"] is None or p["ttft_p99"] > limit_ms)]
    best = max((p["rate"] for p in passing), default=None)
    above = min((p["rate"] for p in failing if best is None or p["rate"] > best), default=None)
    row.update({
        "answer": best, "bracket": [best, above], "points": points,
        "uncertainty": "none stated (one run per rate, no interval on its p99)",
    })  # fmt: skip
    return row


# ------------------------------------------------------------------------------------------- table

RUNNERS: dict[str, Callable[[ServerProcess, float, Path, argparse.Namespace], dict[str, Any]]] = {
    "ours": run_ours,
    "aiperf": run_aiperf,
    "guidellm": run_guidellm,
    "guidellm-1w": lambda s, lim, w, a: run_guidellm(s, lim, w, a, workers=1),
}

LABELS = {
    "ours": "tailgate slo (measured: highest pass)",
    "ours-fitted": "tailgate slo (fitted step loop)",
    "aiperf": "AIPerf monotonic-sla search",
    "guidellm": "GuideLLM sweep (poisson), default workers",
    "guidellm-1w": "GuideLLM sweep (poisson), 1 worker",
}

NOTES = {
    "ours": (
        "**tailgate slo.** Its measured answer is the highest rate whose probes pass an anytime-valid check of the "
        "p99 (a confidence bound, not the point estimate), beside the lowest rate that fails: a bracket meant to "
        "hold the truth at 95%. It warms the server up, then probes 75 s of Poisson arrivals of the mix (at least "
        "300 measured after 25 warm-up completions), pools verdicts across rates, and ends once the fitted step loop "
        "(a model of the engine fitted to the probes' streams and checked against every probe) narrows the "
        "capacity to the 10% resolution; that fitted value and its 95% interval are its point answer. With the "
        "300-request probes of `slo_coverage.e2e` a passing verdict needs more requests than one probe holds "
        "(449 for a p99 bound at 95%), so below the capacity its probes say not enough data rather than pass and "
        "the measured bracket has no lower end: the answer is then the model's, labelled as such. It errs low, "
        "not high: an undecided probe never counts as a pass."
    ),
    "aiperf": (
        "**AIPerf.** Its `monotonic-sla` planner (its perf_analyzer-style SLA search; the recipes search "
        "concurrency, not rate, and `--goodput` only scores one rate) doubles the rate from 1 req/s until the SLA "
        "filter fails, then bisects, each rate latched after two agreeing runs. The planner takes integer "
        "dimensions only, so the rate moves in whole req/s and the search stops once the bracket is one apart "
        "(about 17-20% of these capacities); it answers the last passing integer, with no allowance for sampling "
        "error. Each run is 60 s from an empty server, then a 30 s grace period: a run that starts with no queue "
        "and stops before the queue builds to its steady state sees shorter waits than the steady state does, and "
        "its p99 comes from a few hundred requests, so a rate above the capacity can pass twice (answers too high); "
        "requests still queued when the grace period ends are left out of its percentiles, which favours passing "
        "too."
    ),
    "guidellm": (
        "**GuideLLM.** Its sweep measures the synchronous rate and the saturated throughput, then runs Poisson "
        "rates evenly spaced between them (GuideLLM 0.8's sweep defaults to constant-rate arrivals, so Poisson is "
        "asked for with `strategy_type=poisson`), each for 60 s from an empty queue; it states no SLO answer, so the "
        "answer here is the highest swept rate whose TTFT p99 meets the limit. The answer can only be one of its "
        "grid points, and the grid starts at the synchronous rate: on these servers one request at a time already "
        "runs at about the capacity, so its first Poisson rate lies above the truth and the sweep cannot answer "
        "below it except by answering nothing. Short runs from an empty queue favour passing, and requests cut off "
        "at the end of a run leave its percentiles. Its worker processes (10 by default) each draw Poisson delays "
        "from `random.Random(42)` and add them to one shared clock, so each delay repeats once per worker: the "
        "arrivals clump far more than a Poisson process at that rate, which raises TTFT and pushes the answer "
        "down; the one-worker run removes the repetition. Its reported request rate also differs from the rate it "
        "names: above the target with ten workers, below it with one (one process falls behind its own schedule), "
        "so with one worker the named rate overstates the load the server was given, and the answer errs high."
    ),
}


def error_pct(answer: float | None, truth: float) -> float | None:
    return None if answer is None else round(100.0 * (answer / truth - 1.0), 1)


def result_file(shape: str) -> Path:
    return RESULTS / f"slo-peers-{shape}.json"


def _f(v: Any, fmt: str = "{:.3g}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown() -> str:
    """One table over every shape's JSON, then what each tool's answer means."""
    lines = [
        "# Capacity under an SLO: AIPerf, GuideLLM and tailgate slo on servers of known capacity",
        "",
        "Written by `benchmarks/slo_peers.py` (see its docstring). Servers: the ground-truth server's simulated "
        "engine in real time; truth: `slo_coverage.pooled_truth` (4 x 100,000 simulated requests per rate). "
        "Workload: the reference mix (70% 200->100, 20% 1000->300, 10% 6000->600 tokens), checked on the server's "
        "own token counters (mean prompt / output tokens per request it served). Error = answer / truth - 1.",
        "",
        "| shape | SLO | truth (req/s) | tool | answer (req/s) | error | stated uncertainty | wall (min) "
        "| server saw (prompt/out tokens) | command |",
        "|---|---|---:|---|---:|---:|---|---:|---|---|",
    ]
    for path in sorted(RESULTS.glob("slo-peers-*.json")):
        doc = json.loads(path.read_text())
        truth = doc["truth"]
        for tool in TOOLS:
            row = doc["tools"].get(tool)
            if row is None:
                continue
            variants = [(tool, row.get("answer"))]
            if tool == "ours" and row.get("fitted_capacity") is not None:
                variants.append(("ours-fitted", row["fitted_capacity"]))
            mix = row.get("server_saw") or {}
            saw = f"{_f(mix.get('mean_prompt_tokens'), '{:.0f}')} / {_f(mix.get('mean_output_tokens'), '{:.0f}')}"
            for name, answer in variants:
                unc = row.get("uncertainty") or ""
                if tool == "ours":
                    lo, hi = row.get("bracket") or (None, None)
                    unc = f"measured bracket [{_f(lo, '{:g}')}, {_f(hi, '{:g}')}]" + (
                        " (nothing passed)" * (lo is None)
                    )
                if tool.startswith("guidellm") and answer is None and row.get("points"):
                    unc = guidellm_nothing(row["points"])
                if name == "ours-fitted":
                    unc = f"95% interval {row.get('fitted_interval')}"
                if row.get("error"):
                    unc = f"FAILED: {row['error'][:200]}".replace("|", "/").replace("\n", " ")
                err = error_pct(answer, truth)
                lines.append(
                    f"| {doc['shape']} | {doc['slo']} | {truth:.3f} | {LABELS[name]} | {_f(answer, '{:.3f}')} | "
                    f"{_f(err, '{:+.1f}%')} | {unc} | {_f(row.get('minutes'), '{:.1f}')} | {saw} | "
                    f"`{re.sub(r'/tmp/slo-peers-[A-Za-z0-9_-]+', '<work>', row.get('command', ''))}` |"
                )
    missing = []
    for path in sorted(RESULTS.glob("slo-peers-*.json")):
        doc = json.loads(path.read_text())
        missing += [f"{LABELS[t]} on {doc['shape']}" for t in TOOLS if t not in doc["tools"]]
    if missing:
        lines += ["", f"Not measured (the runs did not fit the time available): {'; '.join(missing)}."]
    lines += ["", "## What each tool measured", ""]
    for path in sorted(RESULTS.glob("slo-peers-*.json")):
        doc = json.loads(path.read_text())
        for tool in TOOLS:
            row = doc["tools"].get(tool)
            if row is not None and not row.get("error"):
                lines.append(f"- {doc['shape']}, {LABELS[tool]}: {detail(tool, row)}")
    lines += ["", "## What the answers mean", "", *[f"{text}\n" for text in NOTES.values()]]
    return "\n".join(lines).rstrip() + "\n"


def guidellm_nothing(points: list[dict[str, Any]]) -> str:
    """When no Poisson rate passed: what the sweep does show, the rate one request at a time reached."""
    sync = next((p for p in points if p["strategy"] == "synchronous"), None)
    rates = [p["rate"] for p in points if p["strategy"] == "poisson"]
    text = f"no Poisson rate passed (lowest swept {_f(min(rates, default=None), '{:.2f}')} req/s failed)"
    if sync is not None:
        text += (f"; its synchronous benchmark (one request at a time, not open-loop) ran "
                 f"{_f(sync['achieved'], '{:.2f}')} req/s with p99 {_f(sync['ttft_p99'], '{:.0f}')} ms")  # fmt: skip
    return text


def detail(tool: str, row: dict[str, Any]) -> str:
    """The probes behind an answer, as the tool saw them."""
    if tool == "ours":
        probes = ", ".join(f"{r:g} {v}" for r, v in row.get("probes") or [])
        return f"probes {probes}; status {row.get('status')}; fitted: {row.get('fitted_why')}"
    if tool == "aiperf":
        runs = ", ".join(f"{r}: {_f(p99, '{:.0f}')} ms (n {_f(n, '{:.0f}')})" for r, p99, n in row.get("runs") or [])
        return f"TTFT p99 per run (rate req/s: p99, requests) {runs}; {row.get('status')}"
    pts = []
    for pt in row.get("points") or []:
        req = pt.get("requests") or {}
        rate = "sync" if pt["strategy"] == "synchronous" else "max" if pt["strategy"] == "throughput" else None
        pts.append(f"{rate or _f(pt['rate'], '{:.2f}')}: {_f(pt['ttft_p99'], '{:.0f}')} ms, ran "
                   f"{_f(pt['achieved'], '{:.2f}')} req/s ({req.get('successful')} ok, {req.get('incomplete')} "
                   f"cut off)")  # fmt: skip
    return f"TTFT p99 per benchmark (target rate req/s: p99, achieved rate) {'; '.join(pts)}"


def run_tool(tool: str, model: EngineModel, limit_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    """One tool against a fresh server: nothing queued or counted from the tool before."""
    work = Path(tempfile.mkdtemp(prefix=f"slo-peers-{tool}-"))
    with start_server_process(engine=model.describe()) as server:
        before = server_counts(server)
        t0 = time.monotonic()
        try:
            row = RUNNERS[tool](server, limit_ms, work, args)
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as e:
            row = {"error": f"{type(e).__name__}: {e}"}
        row["minutes"] = round((time.monotonic() - t0) / 60, 1)
        row["server_saw"] = sent_mix(before, server_counts(server))
    row["work"] = str(work)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=("slots4", "slots8"), default="slots4")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"subset of {','.join(TOOLS)}, run in this order")
    p.add_argument("--cap-min", type=float, default=25.0, help="wall-clock cap per tool, minutes")
    p.add_argument("--time-budget", type=float, default=1200.0, help="tailgate slo --time-budget, seconds")
    p.add_argument("--aiperf-duration", type=float, default=60.0, help="seconds per AIPerf search run")
    p.add_argument("--guidellm-seconds", type=float, default=60.0, help="seconds per GuideLLM sweep benchmark")
    p.add_argument("--data-rows", type=int, default=5000, help="rows of the mix in the peers' dataset files")
    p.add_argument("--report-only", action="store_true", help="rewrite the markdown from the JSON files")
    args = p.parse_args(argv)
    report = RESULTS / "slo-peers.md"
    if args.report_only:
        report.write_text(markdown())
        return 0
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in RUNNERS]
    if unknown:
        p.error(f"--tools: unknown {unknown}")
    settings, slo_text = SHAPES[args.shape]
    model = EngineModel(**settings)
    limits = slo.parse_slo(slo_text)
    limit_ms = {lim.metric: lim.limit for lim in limits if lim.metric != "errors"}
    q = next(lim.p for lim in limits if lim.p is not None) / 100.0
    truth = pooled_truth(model, limit_ms, q, 100000, 4)  # slo_coverage's defaults, so its cache answers
    print(f"[{args.shape}] engine {model.describe()}; SLO {slo_text}; true capacity {truth:.3f} req/s", flush=True)
    path = result_file(args.shape)
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update({"shape": args.shape, "slo": slo_text, "engine": model.describe(), "truth": round(truth, 4)})
    doc.setdefault("tools", {})
    for tool in tools:
        print(f"[{args.shape}] {tool}: running (cap {args.cap_min:g} min)", flush=True)
        row = run_tool(tool, model, limit_ms["ttft"], args)
        row["error_pct"] = error_pct(row.get("answer"), truth)
        doc["tools"][tool] = row
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        report.write_text(markdown())
        print(f"[{args.shape}] {tool}: answer {row.get('answer')} ({row['error_pct']}% vs truth), "
              f"{row['minutes']} min; {row.get('uncertainty') or row.get('error')}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
