"""Side-by-side table of an H200 run: the suite vs the reference harness (same server session)
vs the harness's earlier session (when ``../shared/gpu/reference-runs`` is present) vs the article.

    python benchmarks/h200/compare.py results/h200 > results/h200/comparison.md

A cell agrees when the suite is within ±15% of the same-session harness, or inside the range
spanned by the two harness sessions (the harness against itself, on another day).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: The article's published figures (ms): ttft_p50, ttft_p99, gap_p50, gap_p99, total_p50, total_p99.
ARTICLE: dict[str, tuple[float | None, ...]] = {
    "cont_r1": (17.0, 154.0, 5.9, 129.7, 507.2, 3434.1),
    "cont_r5": (19.3, 161.2, 18.3, 134.9, None, 4409.3),
    "cont_r10": (24.1, 252.2, 129.6, 189.9, None, 5723.2),
    "cont_r20": (47.7, 394.8, 159.9, 212.7, None, 12510.4),
    "gated_b16": (195.8, 637.2, 52.8, 203.6, None, 4073.6),
    "nochunk_r5": (None, 161.1, None, 134.3, None, 4482.3),
    "nochunk_r10": (None, 249.4, None, 267.8, None, 5844.2),
}
KEYS = ("ttft_p50", "ttft_p99", "gap_p50", "gap_p99", "total_p50", "total_p99")
CELLS = {  # table name -> (suite cell folder, harness file name)
    "cont_r1": ("chunked_cont_r1", "cont_r1"),
    "cont_r5": ("chunked_cont_r5", "cont_r5"),
    "cont_r10": ("chunked_cont_r10", "cont_r10"),
    "cont_r20": ("chunked_cont_r20", "cont_r20"),
    "gated_b16": ("chunked_gated_b16", "gated_b16"),
    "nochunk_r5": ("nochunk_cont_r5", "nochunk_r5"),
    "nochunk_r10": ("nochunk_cont_r10", "nochunk_r10"),
    "preempt_r10": ("preempt_cont_r10", "preempt_r10"),
}


def load(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj.get("summary", obj)


def verdict(ours: float | None, same: float | None, other: float | None) -> str:
    if ours is None or same is None:
        return ""
    if abs(ours - same) <= 0.15 * same:
        return "✓"
    if other is not None and min(same, other) <= ours <= max(same, other):
        return "✓ (spread)"
    return f"✗ ({(ours - same) / same:+.0%})"


def main(root: Path) -> None:
    refs = Path(__file__).resolve().parents[3] / "shared" / "gpu" / "reference-runs"
    print("| cell | metric | suite | harness, same session | harness, earlier session | article | agrees |")
    print("|---|---|---:|---:|---:|---:|---|")
    summary: dict[str, dict] = {}
    for name, (cell, harness) in CELLS.items():
        suite = next(iter(sorted((root / "suite" / cell).glob("summary-*.json"))), None)
        ours = load(suite) if suite else None
        same = load(root / "harness" / f"{harness}.json")
        other = load(refs / f"{harness}.summary.json")
        if ours is None:
            continue
        summary[name] = ours
        art = ARTICLE.get(name, (None,) * 6)
        for i, key in enumerate(KEYS):
            o, s = ours.get(key), same.get(key) if same else None
            e = other.get(key) if other else None
            print(f"| {name} | {key} | {o} | {s if s is not None else '–'} | {e if e is not None else '–'} | "
                  f"{art[i] if art[i] is not None else '–'} | {verdict(o, s, e)} |")  # fmt: skip
        pre = (ours.get("preemptions_delta"), same.get("preemptions_delta") if same else None,
               other.get("preemptions_delta") if other else None)  # fmt: skip
        print(f"| {name} | preemptions | {pre[0]} | {pre[1]} | {pre[2] if pre[2] is not None else '–'} | 0 | |")
    if "cont_r10" in summary and "nochunk_r10" in summary:
        ratio = summary["nochunk_r10"]["gap_p99"] / summary["cont_r10"]["gap_p99"]
        print(f"\nChunked prefill off, gap p99 at 10 req/s: x{ratio:.2f} (suite); the article reports x1.41.")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/h200"))
