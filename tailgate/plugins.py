"""Modules that extend the registries (an arrival process, say) without a change to the product's files.

``TAILGATE_PLUGINS`` names them, comma-separated, as Python imports them (``mypkg.arrivals``). Each is
imported once, the first time a registry is read, in every process that reads one: the ``tailgate``
command, a Locust master and each of its load processes (which inherit the environment), so all of them
know the same names. A plugin registers what it adds at import (:func:`tailgate.load.arrivals.register`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TypeVar

from tailgate.optiontable import OptionError

T = TypeVar("T")

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


class Registry(dict[str, T]):
    """The named choices of one axis (arrival processes, endpoints): the only place their names are known.

    A dict by name, in the order they were added (options list them so); :meth:`loaded` is the view every
    reader takes, once the plugins that add to it are imported."""

    def __init__(self, axis: str) -> None:
        super().__init__()
        self.axis = axis

    def add(self, name: str, item: T) -> T:
        """Add ``item``; a second one of the same name is refused (two meanings for one recorded name)."""
        if name in self:
            raise ValueError(f"{self.axis} {name!r} is registered twice")
        self[name] = item
        return item

    def loaded(self) -> Mapping[str, T]:
        load_plugins()
        return self
