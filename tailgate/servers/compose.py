"""A vLLM server run as a ``docker compose`` service (the GPU box in practice)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from tailgate.jsontypes import JsonMapping, JsonObject, JsonValue, as_object
from tailgate.serverconfigs import CHUNKED_OFF_FLAG, DEFAULT

from .base import ServerError, redact_argv
from .net import http_json, is_healthy

# --------------------------------------------------------------------------------------------- compose

IMAGE_HINT = "build it first (scripts/compose-images.sh builds the CPU stack's images) or pull it"


class ComposeSetupError(ServerError):
    """The compose path cannot start at all: no engine, an image that is not there, a port held by
    another process. Bad input to be fixed by the user (exit 2), not a run that failed."""


Runner = Callable[[Sequence[str], Mapping[str, str] | None], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; the default runner for :class:`ComposeServer`."""
    full_env = {**os.environ, **env} if env else None
    return subprocess.run(
        list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, env=full_env, check=False
    )


class ComposeServer:
    """A vLLM server run as a ``docker compose`` service.

    Compose cannot pass flags to ``up``, so the chunked-prefill-off policy is a separate configuration
    chosen at construction: either override files layered on top (``chunked_off_files``) or a second
    service (``chunked_off_service``). Any other flags are exported as ``$TAILGATE_VLLM_ARGS`` for the
    compose file to interpolate into ``command:``; a file that ignores it must set its flags itself.
    """

    restarts = True
    applies_flags = True
    flags_in_files = False

    def __init__(
        self,
        service: str,
        files: Sequence[Path | str] = (),
        *,
        base_url: str = "http://127.0.0.1:8000",
        chunked_off_files: Sequence[Path | str] = (),
        chunked_off_service: str | None = None,
        project_directory: Path | str | None = None,
        project_name: str | None = None,
        compose: Sequence[str] = ("docker", "compose"),
        docker: str = "docker",
        runner: Runner | None = None,
    ) -> None:
        self.service = service
        self.files = [str(f) for f in files]
        self._base_url = base_url.rstrip("/")
        self.chunked_off_files = [str(f) for f in chunked_off_files]
        self.chunked_off_service = chunked_off_service
        self.project_directory = str(project_directory) if project_directory is not None else None
        self.project_name = project_name
        self.compose = list(compose)
        self.docker = docker
        self.runner: Runner = runner or run_command
        self._extra_args: list[str] = []
        self.last_up: list[str] | None = None

    @property
    def base_url(self) -> str:
        """Where the service's port is published."""
        return self._base_url

    def _base(self, extra_files: Sequence[str] = ()) -> list[str]:
        argv = list(self.compose)
        if self.project_directory:
            argv += ["--project-directory", self.project_directory]
        if self.project_name:
            argv += ["-p", self.project_name]
        for f in [*self.files, *extra_files]:
            argv += ["-f", f]
        return argv

    def _variant(self, extra_args: Sequence[str]) -> tuple[str, list[str], list[str]]:
        """(service, extra compose files, flags left for ``$TAILGATE_VLLM_ARGS``) for these flags."""
        args = list(extra_args)
        if CHUNKED_OFF_FLAG not in args:
            return self.service, [], args
        if not self.chunked_off_files and not self.chunked_off_service:
            raise ValueError(
                f"{CHUNKED_OFF_FLAG} needs chunked_off_files or chunked_off_service: compose cannot pass flags"
            )
        rest = [a for a in args if a != CHUNKED_OFF_FLAG]
        return self.chunked_off_service or self.service, list(self.chunked_off_files), rest

    def up_command(self, extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
        """The ``docker compose ... up -d SERVICE`` argv and its environment for these flags."""
        service, extra_files, rest = self._variant(extra_args)
        return [*self._base(extra_files), "up", "-d", service], {"TAILGATE_VLLM_ARGS": shlex.join(rest)}

    def stop_command(self) -> list[str]:
        """``docker compose ... stop`` for every service this object may have started (they share a port)."""
        services = [self.service]
        if self.chunked_off_service and self.chunked_off_service != self.service:
            services.append(self.chunked_off_service)
        return [*self._base(self.chunked_off_files), "stop", *services]

    def _check(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        done = self.runner(argv, env)
        if done.returncode != 0:
            raise ServerError(f"{shlex.join(argv)} failed (exit {done.returncode}):\n{done.stderr or ''}")
        return done.stdout or ""

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """``up -d`` the service for these flags; returns before the server is healthy."""
        if extra_args is not None:
            self._extra_args = [str(a) for a in extra_args]
        argv, env = self.up_command(self._extra_args)
        self._check(argv, env)
        self.last_up = argv

    def preflight(self, check_port: bool = True) -> None:
        """Say in one line why ``up`` cannot work, before anything is started or stopped.

        Without this, a stopped engine or a missing image surfaces as a multi-line compose error, and a
        port held by another process (host networking: the server cannot bind) as a 15-minute wait for
        a health check that never passes.
        """
        try:
            info = self.runner([self.docker, "info", "--format", "{{.ServerVersion}}"], None)
        except OSError as e:
            raise ComposeSetupError(f"{self.docker} cannot run ({e.strerror or e}): install Docker") from None
        if info.returncode != 0:
            raise ComposeSetupError(f"the Docker engine is not running or not reachable: {_first_line(info.stderr)}")
        service, extra_files, rest = self._variant(self._extra_args)
        files = " ".join([*self.files, *extra_files]) or "the default compose file"
        done = self.runner(
            [*self._base(extra_files), "config", "--format", "json", service], {"TAILGATE_VLLM_ARGS": shlex.join(rest)}
        )
        if done.returncode != 0:
            raise ComposeSetupError(f"docker compose cannot read {files}: {_first_line(done.stderr)}")
        try:
            found = json.loads(done.stdout)["services"].get(service)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ComposeSetupError(f"docker compose config of {files} is not the JSON expected") from None
        if not isinstance(found, dict):
            raise ComposeSetupError(f"{files} has no service {service!r}")
        image = found.get("image")
        local_only = found.get("pull_policy") in ("never", "build") or "build" in found
        if image and local_only and self.runner([self.docker, "image", "inspect", str(image)], None).returncode:
            raise ComposeSetupError(f"image {image} (service {service}) is not on this machine; {IMAGE_HINT}")
        if check_port and self.running_container() is None:
            url = urllib.parse.urlsplit(self.base_url)
            host, port = url.hostname or "127.0.0.1", url.port or 80
            if port_taken(host, port):
                raise ComposeSetupError(
                    f"{host}:{port} is taken by another process (no running {service} container holds it); "
                    "free it, or move the server (VLLM_PORT for the compose file, --host for the suite)"
                )

    def stop(self) -> None:
        """``docker compose stop`` the service(s); stopping a stopped service is harmless."""
        self._check(self.stop_command())

    def use_config(self, config: str) -> None:
        """One command for every configuration: the name changes nothing."""

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        """Stop, then ``up -d`` with the configuration for the new flags."""
        self.stop()
        self.start(extra_args)

    def wait_healthy(self, timeout: float = 900.0, interval: float = 1.0) -> float:
        """Poll ``/health``; GPU servers load real weights, hence the long default timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if is_healthy(self.base_url):
                return round(time.monotonic() - t0, 2)
            time.sleep(interval)
        service, extra_files, _ = self._variant(self._extra_args)
        logs = self.runner([*self._base(extra_files), "logs", "--tail", "40", service], None)
        raise ServerError(f"{self.base_url} not healthy after {timeout:.0f} s; service log:\n{logs.stdout}")

    def effective_service(self) -> JsonMapping | None:
        """The active service as compose resolves it (files merged, variables filled in) from
        ``docker compose config``, with the same environment ``up`` got; None if compose cannot say."""
        service, extra_files, rest = self._variant(self._extra_args)
        # naming the service resolves it even when it sits in a profile that is not enabled
        done = self.runner(
            [*self._base(extra_files), "config", "--format", "json", service], {"TAILGATE_VLLM_ARGS": shlex.join(rest)}
        )
        if done.returncode != 0:
            return None
        try:
            found = json.loads(done.stdout)["services"][service]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return found if isinstance(found, dict) else None

    def image(self) -> str | None:
        """The image the active service runs, from ``docker compose config``; None if compose cannot say."""
        found = self.effective_service()
        image = found.get("image") if found else None
        return str(image) if image else None

    def image_digest(self, image: str) -> JsonObject:
        """Image id and repo digests from ``docker image inspect``: the tag alone does not pin a build."""
        done = self.runner([self.docker, "image", "inspect", image], None)
        if done.returncode != 0:
            return {}
        try:
            info = as_object(json.loads(done.stdout)[0])
        except (ValueError, IndexError, KeyError, TypeError):
            return {}
        return {"image_id": _decoded(info.get("Id")), "repo_digests": _decoded(info.get("RepoDigests") or [])}

    def running_container(self) -> JsonMapping | None:
        """``docker inspect`` of the service's running container; None when none runs or docker cannot say.

        The files say what compose was asked to run; the container says what runs. A stale container
        that ``up`` did not re-create, or a file edited after ``up``, shows here and not in the files.
        """
        service, extra_files, _ = self._variant(self._extra_args)
        done = self.runner([*self._base(extra_files), "ps", "-q", "--status", "running", service], None)
        ids = (done.stdout or "").split() if done.returncode == 0 else []
        if len(ids) != 1:
            return None
        inspected = self.runner([self.docker, "inspect", ids[0]], None)
        if inspected.returncode != 0:
            return None
        try:
            info = json.loads(inspected.stdout)[0]
        except (ValueError, IndexError, KeyError, TypeError):
            return None
        return info if isinstance(info, dict) else None

    def describe(self) -> JsonObject:
        """Service, files, the last ``up`` command, the running container's command, image and digest."""
        service, extra_files, rest = self._variant(self._extra_args)
        facts: JsonObject = {
            "kind": "compose",
            "base_url": self.base_url,
            "service": service,
            "files": [*self.files, *extra_files],
            "extra_args": list(self._extra_args),
            "tailgate_vllm_args": shlex.join(rest),
            "command": self.last_up or self.up_command(self._extra_args)[0],
            "image": None,
        }
        with contextlib.suppress(OSError):
            container = self.running_container()
            if container:
                config = _section(container, "Config")
                facts["effective_command"] = redact_argv(
                    [str(container.get("Path") or ""), *_as_list(container.get("Args"))]
                    if container.get("Path")
                    else [*_as_list(config.get("Entrypoint")), *_as_list(config.get("Cmd"))]
                )
                facts["effective_command_from"] = "docker inspect"
                facts["container"] = {"id": _decoded(container.get("Id")),
                                      "name": str(container.get("Name", "")).lstrip("/"),
                                      "started": _decoded(_section(container, "State").get("StartedAt"))}  # fmt: skip
                image = config.get("Image")
                facts["image"] = str(image) if image else None
                facts["image_id"] = _decoded(container.get("Image"))
                if image:
                    facts["repo_digests"] = self.image_digest(str(image)).get("repo_digests", [])
                found = None
            else:
                found = self.effective_service()
            if found:
                facts["effective_command_from"] = "docker compose config (no running container)"
                # what the container would run: the merged files' entrypoint and command. Only these:
                # the environment holds VLLM_API_KEY and HF_TOKEN after interpolation
                facts["effective_command"] = redact_argv(
                    [*_as_list(found.get("entrypoint")), *_as_list(found.get("command"))]
                )
                image = found.get("image")
                facts["image"] = str(image) if image else None
                if image:
                    facts.update(self.image_digest(str(image)))
        version = http_json(self.base_url + "/version", timeout=2.0)
        facts["vllm_version"] = version.get("version") if isinstance(version, dict) else None
        return facts


def _first_line(text: str | None) -> str:
    """The first non-empty line of a tool's error output: the one that says what is wrong."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"


def port_taken(host: str, port: int) -> bool:
    """True when a listener already holds ``host:port``; a bind test, so nothing is sent to it."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _as_list(value: object) -> list[str]:
    """Compose writes ``command``/``entrypoint`` as a list, a string or null."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _decoded(value: object) -> JsonValue:
    """A value Docker's JSON output held, recorded as it came: ``json.loads`` made it, so it is JSON."""
    return cast(JsonValue, value)


def _section(doc: JsonMapping, key: str) -> JsonMapping:
    """A nested object of Docker's output; empty when absent or null."""
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


class ComposeByConfig:
    """Compose cannot pass flags to ``up``: each server configuration is a set of compose files.

    ``flags_in_files`` tells the suite not to record flags of its own: what runs is what the files say,
    and :meth:`describe` reports it from the running container (``docker inspect``).
    """

    restarts = True
    applies_flags = True
    flags_in_files = True

    def __init__(self, servers: Mapping[str, ComposeServer]) -> None:
        self.servers = servers
        self.current = servers[DEFAULT.name]

    @property
    def base_url(self) -> str:
        return self.current.base_url

    def use_config(self, config: str) -> None:
        self.current = self.servers[config]

    def start(self, extra_args: Sequence[str] | None = None) -> None:
        """``up -d`` the current configuration's file set; its command is the files' own."""
        self.current.start([])

    def restart(self, extra_args: Sequence[str] | None = None) -> None:
        # the flags live in the files: `up -d` re-creates the container with this file set's command
        self.current.start([])

    def wait_healthy(self, timeout: float = 900.0) -> float:
        return self.current.wait_healthy(timeout)

    def stop(self) -> None:
        self.current.stop()

    def preflight(self, configs: Sequence[str]) -> None:
        """Check every configuration the command will use; the port only for the first, started first."""
        for i, config in enumerate(c for c in configs if c in self.servers):
            self.servers[config].preflight(check_port=i == 0)

    def describe(self) -> JsonObject:
        return self.current.describe()
