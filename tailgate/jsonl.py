"""Reading JSON-lines files that a live or killed process may still be writing.

Records, server samples and traces are all appended one line per ``write``, so the readers share one
set of rules: a line that does not parse as a JSON object is skipped and counted (a killed writer leaves
one at the end), and a follower only takes lines that end in a newline (the last may be half written).
Pure standard library: the load path and the web UI tab read with it under gevent, the analysis passes
a faster ``loads`` (orjson) for files of millions of lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from tailgate.jsontypes import JsonMapping

Loads = Callable[[bytes | str], object]
"""``json.loads`` or ``orjson.loads``: what a line decodes to is checked before it is handed on."""


def parse_object(raw: bytes | str, loads: Loads = json.loads) -> JsonMapping | None:
    """One line as a JSON object, or None when it is not one (cut, garbage, or not an object).

    Only its being an object is checked: its values are the caller's to read (``tailgate.jsontypes``), as
    a file of millions of records is turned into a frame without a look at each value."""
    try:
        obj = loads(raw)
    except (ValueError, RecursionError):  # orjson's and json's decode errors are ValueErrors
        return None
    return obj if isinstance(obj, dict) else None


def parse_lines(data: bytes, loads: Loads = json.loads) -> tuple[list[JsonMapping], int]:
    """Every JSON object in ``data``, and the count of non-blank lines that are not one.

    A clean block (the usual case) is parsed in one call as a JSON array of its lines; only a damaged
    one is walked line by line to skip what does not parse.
    """
    body = data.strip()
    if not body:
        return [], 0
    try:
        rows = loads(b"[" + body.replace(b"\n", b",") + b"]")  # a blank line fails here and is walked below
    except (ValueError, RecursionError):
        rows = None
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return rows, 0
    good: list[JsonMapping] = []
    bad = 0
    for raw in data.splitlines():
        if not raw.strip():
            continue
        obj = parse_object(raw, loads)
        if obj is None:
            bad += 1
        else:
            good.append(obj)
    return good, bad


def iter_objects(path: str | Path, loads: Loads = json.loads) -> Iterator[JsonMapping | None]:
    """Each non-blank line of a file as an object, None for a line that is not one (so callers count them)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                yield parse_object(raw, loads)


class Follower:
    """The complete lines appended to a set of files since the last call (a cut last line waits for its end).

    ``pattern`` is a glob inside ``folder``, or one file name: the same follower reads every worker's
    records or the one samples file.
    """

    def __init__(self, folder: str | Path, pattern: str) -> None:
        self.folder = Path(folder)
        self.pattern = pattern
        self._offsets: dict[Path, int] = {}

    def new_lines(self) -> list[bytes]:
        lines: list[bytes] = []
        for path in sorted(self.folder.glob(self.pattern)):
            start = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            if cut:
                lines.extend(data[:cut].splitlines())
                self._offsets[path] = start + cut
        return lines

    def new_objects(self) -> tuple[list[JsonMapping], int]:
        """The new complete lines as objects, and how many of them did not parse."""
        good: list[JsonMapping] = []
        bad = 0
        for line in self.new_lines():
            if not line.strip():
                continue
            obj = parse_object(line)
            if obj is None:
                bad += 1
            else:
                good.append(obj)
        return good, bad
