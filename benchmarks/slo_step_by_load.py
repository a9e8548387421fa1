"""A search's measured decode step by how many streams shared the engine, beside what the fitted costs say there.

On the CPU vLLM most fitted models are refused by their replay of the lowest rate (2 req/s: worst-gap p99 24-30%
under what was measured), where the capacity is decided at 14-20 streams and more. This shows why from the streams
themselves: per running count (the per-step mean of :func:`tailgate.slo.stepfit.held_rows`), the measured mean step
and the prediction of every candidate cost set of :func:`tailgate.slo.stepfit.fit_costs`, and how many of the rows
came from overloaded probes (a queue in front of a full batch), which the least squares weighs by their steps like
any other.

Run: ``python benchmarks/slo_step_by_load.py RESULTS_FOLDER [--config NAME]`` (a ``tailgate slo`` folder; seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.slo_refit import load_search, read_state
from tailgate.slo.stepfit import Costs, fit_costs, held_rows

EDGES = (0, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40)
"""Running-count bins (streams per step, lower edges); the last is open."""


def predicted(c: Costs, running: float, prefilled: float, held_k: float) -> float:
    """A step's cost under ``c`` without its square terms (a long prompt's context, a step's batch): they weigh only
    on the few steps that prefill the longest prompts, and the measured step keeps them."""
    return c.step + c.per_seq * running + c.prefill * prefilled + c.kv * held_k


def label(c: Costs) -> str:
    extra = [f"{name} {v:.3g}" for name, v in (("ctx", c.ctx), ("batch", c.batch), ("kv", c.kv)) if v]
    return f"step {c.step:.2f} + {c.per_seq:.3f}/stream + {c.prefill:.4f}/token" + "".join(f", {e}" for e in extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--config", default="", help="the configuration's name (default: the first)")
    args = p.parse_args(argv)
    state = read_state(p, args.results)
    configs = [c for c in state.get("configs", []) if not args.config or c.get("name") == args.config]
    if not configs:
        p.error(f"no configuration {args.config!r} in {args.results / 'slo.json'}")
    search = load_search(args.results, configs[0], state["plan"])
    if search is None:
        p.error("no fittable configuration (no workload, or limits at different percentiles)")
    probes = sorted(search.probes, key=lambda q: q.rate)
    candidates = fit_costs([q.attempts for q in probes])
    if not candidates:
        p.error("too few streams to fit")
    print(f"{json.dumps(configs[0]['name'])}: {len(candidates)} candidate cost sets (ms per step)")
    for k, c in enumerate(candidates):
        print(f"  c{k}: {label(c)}")
    ref = candidates[-1]  # the steps counted as the fullest candidate costs them
    bins: dict[int, list[tuple[float, float, float, float, float]]] = {}
    for probe in probes:
        for streams in probe.attempts:
            for w, step, running, prefilled, held in held_rows(streams, ref.step, ref.per_seq, ref.kv):
                edge = max(e for e in EDGES if e <= running)
                bins.setdefault(edge, []).append((w, step, running, prefilled, held))
    head = " | ".join(f"c{k}" for k in range(len(candidates)))
    print(f"\n| streams per step | rows | steps | measured mean step, ms | {head} |")
    print("|---|---:|---:|---:|" + "---:|" * len(candidates))
    for edge in sorted(bins):
        rows = bins[edge]
        steps = sum(w for w, *_ in rows)
        mean = sum(w * y for w, y, *_ in rows) / steps
        preds = [sum(w * predicted(c, r, pf, h) for w, _, r, pf, h in rows) / steps for c in candidates]
        upper = EDGES[EDGES.index(edge) + 1] - 1 if edge != EDGES[-1] else None
        span = f"{edge}-{upper}" if upper is not None else f"{edge}+"
        cells = " | ".join(f"{x:.2f}" for x in preds)
        print(f"| {span} | {len(rows)} | {steps:.0f} | {mean:.2f} | {cells} |")
    share = [sum(w for w, *_ in bins.get(e, [])) for e in EDGES]
    total = sum(share)
    median = statistics.median(r for b in bins.values() for _, _, r, _, _ in b)
    print(
        f"\nsteps in rows of 32 streams or more: {sum(share[-2:]) / total:.0%} of {total:.0f}; "
        f"median streams per step over the rows: {median:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
