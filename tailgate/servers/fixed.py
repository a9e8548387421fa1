"""A server nobody restarts (``--server url``): the suite only checks that it is up and asks its version."""

from __future__ import annotations

import time
from collections.abc import Sequence

from tailgate.jsontypes import JsonObject

from .base import ServerError
from .net import http_json, is_healthy


class FixedServer:
    """A server nobody restarts: the suite only checks that it is up."""

    restarts = False
    applies_flags = False
    flags_in_files = False

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def use_config(self, config: str) -> None:
        """One command for every configuration: the name changes nothing."""

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        pass

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        pass

    def wait_healthy(self, timeout: float = 30.0) -> float:
        t0 = time.monotonic()
        while not is_healthy(self.base_url):
            if time.monotonic() - t0 > timeout:
                raise ServerError(f"{self.base_url}/health does not answer")
            time.sleep(1)
        return time.monotonic() - t0

    def stop(self) -> None:
        pass

    def describe(self) -> JsonObject:
        version = http_json(self.base_url + "/version")
        return {"kind": "external", "base_url": self.base_url,
                "vllm_version": version.get("version") if isinstance(version, dict) else None}  # fmt: skip
