"""Where completions go and how long they may take: parsed and fixed once per run, before any stream.

Kept apart from the streaming client so the command line and the option checks can validate a server URL
without reading the stream's hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class TargetError(ValueError):
    """A server URL that cannot be used."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where completions go: parsed once, so each request only formats its body."""

    scheme: str
    host: str
    port: int
    api_prefix: str
    """Path prefix that ``/completions`` hangs off, normally ``/v1``."""

    @classmethod
    def parse(cls, url: str) -> Target:
        try:
            parts = urlsplit(url.strip())
        except ValueError as e:  # urlsplit's own complaints, e.g. "Invalid IPv6 URL" for http://[::1
            raise TargetError(f"{url!r} is not a valid URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TargetError(f"{url!r} is not an http(s) URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise TargetError(f"{url!r} has an invalid port") from None
        path = parts.path.rstrip("/")
        if not path.endswith("/v1"):
            path = path + "/v1"
        return cls(parts.scheme, parts.hostname, port, path)

    @property
    def root(self) -> str:
        """Server root (where ``/metrics``, ``/health`` and ``/version`` live)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        root = f"{self.scheme}://{host}:{self.port}"
        prefix = self.api_prefix[: -len("/v1")]
        return root + prefix

    def url(self, path: str) -> str:
        return self.root + path


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 10.0
    request_s: float = 600.0
    """Whole request, as in the reference harness."""
    stall_s: float | None = None
    """Longest silence tolerated between two reads once headers arrived; None = request_s."""
