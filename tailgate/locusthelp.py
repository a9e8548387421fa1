"""``locust -f locustfiles/continuous.py --help`` lists the suite's options beside Locust's own, and a suite
locustfile that is not there is one line and exit 2.

Locust prints its help before it imports the locustfile, so the options a locustfile declares (through
``init_command_line_parser``) never reach it, and a Locust user who asks ``--help`` would not learn of
``--rates`` or ``--trace-file``. The project's environment runs this module at interpreter start (a one-line
``.pth`` file that ``scripts/setup-base.sh`` writes, :data:`PTH_LINE`) only when the program is ``locust``; it
then declares the suite's options ahead of time, and only when help is asked for a locustfile of this suite, so
every other ``locust`` run, and every other locustfile, is untouched. A misspelt locustfile in the suite's
folder (``-f locustfiles/continous.py``) is refused here in one line with the names that exist, exit 2, where
Locust would print a paragraph and exit 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

PTH_NAME = "tailgate-locust-help.pth"
PTH_LINE = 'import os, sys; os.path.basename((sys.argv or [""])[0]) == "locust" and __import__("tailgate.locusthelp")\n'
"""What the ``.pth`` file holds: a line that starts with ``import`` is run by ``site``; this one costs a string
comparison in every other program."""
LOCUSTFILES = Path(__file__).resolve().parent.parent / "locustfiles"


def locustfile_named(argv: Sequence[str]) -> str | None:
    """The ``-f``/``--locustfile`` value of a Locust command line (or ``LOCUST_LOCUSTFILE``), None when absent."""
    for i, arg in enumerate(argv):
        if arg in ("-f", "--locustfile") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--locustfile="):
            return arg.split("=", 1)[1]
        if arg.startswith("-f") and len(arg) > 2 and not arg.startswith("--"):
            return arg[2:]
    return os.environ.get("LOCUST_LOCUSTFILE")


def is_suite_locustfile(name: str) -> bool:
    """A file of the suite's ``locustfiles/`` folder (``locustfiles/continuous.py``, ``gated.py`` ...)."""
    try:
        return Path(name).resolve().parent == LOCUSTFILES
    except OSError:
        return False


def wants_suite_help(argv: Sequence[str]) -> bool:
    asked = any(a in ("-h", "--help") for a in argv[1:])
    name = locustfile_named(argv[1:]) if asked else None
    return name is not None and is_suite_locustfile(name)


def missing_suite_locustfile(argv: Sequence[str]) -> str | None:
    """The first of ``-f``'s comma-separated files that would sit in the suite's folder but is not there."""
    named = locustfile_named(argv[1:])
    for name in (named or "").split(","):
        if name and is_suite_locustfile(name) and not Path(name).exists():
            return name
    return None


def _declare() -> None:
    missing = missing_suite_locustfile(sys.argv)
    if missing is not None:
        known = ", ".join(sorted(p.name for p in LOCUSTFILES.glob("*.py") if not p.name.startswith("_")))
        sys.stderr.write(f"locust: error: no locustfile {missing} (the suite's are {known})\n")
        sys.stderr.flush()
        os._exit(2)  # at interpreter start nothing is open yet, and SystemExit would not end it here
    if wants_suite_help(sys.argv):
        try:
            import tailgate.load.hooks  # noqa: F401  (declares the suite's options on Locust's parser)
        except Exception:  # help without the suite's options rather than no help at all
            return


_declare()
