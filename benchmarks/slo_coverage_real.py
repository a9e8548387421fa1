"""Coverage of the capacity answer on real engines: every kept real search refitted with this tree, scored against
the long-run truth of the same engine and SLO.

The simulated coverage (``slo_coverage.py``) knows each engine's capacity exactly; a real engine's is known only
from long runs beside the search (``real_searches.json``: a rate that passed over thousands of requests, one that
failed, either side possibly unknown, and for the CPU vLLM only the same session's, since its speed moves 20%
between days). Each search's probes are refitted as ``slo_refit.py`` does, and its answer with this tree is the
model's narrowed bracket where the model is usable, else the measured bracket the search reached (for a search
run under older verdict rules, ``measured_now``: what its probes support under this tree's, by
``slo_reread.py``). An answer *holds* where no side of the truth contradicts it (it does not end under a rate
that passed, nor start at or over one that failed); it is *closed* where both its ends are rates; the issue's
count is closed and holding. What a refit cannot show: the confirmation probes a live search with this tree
would choose and run after the fit, so the last column says what this tree prints from the same probes
alone: the measured bracket (an untested model is "not confirmed"), or, for a search this tree's decision code
ran, the answer it printed live (``live_answer``). Those a kept search ran (chosen by the tree
that ran it) are fitted as ordinary probes, then judged as this tree judges a refit after a contradiction: a
refitted model they still contradict is refused, and the answer is the measured bracket.

Run: ``python benchmarks/slo_coverage_real.py [--only NAME,...] [--engine H100|H200|CPU] [--replicates 8]
[--requests 10000] [--json out.json]`` (2-7 minutes of two cores per search; searches without any side of a truth,
or without records, are listed and skipped); ``--scored out.json`` scores an earlier run's answers against the
catalogue's truths as they are now, without refitting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.slo_refit import Search, load_search  # noqa: E402
from tailgate.slo.confirm import Confirmation, contradicted_already  # noqa: E402
from tailgate.slo.replay import ModelAnswer, model_answer  # noqa: E402

CATALOGUE = Path(__file__).with_name("real_searches.json")
Bracket = tuple[float | None, float | None]


@dataclass
class Scored:
    name: str
    engine: str
    truth: Bracket
    measured: Bracket
    answer: Bracket
    source: str
    """``model`` (the fitted step loop's narrowed bracket) or ``measured`` (no usable model)."""
    capacity: float | None
    why: str
    probing_s: float | None
    live: Bracket | None = None
    """The answer the search printed live, where its decision code is this tree's (``live_answer``): a model that
    its own confirmation probes, chosen after the fit, let stand; None: an older tree's search."""

    @property
    def holds(self) -> bool:
        return holds(self.answer, self.truth)

    @property
    def closed(self) -> bool:
        return is_closed(self.answer)

    @property
    def printed(self) -> Bracket:
        """What this tree prints from these probes: the live answer of a search it ran; else the measured bracket,
        since a refit no probe tested after its fit is not confirmed (``settle_confirmed``)."""
        return self.live if self.live is not None else self.measured

    @property
    def printed_holds(self) -> bool:
        return holds(self.printed, self.truth)

    @property
    def printed_closed(self) -> bool:
        return is_closed(self.printed)

    @property
    def width(self) -> float | None:
        """The closed answer's width over its middle (the issue's target: 15%)."""
        low, high = self.answer
        if low is None or high is None or low + high <= 0:
            return None
        return (high - low) / ((high + low) / 2.0)


def is_closed(bracket: Bracket) -> bool:
    """Both ends are rates: an answer that says where the capacity lies, not only on which side of a probe."""
    return bracket[0] is not None and bracket[1] is not None


def holds(answer: Bracket, truth: Bracket) -> bool:
    """No side of the truth contradicts the answer: it does not end at or under a rate that passed over a long run,
    nor start at or over one that failed (an open end contradicts nothing on its side). A measured answer's upper
    end is a rate a probe failed: the capacity it states lies under it, so a long run passing at that rate is a miss."""
    low, high = answer
    passed, failed = truth
    if passed is not None and high is not None and high <= passed:
        return False
    return not (failed is not None and low is not None and low >= failed)


def kind(engine: str) -> str:
    for name in ("H100", "H200", "CPU"):
        if name.lower() in engine.lower():
            return name
    return "other"


def results_folder(entry: dict[str, Any], scratch: Path) -> Path:
    """The search's results folder: the catalogue's folder as it is, or unpacked from its archive into a fresh
    directory (a stale folder from another archive must never be read in its place)."""
    source = ROOT / entry["archive"]
    folder = entry.get("folder") or "."
    if source.is_dir():
        return source / folder
    target = Path(tempfile.mkdtemp(prefix=entry["name"] + "-", dir=scratch))
    with tarfile.open(source) as tar:
        tar.extractall(target, filter="data")
    return target / folder


def catalogued(entry: dict[str, Any], scratch: Path) -> tuple[Path, dict[str, Any], dict[str, Any]] | str:
    """A catalogued search's results folder, its ``slo.json`` and the configuration the entry names, or why not."""
    folder = results_folder(entry, scratch)
    state_file = folder / "slo.json"
    if not state_file.is_file():
        return f"no slo.json in {entry['archive']}"
    state = json.loads(state_file.read_text())
    config = next((c for c in state.get("configs", []) if c.get("name") == entry["config"]), None)
    if config is None:
        return f"no configuration {entry['config']!r} in its slo.json"
    return folder, state, config


def score(entry: dict[str, Any], args: argparse.Namespace, scratch: Path) -> Scored | str:
    """One search refitted and scored, or why it cannot be."""
    truth = (entry["truth"][0], entry["truth"][1])
    if truth == (None, None):
        return "no long-run truth of this engine and SLO"
    found = catalogued(entry, scratch)
    if isinstance(found, str):
        return found
    folder, state, config = found
    # a search that ran under older verdict rules is answered with what its probes support under this tree's
    # (``measured_now``, read by ``slo_reread.py``): the model narrows that bracket, not the one the search printed
    now = entry.get("measured_now", entry["measured"])
    measured = (now[0], now[1])
    search = load_search(folder, config, state["plan"])
    fitted: dict[str, Any] = {}
    answer_: ModelAnswer | None = None
    if search is not None:
        answer_ = model_answer(search.probes, search.limits, search.q, measured, workload=search.workload,
                               requests=args.requests, replicates=args.replicates, seed=search.seed,
                               chunks=search.chunks)  # fmt: skip
        fitted = answer_.as_dict()
    bracket = fitted.get("bracket")
    refused = own_confirmations_refuse(answer_, config, search) if answer_ is not None and search and bracket else ""
    if fitted.get("usable") and bracket and not refused:
        answer, source = (bracket[0], bracket[1]), "model"
    else:
        answer, source = measured, "measured"
    why = refused or str(fitted.get("why") or "no fitted model (no streams, or limits at different percentiles)")
    return Scored(entry["name"], entry["engine"], truth, measured, answer, source, fitted.get("capacity"), why,
                  entry.get("probing_s"), live_of(entry))  # fmt: skip


def live_of(entry: dict[str, Any]) -> Bracket | None:
    live = entry.get("live_answer")
    return None if live is None else (live[0], live[1])


def own_confirmations_refuse(fitted: ModelAnswer, config: dict[str, Any], search: Search) -> str:
    """Why the search's own confirmation probes refuse the refitted model ('' when none does), as the tree treats a
    refit after a contradiction (``contradicted_already``): a decided verdict on the wrong side of its interval, or
    a window off its claim. A refit runs no confirmation probe of its own; a search that ran some measured the
    windows this fit must also answer to."""
    by_rate = {p.rate: p for p in search.probes}
    earlier = [(Confirmation(float(p["rate"]), "above", str(p.get("verdict"))), by_rate.get(float(p["rate"])))
               for p in config.get("probes", []) if p.get("phase") == "confirm"]  # fmt: skip
    if not earlier:
        return ""
    stale = contradicted_already(fitted, earlier, search.q, search.limits, 2)
    if stale is None:
        return ""
    return "refused by the search's own confirmation: " + stale.why.split(": ", 1)[1]


def text(b: Bracket) -> str:
    return "[" + ", ".join("-" if x is None else f"{x:g}" for x in b) + "]"


def line(s: Scored) -> str:
    width = "" if s.width is None else f", {s.width:.0%} wide"
    out = (f"{s.name:<26} truth {text(s.truth):<12} measured {text(s.measured):<13} answer {text(s.answer)} "
           f"({s.source}{width}): {'holds' if s.holds else 'MISSES'}{'' if s.closed else ', open'}")  # fmt: skip
    if s.source == "measured":
        out += f"\n{'':<27}model: {s.capacity} req/s, not used: {s.why[:160]}"
    if s.live is not None:
        verdict = "holds" if s.printed_holds else "MISSES"
        out += f"\n{'':<27}printed live by this tree: {text(s.live)}: {verdict}"
    return out


def table(scored: list[Scored]) -> str:
    """Per engine: the refitted model's answers (a prediction no probe tested after the fit), and what this tree
    would print from the same probes (the measured bracket: an untested model is not printed)."""
    out = ["| engine | searches | closed and holding | holding, open | missing | answers from the model | median "
           "width (closed) | median probing | printed from these probes: holding (closed) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in ("H100", "H200", "CPU", "other"):
        group = [s for s in scored if kind(s.engine) == name]
        if not group:
            continue
        widths = [s.width for s in group if s.closed and s.width is not None]
        med = f"{statistics.median(widths):.0%}" if widths else "-"
        times = [s.probing_s for s in group if s.probing_s is not None]
        probing = f"{statistics.median(times) / 60:.1f} min" if times else "-"
        out.append(f"| {name} | {len(group)} | {sum(s.closed and s.holds for s in group)} | "
                   f"{sum(s.holds and not s.closed for s in group)} | {sum(not s.holds for s in group)} | "
                   f"{sum(s.source == 'model' for s in group)} | {med} | {probing} | "
                   f"{sum(s.printed_holds for s in group)} ({sum(s.printed_closed for s in group)}) |")  # fmt: skip
    return "\n".join(out)


def rescored(path: Path, entries: list[dict[str, Any]]) -> list[Scored]:
    """The answers of an earlier run (its ``--json``), scored against the catalogue's truths as they are now: an
    answer does not depend on the truth, so a new long run re-scores every search without refitting one."""
    by_name = {e["name"]: e for e in entries}
    out = []
    for row in json.loads(path.read_text()):
        entry = by_name.get(row["name"])
        if entry is None:
            continue
        out.append(Scored(row["name"], entry["engine"], (entry["truth"][0], entry["truth"][1]),
                          (row["measured"][0], row["measured"][1]), (row["answer"][0], row["answer"][1]),
                          row["source"], row["capacity"], row["why"], entry.get("probing_s"),
                          live_of(entry)))  # fmt: skip
    return out


def selected(parser: argparse.ArgumentParser, only: str, engine: str) -> list[dict[str, Any]]:
    """The catalogue's searches named by ``--only`` (comma-separated; every one when empty) of ``--engine`` (H100,
    H200 or CPU; any when empty); a name not in the catalogue ends the command with a one-line message."""
    entries: list[dict[str, Any]] = json.loads(CATALOGUE.read_text())["searches"]
    wanted = {n for n in only.split(",") if n}
    unknown = wanted - {e["name"] for e in entries}
    if unknown:
        parser.error(f"not in {CATALOGUE.name}: {', '.join(sorted(unknown))}")
    return [
        e
        for e in entries
        if (not wanted or e["name"] in wanted) and (not engine or kind(e["engine"]) == engine.upper())
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated search names from the catalogue")
    p.add_argument("--engine", default="", help="H100, H200 or CPU: that engine's searches only")
    p.add_argument("--replicates", type=int, default=8)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--json", type=Path, default=None, help="write every scored search here")
    p.add_argument("--scored", type=Path, default=None,
                   help="no refits: score an earlier --json's answers against the catalogue's truths")  # fmt: skip
    args = p.parse_args(argv)
    entries = selected(p, args.only, args.engine)
    scored: list[Scored] = []
    if args.scored is not None:
        if not args.scored.is_file():
            p.error(f"{args.scored} not found: give the --json file of an earlier run")
        scored = [s for s in rescored(args.scored, entries) if s.truth != (None, None)]
        print("\n".join(line(s) for s in scored))
    else:
        with tempfile.TemporaryDirectory(prefix="coverage-real-") as scratch:
            for e in entries:
                result = score(e, args, Path(scratch))
                if isinstance(result, str):
                    print(f"{e['name']:<26} skipped: {result}", flush=True)
                    continue
                scored.append(result)
                print(line(result), flush=True)
    print()
    print(table(scored))
    if args.json:
        rows = [{"name": s.name, "engine": s.engine, "truth": list(s.truth), "measured": list(s.measured),
                 "answer": list(s.answer), "source": s.source, "capacity": s.capacity, "holds": s.holds,
                 "closed": s.closed, "width": s.width, "probing_s": s.probing_s, "why": s.why}
                for s in scored]  # fmt: skip
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
