"""Modules that extend the registries (an arrival process, say) without a change to the product's files.

``TAILGATE_PLUGINS`` names them, comma-separated, as Python imports them (``mypkg.arrivals``). Each is
imported once, the first time a registry is read, in every process that reads one: the ``tailgate``
command, a Locust master and each of its load processes (which inherit the environment), so all of them
know the same names. A plugin registers what it adds at import (:func:`tailgate.load.arrivals.register`).
"""

from __future__ import annotations

import importlib
import os

from tailgate.optiontable import OptionError

PLUGINS_ENV = "TAILGATE_PLUGINS"
_loaded: set[str] = set()


def plugin_names() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def load_plugins() -> None:
    """Import every plugin not imported yet; a missing one is an :class:`OptionError` naming it."""
    for name in plugin_names():
        if name in _loaded:
            continue
        _loaded.add(name)  # before the import: a plugin that reads a registry at import does not recurse
        try:
            importlib.import_module(name)
        except ImportError as e:
            _loaded.discard(name)
            raise OptionError(f"{PLUGINS_ENV}: cannot import {name!r} ({e})") from None
