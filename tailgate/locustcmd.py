"""``tailgate locust ...``: Locust itself, with the suite's options known before it reads its command line.

Plain ``locust`` prints ``--help`` and checks ``-f`` before it imports the locustfile, which is where the suite's
options join its parser: ``locust -f locustfiles/continuous.py --help`` lists none of them, and a mistyped
``-f`` ends in Locust's own message and exit 1. Run through this module, the suite's hooks are imported
first, so ``--help`` lists every option of the suite (and its ``LOCUST_*`` names come from the same
declarations), and a locustfile that is not there is one line and exit 2, the suite's rule for bad input.
Everything else is Locust's own ``main``: same options, same output, same exit codes.

Run as ``python -m tailgate.locustcmd`` (``tailgate locust`` starts it so): Locust must be imported first in
a fresh process, for gevent's monkey-patching to come before anything else opens a socket or a thread.
"""

from __future__ import annotations

import locust  # noqa: F401  (first: gevent's monkey-patching)
from locust import argument_parser
from locust import main as locust_main

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import tailgate.load.hooks  # noqa: F401  (the suite's options and events, before Locust parses anything)
from tailgate.load.preflight import fail

LOCUSTFILES = ("locustfiles/continuous.py", "locustfiles/gated.py")


def locustfile_problem(value: str) -> str | None:
    """Why Locust could not load ``-f value``, in one line, or None (a URL, ``-``, a folder are Locust's own)."""
    for path in (p.strip() for p in value.split(",")):
        if path == "-" or "://" in path or os.path.isdir(path):
            continue
        if not os.path.exists(path):
            return f"-f: no locustfile {path!r} here; the suite's are {' and '.join(LOCUSTFILES)}"
        if not path.endswith(".py"):
            return f"-f: {path!r} is not a .py file; the suite's locustfiles are {' and '.join(LOCUSTFILES)}"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Check ``-f``, then hand over to Locust (which exits itself)."""
    if argv is not None:
        sys.argv = ["locust", *argv]
    sys.argv[0] = "locust"  # Locust's messages name the command the user knows
    # prints --help (with the suite's options) and exits; typed as a tuple, returns the namespace
    options: Any = argument_parser.parse_locustfile_option()
    problem = locustfile_problem(str(options.locustfile))
    if problem:
        fail(problem)
    run_locust: Callable[[], object] = locust_main.main  # unannotated in Locust
    run_locust()


__all__ = ["locustfile_problem", "main"]


if __name__ == "__main__":
    main()
