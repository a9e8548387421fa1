"""What a run checks before it starts: validated settings for the arm, the model the server serves, and
the one line (exit 2) that every bad input ends in, on stderr and in the web UI's Start check alike.

Its own module, free of Locust's events, so the command line's hooks and the web UI's form share it
without importing each other.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tailgate.load.options import Settings, validate
from tailgate.optiontable import OptionError

EXIT_USAGE = 2


def usage_line(message: str) -> str:
    """The one line every bad input gets, on stderr and in the web UI alike."""
    return f"tailgate: error: {message}"


def fail(message: str) -> None:
    """One line on stderr and exit code 2: the contract for every bad input."""
    sys.stderr.write(usage_line(message) + "\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


def resolve_model(settings: Settings) -> str:
    """The model to request: the option, else the server's first served model.

    Doubles as the start-up reachability check, so an unreachable server is one clear line
    before anything runs."""
    url = settings.target.url("/v1/models")
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise OptionError(f"--host: {url} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise OptionError(f"--host: cannot reach {settings.host}: {reason}") from None
    except http.client.HTTPException as e:  # e.g. an SSH or SMTP banner: not HTTP at all
        raise OptionError(f"--host: {settings.host} does not speak HTTP ({type(e).__name__}: "
                          f"{str(e)[:80]!r})") from None  # fmt: skip
    except ValueError:
        raise OptionError(f"--host: {url} did not return JSON; is this an OpenAI-compatible server?") from None
    listed = body.get("data") if isinstance(body, dict) else None
    if not isinstance(listed, list):
        raise OptionError(f"--host: {url} did not list models ({json.dumps(body)[:60]}); "
                          "is this an OpenAI-compatible server?")  # fmt: skip
    models = [m.get("id") for m in listed if isinstance(m, dict)]
    if settings.model:
        return settings.model
    if not models:
        raise OptionError(f"--model: {settings.host} serves no models; name one with --model")
    return str(models[0])


def settings_for(environment: Any, opts: Any, *, contact_server: bool = True) -> Settings:
    """Validated settings for one run of this locustfile's arm; raises OptionError."""
    shape = environment.shape_class
    given: str = getattr(opts, "results_dir", None) or ""
    existed = bool(given) and os.path.exists(given)
    settings = validate(opts, arm=shape.arm, now=time.strftime("%Y%m%d-%H%M%S"))
    if contact_server:
        from tailgate.load.materialize import materialize

        try:
            settings = dataclasses.replace(settings, model=resolve_model(settings))
            settings = materialize(settings)
        except OptionError:
            if not existed:  # a run refused before it started leaves no folder behind
                try:
                    settings.results_dir.rmdir()
                except OSError:
                    pass
            raise
    return settings
