"""``tailgate report RESULTS_DIR``: every failure is one line on stderr and exit status 2.

A report is often built long after the run, on another machine, by someone who did not run
it; a traceback helps nobody there, a sentence naming the folder or option does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

PROG = "tailgate report"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parser() -> _Parser:
    p = _Parser(
        prog=PROG,
        description="Table, charts, diagnosis and a self-contained HTML report from a results folder.",
        allow_abbrev=False,  # as every other command of the suite: options spelt out
    )
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="a run folder, or a suite folder of run folders")
    p.add_argument("--out", metavar="DIR", help="where to write the report (default: RESULTS_DIR/report)")
    p.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="Prometheus that scraped the server during the runs (overrides the URL recorded in run.json)",
    )
    p.add_argument(
        "--decision-rate",
        metavar="R",
        type=float,
        help="arrival rate (req/s) for chart 2, chart 3 and the comparisons (default: chosen from the data)",
    )
    return p


def _fail(message: str, status: int = 2) -> int:
    text = " ".join(str(message).split())
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if len(args_in) >= 2 and args_in[0] == "report" and not args_in[1].startswith("-"):
        args_in = args_in[1:]  # called with the subcommand name still in front
    try:
        args = _parser().parse_args(args_in)
    except _UsageError as e:
        return _fail(str(e))
    except SystemExit as e:  # --help
        return int(e.code or 0)
    if args.decision_rate is not None and not args.decision_rate > 0:
        return _fail(f"--decision-rate must be a positive number, not {args.decision_rate:g}")
    url = args.prometheus_url
    if url is not None and not url.startswith(("http://", "https://")):
        return _fail(f"--prometheus-url must be an http(s) URL, not {url!r}")

    from .report import build_report
    from .runfolders import ResultsError

    try:
        paths = build_report(args.results_dir, out_dir=args.out, prometheus_url=url, decision_rate=args.decision_rate)
    except ResultsError as e:
        return _fail(str(e))
    except OSError as e:
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        return _fail(f"cannot read or write{where}: {e.strerror or e}")
    except Exception as e:  # a defect, not bad input: still one line, with the type to report it by
        return _fail(f"report failed ({type(e).__name__}: {e})", status=1)
    for note in paths.notes:
        print(f"note: {note}")
    print(f"report: {paths.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
