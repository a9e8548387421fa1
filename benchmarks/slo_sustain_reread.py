"""Every attempt of finished ``tailgate slo`` folders, its "sustained" check read again with this tree's rule.

Whether a rate kept up is decided on each attempt's own records and the server's waiting-queue samples kept in its
``slo-probe.json``; a change to the rule is judged on real attempts whose long-run truth is known (a search and
its same-day truth runs, kept in ``benchmarks/results/slo-truth-real/``). Prints, per attempt: the verdict and
its reason, the share of the window's arrivals that ended in it, the share of the requests that were due that
did, and the TTFT trend's rise.

Run: ``python benchmarks/slo_sustain_reread.py FOLDER [FOLDER ...]`` (a search or truth results folder), e.g.
``tar xzf benchmarks/results/slo-truth-real/cpu-search-2026-12-06-stop60.tar.gz -C /tmp`` and
``tar xzf benchmarks/results/slo-truth-real/cpu-truth-2026-12-06-stop60.tar.gz -C /tmp``, then
``python benchmarks/slo_sustain_reread.py /tmp/cpu-search-stop60 /tmp/truth/r16 /tmp/truth/r17 /tmp/truth/r18``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.slo_refit import read_state
from tailgate.records import read_records
from tailgate.slo.attempt import ProbeAttempt
from tailgate.slo.spec import parse_slo
from tailgate.slo.verdict import TREND_MATERIAL, sustain_check
from tailgate.stats import measured_records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+")
    args = p.parse_args(argv)
    for folder in args.folders:
        plan = read_state(p, folder)["plan"]
        limits = parse_slo(",".join(f"{lim['metric']}_p{lim['p']:g}<={lim['limit']:g}ms" for lim in plan["limits"]
                                    if lim.get("p") is not None and lim["metric"] in ("ttft", "total")))  # fmt: skip
        material = TREND_MATERIAL * min((lim.limit for lim in limits), default=0.0)
        warmup = int(plan.get("warmup", 25))
        for mark_file in sorted(folder.glob("*/slo-probe.json")):
            mark = json.loads(mark_file.read_text())
            recs = read_records(mark_file.parent).records
            attempt = ProbeAttempt(measured_records(recs, warmup), sent=len(recs), errors=0, records=recs,
                                   waiting_series=tuple(mark.get("waiting_series") or ()))  # fmt: skip
            row = sustain_check([attempt], float(mark["rate"]), material).attempts[0]
            rise = row.ttft_trend.rise if row.ttft_trend else None
            print(f"{folder.name}/{mark_file.parent.name}: {row.verdict}: {row.reason}; ended in the window "
                  f"{row.keep_up}, of those due {row.due_keep_up}; TTFT rise {rise} ms "
                  f"(material {material:g})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
