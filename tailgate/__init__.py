"""tailgate: what does your batching policy do to tail latency?

The package is laid out by role (``ARCHITECTURE.md`` draws the data flow):

* ``records`` and ``stats``: the record schema and the summary rules, shared by the load path and the
  analysis; they import neither gevent nor pandas, so both sides agree on one schema and one set of
  percentile rules.
* ``load``: the trace, the schedules and the streaming client that run inside Locust.
* ``shapes`` and ``locustfiles``: the arms as Locust shapes and the thin locustfiles users point at.
* ``postprocess``: the analysis (pandas, matplotlib) from a results folder to the HTML report.
* ``servers``: starting, restarting and describing the vLLM server under test.
* ``verify``: the ground-truth server and the self-check that measure the suite's own timing error.
* ``webui``: the Tail latency tab in Locust's web UI.
* ``suite``, ``slo`` and ``cli``: the ``tailgate`` command that runs all of it; ``runner``: the one way
  it runs a Locust child against a server; ``serversession``: the server's life in one command (restarts,
  stage warm-up, interrupt).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

__version__ = "0.1.0"

_SOURCE_ROOT = Path(__file__).resolve().parent.parent
_TOP_LEVEL = {"tailgate.shapes": "shapes", "tailgate.locustfiles": "locustfiles", "tailgate.postprocess": "postprocess"}
"""Installed, these top-level folders of the tree are subpackages (``pyproject.toml``'s package-dir)."""


class _SourceTreeFinder:
    """Finds ``tailgate.shapes`` & co. in a checkout used without installing it (``PYTHONPATH=.``).

    An install maps the folders under the namespace; a bare checkout (a GPU box without a build backend,
    ``python -m`` from the repository root) has only the folders, so this finder maps them the same way.
    It is consulted after every other finder, so an install always wins.
    """

    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        folder = _TOP_LEVEL.get(name)
        if folder is None:
            return None
        init = _SOURCE_ROOT / folder / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])


if all((_SOURCE_ROOT / folder / "__init__.py").is_file() for folder in _TOP_LEVEL.values()) and not any(
    f is _SourceTreeFinder for f in sys.meta_path
):
    sys.meta_path.append(_SourceTreeFinder)
