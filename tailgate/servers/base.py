"""What every server controller shares: the interface a suite drives and its error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # for the checker only: the vLLM image runs this module beside install.py without the package
    from tailgate.jsontypes import JsonObject

HOST = "127.0.0.1"

Log = Callable[[str], None]


SECRET_OPTIONS = ("--api-key",)
"""Options whose value is a secret: metadata keeps the option and drops the value."""


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit for metadata: the value of every secret option replaced, whether it follows
    as the next argument (``--api-key X``) or after ``=``, also inside ``--locust-arg=--api-key=X``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        for option in SECRET_OPTIONS:
            if option + "=" in arg:
                arg = arg.split(option + "=", 1)[0] + option + "=<redacted>"
            elif arg.endswith(option):
                hide_next = True
        out.append(arg)
    return out


class ServerError(RuntimeError):
    """The server could not be set up, started or reached; the message says what to look at."""


# --------------------------------------------------------------------------------------------- interface


@runtime_checkable
class ServerController(Protocol):
    """What a benchmark runner needs from a server: restart it with flags, and say how it was run.

    The three capabilities are declared by every controller (class attributes), because they decide
    what is true to record: flags are *applied* only by a controller that restarts the server and
    passes them on itself.
    """

    restarts: bool
    """False: the server runs as someone else started it; ``restart`` only checks that it is up."""
    applies_flags: bool
    """False: a person applies the flags (``restart`` asks for them); nobody here can confirm it."""
    flags_in_files: bool
    """True: each configuration's command is in its own files; flags passed to ``restart`` are ignored."""

    def use_config(self, config: str) -> None:
        """The configuration the next ``restart`` is for (names override files and restart commands)."""
        ...

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the OpenAI-compatible API."""
        ...

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """Start the server with these vLLM flags (None: the flags it was last given)."""
        ...

    def stop(self) -> None:
        """Stop the server; calling it again, or on a stopped server, does nothing."""
        ...

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop, then start with these flags, so a run never sees the previous policy's state."""
        ...

    def wait_healthy(self, timeout: float = 240.0) -> float:
        """Block until ``/health`` answers 200; return the seconds waited."""
        ...

    def describe(self) -> JsonObject:
        """JSON-ready facts about the server for the run's metadata."""
        ...


@runtime_checkable
class ChecksSetup(Protocol):
    """A controller that can check what it needs (engine, images, port) before anything starts."""

    def preflight(self, configs: Sequence[str]) -> None:
        """Raise a setup error naming what is missing for any of these configurations."""
        ...
