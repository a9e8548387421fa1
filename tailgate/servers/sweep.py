"""Controllers for sweeps over server flags: a restart command, and compose with generated overrides.

A scheduler sweep restarts the server once per configuration with flags nobody wrote down in
advance (``--max-num-batched-tokens 512``...). Compose cannot pass flags to ``up``, and
``command:`` lists cannot splice a variable into several arguments, so :class:`ComposeWithFlags`
writes one override file per flag set that repeats the service's own command with the flags
appended: the container really runs them, and ``docker compose config`` shows it.
:class:`CommandServer` covers everything else (a GPU box's own start script, a remote restart
over ssh): a shell command template is run with the flags filled in.

Standard library only, like every controller.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tailgate.jsontypes import JsonObject

from .base import ServerError
from .compose import ComposeServer, Runner, run_command
from .net import http_json, is_healthy


class CommandServer:
    """A server (re)started by a shell command; ``{flags}`` and ``{config}`` are filled in per configuration.

    The command must return once the server is starting or started (a script that backgrounds it);
    :meth:`wait_healthy` then polls ``/health``. The command actually run is recorded verbatim.
    """

    restarts = True
    applies_flags = True
    flags_in_files = False

    def __init__(self, base_url: str, template: str, *, stop_command: str = "", timeout: float = 900.0) -> None:
        if "{flags}" not in template:
            raise ValueError("the restart command needs a {flags} placeholder")
        self._base_url = base_url.rstrip("/")
        self.template = template
        self.stop_template = stop_command
        self.timeout = timeout
        self.config = "default"
        self.flags: list[str] = []
        self.last_command: str | None = None
        self.last_output = ""

    @property
    def base_url(self) -> str:
        return self._base_url

    def use_config(self, config: str) -> None:
        self.config = config

    def command_for(self, flags: Sequence[str]) -> str:
        """The shell command for these flags (flags quoted, so a value can never run as shell)."""
        return self.template.replace("{flags}", shlex.join(flags)).replace("{config}", shlex.quote(self.config))

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        if extra_args is not None:
            self.flags = [str(a) for a in extra_args]
        cmd = self.command_for(self.flags)
        done = subprocess.run(
            cmd, shell=True, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=self.timeout
        )
        self.last_command = cmd
        self.last_output = (done.stdout + done.stderr)[-4000:]
        if done.returncode != 0:
            raise ServerError(f"restart command failed (exit {done.returncode}): {cmd}\n{self.last_output[-1500:]}")

    def stop(self) -> None:
        if self.stop_template:
            subprocess.run(self.stop_template, shell=True, stdin=subprocess.DEVNULL, capture_output=True, check=False)

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        self.start(extra_args)

    def wait_healthy(self, timeout: float = 900.0) -> float:
        t0 = time.monotonic()
        while not is_healthy(self.base_url):
            if time.monotonic() - t0 > timeout:
                raise ServerError(f"{self.base_url}/health does not answer {timeout:.0f} s after the restart command")
            time.sleep(1)
        return round(time.monotonic() - t0, 2)

    def describe(self) -> JsonObject:
        version = http_json(self.base_url + "/version", timeout=2.0)
        return {
            "kind": "command", "base_url": self.base_url, "command": self.last_command, "extra_args": self.flags,
            "command_output": self.last_output[-2000:],
            "vllm_version": version.get("version") if isinstance(version, dict) else None,
        }  # fmt: skip


class ComposeWithFlags:
    """``docker compose`` where every flag set gets an override file repeating the service's command plus flags.

    The base command is read once from ``docker compose config --format json`` (after the base files'
    own interpolation), so the override differs from the base in the appended flags only.
    """

    restarts = True
    applies_flags = True
    flags_in_files = False

    def __init__(
        self,
        service: str,
        files: Sequence[str | Path],
        override_dir: Path,
        *,
        base_url: str = "http://127.0.0.1:8000",
        runner: Runner | None = None,
    ) -> None:
        self.service = service
        self.files = [str(f) for f in files]
        self.override_dir = Path(override_dir)
        self.runner: Runner = runner or run_command
        self.config = "default"
        self._base_command: list[str] | None = None
        self.current = ComposeServer(service, self.files, base_url=base_url, runner=self.runner)
        self._base_url = base_url
        self.override: Path | None = None

    @property
    def base_url(self) -> str:
        return self.current.base_url

    def use_config(self, config: str) -> None:
        self.config = config

    def preflight(self, configs: Sequence[str]) -> None:
        """Every configuration runs the same service with other flags: its engine, image and port, once."""
        self.current.preflight(check_port=True)

    def base_command(self) -> list[str]:
        """The service's ``command`` as compose resolves it from the base files."""
        if self._base_command is None:
            files = [arg for f in self.files for arg in ("-f", f)]
            argv = ["docker", "compose", *files, "config", "--format", "json"]
            done = self.runner(argv, None)
            if done.returncode != 0:
                raise ServerError(f"{shlex.join(argv)} failed (exit {done.returncode}): {done.stderr}")
            try:
                command = json.loads(done.stdout)["services"][self.service]["command"]
            except (ValueError, KeyError, TypeError) as e:
                raise ServerError(f"compose config has no command for service {self.service}: {e}") from None
            self._base_command = [str(a) for a in (command if isinstance(command, list) else shlex.split(command))]
        return list(self._base_command)

    def override_for(self, flags: Sequence[str]) -> Path:
        """Write (and return) the override file whose ``command`` is the base command plus ``flags``."""
        self.override_dir.mkdir(parents=True, exist_ok=True)
        path = self.override_dir / f"compose-{self.config}.yml"
        doc = {"services": {self.service: {"command": [*self.base_command(), *map(str, flags)]}}}
        path.write_text(json.dumps(doc, indent=1) + "\n")  # JSON is YAML: no YAML writer needed
        return path

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        self.override = self.override_for(list(extra_args or []))
        self.current = ComposeServer(
            self.service, [*self.files, str(self.override)], base_url=self._base_url, runner=self.runner
        )
        self.current.start([])

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        self.current.stop()
        self.start(extra_args)

    def stop(self) -> None:
        self.current.stop()

    def wait_healthy(self, timeout: float = 900.0) -> float:
        return self.current.wait_healthy(timeout)

    def describe(self) -> JsonObject:
        facts = self.current.describe()
        if self.override is not None:
            facts["override_file"] = str(self.override)
            facts["service_command"] = json.loads(self.override.read_text())["services"][self.service]["command"]
        return facts
