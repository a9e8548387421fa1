"""The fitted step loop of a finished ``tailgate slo`` folder, computed again from its records.

A search's probes are its expensive part (minutes each, on a server); the model at its end is seconds of CPU. This
recomputes it for every configuration of a results folder from the records on disk, with this tree's rules and
the given simulation size, and prints each configuration's measured bracket, the model's interval, every probe's
replay beside what was measured, and the narrowed bracket or why there is none. Nothing is written unless
``--json`` names a file.

Run: ``python benchmarks/slo_refit.py RESULTS [--replicates 8] [--requests 10000] [--json out.json] [--any-policy]
[--one-process]``
(for the H200 search kept in the tree: ``tar xzf results/h200/slo-fitted/results-slo-chunked.tar.gz -C /tmp``
then ``python benchmarks/slo_refit.py /tmp/slo``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate.records import read_records
from tailgate.slo import replicates
from tailgate.slo.attempt import ProbeAttempt, ProbeMark
from tailgate.slo.replay import Workload, model_answer, workload_of
from tailgate.slo.servicefit import CHUNK_CHOICES, Probe, prefill_choices, probes_of
from tailgate.slo.spec import PROBE_MARK
from tailgate.slo.verdict import Check
from tailgate.stats import measured_records


@dataclass
class Search:
    """One configuration of a finished search, as the model sees it."""

    probes: list[Probe]
    limits: dict[str, float]
    q: float
    measured: tuple[float | None, float | None]
    workload: Workload
    seed: int
    chunks: tuple[int, ...] = CHUNK_CHOICES
    """The prefill policies the server's knobs allow (:func:`prefill_choices`)."""


def read_state(parser: argparse.ArgumentParser, folder: Path) -> dict[str, Any]:
    """A results folder's ``slo.json``; a folder without one ends the command with a one-line message."""
    state_file = folder / "slo.json"
    if not state_file.is_file():
        parser.error(f"{state_file} not found: give a tailgate slo results folder")
    state: dict[str, Any] = json.loads(state_file.read_text())
    return state


def load_search(root: Path, config: dict[str, Any], plan: dict[str, Any],
                before: int | None = None) -> Search | None:  # fmt: skip
    """The probes of one configuration of a ``tailgate slo`` folder, read from its records (None: no model can be
    fitted: no workload, or limits at different percentiles); ``before``: only the probes run before that index
    (the search as it stood when it fitted the model its confirmation probes tested)."""
    warmup = int(plan.get("warmup", 25))
    by_rate: dict[float, list[ProbeAttempt]] = {}
    checks: dict[float, list[Check]] = {}
    for probe in config.get("probes", []):
        if before is not None and int(probe.get("index", 0)) >= before:
            continue
        rate = float(probe["rate"])
        checks[rate] = [Check.from_json(c, where=f"probe at {rate:g} req/s") for c in probe.get("checks", [])]
        for a in probe.get("attempts", []):
            recs = read_records(root / a["dir"]).records
            mark = root / a["dir"] / PROBE_MARK
            # the KV pool the server stated admits and preempts in the fitted engine, as in the search's own fit
            pool = ProbeMark.read(mark).kv_capacity_tokens if mark.is_file() else None
            # sent and errors are the verdict's, not the model's: the fit reads the records
            attempt = ProbeAttempt(
                measured_records(recs, warmup),
                sent=len(recs),
                errors=0,
                stopped_early=a.get("stopped_early"),
                workload=int(a["seed"]),
                records=recs,
                kv_capacity_tokens=pool,
            )
            by_rate.setdefault(rate, []).append(attempt)
    limits = {lim["metric"]: float(lim["limit"]) for lim in plan["limits"] if lim.get("p") is not None}
    qs = {lim["p"] for lim in plan["limits"] if lim.get("p") is not None}
    result = config.get("result") or {}
    measured = (result.get("best_rate"), result.get("first_fail_rate"))
    workload = workload_of(by_rate, trace_file=any("trace-file" in x for x in plan.get("locust_args", [])))
    if workload is None or len(qs) != 1:
        return None
    chunks = prefill_choices(config.get("knobs") or {})
    return Search(probes_of(by_rate, checks), limits, qs.pop() / 100.0, measured, workload, int(plan.get("seed", 7)),
                  chunks)  # fmt: skip


def refit(root: Path, config: dict[str, Any], plan: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    search = load_search(root, config, plan)
    if search is None:
        return {"config": config["name"], "fitted": None}
    t0 = time.monotonic()
    chunks = CHUNK_CHOICES if args.any_policy else search.chunks
    answer = model_answer(search.probes, search.limits, search.q, search.measured, workload=search.workload,
                          requests=args.requests, replicates=args.replicates, seed=search.seed,
                          chunks=chunks)  # fmt: skip
    return {"config": config["name"], "measured": list(search.measured), "seconds": round(time.monotonic() - t0, 1),
            "fitted": answer.as_dict()}  # fmt: skip


def noise_text(pairs: list[list[float]]) -> str:
    """Per prompt length: how many delays, and their 10th, 50th and 90th percentiles (ms)."""
    by_length: dict[int, list[float]] = {}
    for prompt, ms in pairs:
        by_length.setdefault(int(prompt), []).append(float(ms))
    parts = []
    for prompt, delays in sorted(by_length.items()):
        d = sorted(delays)
        at = [d[min(len(d) - 1, int(q * len(d)))] for q in (0.1, 0.5, 0.9)]
        parts.append(f"{prompt} tokens: {len(d)}, p10/p50/p90 {at[0]:+.1f} / {at[1]:+.1f} / {at[2]:+.1f} ms")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--replicates", type=int, default=8)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--any-policy",
        action="store_true",
        help="let the replay choose among every prefill policy, whatever the server's knobs declared",
    )
    p.add_argument("--one-process", action="store_true", help="simulate every replicate in this process")
    args = p.parse_args(argv)
    if args.one_process:
        replicates.PARALLEL_REQUESTS = sys.maxsize
    state = read_state(p, args.results)
    rows = [refit(args.results, c, state["plan"], args) for c in state.get("configs", [])]
    for row in rows:
        f = row["fitted"]
        print(f"{row['config']}: measured bracket {row.get('measured')}")
        if not f:
            print("  no fitted model (no streams, or limits at different percentiles)")
            continue
        e = f["engine"] or {}
        print(f"  fitted step loop ({row['seconds']} s): {e.get('slots')} slots "
              f"({'reached' if f['slots_reached'] else 'never filled: unlimited'}), step {e.get('step_ms', 0):.3g} ms "
              f"+ {e.get('step_ms_per_seq', 0):.3g} ms/stream + {e.get('step_ms_per_kv_ktoken', 0):.3g} ms/1,000 held "
              f"tokens + {e.get('prefill_ms_per_token', 0):.3g} ms/prefilled "
              f"token (+ {e.get('prefill_ms_per_token_ctx', 0):.3g} per 1,000 before it in its prompt, "
              f"+ {e.get('prefill_ms_per_token_step', 0):.3g} per 1,000 in its step; front end "
              f"{e.get('frontend_ms', 0):.3g} ms + {e.get('frontend_ms_per_token', 0):.3g} ms/token"
              f"{', one prompt at a time' if e.get('frontend_serial') else ''}"
              f"{'; each step composed as the one before starts' if e.get('async_scheduling') else ''}), "
              f"{'chunks of ' + str(e.get('chunk_tokens')) if e.get('chunked') else 'whole prompts'}; "
              f"{f['streams']} streams; requests from {f['workload']}")  # fmt: skip
        if e.get("frontend_noise"):
            print(f"  lone requests' TTFT spread drawn per request: {noise_text(e['frontend_noise'])}")
        for r in f["replay"]:
            print(f"    {r['rate']:>6g} req/s {r['key']:<9} measured {r['measured']:>7.1f} ms  replayed "
                  f"{r['model']:>7.1f} ms  interval [{r['low']}, {r['high']}]  "
                  f"{'agrees' if r['inside'] else 'DISAGREES'}")  # fmt: skip
        print(f"  capacity {f['capacity']} req/s, 95% interval {f['interval']} (model estimate); "
              f"narrowed bracket {f['bracket']}; {f['why']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
