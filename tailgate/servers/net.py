"""Small stdlib HTTP helpers for health checks and metadata; no third-party client, so controllers run
before and outside the load generator.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .base import HOST

# --------------------------------------------------------------------------------------------- HTTP bits


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (so parallel tests do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers; health checks need no more than this."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def http_json(url: str, timeout: float = 5.0) -> Any:
    """GET and decode JSON, or None on any failure: used for best-effort metadata only."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read().decode())
    except (OSError, ValueError):
        return None


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    """True when ``/health`` answers 200 (vLLM answers 503 once its engine has died)."""
    return http_status(base_url.rstrip("/") + "/health", timeout) == 200


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, for error messages that should not send the user hunting."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def unreachable(url: str) -> str | None:
    """Why the server at ``url`` cannot be reached now (None: it answered), checked before anything
    starts: a server someone else runs that is down is a wrong ``--host`` as far as this run can tell."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=5.0):
            return None
    except urllib.error.HTTPError:
        return None  # it answered: authentication or routing is the load generator's to report
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{url} does not answer ({reason}); start the server or fix the URL"
