"""How often a real server prefilled two long prompts in one step, beside what a fitted engine replays on the same
arrivals under each way of taking requests in.

With chunked prefill off, the worst-gap p99 near the capacity is set by the steps that prefill two long prompts at
once, a few per thousand requests: the capacity moves with how often they happen. A run's own first tokens show
them (long prompts whose first tokens came within one step's tolerance of each other), so a long run at a known
rate tells which admission the engine has: a front end that tokenizes side by side, or one prompt at a time
(``frontend_serial``), each step composed at its start or when the one before it starts (``async_scheduling``).

The engine is fitted to a finished search (``tailgate slo`` folder) as the search fits it; each RUN is a folder
of records (a long probe, e.g. ``benchmarks/slo_truth_real.py``'s), replayed whole through each variant.

    python benchmarks/pair_steps.py SEARCH RUN [RUN ...] [--long 4000] [--gap-limit 200]
    # the H100 with chunked prefill off (results/h100/README.md):
    mkdir -p /tmp/hn && for t in results/h100/nochunk/*/*.tar.gz; do tar xzf $t -C /tmp/hn; done
    python benchmarks/pair_steps.py /tmp/hn/slo /tmp/hn/truth/nochunk/r7p5/* /tmp/hn/truth/nochunk/r8p5/*
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slo_refit import load_search, read_state

from tailgate.records import read_records
from tailgate.slo.servicefit import fit_service, replay
from tailgate.slo.stepfit import STEP_TOL_S, Stream, streams_of

VARIANTS = {
    "side by side": {"frontend_serial": False, "async_scheduling": False},
    "one at a time": {"frontend_serial": True, "async_scheduling": False},
    "side by side, composed ahead": {"frontend_serial": False, "async_scheduling": True},
    "one at a time, composed ahead": {"frontend_serial": True, "async_scheduling": True},
}


def paired_steps(firsts: list[float]) -> int:
    """Steps that emitted the first token of two long prompts or more (first tokens within the tolerance)."""
    firsts = sorted(firsts)
    return sum(1 for a, b in itertools.pairwise(firsts) if b - a <= STEP_TOL_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("search", type=Path, help="a tailgate slo results folder (the engine is fitted to it)")
    p.add_argument("runs", type=Path, nargs="+", help="folders of records to replay")
    p.add_argument("--long", type=int, default=4000, help="prompt tokens from which a prompt counts as long")
    p.add_argument("--gap-limit", type=float, default=200.0, help="ms: the share of worst gaps over it is printed")
    args = p.parse_args(argv)
    state = read_state(p, args.search)
    for config in state.get("configs", []):
        search = load_search(args.search, config, state["plan"])
        fit = None if search is None else fit_service(search.probes, search.q, list(search.limits), search.limits,
                                                      search.chunks)  # fmt: skip
        if fit is None:
            print(f"{config['name']}: no fitted engine")
            continue
        shown = {k: v for k, v in fit.engine.describe().items() if k not in ("frontend_noise", "noise_seed")}
        print(f"{config['name']}: fitted engine {shown}")
        totals = {"measured": 0, **{v: 0 for v in VARIANTS}}
        for run in args.runs:
            records = read_records(run).records
            streams: list[Stream] = sorted(streams_of(records, {r.trace_id for r in records}),
                                           key=lambda s: s.intended)  # fmt: skip
            if not streams:
                print(f"  {run}: no finished streams")
                continue
            real = paired_steps([s.first for s in streams if s.prompt >= args.long])
            share = sum(s.gap_ms > args.gap_limit for s in streams) / len(streams)
            totals["measured"] += real
            row = [f"measured {real} paired steps, {share:.2%} of worst gaps over {args.gap_limit:g} ms"]
            for name, flags in VARIANTS.items():
                outs = replay(replace(fit.engine, **flags), streams)
                pairs = paired_steps([s.intended + o.ttft_ms / 1000 for s, o in zip(streams, outs, strict=True)
                                      if s.prompt >= args.long])  # fmt: skip
                over = sum(o.worst_gap_ms > args.gap_limit for o in outs) / len(outs)
                totals[name] += pairs
                row.append(f"{name} {pairs} ({over:.2%})")
            long_n = sum(s.prompt >= args.long for s in streams)
            print(f"  {run.name}: {len(streams)} streams, {long_n} long: " + "; ".join(row))
        print("  all runs: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
