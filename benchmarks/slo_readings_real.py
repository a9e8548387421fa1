"""Which readings of an extrapolated prefill cost a real engine's own windows rule out.

A search whose probes never saw the largest steps answers with the union of the fitted square's readings past
them (:mod:`tailgate.slo.readings`), and its confirmation runs one probe between the readings first. This checks
that rule on a real engine without a device: the model is fitted to a finished search's probes (as
``slo_refit.py`` does), every long run given is cut into windows of one confirmation probe's length (consecutive
slices of its measured requests, each with the 25 before it as warm-up), and each window is judged as the
between probe would be: its verdict on the search's limits, each reading's capacity ratio on the window's own
requests, and the bracket left (:attr:`tailgate.slo.readings.ReadingsTest.bounds`). It prints the readings, then
per window the bracket and what was ruled out, then per reading how many windows ruled it out and, with
``--truth LOW,HIGH``, how many windows left a bracket holding the truth. Nothing is written unless ``--json``
names a file.

Run: ``python benchmarks/slo_readings_real.py SEARCH RUN [RUN ...] [--window 560] [--truth 9,10.5]``. The H100
kept in the tree (its second search, probes at 5-20 req/s, and the four long runs)::

    mkdir -p /tmp/h1 && for t in results/h100/slo2/*.tar.gz results/h100/truth/*.tar.gz; do tar xzf $t -C /tmp/h1; done
    python benchmarks/slo_readings_real.py /tmp/h1/slo /tmp/h1/truth/chunked/r{9,10p5,12} --window 560 --truth 9,10.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slo_refit import load_search

from tailgate import slo
from tailgate.records import read_records
from tailgate.slo.confirm import LENGTH
from tailgate.slo.readings import ReadingsTest, between_rate, judge_readings, readings_of
from tailgate.slo.replay import model_answer
from tailgate.slo.servicefit import probes_of
from tailgate.stats import measured_records

WARMUP = 25


def windows_of(run: Path, size: int) -> list[tuple[float, list[Any]]]:
    """The long run's records cut into windows of ``size`` measured requests, each with its warm-up before it."""
    document = json.loads((run / "slo.json").read_text())
    out = []
    for probe in document["configs"][0]["probes"]:
        rate = float(probe["rate"])
        for a in probe["attempts"]:
            recs = sorted(read_records(run / a["dir"]).records, key=lambda r: r.intended_s)
            for start in range(WARMUP, len(recs) - size + 1, size):
                out.append((rate, recs[start - WARMUP : start + size]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("search", type=Path, help="a finished tailgate slo folder (the model is fitted to its probes)")
    p.add_argument("runs", type=Path, nargs="+", help="long runs, each a tailgate slo folder of one probe")
    p.add_argument("--window", type=int, default=0, help="measured requests a window (default: a confirmation's)")
    p.add_argument("--replicates", type=int, default=4)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--truth", default="", help="LOW,HIGH: the long runs' bracket, to count the windows that hold it")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    document = json.loads((args.search / "slo.json").read_text())
    plan, config = document["plan"], document["configs"][0]
    search = load_search(args.search, config, plan)
    if search is None:
        print("slo_readings_real: no model can be fitted to that search", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    answer = model_answer(search.probes, search.limits, search.q, search.measured, workload=search.workload,
                          requests=args.requests, replicates=args.replicates, seed=search.seed,
                          chunks=search.chunks)  # fmt: skip
    readings = readings_of(answer)
    print(f"model {answer.capacity} [{answer.low}, {answer.high}] ({time.monotonic() - t0:.0f} s): "
          f"{'; '.join(r.text() for r in readings) or 'one reading'}")  # fmt: skip
    if not readings:
        return 0
    print(f"the between probe would run at {between_rate(readings)} req/s")
    limits_text = ",".join(f"{lim['metric']}_p{lim['p']:g}<={lim['limit']:g}ms" for lim in plan["limits"] if lim["p"])
    size = args.window or int(LENGTH * int(plan.get("n", 500)))
    ruled: dict[str, int] = {r.name: 0 for r in readings}
    truth = tuple(float(x) for x in args.truth.split(",")) if args.truth else None
    held = 0
    rows = []
    for run in args.runs:
        for k, (rate, recs) in enumerate(windows_of(run, size)):
            attempt = slo.ProbeAttempt(measured_records(recs, WARMUP), sent=len(recs), errors=0, records=recs,
                                       workload=k)  # fmt: skip
            verdict, checks = slo.check_probe([attempt], slo.parse_slo(limits_text), rate=rate)
            probe = probes_of({rate: [attempt]}, {rate: list(checks)})[0]
            test = ReadingsTest(1, rate, verdict, tuple(judge_readings(readings, rate, verdict, probe, search.q,
                                                                       search.limits)))  # fmt: skip
            for j in test.judged:
                ruled[j.reading.name] += bool(j.ruled_out)
            low, high = test.bounds
            holds = truth is None or (low <= truth[0] and truth[1] <= high)
            held += holds
            out = "; ".join(f"{j.reading.name}: {j.ruled_out}" for j in test.judged if j.ruled_out) or "none"
            print(f"  {run.name} window {k + 1} at {rate:g} req/s ({verdict}): bracket [{low:.3g}, {high:.3g}]"
                  f"{'' if truth is None else ' holds' if holds else ' MISSES'}; ruled out {out}")  # fmt: skip
            rows.append({"run": str(run), "window": k + 1, "rate": rate, "verdict": verdict, **test.to_json()})
    for name, count in ruled.items():
        print(f"{name}: ruled out in {count} of {len(rows)} windows")
    if truth is not None:
        print(f"the bracket holds [{truth[0]:g}, {truth[1]:g}] in {held} of {len(rows)} windows")
    if args.json:
        args.json.write_text(json.dumps({"model": answer.as_dict(), "windows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
