"""Extract the reference harness from the seed article for the H200 run, with ``ignore_eos`` added.

Random weights stop early at EOS, so the device's harness sends ``ignore_eos: true`` exactly as the
suite does (``--ignore-eos``); nothing else changes. The result goes under ``.gpu/`` (ignored by git,
carried to the device by the call that needs it) and is never committed.

    python benchmarks/h200/prepare_harness.py [--article PATH] [--out .gpu/harness/batching_bench.py]
"""

from __future__ import annotations

import argparse
import hashlib
import py_compile
import sys
from pathlib import Path

PAYLOAD_LINE = '        "stream": True,\n'
IGNORE_EOS_LINE = '        "ignore_eos": True,\n'


def prepare(article: Path, out: Path) -> str:
    """Write the harness to ``out``; return its sha256."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from compare_peers import extract_seed_harness  # the same extraction the peer benchmark uses

    out.parent.mkdir(parents=True, exist_ok=True)
    path = extract_seed_harness(article, out.parent)
    text = path.read_text(encoding="utf-8")
    if IGNORE_EOS_LINE not in text:
        if text.count(PAYLOAD_LINE) != 1:
            raise SystemExit("the harness's payload is not where expected; add ignore_eos by hand")
        text = text.replace(PAYLOAD_LINE, PAYLOAD_LINE + IGNORE_EOS_LINE)
    if path != out:
        path.unlink()
    out.write_text(text, encoding="utf-8")
    py_compile.compile(str(out), doraise=True)
    return hashlib.sha256(out.read_bytes()).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--article", default="/work/shared/reference/seed-article.txt")
    p.add_argument("--out", default=".gpu/harness/batching_bench.py")
    args = p.parse_args()
    digest = prepare(Path(args.article), Path(args.out))
    print(f"{args.out} sha256 {digest}")


if __name__ == "__main__":
    main()
