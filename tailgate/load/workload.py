"""The seeded mixed-length trace, drawn exactly as the reference harness draws it.

Comparability across tools depends on identical draws: one ``random.Random(seed)`` and one
``rng.random()`` per item, with cumulative thresholds 0.70 and 0.90. Users who want their own
length mix bring a JSONL trace instead of changing the draw.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tailgate.optiontable import DEFAULT_SEED

PROMPT_WORD = "ocean "

#: (cumulative probability, prompt tokens, max tokens), in the reference harness's order.
SEED_MIX: tuple[tuple[float, int, int], ...] = (
    (0.70, 200, 100),
    (0.90, 1000, 300),
    (1.00, 6000, 600),
)


class TraceError(ValueError):
    """A trace file that cannot be used, with a message fit for one line of output."""


@dataclass(frozen=True, slots=True)
class TraceItem:
    id: int
    prompt_tokens: int
    max_tokens: int


def make_trace(length: int, seed: int = DEFAULT_SEED) -> list[TraceItem]:
    """Draw ``length`` items; the first ``warm-up`` of them are the warm-up by position."""
    rng = random.Random(seed)
    items = []
    for i in range(length):
        r = rng.random()
        if r < SEED_MIX[0][0]:
            prompt, out = SEED_MIX[0][1:]
        elif r < SEED_MIX[1][0]:
            prompt, out = SEED_MIX[1][1:]
        else:
            prompt, out = SEED_MIX[2][1:]
        items.append(TraceItem(i, prompt, out))
    return items


def build_prompt(prompt_tokens: int, word: str = PROMPT_WORD) -> str:
    """Filler text that the project's tokenizer (and most real ones) counts as one token per word."""
    return word * prompt_tokens


def mix_of(items: Iterable[TraceItem]) -> dict[str, int]:
    """Count items per (prompt→max) class, e.g. ``{"200→100": 371, ...}``."""
    counts: dict[str, int] = {}
    for it in items:
        key = f"{it.prompt_tokens}→{it.max_tokens}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0].split("→")[0])))


def save_jsonl(items: Sequence[TraceItem], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(asdict(it)) + "\n")


def load_jsonl(path: str | Path) -> list[TraceItem]:
    """Load a user trace; ids are renumbered by line order when absent.

    Every defect is reported as a :class:`TraceError` naming the file and line, so the CLI can
    print one line instead of a traceback.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"trace file {p} does not exist") from None
    except OSError as e:
        raise TraceError(f"trace file {p} cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"trace file {p} is not UTF-8 text") from None
    items: list[TraceItem] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # nesting deeper than the parser's stack is not a trace either
            raise TraceError(f"trace file {p} line {lineno}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise TraceError(f"trace file {p} line {lineno}: expected an object")
        prompt, out = obj.get("prompt_tokens"), obj.get("max_tokens")
        for name, value in (("prompt_tokens", prompt), ("max_tokens", out)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TraceError(f"trace file {p} line {lineno}: {name} must be a positive integer")
        assert isinstance(prompt, int) and isinstance(out, int)  # checked just above
        item_id = obj.get("id", len(items))
        if not isinstance(item_id, int) or isinstance(item_id, bool):
            raise TraceError(f"trace file {p} line {lineno}: id must be an integer")
        items.append(TraceItem(item_id, prompt, out))
    if not items:
        raise TraceError(f"trace file {p} holds no items")
    if len({it.id for it in items}) != len(items):
        raise TraceError(f"trace file {p}: ids are not unique")
    return items
