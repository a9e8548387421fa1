"""A server someone else runs: the suite names the flags it needs and waits for the restart."""

from __future__ import annotations

import contextlib
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from tailgate.jsontypes import JsonObject
from tailgate.serverconfigs import CHUNKED_OFF_FLAG

from .base import Log, ServerError
from .net import http_json, is_healthy

# --------------------------------------------------------------------------------------------- manual


class ManualServer:
    """A server someone else runs: the suite says which flags it needs and waits for the restart.

    A restart is recognised without asking: ``/health`` going down and coming back, or the server's
    process start time (from ``/metrics``) changing when the restart was too quick to catch. Standard
    input is read only when it is a terminal, so unattended runs never block on it.

    ``applies_flags`` is False: the suite only asks for the flags; metadata records them as requested.
    """

    restarts = True
    applies_flags = False
    flags_in_files = False

    def __init__(
        self,
        base_url: str,
        *,
        out: Log = print,
        interactive: bool | None = None,
        input_fn: Callable[[str], str] = input,
        timeout: float = 3600.0,
        poll: float = 1.0,
        remind_every: float = 60.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.out = out
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.input_fn = input_fn
        self.timeout = timeout
        self.poll = poll
        self.remind_every = remind_every
        self._extra_args: list[str] = []

    @property
    def base_url(self) -> str:
        """The server's API address."""
        return self._base_url

    def _process_start_time(self) -> float | None:
        """``process_start_time_seconds`` from ``/metrics``: changes whenever the server process does."""
        try:
            with urllib.request.urlopen(self.base_url + "/metrics", timeout=2.0) as resp:
                text = resp.read().decode(errors="replace")
        except (OSError, ValueError):
            return None
        for line in text.splitlines():
            if line.startswith("process_start_time_seconds "):
                with contextlib.suppress(ValueError):
                    return float(line.split()[1])
        return None

    def _ask(self, message: str, extra_args: Sequence[str]) -> None:
        flags = shlex.join(extra_args) if extra_args else "(no extra flags)"
        self.out(f"{message} the vLLM server at {self.base_url} with: {flags}")
        if CHUNKED_OFF_FLAG not in extra_args:
            self.out("  (chunked prefill on: leave out --no-enable-chunked-prefill)")

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """Ask for the server to run with these flags and wait until it answers."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        self._ask("Start", self._extra_args)
        if self.interactive:
            self.input_fn("Press Enter once it is starting... ")
        self.wait_healthy(self.timeout)

    def stop(self) -> None:
        """Nothing to do: the suite does not own this server and leaves it running."""

    def use_config(self, config: str) -> None:
        """One command for every configuration: the name changes nothing."""

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Ask for a restart with these flags and wait until a new server process answers."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        before = self._process_start_time()
        self._ask("Restart", self._extra_args)
        if self.interactive:
            self.input_fn("Press Enter once it is restarting... ")
            self.wait_healthy(self.timeout)
            return
        t0 = time.monotonic()
        last_reminder = t0
        seen_down = False
        while time.monotonic() - t0 < self.timeout:
            if not is_healthy(self.base_url):
                seen_down = True
            elif seen_down:
                return
            else:
                now_start = self._process_start_time()
                if before is not None and now_start is not None and now_start != before:
                    return
            if time.monotonic() - last_reminder >= self.remind_every:
                last_reminder = time.monotonic()
                self._ask("Still waiting: restart", self._extra_args)
            time.sleep(self.poll)
        raise ServerError(f"no restart of {self.base_url} seen within {self.timeout:.0f} s")

    def wait_healthy(self, timeout: float = 3600.0) -> float:
        """Poll ``/health`` until 200, reminding the operator now and then."""
        t0 = time.monotonic()
        last_reminder = t0
        while time.monotonic() - t0 < timeout:
            if is_healthy(self.base_url):
                return round(time.monotonic() - t0, 2)
            if time.monotonic() - last_reminder >= self.remind_every:
                last_reminder = time.monotonic()
                self.out(f"Still waiting for {self.base_url}/health ...")
            time.sleep(self.poll)
        raise ServerError(f"{self.base_url} not healthy after {timeout:.0f} s")

    def describe(self) -> JsonObject:
        """The flags that were asked for and the version the server reports: all the suite can know."""
        version = http_json(self.base_url + "/version", timeout=2.0)
        return {
            "kind": "manual",
            "base_url": self.base_url,
            "requested_args": list(self._extra_args),
            "vllm_version": version.get("version") if isinstance(version, dict) else None,
        }
