"""Which server a command measures and who restarts it, declared once for every command.

``tailgate suite`` and ``tailgate slo`` both run cells against a server that some controller owns. A
user who learned one command's server options must be able to trust them in the other, so the server
kinds are one registry, their options one declaration, and :func:`make_controller` the one constructor:
a kind's placement, restart command or set-up check cannot exist in one command only.

Standard library only, like every controller: this runs before, and outside of, the load generator.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tailgate.optiondecl import PLACEMENTS, add_option

from .base import ServerController

Log = Callable[[str], None]


@dataclass(frozen=True)
class ServerKind:
    """One way to own a server, with what a command must know of it beyond the controller.

    ``has_url``: ``--host`` names it (every kind but local). ``stopped_at_end``: this command started
    it, so the command's cleanup stops it. ``up_already``: nobody here starts it, so a server that does
    not answer now is a wrong ``--host`` and the command refuses before it runs anything.
    ``restarts``: a command can move it from one configuration to another (else it runs one).
    ``flags_in_files``: a configuration's flags live in its files, so flags given as options are refused.
    ``checks_setup``: what it needs (engine, images, port) can be checked before anything starts.
    ``shares_cores``: it runs on this machine's cores, so the load processes ask for real-time priority.
    ``by_command``: the user's ``--restart-command`` (and ``--stop-command``) own it.
    """

    name: str
    help: str
    has_url: bool
    stopped_at_end: bool
    up_already: bool
    build: Callable[[ServerSpec, Log], ServerController]
    restarts: bool = True
    flags_in_files: bool = False
    checks_setup: bool = False
    shares_cores: bool = False
    by_command: bool = False


@dataclass(frozen=True)
class ServerSpec:
    """Everything needed to build a controller, checked before any server starts.

    ``config_overrides`` maps a server configuration to the compose override files that give it its
    flags (the suite's fixed chunked / nochunk / preempt cells); without it, compose writes an override
    per flag set (the SLO search's arbitrary configurations).
    """

    kind: str
    host: str
    results: Path
    tag: str = "[suite]"
    placement: str = "isolated"
    compose_service: str = "vllm"
    compose_files: tuple[str, ...] = ()
    config_overrides: Mapping[str, tuple[str, ...]] | None = None
    restart_command: str = ""
    stop_command: str = ""

    @property
    def server_kind(self) -> ServerKind:
        return SERVER_KINDS[self.kind]

    def problems(self) -> list[str]:
        """One line per option that cannot work, in the words of the option (empty when all is well)."""
        found: list[str] = []
        if self.kind not in SERVER_KINDS:
            found.append(f"--server: unknown kind '{self.kind}' (choose from {', '.join(SERVER_KINDS)})")
            return found
        if self.placement not in PLACEMENTS:
            found.append(f"--placement: choose from {', '.join(PLACEMENTS)}")
        if self.server_kind.by_command and "{flags}" not in self.restart_command:
            found.append("--restart-command: give a shell command with a {flags} placeholder")
        if not self.server_kind.by_command and (self.restart_command or self.stop_command):
            found.append("--restart-command/--stop-command: only with --server command")
        return found


def _local(spec: ServerSpec, log: Log) -> ServerController:
    from .install import ensure_tiny_model, ensure_vllm_venv
    from .local import AUTO_CPUS, LocalVllmServer

    log(f"{spec.tag} preparing the CPU vLLM (installed once into ~/.cache/tailgate)")
    python = ensure_vllm_venv(log=log)
    model = ensure_tiny_model(python=python)
    cpus = AUTO_CPUS if spec.placement == "isolated" else None  # shared: the server may use every core
    return LocalVllmServer(python, model, log_path=spec.results / "server.log", cpus=cpus)


def _compose(spec: ServerSpec, log: Log) -> ServerController:
    from .compose import ComposeByConfig, ComposeServer
    from .sweep import ComposeWithFlags

    files = list(spec.compose_files) or ["docker-compose.yml"]
    if spec.config_overrides is None:
        return ComposeWithFlags(spec.compose_service, files, spec.results / "compose", base_url=spec.host)
    return ComposeByConfig(
        {
            config: ComposeServer(spec.compose_service, [*files, *extra], base_url=spec.host)
            for config, extra in spec.config_overrides.items()
        }
    )


def _manual(spec: ServerSpec, log: Log) -> ServerController:
    from .manual import ManualServer

    return ManualServer(spec.host, out=log)


def _command(spec: ServerSpec, log: Log) -> ServerController:
    from .sweep import CommandServer

    return CommandServer(spec.host, spec.restart_command, stop_command=spec.stop_command)


def _url(spec: ServerSpec, log: Log) -> ServerController:
    from .fixed import FixedServer

    return FixedServer(spec.host)


_KINDS = (
    ServerKind("local", "the CPU vLLM of this machine, started and restarted here",
               has_url=False, stopped_at_end=True, up_already=False, build=_local, shares_cores=True),
    ServerKind("compose", "a docker compose service, re-created per configuration",
               has_url=True, stopped_at_end=False, up_already=False, build=_compose, flags_in_files=True,
               checks_setup=True),
    ServerKind("manual", "you restart it when asked",
               has_url=True, stopped_at_end=False, up_already=False, build=_manual),
    ServerKind("command", "--restart-command (re)starts it, {flags} and {config} filled in",
               has_url=True, stopped_at_end=True, up_already=False, build=_command, by_command=True),
    ServerKind("url", "nobody restarts it: one configuration, its flags recorded as declared",
               has_url=True, stopped_at_end=False, up_already=True, build=_url, restarts=False),
)  # fmt: skip
SERVER_KINDS: dict[str, ServerKind] = {kind.name: kind for kind in _KINDS}
EMBEDDED_KIND = SERVER_KINDS["local"]
"""The kind ``--embedded`` means: the CPU vLLM of this machine."""


def embedded_server_problem(args: argparse.Namespace) -> str | None:
    """``--embedded`` starts this machine's CPU server: another ``--server`` beside it would be silently set aside
    (a search meant for a float32 server started by ``tailgate serve`` measuring a fresh bfloat16 one instead)."""
    named = SERVER_KINDS.get(args.server) if getattr(args, "server", None) else None
    if getattr(args, "embedded", False) and named is not None and named is not EMBEDDED_KIND:
        return (f"--server: --embedded starts its own CPU server; it cannot be combined with --server {named.name} "
                "(give that server's rates and --n instead of --embedded)")  # fmt: skip
    return None


def server_kind_of(args: argparse.Namespace) -> ServerKind | None:
    """The kind the parsed options ask for (``--embedded`` is the local one); None: neither was given."""
    if getattr(args, "embedded", False):
        return EMBEDDED_KIND
    return SERVER_KINDS.get(args.server) if args.server else None


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """The server options every command that runs cells shares, declared here only."""
    kinds_help = "; ".join(f"{k.name} ({k.help})" for k in _KINDS)
    url_kinds = ", ".join(k.name for k in _KINDS if k.has_url)
    p.add_argument("--server", choices=tuple(SERVER_KINDS), default=None, help=f"who owns the server: {kinds_help}")
    p.add_argument("--host", default="http://127.0.0.1:8000", help=f"server URL ({url_kinds})")
    add_option(p, "placement")
    p.add_argument("--compose-file", action="append", default=[], help="compose file(s) (default docker-compose.yml)")
    p.add_argument("--compose-service", default="vllm")
    p.add_argument("--restart-command", default="",
                   help="--server command: shell command that (re)starts the server; {flags} and {config} are "
                        "filled in")  # fmt: skip
    p.add_argument("--stop-command", default="", help="--server command: shell command that stops it at the end")


def server_spec(
    args: argparse.Namespace,
    results: Path,
    *,
    tag: str,
    config_overrides: Mapping[str, tuple[str, ...]] | None = None,
) -> ServerSpec:
    """The spec the parsed options describe; ``--embedded`` means the local CPU vLLM."""
    return ServerSpec(
        kind=EMBEDDED_KIND.name if getattr(args, "embedded", False) else (args.server or ""),
        host=args.host,
        results=results,
        tag=tag,
        placement=args.placement,
        compose_service=args.compose_service,
        compose_files=tuple(args.compose_file),
        config_overrides=config_overrides,
        restart_command=args.restart_command,
        stop_command=args.stop_command,
    )


def make_controller(spec: ServerSpec, log: Log) -> ServerController:
    """The one constructor of a server controller, whichever command asks."""
    problems = spec.problems()
    if problems:
        raise ValueError(problems[0])
    return spec.server_kind.build(spec, log)


def check_setup(controller: ServerController, configs: Sequence[str]) -> None:
    """What the controller needs for these configurations (engine, images, port), checked before a command
    stops or starts anything: both commands call this, so neither can start a server the other refuses.
    Raises the controller's setup error (:class:`~tailgate.servers.compose.ComposeSetupError`), one line."""
    from .base import ChecksSetup

    if isinstance(controller, ChecksSetup):
        controller.preflight(configs)
