"""What a long prompt's chunks cost, read from a finished search's records: its TTFT (every chunk) beside the stall
it put on the streams already running (its last chunk only), and the probes replayed with given prefill costs.

Under chunked prefill a 6,000-token prompt is prefilled over several steps, and the stall a running stream feels
is the step of one chunk; with a cost per token alone every chunk costs the same, so the worst of them is the
whole prompt's cost over the number of chunks. Where the last chunk (the one that attends to the most of its own
prompt) costs clearly more than that share, the engine has a context term that the flat cost leaves out, and
the fitted model's worst gaps replay short. ``--try A,C`` replays every probe with ``A`` ms per prefilled token
and ``C`` ms per token per 1,000 before it in its prompt (the other costs as given by ``--engine``), so a
candidate can be judged against each probe's measured percentiles before it is offered to the fit.

Run: ``python benchmarks/slo_chunk_stalls.py RESULTS [--config NAME] [--long 3000]
[--try 0.0093,0.0044 ...] [--engine '{"slots": 128, "step_ms": 0.933, "chunked": true, "chunk_tokens": 2048}']``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.slo_refit import load_search, read_state
from tailgate.records import read_records
from tailgate.slo.servicefit import replay_fit
from tailgate.verify.groundtruth.engine import EngineModel


def stalls(folder: Path, long_tokens: int) -> list[tuple[float, float, int]]:
    """Per long prompt that arrived with streams running: (its TTFT ms, the worst gap among the running streams
    whose worst gap ended between its send and its first token, how many such streams)."""
    recs = [r for r in read_records(folder).records if r.worst_gap_ms]
    out = []
    for r in recs:
        prompt = r.prompt_tokens or r.prompt_tokens_planned or 0
        if prompt < long_tokens or r.first_chunk_s is None:
            continue
        sent, first = r.intended_s, r.first_chunk_s
        victims = [v.worst_gap_ms for v in recs if v.worst_gap_end_s and v.first_chunk_s and v.worst_gap_ms
                   and v.first_chunk_s < sent <= v.worst_gap_end_s <= first + 0.01]  # fmt: skip
        if victims:
            out.append(((first - sent) * 1000.0, max(victims), len(victims)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--config", default=None, help="configuration name (default: the first)")
    p.add_argument("--long", type=int, default=3000, help="prompts of at least this many tokens are long")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="A,C")
    p.add_argument("--engine", default="{}", help="JSON of the other EngineModel fields for --try")
    args = p.parse_args(argv)
    state = read_state(p, args.results)
    configs = state.get("configs", [])
    config = next((c for c in configs if args.config in (None, c.get("name"))), None)
    if config is None:
        p.error(f"no configuration {args.config!r} in {args.results / 'slo.json'}")
    for probe in sorted(config.get("probes", []), key=lambda x: float(x["rate"])):
        for a in probe.get("attempts", []):
            rows = stalls(args.results / a["dir"], args.long)
            if not rows:
                continue
            ttft = statistics.median(t for t, _, _ in rows)
            gap = statistics.median(g for _, g, _ in rows)
            print(f"{float(probe['rate']):>7g} req/s {a['dir']}: {len(rows)} long prompts with streams running: "
                  f"median TTFT {ttft:.1f} ms, median worst stall on the running streams {gap:.1f} ms "
                  f"({gap / ttft:.0%} of the TTFT)")  # fmt: skip
    if not args.tries:
        return 0
    search = load_search(args.results, config, state["plan"])
    if search is None:
        p.error("no model can be fitted to this search (no workload, or limits at different percentiles)")
    try:
        fields = json.loads(args.engine)
        costs = [tuple(float(x) for x in t.split(",")) for t in args.tries]
    except ValueError as e:
        p.error(f"--engine or --try: {e}")
    for a_cost, c_cost in costs:
        engine = EngineModel(**{**fields, "prefill_ms_per_token": a_cost, "prefill_ms_per_token_ctx": c_cost})
        rows_, score = replay_fit(engine, search.probes, search.q, tuple(search.limits), search.limits)
        print(f"prefill {a_cost:g} ms/token + {c_cost:g} per 1,000 before it: score {score:.3f}")
        for r in rows_:
            print(f"  {r.rate:>7g} req/s {r.key:<9} measured {r.measured:>8.1f} ms  replayed {r.model:>8.1f} ms  "
                  f"{'agrees' if r.inside else 'DISAGREES'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
