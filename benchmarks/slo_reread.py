"""Re-read a finished ``tailgate slo`` folder with the current verdict rules, probe by probe.

Verdicts stored in ``slo.json`` are those of the rules the search ran under. This prints what each probe's
recorded requests support under today's rules (distribution-free bounds with the design effect, the
steady-state check), without sending anything, so an older answer can be corrected from its own data.

Run: ``python benchmarks/slo_reread.py results/h200/slo``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tailgate import slo
from tailgate.slo.plan import SloPlan
from tailgate.slo.probe import SloRunner


def probe_attempts(reader: SloRunner, root: Path, probe: Mapping[str, Any]) -> list[slo.ProbeAttempt]:
    """One probe of ``slo.json`` as a verdict reads it: each attempt's folder, with its workload's seed, since runs
    of one seed are one workload and their blocks are clustered together."""
    folders = [root / a["dir"] for a in probe["attempts"]]
    return [
        replace(reader._attempt_data(d, slo.ProbeMark.read(d / slo.PROBE_MARK)), workload=int(a["seed"]))
        for d, a in zip(folders, probe["attempts"], strict=True)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="a tailgate slo results folder (with slo.json)")
    args = p.parse_args(argv)
    root = Path(args.results)
    state = json.loads((root / slo.SLO_FILE).read_text())
    limits = slo.parse_slo(state["plan"]["slo"])
    plan = SloPlan(limits=limits, configs=[], n=state["plan"]["n"], warmup=state["plan"]["warmup"],
                   reruns=int(state["plan"].get("reruns", 0)), extend=int(state["plan"].get("extend", 0)))  # fmt: skip
    reader = SloRunner(plan, None, root, log=lambda _line: None)
    print(f"SLO {state['plan']['slo']}; confidence {plan.confidence:.0%} one-sided, each of a probe's "
          f"{plan.looks} looks at {plan.look_confidence:.1%}")  # fmt: skip
    print("| configuration | rate | verdict then | verdict now | attempts (seeds) | why, per check |")
    print("|---|---:|---|---|---|---|")
    for c in state["configs"]:
        for pr in sorted(c["probes"], key=lambda x: x["rate"]):
            attempts = probe_attempts(reader, root, pr)
            verdict, checks = slo.check_probe(attempts, limits, level=plan.look_confidence, rate=pr["rate"])
            why = "; ".join(f"{ch.key}: {ch.verdict} (n {ch.n}, effective {ch.n_effective})" if ch.n_effective
                            is not None else f"{ch.key}: {ch.verdict}" for ch in checks)  # fmt: skip
            seeds = ", ".join(str(a.get("seed")) for a in pr["attempts"])
            print(f"| {c['name']} | {pr['rate']:g} | {pr['verdict']} | {verdict} | {len(attempts)} ({seeds}) | {why} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
