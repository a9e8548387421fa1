"""What paused the load process during a stage: the ``TAILGATE_STALL_LOG`` events of a self-check run,
placed on the stage's own time line (seconds after its first send).

Run the self-check with the watch on and the run kept, then point this at both:

    TAILGATE_STALL_LOG=/tmp/stall tailgate selfcheck --rate 50 --n 500 --keep /tmp/sc
    python benchmarks/stall_trace.py --log '/tmp/stall.*' --records /tmp/sc [--json out.json]

Prints every collection of generation 1 or 2 and every greenlet turn over the watch's threshold that fell
inside the stage (first send to last record end), with the records whose reads were merged late
(``client_coalesced``) beside it, so a pause and the streams it merged can be read off one table.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path
from typing import Any

from tailgate.records import RequestRecord, read_records


def stage_events(log_paths: list[str], records: list[RequestRecord]) -> dict[str, Any]:
    """The watch's events inside the stage, on its clock (s after the first send), and its merged streams."""
    timed = [(r.sent_mono_ns, r) for r in records if r.sent_mono_ns]
    if not timed:
        return {"error": "no records with sent_mono_ns"}
    t0 = min(sent for sent, _ in timed)
    end = max(sent + int(((r.end_s or r.sent_s) - r.sent_s) * 1e9) for sent, r in timed)
    events: list[dict[str, Any]] = []
    for path in log_paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            if t0 <= e["at_ns"] <= end and (e["kind"] == "turn" or e["generation"] > 0):
                events.append({**e, "at_s": round((e["at_ns"] - t0) / 1e9, 4)})
    events.sort(key=lambda e: e["at_ns"])
    merged = sorted(round((sent - t0) / 1e9, 3) for sent, r in timed if r.client_coalesced)
    gcs = [e for e in events if e["kind"] == "gc"]
    return {
        "stage_s": round((end - t0) / 1e9, 3),
        "records": len(records),
        "full_collections": sum(1 for e in gcs if e["generation"] == 2),
        "full_collection_ms": [e["ms"] for e in gcs if e["generation"] == 2],
        "gen1_collections": sum(1 for e in gcs if e["generation"] == 1),
        "gen1_max_ms": max((e["ms"] for e in gcs if e["generation"] == 1), default=None),
        "long_turns": sum(1 for e in events if e["kind"] == "turn"),
        "merged_streams_sent_at_s": merged,
        "events": events,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log", required=True, help="the watch's files (a glob: one file per load process)")
    p.add_argument("--records", required=True, help="the kept self-check folder (or a results folder)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--max-events", type=int, default=40, help="events listed at most (all go to --json)")
    args = p.parse_args(argv)
    paths = sorted(glob.glob(args.log))
    if not paths:
        sys.stderr.write(f"stall_trace: error: no file matches {args.log!r}\n")
        return 2
    result = stage_events(paths, read_records(Path(args.records)).records)
    if "error" in result:
        sys.stderr.write(f"stall_trace: error: {result['error']}\n")
        return 2
    print(
        f"stage {result['stage_s']} s, {result['records']} records; full collections in the stage: "
        f"{result['full_collections']} {result['full_collection_ms']} ms; generation-1: {result['gen1_collections']} "
        f"(longest {result['gen1_max_ms']} ms); greenlet turns over the threshold: {result['long_turns']}"
    )
    print(f"merged (client_coalesced) streams, sent at s: {result['merged_streams_sent_at_s']}")
    for e in result["events"][: args.max_events]:
        if e["kind"] == "gc":
            print(f"  {e['at_s']:8.3f} s  gc gen{e['generation']}  {e['ms']:8.3f} ms  tracked {e['tracked']}")
        else:
            print(f"  {e['at_s']:8.3f} s  turn      {e['ms']:8.3f} ms  {e['stack'][:1]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
