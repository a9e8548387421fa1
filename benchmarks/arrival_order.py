"""Did the server take each gated batch in trace order? Read back from vLLM's request log.

The suite names every request ``X-Request-Id: tg-<run>-<stage>-<trace id>``; a vLLM started with
``--enable-log-requests`` logs ``Received request cmpl-tg-<run>-<stage>-<trace id>-0`` as its API
server takes each request in, so the log's line order is the server's arrival order. Prints, per
batch, whether that order is trace order, and the spread of the client's write instants.

    python benchmarks/arrival_order.py SERVER_LOG RESULTS_DIR [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from tailgate.records import RequestRecord, read_records

RECEIVED = re.compile(r"Received request cmpl-tg-(?P<run>[0-9a-f]+)-(?P<stage>\d+)-(?P<trace>\d+)")


def server_order(log_text: str) -> dict[tuple[str, int], list[int]]:
    """(run id, stage) -> trace ids in the order the server logged receiving them."""
    out: dict[tuple[str, int], list[int]] = {}
    for m in RECEIVED.finditer(log_text):
        out.setdefault((m["run"], int(m["stage"])), []).append(int(m["trace"]))
    return out


def check(log_text: str, records: list[RequestRecord]) -> dict[str, Any]:
    order = server_order(log_text)
    batches: dict[tuple[str, int, int], list[RequestRecord]] = {}
    for r in records:
        if r.arm == "gated" and r.batch is not None:
            batches.setdefault((r.run_id, r.stage, r.batch), []).append(r)
    rows = []
    for (run, stage, batch), recs in sorted(batches.items()):
        ids = sorted(r.trace_id for r in recs)
        seen = [t for t in order.get((run, stage), []) if t in set(ids)]
        written = [r.request_written_s for r in sorted(recs, key=lambda r: r.trace_id)]
        known = [w for w in written if w is not None]
        rows.append({
            "run_id": run, "stage": stage, "batch": batch, "size": len(ids),
            "server_saw": len(seen), "server_in_trace_order": seen == ids if len(seen) == len(ids) else None,
            "writes_in_trace_order": known == sorted(known) if len(known) == len(ids) else None,
            "write_spread_ms": round((max(known) - min(known)) * 1e3, 3) if known else None,
        })  # fmt: skip
    logged = [r for r in rows if r["server_in_trace_order"] is not None]
    return {
        "batches": len(rows),
        "batches_logged_by_server": len(logged),
        "batches_in_trace_order_at_server": sum(1 for r in logged if r["server_in_trace_order"]),
        "batches_written_in_trace_order": sum(1 for r in rows if r["writes_in_trace_order"]),
        "rows": rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server_log")
    p.add_argument("results_dir")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = check(Path(args.server_log).read_text(errors="replace"), read_records(args.results_dir).records)
    print(
        f"gated batches: {result['batches']}; logged by the server: {result['batches_logged_by_server']}; "
        f"in trace order at the server: {result['batches_in_trace_order_at_server']}; "
        f"written in trace order by the client: {result['batches_written_in_trace_order']}"
    )
    if not result["batches_logged_by_server"]:
        print("the server log has no 'Received request cmpl-tg-...' lines: start vLLM with --enable-log-requests")
    bad = [r for r in result["rows"] if r["server_in_trace_order"] is False]
    for r in bad[:10]:
        print(f"  batch {r['batch']} (stage {r['stage']}) reached the server out of trace order")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
