"""Is a missed capacity the model's error or the truth window's luck? A search's fitted model on a truth run's own
requests.

A model's answer is a long-run capacity (its p99 over hundreds of thousands of simulated requests of the mix); a
truth rate is one run of 4,000 requests, whose p99 has its own spread. When the two disagree, replaying the truth
run's arrivals and requests through the fitted model separates them: the model's p99 on the same requests against
the one measured (the model's error on this window, no sampling between them), and the model's p99 on these
requests against its own long-run curve at that rate (the window's luck). The window match
(:func:`tailgate.slo.windowmatch.window_match`) turns the first into a capacity ratio with a block-bootstrap
interval.

Run: ``python benchmarks/truth_replay.py SEARCH_FOLDER TRUTH_ATTEMPT_FOLDER [...] [--config chunked]``: the search's
``slo.json`` holds the fitted model; each truth folder holds one run's records (``slo_truth_real.py run`` writes
them as ``rRATE/CONFIG_slo_rRATE_a1``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate.records import read_records
from tailgate.slo.servicefit import METRIC_OF_OUTCOME, replay
from tailgate.slo.stepfit import streams_of
from tailgate.slo.windowmatch import window_match
from tailgate.verify.groundtruth.engine import EngineModel, quantile

Q = 0.99


def fitted_of(search: Path, config: str) -> tuple[EngineModel, list[dict[str, Any]]]:
    """The fitted engine of one configuration of a search, and its long-run curve (rate, per-metric p99 bands)."""
    state = json.loads((search / "slo.json").read_text())
    chosen = next((c for c in state["configs"] if c["name"] == config), None)
    fitted = (chosen or {}).get("result", {}).get("fitted") or {}
    if not fitted.get("engine"):
        raise SystemExit(f"truth_replay: no fitted model for {config!r} in {search / 'slo.json'}")
    known = EngineModel.__dataclass_fields__
    return EngineModel(**{k: v for k, v in fitted["engine"].items() if k in known}), fitted.get("curve", [])


def curve_at(curve: list[dict[str, Any]], rate: float, metric: str) -> float | None:
    """The long-run p99 the model gives at ``rate``, interpolated between the rates its search simulated."""
    points = sorted((p["rate"], p[metric][0]) for p in curve if metric in p)
    for (r0, v0), (r1, v1) in itertools.pairwise(points):
        if r0 <= rate <= r1:
            return v0 + (v1 - v0) * (rate - r0) / (r1 - r0) if r1 > r0 else v0
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("search", type=Path)
    p.add_argument("truths", type=Path, nargs="+")
    p.add_argument("--config", default="chunked")
    p.add_argument("--warmup", type=int, default=25, help="trace ids under this are the run's warm-up")
    args = p.parse_args(argv)
    engine, curve = fitted_of(args.search, args.config)
    print("| truth run | rate | metric | measured p99 | model on the same requests | window match: true / model's "
          "capacity | model's long-run p99 at this rate |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---:|")
    for folder in args.truths:
        records = read_records(folder).records
        if not records:
            print(f"truth_replay: no records in {folder}", file=sys.stderr)
            return 2
        streams = streams_of(records, {r.trace_id for r in records if r.trace_id >= args.warmup})
        outcomes = replay(engine, streams)
        rate = records[0].rate_or_batch or 0.0
        for metric in ("ttft", "gap"):
            measured = quantile([s.value(metric) for s in streams if s.measured], Q)
            modelled = quantile([getattr(o, METRIC_OF_OUTCOME[metric]) for o in outcomes], Q)
            match = window_match(engine, [streams], Q, metric)
            long_run = curve_at(curve, rate, metric)
            print(f"| {folder.name} | {rate:g} | {metric} | {measured:.1f} | {modelled:.1f} | "
                  f"{'-' if match is None else match.text().split(': ', 1)[1]} | "
                  f"{'-' if long_run is None else f'{long_run:.1f}'} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
