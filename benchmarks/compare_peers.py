"""Side by side: how far each load generator's own figures are from what the server actually did.

Every tool runs the same load against a fresh ground-truth server (:mod:`tailgate.verify.groundtruth`):
open-loop Poisson arrivals at each rate, ``--tokens``-chunk streams with a ``--ttft-ms`` first chunk
and ``--gap-ms`` gaps, a 16-token prompt. The server logs, on ``CLOCK_MONOTONIC``, when it received
each request and when each chunk's write returned, so every figure a tool reports can be compared
with the truth for the very requests it sent:

- tailgate (one Locust process, and ``--processes 2``): records carry the response id, the send on
  the monotonic clock and every chunk's arrival, so the join is exact, chunk by chunk.
- ``vllm bench serve`` (the CPU vLLM's copy, run through its ``add_cli_args``/``main`` because the
  venv's ``vllm`` entry point is broken): ``--save-detailed`` keeps per-request ``start_times``
  (``perf_counter``, the same clock), TTFT and the ITL list, so chunk times are reconstructed; it
  keeps no response id, so requests are paired with server streams in first-chunk order.
- GuideLLM (its own venv): per-request wall-clock timings and the response id; no per-chunk times,
  so there is no per-chunk error and no worst gap, only its per-request mean ITL.
- the seed article's harness, extracted at run time into a temporary folder and run unchanged but
  for two things a wrapper does around it: its trace generator returns the same 16/``--tokens``
  items as everyone else's, and the first ``perf_counter()`` read inside each request (its own
  ``start``) is kept, so its TTFT can be set against the server's first write. Requests are paired
  in first-chunk order.

"Error" is always the tool's figure minus the truth. TTFT has two yardsticks: the server's first
write minus the tool's own send stamp (the receive side: what the tool adds after the server wrote),
and the server's own TTFT (first write minus the moment it had read the request), under which
connect, upload and any queueing between the tool's stamp and the wire count as error too; that part
is shown alone as *send → received*, and it also holds the server's accept and parse. The worst gap
is set against the longest interval between the server's writes of that stream; ITL against the
server's write intervals (pooled, or per-request means weighted by chunk count where that is what
the tool reports). Where a tool keeps its send time, the per-request TTFT error is its TTFT minus
the server's first write minus that send; where it keeps chunk times, the per-chunk error is each
chunk's receive time minus the server's write of it. A tool *sustains* a rate when it completed every
request and both its reported TTFT p99 (receive side) and its reported gap p99 are within 1 ms of
the truth.

    python benchmarks/compare_peers.py                       # 20, 50, 100, 200 req/s, about 10 s each
    python benchmarks/compare_peers.py --rates 20 --duration-s 5 --tools tailgate,seed-harness
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate.stats import percentile
from tailgate.verify.groundtruth import ServerProcess, start_server_process
from tailgate.verify.selfcheck import CpuSampler, SelfCheckConfig, distribution, machine_facts, run_load

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "tailgate"
SEED_ARTICLE = Path("/work/shared/reference/seed-article.txt")
MODEL = "ground-truth"
PROMPT_TOKENS = 16
TOOLS = ("tailgate", "tailgate-p2", "vllm-bench", "guidellm", "seed-harness")
SUSTAIN_MS = 1.0
MS = 1_000_000
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


# ------------------------------------------------------------------------------------------- model


@dataclass(slots=True)
class Seen:
    """One request as a tool saw it. Times are monotonic nanoseconds; None where the tool keeps nothing."""

    seq: int | None
    send_ns: int | None
    first_ns: int | None
    ttft_ms: float | None
    worst_gap_ms: float | None = None
    mean_itl_ms: float | None = None
    chunk_ns: list[int] | None = None


@dataclass(slots=True)
class ToolRun:
    tool: str
    rate: float
    n: int
    seen: list[Seen] = field(default_factory=list)
    failed: int = 0
    reported: dict[str, float | None] = field(default_factory=dict)
    """ttft_p50, ttft_p99, gap_p50, gap_p99 (worst gap per request), itl_p50, itl_p99."""
    itl_kind: str = "pooled"
    """``pooled``: every chunk interval; ``request_mean``: one mean per request, weighted by its intervals."""
    notes: list[str] = field(default_factory=list)
    cpu: dict[str, float] | None = None
    exit_code: int | None = None
    command: str = ""


def mono_offset_ns() -> int:
    """``time.time_ns() - time.monotonic_ns()``, read tightly, to put wall-clock stamps on the monotonic axis."""
    best: tuple[int, int] | None = None
    for _ in range(5):
        a = time.monotonic_ns()
        w = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, w - (a + b) // 2)
    assert best is not None
    return best[1]


def run_process(
    cmd: Sequence[str], *, cwd: Path, log: Path, server: ServerProcess, env: dict[str, str] | None = None
) -> tuple[int, CpuSampler]:
    """Run a tool to completion with its process tree's CPU sampled; returns (exit code, sampler)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **OFFLINE_ENV, **(env or {})},
        )  # fmt: skip
        sampler = CpuSampler(proc.pid, [server.pid])
        sampler.start()
        try:
            rc = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            sampler.stop()
    return rc, sampler


def window_cpu(sampler: CpuSampler, seen: Sequence[Seen], offset_ns: int) -> dict[str, float] | None:
    starts = [s.send_ns or s.first_ns for s in seen if (s.send_ns or s.first_ns)]
    ends = [s.chunk_ns[-1] if s.chunk_ns else s.first_ns for s in seen if s.first_ns]
    if not starts or not ends:
        return None
    return sampler.window((min(starts) + offset_ns) / 1e9, (max(e for e in ends if e) + offset_ns) / 1e9)


# ------------------------------------------------------------------------------------------- tools


def run_tailgate(rate: float, n: int, tokens: int, server: ServerProcess, work: Path, processes: int) -> ToolRun:
    cfg = SelfCheckConfig(rate=rate, n=n, tokens=tokens, processes=processes)
    run = run_load(cfg, server, work)
    tr = ToolRun(f"tailgate{'' if processes == 1 else f'-p{processes}'}", rate, n, exit_code=run.exit_code)
    tr.command = shlex.join(
        ["locust", "-f", "locustfiles/continuous.py", "--headless", "--host", "<server>", "--rates", f"{rate:g}",
         "--n", str(n), "--warmup", "0", "--trace-file", f"<{n} x 16/{tokens}>", "--record-chunks",
         *(["--processes", str(processes)] if processes > 1 else [])]
    )  # fmt: skip
    for r in run.records:
        if r.error_class or r.sent_mono_ns is None:
            tr.failed += 1
            continue
        sent = r.sent_mono_ns
        chunks = [sent + round(o * MS) for o in r.chunk_offsets_ms or []]
        rid = r.response_id or ""
        tr.seen.append(
            Seen(
                seq=int(rid[5:]) if rid.startswith("cmpl-") and rid[5:].isdigit() else None,
                send_ns=sent,
                first_ns=chunks[0] if chunks else None,
                ttft_ms=r.ttft_ms,
                worst_gap_ms=r.worst_gap_ms,
                chunk_ns=chunks,
            )
        )
    summaries = sorted((work / "results").glob("summary-*.json"))
    if summaries:
        s = json.loads(summaries[0].read_text())
        tr.reported = {k: s.get(k) for k in ("ttft_p50", "ttft_p99")}
        tr.reported.update(gap_p50=s.get("gap_p50"), gap_p99=s.get("gap_p99"))
    tr.cpu = run.stage_cpu()
    return tr


def run_vllm_bench(rate: float, n: int, tokens: int, server: ServerProcess, work: Path, python: Path) -> ToolRun:
    tr = ToolRun("vllm-bench", rate, n)
    runner = work / "bench_serve.py"
    runner.write_text(
        "import sys\n"
        "from vllm.benchmarks.serve import add_cli_args, main\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
        "add_cli_args(parser)\n"
        "main(parser.parse_args(sys.argv[1:]))\n"
    )
    args = [
        "--backend", "openai", "--base-url", server.base_url, "--endpoint", "/v1/completions", "--model", MODEL,
        "--tokenizer", str(CACHE / "tiny-model"), "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(tokens), "--random-range-ratio", "0", "--num-prompts", str(n),
        "--request-rate", f"{rate:g}", "--seed", "0", "--ignore-eos", "--save-result", "--save-detailed",
        "--result-dir", str(work), "--result-filename", "vllm.json", "--percentile-metrics", "ttft,itl,tpot,e2el",
        "--metric-percentiles", "50,99", "--disable-tqdm",
    ]  # fmt: skip
    tr.command = shlex.join(["vllm", "bench", "serve", *args]).replace(server.base_url, "<server>")
    rc, sampler = run_process([str(python), str(runner), *args], cwd=work, log=work / "vllm.log", server=server)
    tr.exit_code = rc
    out = work / "vllm.json"
    if not out.exists():
        tr.notes.append(f"no result file (exit {rc}): {(work / 'vllm.log').read_text(errors='replace')[-400:]}")
        return tr
    d = json.loads(out.read_text())
    tr.reported = {
        "ttft_p50": d.get("p50_ttft_ms"), "ttft_p99": d.get("p99_ttft_ms"),
        "itl_p50": d.get("p50_itl_ms"), "itl_p99": d.get("p99_itl_ms"),
    }  # fmt: skip
    worst: list[float] = []
    for start, ttft, itls, err in zip(d["start_times"], d["ttfts"], d["itls"], d["errors"], strict=True):
        if err or not ttft:
            tr.failed += 1
            continue
        send = round(start * 1e9)
        first = send + round(ttft * 1e9)
        chunks = [first + round(c * 1e9) for c in accumulate(itls, initial=0.0)]
        gap = max(itls) * 1e3 if itls else 0.0
        worst.append(gap)
        tr.seen.append(Seen(None, send, first, ttft * 1e3, gap, chunk_ns=chunks))
    tr.reported.update(gap_p50=percentile(worst, 50), gap_p99=percentile(worst, 99))
    tr.notes.append("worst gap derived from its per-request ITL lists (it reports no worst gap)")
    tr.cpu = window_cpu(sampler, tr.seen, mono_offset_ns())
    return tr


def run_guidellm(rate: float, n: int, tokens: int, server: ServerProcess, work: Path, exe: Path) -> ToolRun:
    tr = ToolRun("guidellm", rate, n, itl_kind="request_mean")
    data = work / "data.jsonl"
    with open(data, "w") as f:
        for _ in range(n):
            row = {"prompt": "ocean " * PROMPT_TOKENS, "prompt_tokens_count": PROMPT_TOKENS}
            f.write(json.dumps({**row, "output_tokens_count": tokens}) + "\n")
    args = [
        "run", "--backend", f"kind=openai_http,target={server.base_url},model={MODEL},request_format=/v1/completions",
        "--profile", f"kind=poisson,rate={rate:g}", "--constraint", f"kind=max_requests,count={n}",
        "--data", f"kind=json_file,path={data}", "--tokenizer", f"kind=huggingface_auto,model={CACHE / 'tiny-model'}",
        "--output", f"kind=json,path={work / 'guidellm.json'}", "--disable-console-interactive",
    ]  # fmt: skip
    tr.command = shlex.join(["guidellm", *args]).replace(server.base_url, "<server>")
    tr.notes.append(
        "prompts from a JSON file: its synthetic_text data produced empty prompts with this tokenizer, "
        "which its /v1/completions handler refuses"
    )
    offset = mono_offset_ns()
    rc, sampler = run_process([str(exe), *args], cwd=work, log=work / "guidellm.log", server=server)
    tr.exit_code = rc
    out = work / "guidellm.json"
    if not out.exists():
        tr.notes.append(f"no result file (exit {rc}): {(work / 'guidellm.log').read_text(errors='replace')[-400:]}")
        return tr
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def pct(metric: str, p: str) -> float | None:
        return (m[metric]["successful"].get("percentiles") or {}).get(p)

    tr.reported = {
        "ttft_p50": pct("time_to_first_token_ms", "p50"), "ttft_p99": pct("time_to_first_token_ms", "p99"),
        "itl_p50": pct("inter_token_latency_ms", "p50"), "itl_p99": pct("inter_token_latency_ms", "p99"),
    }  # fmt: skip
    reqs = bench["requests"]
    tr.failed = len(reqs.get("errored") or []) + len(reqs.get("incomplete") or [])
    for r in reqs.get("successful") or []:
        t = r["info"]["timings"]
        rid = r.get("response_id") or ""
        start, first, last = t["request_start"], t["first_token_iteration"], t["last_token_iteration"]
        k = t.get("token_iterations") or 0
        if start is None or first is None:
            tr.failed += 1
            continue
        mean_itl = (last - first) * 1e3 / (k - 1) if last is not None and k > 1 else None
        tr.seen.append(
            Seen(
                int(rid[5:]) if rid.startswith("cmpl-") and rid[5:].isdigit() else None,
                round(start * 1e9) - offset,
                round(first * 1e9) - offset,
                (first - start) * 1e3,
                None,
                mean_itl,
            )
        )
    tr.cpu = window_cpu(sampler, tr.seen, offset)
    return tr


def extract_seed_harness(article: Path, into: Path) -> Path:
    """The article's harness: from its ``#!/usr/bin/env python3`` line to its ``main()`` call, verbatim."""
    lines = article.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#!/usr/bin/env python3"))
    end = next(
        i
        for i in range(start, len(lines) - 1)
        if lines[i] == 'if __name__ == "__main__":' and lines[i + 1] == "    main()"
    )
    path = into / "batching_bench.py"
    path.write_text("\n".join(lines[start : end + 2]) + "\n", encoding="utf-8")
    return path


SEED_WRAPPER = '''\
"""Runs the extracted harness unchanged, with the suite's trace and its own start stamps kept."""
import importlib.util, sys, threading, time

spec = importlib.util.spec_from_file_location("batching_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
prompt_tokens, max_tokens = int(sys.argv[2]), int(sys.argv[3])
item = {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens}
bench.make_trace = lambda n, seed: [{"id": i, **item} for i in range(n)]
local = threading.local()


class Clock:
    """The harness's ``time``: every read passes through; the first perf_counter() of a request is its start."""

    def __getattr__(self, name):
        return getattr(time, name)

    def perf_counter(self):
        t = time.perf_counter()
        if getattr(local, "armed", False):
            local.armed = False
            local.start = t
        return t


bench.time = Clock()
one_request = bench.one_request


def stamped(base, model, item):
    local.armed = True
    result = one_request(base, model, item)
    result["start_perf_counter"] = local.start
    return result


bench.one_request = stamped
sys.argv = ["batching_bench.py", *sys.argv[4:]]
bench.main()
'''


def run_seed_harness(rate: float, n: int, tokens: int, server: ServerProcess, work: Path, article: Path) -> ToolRun:
    tr = ToolRun("seed-harness", rate, n)
    harness = extract_seed_harness(article, work)
    wrapper = work / "run_harness.py"
    wrapper.write_text(SEED_WRAPPER, encoding="utf-8")
    out = work / "seed.json"
    args = ["--base-url", f"{server.base_url}/v1", "--model", MODEL, "--arm", "continuous", "--rate", f"{rate:g}",
            "--n", str(n), "--warmup", "0", "--out", str(out)]  # fmt: skip
    tr.command = shlex.join(["python3", "batching_bench.py", *args]).replace(server.base_url, "<server>")
    cmd = [sys.executable, str(wrapper), str(harness), str(PROMPT_TOKENS), str(tokens), *args]
    rc, sampler = run_process(cmd, cwd=work, log=work / "seed.log", server=server)
    tr.exit_code = rc
    if not out.exists():
        tr.notes.append(f"no result file (exit {rc}): {(work / 'seed.log').read_text(errors='replace')[-400:]}")
        return tr
    doc = json.loads(out.read_text())
    s = doc["summary"]
    tr.reported = {k: s.get(k) for k in ("ttft_p50", "ttft_p99", "gap_p50", "gap_p99")}
    tr.failed = int(s.get("errors") or 0)
    for r in doc["records"]:
        send = round(r["start_perf_counter"] * 1e9)
        tr.seen.append(Seen(None, send, send + round(r["ttft_ms"] * MS), r["ttft_ms"], r["worst_gap_ms"]))
    tr.notes.append("its figures are rounded to 0.1 ms, its requests paired in first-chunk order")
    tr.cpu = window_cpu(sampler, tr.seen, mono_offset_ns())
    return tr


# ------------------------------------------------------------------------------------------- truth


@dataclass(slots=True)
class Stream:
    seq: int
    received_ns: int
    writes: list[int]
    begins: list[int]

    @property
    def worst_gap_ms(self) -> float:
        return max((b - a for a, b in zip(self.writes, self.writes[1:], strict=False)), default=0) / MS

    @property
    def mean_gap_ms(self) -> float | None:
        return (self.writes[-1] - self.writes[0]) / MS / (len(self.writes) - 1) if len(self.writes) > 1 else None


def streams_of(dump: dict[str, Any]) -> dict[int, Stream]:
    received = {row[0]: row[1] for row in dump["requests"]}
    out: dict[int, Stream] = {}
    begins = dump.get("chunk_write_begin") or [row[2] for row in dump["chunks"]]
    for (seq, _, t), b in sorted(zip(dump["chunks"], begins, strict=True), key=lambda x: (x[0][0], x[0][1])):
        st = out.setdefault(seq, Stream(seq, received.get(seq, 0), [], []))
        st.writes.append(t)
        st.begins.append(b)
    return out


def pair(seen: list[Seen], streams: dict[int, Stream]) -> tuple[list[tuple[Seen, Stream]], int]:
    """Pair each request with its server stream: by response id, else in first-chunk order.

    Returns the pairs and the count of suspicious ones (the tool received a chunk before the server began
    writing it), which a wrong pairing produces and a right one cannot.
    """
    if all(s.seq is not None for s in seen):
        pairs = [(s, streams[s.seq]) for s in seen if s.seq in streams]  # type: ignore[index]
    else:
        ordered = sorted(streams.values(), key=lambda st: st.writes[0])
        ordered = ordered[len(ordered) - len(seen) :] if len(ordered) > len(seen) else ordered
        tools = sorted((s for s in seen if s.first_ns is not None), key=lambda s: s.first_ns or 0)
        pairs = list(zip(tools, ordered, strict=False))
    suspicious = 0
    for s, st in pairs:
        times = s.chunk_ns or ([s.first_ns] if s.first_ns is not None else [])
        if any(c < b for c, b in zip(times, st.begins, strict=False)):
            suspicious += 1
    return pairs, suspicious


def weighted_request_means(streams: Sequence[Stream]) -> list[float]:
    out: list[float] = []
    for st in streams:
        if st.mean_gap_ms is not None:
            out += [st.mean_gap_ms] * (len(st.writes) - 1)
    return out


def evaluate(tr: ToolRun, dump: dict[str, Any]) -> dict[str, Any]:
    streams = streams_of(dump)
    pairs, suspicious = pair(tr.seen, streams)
    mine = [st for _, st in pairs]
    server_ttft = [(st.writes[0] - st.received_ns) / MS for st in mine]
    true_ttft = [(st.writes[0] - s.send_ns) / MS for s, st in pairs if s.send_ns is not None]
    upload = [(st.received_ns - s.send_ns) / MS for s, st in pairs if s.send_ns is not None]
    ttft_err = [s.ttft_ms - (st.writes[0] - s.send_ns) / MS for s, st in pairs if s.send_ns and s.ttft_ms is not None]
    gap_err = [s.worst_gap_ms - st.worst_gap_ms for s, st in pairs if s.worst_gap_ms is not None]
    itl_err = [s.mean_itl_ms - (st.mean_gap_ms or 0) for s, st in pairs if s.mean_itl_ms is not None]
    chunk_err = [(c - w) / MS for s, st in pairs if s.chunk_ns for c, w in zip(s.chunk_ns, st.writes, strict=False)]
    true_gap = [st.worst_gap_ms for st in mine]
    if tr.itl_kind == "pooled":
        true_itl = [(b - a) / MS for st in mine for a, b in zip(st.writes, st.writes[1:], strict=False)]
    else:
        true_itl = weighted_request_means(mine)
    truth = {
        "ttft_p50": percentile(true_ttft, 50), "ttft_p99": percentile(true_ttft, 99),
        "server_ttft_p50": percentile(server_ttft, 50), "server_ttft_p99": percentile(server_ttft, 99),
        "gap_p50": percentile(true_gap, 50), "gap_p99": percentile(true_gap, 99),
        "itl_p50": percentile(true_itl, 50), "itl_p99": percentile(true_itl, 99),
    }  # fmt: skip
    reported = {**tr.reported, "server_ttft_p50": tr.reported.get("ttft_p50"),
                "server_ttft_p99": tr.reported.get("ttft_p99")}  # fmt: skip
    errors = {
        k: (reported[k] - truth[k]) if reported.get(k) is not None and truth[k] is not None else None for k in truth
    }
    sends = sorted(s.send_ns for s in tr.seen if s.send_ns)
    achieved = (len(sends) - 1) / ((sends[-1] - sends[0]) / 1e9) if len(sends) > 1 and sends[-1] > sends[0] else None
    gap_key = "gap_p99" if errors.get("gap_p99") is not None else "itl_p99"
    sustained = (
        tr.failed == 0
        and len(tr.seen) == tr.n
        and errors.get("ttft_p99") is not None
        and abs(errors["ttft_p99"]) <= SUSTAIN_MS
        and errors.get(gap_key) is not None
        and abs(errors[gap_key]) <= SUSTAIN_MS  # type: ignore[arg-type]
    )
    return {
        "tool": tr.tool, "rate": tr.rate, "n": tr.n, "ok": len(tr.seen), "failed": tr.failed,
        "exit_code": tr.exit_code, "achieved_rate": achieved, "paired": len(pairs), "suspicious_pairs": suspicious,
        "reported": tr.reported, "truth": truth, "reported_minus_truth": errors, "itl_kind": tr.itl_kind,
        "per_request_ttft_error_ms": distribution(ttft_err), "send_to_received_ms": distribution(upload),
        "per_request_gap_error_ms": distribution(gap_err),
        "per_request_mean_itl_error_ms": distribution(itl_err), "per_chunk_error_ms": distribution(chunk_err),
        "cpu": tr.cpu, "sustained": sustained, "notes": tr.notes, "command": tr.command,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------- report


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return percentile(xs, 50)


def aggregate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tool and rate: the median of each figure over the repeats, and how many sustained.

    Medians figure by figure, because a shared machine spoils single runs at random and a median run
    chosen by one figure would carry another figure's bad luck along.
    """
    out: list[dict[str, Any]] = []
    keys = dict.fromkeys((r["tool"], r["rate"]) for r in results)
    for tool, rate in keys:
        runs = [r for r in results if r["tool"] == tool and r["rate"] == rate]
        first = runs[0]
        agg = {**first, "runs": len(runs), "sustained_runs": sum(r["sustained"] for r in runs)}
        agg["sustained"] = agg["sustained_runs"] * 2 > len(runs)
        for group in ("reported", "truth", "reported_minus_truth"):
            agg[group] = {k: _median([r[group].get(k) for r in runs]) for k in first[group]}
        groups = ("per_request_ttft_error_ms", "per_request_gap_error_ms", "per_request_mean_itl_error_ms",
                  "send_to_received_ms")  # fmt: skip
        for group in (*groups, "per_chunk_error_ms"):
            agg[group] = {k: _median([r[group].get(k) for r in runs]) for k in first[group]}
            agg[group]["n"] = first[group]["n"]
        cpus = [r["cpu"] for r in runs if r.get("cpu")]
        agg["cpu"] = {k: _median([c.get(k) for c in cpus]) for k in cpus[0]} if cpus else None
        agg["achieved_rate"] = _median([r["achieved_rate"] for r in runs])
        agg["ok"] = min(r["ok"] for r in runs)
        agg["loadavg_before"] = _median([r["loadavg_before"] for r in runs])
        agg["suspicious_pairs"] = sum(r["suspicious_pairs"] for r in runs)
        out.append(agg)
    return out


def _f(v: float | None, digits: int = 2, signed: bool = True) -> str:
    if v is None:
        return "–"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    rates = sorted({r["rate"] for r in results})
    tools = list(dict.fromkeys(r["tool"] for r in results))
    out = [
        "# Load generators against the ground truth",
        "",
        f"Generated by `benchmarks/compare_peers.py` on {meta['date']} ({meta['machine']}).",
        "",
        "Every tool ran the same load against a fresh ground-truth server: open-loop Poisson arrivals, "
        f"{meta['tokens']}-chunk streams, first chunk {meta['ttft_ms']:g} ms after the request, then one every "
        f"{meta['gap_ms']:g} ms, 16-token prompts, about {meta['duration_s']:g} s per rate. Errors are the tool's "
        "figure minus the truth from the server's monotonic write log (ms). TTFT: against the server's first write "
        "minus the tool's own send stamp (receive side; also per request), and, in *TTFT p99 err vs server*, "
        "against the server's own TTFT (first write minus the moment it had read the request), which adds what "
        "happens between the tool's stamp and the server reading the request (connect, upload, the tool's own "
        "queues, the server's accept), shown alone as *send → received*. Worst gap: against the longest "
        "interval between the server's writes "
        "of that stream; ITL against the server's write intervals (pooled for vLLM, per-request means weighted "
        "by chunks for GuideLLM, as each reports it). Per-chunk error: the tool's chunk time minus the server's "
        "write (only tools that keep per-chunk times). *Sustains*: every request completed and both reported "
        "p99s (TTFT, and worst gap or else ITL) within 1 ms of the truth, in most of the "
        f"{meta['repeat']} interleaved run(s); every figure below is the median over those runs.",
        "",
        "## Highest rate sustained within 1 ms p99 error",
        "",
        "| tool | " + " | ".join(f"{r:g} req/s" for r in rates) + " | highest |",
        "|---|" + "---|" * (len(rates) + 1),
    ]
    for tool in tools:
        cells, best = [], None
        for rate in rates:
            r = next((x for x in results if x["tool"] == tool and x["rate"] == rate), None)
            if r is None:
                cells.append("not run")
                continue
            cells.append(f"{'yes' if r['sustained'] else 'no'} ({r['sustained_runs']}/{r['runs']})")
            if r["sustained"]:
                best = rate
        out.append(f"| {tool} | " + " | ".join(cells) + f" | {'none' if best is None else f'{best:g} req/s'} |")
    out += [
        "",
        "## Side by side",
        "",
        "| req/s | tool | ok/n | achieved req/s | TTFT p50 err | TTFT p99 err | worst-gap p99 err | ITL p99 err "
        "| per-request TTFT err p99 | per-chunk err p50 / p99 / max | TTFT p99 err vs server "
        "| send → received p50 / p99 | tool CPU (cores) | others' CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rate in rates:
        for tool in tools:
            r = next((x for x in results if x["tool"] == tool and x["rate"] == rate), None)
            if r is None:
                continue
            e = r["reported_minus_truth"]
            pc = r["per_chunk_error_ms"]
            chunk = f"{_f(pc['p50'])} / {_f(pc['p99'])} / {_f(pc['max'])}" if pc["n"] else "–"
            cpu = r.get("cpu") or {}
            up = r["send_to_received_ms"]
            out.append(
                f"| {rate:g} | {tool} | {r['ok']}/{r['n']} | {_f(r['achieved_rate'], 1, False)} | {_f(e['ttft_p50'])} "
                f"| {_f(e['ttft_p99'])} | {_f(e['gap_p99'])} | {_f(e['itl_p99'])} "
                f"| {_f(r['per_request_ttft_error_ms']['p99'])} | {chunk} | {_f(e['server_ttft_p99'])} "
                f"| {_f(up['p50'], 2, False)} / {_f(up['p99'], 2, False)} "
                f"| {_f(cpu.get('load_cores'), 2, False)} | {_f(cpu.get('others_busy_cores'), 2, False)} |"
            )
    out += ["", "## Reported and true values (ms)", ""]
    out.append(
        "| req/s | tool | TTFT p50 | TTFT p99 | server's TTFT p50 | server's TTFT p99 | worst gap p50 | worst gap p99 "
        "| ITL p50 | ITL p99 |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for rate in rates:
        for tool in tools:
            r = next((x for x in results if x["tool"] == tool and x["rate"] == rate), None)
            if r is None:
                continue
            rep, tru = r["reported"], r["truth"]

            def both(k: str, rep: dict = rep, tru: dict = tru) -> str:
                shown = rep.get(k.replace("server_", ""))
                return f"{_f(shown, 2, False)} / {_f(tru.get(k), 2, False)}"

            keys = ("ttft_p50", "ttft_p99", "server_ttft_p50", "server_ttft_p99", "gap_p50", "gap_p99")
            cols = " | ".join(both(k) for k in (*keys, "itl_p50", "itl_p99"))
            out.append(f"| {rate:g} | {tool} | {cols} |")
    out += ["", "(reported / true)", "", "## Machine load during each run", ""]
    out.append("| req/s | tool | load avg 1 min before | others' CPU during the run (cores of 2) | CPU time stolen "
               "by the host |")  # fmt: skip
    out.append("|---|---|---|---|---|")
    for r in results:
        cpu = r.get("cpu") or {}
        others = _f(cpu.get("others_busy_cores"), 2, False)
        steal = cpu.get("host_steal_share")
        stolen = "–" if steal is None else f"{100 * steal:.1f}%"
        out.append(f"| {r['rate']:g} | {r['tool']} | {r['loadavg_before']:.2f} | {others} | {stolen} |")
    notes = {(r["tool"], n) for r in results for n in r["notes"]}
    if notes or meta.get("skipped"):
        out += ["", "## Notes", ""]
        for tool, note in sorted(notes):
            out.append(f"- {tool}: {note}")
        for tool, why in meta.get("skipped", {}).items():
            out.append(f"- {tool}: not run: {why}")
    suspicious = [r for r in results if r["suspicious_pairs"]]
    for r in suspicious:
        out.append(f"- {r['tool']} at {r['rate']:g} req/s: {r['suspicious_pairs']} request(s) paired doubtfully")
    out += ["", "## Commands", "", "Reproduce everything:", "", "```bash", meta["command"], "```", ""]
    out.append("Each tool's own command, as run (`<server>` is the ground-truth server of that run):")
    out.append("")
    seen_cmd: set[str] = set()
    for r in results:
        key = r["tool"]
        if key in seen_cmd or not r["command"]:
            continue
        seen_cmd.add(key)
        out += [f"- {key}: `{r['command']}`"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="20,50,100,200", help="arrival rates, req/s")
    p.add_argument("--duration-s", type=float, default=10.0, help="about this long per rate: n = rate x duration")
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--gap-ms", type=float, default=10.0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--tools", default=",".join(TOOLS), help=f"subset of {','.join(TOOLS)}")
    p.add_argument("--repeat", type=int, default=1, help="runs per tool and rate, interleaved; medians are reported")
    p.add_argument("--vllm-python", default=str(CACHE / "vllm-venv" / "bin" / "python"))
    p.add_argument("--guidellm", default=str(CACHE / "guidellm-venv" / "bin" / "guidellm"))
    p.add_argument("--seed-article", default=str(SEED_ARTICLE))
    p.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "peers.md"))
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "peers.json"))
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        p.error(f"unknown tools: {', '.join(sorted(unknown))}")
    skipped: dict[str, str] = {}
    runners: dict[str, Callable[[float, int, ServerProcess, Path], ToolRun]] = {
        "tailgate": lambda r, n, s, w: run_tailgate(r, n, args.tokens, s, w, 1),
        "tailgate-p2": lambda r, n, s, w: run_tailgate(r, n, args.tokens, s, w, 2),
        "vllm-bench": lambda r, n, s, w: run_vllm_bench(r, n, args.tokens, s, w, Path(args.vllm_python)),
        "guidellm": lambda r, n, s, w: run_guidellm(r, n, args.tokens, s, w, Path(args.guidellm)),
        "seed-harness": lambda r, n, s, w: run_seed_harness(r, n, args.tokens, s, w, Path(args.seed_article)),
    }
    needs = {"vllm-bench": args.vllm_python, "guidellm": args.guidellm, "seed-harness": args.seed_article}
    for tool, path in needs.items():
        if tool in tools and not Path(path).exists():
            skipped[tool] = f"{path} does not exist"
            tools.remove(tool)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="compare-peers-") as tmp:
        for rate in rates:
            n = max(20, round(rate * args.duration_s))
            for rep, tool in ((rep, tool) for rep in range(args.repeat) for tool in tools):
                work = Path(tmp) / f"{tool}-r{rate:g}-{rep}"
                work.mkdir()
                before = machine_facts()
                print(
                    f"[peers] {tool} at {rate:g} req/s, {n} requests (load avg {before['loadavg_1m']:.2f})", flush=True
                )
                server = start_server_process(
                    ttft_ms=args.ttft_ms, gap_ms=args.gap_ms, model=MODEL, accept_any_model=True
                )
                try:
                    tr = runners[tool](rate, n, server, work)
                    dump = server.dump()
                finally:
                    server.close()
                r = evaluate(tr, dump)
                r["loadavg_before"] = before["loadavg_1m"]
                r["repeat"] = rep
                results.append(r)
                e = r["reported_minus_truth"]
                print(
                    f"[peers]   ok {r['ok']}/{n}, TTFT p99 err {_f(e['ttft_p99'])}, gap p99 err {_f(e['gap_p99'])}, "
                    f"ITL p99 err {_f(e['itl_p99'])}, per-chunk p99 {_f(r['per_chunk_error_ms']['p99'])} "
                    f"{'sustained' if r['sustained'] else 'not sustained'}",
                    flush=True,
                )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "tokens": args.tokens, "gap_ms": args.gap_ms, "ttft_ms": args.ttft_ms, "duration_s": args.duration_s,
        "command": "python benchmarks/compare_peers.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "skipped": skipped, "repeat": args.repeat,
    }  # fmt: skip
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(markdown(aggregate(results), meta), encoding="utf-8")
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n", encoding="utf-8")
    print(f"[peers] wrote {args.report} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
